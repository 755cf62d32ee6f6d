"""Where a test run's CPU goes: an opt-in recorder and its summary.

    RNNSTEP_TEST_AUDIT=/tmp/audit python -m pytest -q   # records (any tier)
    python -m tests.support.tf_audit /tmp/audit          # sums it up

`tests/conftest.py` installs the recorder in every process that runs tests
(the xdist workers, or the one process with `-n0`) when
`RNNSTEP_TEST_AUDIT` names a folder. Each process appends JSON lines to
`<folder>/<pid>.jsonl`:

- one `test` record a test (setup, call and teardown): its wall seconds,
  the CPU seconds of its own process (`own`), of the subprocesses it ran
  and reaped (`exec`: `resource.RUSAGE_CHILDREN`) and of the children the
  fork server ran for it (`fork`: `forkserver.children_cpu`, which the
  server reports with each exit status);
- one `trace` record each time TensorFlow traced a function (a concrete
  function made), and one `first` record for each concrete function's first
  call (TensorFlow's instantiation, Grappler, an XLA compile, and the call
  itself), in the process's CPU seconds, with the function's name and the
  test they ran in. What happens in subprocesses is in their test's `exec`
  and `fork` seconds, not broken down. A child's CPU counts when it is
  reaped: a server a module fixture stops counts in that module's last
  test, and a `subprocess.Popen` child never waited for counts in whichever
  later test's `subprocess` call reaps it.

The recorder wraps two private TensorFlow functions (`tracing_compilation.
trace_function`, which every `tf.function` traces through, and
`ConcreteFunction._call_flat`); where a TensorFlow version lacks them it
records tests only and says so.
It adds a few microseconds a call; times are CPU seconds, so a loaded
machine's figures still add up (wall seconds do not).
"""

import collections
import json
import os
import re
import resource
import sys
import threading
import time

import pytest

ENV = "RNNSTEP_TEST_AUDIT"


def _cpu(who) -> float:
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


class Recorder:
  """Appends this process's records to `<directory>/<pid>.jsonl`."""

  def __init__(self, directory: str):
    os.makedirs(directory, exist_ok=True)
    self._out = open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a",
                     buffering=1, encoding="utf-8")
    self.test = ""

  def write(self, **record):
    record.setdefault("test", self.test)
    self._out.write(json.dumps(record) + "\n")

  def wrap_tensorflow(self):
    """Records traces and first calls (see the module doc)."""
    try:
      from tensorflow.python.eager.polymorphic_function import (  # pylint: disable=g-import-not-at-top
          concrete_function, tracing_compilation)
      trace_function = tracing_compilation.trace_function
      concrete_class = concrete_function.ConcreteFunction
      call_flat = concrete_class._call_flat  # pylint: disable=protected-access
    except (ImportError, AttributeError) as e:
      print(f"tf_audit: tests only, TensorFlow's functions not wrapped: {e}",
            file=sys.stderr)
      return
    recorder, called = self, set()
    # Only the outermost trace or call of a thread is recorded: a function
    # traced or called inside another's trace is part of that one's time.
    depth = threading.local()

    def timed(kind, name, work):
      outer = not getattr(depth, "value", 0)
      depth.value = getattr(depth, "value", 0) + 1
      start = time.process_time()
      try:
        return work()
      finally:
        depth.value -= 1
        seconds = time.process_time() - start
        # A cached concrete function comes back in microseconds.
        if outer and (kind == "first" or seconds > 0.01):
          recorder.write(kind=kind, name=name(), s=seconds)

    def traced(args=None, kwargs=None, tracing_options=None):
      return timed("trace", lambda: getattr(tracing_options, "name", "?"),
                   lambda: trace_function(args, kwargs, tracing_options))

    def first_called(concrete, *args, **kwargs):
      if id(concrete) in called:
        return call_flat(concrete, *args, **kwargs)
      called.add(id(concrete))

      def name():
        value = concrete.name
        return value.decode() if isinstance(value, bytes) else str(value)

      return timed("first", name,
                   lambda: call_flat(concrete, *args, **kwargs))

    tracing_compilation.trace_function = traced
    concrete_class._call_flat = first_called  # pylint: disable=protected-access

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item, nextitem):
    del nextitem
    from tests.support import forkserver  # pylint: disable=g-import-not-at-top
    self.test = item.nodeid
    before = (time.perf_counter(), _cpu(resource.RUSAGE_SELF),
              _cpu(resource.RUSAGE_CHILDREN), forkserver.children_cpu())
    yield
    after = (time.perf_counter(), _cpu(resource.RUSAGE_SELF),
             _cpu(resource.RUSAGE_CHILDREN), forkserver.children_cpu())
    wall, own, executed, forked = (b - a for a, b in zip(before, after))
    self.write(kind="test", wall=wall, own=own, exec=executed, fork=forked)
    self.test = ""


def install(config):
  """Registers the recorder when `RNNSTEP_TEST_AUDIT` names a folder (from
  `tests/conftest.py`'s `pytest_configure`); the xdist controller, which
  runs no test, records nothing."""
  directory = os.environ.get(ENV)
  controller = (getattr(config, "workerinput", None) is None
                and config.getoption("numprocesses", None))
  if not directory or controller:
    return
  recorder = Recorder(directory)
  recorder.wrap_tensorflow()
  config.pluginmanager.register(recorder, "tf_audit")


def _file_of(test: str) -> str:
  return re.sub(r"::.*", "", test).removeprefix("tests/") or "(outside tests)"


def summary(directory: str, top: int = 25) -> str:
  """The recorded run, summed: per file, per kind of TensorFlow work and
  per function, CPU seconds (see the module doc)."""
  records = []
  for name in sorted(os.listdir(directory)):
    if name.endswith(".jsonl"):
      with open(os.path.join(directory, name), encoding="utf-8") as f:
        records.extend(json.loads(line) for line in f if line.strip())
  per_file = collections.defaultdict(collections.Counter)
  per_function = collections.Counter()
  counts = collections.Counter()
  for record in records:
    row = per_file[_file_of(record["test"])]
    if record["kind"] == "test":
      for key in ("wall", "own", "exec", "fork"):
        row[key] += record[key]
      row["tests"] += 1
    else:
      row[record["kind"]] += record["s"]
      name = re.sub(r"^__inference_|_\d+$", "", record["name"])
      per_function[(record["kind"], name)] += record["s"]
      counts[(record["kind"], name)] += 1
  totals = collections.Counter()
  for row in per_file.values():
    totals.update(row)
  columns = ("tests", "own", "exec", "fork", "trace", "first", "wall")
  lines = [f"{len(records)} records from {directory}; CPU seconds but "
           "tests and wall (trace and first are within own)", "",
           "| file | " + " | ".join(columns) + " |",
           "|---|" + "---|" * len(columns)]
  rows = sorted(per_file.items(), key=lambda kv: -(
      kv[1]["own"] + kv[1]["exec"] + kv[1]["fork"]))
  for name, row in [("all", totals)] + rows[:top]:
    lines.append(f"| {name} | " + " | ".join(
        f"{row[c]:.0f}" if c == "tests" else f"{row[c]:.1f}"
        for c in columns) + " |")
  lines += ["", "| kind | function | count | CPU s |", "|---|---|---|---|"]
  for (kind, name), seconds in per_function.most_common(top):
    lines.append(f"| {kind} | {name} | {counts[(kind, name)]} | "
                 f"{seconds:.1f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit("usage: python -m tests.support.tf_audit FOLDER")
  print(summary(sys.argv[1]))
