"""Tests of the `rnnstep-inspect` binary, run as subprocesses.

As in tests/test_cli_generate.py, the module fixture runs every subprocess
once, concurrently; expected pages come from the library (`rnnstep.inspect`
and `rnnstep.inspect_page`) in this process, on the same small model file and
a real held-out excerpt of tinyshakespeare. (The page in a browser:
tests/test_inspect_page.py.)
"""

import configparser
import os
import pathlib

import pytest

import rnnstep
from rnnstep.cli import inspect as cli_inspect
from rnnstep.inspect import analysis as inspect
from rnnstep.inspect import page as inspect_page
from tests.support.cli import command, ok, one_error_line
from tests.support.cli import run_concurrently, write_model

# Quick tier (-m "not slow") leaves this file out: rnnstep-inspect
# subprocesses.
pytestmark = pytest.mark.slow

COMMAND = command("rnnstep-inspect", "rnnstep.cli.inspect")
ROOT = pathlib.Path(__file__).resolve().parent.parent
EXCERPT = ROOT / "tests" / "data" / "tinyshakespeare_heldout_excerpt.txt"
MAX_CHARS = 300
OWN_FLAGS = ["weights", "dtype", "corpus", "vocab", "text", "prompt", "output",
             "neuron", "num_neurons", "max_chars"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("cli_inspect")
  weights = str(tmp / "model.npz")
  write_model(weights)
  errors = tmp / "errors"
  errors.mkdir()
  (errors / "latin1.txt").write_bytes("ROM\xc9O".encode("latin-1"))
  (errors / "empty.txt").write_text("")
  (errors / "unknown.txt").write_text("ROMEO:\nO R\u00f6meo\n")
  kept = errors / "kept.html"
  kept.write_text("an earlier page")
  model_flag = f"--weights={weights}"
  runs = {
      "text_file": ([model_flag, f"--text={EXCERPT}",
                     f"--max_chars={MAX_CHARS}",
                     f"--output={tmp / 'page.html'}"], False),
      "prompt_stdout": ([model_flag, "--prompt=ROMEO:\nO Romeo, Romeo!",
                         "--neuron=0:5", "--neuron=0:2", "--num_neurons=3",
                         "--output=-"], False),
      "bundled": (["--prompt=JULIET:", f"--output={tmp / 'bundled.html'}",
                   "--num_neurons=2"], False),
      "help": (["--help"], False),
      "no_text": ([model_flag, f"--output={errors / 'x.html'}"], False),
      "text_and_prompt": ([model_flag, f"--text={EXCERPT}", "--prompt=A",
                           f"--output={errors / 'x.html'}"], False),
      "no_output": ([model_flag, "--prompt=A"], False),
      "bad_neuron": ([model_flag, "--prompt=A", "--neuron=0:32",
                      f"--output={kept}"], False),
      "no_neurons": ([model_flag, "--prompt=A", "--num_neurons=0",
                      f"--output={kept}"], False),
      "bad_max_chars": ([model_flag, "--prompt=A", "--max_chars=0",
                         f"--output={kept}"], False),
      "unknown_char": ([model_flag, f"--text={errors / 'unknown.txt'}",
                        f"--output={kept}"], False),
      "not_utf8": ([model_flag, f"--text={errors / 'latin1.txt'}",
                    f"--output={kept}"], False),
      "empty_file": ([model_flag, f"--text={errors / 'empty.txt'}",
                      f"--output={kept}"], False),
      "missing_file": ([model_flag, f"--text={errors / 'missing.txt'}",
                        f"--output={kept}"], False),
      "output_dir_missing": ([model_flag, "--prompt=A",
                              f"--output={errors / 'no' / 'x.html'}"], False),
      "positional": ([model_flag, "--prompt=A", f"--output={kept}", "extra"],
                     False),
  }
  return {"tmp": tmp, "errors": errors, "kept": kept, "weights": weights,
          "results": run_concurrently(COMMAND, runs)}


def test_entry_point_is_declared():
  config = configparser.ConfigParser()
  config.read(ROOT / "setup.cfg")
  scripts = config["options.entry_points"]["console_scripts"]
  assert "rnnstep-inspect = rnnstep.cli.inspect:run" in scripts
  assert callable(cli_inspect.run)
  # Spelled out in the CLI so that --help needs no TensorFlow.
  assert cli_inspect.DEFAULT_NUM_NEURONS == inspect.DEFAULT_NUM_NEURONS


def test_text_file_page_is_the_library_page(env):
  out = env["tmp"] / "page.html"
  assert ok(env["results"]["text_file"]) == (
      f"{out}: {MAX_CHARS} characters, {inspect.DEFAULT_NUM_NEURONS} neurons\n")
  text = EXCERPT.read_text()
  model = rnnstep.load(env["weights"])
  analysis = inspect.analyze(model, text[:MAX_CHARS])
  notice = (f"Showing the first {MAX_CHARS} of {len(text)} characters of "
            f"--text={EXCERPT} (--max_chars).")
  assert out.read_text(encoding="utf-8") == inspect_page.render(
      analysis, "model.npz", notice)
  assert not [name for name in os.listdir(env["tmp"]) if name.endswith(".tmp")]


def test_prompt_to_stdout_offers_the_chosen_neurons_first(env):
  page = ok(env["results"]["prompt_stdout"])
  model = rnnstep.load(env["weights"])
  analysis = inspect.analyze(model, "ROMEO:\nO Romeo, Romeo!", ["0:5", "0:2"],
                             num_neurons=3)
  assert page == inspect_page.render(analysis, "model.npz")
  assert [str(o.neuron) for o in analysis.offered[:2]] == ["0:5", "0:2"]


def test_bundled_model_by_default(env):
  assert ok(env["results"]["bundled"]).endswith(": 7 characters, 2 neurons\n")
  page = (env["tmp"] / "bundled.html").read_text(encoding="utf-8")
  assert "the bundled Shakespeare model" in page and "GRU 768" in page


def test_help_lists_the_flags(env):
  text = ok(env["results"]["help"])
  assert text.startswith("rnnstep-inspect: a page showing")
  for flag in OWN_FLAGS:
    assert f"--{flag}" in text, flag


@pytest.mark.parametrize("name, status, pattern", [
    ("no_text", 2, "no text to read: give --text=FILE or --prompt=TEXT"),
    ("text_and_prompt", 2, "At most one of (text, prompt)"),
    ("no_output", 2, "--output"),
    ("bad_neuron", 2, "--neuron=0:32: layer 0 has 32 units, numbered from 0"),
    ("no_neurons", 2, "--num_neurons=0 without --neuron leaves no neuron"),
    ("bad_max_chars", 2, "--max_chars=0: must be an integer in [1,"),
    ("unknown_char", 1, "unknown.txt: character '\u00f6' (U+00F6) at "
     "position 10 is not in the model's vocabulary"),
    ("not_utf8", 1, "latin1.txt: not UTF-8 text (byte 3:"),
    ("empty_file", 1, "empty.txt: the file is empty"),
    ("missing_file", 1, "missing.txt: No such file or directory"),
    ("output_dir_missing", 1, "cannot create a file in"),
    ("positional", 2, "unexpected arguments ['extra']"),
])
def test_errors_are_one_line_and_leave_outputs_alone(env, name, status,
                                                     pattern):
  line = one_error_line(env["results"][name], status)
  assert line.startswith("rnnstep-inspect: error: ")
  assert pattern in line, line
  assert env["kept"].read_text() == "an earlier page"
  assert sorted(os.listdir(env["errors"])) == [
      "empty.txt", "kept.html", "latin1.txt", "unknown.txt"]
