"""rnnstep-serve: every response is `rnnstep.generate`'s text, under any load.

The scheduler test runs in-process (quick); the rest drive one real server
process (`tests/support/serve_process.py`) with the official `openai` client
and raw httpx, sharing it across the file; its fixture's teardown drains it
with SIGTERM. The model is the tiny GRU of `cli.write_model`, on the graph path
(`--jit_compile=false`: nothing to compile per batch size), so the whole
file runs in well under a minute on two cores.
"""

import concurrent.futures
import json
import random
import re
import threading
import time

import httpx
import numpy as np
import pytest

import rnnstep
from rnnstep.decoding import options as options_lib
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import lanes as lanes_lib
from rnnstep.serve import protocol
from rnnstep.serve import scheduler as scheduler_lib
from tests.support import cli
from tests.support import http
from tests.support import serve_process

pytestmark = pytest.mark.skipif(not serve_process.stack_installed(),
                                reason="the serving stack is not installed")

MAX_BATCH = 8
MAX_TOKENS_LIMIT = 2000
MAX_QUEUE = 24
PROMPTS = ["ROMEO:", "To be", "a", "First Citizen:\nBefore we proceed",
           "KING RICHARD III:\nNow is the winter"]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("serve") / "tiny.npz")
  cli.write_model(path)
  return path


@pytest.fixture(scope="module")
def model(model_path):
  return rnnstep.load(model_path)


@pytest.fixture(scope="module")
def server(model_path, model):
  with serve_process.RemoteServer([
      f"--model={model_path}", f"--max_batch={MAX_BATCH}", "--chunk_steps=8",
      f"--max_queue={MAX_QUEUE}", f"--max_tokens_limit={MAX_TOKENS_LIMIT}",
      "--max_prompt_tokens=256", "--jit_compile=false", "--drain_timeout=20",
      "--lanes=2"  # Two schedulers of 4 slots (the default on 2 cores).
  ]) as running:
    yield running
    sigterm_drains_in_flight_then_exits_0(running, model)


def sigterm_drains_in_flight_then_exits_0(server, model):
  """The shared server's stop (its fixture's teardown): SIGTERM while a
  stream runs. New work is refused (503) while it drains, the stream ends
  with `generate`'s whole text, and the process exits 0."""
  body = dict(prompt="ROMEO:", max_tokens=1000, seed=5, temperature=0.9)
  with http.stream("POST", server.url("/v1/completions"),
                   json=dict(body, stream=True), timeout=60) as response:
    lines = response.iter_lines()
    text = ""
    for line in lines:
      if line.startswith("data: "):
        text += json.loads(line[6:])["choices"][0]["text"]
        break
    server.process.send_signal(15)
    time.sleep(0.3)
    try:  # New work is refused while it drains (or the socket is closed).
      status = post(server, dict(prompt="a", max_tokens=3)).status_code
    except httpx.TransportError:
      status = 503
    assert status == 503
    for line in lines:
      if line == "data: [DONE]":
        break
      if line.startswith("data: "):
        text += json.loads(line[6:])["choices"][0]["text"]
  assert text == serve_process.expected(model, body, 5)[0][0]
  assert server.process.wait(60) == 0


def post(server, body, timeout=60, **kwargs):
  return http.post(server.url("/v1/completions"), json=body, timeout=timeout,
                   **kwargs)


def stream_text(server, body):
  """Each choice's streamed text joined, its finish reasons, the frames and
  the seed the server reports (None after a 429)."""
  texts, reasons, frames, seed = {}, {}, [], None
  with http.stream("POST", server.url("/v1/completions"),
                   json=dict(body, stream=True), timeout=60) as response:
    if response.status_code == 429:
      return None
    assert response.status_code == 200, response.read()
    for line in response.iter_lines():
      if not line.startswith("data: "):
        continue
      frames.append(line[len("data: "):])
      if frames[-1] == "[DONE]":
        break
      seed = json.loads(frames[-1])["seed"]
      for choice in json.loads(frames[-1])["choices"]:
        texts[choice["index"]] = texts.get(choice["index"], "") + choice[
            "text"]
        if choice["finish_reason"] is not None:
          assert choice["index"] not in reasons  # Once per choice.
          reasons[choice["index"]] = choice["finish_reason"]
  return texts, reasons, frames, seed


# -- the scheduler, in-process ------------------------------------------------


def test_scheduler_rows_equal_generate_whatever_shares_the_batch(model):
  """Rows admitted at different chunks, in any slot, with per-row options."""
  scheduler = scheduler_lib.Scheduler(
      model, path="graph", max_batch=4, chunk_steps=5, max_queue=64,
      max_tokens_limit=64, max_prompt_tokens=128)
  scheduler.warm_up()
  traces = (
      scheduler.generator.programs.serve_fn.experimental_get_tracing_count())
  scheduler.start()
  cases = [  # (prompts, max_tokens, seed, key, want_scores, options)
      (["ROMEO:"] * 3, 33, 1, completion_lib.Shared(), False,
       dict(temperature=0.8)),
      (["Hi", "there you"], 23, 2, completion_lib.Shared(), False,
       dict(top_k=5)),
      (["x"], 50, 3, completion_lib.Shared(stop=("e",)), False,
       dict(repetition_penalty=1.3)),
      (["ab", "b"], 17, 4, completion_lib.Shared(), True, dict(top_p=0.9)),
      (["q"], 30, 5, completion_lib.Shared(no_repeat_ngram_size=2), False, {}),
      (["a"], 30, 6, completion_lib.Shared(regex="[a-z ]+\\."), False,
       dict(temperature=0.0)),
      (["To", "b"], 40, 9, completion_lib.Shared(
          stop=("th", "e r"), regex="[a-z]+( [a-z]+)*", repetition_window=3,
          no_repeat_ngram_size=3), False, dict(repetition_penalty=1.2)),
      # Prompts longer than a piece (8 characters here), primed across
      # chunks beside short ones; the penalty reads the whole prompt's
      # history (the last 7 characters of it).
      ([PROMPTS[4] * 2, "ab", PROMPTS[3]], 25, 7,
       completion_lib.Shared(repetition_window=7), True,
       dict(repetition_penalty=1.3)),
      ([PROMPTS[4] + PROMPTS[3]], 20, 8, completion_lib.Shared(), False, {}),
      # OpenAI's penalties count each row's continuation across chunks, not
      # its prompt (primed across chunks here too).
      ([PROMPTS[4] * 2, "ab"], 30, 10, completion_lib.Shared(), False,
       dict(frequency_penalty=0.7, presence_penalty=-0.4)),
  ]
  outputs = []
  for prompts, max_tokens, seed, key, want, options in cases:
    out, done = {}, threading.Event()

    def sink(update, out=out, done=done, count=len(prompts)):
      text, _, _ = out.get(update.index, ("", None, 0.0))
      out[update.index] = (text + update.text, update.finish_reason,
                           update.score)
      if len(out) == count and all(v[1] for v in out.values()):
        done.set()

    params = options_lib.Params(**{o.name: options.get(o.name, o.default)
                                   for o in options_lib.PER_ROW})
    scheduler.submit(completion_lib.Completion(
        [model.encode(p) for p in prompts], [params] * len(prompts),
        seed=seed, max_tokens=max_tokens, shared=key, want_scores=want,
        sink=sink))
    outputs.append((out, done))
    time.sleep(0.005)  # Arrivals between chunks.
  for (prompts, max_tokens, seed, key, want, options), (out, done) in zip(
      cases, outputs):
    assert done.wait(60)
    reference = rnnstep.generate(
        model, prompts, max_tokens, seed=seed, stop=list(key.stop) or None,
        regex=key.regex, no_repeat_ngram_size=key.no_repeat_ngram_size,
        repetition_window=key.repetition_window, return_scores=want,
        jit_compile=False, **options)
    texts = [out[i][0] for i in range(len(prompts))]
    if want:
      reference, scores = reference
      assert [out[i][2] for i in range(len(prompts))] == pytest.approx(
          scores, rel=1e-5)
    assert texts == reference
  assert scheduler.close(timeout=10)
  assert scheduler.stats.running == 0 and scheduler.stats.waiting == 0
  # Rows of different stop strings, patterns and look-back settings ran in
  # the same chunks.
  assert scheduler.stats.mixed_chunks > 0
  # New prompts, lengths, options, batch sizes, stop lists, patterns: nothing
  # traced after warm_up.
  assert (scheduler.generator.programs.serve_fn
          .experimental_get_tracing_count()) == traces


def test_scheduler_row_over_the_joined_tables_limit_waits(model, monkeypatch):
  """A row whose stop strings would take the joined table over its limit
  waits for the running rows to drain (nothing overtakes it), then runs."""
  from rnnstep.decoding import stopping  # pylint: disable=g-import-not-at-top
  # Room for 6 states: "abcd" (5) beside the plain row's (1), not "xyz" (4).
  monkeypatch.setattr(stopping, "MAX_TABLE_BYTES", 6 * model.vocab_size * 4)
  scheduler = scheduler_lib.Scheduler(
      model, path="graph", max_batch=4, chunk_steps=5, max_queue=8,
      max_tokens_limit=64, max_prompt_tokens=16)
  events, done = [], threading.Event()
  cases = [("abcd",), (), ("xyz",)]

  def sink(update, k):
    events.append((k, update))
    if sum(1 for _, u in events if u.finish_reason) == len(cases):
      done.set()

  for k, stop in enumerate(cases):
    scheduler.submit(completion_lib.Completion(
        [model.encode("ROMEO:")], [options_lib.DEFAULTS], seed=k,
        max_tokens=30, shared=completion_lib.Shared(stop=stop),
        want_scores=False, sink=lambda update, k=k: sink(update, k)))
  scheduler.start()
  try:
    assert done.wait(60)
  finally:
    assert scheduler.close(timeout=10)
  for k, stop in enumerate(cases):
    assert "".join(u.text for j, u in events if j == k) == rnnstep.generate(
        model, "ROMEO:", 30, seed=k, stop=list(stop) or None,
        jit_compile=False)
  order = [k for k, _ in events]
  assert order.index(2) > max(i for i, k in enumerate(order) if k == 0)
  assert scheduler.stats.mixed_chunks > 0  # The first two ran together.


def test_scheduler_tables_keep_one_shape_on_compiling_paths(model):
  """Under XLA every chunk's joined tables have the warm-up's shapes,
  whatever stop lists and patterns its rows bring (nothing compiles)."""
  scheduler = scheduler_lib.Scheduler(
      model, path="xla", max_batch=4, chunk_steps=8, max_queue=4,
      max_tokens_limit=16)
  shapes = set()
  for settings in [[()], [("a",), ("bc", "d")],
                   [("the", "and"), (), ("xyz",), ("q",)]]:
    for regex in [None, "[a-z]+", "[0-9]+, [A-Z][a-z]*\\."]:
      rows = [completion_lib.Completion(
          [model.encode("a")], [options_lib.DEFAULTS], seed=0, max_tokens=1,
          shared=completion_lib.Shared(stop=stop, regex=regex),
          want_scores=False, sink=None).rows[0] for stop in settings]
      tables = scheduler.calls.tables.joined(rows)
      shapes.add((tables.stops.table.shape, tables.dfa.table.shape))
  capacities = scheduler.calls.tables
  assert shapes == {((capacities.stop_capacity, model.vocab_size),
                     (capacities.dfa_capacity, model.vocab_size))}


def test_lanes_split_slots_hold_the_queue_and_give_generate_s_text(model):
  """Two lanes (rnnstep/serve/lanes.py): a request goes whole to the lane
  with the fewest rows, the queue limit holds across the lanes, and every
  row's text is `generate`'s whichever lane ran it."""
  # A lane a core unless the CPU kind was measured faster with one.
  assert lanes_lib.default_lanes("avx512_bf16", 2, 64) == 2
  assert lanes_lib.default_lanes("other", 8, 4) == 4
  assert all(lanes_lib.default_lanes(kind, 2, 64) == 1
             for kind in lanes_lib.ONE_LANE_KINDS)
  # An RWKV-7 model: one lane on any CPU (ONE_LANE_CELL_KINDS).
  assert lanes_lib.default_lanes("avx512_bf16", 2, 64, ("rwkv7",)) == 1
  assert lanes_lib.default_lanes("avx512_bf16", 2, 64, ("gru", "lstm")) == 2
  assert lanes_lib.split_slots(64, 2) == [32, 32]
  assert lanes_lib.split_slots(7, 3) == [3, 2, 2]
  with pytest.raises(ValueError):
    lanes_lib.split_slots(1, 2)
  schedulers = [scheduler_lib.Scheduler(
      model, path="graph", max_batch=2, chunk_steps=5,
      max_queue=lanes_lib.lane_queue(3, 4, 2), max_tokens_limit=64,
      max_prompt_tokens=128) for _ in range(2)]
  lanes = lanes_lib.Lanes(schedulers, max_queue=3)
  assert lanes.max_batch == 4
  outputs = []

  def submit(prompts, seed):
    out, done = {}, threading.Event()

    def sink(update, out=out, done=done, count=len(prompts)):
      out[update.index] = out.get(update.index, "") + update.text
      if update.finish_reason:
        out.setdefault("ended", set()).add(update.index)
      if len(out.get("ended", ())) == count:
        done.set()

    lanes.submit(completion_lib.Completion(
        [model.encode(p) for p in prompts],
        [options_lib.DEFAULTS] * len(prompts), seed=seed, max_tokens=21,
        shared=completion_lib.Shared(), want_scores=False, sink=sink))
    outputs.append((prompts, seed, out, done))

  # Nothing runs yet: 4 free slots and 3 queue places take 7 rows in all.
  submit(["ROMEO:", "To be", "a", "b"], 1)  # 4 rows: the first lane.
  submit(["KING", "x"], 2)                   # The emptier lane.
  with pytest.raises(completion_lib.QueueFull):
    submit(["no", "room"], 3)                # 8 rows > 7.
  with pytest.raises(ValueError, match="prompt"):
    submit(["x" * 129], 5)                   # Over max_prompt_tokens.
  submit(["y"], 4)                           # 7: the second lane again.
  assert [e.stats.waiting for e in schedulers] == [4, 3]
  assert lanes.stats.waiting == 7
  lanes.warm_up()
  lanes.start()
  for prompts, seed, out, done in outputs:
    assert done.wait(60)
    assert [out[i] for i in range(len(prompts))] == rnnstep.generate(
        model, prompts, 21, seed=seed, jit_compile=False)
  assert lanes.close(timeout=10)
  assert lanes.stats.running == 0 and lanes.stats.chunks >= 2


def test_trim_stop_and_hold_back():
  assert protocol.trim_stop("abc\n\n", ["\n", "\n\n"]) == "abc"
  assert protocol.trim_stop("abc", ["x"]) == "abc"
  assert protocol.held_back(["ab", "abcd"]) == 3
  assert protocol.held_back([]) == 0


def test_a_running_chunk_is_the_json_of_its_envelope():
  """The stream's bytes, formatted directly, are json.dumps's."""
  envelope = {"id": "cmpl-1", "object": "text_completion", "created": 5,
              "model": "m", "seed": 3, "choices": []}
  head = protocol.chunk_head(envelope)
  for text in ["", 'a "q" \\ \n\r\t}]', "\u00e9\u2026\u2028\x00"]:
    want = dict(envelope, choices=[{"index": 2, "text": text,
                                    "logprobs": None, "finish_reason": None}])
    assert protocol.running_chunk(head, 2, text) == (
        f"data: {json.dumps(want)}\r\n\r\n".encode())


# -- the server process -------------------------------------------------------


@pytest.mark.slow
def test_models_health_and_one_completion_with_openai_client(server, model):
  assert http.get(server.url("/health")).status_code == 200
  listed = http.get(server.url("/v1/models")).json()
  assert listed["object"] == "list" and len(listed["data"]) == 1
  client = server.openai_client()
  response = client.completions.create(
      model=listed["data"][0]["id"], prompt="ROMEO:", max_tokens=40, seed=7,
      temperature=0.7, extra_body={"top_k": 10})
  want, reasons = serve_process.expected(
      model, dict(prompt="ROMEO:", max_tokens=40, temperature=0.7, top_k=10),
      7)
  assert [c.text for c in response.choices] == want
  assert [c.finish_reason for c in response.choices] == reasons
  assert response.object == "text_completion"
  assert response.usage.completion_tokens == 40
  assert response.usage.prompt_tokens == 6


@pytest.mark.slow  # The server process, as its other tests.
def test_token_id_prompts_answer_as_their_text_does(server, model):
  """#61: `prompt` as a list of ints (one prompt) or of int lists (one
  prompt each), as OpenAI's completions take it: the same continuation as
  the prompt as a string (greedy and seeded, streamed too); an echo puts
  the ids' text in front."""
  texts = ["ROMEO:", "To be"]
  ids = [model.encode(t).tolist() for t in texts]
  for settings in (dict(temperature=0), dict(temperature=0.9, seed=11)):
    for as_text, as_ids in ((texts[0], ids[0]), (texts, ids)):
      body = dict(settings, prompt=as_text, max_tokens=24, n=2, seed=11)
      want = post(server, body).json()
      got = post(server, dict(body, prompt=as_ids)).json()
      assert [c["text"] for c in got["choices"]] == [
          c["text"] for c in want["choices"]], (body, got)
      assert got["usage"] == want["usage"]
      assert [c["text"] for c in got["choices"]] == serve_process.expected(
          model, body, 11)[0]
  streamed, _, _, _ = stream_text(server, dict(prompt=ids, max_tokens=24,
                                               seed=4, temperature=0.9))
  whole = post(server, dict(prompt=texts, max_tokens=24, seed=4,
                            temperature=0.9)).json()
  assert [streamed[k] for k in range(2)] == [c["text"] for c in
                                             whole["choices"]]
  echoed = post(server, dict(prompt=ids[1], max_tokens=5, seed=1,
                             echo=True)).json()
  assert echoed["choices"][0]["text"] == texts[1] + post(
      server, dict(prompt=texts[1], max_tokens=5, seed=1)).json()[
          "choices"][0]["text"]
  client = server.openai_client()
  response = client.completions.create(model="tiny", prompt=ids[0],
                                       max_tokens=12, seed=2)
  assert response.choices[0].text == serve_process.expected(
      model, dict(prompt=texts[0], max_tokens=12), 2)[0][0]
  reply = post(server, dict(prompt=[ids[0], [3, 4, 65]], max_tokens=5))
  assert reply.status_code == 400
  assert reply.json()["error"]["message"] == (
      "prompts[1][2] = 65 is outside the vocabulary of 65 ids (0 to 64)")


@pytest.mark.slow
def test_chat_without_a_template_is_400_naming_the_flag(server):
  """A character model has no chat template of its own: without
  --chat_template its chat requests are refused, never given a guessed
  format (tests/test_serve_chat.py serves chat)."""
  reply = http.post(server.url("/v1/chat/completions"), timeout=60, json=dict(
      messages=[{"role": "user", "content": "hi"}], max_tokens=5))
  assert reply.status_code == 400
  error = reply.json()["error"]
  assert "--chat_template" in error["message"]
  assert error["code"] == "no_chat_template"


@pytest.mark.slow
def test_streamed_chunks_join_into_the_whole_text(server, model):
  for body in [
      dict(prompt=["ROMEO:", "a"], n=2, max_tokens=60, seed=3,
           temperature=0.9),
      dict(prompt="To be", max_tokens=80, seed=4, stop=["e ", "th"]),
      dict(prompt="To be", max_tokens=80, seed=4, stop=["e ", "th"],
           include_stop_str_in_output=True),
      dict(prompt="a", max_tokens=0, seed=1),
  ]:
    whole = post(server, body).json()
    assert whole["seed"] == body["seed"]
    texts, reasons, frames, _ = stream_text(server, body)
    assert frames[-1] == "[DONE]"
    count = len(whole["choices"])
    assert [texts.get(k, "") for k in range(count)] == [
        c["text"] for c in whole["choices"]]
    assert [reasons[k] for k in range(count)] == [
        c["finish_reason"] for c in whole["choices"]]
    want, want_reasons = serve_process.expected(model, body, body["seed"])
    assert [c["text"] for c in whole["choices"]] == want, body
    assert [c["finish_reason"] for c in whole["choices"]] == want_reasons


@pytest.mark.slow
def test_concurrent_random_requests_each_equal_generate(server, model):
  rng = random.Random(0)
  bodies = [serve_process.random_body(rng, PROMPTS, 120) for _ in range(32)]
  # One request without a seed: the response names the one it drew.
  bodies.append(dict(prompt="ROMEO:", max_tokens=50, temperature=1.0))

  def send(body, streamed):
    time.sleep(rng.random() * 0.5)  # Random arrivals.
    while True:  # A client retries after a 429, as its Retry-After says.
      if streamed:
        got = stream_text(server, body)
        if got is not None:
          return body, got[3], got[0], got[1]
      else:
        reply = post(server, body)
        if reply.status_code != 429:
          break
      time.sleep(0.2)
    assert reply.status_code == 200, reply.text
    reply = reply.json()
    return body, reply["seed"], {c["index"]: c["text"] for c in reply[
        "choices"]}, {c["index"]: c["finish_reason"] for c in reply[
            "choices"]}

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    results = list(pool.map(send, bodies, [
        body.get("n", 1) == 1 and rng.random() < 0.5 for body in bodies]))
  for body, seed, texts, reasons in results:
    seed = body.get("seed", seed)
    want, want_reasons = serve_process.expected(model, body, seed)
    assert [texts[k] for k in range(len(want))] == want, body
    assert [reasons[k] for k in range(len(want))] == want_reasons, body


@pytest.mark.slow
def test_a_long_prompt_is_primed_across_chunks_while_others_decode(
    server, model):
  # 230 characters, in pieces of 8 (the server's --chunk_steps) each
  # overlapping the last by the character priming leaves to the first step:
  # 32 calls only prime, the 33rd primes the last piece and decodes.
  long_prompt = " ".join([PROMPTS[3]] * 7)
  alone = dict(prompt=long_prompt, max_tokens=16, seed=11)
  chunks = once_idle(server, "rnnstep_chunks")
  saved = once_idle(server, "rnnstep_prefix_cache_tokens_saved")
  assert post(server, alone).json()["choices"][0]["text"] == (
      serve_process.expected(model, alone, 11)[0][0])
  # 16 characters take 2 calls of 8 steps: primed whole, 2 calls in all.
  # Fewer where the prefix cache held a prefix of it (earlier tests on this
  # server send PROMPTS[3]): those pieces are not primed again.
  calls = once_idle(server, "rnnstep_chunks") - chunks
  if once_idle(server, "rnnstep_prefix_cache_tokens_saved") == saved:
    assert calls == 32 + 2
  else:
    assert calls < 32 + 2
  # Beside rows decoding (streamed, admitted first) and rows of its own
  # request that decode while it primes; the penalty reads the whole
  # prompt's history.
  others = [dict(prompt=p, max_tokens=160, seed=k, temperature=0.9)
            for k, p in enumerate(PROMPTS[:3])]
  long_ones = [dict(prompt=[long_prompt, "a", long_prompt[:100]], n=1,
                    max_tokens=60, seed=12, repetition_penalty=1.3),
               dict(prompt=long_prompt[:150], max_tokens=40, seed=13,
                    stop=["e"], temperature=0.7)]

  def send(body):
    if body in others:
      texts, _, _, _ = stream_text(server, body)
      return [texts[0]]
    time.sleep(0.2)  # After the others have started decoding.
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    return [c["text"] for c in reply.json()["choices"]]

  with concurrent.futures.ThreadPoolExecutor(5) as pool:
    results = list(pool.map(send, others + long_ones))
  for body, texts in zip(others + long_ones, results):
    assert texts == serve_process.expected(model, body, body["seed"])[0], body


def stop_across_a_chunk(text, chunk):
  """A 3-character stop string of `text` that ends in a later chunk than it
  starts (a row's chunks end every `chunk` characters), met first there."""
  for boundary in range(chunk, len(text) - 2, chunk):
    for start in range(boundary - 2, boundary):
      if text.find(text[start:start + 3]) == start:
        return text[start:start + 3]
  raise AssertionError(f"no stop string across a chunk in {text!r}")


@pytest.mark.slow
def test_rows_of_different_settings_run_in_the_same_chunks(server, model):
  """Stop lists (one spanning a chunk boundary), regexes, n-gram sizes and
  windows, and plain rows, arriving together: each is generate's text, and
  they share chunks rather than wait for each other to drain."""
  plain = dict(prompt="To be", max_tokens=80, seed=22, temperature=0.9)
  spanning = stop_across_a_chunk(serve_process.expected(
      model, plain, 22)[0][0], 8)  # The server's --chunk_steps.
  bodies = [
      dict(prompt="ROMEO:", max_tokens=60, seed=21, temperature=0.8),
      dict(plain, stop=[spanning, "zzz"]),
      dict(prompt="a", max_tokens=70, seed=23, stop=["e ", "th"]),
      dict(prompt="a", max_tokens=70, seed=24, regex="[a-z ]+\\.",
           temperature=0.7),
      dict(prompt="ROMEO:", max_tokens=70, seed=25,
           regex="[A-Z][a-z]+(, [a-z]+)*\\n"),
      dict(prompt="To be", max_tokens=70, seed=26, no_repeat_ngram_size=2),
      dict(prompt="a", max_tokens=70, seed=27, no_repeat_ngram_size=3,
           repetition_penalty=1.3, repetition_window=5),
      dict(prompt="ROMEO:", max_tokens=70, seed=28, repetition_penalty=1.3,
           repetition_window=12, stop=["\n"]),
  ]
  assert len(bodies) == MAX_BATCH
  chunks = once_idle(server, "rnnstep_chunks")
  mixed = metric(server, "rnnstep_mixed_settings_chunks")
  start = threading.Barrier(len(bodies))

  def send(body):
    start.wait()  # Together.
    if body is bodies[1]:  # Streamed: its stop string is held back.
      texts, reasons, _, _ = stream_text(server, body)
      return texts[0], reasons[0]
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    return (reply.json()["choices"][0]["text"],
            reply.json()["choices"][0]["finish_reason"])

  with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
    results = list(pool.map(send, bodies))
  for body, (text, reason) in zip(bodies, results):
    want, reasons = serve_process.expected(model, body, body["seed"])
    assert (text, reason) == (want[0], reasons[0]), body
  assert results[1][1] == "stop"
  # Run one settings at a time, each request would need a chunk per 8
  # characters of its own; together each of the server's two lanes needs
  # about its longest's (more when a loaded machine staggers the arrivals
  # over chunks: 28 against 55 seen, where 18 is the least).
  generated = [len(serve_process.expected(
      model, dict(body, include_stop_str_in_output=True), body["seed"])[0][0])
               for body in bodies]
  ran = once_idle(server, "rnnstep_chunks") - chunks
  assert ran < sum(-(-n // 8) for n in generated), (ran, generated)
  assert metric(server, "rnnstep_mixed_settings_chunks") - mixed >= 5


@pytest.mark.exhaustive  # Three more servers (a minute); the default run's
# servers take this machine's default path.
def test_xla_elementwise_and_strategy_servers_give_generates_text(model_path,
                                                                  model):
  """The other two paths through the server, and its slots over 2 devices,
  with and without `logprobs`.

  Kept cheap for CI: few shapes, so few compiles (2 slots: batch buckets 1
  and 2; pieces of 8: one prompt width); the three servers start at once
  while this process computes the references; each request is one row of
  16 characters with the same stop string (one shape of `generate`'s
  program per path). The strategy's server runs the graph path over two
  logical CPUs with 3 slots (an odd count: a replica is padded).
  """
  servers = {  # name: (flags, generate's jit_compile)
      "xla": (["--jit_compile=true", "--max_batch=2", "--lanes=1"], True),
      "elementwise": (["--jit_compile=elementwise", "--max_batch=2"],
                      "elementwise"),
      "strategy": (["--jit_compile=false", "--max_batch=3",
                    "--strategy=mirrored", "--devices=/cpu:0,/cpu:1"], False),
  }
  running = {name: serve_process.RemoteServer([
      f"--model={model_path}", "--chunk_steps=8", "--max_queue=8",
      "--max_tokens_limit=48", "--max_prompt_tokens=16"] + flags, wait=False)
             for name, (flags, _) in servers.items()}
  try:
    # 16 characters: primed in three pieces. Four requests for 2 or 3
    # slots: rows join and leave while others run. Each its own stop
    # strings, joined in one table (all four fit the warm-up's 16 states:
    # nothing compiles).
    bodies = [dict(prompt=prompt, max_tokens=48, seed=seed, stop=stop,
                   temperature=temperature)
              for seed, (prompt, temperature, stop) in enumerate([
                  ("First Citizen:\nB", 0.8, ["th"]),
                  ("KING RICHARD III", 0.0, ["e "]),
                  ("ROMEO:\nBut soft,", 1.3, ["th", "ou"]),
                  ("To be, or not to", 0.8, ["o,"])])]
    want = {name: [serve_process.expected(model, body, body["seed"],
                                          jit_compile=jit_compile)[0]
                   for body in bodies]
            for name, (_, jit_compile) in servers.items()}
    for name, server in running.items():
      server.wait_until_healthy(300)  # Three compiling at once.

      def send(body, server=server):
        if body["seed"] % 2:
          return [stream_text(server, body)[0][0]]
        reply = post(server, body)
        assert reply.status_code == 200, reply.text
        return [c["text"] for c in reply.json()["choices"]]

      with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        assert list(pool.map(send, bodies)) == want[name], name
    # `logprobs` on every path and over the strategy's replicas: each
    # token's is the raw model's, teacher-forced (`rnnstep.logits`).
    probe = dict(prompt="ROMEO:", max_tokens=12, seed=7, temperature=0.9,
                 logprobs=2)
    start = len(model.encode(probe["prompt"]))
    for name, server in running.items():
      reply = post(server, probe)
      assert reply.status_code == 200, reply.text
      choice = reply.json()["choices"][0]
      assert "".join(choice["logprobs"]["tokens"]) == choice["text"], name
      ids = model.encode(probe["prompt"] + choice["text"])
      logits = rnnstep.logits(model, ids[None])[0].astype(np.float64)
      logits -= logits.max(axis=-1, keepdims=True)
      log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
      np.testing.assert_allclose(
          choice["logprobs"]["token_logprobs"],
          log_softmax[np.arange(start - 1, len(ids) - 1), ids[start:]],
          atol=1e-4, err_msg=name)
  finally:
    for server in running.values():
      server.close()


@pytest.mark.slow
def test_the_xla_server_answers_while_its_programs_compile(model_path,
                                                            model):
  """Under XLA (the default path of a 64-slot server on AVX2) the server
  is ready once the graph path is traced: /health says 200 while its XLA
  programs compile (14 for 64 slots, minutes), a completion served then
  (on the graph path) is `generate`'s text on either path, and SIGTERM
  while a program compiles exits 0."""
  with serve_process.RemoteServer([
      f"--model={model_path}", "--jit_compile=true", "--lanes=1",
      "--max_batch=64"]) as server:
    assert http.get(server.url("/health")).json()["programs_compiling"] > 0
    body = dict(prompt=PROMPTS[3], max_tokens=60, seed=4, temperature=0.8)
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    assert metric(server, "rnnstep_interim_chunks") > 0
    assert metric(server, "rnnstep_programs_compiling") > 0
    assert server.terminate(timeout=30) == 0
    # The graph path's reference (what ran; XLA's agrees, README
    # "Reproducibility", and compiles for seconds more).
    assert reply.json()["choices"][0]["text"] == serve_process.expected(
        model, body, 4)[0][0]


@pytest.mark.slow
def test_bad_input_answers_400_naming_the_field_then_serves(server, model):
  cases = [
      (b"{not json", "body"),
      (dict(prompt="a", max_tokens=5, colour="red"), "colour"),
      (dict(prompt="a", max_tokens=5, temperature="hot"), "temperature"),
      (dict(prompt="a", max_tokens=5, top_p=2), "top_p"),
      (dict(prompt="a", max_tokens=5, top_k=-1), "top_k"),
      (dict(prompt="ab\u20ac", max_tokens=5), "prompt"),
      (dict(prompt="", max_tokens=5), "prompt"),
      # Token ids (#61): taken, but each one must be a usable id.
      (dict(prompt=[1, 65], max_tokens=5), "prompt"),
      (dict(prompt=[[1, 2], [3, -1]], max_tokens=5), "prompt"),
      (dict(prompt=[[1, 2], "a"], max_tokens=5), "prompt"),
      (dict(prompt=[[]], max_tokens=5), "prompt"),
      (dict(prompt=[1, True], max_tokens=5), "prompt"),
      (dict(prompt="a", max_tokens=MAX_TOKENS_LIMIT + 1), "max_tokens"),
      (dict(prompt="a", max_tokens=-1), "max_tokens"),
      (dict(prompt=["a", "b", "c"], n=3, max_tokens=5), "n"),
      (dict(prompt="a", max_tokens=5, regex="("), "regex"),
      (dict(prompt="a", max_tokens=5, stop=""), "stop"),
      (dict(prompt="a", max_tokens=5, stop=["\u20ac"]), "stop"),
      (dict(prompt="a", max_tokens=5, seed="x"), "seed"),
      (dict(prompt="a", max_tokens=5, stream="yes"), "stream"),
      (dict(prompt="a", max_tokens=5, logprobs=9), "logprobs"),
      (dict(prompt="a", max_tokens=5, presence_penalty=2.5),
       "presence_penalty"),
      (dict(prompt="a", max_tokens=5, frequency_penalty="x"),
       "frequency_penalty"),
  ]
  for body, param in cases:
    if isinstance(body, bytes):
      reply = http.post(server.url("/v1/completions"), content=body,
                        headers={"content-type": "application/json"})
    else:
      reply = post(server, body)
    assert reply.status_code == 400, (body, reply.text)
    error = reply.json()["error"]
    assert error["param"] == param, (body, error)
    assert error["type"] == "invalid_request_error"
    assert error["message"] and "\n" not in error["message"]
  import openai  # pylint: disable=g-import-not-at-top
  with pytest.raises(openai.BadRequestError, match="top_p"):
    server.openai_client().completions.create(model="tiny", prompt="a",
                                              max_tokens=3, top_p=7)
  # An oversized body is refused from its length, before it is parsed.
  reply = http.post(server.url("/v1/completions"),
                    content=b"x" * (8 << 20),
                    headers={"content-type": "application/json"})
  assert reply.status_code == 413
  assert post(server, dict(prompt="a", max_tokens=5, seed=1)).status_code == 200
  # OpenAI's penalties, as the openai client sends them, are generate's.
  penalized = server.openai_client().completions.create(
      model="tiny", prompt="ROMEO:", max_tokens=30, seed=3,
      frequency_penalty=0.8, presence_penalty=-0.5)
  assert penalized.choices[0].text == serve_process.expected(model, dict(
      prompt="ROMEO:", max_tokens=30, frequency_penalty=0.8,
      presence_penalty=-0.5), 3)[0][0]


def metric(server, name, labels=""):
  page = http.get(server.url("/metrics")).text
  found = re.search(rf"^{re.escape(name + labels)} (\S+)$", page, re.M)
  return float(found.group(1)) if found else 0.0


def once_idle(server, name):
  """A metric's value once no row runs (the scheduler has counted its last
  chunk: it may answer a request before it counts the chunk)."""
  deadline = time.monotonic() + 10
  while metric(server, "rnnstep_requests_running") > 0:
    assert time.monotonic() < deadline
    time.sleep(0.05)
  return metric(server, name)


def generated_once_idle(server, before):
  """Characters generated since `before` (the counter), once no row runs."""
  return once_idle(server, "rnnstep_generated_characters_total") - before


@pytest.mark.slow
def test_disconnect_mid_stream_cancels_the_row(server):
  before = metric(server, "rnnstep_generated_characters_total")
  with http.stream("POST", server.url("/v1/completions"), json=dict(
      prompt="ROMEO:", max_tokens=MAX_TOKENS_LIMIT, seed=1, stream=True,
      repetition_penalty=1.1, no_repeat_ngram_size=2),
                    timeout=60) as response:
    for line in response.iter_lines():
      if line.startswith("data: "):
        break  # The first chunk; then the client goes away.
  assert generated_once_idle(server, before) < MAX_TOKENS_LIMIT
  # A non-streamed client that gives up is noticed too.
  before = metric(server, "rnnstep_generated_characters_total")
  with pytest.raises(httpx.ReadTimeout):
    post(server, dict(prompt="ROMEO:", max_tokens=MAX_TOKENS_LIMIT, seed=2,
                      repetition_penalty=1.1, no_repeat_ngram_size=2),
         timeout=0.5)
  assert generated_once_idle(server, before) < MAX_TOKENS_LIMIT
  # The slot is free: the next request gets it.
  assert post(server, dict(prompt="a", max_tokens=5, seed=1)).status_code == 200


@pytest.mark.slow
def test_full_queue_answers_429_with_retry_after(server):
  body = dict(prompt="ROMEO:", n=MAX_BATCH, max_tokens=200, seed=1)
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    replies = list(pool.map(lambda _: post(server, body), range(8)))
  statuses = sorted(r.status_code for r in replies)
  assert 429 in statuses and 200 in statuses, statuses
  assert set(statuses) == {200, 429}
  refused = next(r for r in replies if r.status_code == 429)
  assert refused.headers["retry-after"]
  assert refused.json()["error"]["code"] == "queue_full"


@pytest.mark.slow
def test_metrics_count_what_was_served(server):
  names = ['rnnstep_requests_total{status="200"}',
           'rnnstep_requests_total{status="400"}',
           "rnnstep_generated_characters_total",
           "rnnstep_time_to_first_character_seconds_count",
           "rnnstep_e2e_request_latency_seconds_count"]
  before = [metric(server, name) for name in names]
  for seed in range(3):
    assert post(server, dict(prompt="a", max_tokens=20, n=2,
                             seed=seed)).status_code == 200
  assert post(server, dict(prompt="a", max_tokens=-1)).status_code == 400
  after = [metric(server, name) for name in names]
  assert [b - a for a, b in zip(before, after)] == [3, 1, 120, 3, 3]
  assert metric(server, "rnnstep_requests_waiting") == 0
