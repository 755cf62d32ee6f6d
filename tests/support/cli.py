"""Helpers for the tests that run the installed binaries or fresh interpreters.

`command` finds a console script (or `python -m`), `run_concurrently` runs a
module's subprocesses a few at a time, `ok` / `one_error_line` check a run's
streams, `write_model` writes a small random model file, and `run_script`
runs a Python script in a fresh interpreter (the matrix's and the SavedModel
tests' serving runs). `TF_NOISE` matches the lines TensorFlow prints at import
whatever TF_CPP_MIN_LOG_LEVEL says.
"""

import concurrent.futures
import json
import os
import pathlib
import pty
import re
import shutil
import subprocess
import sys

import numpy as np

from rnnstep.model import model_file
from tests.support import forkserver

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
TIMEOUT = 600
REPO = pathlib.Path(__file__).resolve().parents[2]

# The Shakespeare character set (65 characters, as in the TF tutorial).
VOCAB = list("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

# TF >= 2.19 prints these at import whatever TF_CPP_MIN_LOG_LEVEL says
# (tensorflow/tensorflow#100442); the CLI can only hide them if importing
# `rnnstep` does not import TensorFlow first.
TF_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are "
    r"written to STDERR|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] .*|"
    r"To enable the following instructions: .*")


def command(program, module):
  """The installed console script, or `python -m` when it is not on PATH."""
  binary = shutil.which(program)
  return [binary] if binary else [sys.executable, "-m", module]


class Result:

  def __init__(self, returncode, stdout, stderr):
    self.returncode = returncode
    self.stdout = stdout
    self.stderr_lines = [line for line in stderr.splitlines()
                         if line.strip() and not TF_NOISE.fullmatch(line.strip())]

  def __repr__(self):
    return (f"Result(rc={self.returncode}, stdout={self.stdout[:300]!r}, "
            f"stderr={self.stderr_lines!r})")


def run_binary(cmd, args, tty_stderr=False):
  if not tty_stderr:
    proc = forkserver.run(cmd + args, capture_output=True, text=True,
                          env=ENV, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    return Result(proc.returncode, proc.stdout, proc.stderr)
  # A terminal on stderr only: the fork server passes the pty's end to the
  # child as it passes a pipe (a real exec where it cannot fork).
  master, slave = pty.openpty()
  proc = forkserver.popen(cmd + args, stdout=subprocess.PIPE, stderr=slave,
                          env=ENV)
  os.close(slave)
  chunks = []
  while True:
    try:
      data = os.read(master, 1 << 16)
    except OSError:  # EIO: the child closed the terminal.
      break
    if not data:
      break
    chunks.append(data)
  os.close(master)
  stdout = proc.stdout.read().decode()
  proc.stdout.close()
  proc.wait(TIMEOUT)
  return Result(proc.returncode, stdout, b"".join(chunks).decode())


def run_script(script: str, *args: str):
  """Runs Python source `script` in a fresh interpreter from the repository
  root, `args` as its argv; returns its last stdout line, read as JSON."""
  result = forkserver.run(
      [sys.executable, "-c", script, *args], capture_output=True, text=True,
      timeout=TIMEOUT, cwd=REPO, env=ENV, stdin=subprocess.DEVNULL)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def run_concurrently(cmd, runs, workers=4):
  """{name: (args, tty_stderr)} -> {name: Result}, `workers` at a time."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futures = {name: pool.submit(run_binary, cmd, args, tty)
               for name, (args, tty) in runs.items()}
    return {name: future.result() for name, future in futures.items()}


def write_model(path, seed=0, window=None, embedding_dim=16, units=32):
  """A small random GRU model (V=65, D=16, U=32) over VOCAB: the
  architecture of `reference_models.TINY_LAYERS` (programs shared).

  Args:
    path: where to write the model file.
    seed: the weights' random seed.
    window: the window the file records, if any.
    embedding_dim, units: D and U for another architecture (its own
      programs).
  """
  rng = np.random.default_rng(seed)
  v, d, u = len(VOCAB), embedding_dim, units
  config = model_file.ModelConfig(d, (model_file.LayerConfig("gru", u, True),),
                                  window=window)
  tensors = {
      "embedding": rng.normal(size=(v, d)),
      "layer0_kernel": rng.normal(size=(d, 3 * u)) * 0.3,
      "layer0_recurrent_kernel": rng.normal(size=(u, 3 * u)) * 0.3,
      "layer0_bias": rng.normal(size=(2, 3 * u)) * 0.1,
      "dense_kernel": rng.normal(size=(u, v)),
      "dense_bias": rng.normal(size=(v,)) * 0.1,
  }
  model_file.write(path, config, VOCAB,
                   {k: x.astype(np.float32) for k, x in tensors.items()})


def ok(result):
  assert result.returncode == 0, result
  assert result.stderr_lines == [], result
  return result.stdout


def one_error_line(result, status=None):
  assert result.returncode != 0, result
  if status is not None:
    assert result.returncode == status, result
  assert result.stdout == "", result
  assert len(result.stderr_lines) == 1, result
  assert "Traceback" not in result.stderr_lines[0]
  return result.stderr_lines[0]
