"""The cut inside a sweep: which cases of a parameterized test run by default
(tests/conftest.py applies it).

The suite has three tiers: the quick tier (`-m "not slow"`), the default run
(README, CI: everything but `exhaustive`) and the exhaustive tier
(`-m exhaustive`). A sweep over paths, stacks, dtypes or cases keeps the cases
it names in the default run (quick, unless the test is marked slow) and makes
its other cases exhaustive.

For pytest's own parametrize, `quick_params` makes the cases it does not name
`pytest.param(..., marks=pytest.mark.exhaustive)`. absl's parameterized cases
cannot carry marks, so the decorator `quick_cases` names the cases that stay,
and conftest marks the test's other cases exhaustive.
"""

import dataclasses

import pytest


@dataclasses.dataclass(frozen=True)
class QuickCases:
  name: str  # The test method's own name, before absl adds the case's.
  cases: frozenset


def quick_cases(*cases):
  """Under an absl parameterized decorator: the cases named (a named case by
  its name, another by its index) stay in the default run; the others are
  exhaustive."""
  def decorate(test):
    test.quick_cases = QuickCases(test.__name__, frozenset(map(str, cases)))
    return test
  return decorate


def is_exhaustive_case(item):
  """Whether `item` is a case that its test's `quick_cases` leaves out."""
  quick = getattr(getattr(item, "obj", None), "quick_cases", None)
  if not isinstance(quick, QuickCases) or not item.name.startswith(quick.name):
    return False
  return item.name[len(quick.name):].lstrip("_") not in quick.cases


def quick_params(values, *quick):
  """`pytest.mark.parametrize` values in which only those in `quick` stay in
  the default run: the others come as `pytest.param(..., marks=exhaustive)`
  (a tuple value is one case of several arguments)."""
  return [value if value in quick else
          pytest.param(*(value if isinstance(value, tuple) else (value,)),
                       marks=pytest.mark.exhaustive)
          for value in values]


# The test files that take longest, longest first (seconds per file or
# family, the mean of two `--durations=0` runs of the 2-worker default run on
# a 2-core EPYC Zen 4, 2026-12-06: only their order matters):
# tests/conftest.py queues them first and the rest after, in their own
# order. With `--dist loadgroup` each file (or family, below) runs whole on
# one worker, and xdist's default queue (files with the most tests first)
# left long files of few tests for last, so one worker idled while the other
# finished them. Longest first keeps the run's tail short. A file not named
# here only runs later; keep the list roughly current (`--durations=0`,
# summed per file).
#
# Before them, the files whose tests fork the test process itself, for each
# file they convert (rnnstep/convert/isolation.py's reader child): a fork
# copies the process's page tables and its children's pages on write, so
# its cost grows with the worker's memory, which the traced programs of
# every file before grow to gigabytes. Run first, these four files' tests
# took 46 s of the default run on a Zen 5, against 84-92 s among the others
# (tests/test_convert_errors.py alone: 8 s in a fresh process, 33 s in one
# holding 4 GB).
FORKS_FIRST = (
    "test_convert_errors.py",   # 68 reader children
    "test_convert_torch.py",    # 33
    "test_convert.py",          # 27 (its tests: 30-40 s in all)
    "test_convert_recipes.py",  # 16
)
LONGEST_FIRST = FORKS_FIRST + (
    "test_generator.py",        # 97 with test_saved_model (its family)
    "test_tokens.py",           # 96 with test_scoring
    "test_rwkv7.py",            # 87 (a LiteRT conversion, XLA compiles)
    "test_api.py",              # 63 with the rest of the tiny family
    "test_compiling.py",        # 42 (fresh processes that compile)
    "test_serve_prefix_cache.py",  # 36
    "test_fast_path.py",        # 36
    "test_sampling.py",         # 35 with test_constraints
    "test_window.py",           # 28
    "test_cli_generate.py",     # 26
    "test_weights_dtype.py",    # 25
    "test_recompute.py",        # 23
    "test_cache_trust.py",      # 23 (background exports)
    "test_serve_chat.py",       # 21
    "test_litert.py",           # 20
    "test_jobs.py",             # 18
    "test_litert_options.py",   # 18 (three LiteRT conversions)
    "test_serve.py",            # 18
    "test_serve_network.py",    # 15
    # (Seconds on a Zen 5, 2026-12-07.) Left to the unlisted files' order,
    # these ended the run, one worker idling while the other finished them.
    "test_litert_int8.py",      # 10 (an RWKV-7 LiteRT export)
    "test_web_export.py",       # 10 (Chromium)
    "test_state_file.py",       # 9
    "test_keras_free.py",       # 9 (a fresh interpreter)
    "test_cli_export.py",       # 7
)


# Test files whose models share one architecture, so that on one process the
# second file runs the programs the first traced and compiled (programs are
# shared per architecture: rnnstep/model/network.py's `shared_function`; a
# tiny model's first call costs 3-8 CPU-s a path). Each family runs on one
# xdist worker (setup.cfg's `--dist loadgroup`; tests/conftest.py gives every
# test its file's group); any other file is a group of its own.
FAMILIES = {
    # reference_models.large_projection_model(): its XLA programs at batch 1
    # (a 16,384-wide projection) compiled once for the library's calls.
    "large_projection": ("test_generator.py", "test_saved_model.py"),
    # reference_models.sampling_model(): graph, XLA and its XLA buckets.
    "sampling_model": ("test_sampling.py", "test_constraints.py"),
    # cli.write_model's architecture (GRU 32 over 65 characters, D=16):
    # reference_models.TINY_LAYERS in process, the file in the others.
    "tiny": ("test_pipelines.py", "test_serve_scheduler.py", "test_api.py",
             "test_tuning.py"),
    # token_models.CONFIG over 256 tokens (words, bytes, BPE).
    "token_models": ("test_tokens.py", "test_scoring.py"),
}
_FAMILY_OF = {name: family for family, names in FAMILIES.items()
              for name in names}


def _file_name(item):
  return item.path.name if hasattr(item, "path") else ""


def group_of(item) -> str:
  """The xdist group of a collected test: its file's family, or its file."""
  name = _file_name(item)
  return _FAMILY_OF.get(name, name)


def longest_first(items):
  """`items` (pytest's collected tests) with the files of `LONGEST_FIRST`
  first, in its order, each family's files together at the place of its
  first; each file's tests and the other files keep their order."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  for names in FAMILIES.values():
    first = min(rank.get(name, len(LONGEST_FIRST)) for name in names)
    for order, name in enumerate(names):
      rank[name] = first + (order + 1) / (len(names) + 1)
  def key(item):
    return rank.get(_file_name(item), len(LONGEST_FIRST))
  return sorted(items, key=key)


# The quick tier's rule, enforced: a test that starts another process is
# `slow` (a fresh interpreter costs seconds of TensorFlow's import; a forked
# one its trace and compile), unless its children import no TensorFlow
# (`light_process`). `tests/conftest.py` sets `current_test` around each
# test and installs the guard on `subprocess.Popen` and the fork server.
current_test = None


class ProcessInQuickTest(AssertionError):
  """A test outside `slow` started a process."""


def check_process_allowed(args) -> None:
  """Raises `ProcessInQuickTest` when the running test (on the main thread:
  a process a background thread starts is nobody's test) is neither `slow`
  nor `light_process`."""
  import threading  # pylint: disable=g-import-not-at-top
  item = current_test
  if (item is None or threading.current_thread() is not threading.main_thread()
      or item.get_closest_marker("slow")
      or item.get_closest_marker("light_process")):
    return
  raise ProcessInQuickTest(
      f"{item.nodeid} started a process ({str(args)[:120]}) but is not "
      "marked slow: mark it @pytest.mark.slow (the quick tier starts no "
      "process: docs/dev/testing.md), or @pytest.mark.light_process if its "
      "children import no TensorFlow")


def guard_processes() -> None:
  """Wraps `subprocess.Popen` and the fork server's `run`/`popen` with
  `check_process_allowed` (once per process)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from tests.support import forkserver  # pylint: disable=g-import-not-at-top
  if getattr(subprocess.Popen, "_quick_tier_guard", False):
    return
  popen_init = subprocess.Popen.__init__

  def guarded_init(self, args, *rest, **kwargs):
    check_process_allowed(args)
    popen_init(self, args, *rest, **kwargs)
  subprocess.Popen.__init__ = guarded_init
  subprocess.Popen._quick_tier_guard = True  # pylint: disable=protected-access
  for name in ("run", "popen"):
    start = getattr(forkserver, name)

    def guarded(args, *rest, _start=start, **kwargs):
      check_process_allowed(args)
      return _start(args, *rest, **kwargs)
    setattr(forkserver, name, guarded)
