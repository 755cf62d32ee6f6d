"""Shared test set-up: quiet TF logs, Keras on the TensorFlow backend."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# XLA's persistent compilation cache, one directory for the whole run: the
# first process (pytest's controller) makes it, and the xdist workers and
# every subprocess a test starts inherit it through the environment, so a
# program one process compiled is loaded, not compiled again, by the others.
# Set before anything imports TensorFlow, which reads TF_XLA_FLAGS once. Only
# the process that made the directory removes it. (A fresh directory per run:
# TF 2.21 fails the call on a corrupted entry, so none is kept between runs.)
_XLA_CACHE_ENV = "RNNSTEP_TEST_XLA_CACHE"
if _XLA_CACHE_ENV not in os.environ:
  import atexit as _atexit  # pylint: disable=g-import-not-at-top
  import shutil as _shutil  # pylint: disable=g-import-not-at-top
  import tempfile as _tempfile  # pylint: disable=g-import-not-at-top
  os.environ[_XLA_CACHE_ENV] = _tempfile.mkdtemp(prefix="rnnstep_test_xla_")
  _atexit.register(_shutil.rmtree, os.environ[_XLA_CACHE_ENV], True)
  os.environ["TF_XLA_FLAGS"] = " ".join(filter(None, (
      os.environ.get("TF_XLA_FLAGS"),
      "--tf_xla_persistent_cache_directory=" + os.environ[_XLA_CACHE_ENV])))

from absl import flags  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

from tests.support import tf_audit  # pylint: disable=g-import-not-at-top
from tests.support import tiers  # pylint: disable=g-import-not-at-top

# absl's TestCase helpers (create_tempdir) read flags; pytest does not parse them.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()

# Tests never read or write the user's tuning cache (rnnstep/tuning.py): a
# winner measured on this machine would change which path jit_compile=None
# takes. Subprocesses inherit this.
import atexit  # pylint: disable=g-import-not-at-top,g-bad-import-order
import gc  # pylint: disable=g-import-not-at-top,g-bad-import-order
import platform  # pylint: disable=g-import-not-at-top,g-bad-import-order
import shutil  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order

os.environ["RNNSTEP_CACHE_DIR"] = tempfile.mkdtemp(prefix="rnnstep_test_cache_")
atexit.register(shutil.rmtree, os.environ["RNNSTEP_CACHE_DIR"], True)
# Calls that leave the path to rnnstep (`jit_compile=None`, a server's
# default --jit_compile) take the graph path (rnnstep/engine/paths.py's
# `pinned_path`), so that which XLA programs the suite compiles, in the
# foreground or the background, does not depend on the CPU's kind: the
# tests of each path name it, and the tests of the automatic choice unpin it
# (the `unpinned_default_path` fixture). `RNNSTEP_DEFAULT_PATH= python -m
# pytest` runs the suite with the choice this machine makes.
os.environ.setdefault("RNNSTEP_DEFAULT_PATH", "graph")
# Nor does a CLI run start a background export for the compiled-artifact
# cache (rnnstep/litert/cache.py): tests/test_fast_path.py turns it on
# for its own runs.
os.environ["RNNSTEP_COMPILED_CACHE"] = "off"


@pytest.fixture
def unpinned_default_path(monkeypatch):
  """`jit_compile=None` as users get it: the tuning cache's and the tables'
  choice for this machine, not the suite's pinned graph path (for this
  process and the subprocesses `tests.support.cli` starts)."""
  monkeypatch.delenv("RNNSTEP_DEFAULT_PATH", raising=False)
  from tests.support import cli  # pylint: disable=g-import-not-at-top
  monkeypatch.delitem(cli.ENV, "RNNSTEP_DEFAULT_PATH", raising=False)


def pytest_configure(config):
  """One garbage collection, not five, when a process's session ends:
  pytest's unraisable-exception check collects five times over the whole
  heap, which in a worker holding TensorFlow's graphs took seconds of the
  run's last minute (as pytester sets it for its in-process runs). And the
  CPU recorder, where asked for."""
  try:
    from _pytest import unraisableexception  # pylint: disable=g-import-not-at-top
    config.stash[unraisableexception.gc_collect_iterations_key] = 1
  except (ImportError, AttributeError):  # Another pytest: its default.
    pass
  # `RNNSTEP_TEST_AUDIT=DIR`: where the run's CPU goes (tests/support/tf_audit.py).
  tf_audit.install(config)


def pytest_sessionfinish(session, exitstatus):
  """A background XLA compile still running when pytest exits ends the
  process by os._exit (rnnstep/engine/compiling.py), which does not see the
  status `python -m pytest` raises: it is told."""
  del session
  compiling = sys.modules.get("rnnstep.engine.compiling")
  if compiling is not None:
    compiling.set_exit_status(int(exitstatus))


def pytest_sessionstart(session):
  """The quick tier's rule: a test that starts a process is `slow`
  (`tiers.guard_processes`)."""
  del session
  # `platform.processor()` runs `uname -p` once a process and keeps the
  # answer; h5py's import asks for it. Asked here, before the guard, it is
  # nobody's test's process (else the first quick test importing h5py in a
  # worker would fail the guard, depending on the order of the files).
  platform.processor()
  tiers.guard_processes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Which test is running, for `tiers.check_process_allowed`."""
  del nextitem
  tiers.current_test = item
  try:
    yield
  finally:
    tiers.current_test = None


# A background XLA compile (rnnstep/engine/compiling.py) that a test's call
# left running would go on into the next tests of its worker, beside their
# own work and past the fixtures it uses: a compile once outlived its test's
# temporary state and crashed a later one's process. Each test's body and
# teardown end when this process's compiles have (the CPU is spent either
# way); one still running after 10 minutes fails the test.
_COMPILE_WAIT_SECONDS = 600


def _wait_for_background_compiles(outcome, phase):
  compiling = sys.modules.get("rnnstep.engine.compiling")
  if compiling is not None and not compiling.wait_idle(_COMPILE_WAIT_SECONDS):
    outcome.force_exception(AssertionError(
        f"a background XLA compile was still running {_COMPILE_WAIT_SECONDS}"
        f" s after the test's {phase}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  del item
  outcome = yield
  _wait_for_background_compiles(outcome, "body")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
  outcome = yield
  _wait_for_background_compiles(outcome, "teardown")
  if nextitem is None or nextitem.path != item.path:
    _freeze_what_outlives_the_file()


def _freeze_what_outlives_the_file():
  """Collects a finished file's garbage, then moves what outlives it (the
  imports, the programs shared per architecture, caches) to the garbage
  collector's permanent generation: Python's full collections scan every
  object not frozen, and a worker holding every file's traced programs
  holds millions, so its full collections took 25 of the default run's
  CPU-seconds (0.4 s each). What dies later is still freed by its reference
  count; only a cycle among frozen objects would stay."""
  gc.collect()
  gc.freeze()


# First: `-m` selects on the markers added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Marks slow every `exhaustive` test and every case that `quick_cases`
  leaves out, and drops `tf.test.TestCase.test_session`, a deprecated stub
  that every tf.test.TestCase subclass inherits and that only ever skips: it added one
  meaningless skip per class (19) to the count, hiding the skips that matter.
  It is not a test of ours, so it is dropped silently (not "deselected").
  Then it queues the longest files first (`tiers.longest_first`) and gives
  each test its file's xdist group (`tiers.group_of`)."""
  del config

  def is_stub(item):
    method = getattr(getattr(item, "cls", None), "test_session", None)
    return (item.name == "test_session" and method is not None
            and method.__qualname__ == "TensorFlowTestCase.test_session")

  items[:] = tiers.longest_first(
      [item for item in items if not is_stub(item)])
  # The cases of a sweep that `tiers.quick_cases` leaves out are exhaustive
  # (the default run leaves them out: setup.cfg), and an exhaustive test is
  # slow: `-m "not slow"` (the quick tier) skips it too.
  for item in items:
    # One worker per file, or per family of files that share their models'
    # programs (`tiers.FAMILIES`; setup.cfg's `--dist loadgroup`).
    item.add_marker(pytest.mark.xdist_group(tiers.group_of(item)))
    if tiers.is_exhaustive_case(item):
      item.add_marker(pytest.mark.exhaustive)
    if item.get_closest_marker("exhaustive"):
      item.add_marker(pytest.mark.slow)
