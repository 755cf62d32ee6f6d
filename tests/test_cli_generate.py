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

import rnnstep
from rnnstep import model as model_lib
from tests.test_cli_common import command, ok, one_error_line
from tests.test_cli_common import run_concurrently, write_model

COMMAND = command("rnnstep-generate", "rnnstep.cli.generate")
PROMPTS = ["ROMEO:", "To be"]
SAMPLES = 2
STEPS = 60
SEED = 7
SAMPLING = {"temperature": 0.8, "top_k": 20, "top_p": 0.95}
OWN_FLAGS = ["weights", "prompt", "num_steps", "temperature", "top_k", "top_p",
             "seed", "num_samples", "stop", "jit_compile", "dtype", "output",
             "format", "stream", "chunk_size", "corpus", "vocab"]

# Bad values, in groups run together: all are checked after parsing and
# reported in the one error line (one process per group: TF imports are slow).
BAD_VALUES = [
    [("num_steps", "-1"), ("temperature", "-0.5"), ("top_p", "0"),
     ("top_k", "-1"), ("num_samples", "0"), ("chunk_size", "0")],
    [("top_p", "1.5"), ("temperature", "nan")],
]


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
      "single_tty": ([f"--weights={weights}", "--num_steps=40", "--seed=3",
                      "--dtype=bfloat16", "--jit_compile"], True),
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
  result = env["results"]["single_tty"]
  assert result.returncode == 0, result
  assert result.stdout.startswith("ROMEO:") and result.stdout.endswith("\n")
  assert len(result.stdout) == len("ROMEO:") + 40 + 1
  assert "-----" not in result.stdout
  assert any("generating 1 x 40 characters" in line
             for line in result.stderr_lines), result
  # Not a terminal: no progress, nothing on stderr.
  assert env["results"]["jsonl_file"].stderr_lines == []


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
