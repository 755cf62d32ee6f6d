"""tests/support/tf_audit.py: the run's CPU recorder and its summary."""

import json
import sys

import pytest

from tests.support import cli
from tests.support import forkserver
from tests.support import tf_audit

# A process that records as a test worker does: a test's traces and first
# calls (one outer function calling an inner one: only the outer is
# recorded), then the summary of its folder.
SCRIPT = r"""
import sys
import tensorflow as tf
from tests.support import tf_audit
recorder = tf_audit.Recorder(sys.argv[1])
recorder.wrap_tensorflow()
recorder.test = "tests/test_x.py::test_a"
inner = tf.function(lambda x: x * 2)
outer = tf.function(lambda x: inner(x) + 1)
assert int(outer(tf.constant(3))) == 7
assert int(outer(tf.constant(4))) == 9  # Traced once, first-called once.
recorder.test = ""
recorder.write(kind="test", test="tests/test_x.py::test_a", wall=1.0,
               own=0.5, exec=0.25, fork=0.125)
print(tf_audit.summary(sys.argv[1]))
"""


@pytest.mark.slow  # A subprocess.
def test_a_test_s_traces_first_calls_and_cpu_are_summed_per_file(tmp_path):
  result = forkserver.run([sys.executable, "-c", SCRIPT, str(tmp_path)],
                          env=dict(cli.ENV, PYTHONPATH=str(cli.REPO)),
                          capture_output=True, text=True, timeout=cli.TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  (name,) = [p for p in tmp_path.iterdir() if p.suffix == ".jsonl"]
  records = [json.loads(line) for line in name.read_text().splitlines()]
  kinds = [(r["kind"], r["test"]) for r in records]
  assert kinds == [("trace", "tests/test_x.py::test_a"),
                   ("first", "tests/test_x.py::test_a"),
                   ("test", "tests/test_x.py::test_a")], kinds
  assert "| test_x.py | 1 | 0.5 | 0.2 | 0.1 |" in result.stdout, result.stdout


def test_the_controller_of_a_distributed_run_records_nothing(monkeypatch,
                                                             tmp_path):
  class Config:  # What tf_audit.install reads of pytest's config.
    def __init__(self, worker, processes):
      if worker:
        self.workerinput = {}
      self.processes = processes
      self.registered = []
      self.pluginmanager = self

    def getoption(self, name, default=None):
      assert name == "numprocesses"
      return self.processes if self.processes is not None else default

    def register(self, plugin, name):
      self.registered.append(name)

  monkeypatch.delenv(tf_audit.ENV, raising=False)
  unasked = Config(worker=True, processes=2)
  tf_audit.install(unasked)
  assert not unasked.registered
  monkeypatch.setenv(tf_audit.ENV, str(tmp_path))
  controller = Config(worker=False, processes=2)
  tf_audit.install(controller)
  assert not controller.registered and not list(tmp_path.iterdir())
