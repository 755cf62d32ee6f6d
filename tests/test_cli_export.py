"""Tests of the installed `rnnstep-export` binary, run as a subprocess.

The exported SavedModel is loaded in a process where `rnnstep`, `keras` and
`tf_keras` are unimportable; its text must equal `rnnstep.generate` in this
process on the same small random model file.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import rnnstep
from tests.test_cli_common import ENV, TIMEOUT, command, ok, one_error_line
from tests.test_cli_common import Result, run_concurrently, write_model

COMMAND = command("rnnstep-export", "rnnstep.cli.export")
PROMPTS = ["ROMEO:", "To be, or not", "J"]
STEPS = 40
CALLS = [  # (signature, its arguments besides the prompts)
    ("serving_default", {"num_steps": STEPS, "temperature": 0.8, "seed": 11}),
    ("generate_top_k_top_p", {"num_steps": STEPS, "temperature": 1.0,
                              "seed": 3, "top_k": 5, "top_p": 0.9}),
]

SERVE = textwrap.dedent("""
    import json, sys
    sys.modules.update(rnnstep=None, keras=None, tf_keras=None)
    import tensorflow as tf
    signatures = tf.saved_model.load(sys.argv[1]).signatures
    prompts, calls = json.loads(sys.argv[2])
    texts = []
    for name, args in calls:
      args = {k: tf.constant(v, tf.int64 if k == "seed" else None)
              for k, v in args.items()}
      out = signatures[name](prompts=tf.constant(prompts), **args)["text"]
      texts.append([t.decode() for t in out.numpy()])
    print(json.dumps(texts))
""")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Writes the model and runs every export, 4 at a time."""
  tmp = tmp_path_factory.mktemp("cli_export")
  weights = str(tmp / "model.npz")
  write_model(weights)
  for name in ("errors", "full", "sigterm"):
    (tmp / name).mkdir()
  (tmp / "full" / "keep.txt").write_text("keep")
  served = tmp / "served" / "1"  # Its parent does not exist yet.
  runs = {
      "export": ([f"--weights={weights}", f"--output={served}"], False),
      "missing_weights": ([f"--weights={tmp / 'errors' / 'missing.npz'}",
                           f"--output={tmp / 'errors' / 'new' / '1'}"], False),
      "non_empty": ([f"--weights={weights}", f"--output={tmp / 'full'}"],
                    False),
      "no_output": ([f"--weights={weights}"], False),
      "help": (["--help"], False),
  }
  return {"tmp": tmp, "weights": weights, "served": served,
          "results": run_concurrently(COMMAND, runs)}


def test_binary_is_installed():
  assert len(COMMAND) == 1, "rnnstep-export is not on PATH: `pip install -e .`"


def test_export_reports_where_and_the_signatures(env):
  served = str(env["served"])
  lines = ok(env["results"]["export"]).splitlines()
  assert served in lines[0]
  assert any(line.strip().startswith("serving_default(") for line in lines)
  assert any(line.strip().startswith("generate_top_k_top_p(") for line in lines)
  assert lines[-1].endswith(f"saved_model_cli show --dir {served} --all")
  assert os.listdir(env["served"].parent) == ["1"]  # No temp directory left.


def test_served_text_equals_the_library_without_rnnstep(env):
  ok(env["results"]["export"])
  proc = subprocess.run(
      [sys.executable, "-c", SERVE, str(env["served"]),
       json.dumps([PROMPTS, CALLS])],
      capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  served = json.loads(proc.stdout.strip().splitlines()[-1])
  model = rnnstep.load(env["weights"])
  assert served == [rnnstep.generate(model, PROMPTS, jit_compile=False, **args)
                    for _, args in CALLS]


def test_help_lists_the_flags(env):
  text = ok(env["results"]["help"])
  assert "USAGE: rnnstep-export" in text
  for flag in ("--weights", "--output", "--[no]jit_compile", "--dtype",
               "--corpus", "--vocab"):
    assert flag in text, flag


def test_missing_weights_is_one_line_and_creates_nothing(env):
  line = one_error_line(env["results"]["missing_weights"], 1)
  assert line.startswith("rnnstep-export: error: --weights")
  assert "missing.npz" in line
  assert os.listdir(env["tmp"] / "errors") == []


def test_non_empty_output_is_one_line_and_left_untouched(env):
  line = one_error_line(env["results"]["non_empty"], 1)
  assert line.startswith("rnnstep-export: error: --output=")
  assert "not an empty directory" in line
  assert os.listdir(env["tmp"] / "full") == ["keep.txt"]
  assert (env["tmp"] / "full" / "keep.txt").read_text() == "keep"


def test_missing_output_flag_is_a_usage_error(env):
  assert "--output" in one_error_line(env["results"]["no_output"], 2)


def test_sigterm_while_exporting_removes_what_it_created(env):
  """Killed once its temp directory exists: the temp directory and the
  parents it made go; the directory that was there stays."""
  parent = env["tmp"] / "sigterm"
  made = parent / "a" / "b"
  proc = subprocess.Popen(
      COMMAND + [f"--weights={env['weights']}", f"--output={made / '1'}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
  deadline = time.monotonic() + TIMEOUT
  while not (made.is_dir() and os.listdir(made)):
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.005)
  proc.terminate()
  stdout, stderr = proc.communicate(timeout=TIMEOUT)
  line = one_error_line(Result(proc.returncode, stdout, stderr), 143)
  assert line == "rnnstep-export: error: terminated"
  assert os.listdir(parent) == []
