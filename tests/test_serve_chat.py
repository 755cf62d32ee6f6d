"""Chat completions (#61): templates, and `rnnstep-serve`'s
`/v1/chat/completions` through the official `openai` client (and the
RWKV-7 server's `/v1/completions`).

The library-level tests check the chat templates against strings written
here (RWKV's convention as BlinkDL's ChatRWKV `API_DEMO_CHAT.py` renders
it) and Jinja's sandbox against hostile templates. The server tests drive
two real server processes, shared by the file and started together: the
RWKV-7 preset of tests/test_rwkv7.py (world vocabulary: RWKV's convention,
its reply ending at a blank line) and the tiny GRU of `cli.write_model`
given a Jinja `--chat_template` file and `--chat_end_of_turn`. Every reply
equals `rnnstep.generate` on the rendered prompt (written out here) with the
same seed, cut before the end of turn.
"""

import concurrent.futures
import json
import pathlib
import shutil

import numpy as np
import pytest

import rnnstep
from rnnstep import convert
from rnnstep.model import chat_template
from rnnstep.model import model_file
from tests.support import cli
from tests.support import http
from tests.support import serve_process

PRESET = str(pathlib.Path(__file__).parent / "data" / "rwkv7" / "preset")
MAX_PROMPT_TOKENS = 128
MAX_TOKENS_LIMIT = 64
MODEL = "chat-model"  # Both servers' --served_model_name.
# The GRU's template: its vocabulary has capitals, ':', ' ' and line ends.
# A first message "boom" makes it refuse; "loop" makes it loop for ever.
GRU_TEMPLATE = """\
{% if messages[0].content == 'boom' %}
{{ raise_exception('boom refused') }}
{% endif %}
{% if messages[0].content == 'loop' %}
{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}
{% endif %}
{% for m in messages %}{{ m.role|upper }}: {{ m.content }}
{% endfor %}
{% if add_generation_prompt %}ASSISTANT:{% endif %}"""
HELLO = [{"role": "user", "content": "Hello there"}]
# RWKV's rendering of HELLO, written out.
HELLO_RWKV = "User: Hello there\n\nAssistant:"


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# -- the templates ------------------------------------------------------------


def test_rwkv_convention_renders_chatrwkv_s_prompt():
  messages = [chat_template.Message(*m) for m in [
      ("system", "  You are terse.\r\n"), ("user", "Hi\n\n\nthere"),
      ("assistant", "Hello!"), ("user", "Bye")]]
  template = chat_template.RwkvTemplate()
  assert template.render(messages) == (
      "System: You are terse.\n\nUser: Hi\nthere\n\nAssistant: Hello!\n\n"
      "User: Bye\n\nAssistant:")
  assert template.end_of_turn == ("\n\n",)
  with pytest.raises(chat_template.TemplateError, match="over 20"):
    template.render(messages, chat_template.Limits(20))


def test_find_takes_the_flag_then_the_model_s_then_rwkv_s(tmp_path):
  assert chat_template.find(None, "characters") is None
  assert isinstance(chat_template.find(None, "world"),
                    chat_template.RwkvTemplate)
  assert chat_template.find(None, "world", end_of_turn=["\n"]
                            ).end_of_turn == ("\n",)
  config = tmp_path / "tokenizer_config.json"
  config.write_text(json.dumps({
      "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>"
                       "{{ m.content }}{{ eos_token }}{% endfor %}"
                       "{% if add_generation_prompt %}<assistant>{% endif %}",
      "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
  data = chat_template.read_tokenizer_config(str(config))
  assert data == model_file.ChatTemplateData(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
      "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>"
      "{% endif %}", "<s>", "</s>")
  for found in (chat_template.find(data, "world"),
                chat_template.find(None, "characters", str(config))):
    assert found.render([chat_template.Message("user", "hi")]) == (
        "<s><user>hi</s><assistant>")
    assert found.end_of_turn == ("</s>",)
  jinja = tmp_path / "t.jinja"
  jinja.write_text("{{ messages[0].content }}!")
  found = chat_template.find(data, "world", str(jinja))  # The flag first.
  assert found.render([chat_template.Message("user", "x")]) == "x!"
  assert found.end_of_turn == ()
  (tmp_path / "bad.json").write_text('{"eos_token": "x"}')
  assert chat_template.read_tokenizer_config(str(tmp_path / "bad.json")) is None
  with pytest.raises(chat_template.TemplateError, match="no chat_template"):
    chat_template.find(None, "characters", str(tmp_path / "bad.json"))
  (tmp_path / "bad.jinja").write_text("{% for %}")
  with pytest.raises(chat_template.TemplateError, match="does not compile"):
    chat_template.find(None, "characters", str(tmp_path / "bad.jinja"))


def test_the_converter_keeps_the_tokenizer_config_s_template(tmp_path):
  """A folder converted (or loaded) with a Hugging Face tokenizer_config.json
  keeps its chat template in the model file; a file without one is written
  as before."""
  folder = tmp_path / "preset"
  shutil.copytree(PRESET, folder)
  data = model_file.ChatTemplateData("{{ messages[0].content }}:", "", "<e>")
  (folder / "tokenizer_config.json").write_text(json.dumps({
      "chat_template": data.template, "eos_token": "<e>"}))
  assert rnnstep.load(str(folder)).chat_template == data
  out = tmp_path / "with.npz"
  summary = convert.convert(str(folder), str(out))
  assert any("chat template" in note for note in summary.notes)
  assert rnnstep.load(str(out)).chat_template == data
  assert model_file.read(str(out)).chat_template == data
  convert.convert(PRESET, str(tmp_path / "without.npz"))
  assert model_file.read(str(tmp_path / "without.npz")).chat_template is None
  with np.load(tmp_path / "without.npz") as archive:
    assert "chat_template" not in archive.files
  # A template that does not compile is refused when converted, naming it.
  (folder / "tokenizer_config.json").write_text(json.dumps({
      "chat_template": "{% for %}"}))
  with pytest.raises(ValueError, match="tokenizer_config.json: the chat "
                     "template does not compile"):
    convert.convert(str(folder), str(tmp_path / "bad.npz"))
  assert not (tmp_path / "bad.npz").exists()
  # A model file's member that is not a template object is refused.
  members = dict(np.load(out))
  members["chat_template"] = np.array('{"template": 3}')
  np.savez(tmp_path / "hostile.npz", **members)
  with pytest.raises(ValueError, match="hostile.npz: chat_template must be"):
    model_file.read(str(tmp_path / "hostile.npz"))


@pytest.mark.parametrize("text,refusal", [
    ("{{ ''.__class__ }}", "unsafe"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    ("{{ messages.append(1) }}", "unsafe"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
     "{% endfor %}", "steps"),
    ("{% set s = messages[0].content * 50000 %}{% for c in s %}{% for d in s %}"
     "{% endfor %}{% endfor %}", "steps"),
    ("{% set ns = namespace(s='xy') %}{% for i in range(64) %}"
     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "string over"),
    ("{{ 'x' * 10**9 }}", "value over"),
    ("{% set ns = namespace(n=9) %}{% for i in range(64) %}"
     "{% set ns.n = ns.n ** 64 %}{% endfor %}", "bits"),
    ("{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}",
     "renders to over"),
    ("{{ raise_exception('no system message') }}", "no system message"),
])
def test_jinja_sandbox_refuses_in_one_line(text, refusal):
  template = chat_template.JinjaTemplate(text, source="t.jinja")
  with pytest.raises(chat_template.TemplateError, match=refusal) as e:
    template.render([chat_template.Message("user", "hello")],
                    chat_template.Limits(100_000))
  assert str(e.value).startswith("t.jinja: ")
  assert "\n" not in str(e.value)


# -- the servers --------------------------------------------------------------

@pytest.fixture(scope="module")
def gru_path(tmp_path_factory):
  folder = tmp_path_factory.mktemp("chat")
  cli.write_model(str(folder / "tiny.npz"))
  (folder / "chat.jinja").write_text(GRU_TEMPLATE)
  return folder


@pytest.fixture(scope="module")
def servers(gru_path):
  """(the RWKV-7 preset's server, the GRU's), started together."""
  if not serve_process.stack_installed():
    pytest.skip("the serving stack is not installed")
  common = ["--max_batch=4", "--chunk_steps=8", "--jit_compile=false",
            "--lanes=1", f"--max_tokens_limit={MAX_TOKENS_LIMIT}",
            f"--max_prompt_tokens={MAX_PROMPT_TOKENS}",
            f"--served_model_name={MODEL}"]
  rwkv = serve_process.RemoteServer([f"--model={PRESET}"] + common,
                                    wait=False)
  gru = serve_process.RemoteServer(
      [f"--model={gru_path / 'tiny.npz'}",
       f"--chat_template={gru_path / 'chat.jinja'}",
       "--chat_end_of_turn=\\n"] + common, wait=False)
  try:
    rwkv.wait_until_healthy(300)
    gru.wait_until_healthy(300)
    yield rwkv, gru
  finally:
    rwkv.close()
    gru.close()


@pytest.fixture(scope="module")
def rwkv_model():
  return rnnstep.load(PRESET)


@pytest.fixture(scope="module")
def gru_model(gru_path):
  return rnnstep.load(str(gru_path / "tiny.npz"))


def expected(model, prompt, seed, end_of_turn, **body):
  """(contents, finish reasons): `rnnstep.generate` on `prompt`, cut before
  the end of turn or a stop string."""
  stop = body.pop("stop", [])
  stop = [stop] if isinstance(stop, str) else stop
  return serve_process.expected(
      model, dict(body, prompt=prompt, stop=stop + [end_of_turn]), seed)


def stream_chat(client, **kwargs):
  """Each choice's streamed content, its finish reason, and the chunks."""
  chunks = list(client.chat.completions.create(model=MODEL, stream=True,
                                               **kwargs))
  contents, reasons, roles = {}, {}, {}
  for chunk in chunks:
    assert chunk.object == "chat.completion.chunk"
    for choice in chunk.choices:
      if choice.delta.role is not None:
        roles[choice.index] = choice.delta.role
        assert choice.index not in contents  # The role comes first.
      contents[choice.index] = contents.get(choice.index, "") + (
          choice.delta.content or "")
      if choice.finish_reason is not None:
        assert choice.index not in reasons  # Once a choice.
        reasons[choice.index] = choice.finish_reason
  assert set(roles.values()) == {"assistant"}
  return contents, reasons, chunks


@pytest.mark.slow
def test_rwkv7_completions_over_http_equal_generate(servers, rwkv_model):
  """The RWKV-7 preset's server (tests/test_rwkv7.py's model) on
  `/v1/completions`: concurrent requests (streamed and not, stop strings, a
  regex, several rows) each give `generate`'s text; logprobs are the
  model's, teacher-forced."""
  server = servers[0]
  bodies = [dict(prompt="Hello the poet said", max_tokens=24, seed=1,
                 temperature=0.9, stop=["he", "an"]),
            dict(prompt=["中文", "the"], max_tokens=20, seed=2,
                 temperature=1.0, regex="[a-z ]+"),
            dict(prompt="café", max_tokens=24, seed=3, temperature=0.9,
                 regex="[a-z ]+", logprobs=1)]
  want = [serve_process.expected(rwkv_model, b, b["seed"])[0]
          for b in bodies]

  def send(body):
    if body["seed"] == 1:  # Streamed: the chunks join into the text.
      with http.stream("POST", server.url("/v1/completions"),
                       json=dict(body, stream=True), timeout=120) as r:
        assert r.status_code == 200
        frames = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
      return ["".join(c["text"] for f in frames for c in f["choices"])]
    reply = http.post(server.url("/v1/completions"), json=body,
                      timeout=120)
    assert reply.status_code == 200, reply.text
    return [c["text"] for c in reply.json()["choices"]]

  with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
    assert list(pool.map(send, bodies)) == want
  # Log-probabilities are the raw model's, teacher-forced over the ids
  # generated (ASCII tokens, by the regex: each names one id).
  choice = http.post(server.url("/v1/completions"), json=bodies[2],
                     timeout=120).json()["choices"][0]
  tokens = choice["logprobs"]["tokens"]
  assert "".join(tokens) == choice["text"] == want[2][0]
  prompt = rwkv_model.encode("café").tolist()
  ids = prompt + [rwkv_model.tokens.pieces.index(t.encode())
                  for t in tokens]
  logp = _log_softmax(rnnstep.logits(rwkv_model, ids)[0].astype(
      np.float64))
  np.testing.assert_allclose(
      choice["logprobs"]["token_logprobs"],
      logp[np.arange(len(prompt) - 1, len(ids) - 1), ids[len(prompt):]],
      atol=1e-4)


@pytest.mark.slow
def test_rwkv7_chat_is_generate_s_text_cut_at_the_end_of_turn(
    servers, rwkv_model):
  client = servers[0].openai_client()
  # Seeds whose replies end at the blank line (else they run to max_tokens).
  reply = client.chat.completions.create(
      model=MODEL, messages=HELLO, max_tokens=60, seed=2, temperature=1.5)
  want, reasons = expected(rwkv_model, HELLO_RWKV, 2, "\n\n", max_tokens=60,
                           temperature=1.5)
  assert reply.object == "chat.completion"
  assert reply.choices[0].message.role == "assistant"
  assert [reply.choices[0].message.content] == want
  assert [reply.choices[0].finish_reason] == reasons == ["stop"]
  assert "\n\n" not in want[0]
  assert reply.usage.prompt_tokens == len(rwkv_model.encode(HELLO_RWKV))

  # n=2, one of which ends its turn; streamed alike, with usage.
  want, reasons = expected(rwkv_model, HELLO_RWKV, 1, "\n\n", n=2,
                           max_tokens=60, temperature=1.5)
  assert "stop" in reasons
  both = client.chat.completions.create(
      model=MODEL, messages=HELLO, n=2, max_completion_tokens=60, seed=1,
      temperature=1.5)
  assert [c.message.content for c in both.choices] == want
  assert [c.finish_reason for c in both.choices] == reasons
  contents, streamed, chunks = stream_chat(
      client, messages=HELLO, n=2, max_tokens=60, seed=1, temperature=1.5,
      stream_options={"include_usage": True})
  assert [contents[0], contents[1]] == want
  assert [streamed[0], streamed[1]] == reasons
  assert chunks[-1].choices == []
  assert chunks[-1].usage.completion_tokens == both.usage.completion_tokens


@pytest.mark.slow
def test_rwkv7_chat_logprobs_are_chat_s_shape_and_the_model_s(
    servers, rwkv_model):
  client = servers[0].openai_client()
  reply = client.chat.completions.create(
      model=MODEL, messages=HELLO, n=2, max_tokens=60, seed=1,
      temperature=1.5, logprobs=True, top_logprobs=3)
  want, _ = expected(rwkv_model, HELLO_RWKV, 1, "\n\n", n=2, max_tokens=60,
                     temperature=1.5)
  prompt = rwkv_model.encode(HELLO_RWKV).tolist()
  pieces = rwkv_model.tokens.pieces
  for choice, text in zip(reply.choices, want):
    assert choice.message.content == text
    entries = choice.logprobs.content
    ids = [pieces.index(bytes(e.bytes)) for e in entries]
    # The ids' bytes are the reply's, and the end of turn's where it ended.
    generated = b"".join(bytes(e.bytes) for e in entries)
    assert generated.decode("utf-8", "replace") in (text, text + "\n\n")
    logp = _log_softmax(rnnstep.logits(rwkv_model, prompt + ids)[0].astype(
        np.float64))
    teacher = logp[np.arange(len(prompt) - 1, len(prompt) + len(ids) - 1),
                   ids]
    np.testing.assert_allclose([e.logprob for e in entries], teacher,
                               atol=1e-4)
    for e in entries:
      tops = [t.logprob for t in e.top_logprobs]
      assert len(tops) == 3 and tops == sorted(tops, reverse=True)
      assert e.logprob <= tops[0] + 1e-6
  # Streamed, the entries come with their chunks (choice 0 alone).
  chunks = list(client.chat.completions.create(
      model=MODEL, messages=HELLO, max_tokens=60, seed=1, temperature=1.5,
      logprobs=True, stream=True))
  streamed = [e.logprob for c in chunks for choice in c.choices
              if choice.logprobs for e in choice.logprobs.content]
  np.testing.assert_allclose(
      streamed, [e.logprob for e in reply.choices[0].logprobs.content],
      atol=1e-4)  # One row, not two: float32 rounding apart.


@pytest.mark.slow
def test_char_model_chat_with_a_template_file(servers, gru_model):
  client = servers[1].openai_client()
  messages = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                           {"type": "text", "text": "there"}]}]
  # The template file's rendering, written out (parts joined by a line).
  prompt = "SYSTEM: Be brief.\nUSER: Hi\nthere\nASSISTANT:"
  body = dict(n=3, max_tokens=40, temperature=1.0, stop="Q")
  want, reasons = expected(gru_model, prompt, 5, "\n", **body)
  # One ends its turn, one at the request's stop string, one at its length.
  assert reasons == ["stop", "length", "stop"] and "Q" not in want[2]
  body["seed"] = 5
  reply = client.chat.completions.create(model=MODEL, messages=messages,
                                         **body)
  assert [c.message.content for c in reply.choices] == want
  assert [c.finish_reason for c in reply.choices] == reasons
  contents, streamed, _ = stream_chat(client, messages=messages, **body)
  assert [contents[k] for k in range(3)] == want
  assert [streamed[k] for k in range(3)] == reasons
  # OpenAI's penalties, as the client sends them: generate's text with them.
  body = dict(max_tokens=40, temperature=0, frequency_penalty=1.5,
              presence_penalty=-0.5)
  want, reasons = expected(gru_model, prompt, 0, "\n", **body)
  reply = client.chat.completions.create(model=MODEL, messages=messages,
                                         seed=0, **body)
  assert [reply.choices[0].message.content] == want


def post_chat(server, body, **kwargs):
  return http.post(server.url("/v1/chat/completions"), json=body,
                   timeout=60, **kwargs)


def refusal(response, status=400):
  assert response.status_code == status, response.text
  error = response.json()["error"]
  assert set(error) == {"message", "type", "param", "code"}
  assert "\n" not in error["message"]
  return error


@pytest.mark.slow
def test_bad_chat_requests_get_400_naming_the_field(servers):
  rwkv, gru = servers
  user = {"role": "user", "content": "x"}
  for body, param in [
      (dict(messages=[user, {"role": "tool", "content": "x"}]),
       "messages[1].role"),
      (dict(messages=[{"role": "user", "content": [
          {"type": "image_url", "image_url": {"url": "http://x"}}]}]),
       "messages[0].content[0].type"),
      (dict(messages=[]), "messages"),
      (dict(messages=[user] * 1025), "messages"),
      (dict(messages=[{"role": "user", "content": "a" * 2000}]),
       "messages"),  # Over --max_prompt_tokens, rendered.
      (dict(messages=[user], presence_penalty=2.5), "presence_penalty"),
      (dict(messages=[user], top_logprobs=2), "top_logprobs"),
      (dict(messages=[user], max_tokens=MAX_TOKENS_LIMIT + 1), "max_tokens"),
      (dict(messages=[user], max_tokens=3, max_completion_tokens=4),
       "max_completion_tokens"),
      (dict(messages=[user], temperature=-1), "temperature"),
      (dict(messages=[user], prompt="x"), "prompt"),
  ]:
    for server in servers:
      assert refusal(post_chat(server, body))["param"] == param, body
  # The GRU's vocabulary has no '#': the rendered prompt is refused.
  error = refusal(post_chat(gru, dict(messages=[
      {"role": "user", "content": "#"}])))
  assert error["param"] == "messages"
  # The template's own refusal, and its loop, bounded.
  for content, words in [("boom", "boom refused"), ("loop", "steps")]:
    error = refusal(post_chat(gru, dict(messages=[
        {"role": "user", "content": content}])))
    assert error["param"] == "messages" and words in error["message"]
  # The same guards as completions.
  assert refusal(post_chat(rwkv, dict(messages=[user], model="other")),
                 404)["param"] == "model"
  assert refusal(http.post(rwkv.url("/v1/chat/completions"),
                           content=b'{"messages": []}', timeout=60,
                           headers={"Content-Type": "text/plain"}), 415)
  schema = http.get(rwkv.url("/openapi.json")).json()
  assert "/v1/chat/completions" in schema["paths"]
  assert "ChatCompletionRequest" in schema["components"]["schemas"]
