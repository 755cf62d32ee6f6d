"""rnnstep.beam's RunInference handlers against the library's own calls.

Every record's result is compared with the library's public functions:
`rnnstep.generate` batched with one seed per row (a row's text is then its
one-row call's, README "Reproducibility"), `rnnstep.loglikelihood` and
`rnnstep.loglikelihood_rolling`. In process: `run_inference` on batches,
keyed and not, and every refusal. Then (slow) a real pipeline on the
DirectRunner in multi-processing mode with two workers over a few hundred
keyed records.
"""

import hashlib
import json
import os
import pickle

import pytest

beam = pytest.importorskip("apache_beam", reason="pip install 'rnnstep[beam]'")
# pylint: disable=g-import-not-at-top,g-bad-import-order
from apache_beam.ml.inference import base
from apache_beam.options import pipeline_options

import rnnstep
from rnnstep import beam as rnnstep_beam
from rnnstep import errors
from tests.support import cli

STEPS = 24
SEED = 11
TEMPERATURE = 0.9
PROMPTS = ("ROMEO:", "JULIET:", "To be", "A", "What, ho!")
SHORT = dict(max_tokens=12, stop=["e", "o"])  # Another group of calls.
# Graph path: no compile per batch shape, and the same path for the library.
HANDLER = dict(max_tokens=STEPS, seed=SEED, temperature=TEMPERATURE,
               jit_compile=False)


def records(count):
  """`count` keyed records: bare prompts, seeded dicts, per-record options."""
  out = []
  for i in range(count):
    prompt = PROMPTS[i % len(PROMPTS)]
    record = (prompt, {"prompt": prompt, "seed": i},
              {"prompt": prompt, "seed": 10**12 + i,
               "temperature": 0.5 + i % 3 / 4, "top_k": i % 7},
              dict(SHORT, prompt=prompt))[i % 4]
    out.append((f"key{i}", record))
  return out


def seed_of(record):
  """A record's seed as documented: its own, else `rnnstep.record_seed` of
  the handler's seed and the first 8 bytes (little-endian) of the BLAKE2b
  hash of its prompt."""
  if isinstance(record, dict) and "seed" in record:
    return record["seed"]
  prompt = record if isinstance(record, str) else record["prompt"]
  digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
  return rnnstep.record_seed(SEED, int.from_bytes(digest, "little"))


def expected(model, keyed):
  """{key: inference} from `rnnstep.generate`, one batched call per group of
  per-call settings, one seed per row."""
  groups = {}
  for key, record in keyed:
    fields = {"prompt": record} if isinstance(record, str) else record
    groups.setdefault(fields.get("max_tokens", STEPS), []).append(
        (key, fields))
  out = {}
  for steps, members in groups.items():
    stop = SHORT["stop"] if steps != STEPS else None
    texts, scores = rnnstep.generate(
        model, [f["prompt"] for _, f in members], steps,
        seed=[seed_of(f) for _, f in members], stop=stop,
        temperature=[f.get("temperature", TEMPERATURE) for _, f in members],
        top_k=[f.get("top_k", 0) for _, f in members],
        return_scores=True, jit_compile=False)
    for (key, fields), text, score in zip(members, texts, scores):
      out[key] = {"text": text, "logprob": score, "seed": seed_of(fields),
                  "stopped": bool(stop) and text.endswith(tuple(stop))}
  return out


PAIRS = [("ROMEO", ":"), ("To be, or ", "not"), ("A", "B"), ("What", ", ho!")]
TEXTS = ["ROMEO:", "To be, or not", "AB"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("beam")
  path = str(tmp / "model.npz")
  cli.write_model(path)
  handler = rnnstep_beam.CompletionsModelHandler(path, **HANDLER)
  loaded = handler.load_model()
  return {"tmp": tmp, "path": path, "handler": handler, "loaded": loaded,
          "model": loaded.model}


def assert_inference(got, want):
  assert got["text"] == want["text"]
  assert got["seed"] == want["seed"]
  assert got["stopped"] == want["stopped"]
  # Other batches, other matmul kernels: equal to float32 rounding.
  assert got["logprob"] == pytest.approx(want["logprob"], rel=1e-5, abs=1e-4)


def test_a_batch_gives_each_record_its_one_row_text(env):
  keyed = records(40)
  want = expected(env["model"], keyed)
  got = base.KeyedModelHandler(env["handler"]).run_inference(
      keyed, env["loaded"])
  assert [key for key, _ in got] == [key for key, _ in keyed]
  for (key, result), (_, record) in zip(got, keyed):
    assert result.example is record and result.model_id == env["path"]
    assert_inference(result.inference, want[key])
  assert any(want[key]["stopped"] for key in want)
  # Literally one-row calls, for one record of each kind.
  for key, record in keyed[:4]:
    fields = {"prompt": record} if isinstance(record, str) else record
    options = {name: fields[name] for name in ("temperature", "top_k")
               if name in fields}
    assert want[key]["text"] == rnnstep.generate(
        env["model"], fields["prompt"], fields.get("max_tokens", STEPS),
        seed=seed_of(record), stop=fields.get("stop"),
        **dict(dict(temperature=TEMPERATURE), **options), jit_compile=False)
  # One prompt without a seed: one text, whatever its batch.
  alone = env["handler"].run_inference(["ROMEO:"], env["loaded"])
  assert alone[0].inference["text"] == want["key0"]["text"]


def test_scoring_equals_the_librarys(env):
  handler = rnnstep_beam.LoglikelihoodModelHandler(env["path"],
                                                   jit_compile=False)
  batch = [PAIRS[0], list(PAIRS[1]),
           {"context": PAIRS[2][0], "continuation": PAIRS[2][1]}, PAIRS[3]]
  want = rnnstep.loglikelihood(env["model"], PAIRS, jit_compile=False)
  got = handler.run_inference(batch, env["loaded"])
  assert [r.example for r in got] == batch
  for result, (logprob, greedy) in zip(got, want):
    assert result.inference == {"logprob": pytest.approx(logprob, rel=1e-6),
                                "is_greedy": greedy}
  rolling = rnnstep_beam.LoglikelihoodModelHandler(
      env["path"], rolling=True, jit_compile=False)
  got = rolling.run_inference([TEXTS[0], {"text": TEXTS[1]}, TEXTS[2]],
                              env["loaded"])
  want = rnnstep.loglikelihood_rolling(env["model"], TEXTS, jit_compile=False)
  assert [r.inference for r in got] == [
      {"logprob": pytest.approx(w, rel=1e-6)} for w in want]


@pytest.mark.parametrize("record, argument, words", [
    ({"prompt": "AB~"}, "prompt", "the record 'AB~': prompt: character '~'"),
    ({"prompt": ""}, "prompt", "the record '': the prompt is empty"),
    ({"prompt": 3}, "prompt", "\"prompt\" must be a str, got 3"),
    (3, "prompt", "a record must be a prompt (str) or a dict"),
    ({"prompt": "A", "tempo": 1}, "tempo", "the record 'A': unknown field "
     "'tempo'; a record has prompt, seed, max_tokens, stop, regex"),
    ({"prompt": "A", "top_p": 2}, "top_p", "the record 'A': top_p must be in "
     "(0, 1] (1 = off), got 2"),
    ({"prompt": "A", "top_k": [1, 2]}, "top_k", "top_k must be one value"),
    ({"prompt": "A", "seed": "1"}, "seed", "seed must be a 64-bit integer"),
    ({"prompt": "A", "max_tokens": -1}, "max_tokens", "max_tokens must be an "
     "integer in [0, 2**31), got -1"),
    ({"prompt": "A", "stop": 3}, "stop", "stop must be a str or a list"),
    ({"prompt": "A", "regex": "[~]"}, "regex", "the record 'A': regex '[~]' "
     "matches no string"),
    ({"prompt": "A", "num_beams": 1000}, "num_beams", "the record 'A': "
     "num_beams must be an integer from 1"),
    ({"prompt": "A", "num_return_sequences": 2}, "num_return_sequences",
     "each record gets one text"),
])
def test_a_bad_record_fails_its_batch_naming_record_and_field(
    env, record, argument, words):
  with pytest.raises(errors.ArgumentError) as raised:
    env["handler"].run_inference(["JULIET:", record], env["loaded"])
  assert raised.value.argument == argument
  assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("rolling, record, argument, words", [
    (False, ("", "A"), "context", "the context gives no tokens"),
    (False, ("A", "~"), "context", "context + continuation: character '~'"),
    (False, "AB", "context", "a record must be a (context, continuation)"),
    (False, {"context": "A", "x": "B"}, "x", "unknown field 'x'"),
    (True, ("A", "B"), "text", "a record must be a text (str)"),
    (True, "A~", "text", "the record 'A~': text: character '~'"),
])
def test_a_bad_scoring_record_names_record_and_field(
    env, rolling, record, argument, words):
  handler = rnnstep_beam.LoglikelihoodModelHandler(env["path"],
                                                   rolling=rolling)
  good = "AB" if rolling else ("A", "B")
  with pytest.raises(errors.ArgumentError) as raised:
    handler.run_inference([good, record], env["loaded"])
  assert raised.value.argument == argument and words in str(raised.value)


def test_handler_arguments():
  make = rnnstep_beam.CompletionsModelHandler
  with pytest.raises(TypeError, match="unexpected keyword argument 'tempo'"):
    make(max_tokens=5, tempo=1)
  for kwargs, argument in ((dict(max_tokens=-1), "max_tokens"),
                           (dict(max_tokens=5, top_k=-1), "top_k"),
                           (dict(max_tokens=5, seed=2**63), "seed"),
                           (dict(max_tokens=5, num_return_sequences=2),
                            "num_return_sequences"),
                           (dict(max_tokens=5, regex=3), "regex")):
    with pytest.raises(errors.ArgumentError) as raised:
      make(**kwargs)
    assert raised.value.argument == argument
  with pytest.raises(errors.ArgumentError, match="takes no inference_args"):
    make(max_tokens=5).validate_inference_args({"temperature": 1})
  # A drawn seed is drawn once, when the pipeline is built, and travels.
  handler = make(max_tokens=5, min_batch_size=8, max_batch_size=64)
  assert 0 <= handler.seed < 2**31
  assert pickle.loads(pickle.dumps(handler)).seed == handler.seed
  assert handler.batch_elements_kwargs() == {"min_batch_size": 8,
                                             "max_batch_size": 64}
  assert not handler.share_model_across_processes()
  assert make(max_tokens=5, large_model=True).share_model_across_processes()
  with pytest.raises(errors.ArgumentError) as raised:
    rnnstep_beam.LoglikelihoodModelHandler(window=-1)
  assert raised.value.argument == "window"
  # The error type survives pickling (workers and shared models send it).
  error = pickle.loads(pickle.dumps(errors.ArgumentError("seed", "bad")))
  assert (error.argument, str(error)) == ("seed", "bad")


def _as_line(kind):
  """A pipeline step: (key, PredictionResult) -> a JSON line with the pid."""
  def line(keyed):
    key, result = keyed
    return json.dumps([kind, key, result.inference, os.getpid()])
  return line


@pytest.mark.slow  # Two worker processes, each importing TensorFlow.
def test_a_pipeline_on_two_worker_processes_gives_the_librarys_texts(env):
  keyed = records(240)
  pairs = [(f"pair{i}", PAIRS[i % len(PAIRS)]) for i in range(40)]
  handler = rnnstep_beam.CompletionsModelHandler(
      env["path"], max_batch_size=32, **HANDLER)
  scorer = rnnstep_beam.LoglikelihoodModelHandler(
      env["path"], jit_compile=False, max_batch_size=16)
  out = env["tmp"] / "pipeline"
  options = pipeline_options.PipelineOptions(
      direct_num_workers=2, direct_running_mode="multi_processing")
  pipeline = beam.Pipeline(options=options)
  generated = (pipeline | "Records" >> beam.Create(keyed)
               | "Generate" >> base.RunInference(
                   base.KeyedModelHandler(handler))
               | "GenerateLine" >> beam.Map(_as_line("text")))
  scored = (pipeline | "Pairs" >> beam.Create(pairs)
            | "Score" >> base.RunInference(base.KeyedModelHandler(scorer))
            | "ScoreLine" >> beam.Map(_as_line("score")))
  ((generated, scored) | beam.Flatten()
   | beam.io.WriteToText(str(out / "results")))
  result = pipeline.run()
  result.wait_until_finish()

  lines = [json.loads(line) for name in sorted(os.listdir(out))
           for line in (out / name).read_text().splitlines()]
  texts = {key: inference for kind, key, inference, _ in lines
           if kind == "text"}
  assert sorted(texts) == sorted(key for key, _ in keyed)  # Each once.
  want = expected(env["model"], keyed)
  for key in texts:
    assert_inference(texts[key], want[key])
  scores = {key: inference for kind, key, inference, _ in lines
            if kind == "score"}
  assert len(scores) == len(pairs)
  for key, pair in pairs:
    logprob, greedy = rnnstep.loglikelihood(env["model"], [pair],
                                            jit_compile=False)[0]
    assert scores[key] == {"logprob": pytest.approx(logprob, rel=1e-5),
                           "is_greedy": greedy}
  # Two worker processes, neither this one; each loaded each model once.
  pids = {pid for *_, pid in lines}
  assert len(pids) == 2 and os.getpid() not in pids
  loads = [m.committed.count for m in result.metrics().query()["distributions"]
           if m.key.metric.name == "load_model_latency_milli_secs"]
  assert sorted(loads) == [2, 2], loads
