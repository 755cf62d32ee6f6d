"""rnnstep/cli/common.py in process, on a toy tool.

The helpers for the tests of the binaries are in tests/support/cli.py.
"""

import importlib
import os
import pathlib
import signal
import stat
import sys
import types

from absl import flags
import pytest

from rnnstep.cli import common


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


def test_a_tool_s_tensorflow_import_skips_keras_only_while_it_runs(
    monkeypatch):
  """TensorFlow's `__init__` imports `keras.src.optimizers` in a
  try/except ImportError when Keras is installed; a tool makes that import fail
  at once (`common._tensorflow_without_keras`), and only where Keras is not
  loaded yet. (A fresh `rnnstep-generate --nocache` then imports no Keras
  module at all: `python -X importtime` lists none.)"""
  eager = "keras.src.optimizers"
  for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
    monkeypatch.delitem(sys.modules, name)
  seen = []

  def main(argv):
    del argv
    with pytest.raises(ModuleNotFoundError, match="halted"):
      importlib.import_module(eager)
    seen.append("keras" in sys.modules)

  assert run_toy(main) == 0
  assert seen == [False] and eager not in sys.modules  # Nothing left behind.

  monkeypatch.setitem(sys.modules, "keras", types.ModuleType("keras"))
  assert run_toy(lambda argv: seen.append(eager in sys.modules)) == 0
  assert seen == [False, False]  # Keras already loaded: left alone.


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


# Every tool that takes a model calls its flag --model, as vLLM and llama.cpp
# do; --weights, the name the tools first had, is its alias.
MODEL_TOOLS = ("rnnstep.cli.generate", "rnnstep.cli.export",
               "rnnstep.cli.tune", "rnnstep.cli.inspect", "rnnstep.serve.main")


@pytest.mark.parametrize("tool", MODEL_TOOLS)
def test_model_and_weights_name_one_flag(tool):
  module = importlib.import_module(tool)
  # Their one required flag.
  required = ["--output=x"] if tool.endswith(("export", "inspect")) else []
  seen = {}
  for flag in ("--model", "--weights"):
    common.parse_flags(module.__doc__, module.FLAGS,
                       ["tool", f"{flag}=m.npz", *required])
    seen[flag] = (module.FLAGS["model"].value, module.FLAGS["weights"].value,
                  module._MODEL.value, module._MODEL.name)  # pylint: disable=protected-access
  assert seen == {"--model": ("m.npz", "m.npz", "m.npz", "--model"),
                  "--weights": ("m.npz", "m.npz", "m.npz", "--weights")}
  common.parse_flags(module.__doc__, module.FLAGS, ["tool", *required])
  assert module._MODEL.value is None  # pylint: disable=protected-access
  assert module._MODEL.name == "--model"  # pylint: disable=protected-access
  help_text = module.FLAGS.get_help()
  assert "--model: " in help_text
  assert "--weights: Alias for --model." in help_text


@pytest.mark.parametrize("flag", ["--model", "--weights"])
def test_a_model_error_names_the_flag_as_typed(flag, tmp_path):
  missing = str(tmp_path / "missing.npz")
  with pytest.raises(common.Failure, match=f"^{flag}: .*missing.npz"):
    common.load_model(missing, "float32", flag=flag)
