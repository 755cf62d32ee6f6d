"""rnnstep/cli/common.py in process, and helpers for the tests of the binaries.

The helpers (`run_concurrently`, `write_model`, `ok`, `one_error_line`) serve
tests/test_cli_generate.py and tests/test_cli_export.py, which run the
installed console scripts as subprocesses; `run_script` runs a Python script
in a fresh interpreter (the matrix's and the SavedModel tests' serving runs).
"""

import concurrent.futures
import json
import os
import pathlib
import pty
import re
import shutil
import signal
import stat
import subprocess
import sys

from absl import flags
import numpy as np
import pytest

from rnnstep.cli import common
from rnnstep.model import model_file

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
TIMEOUT = 600
REPO = pathlib.Path(__file__).resolve().parent.parent

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
    proc = subprocess.run(cmd + args, capture_output=True, text=True,
                          env=ENV, stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    return Result(proc.returncode, proc.stdout, proc.stderr)
  master, slave = pty.openpty()
  proc = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=slave,
                          stdin=subprocess.DEVNULL, env=ENV)
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
  result = subprocess.run(
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


def write_model(path):
  """A small random GRU model (V=65, D=16, U=32) over VOCAB."""
  rng = np.random.default_rng(0)
  v, d, u = len(VOCAB), 16, 32
  config = model_file.ModelConfig(d, (model_file.LayerConfig("gru", u, True),))
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


# In process: a toy tool on common.run.

TOY_DOC = "toy: a tool for testing.\n\nUSAGE: toy --name=NAME"
TOY_FLAGS = flags.FlagValues()
flags.DEFINE_string("name", None, "A name.", flag_values=TOY_FLAGS)
flags.register_validator("name", lambda name: name != "bad",
                         message="must not be bad", flag_values=TOY_FLAGS)


def run_toy(main, *args):
  with pytest.raises(SystemExit) as raised:
    common.run("toy", TOY_DOC, TOY_FLAGS, main, ["toy", *args])
  return raised.value.code or 0


def raising(error):
  def main(argv):
    del argv
    raise error
  return main


@pytest.mark.parametrize("error,status,words", [
    (common.Failure("bad\n  thing", 2), 2, "toy: error: bad; thing"),
    (FileNotFoundError(2, "No such file or directory", "x.npz"), 1,
     "toy: error: No such file or directory: x.npz"),
    (ValueError("no good"), 1, "toy: error: no good"),
    (KeyError("k"), 1, "toy: error: unexpected KeyError: 'k' (please report"),
    (KeyboardInterrupt(), 130, "toy: error: interrupted"),
    (common.Terminated(), 143, "toy: error: terminated"),
])
def test_exceptions_become_one_line_and_a_status(error, status, words, capfd,
                                                  monkeypatch):
  monkeypatch.delenv("RNNSTEP_DEBUG", raising=False)
  assert run_toy(raising(error), "--name=a") == status
  captured = capfd.readouterr()
  assert captured.out == ""
  assert captured.err.splitlines() == [captured.err.strip()]
  assert captured.err.startswith(words)


def test_debug_raises_unexpected_errors_but_reports_failures(capfd,
                                                             monkeypatch):
  monkeypatch.setenv("RNNSTEP_DEBUG", "1")
  with pytest.raises(KeyError):
    common.run("toy", TOY_DOC, TOY_FLAGS, raising(KeyError("k")), ["toy"])
  assert run_toy(raising(common.Failure("mine")), "--name=a") == 1
  assert capfd.readouterr().err == "toy: error: mine\n"


def test_success_sees_the_flags_and_sigterm_handler_is_restored(capfd):
  before = signal.getsignal(signal.SIGTERM)
  seen = []

  def main(argv):
    seen.append((argv, TOY_FLAGS.name))
    print("done")

  assert run_toy(main, "--name=a") == 0
  assert run_toy(main) == 0  # Flags start afresh on a second run.
  assert seen == [(["toy"], "a"), (["toy"], None)]
  assert capfd.readouterr() == ("done\ndone\n", "")
  assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("args,words", [
    (["--nme=a"], "toy: error: Unknown command line flag 'nme'"),
    (["--name=bad"], "toy: error: flag --name=bad: must not be bad"),
])
def test_flag_errors_are_one_line(args, words, capfd):
  assert run_toy(raising(AssertionError("main ran")), *args) == 2
  captured = capfd.readouterr()
  assert captured.out == "" and captured.err.count("\n") == 1
  assert captured.err.startswith(words) and "(see --help)" in captured.err


def test_help_exits_0_and_helpfull_adds_flagfile(capfd, tmp_path):
  main = raising(AssertionError("main ran"))
  assert run_toy(main, "--help") == 0
  short = capfd.readouterr()
  assert run_toy(main, "--name=a", "--helpfull") == 0
  full = capfd.readouterr()
  for captured in (short, full):
    assert captured.out.startswith(TOY_DOC)
    assert "--name: A name." in captured.out
    assert captured.err == ""
  assert "--flagfile" in full.out and "--flagfile" not in short.out
  flagfile = tmp_path / "flags"
  flagfile.write_text("--name=from_file\n")
  seen = []
  assert run_toy(lambda argv: seen.append(TOY_FLAGS.name),
                 f"--flagfile={flagfile}") == 0
  assert seen == ["from_file"]


def test_atomic_output_appears_whole_with_the_mode_open_gives(tmp_path):
  path = tmp_path / "out.txt"
  umask = os.umask(0o027)
  try:
    with common.atomic_output(str(path)) as f:
      f.write("é\n")
      assert not path.exists()
  finally:
    os.umask(umask)
  assert path.read_text(encoding="utf-8") == "é\n"
  assert stat.S_IMODE(path.stat().st_mode) == 0o640
  path.chmod(0o600)  # An existing file keeps its mode.
  with common.atomic_output(str(path)) as f:
    f.write("again")
  assert path.read_text() == "again"
  assert stat.S_IMODE(path.stat().st_mode) == 0o600
  assert os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("error", [ValueError("x"), KeyboardInterrupt(),
                                   common.Terminated()])
def test_atomic_output_leaves_nothing_on_failure(error, tmp_path):
  path = tmp_path / "out.txt"
  path.write_text("old")
  with pytest.raises(type(error)):
    with common.atomic_output(str(path)) as f:
      f.write("partial")
      raise error
  assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_atomic_output_errors_name_the_flag(tmp_path):
  with pytest.raises(common.Failure, match=r"^--out=.*: is a directory$"):
    with common.atomic_output(str(tmp_path), "--out"):
      pass
  with pytest.raises(common.Failure, match=r"^--output=.*: cannot create a "
                     r"file in .*missing \(No such file or directory\)$"):
    with common.atomic_output(str(tmp_path / "missing" / "out.txt")):
      pass


def test_staged_directory_replaces_nothing_or_an_empty_directory(tmp_path):
  for name, exists in (("new", False), ("empty", True)):
    target = tmp_path / name
    if exists:
      target.mkdir()
    with common.staged_path(str(target), directory=True) as tmp:
      assert os.path.dirname(tmp) == str(tmp_path)
      pathlib.Path(tmp, "file").write_text(name)
    assert (target / "file").read_text() == name
  with pytest.raises(common.Failure,
                     match=r"^--output=.*/new: Directory not empty$"):
    with common.staged_path(str(tmp_path / "new"), directory=True) as tmp:
      pathlib.Path(tmp, "other").write_text("x")
  assert sorted(os.listdir(tmp_path)) == ["empty", "new"]
  assert os.listdir(tmp_path / "new") == ["file"]


def test_dtypes_are_the_library_s():
  from rnnstep.model import network as model_lib  # pylint: disable=g-import-not-at-top
  assert common.DTYPES == tuple(model_lib.DTYPES)
