"""tests/support/forkserver.py against a real exec: what a forked child
sees and returns equals what a fresh interpreter sees and returns."""

import os
import signal
import subprocess
import sys

import pytest

from tests.support import cli
from tests.support import forkserver
from tests.support import tiers

pytestmark = pytest.mark.slow  # Subprocesses.

# What a program can observe of how it was started.
PROBE = r"""
import json, os, sys
line = sys.stdin.readline()
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "env": os.environ.get("PROBE_VALUE"), "stdin": line,
                  "main": __name__, "tty": [os.isatty(1), os.isatty(2)],
                  "rnnstep": "rnnstep" in sys.modules}))
print("to stderr", file=sys.stderr)
if len(sys.argv) > 1 and sys.argv[1] == "raise":
  raise ValueError("raised")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def both(cmd, **kwargs):
  """(real exec, forked) results of one call."""
  kwargs = dict(capture_output=True, text=True, timeout=120, **kwargs)
  return subprocess.run(cmd, **kwargs), forkserver.run(cmd, **kwargs)


@pytest.mark.parametrize("args", [[], ["3"], ["raise"]])
def test_a_script_sees_and_returns_what_a_fresh_interpreter_does(tmp_path,
                                                                 args):
  real, forked = both([sys.executable, "-c", PROBE, *args], cwd=tmp_path,
                      input="a line\n", env=dict(cli.ENV, PROBE_VALUE="x"))
  assert forked.returncode == real.returncode
  assert forked.stdout == real.stdout
  # A traceback names the server's frame too; its last line is the same.
  assert forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]


def test_a_module_and_a_console_script_run_as_installed(tmp_path):
  model = tmp_path / "model.npz"
  cli.write_model(model)
  flags = [f"--weights={model}", "--prompt=AB", "--num_steps=12",
           "--temperature=0"]
  real, forked = both([sys.executable, "-m", "rnnstep.cli.generate"] + flags,
                      env=cli.ENV, stdin=subprocess.DEVNULL)
  assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
  assert forked.returncode == 0 and forked.stdout.startswith("AB")
  script = forkserver.run(
      cli.command("rnnstep-generate", "rnnstep.cli.generate") + flags,
      env=cli.ENV, capture_output=True, text=True, timeout=120)
  assert (script.returncode, script.stdout) == (0, real.stdout)


# A long-running child: a line on each stream, then waits for a signal.
SERVING = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("up", flush=True)
print("err", file=sys.stderr, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_long_running_child_is_signalled_and_reaped_as_popen_s(sig):
  """`popen` (the tests' servers): the pid is the child's, a signal reaches
  it, and `poll`, `wait` and `communicate` give what `subprocess.Popen`'s
  give."""
  cmd = [sys.executable, "-c", SERVING]
  kwargs = dict(env=cli.ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
  real = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, **kwargs)
  forked = forkserver.popen(cmd, **kwargs)
  assert isinstance(forked, forkserver.Process)
  outcomes = []
  for process in (real, forked):
    assert process.stdout.readline() == "up\n"
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
      process.wait(0.1)
    with open(f"/proc/{process.pid}/cmdline", "rb") as f:
      assert b"-c" in f.read()
    process.send_signal(sig)
    outcomes.append(process.communicate(timeout=60) + (process.returncode,
                                                       process.poll()))
  assert outcomes[1] == outcomes[0] == (
      "", "err\n", 7 if sig == signal.SIGTERM else -signal.SIGKILL,
      7 if sig == signal.SIGTERM else -signal.SIGKILL)


def test_a_timeout_kills_the_child_and_other_programs_exec():
  with pytest.raises(subprocess.TimeoutExpired):
    forkserver.run([sys.executable, "-c", "import time; time.sleep(60)"],
                   env=cli.ENV, timeout=1)
  # Not this Python, or an environment TensorFlow reads while importing:
  # a real exec (the forked children would differ).
  assert forkserver.run(["sh", "-c", "echo $$"], capture_output=True,
                        text=True).stdout.strip().isdigit()
  changed = dict(cli.ENV, TF_CPP_MIN_LOG_LEVEL="1")
  assert forkserver._server_for(changed) is None  # pylint: disable=protected-access
  assert forkserver._server_for(cli.ENV) is not None  # pylint: disable=protected-access


def test_each_forked_child_s_cpu_seconds_are_reported():
  """What `tests/support/tf_audit.py` charges a test for its forks: the
  child's CPU seconds come back with its exit status (`children_cpu`)."""
  burn = "import time\nend = time.process_time() + 0.3\n" \
         "while time.process_time() < end: pass\n"
  before = forkserver.children_cpu()
  result = forkserver.run([sys.executable, "-c", burn], env=cli.ENV,
                          timeout=120)
  assert result.returncode == 0
  assert 0.3 <= forkserver.children_cpu() - before < 30
  child = forkserver.popen([sys.executable, "-c", burn], env=cli.ENV)
  assert child.wait(120) == 0
  assert forkserver.children_cpu() - before >= 0.6


def test_a_child_s_own_tf_xla_flags_are_the_ones_its_xla_reads(tmp_path):
  """TensorFlow reads TF_XLA_FLAGS at XLA's first use, not at import: a
  forked child with its own persistent cache folder compiles into it."""
  flags = f"--tf_xla_persistent_cache_directory={tmp_path}"
  env = dict(cli.ENV, TF_XLA_FLAGS=flags)
  assert forkserver._server_for(env) is not None  # pylint: disable=protected-access
  script = ("import tensorflow as tf\n"
            "f = tf.function(lambda x: x * 3 + 1, jit_compile=True)\n"
            "print(int(f(tf.constant(2))))\n")
  result = forkserver.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0 and result.stdout == "7\n", result.stderr
  assert [p.name for p in tmp_path.iterdir()
          if p.name.startswith("xla_compile_cache")], list(tmp_path.iterdir())


class _QuickTest:
  """A collected test as the guard sees it, marked with `marks`."""

  nodeid = "tests/test_x.py::test_quick"

  def __init__(self, *marks):
    self.marks = marks

  def get_closest_marker(self, name):
    return pytest.mark.slow if name in self.marks else None


def test_a_test_outside_slow_that_starts_a_process_fails_naming_the_mark(
    monkeypatch):
  """tests/support/tiers.py's guard (installed by tests/conftest.py): a
  process started by a test that is neither `slow` nor `light_process`
  fails it before it starts, by exec or by the fork server."""
  monkeypatch.setattr(tiers, "current_test", _QuickTest())
  for start in (subprocess.run, forkserver.run):
    with pytest.raises(tiers.ProcessInQuickTest, match=(
        r"^tests/test_x.py::test_quick started a process \(\['true'\]\) but "
        "is not marked slow: mark it @pytest.mark.slow")):
      start(["true"])
  for marks in (("slow",), ("light_process",)):
    monkeypatch.setattr(tiers, "current_test", _QuickTest(*marks))
    assert subprocess.run(["true"], check=True).returncode == 0
