"""Tests of the installed `rnnstep-export` binary, run as a subprocess.

The exported SavedModel is loaded in a process where `rnnstep`, `keras` and
`tf_keras` are unimportable; its text must equal `rnnstep.generate` in this
process on the same small random model file. The --format=tflite export runs
in the ai_edge_litert interpreter in a process without TensorFlow.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import rnnstep
from rnnstep.cli import export
from tests.support import forkserver
from tests.support.cli import ENV, TIMEOUT, command, ok, one_error_line
from tests.support.cli import Result, run_concurrently, write_model

# Quick tier (-m "not slow") leaves this file out: every test runs
# rnnstep-export and serves the export in fresh interpreters.
pytestmark = pytest.mark.slow

COMMAND = command("rnnstep-export", "rnnstep.cli.export")
PROMPTS = ["ROMEO:", "To be, or not", "J"]
STEPS = 40
CALLS = [  # (signature, its arguments besides the prompts)
    ("serving_default", {"num_steps": STEPS, "temperature": 0.8, "seed": 11}),
    ("generate_top_k_top_p", {"num_steps": STEPS, "temperature": 1.0,
                              "seed": 3, "top_k": 5, "top_p": 0.9}),
    # The pattern the export compiled (--regex), and stop strings.
    ("generate_constrained", {
        "num_steps": STEPS, "temperature": 0.8, "seed": 11, "top_k": 0,
        "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
        "repetition_penalty": 1.2, "repetition_window": 0,
        "no_repeat_ngram_size": 0, "num_beams": 1, "length_penalty": 1.0,
        "frequency_penalty": 0.3, "presence_penalty": 0.0,
        "stop": ["e", "th"], "regex": "[a-z ,]+[.!?]"}),
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

# The LiteRT export, run where TensorFlow, rnnstep and Keras are unimportable.
LITERT = textwrap.dedent("""
    import json, os, sys
    sys.modules.update(tensorflow=None, rnnstep=None, keras=None, tf_keras=None)
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter
    directory, prompts, calls = sys.argv[1], *json.loads(sys.argv[2])
    with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as f:
      vocab = json.load(f)
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.zeros([len(prompts), max(map(len, prompts))], np.int32)
    for row, prompt in enumerate(prompts):
      ids[row, :len(prompt)] = [index[c] for c in prompt]
    runner = Interpreter(os.path.join(directory, "model.tflite")
                         ).get_signature_runner("generate")
    size = len(vocab)
    # Every option off (a client's defaults) but those a call gives; no stop
    # string (one state, never accepting), no pattern (every row FREE).
    off = dict(temperature=[1.0], top_k=[0], top_p=[1.0], min_p=[0.0],
               typical_p=[1.0], repetition_penalty=[1.0],
               repetition_window=0, no_repeat_ngram_size=0, num_beams=1,
               length_penalty=1.0, frequency_penalty=[0.0],
               presence_penalty=[0.0])
    texts = []
    for args in calls:
      # Per-row inputs (a list above) are [B] or [1]; the others scalars.
      values = {k: np.array(args.get(k, v), np.float32 if isinstance(
          v[0] if isinstance(v, list) else v, float) else np.int32).reshape(
              [-1] if isinstance(v, list) else [])
                for k, v in off.items()}
      out = runner(prompt_ids=ids,
                   prompt_lengths=np.array([len(p) for p in prompts], np.int32),
                   num_steps=np.int32(args["num_steps"]),
                   seed=np.int32(args["seed"]),
                   stop_table=np.zeros([1, size], np.int32),
                   stop_accept=np.zeros([1], bool),
                   regex_table=np.array([[0] * size, [1] * size], np.int32),
                   regex_ends=np.zeros([2], bool),
                   regex_start=np.zeros([1], np.int32), **values)
      texts.append(["".join(vocab[i] for i in row[:n])
                    for row, n in zip(out["ids"], out["lengths"])])
    print(json.dumps(texts))
""")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Writes the model and runs every export, 4 at a time."""
  tmp = tmp_path_factory.mktemp("cli_export")
  weights = str(tmp / "model.npz")
  write_model(weights)
  for name in ("errors", "full", "sigterm", "litert_errors"):
    (tmp / name).mkdir()
  (tmp / "full" / "keep.txt").write_text("keep")
  served = tmp / "served" / "1"  # Its parent does not exist yet.
  runs = {
      "export": ([f"--weights={weights}", f"--output={served}",
                  "--regex=[a-z ,]+[.!?]", "--regex=[0-9]+"], False),
      "bad_regex": ([f"--weights={weights}", "--regex=[0-9]+", "--regex=(",
                     f"--output={tmp / 'litert_errors' / 'f'}"], False),
      "tflite_regex": ([f"--weights={weights}", "--format=tflite",
                        "--regex=[0-9]+",
                        f"--output={tmp / 'litert_errors' / 'g'}"], False),
      "missing_weights": ([f"--weights={tmp / 'errors' / 'missing.npz'}",
                           f"--output={tmp / 'errors' / 'new' / '1'}"], False),
      "non_empty": ([f"--weights={weights}", f"--output={tmp / 'full'}"],
                    False),
      "no_output": ([f"--weights={weights}"], False),
      "help": (["--help"], False),
      "tflite": ([f"--weights={weights}", "--format=tflite",
                  f"--output={tmp / 'litert' / 'a'}"], False),
      "tflite_bfloat16": ([f"--weights={weights}", "--format=tflite",
                           "--dtype=bfloat16",
                           f"--output={tmp / 'litert_errors' / 'b'}"], False),
      "tflite_jit": ([f"--weights={weights}", "--format=tflite",
                      "--jit_compile",
                      f"--output={tmp / 'litert_errors' / 'c'}"], False),
      "tflite_non_empty": ([f"--weights={weights}", "--format=tflite",
                            f"--output={tmp / 'full'}"], False),
      "web": ([f"--weights={weights}", "--format=web",
               f"--output={tmp / 'web' / 'a'}"], False),
      "web_jit": ([f"--weights={weights}", "--format=web", "--jit_compile",
                   f"--output={tmp / 'litert_errors' / 'e'}"], False),
      "bad_format": ([f"--weights={weights}", "--format=onnx",
                      f"--output={tmp / 'litert_errors' / 'd'}"], False),
      "int8_saved_model": ([f"--weights={weights}", "--dynamic_range_int8",
                            f"--output={tmp / 'litert_errors' / 'h'}"], False),
      "int8_rounded_weights": ([f"--weights={weights}", "--format=tflite",
                                "--dynamic_range_int8",
                                "--weights_dtype=float16",
                                f"--output={tmp / 'litert_errors' / 'i'}"],
                               False),
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
  proc = forkserver.run(
      [sys.executable, "-c", SERVE, str(env["served"]),
       json.dumps([PROMPTS, CALLS])],
      capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  served = json.loads(proc.stdout.strip().splitlines()[-1])
  model = rnnstep.load(env["weights"])
  assert served == [rnnstep.generate(model, PROMPTS, jit_compile=False, **args)
                    for _, args in CALLS]
  assert all(len(text) < STEPS for text in served[-1])  # Stopped early.


def test_tflite_export_reports_files_and_the_signature(env):
  directory = env["tmp"] / "litert" / "a"
  lines = ok(env["results"]["tflite"]).splitlines()
  assert lines[0].startswith("wrote a LiteRT model of ")
  assert str(directory) in lines[0]
  assert lines[-2].strip().startswith("generate(prompt_ids: int32[?][?], ")
  assert lines[-1].startswith("every decoding option is an input")
  assert sorted(os.listdir(directory)) == ["model.tflite", "vocab.json"]
  assert os.listdir(directory.parent) == ["a"]  # No temp directory left.


def test_tflite_text_equals_the_library_without_tensorflow(env):
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  ok(env["results"]["tflite"])
  calls = [dict(args, num_steps=STEPS) for name, args in CALLS
           if name != "generate_constrained"]  # No stop tables to build.
  calls.append(dict(num_steps=STEPS, temperature=0.0, seed=0))
  calls.append(dict(num_steps=STEPS, temperature=[0.5, 1.0, 1.5], seed=4,
                    repetition_penalty=1.3, no_repeat_ngram_size=2,
                    min_p=0.05))
  proc = forkserver.run(
      [sys.executable, "-c", LITERT, str(env["tmp"] / "litert" / "a"),
       json.dumps([PROMPTS, calls])],
      capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  texts = json.loads(proc.stdout.strip().splitlines()[-1])
  model = rnnstep.load(env["weights"])
  assert texts == [rnnstep.generate(model, PROMPTS, jit_compile=False, **args)
                   for args in calls]


def test_web_export_reports_the_files(env):
  directory = env["tmp"] / "web" / "a"
  lines = ok(env["results"]["web"]).splitlines()
  assert lines[0].startswith("wrote a web export of ")
  assert str(directory) in lines[0]
  assert lines[1].startswith(f"open: chromium {directory / 'index.html'}")
  assert sorted(os.listdir(directory)) == ["index.html", "model.json",
                                           "rnnstep.js", "weights.bin"]
  assert os.listdir(directory.parent) == ["a"]  # No temp directory left.


@pytest.mark.parametrize("run, status, words", [
    ("tflite_bfloat16", 2, "--dtype=bfloat16: --format=tflite exports float32"),
    ("tflite_jit", 2, "--jit_compile applies to --format=saved_model only"),
    ("tflite_non_empty", 1, "not an empty directory"),
    ("bad_format", 2, "--format=onnx"),
    ("web_jit", 2, "--jit_compile applies to --format=saved_model only"),
    ("tflite_regex", 2, "--regex applies to --format=saved_model only"),
    ("bad_regex", 2, "--regex: "),
    ("int8_saved_model", 2,
     "--dynamic_range_int8 applies to --format=tflite only"),
    ("int8_rounded_weights", 2,
     "--weights_dtype=float16: --dynamic_range_int8 rounds the weights to "
     "int8; drop one of them"),
])
def test_tflite_bad_values_are_one_line_and_create_nothing(env, run, status,
                                                          words):
  line = one_error_line(env["results"][run], status)
  assert line.startswith("rnnstep-export: error: ")
  assert words in line
  assert os.listdir(env["tmp"] / "litert_errors") == []
  assert os.listdir(env["tmp"] / "full") == ["keep.txt"]


def test_help_lists_the_flags(env):
  text = ok(env["results"]["help"])
  assert "USAGE: rnnstep-export" in text
  for flag in ("--weights", "--output", "--[no]jit_compile", "--dtype",
               "--format", "--corpus", "--vocab", "--[no]dynamic_range_int8"):
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
  parents it made go; the directory that was there stays. The tool's
  test-only pause (export.PAUSE_ENV) holds it there until the signal, so a
  fast export cannot finish first."""
  parent = env["tmp"] / "sigterm"
  made = parent / "a" / "b"
  paused = env["tmp"] / "sigterm.paused"
  proc = forkserver.popen(
      COMMAND + [f"--weights={env['weights']}", f"--output={made / '1'}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**ENV, export.PAUSE_ENV: str(paused)})
  deadline = time.monotonic() + TIMEOUT
  while not paused.exists():
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.005)
  assert len(os.listdir(made)) == 1  # The temp directory, nothing else yet.
  proc.terminate()
  stdout, stderr = proc.communicate(timeout=TIMEOUT)
  line = one_error_line(Result(proc.returncode, stdout, stderr), 143)
  assert line == "rnnstep-export: error: terminated"
  assert os.listdir(parent) == []
