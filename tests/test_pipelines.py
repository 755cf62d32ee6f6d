"""rnnstep.pipelines' RunInference handlers against the library's own calls.

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
from apache_beam.io import localfilesystem
from apache_beam.ml.inference import base
from apache_beam.options import pipeline_options

import rnnstep
from rnnstep import pipelines
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
  handler = pipelines.CompletionsModelHandler(path, **HANDLER)
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
  handler = pipelines.LoglikelihoodModelHandler(env["path"],
                                                   jit_compile=False)
  batch = [PAIRS[0], TEXTS[0], list(PAIRS[1]),
           {"context": PAIRS[2][0], "continuation": PAIRS[2][1]},
           {"text": TEXTS[1]}, PAIRS[3], TEXTS[2]]
  pairs = rnnstep.loglikelihood(env["model"], PAIRS, jit_compile=False)
  texts = rnnstep.loglikelihood_rolling(env["model"], TEXTS,
                                        jit_compile=False)
  want = [pairs[0], texts[0], pairs[1], pairs[2], texts[1], pairs[3],
          texts[2]]
  got = handler.run_inference(batch, env["loaded"])
  assert [r.example for r in got] == batch
  for result, score in zip(got, want):
    if isinstance(score, tuple):
      assert result.inference == {
          "logprob": pytest.approx(score[0], rel=1e-6), "is_greedy": score[1]}
    else:
      assert result.inference == {"logprob": pytest.approx(score, rel=1e-6)}


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
    # The library's words (records.check), as every front end says them.
    ({"prompt": "A", "seed": "1"}, "seed", "the record 'A': seed must be "
     "None, a 64-bit integer or a list of them (one per prompt), got '1'"),
    ({"prompt": "A", "max_tokens": -1}, "max_tokens", "the record 'A': "
     "max_tokens must be a non-negative integer, got -1"),
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


@pytest.mark.parametrize("record, argument, words", [
    (("", "A"), "context", "the context gives no tokens"),
    (("A", "~"), "context", "context + continuation: character '~'"),
    ("A~", "text", "the record 'A~': text: character '~'"),
    ("", "text", "the text gives no tokens"),
    ({"context": "A", "x": "B"}, "text", "a record must be a (context, "
     "continuation) pair of str"),
    (("A", 3), "context", "a record must be"),
    (3, "text", "a record must be"),
])
def test_a_bad_scoring_record_names_record_and_field(
    env, record, argument, words):
  handler = pipelines.LoglikelihoodModelHandler(env["path"])
  with pytest.raises(errors.ArgumentError) as raised:
    handler.run_inference(["AB", ("A", "B"), record], env["loaded"])
  assert raised.value.argument == argument and words in str(raised.value)


def test_handler_arguments():
  make = pipelines.CompletionsModelHandler
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
  # Neither given: the jsonl job's default batch, fixed.
  assert make(max_tokens=5).batch_elements_kwargs() == {
      "min_batch_size": 256, "max_batch_size": 256}
  assert make(max_tokens=5, large_model=True).share_model_across_processes()
  with pytest.raises(errors.ArgumentError) as raised:
    pipelines.LoglikelihoodModelHandler(window=-1)
  assert raised.value.argument == "window"
  # The error type survives pickling (workers and shared models send it).
  error = pickle.loads(pickle.dumps(errors.ArgumentError("seed", "bad")))
  assert (error.argument, str(error)) == ("seed", "bad")


class _PrefixedFileSystem(localfilesystem.LocalFileSystem):
  """A filesystem with a scheme (local files behind "rnnsteptest://"), as a
  stand-in for gs:// or s3://: Beam finds it by its scheme."""

  @classmethod
  def scheme(cls):
    return "rnnsteptest"

  def open(self, path, *args, **kwargs):  # pylint: disable=arguments-differ
    return super().open(path[len("rnnsteptest://"):], *args, **kwargs)


def test_a_model_on_a_remote_filesystem_loads(env):
  handler = pipelines.CompletionsModelHandler(
      "rnnsteptest://" + env["path"], **HANDLER)
  loaded = handler.load_model()
  assert loaded.model.vocab == env["model"].vocab
  got = handler.run_inference(["ROMEO:"], loaded)[0].inference
  assert got["text"] == rnnstep.generate(
      env["model"], "ROMEO:", STEPS, seed=seed_of("ROMEO:"),
      temperature=TEMPERATURE, jit_compile=False)


def read_lines(prefix):
  """The JSON lines of a pipeline's output files PREFIX-*.jsonl."""
  folder = prefix.parent
  return [json.loads(line) for name in sorted(os.listdir(folder))
          if name.startswith(prefix.name) and name.endswith(".jsonl")
          for line in (folder / name).read_text().splitlines()]


def test_the_scoring_pipeline_in_process(env):
  # `python -m rnnstep.pipelines --score` on the DirectRunner in this process.
  source = env["tmp"] / "pairs.jsonl"
  records = ([{"key": i, "context": c, "continuation": t}
              for i, (c, t) in enumerate(PAIRS)]
             + [{"key": f"t{i}", "text": t} for i, t in enumerate(TEXTS)])
  source.write_text("".join(json.dumps(r) + "\n" for r in records))
  out = env["tmp"] / "scored" / "out"
  assert pipelines.main([f"--input={source}", f"--output={out}",
                            f"--model={env['path']}", "--score",
                            "--jit_compile=false"]) == 0
  lines = sorted(read_lines(out), key=lambda line: str(line["key"]))
  pairs = rnnstep.loglikelihood(env["model"], PAIRS, jit_compile=False)
  texts = rnnstep.loglikelihood_rolling(env["model"], TEXTS,
                                        jit_compile=False)
  assert lines == [
      {"key": i, "context": c, "continuation": t,
       "logprob": pytest.approx(pairs[i][0], rel=1e-6),
       "is_greedy": pairs[i][1]} for i, (c, t) in enumerate(PAIRS)] + [
           {"key": f"t{i}", "text": t,
            "logprob": pytest.approx(texts[i], rel=1e-6)}
           for i, t in enumerate(TEXTS)]


def test_a_bad_flag_is_one_line(env, capsys):
  assert pipelines.main(["--input=x", "--output=y", "--top_p=3"]) == 2
  assert capsys.readouterr().err == (
      "python -m rnnstep.pipelines: --top_p: CompletionsModelHandler: top_p "
      "must be in (0, 1] (1 = off), got 3.0\n")


@pytest.mark.slow  # Two worker processes, each importing TensorFlow.
def test_a_pipeline_on_two_worker_processes_gives_the_librarys_texts(env):
  # `python -m rnnstep.pipelines`: files of jsonl records in, jsonl out.
  keyed = records(240)
  source = env["tmp"] / "records.jsonl"
  source.write_text("".join(
      json.dumps(dict({"prompt": record} if isinstance(record, str)
                      else record, key=key)) + "\n"
      for key, record in keyed))
  out = env["tmp"] / "generated" / "out"
  result = pipelines.run([
      f"--input={source}", f"--output={out}", f"--model={env['path']}",
      f"--max_tokens={STEPS}", f"--seed={SEED}",
      f"--temperature={TEMPERATURE}", "--jit_compile=false",
      "--max_batch_size=32", "--direct_num_workers=2",
      "--direct_running_mode=multi_processing"])
  lines = read_lines(out)
  assert sorted(line["key"] for line in lines) == sorted(
      key for key, _ in keyed)  # Each record once.
  want = expected(env["model"], keyed)
  for line in lines:
    assert_inference(line, want[line["key"]])
    record = dict(keyed)[line["key"]]
    assert line["prompt"] == (record if isinstance(record, str)
                              else record["prompt"])
  # Two worker processes (not this one), each loading the model once.
  loads = [m.committed.count for m in result.metrics().query()["distributions"]
           if m.key.metric.name == "load_model_latency_milli_secs"]
  assert loads == [2], loads
