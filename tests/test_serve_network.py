"""rnnstep-serve on a network: hostile bodies, keys, origins, hosts, OpenAI's
logprobs and echo, the schema and its fuzzer (#47).

Real server processes (`tests/support/serve_process.py`), driven by the
official `openai` client and raw httpx: one with two API keys, shared by the
file (its fixture's teardown stops it with SIGTERM while a pattern is being
checked);
a byte and a byte-level BPE model's for prompts over the limit in ids; one
whose warm-up fails. Every text is checked against `rnnstep.generate`, every
log-probability against `rnnstep.logits` (a teacher-forced forward pass)
log-softmaxed in numpy.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import rnnstep
from tests.support import cli
from tests.support import http
from tests.support import forkserver
from tests.support import serve_process
from tests.support import token_models

# A real server process: the default run, not the quick tier.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not serve_process.stack_installed(),
                                 reason="the serving stack is not installed")]

KEYS = ("sk-first-key", "sk-second-key")
NAME = "tiny-gru"
ORIGIN = "https://app.example"
MAX_PROMPT_TOKENS = 64
AUTH = {"Authorization": f"Bearer {KEYS[1]}"}
# A pattern whose DFA has about 2^21 states: refused while it is built.
BLOWUP = "[ab]*a[ab]{20}"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("network") / "tiny.npz")
  cli.write_model(path)
  return path


@pytest.fixture(scope="module")
def model(model_path):
  return rnnstep.load(model_path)


# A chat template for the tiny GRU's vocabulary (the fuzzer's chat requests
# render through it).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m.role|upper }}: {{ m.content }}\n"
                 "{% endfor %}ASSISTANT:")


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
  template = tmp_path_factory.mktemp("chat") / "chat.jinja"
  template.write_text(CHAT_TEMPLATE)
  with serve_process.RemoteServer([
      f"--model={model_path}", f"--chat_template={template}",
      "--chat_end_of_turn=\\n", "--max_batch=8", "--chunk_steps=8",
      "--max_tokens_limit=400", f"--max_prompt_tokens={MAX_PROMPT_TOKENS}",
      "--jit_compile=false", "--drain_timeout=20", "--lanes=2",
      f"--api_key={KEYS[0]}", f"--api_key={KEYS[1]}",
      f"--served_model_name={NAME}", f"--allowed_origins={ORIGIN}",
      "--check_timeout=30"]) as running:
    yield running
    sigterm_while_a_pattern_is_checked_exits_0_in_time(running)


def sigterm_while_a_pattern_is_checked_exits_0_in_time(server):
  """The shared server's stop (its fixture's teardown): SIGTERM while a
  pattern that takes seconds to refuse is being checked. The check is
  abandoned (`checks.RequestChecks.abandon`) rather than waited for
  (`--check_timeout=30`): the request is answered, 503 shutting down (or
  400 naming `regex`, had its check ended first), and the process exits 0
  well within the check's timeout."""
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    checking = pool.submit(post, server, dict(prompt="ab", regex=BLOWUP))
    time.sleep(0.3)
    server.process.send_signal(15)
    started = time.monotonic()
    assert server.process.wait(30) == 0
    assert time.monotonic() - started < 20
    reply = checking.result()  # Answered in the drain, not dropped.
  if reply.status_code == 400:
    assert_error(reply, 400, "regex")
  else:
    error = assert_error(reply, 503)
    assert error["type"] == "service_unavailable", error
    assert "shutting down" in error["message"], error


def post(server, body, *, headers=AUTH, path="/v1/completions", timeout=60):
  """POSTs a JSON body (bytes as they are), with the key by default."""
  content = body if isinstance(body, bytes) else json.dumps(body).encode()
  return http.post(server.url(path), content=content, timeout=timeout,
                   headers={"Content-Type": "application/json", **headers})


def assert_error(reply, status, param=None, code=None):
  """An OpenAI error body, in one line, with this status, param and code."""
  assert reply.status_code == status, reply.text
  error = reply.json()["error"]
  assert set(error) == {"message", "type", "param", "code"}, error
  assert error["message"] and "\n" not in error["message"]
  if param is not None:
    assert error["param"] == param, error
  if code is not None:
    assert error["code"] == code, error
  return error


def test_the_issue_s_table_each_answered_as_it_must_be(server, model):
  """#47's table: each row's body, and the answer it must get."""
  # A lone surrogate is valid JSON: the field holding it is named.
  assert_error(post(server, b'{"prompt": "a", "stop": "\\ud800"}'), 400,
               "stop")
  assert_error(post(server, b'{"prompt": "\\udc00a", "max_tokens": 2}'), 400,
               "prompt")
  assert_error(post(server, b'{"prompt": "a", "regex": "\\ud800"}'), 400,
               "regex")
  assert_error(post(server, b"[" * 100_000 + b"]" * 100_000), 400, "body")
  assert_error(post(server, dict(prompt="a", regex="(" * 2000 + "a"
                                 + ")" * 2000)), 400, "regex")
  # A web page's simple request (no preflight) is not JSON: 415.
  assert_error(http.post(server.url("/v1/completions"), content=json.dumps(
      dict(prompt="a", max_tokens=3)), headers={
          "Content-Type": "text/plain", **AUTH}), 415, "body")
  assert_error(post(server, dict(prompt="a", model="gpt-4")), 404, "model",
               "model_not_found")
  assert post(server, dict(prompt="a", model=NAME, max_tokens=2)
              ).status_code == 200
  assert_error(http.post(server.url("/v1/completions"), json=dict(
      prompt="a")), 401, code="invalid_api_key")
  assert_error(post(server, dict(prompt="a"), headers={
      "Authorization": "Bearer sk-wrong"}), 401, code="invalid_api_key")
  assert_error(post(server, dict(prompt="a"), headers={
      "Authorization": KEYS[0]}), 401)  # Not a bearer token.
  for path in ("/health", "/metrics", "/openapi.json"):  # Open, as vLLM's.
    assert http.get(server.url(path)).status_code == 200, path
  assert_error(http.get(server.url("/v1/models")), 401)
  assert_error(http.get(server.url("/nowhere"), headers=AUTH), 404)


def test_a_pattern_that_blows_up_is_refused_while_others_are_served(
    server, model):
  """Two checks of the blow-up pattern at once: each refused naming regex,
  and plain requests sent meanwhile answered with `generate`'s text (their
  checks run on threads of their own; how long they wait beside a blow-up
  is measured by tools/bench/serve_hostile.py's p99 bound)."""
  with concurrent.futures.ThreadPoolExecutor(6) as pool:
    blowups = [pool.submit(post, server, dict(prompt="ab", max_tokens=4,
                                              regex=BLOWUP))
               for _ in range(2)]
    time.sleep(0.2)
    body = dict(prompt="ROMEO:", max_tokens=12, seed=3)
    plain = [pool.submit(post, server, body) for _ in range(3)]
    for reply in plain:
      assert reply.result().status_code == 200
      assert reply.result().json()["choices"][0]["text"] == (
          serve_process.expected(model, body, 3)[0][0])
    for reply in blowups:
      error = assert_error(reply.result(), 400, "regex")
      assert "states" in error["message"] or "long" in error["message"]


def _logprob_references(model, prompt, text):
  """Per generated token: (its log-probability, the log-softmax row) under
  the raw model, from a teacher-forced `rnnstep.logits` over prompt + text."""
  ids = np.concatenate([model.encode(prompt), model.encode(text)])
  logits = np.asarray(rnnstep.logits(model, ids[:-1]), np.float64)[0]
  rows = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - logits.max(-1, keepdims=True)
  positions = np.arange(len(ids) - 1)
  return rows[positions, ids[1:]], rows


def test_logprobs_are_openai_s_shape_and_the_model_s(server, model):
  client = server.openai_client(api_key=KEYS[0])
  prompt = "ROMEO:"
  for k, extra in [(2, {}), (0, dict(temperature=0.0)),
                   (5, dict(top_k=5, repetition_penalty=1.3))]:
    response = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=30, seed=11, logprobs=k,
        extra_body=extra)
    choice = response.choices[0]
    body = dict(prompt=prompt, max_tokens=30, **extra)
    assert choice.text == serve_process.expected(model, body, 11)[0][0]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert len(logprobs.token_logprobs) == 30
    assert logprobs.text_offset == list(np.cumsum(
        [0] + [len(t) for t in logprobs.tokens[:-1]]))
    want, rows = _logprob_references(model, prompt, choice.text)
    np.testing.assert_allclose(logprobs.token_logprobs, want[-30:],
                               atol=2e-5, rtol=1e-5)
    # They add up to the library's return_scores (the raw model's).
    _, scores = rnnstep.generate(model, prompt, 30, seed=11,
                                 return_scores=True, jit_compile=False,
                                 **extra)
    assert sum(logprobs.token_logprobs) == pytest.approx(float(scores),
                                                         abs=1e-3)
    for step, top in enumerate(logprobs.top_logprobs):
      row = rows[len(model.encode(prompt)) - 1 + step]
      best = np.argsort(-row, kind="stable")[:k]
      want_top = {model.vocab[i]: row[i] for i in best}
      want_top.setdefault(logprobs.tokens[step],
                          logprobs.token_logprobs[step])
      assert top.keys() == want_top.keys()
      np.testing.assert_allclose([top[t] for t in want_top],
                                 list(want_top.values()), atol=2e-5)


def test_echo_puts_the_prompt_first_with_its_logprobs(server, model):
  client = server.openai_client(api_key=KEYS[0])
  body = dict(prompt="To be", max_tokens=10, temperature=0.8)
  response = client.completions.create(model=NAME, echo=True, seed=4, **body)
  text = serve_process.expected(model, body, 4)[0][0]
  assert response.choices[0].text == "To be" + text
  scored = client.completions.create(model=NAME, echo=True, seed=4,
                                     logprobs=1, **body).choices[0]
  assert scored.text == "To be" + text
  logprobs = scored.logprobs
  assert logprobs.tokens == list("To be" + text)
  assert logprobs.token_logprobs[0] is None
  assert logprobs.top_logprobs[0] is None
  want, _ = _logprob_references(model, "To be", text)
  np.testing.assert_allclose(logprobs.token_logprobs[1:], want, atol=2e-5)
  # max_tokens 0 scores a text (what lm-evaluation-harness asks).
  only = client.completions.create(model=NAME, prompt="To be" + text,
                                   max_tokens=0, echo=True, logprobs=0)
  assert only.choices[0].text == "To be" + text
  np.testing.assert_allclose(only.choices[0].logprobs.token_logprobs[1:],
                             want, atol=2e-5)
  # Streamed: the prompt first, then the text; the entries alike.
  chunks = list(client.completions.create(model=NAME, echo=True, seed=4,
                                          logprobs=1, stream=True, **body))
  assert "".join(c.choices[0].text for c in chunks if c.choices) == (
      "To be" + text)
  streamed = [lp for c in chunks if c.choices and c.choices[0].logprobs
              for lp in c.choices[0].logprobs.token_logprobs]
  np.testing.assert_allclose(streamed[1:], want, atol=2e-5)


def test_tokenize_and_detokenize(server, model):
  reply = post(server, dict(prompt="ROMEO:"), path="/tokenize")
  assert reply.status_code == 200, reply.text
  assert reply.json()["tokens"] == model.encode("ROMEO:").tolist()
  assert reply.json()["count"] == 6
  back = post(server, dict(tokens=reply.json()["tokens"]), path="/detokenize")
  assert back.json() == {"prompt": "ROMEO:"}
  assert_error(post(server, dict(tokens=[10**6]), path="/detokenize"), 400,
               "tokens")
  assert_error(post(server, dict(prompt="a\u20ac"), path="/tokenize"), 400,
               "prompt")


def test_prompt_over_the_limit_in_tokens_is_refused(server):
  assert_error(post(server, dict(prompt="a" * (MAX_PROMPT_TOKENS + 1))), 400,
               "prompt")
  assert post(server, dict(prompt="a" * MAX_PROMPT_TOKENS, max_tokens=2)
              ).status_code == 200


def test_cors_answers_the_allowed_origin_only(server):
  def preflight(origin):
    return http.options(server.url("/v1/completions"), headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
  allowed = preflight(ORIGIN)
  assert allowed.status_code == 200
  assert allowed.headers["access-control-allow-origin"] == ORIGIN
  other = preflight("https://evil.example")
  assert "access-control-allow-origin" not in other.headers
  # DNS rebinding: a loopback server answers loopback Host names only.
  assert http.get(server.url("/health"), headers={
      "Host": "evil.example:8000"}).status_code == 400
  assert http.get(server.url("/health"), headers={
      "Host": "localhost"}).status_code == 200


@pytest.mark.slow
def test_schema_fuzzer_finds_no_server_error(server):
  """schemathesis over /openapi.json: no 5xx; every 4xx OpenAI's body."""
  schemathesis = pytest.importorskip("schemathesis")
  # pylint: disable=g-import-not-at-top
  from hypothesis import HealthCheck, given, settings, strategies
  from schemathesis import GenerationMode
  # pylint: enable=g-import-not-at-top
  schema = schemathesis.openapi.from_url(server.url("/openapi.json"))
  sent, statuses = [0], {}

  for operation in schema.get_all_operations():
    operation = operation.ok()

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategies.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE)))
    def fuzz(case):
      for name in ("max_tokens", "max_completion_tokens"):
        if case.body is not None and isinstance(case.body, dict) and (
            name in case.body):
          # Short generations; a value of another type (a negative case: a
          # string, a list) goes as the fuzzer made it, for the server to
          # refuse.
          value = case.body[name]
          if value is None or (isinstance(value, (int, float))
                               and not isinstance(value, bool)):
            case.body[name] = min(value or 0, 20)
      response = case.call(headers=AUTH, timeout=60)
      sent[0] += 1
      statuses[response.status_code] = statuses.get(
          response.status_code, 0) + 1
      assert response.status_code < 500, (case.body, response.text)
      if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param",
                                                 "code"}

    fuzz()
  print(f"schemathesis sent {sent[0]} requests: {statuses}")
  assert sent[0] >= 100


@pytest.fixture(scope="module")
def token_servers(tmp_path_factory):
  """A byte model's server and a byte-level BPE's, started together."""
  tokenizers = pytest.importorskip("tokenizers")
  folder = tmp_path_factory.mktemp("token_servers")
  paths = [token_models.write_bytes(folder / "bytes.npz"),
           token_models.write_bpe(folder / "bpe.npz", tokenizers)[2]]
  servers = [serve_process.RemoteServer([
      f"--model={path}", "--max_batch=4", "--chunk_steps=8",
      "--max_tokens_limit=64", "--max_prompt_tokens=40",
      "--jit_compile=false", "--lanes=1"], wait=False) for path in paths]
  try:
    for running in servers:
      running.wait_until_healthy()
    yield list(zip(paths, servers))
  finally:
    for running in servers:
      running.close()


@pytest.mark.slow
def test_a_long_non_ascii_prompt_is_refused_beside_a_running_request(
    token_servers):
  """A prompt within the limit in characters but over it in ids (a byte or
  byte-fallback model's non-ASCII text) is 400 naming prompt; a request
  running beside it still equals `generate`'s."""
  for path, running in token_servers:
    model = rnnstep.load(path)
    body = dict(prompt="the cat", max_tokens=60, seed=9, temperature=0.9)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      beside = pool.submit(post, running, body, headers={})
      time.sleep(0.05)
      # Characters the BPE saw in training (it has no token for others):
      # at most 40 characters, over 40 ids.
      long = "\u00efv\u00e9 " * 10
      assert len(long) <= 40 < len(model.encode(long))
      assert_error(post(running, dict(prompt=long, max_tokens=4),
                        headers={}), 400, "prompt")
      reply = beside.result()
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["text"] == serve_process.expected(
        model, body, 9)[0][0]


@pytest.mark.slow
def test_a_failed_warm_up_exits_non_zero_saying_why(model_path):
  """The scheduler's warm-up raises (as an out-of-memory or a compile error
  would): the process exits 1 with the reason on stderr, instead of
  answering 503 forever."""
  script = (
      "import sys\n"
      "from rnnstep.serve import scheduler\n"
      "def fail(self):\n"
      "  raise MemoryError('injected: no memory for the programs')\n"
      "scheduler.Scheduler.warm_up = fail\n"
      "from rnnstep.serve import main\n"
      "sys.argv = ['rnnstep-serve', '--model=' + sys.argv[1], '--port=' + "
      "sys.argv[2], '--jit_compile=false', '--lanes=1']\n"
      "main.run()\n")
  # Forked (tests/support/forkserver.py): the warm-up's failure is the
  # point, not a fresh interpreter's start.
  result = forkserver.run(
      [sys.executable, "-c", script, model_path,
       str(serve_process.free_port())], capture_output=True, text=True,
      timeout=120, cwd=cli.REPO, env=cli.ENV)
  assert result.returncode == 1, result
  assert "warm-up failed: MemoryError: injected" in result.stderr


def test_keys_from_a_file_and_the_environment(model_path, tmp_path):
  """--api_key_file and RNNSTEP_API_KEY, checked before the model loads."""
  missing = subprocess.run(
      cli.command("rnnstep-serve", "rnnstep.serve.main") + [
          f"--model={model_path}", f"--api_key_file={tmp_path / 'none'}"],
      capture_output=True, text=True, timeout=120, cwd=cli.REPO, env=cli.ENV)
  assert missing.returncode == 2
  assert missing.stderr.strip().startswith(
      "rnnstep-serve: error: --api_key_file:")
  (tmp_path / "keys").write_text("# the team's keys\nsk-from-file\n\n")
  os.environ["RNNSTEP_API_KEY"] = "sk-from-env"
  try:
    import rnnstep.serve.main as main  # pylint: disable=g-import-not-at-top
    main.FLAGS([f"rnnstep-serve", f"--api_key_file={tmp_path / 'keys'}",
                "--api_key=sk-flag"])
    assert sorted(main._api_keys()) == ["sk-flag", "sk-from-env",
                                        "sk-from-file"]
  finally:
    del os.environ["RNNSTEP_API_KEY"]
    main.FLAGS.unparse_flags()
