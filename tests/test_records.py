"""One request record, one check: every front end refuses a value in the
library's words (issue 59).

The same bad values go to the library (`rnnstep.generate`), the jsonl job (a
real `rnnstep-generate --input=... --output=...` run), the Beam handler
(`run_inference` in process) and the server (a real `rnnstep-serve`): each
answer holds the library's message, and names the field.
"""

import dataclasses
import json

import pytest

import rnnstep
from rnnstep.decoding import options as options_lib
from rnnstep.decoding import stopping
from rnnstep import errors
from rnnstep import records
from tests.support import cli

STEPS = 5
PROMPT = "ROMEO:"
# (field, bad value): each front end takes these in a record of its own.
BAD_VALUES = (("temperature", -0.5), ("top_p", 2), ("seed", 2**64))
# Past `stopping.MAX_STOP_BYTES` together (the jsonl job's stop is a flag).
LONG_STOP = ["x" * 3000, "y" * 3000]


def library_message(**arguments) -> str:
  with pytest.raises(errors.ArgumentError) as raised:
    records.check(PROMPT, STEPS, **arguments)
  return str(raised.value)


# -- The check itself (fast) -------------------------------------------------


def test_a_record_is_frozen_with_every_option_checked():
  record = records.check(["A", "B"], 3, seed=[1, 2], stop="x",
                         regex="[AB]+", options={"temperature": [0, 0.5]})
  assert record.prompts == ("A", "B") and record.seed == (1, 2)
  assert record.stop == ("x",) and record.regex == ("[AB]+", "[AB]+")
  assert dict(record.options) == dict(
      {o.name: o.default for o in options_lib.OPTIONS}, temperature=(0, 0.5))
  with pytest.raises(dataclasses.FrozenInstanceError):
    record.stop = ()  # pytype: disable=not-writable
  with pytest.raises(TypeError):
    record.options["top_k"] = 3


@pytest.mark.parametrize("arguments, argument, words", [
    (dict(options={"temperature": -0.5}), "temperature",
     "temperature must be a finite number >= 0 (0 = greedy), got -0.5"),
    (dict(seed=1.5), "seed", "seed must be None, a 64-bit integer"),
    (dict(stop=LONG_STOP), "stop", "the stop strings are 6000 bytes"),
    (dict(stop=""), "stop", "a stop string is empty"),
    (dict(stop=3), "stop", "stop must be a str or a list of str, got 3"),
    (dict(regex=3), "regex", "regex must be a str"),
    (dict(return_scores=1), "return_scores", "return_scores must be True"),
])
def test_a_bad_value_is_refused_naming_its_argument(arguments, argument,
                                                    words):
  with pytest.raises(errors.ArgumentError) as raised:
    records.check(PROMPT, STEPS, **arguments)
  assert raised.value.argument == argument and words in str(raised.value)


def test_a_record_of_one_row_takes_one_value_and_its_steps_name():
  for arguments, argument in ((dict(seed=[1]), "seed"),
                              (dict(options={"top_k": [1]}), "top_k")):
    with pytest.raises(errors.ArgumentError, match="must be one value") as e:
      records.check(PROMPT, STEPS, one_row=True, **arguments)
    assert e.value.argument == argument
  with pytest.raises(errors.ArgumentError, match="max_tokens must be a non-"
                     "negative integer, got -1") as raised:
    records.check(PROMPT, -1, steps_name="max_tokens")
  assert raised.value.argument == "max_tokens"
  assert stopping.MAX_STOP_BYTES < sum(len(s) for s in LONG_STOP)


def test_stopped():
  assert records.stopped("To be.", (".",))
  assert records.stopped("To be.", [".", "!"])
  assert not records.stopped("To be", (".",))
  assert not records.stopped("To be.", ())


# -- Every front end (slow: a job process and a server) ----------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("records") / "tiny.npz")
  cli.write_model(path)
  return path


@pytest.mark.slow
def test_every_front_end_says_the_librarys_message(model_path, tmp_path):
  # pylint: disable=g-import-not-at-top
  from tests.support import http
  from tests.support import serve_process
  # pylint: enable=g-import-not-at-top
  model = rnnstep.load(model_path)
  want = {}
  for field, value in BAD_VALUES:
    arguments = ({"seed": value} if field == "seed"
                 else {"options": {field: value}})
    want[field] = library_message(**arguments)
    with pytest.raises(errors.ArgumentError) as raised:
      rnnstep.generate(model, PROMPT, STEPS, **{field: value})
    assert (raised.value.argument, str(raised.value)) == (field, want[field])
  want["stop"] = library_message(stop=LONG_STOP)
  with pytest.raises(errors.ArgumentError) as raised:
    rnnstep.generate(model, PROMPT, STEPS, stop=LONG_STOP)
  assert str(raised.value) == want["stop"]
  server = None
  if serve_process.stack_installed():
    server = serve_process.RemoteServer(
        [f"--model={model_path}", "--max_batch=4", "--jit_compile=false"],
        wait=False)
  try:
    # The jsonl job: one bad record a line, each reported and skipped.
    source = tmp_path / "in.jsonl"
    source.write_text("".join(
        json.dumps({"prompt": PROMPT, field: value}) + "\n"
        for field, value in BAD_VALUES) + json.dumps({"prompt": PROMPT}))
    job = cli.run_binary(
        cli.command("rnnstep-generate", "rnnstep.cli.generate"),
        [f"--weights={model_path}", f"--input={source}",
         f"--output={tmp_path / 'out.jsonl'}", f"--num_steps={STEPS}",
         "--skip_bad_lines", "--nojit_compile"], False)
    assert job.returncode == 0, job
    said = "\n".join(job.stderr_lines)
    for number, (field, _) in enumerate(BAD_VALUES, 1):
      assert f"line {number}: skipped: {want[field]}" in said, said
    # The Beam handler, in process.
    pipelines = pytest.importorskip("rnnstep.pipelines")
    handler = pipelines.CompletionsModelHandler(model_path, max_tokens=STEPS)
    loaded = handler.load_model()
    for field, value in BAD_VALUES + (("stop", LONG_STOP),):
      with pytest.raises(errors.ArgumentError) as raised:
        handler.run_inference([{"prompt": PROMPT, field: value}], loaded)
      assert raised.value.argument == field
      assert str(raised.value) == f"the record {PROMPT!r}: {want[field]}"
    # The server: a 400 whose message is the library's, naming the field.
    if server is None:
      pytest.skip("the serving stack is not installed")
    server.wait_until_healthy(startup_timeout=600)
    for field, value in BAD_VALUES + (("stop", LONG_STOP),):
      reply = http.post(server.url("/v1/completions"), timeout=60, json={
          "prompt": PROMPT, "max_tokens": STEPS, field: value})
      assert reply.status_code == 400, reply.text
      error = reply.json()["error"]
      assert (error["param"], error["message"]) == (field, want[field])
  finally:
    if server is not None:
      server.close()
