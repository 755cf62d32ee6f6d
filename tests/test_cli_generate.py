"""Tests of the installed `rnnstep-generate` binary, run as a subprocess.

Every subprocess pays TensorFlow's import (seconds), so the module fixture `env`
declares all runs, executes them concurrently once, and the tests below check
their results. Expected texts come from the library
(`rnnstep.generate`) in this process, on the same small random model file.
"""

import json
import os
import re

import pytest

from tests.support import keras_reference as kr

import rnnstep
from rnnstep.engine import paths
from rnnstep.model import model_file
from rnnstep.model import network as model_lib
from tests.support.cli import command, ok, one_error_line
from tests.support.cli import run_concurrently, write_model

# Quick tier (-m "not slow") leaves this file out: rnnstep-generate
# subprocesses.
pytestmark = pytest.mark.slow

COMMAND = command("rnnstep-generate", "rnnstep.cli.generate")
PROMPTS = ["ROMEO:", "To be"]
SAMPLES = 2
STEPS = 60
SEED = 7
SAMPLING = {"temperature": 0.8, "top_k": 20, "top_p": 0.95}
OWN_FLAGS = ["weights", "prompt", "num_steps", "temperature", "top_k", "top_p",
             "seed", "num_samples", "stop", "jit_compile", "dtype", "output",
             "format", "stream", "chunk_size", "min_p", "repetition_penalty",
             "repetition_window", "no_repeat_ngram_size", "num_beams",
             "length_penalty", "num_return_sequences", "corpus", "vocab",
             "typical_p", "regex", "cache", "verbose", "input", "overwrite",
             "skip_bad_lines", "score", "batch_size", "frequency_penalty",
             "presence_penalty"]

# Bad values, in groups run together: all are checked after parsing and
# reported in the one error line (one process per group: TF imports are slow).
BAD_VALUES = [
    [("num_steps", "-1"), ("temperature", "-0.5"), ("top_p", "0"),
     ("top_k", "-1"), ("num_samples", "0"), ("chunk_size", "0")],
    [("top_p", "1.5"), ("temperature", "nan"), ("typical_p", "0"),
     ("top_k", "2.5")],
    [("min_p", "1.5"), ("repetition_penalty", "0"), ("repetition_window", "-1"),
     ("no_repeat_ngram_size", "-2"), ("num_beams", "0"),
     ("num_return_sequences", "0"), ("length_penalty", "inf"),
     ("frequency_penalty", "2.5"), ("presence_penalty", "-3")],
]
# Decoding options: per-prompt temperatures, the look-back rules, min-p.
DECODING = {"temperature": "0.5,1.0", "min_p": "0.05",
            "repetition_penalty": "1.3", "repetition_window": "16",
            "no_repeat_ngram_size": "3", "typical_p": "0.9",
            "frequency_penalty": "0.4", "presence_penalty": "-0.3"}
BEAMS = {"num_beams": "4", "num_return_sequences": "2", "length_penalty": "0.7"}


def truncate(text, stops):
  """The continuation as a row that stops at the first stop string ends."""
  ends = [text.find(s) + len(s) for s in stops if s in text]
  return text[:min(ends)] if ends else text


def rows_of(texts):
  """(index, prompt index, sample, prompt, text) per row, in row order."""
  return [(p * SAMPLES + s, p, s, prompt, texts[p * SAMPLES + s])
          for p, prompt in enumerate(PROMPTS) for s in range(SAMPLES)]


def render_text(texts, seed):
  """The documented text format for several samples."""
  return "".join(f"----- row {i}: prompt {p}, sample {s}, seed {seed} -----\n"
                 f"{prompt}{text}\n" for i, p, s, prompt, text in rows_of(texts))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Writes the model; computes the library's texts; runs every subprocess."""
  tmp = tmp_path_factory.mktemp("cli_generate")
  weights = str(tmp / "model.npz")
  write_model(weights)
  model = rnnstep.load(weights)
  batch = [prompt for prompt in PROMPTS for _ in range(SAMPLES)]
  expected = rnnstep.generate(model, batch, STEPS, seed=SEED, **SAMPLING)
  stops = [expected[0][8:10], expected[3][15]]

  common = [f"--weights={weights}", f"--num_steps={STEPS}", f"--seed={SEED}",
            f"--num_samples={SAMPLES}"] + [f"--prompt={p}" for p in PROMPTS] + [
                f"--{name}={value}" for name, value in SAMPLING.items()]
  flagfile = tmp / "flags.txt"
  flagfile.write_text("".join(arg + "\n" for arg in common))
  stop_flags = [f"--stop={s}" for s in stops]
  (tmp / "errors").mkdir()
  runs = {
      "jsonl_file": (common + ["--format=jsonl",
                               f"--output={tmp / 'out.jsonl'}"], False),
      "text_flagfile": ([f"--flagfile={flagfile}"], False),
      "text_stream": (common + ["--stream", "--chunk_size=7"], False),
      "stop_jsonl_stream": (common + stop_flags + [
          "--format=jsonl", "--stream", "--chunk_size=3"], False),
      "fresh_seed": ([f"--weights={weights}", "--num_steps=30",
                      "--num_samples=2", "--prompt=JULIET:", "--format=jsonl",
                      "--nojit_compile"], False),
      # The bundled model (no --weights), in bfloat16 under XLA, greedy, with
      # a terminal on stderr.
      "single_tty": (["--num_steps=150", "--temperature=0",
                      "--dtype=bfloat16", "--jit_compile"], True),
      "greedy_graph": ([f"--weights={weights}", "--num_steps=60",
                        "--temperature=0", "--nojit_compile"], False),
      "helpfull": (["--helpfull"], False),
      "help": (["--help"], False),
      "unknown_flag": ([f"--weights={weights}", "--temprature=0.5"], False),
      "missing_weights": ([f"--weights={tmp / 'errors' / 'missing.npz'}",
                           f"--output={tmp / 'errors' / 'out.txt'}"], False),
      "unknown_char": ([f"--weights={weights}", "--prompt=ROMÉO:"], False),
  }
  for group, bad in enumerate(BAD_VALUES):
    runs[f"bad_values_{group}"] = (
        [f"--weights={weights}"] + [f"--{flag}={value}" for flag, value in bad],
        False)
  runs["bundled_default"] = ([], False)
  decoding = common[:-len(SAMPLING)] + [f"--{k}={v}" for k, v in DECODING.items()]
  runs["decoding_jsonl"] = (decoding + ["--format=jsonl"], False)
  runs["decoding_stream_jsonl"] = (decoding + stop_flags + [
      "--format=jsonl", "--stream", "--chunk_size=9"], False)
  runs["row_temperatures"] = (common[:-len(SAMPLING)] + [
      "--temperature=0,0.5,1,2", "--format=jsonl"], False)
  beam_flags = [f"--weights={weights}", f"--num_steps={STEPS}",
                f"--seed={SEED}"] + [
      f"--prompt={p}" for p in PROMPTS] + [f"--{k}={v}" for k, v in BEAMS.items()]
  runs["beams_jsonl"] = (beam_flags + stop_flags + ["--format=jsonl"], False)
  runs["beams_text"] = (beam_flags + ["--num_steps=20"], False)
  for name, extra in (("beams_over", ["--num_return_sequences=5"]),
                      ("beams_stream", ["--stream"]),
                      ("beams_samples", ["--num_samples=2"]),
                      ("beams_vocab", ["--num_beams=500",
                                       "--num_return_sequences=1"])):
    runs[name] = (beam_flags + extra, False)
  runs["temperature_count"] = (common[:-len(SAMPLING)] + [
      "--temperature=0.5,0.6,0.7"], False)
  results = run_concurrently(COMMAND, runs)
  return {"tmp": tmp, "weights": weights, "model": model, "expected": expected,
          "stops": stops, "results": results}


def test_binary_is_installed():
  assert len(COMMAND) == 1, "rnnstep-generate is not on PATH: `pip install -e .`"


def test_batch_as_jsonl_file_matches_the_library(env):
  out = env["tmp"] / "out.jsonl"
  assert ok(env["results"]["jsonl_file"]) == ""
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["index"], r["prompt_index"], r["sample"], r["prompt"], r["text"])
          for r in records] == rows_of(env["expected"])
  assert all(r["seed"] == SEED and r["stopped"] is False for r in records)
  assert sorted(os.listdir(env["tmp"])) == ["errors", "flags.txt", "model.npz",
                                           "out.jsonl"]  # No temp file left.


def test_flagfile_text_format_and_same_seed_same_text(env):
  # A second process with the same seed prints the library's texts again.
  assert ok(env["results"]["text_flagfile"]) == render_text(env["expected"], SEED)


def test_stream_prints_what_the_one_shot_run_prints(env):
  assert (ok(env["results"]["text_stream"])
          == ok(env["results"]["text_flagfile"]))


def test_stop_strings_end_rows_and_release_streamed_rows(env):
  stops = env["stops"]
  expected = [truncate(text, stops) for text in env["expected"]]
  assert expected[0] != env["expected"][0]  # Row 0 stops early.
  records = [json.loads(line)
             for line in ok(env["results"]["stop_jsonl_stream"]).splitlines()]
  assert [r["text"] for r in records] == expected
  assert [r["stopped"] for r in records] == [
      text.endswith(tuple(stops)) for text in expected]


def test_fresh_seed_is_reported_and_reproduces_the_run(env):
  records = [json.loads(line)
             for line in ok(env["results"]["fresh_seed"]).splitlines()]
  assert len(records) == 2
  seed = records[0]["seed"]
  assert isinstance(seed, int) and all(r["seed"] == seed for r in records)
  again = rnnstep.generate(env["model"], ["JULIET:"] * 2, 30, seed=seed,
                           jit_compile=False)
  assert [r["text"] for r in records] == again


def test_single_sample_prints_just_the_text_and_progress_on_a_tty(env):
  """--dtype and --jit_compile are honoured: the bundled model's bfloat16
  greedy text under XLA is the library's. On real weights bfloat16 greedy
  parts from float32's (near-ties flip), so this also fails if --dtype were
  ignored."""
  result = env["results"]["single_tty"]
  assert result.returncode == 0, result
  bfloat16 = rnnstep.generate(rnnstep.load(dtype="bfloat16"), "ROMEO:", 150,
                              temperature=0, jit_compile=True)
  # Float32's greedy text is the same on every path: the graph path's,
  # which compiles nothing.
  float32 = rnnstep.generate(rnnstep.load(), "ROMEO:", 150, temperature=0,
                             jit_compile=False)
  assert bfloat16 != float32
  assert result.stdout == "ROMEO:" + bfloat16 + "\n"
  # One sample on a terminal: the progress line (its frames, then the
  # eraser); and on a CPU without bf16 arithmetic, one line saying it is no
  # faster here. Nothing else.
  progress = [line for line in result.stderr_lines
              if "rnnstep-generate: generating 1 x 150 characters" in line]
  assert progress, result
  note = paths.slower_dtype_note("bfloat16")
  assert [line for line in result.stderr_lines
          if line not in progress and line != "\033[K"] == (
              [f"rnnstep-generate: note: --dtype=bfloat16: {note}"]
              if note else []), result
  # Not a terminal: no progress, nothing on stderr.
  assert env["results"]["jsonl_file"].stderr_lines == []


def test_greedy_text_equals_a_keras_greedy_loop(env):
  data = model_file.read(env["weights"])
  layers = list(data.config.layers)
  keras_model = kr.from_weights(data.tensors, layers)
  model = env["model"]
  want = model.decode(kr.greedy(keras_model, model.encode("ROMEO:"), 60))
  assert ok(env["results"]["greedy_graph"]) == "ROMEO:" + want + "\n"


def test_helpfull_and_help_list_the_flags(env):
  full = env["results"]["helpfull"]
  short = env["results"]["help"]
  for result in (full, short):
    assert result.returncode == 0 and result.stderr_lines == [], result
    assert "USAGE: rnnstep-generate" in result.stdout
    for flag in OWN_FLAGS:
      assert re.search(rf"--(\[no\])?{flag}\b", result.stdout), (flag, result)
    # The --dtype choices are the library's.
    assert "<" + "|".join(model_lib.DTYPES) + ">" in result.stdout
  assert "--flagfile" in full.stdout and "--flagfile" not in short.stdout


@pytest.mark.parametrize("group", range(len(BAD_VALUES)))
def test_bad_values_are_one_line_naming_each_flag(env, group):
  line = one_error_line(env["results"][f"bad_values_{group}"], status=2)
  for flag, _ in BAD_VALUES[group]:
    assert f"--{flag}=" in line, flag
  assert line.count("flag --") == len(BAD_VALUES[group])


def test_unknown_flag(env):
  assert "temprature" in one_error_line(env["results"]["unknown_flag"], 2)


def test_missing_weights_file_leaves_no_output_file(env):
  line = one_error_line(env["results"]["missing_weights"], 1)
  assert "--weights" in line and "missing.npz" in line
  assert os.listdir(env["tmp"] / "errors") == []


def test_unknown_prompt_character_names_it_and_the_flag(env):
  line = one_error_line(env["results"]["unknown_char"], 2)
  assert "--prompt" in line and "'É'" in line


def test_default_run_on_the_bundled_model(env):
  text = ok(env["results"]["bundled_default"])
  assert text.startswith("ROMEO:") and text.endswith("\n")
  assert len(text) == len("ROMEO:") + 1000 + 1
  assert 0.1 < text.count(" ") / len(text) < 0.3  # Word-like, not noise.


def test_decoding_options_and_logprob_match_the_library(env):
  model, stops = env["model"], env["stops"]
  batch = [prompt for prompt in PROMPTS for _ in range(SAMPLES)]
  options = dict(temperature=[0.5, 0.5, 1.0, 1.0], min_p=0.05,
                 repetition_penalty=1.3, repetition_window=16,
                 no_repeat_ngram_size=3, typical_p=0.9, frequency_penalty=0.4,
                 presence_penalty=-0.3, seed=SEED, return_scores=True)
  texts, scores = rnnstep.generate(model, batch, STEPS, **options)
  records = [json.loads(line) for line in
             ok(env["results"]["decoding_jsonl"]).splitlines()]
  assert [r["text"] for r in records] == texts
  assert [r["logprob"] for r in records] == pytest.approx(scores, rel=1e-6)
  stopped, stopped_scores = rnnstep.generate(model, batch, STEPS, stop=stops,
                                             **options)
  records = [json.loads(line) for line in
             ok(env["results"]["decoding_stream_jsonl"]).splitlines()]
  assert [r["text"] for r in records] == stopped
  assert [r["logprob"] for r in records] == pytest.approx(stopped_scores,
                                                          rel=1e-6)


def test_one_temperature_per_row(env):
  batch = [prompt for prompt in PROMPTS for _ in range(SAMPLES)]
  texts = rnnstep.generate(env["model"], batch, STEPS, seed=SEED,
                           temperature=[0.0, 0.5, 1.0, 2.0])
  records = [json.loads(line) for line in
             ok(env["results"]["row_temperatures"]).splitlines()]
  assert [r["text"] for r in records] == texts
  line = one_error_line(env["results"]["temperature_count"], 2)
  assert "--temperature lists 3 values for 2 prompts x 2 samples" in line


def test_beam_search_prints_the_best_hypotheses(env):
  model, stops = env["model"], env["stops"]
  texts, scores = rnnstep.generate(model, PROMPTS, STEPS, num_beams=4,
                                   num_return_sequences=2, length_penalty=0.7,
                                   stop=stops, return_scores=True)
  records = [json.loads(line) for line in
             ok(env["results"]["beams_jsonl"]).splitlines()]
  assert [(r["prompt_index"], r["sample"], r["text"]) for r in records] == [
      (p, j, texts[p][j]) for p in range(len(PROMPTS)) for j in range(2)]
  assert [r["logprob"] for r in records] == pytest.approx(
      [s for per in scores for s in per], rel=1e-6)
  best = rnnstep.generate(model, PROMPTS, 20, num_beams=4,
                          num_return_sequences=2, length_penalty=0.7)
  assert ok(env["results"]["beams_text"]) == "".join(
      f"----- row {p * 2 + j}: prompt {p}, sample {j}, seed {SEED} -----\n"
      f"{PROMPTS[p]}{best[p][j]}\n" for p in range(2) for j in range(2))


@pytest.mark.parametrize("name, words", [
    ("beams_over", "--num_return_sequences=5 is more than --num_beams=4"),
    ("beams_stream", "--stream with --num_beams=4"),
    ("beams_samples", "--num_samples=2 with --num_beams=4"),
    ("beams_vocab", "--num_beams: num_beams must be an integer from 1"),
])
def test_beam_flag_errors_are_one_line(env, name, words):
  assert words in one_error_line(env["results"][name], 2)
