"""XLA programs compiled in the background for the library
(rnnstep/engine/compiling.py) and XLA's disk cache of programs
(rnnstep/engine/xla_cache.py)."""

import ast
import collections
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rnnstep
from rnnstep import api
from rnnstep.engine import compiling
from rnnstep.engine import cpu
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import paths
from rnnstep.engine import scoring
from rnnstep.engine import xla_cache
from rnnstep.model import model_file
from tests.support import cli
from tests.support import forkserver
from tests.support import numpy_reference as nr
from tests.support.tiers import quick_params

# These tests are about the choice jit_compile=None makes (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("unpinned_default_path")


@pytest.fixture(scope="module")
def model():
  return rnnstep.load()


@pytest.fixture
def background(model, monkeypatch):
  """The model's `Background` with a compiler of its own (the shared one
  knows what other tests compiled), recording the path of each call the
  library makes (`taken`)."""
  if paths.default_path(model, 1) != paths.XLA:
    pytest.skip("jit_compile=None does not pick XLA on this machine")
  found = compiling.background(model)
  monkeypatch.setattr(found, "compiler", compiling.Compiler())
  record_paths_taken(found, monkeypatch)
  return found


def record_paths_taken(found, monkeypatch):
  """Appends (path, function) to `found.taken` for each call the library
  makes on `found`'s target or graph generator."""
  found.taken = []
  for generator in (found.target, found.graph):
    def call(name, *args, _path=generator.path, _call=generator.call):
      if threading.current_thread() is threading.main_thread():  # Not a
        found.taken.append((_path, name))  # compile's call.
      return _call(name, *args)
    monkeypatch.setattr(generator, "call", call)


def wait_compiled(compiler, timeout=300):
  deadline = time.monotonic() + timeout
  while compiler.pending:
    assert time.monotonic() < deadline, "the compile did not finish"
    time.sleep(0.05)


def test_each_jit_compile_value_has_its_generator(model):
  """None (where it picks XLA) compiles in the background; True compiles in
  the foreground; False never compiles; a strategy's replicas run XLA as
  before."""
  if paths.default_path(model, 1) != paths.XLA:
    pytest.skip("jit_compile=None does not pick XLA on this machine")
  assert isinstance(api._generator(model, None, 1, 0), compiling.Background)
  explicit = api._generator(model, True, 1, 0)
  assert isinstance(explicit, generator_lib.Generator)
  assert explicit.path == paths.XLA
  assert api._generator(model, False, 1, 0).path == paths.GRAPH
  assert isinstance(api._generator(model, None, 1, 0, strategy=object()),
                    generator_lib.Generator)


@pytest.mark.slow  # One XLA compile (seconds).
def test_generate_runs_on_the_graph_path_until_its_program_is_compiled(
    model, background):
  prompts = ["ROMEO:", "To be, or", "a"]
  options = dict(seed=7, temperature=0.9, top_k=30)
  first = rnnstep.generate(model, prompts, 50, **options)
  assert background.taken == [("graph", "generate_fn")]
  wait_compiled(background.compiler)
  second = rnnstep.generate(model, prompts, 50, **options)
  assert background.taken[-1] == ("xla", "generate_fn")
  # The same text on each path (README "Reproducibility"), and the
  # explicit paths' text.
  assert first == second
  assert first == rnnstep.generate(model, prompts, 50, jit_compile=False,
                                   **options)
  assert first == rnnstep.generate(model, prompts, 50, jit_compile=True,
                                   **options)


@pytest.mark.slow  # Two XLA compiles.
def test_a_stream_goes_on_under_xla_once_its_programs_are_compiled(
    model, background):
  """The first chunk and the first continuation run on the graph path; once
  their programs are compiled, the next chunks (the carry from a graph
  call) run under XLA; joined, the text is `generate`'s."""
  options = dict(seed=11, temperature=0.8)
  pieces = []
  for piece in rnnstep.stream(model, "Hello", 120, chunk_size=20, **options):
    pieces.append(piece)
    wait_compiled(background.compiler)
  assert background.taken[:3] == [("graph", "generate_fn"),
                                  ("graph", "continue_fn"),
                                  ("xla", "continue_fn")]
  assert set(background.taken[2:]) == {("xla", "continue_fn")}
  assert "".join(pieces) == rnnstep.generate(model, "Hello", 120,
                                             jit_compile=False, **options)


@pytest.fixture
def elementwise(model, monkeypatch):
  """`jit_compile=None` picks the elementwise path at every batch size
  (this CPU's table forced: its own puts the elementwise band where
  another kind's may not), and the model's elementwise `Background`, with
  a compiler of its own that scoring shares, records each call's path."""
  monkeypatch.setitem(paths.FASTEST_PATHS, cpu.kind(), dict(
      paths.FASTEST_PATHS[cpu.kind()], float32=((None, paths.ELEMENTWISE),)))
  found = compiling.background(model, paths.ELEMENTWISE)
  compiler = compiling.Compiler()
  monkeypatch.setattr(found, "compiler", compiler)
  monkeypatch.setitem(compiling._COMPILERS, found.programs, compiler)
  record_paths_taken(found, monkeypatch)
  return found


def reference_greedy(model, prompt, num_steps):
  """The float64 numpy model's greedy continuation (text)."""
  reference = nr.Reference(*nr.tensors_of_file(
      model_file.read(rnnstep.bundled_model_path())))
  return model.decode(reference.greedy(model.encode(prompt), num_steps))


def test_an_elementwise_choice_compiles_in_the_background(model, elementwise):
  assert api._path(model, None, 40) == paths.ELEMENTWISE
  assert api._generator(model, None, 40, 0) is elementwise
  assert api._generator(model, "elementwise", 40, 0) is elementwise.target
  assert api._generator(model, False, 40, 0) is elementwise.graph


@pytest.mark.slow  # The elementwise path's small programs compile (seconds).
@pytest.mark.parametrize("options", [dict(temperature=0.0),
                                     dict(temperature=0.8, seed=7)])
def test_a_new_batch_runs_on_the_graph_path_while_its_programs_compile(
    model, elementwise, options):
  """Its first call runs on the graph path and queues the compile; once
  compiled, its calls run elementwise, a new prompt length at that batch
  among them (nothing new compiles: XLA's disk cache gains no program);
  each text is the explicit paths' (and greedy, the float64 model's)."""
  prompts = ["ROMEO:", "To be, or", "a"]
  first = rnnstep.generate(model, prompts, 40, **options)
  assert elementwise.taken == [("graph", "generate_fn")]
  assert elementwise.compiler.pending == 1
  assert not compiling.wait_idle(timeout=0)  # Compiling (for seconds).
  assert compiling.wait_idle(timeout=300)
  assert elementwise.compiler.pending == 0
  second = rnnstep.generate(model, prompts, 40, **options)
  assert elementwise.taken[-1] == ("elementwise", "generate_fn")
  assert first == second
  for jit_compile in (False, "elementwise"):
    assert first == rnnstep.generate(model, prompts, 40,
                                     jit_compile=jit_compile, **options)
  if not options["temperature"]:
    assert first[0] == reference_greedy(model, prompts[0], 40)
  before = xla_cache.entry_names()
  longer = ["First Citizen:\nBefore we proceed", "b", "c"]
  text = rnnstep.generate(model, longer, 40, **options)
  assert elementwise.taken[-1] == ("elementwise", "generate_fn")
  assert elementwise.compiler.pending == 0
  assert xla_cache.entry_names() == before
  assert text == rnnstep.generate(model, longer, 40, jit_compile=False,
                                  **options)


@pytest.mark.slow  # Two compiles of the elementwise path's programs.
def test_a_stream_keeps_the_path_it_started_on(model, elementwise):
  """The elementwise loop's carry has consumed its last id, the graph
  path's has not: a stream that starts on the graph path stays there, its
  programs compiled once it ends (not beside its chunks); the next stream
  of its shape runs elementwise. Joined, each is `generate`'s text."""
  options = dict(seed=11, temperature=0.8)
  prompts = ["Hello", "ROMEO:", "x"]
  pieces = []
  for piece in rnnstep.stream(model, prompts, 100, chunk_size=20, **options):
    pieces.append(piece)
    assert not elementwise.compiler.pending  # Nothing compiles beside it.
  assert elementwise.taken == ([("graph", "generate_fn")]
                               + [("graph", "continue_fn")] * 4)
  wait_compiled(elementwise.compiler)
  again = list(rnnstep.stream(model, prompts, 100, chunk_size=20, **options))
  assert elementwise.taken[5:] == ([("elementwise", "generate_fn")]
                                   + [("elementwise", "continue_fn")] * 4)
  want = rnnstep.generate(model, prompts, 100, jit_compile=False, **options)
  for chunks in (pieces, again):
    assert ["".join(row) for row in zip(*chunks)] == want


def test_a_compiler_bound_keeps_later_batches_on_the_graph_path(
    model, elementwise, monkeypatch):
  compiler = compiling.Compiler(max_programs=0)
  monkeypatch.setattr(elementwise, "compiler", compiler)
  for _ in range(2):
    rnnstep.generate(model, ["a", "b", "c", "d"], 5, temperature=0.0)
    assert compiler.pending == 0 and not compiler.compiled
  assert elementwise.taken == [("graph", "generate_fn")] * 2


def record_scoring_paths(monkeypatch):
  """The `(path, function)` of each scoring call the library makes on the
  main thread (not the compiling thread's), in order."""
  taken = []
  call = scoring.Calls.call

  def recorded(self, name, *args):
    if threading.current_thread() is threading.main_thread():
      taken.append((self.path, name))
    return call(self, name, *args)

  monkeypatch.setattr(scoring.Calls, "call", recorded)
  return taken


@pytest.mark.slow  # The elementwise path's scoring programs compile.
def test_scoring_runs_on_the_graph_path_while_its_batch_compiles(
    model, elementwise, monkeypatch):
  """Scored by batch: a batch size not compiled runs on the graph path and
  queues its compile; once compiled, elementwise, a longer text at that
  batch too, and a shared context's call the same way; every score the
  float64 model's."""
  taken = record_scoring_paths(monkeypatch)
  reference = nr.Reference(*nr.tensors_of_file(
      model_file.read(rnnstep.bundled_model_path())))
  shared = [("ROMEO: ROMEO:", " O"), ("ROMEO: ROMEO:", " a"), ("Q", "x")]
  for pairs in ([("ROMEO:", " O"), ("To be", ", or"), ("K", "ING")],
                [("ROMEO:", " O"), ("To be", ", or"), ("K", "ING")],
                [("First Citizen:", " Before we"), ("a", "bc"), ("Q", "x")],
                shared, shared):
    got = rnnstep.loglikelihood(model, pairs)
    for (context, continuation), (logprob, _) in zip(pairs, got):
      ids = model.encode(context + continuation)
      logits = reference.logits(ids[:-1])
      peak = logits.max(-1, keepdims=True)
      logsoftmax = logits - peak - np.log(
          np.exp(logits - peak).sum(-1, keepdims=True))
      positions = np.arange(len(context) - 1, len(ids) - 1)
      want = logsoftmax[positions, ids[positions + 1]].sum()
      assert abs(logprob - want) <= 1e-4, (logprob, want)
    wait_compiled(elementwise.compiler)
  # A context two rows share runs once (`scoring.PREFIX`), its one row a
  # batch of its own.
  assert taken == ([("graph", "stepped")] + [("elementwise", "stepped")] * 2
                   + [("graph", "prefix"), ("elementwise", "stepped"),
                      ("elementwise", "prefix"), ("elementwise", "stepped")])


def test_scoring_over_windows_runs_on_the_graph_path_while_xla_compiles(
    model, monkeypatch):
  """Over windows `jit_compile=None` scores under XLA (one program a padded
  shape and window): a shape not compiled runs on the graph path and queues
  its compile; once compiled, XLA; every score the float64 model's over the
  same windows."""
  monkeypatch.delenv("RNNSTEP_DEFAULT_PATH", raising=False)
  assert scoring.default_path(4) == paths.XLA
  compiler = compiling.Compiler()
  programs = generator_lib.programs_for(model, paths.XLA)
  monkeypatch.setitem(compiling._COMPILERS, programs, compiler)
  taken = record_scoring_paths(monkeypatch)
  reference = nr.Reference(*nr.tensors_of_file(
      model_file.read(rnnstep.bundled_model_path())))
  pairs = [("ROMEO: ", "O Juliet"), ("To be", ", or not")]
  for _ in range(2):
    got = rnnstep.loglikelihood(model, pairs, window=4)
    for (context, continuation), (logprob, _) in zip(pairs, got):
      ids = model.encode(context + continuation)
      want = 0.0
      for t in range(len(context) - 1, len(ids) - 1):
        logits = reference.logits(ids[max(0, t - 3):t + 1])[-1]
        peak = logits.max()
        want += logits[ids[t + 1]] - peak - np.log(
            np.exp(logits - peak).sum())
      assert abs(logprob - want) <= 1e-4, (logprob, want)
    wait_compiled(compiler)
  assert taken == [("graph", "windows"), ("xla", "windows")]


Request = collections.namedtuple("Request", "num_steps")


class FakePrograms:

  def traced(self, name):
    del name
    return True


class FakeGenerator:
  """Compiles in no time, and records what it was asked to compile."""

  def __init__(self):
    self.programs = FakePrograms()
    self.calls = []

  def call(self, name, *args):
    self.calls.append((name, args[0].num_steps))


def test_a_compiler_compiles_at_most_its_bound_of_programs():
  compiler = compiling.Compiler(max_programs=2)
  generator = FakeGenerator()
  assert compiler.want("a", generator, (Request(50),), name="generate_fn")
  assert compiler.want("b", generator, (Request(50),), name="generate_fn")
  wait_compiled(compiler)
  # A third shape stays on the graph path; the compiled ones are ready.
  assert not compiler.want("c", generator, (Request(50),), name="generate_fn")
  assert compiler.ready("a") and compiler.ready("b")
  assert not compiler.ready("c") and compiler.pending == 0
  assert generator.calls == [("generate_fn", 1)] * 2  # One step each.
  assert compiling.MAX_PROGRAMS == 64


def test_a_shape_queued_by_a_model_since_freed_is_not_marked_failed():
  # A freed model's queued shape is dropped, not failed: a failure would keep
  # every later model of the architecture on the graph path for that shape.
  compiler = compiling.Compiler()
  freed = FakeGenerator()
  freed.model = None  # What a generator's weak reference gives once freed.
  assert compiler.want("a", freed, (Request(50),), name="generate_fn")
  wait_compiled(compiler)
  assert not compiler.failed("a") and not compiler.ready("a")
  assert freed.calls == []
  alive = FakeGenerator()
  assert compiler.want("a", alive, (Request(50),), name="generate_fn")
  wait_compiled(compiler)
  assert compiler.ready("a") and alive.calls == [("generate_fn", 1)]


def fresh_process_env(cache_dir):
  """The environment of a process with its own rnnstep cache folder and no
  XLA cache folder of its own (tests/conftest.py sets one for the suite)."""
  env = dict(cli.ENV, RNNSTEP_CACHE_DIR=str(cache_dir),
             PYTHONPATH=os.pathsep.join(filter(None, (
                 str(cli.REPO), os.environ.get("PYTHONPATH")))))
  flags = [flag for flag in env.get("TF_XLA_FLAGS", "").split()
           if not flag.startswith(xla_cache.FLAG)]
  env["TF_XLA_FLAGS"] = " ".join(flags)
  return env


def entries(cache_dir):
  found = {}
  for folder, _, names in os.walk(os.path.join(cache_dir, xla_cache.SUBDIR)):
    for name in names:
      if name.endswith(".pb"):
        st = os.stat(os.path.join(folder, name))
        found[name] = (st.st_size, st.st_mtime_ns)
  return found


EXIT_WHILE_COMPILING = """
import atexit, sys
import rnnstep
from rnnstep.engine import compiling
model = rnnstep.load()
rnnstep.generate(model, "ROMEO:", 70, seed=1, jit_compile=False)  # Traced.
atexit.register(lambda: print("the script's exit handler ran", flush=True))
rnnstep.generate(model, "ROMEO:", 70, seed=1)  # Its program compiles now.
print("compiling", compiling.background(model).compiler.pending, flush=True)
sys.stdout.write("the last line, not flushed\\n")
"""


# The same where the elementwise path is picked (this CPU's table forced,
# as the `elementwise` fixture does), its small programs compiling.
EXIT_WHILE_COMPILING_ELEMENTWISE = """
from rnnstep.engine import cpu, paths
paths.FASTEST_PATHS[cpu.kind()] = dict(
    paths.FASTEST_PATHS[cpu.kind()], float32=((None, paths.ELEMENTWISE),))
""" + EXIT_WHILE_COMPILING.replace(
    "compiling.background(model)",
    "compiling.background(model, paths.ELEMENTWISE)")


# The graph path's background compile by default; the elementwise path's
# small programs in the exhaustive tier (one fresh process each).
@pytest.mark.slow  # A process importing TensorFlow.
@pytest.mark.parametrize("script", quick_params(
    [EXIT_WHILE_COMPILING, EXIT_WHILE_COMPILING_ELEMENTWISE],
    EXIT_WHILE_COMPILING))
def test_a_process_that_exits_while_a_program_compiles_exits_at_once(
    tmp_path, script):
  """Exit status 0, no abort, the script's exit handlers and output kept,
  and the compile is not waited for (it wrote no program to the cache)."""
  result = subprocess.run(
      [sys.executable, "-c", script], capture_output=True,
      text=True, env=fresh_process_env(tmp_path), timeout=cli.TIMEOUT,
      check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines() == [
      "compiling 1", "the last line, not flushed",
      "the script's exit handler ran"]
  assert "terminate" not in result.stderr and "FATAL" not in result.stderr
  assert not entries(tmp_path)


COMPILE_AND_USE = """
import time
import rnnstep
from rnnstep.engine import compiling
model = rnnstep.load()
for _ in range(2):  # The graph path while compiling, then XLA.
  text = rnnstep.generate(model, ["ROMEO:", "a"], 40, seed=3)
  compiler = compiling.background(model).compiler
  while compiler.pending:
    time.sleep(0.05)
print(text)
"""


# Scoring's XLA program (its own function, traced as generation's are).
SCORE = """
rnnstep.loglikelihood(model, [("ROMEO:", " a")], jit_compile=True)
"""


# Work that traces other functions first: TensorFlow numbers every traced
# function's names by one counter, which `generator.stable_names` sets aside.
TRACE_OTHERS_FIRST = """
import rnnstep
import tensorflow as tf
rnnstep.generate(rnnstep.load(), "ab", 5, seed=1, jit_compile=False)
tf.function(lambda x: x + 1)(tf.constant(1))
"""


@pytest.mark.slow  # Two processes importing TensorFlow, one XLA compile.
def test_a_second_process_loads_the_programs_the_first_one_compiled(tmp_path):
  """Even when it traced other functions before (in another order)."""
  env = fresh_process_env(tmp_path)
  # Forked (tests/support/forkserver.py): their own TF_XLA_FLAGS are read
  # at XLA's first use; what matters is that each is another process.
  run = lambda script: forkserver.run(
      [sys.executable, "-c", script], capture_output=True, text=True,
      env=env, timeout=cli.TIMEOUT, check=True).stdout
  text = run(COMPILE_AND_USE + SCORE)
  compiled = entries(tmp_path)
  assert compiled  # One file a program, written by TensorFlow.
  assert run(TRACE_OTHERS_FIRST + COMPILE_AND_USE + SCORE) == text
  # rnnstep-generate, which would not compile XLA for 40 steps, runs the
  # program on disk (TensorFlow's log says it loaded it), with its text.
  result = subprocess.run(
      [sys.executable, "-m", "rnnstep.cli.generate", "--prompt=ROMEO:",
       "--prompt=a", "--num_steps=40", "--seed=3", "--nocache", "--verbose"],
      capture_output=True, text=True, timeout=cli.TIMEOUT, check=True,
      env=dict(env, RNNSTEP_DEBUG="1", TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="device_executable_persistor=1"))
  assert "Loading cached entry for: __inference__generate_impl" in (
      result.stderr), result.stderr[-3000:]
  assert "XLA where its disk cache holds the program" in result.stderr
  for prompt, generated in zip(["ROMEO:", "a"], ast.literal_eval(text)):
    assert f"{prompt}{generated}\n" in result.stdout
  # Nothing compiled again: no new program, none written again.
  assert entries(tmp_path) == compiled
  folder = os.path.join(tmp_path, xla_cache.SUBDIR)
  for path in [folder] + [os.path.join(folder, d) for d in os.listdir(folder)]:
    assert os.stat(path).st_mode & 0o777 == 0o700


def entry_bytes(*fields):
  """An `XlaSerializedCacheEntry`'s wire format: each field length-delimited."""
  out = b""
  for number, value in fields:
    out += bytes([number << 3 | 2, len(value)]) + value
  return out


def test_pruning_keeps_only_whole_entries_of_ours_under_the_cap(tmp_path):
  def entry(name, data, mode=0o644, age=0):
    path = tmp_path / f"xla_compile_cache__{name}__1__XLA_CPU_JIT.pb"
    path.write_bytes(data)
    path.chmod(mode)
    then = time.time() - age
    os.utime(path, (then, then))
    return path.name

  whole = entry_bytes((1, b"key"), (2, b"hlo"), (3, b"machine code"))
  kept = entry("1", whole, age=10)
  entry("2", whole, age=1000)  # The least recently used: over the cap.
  entry("3", whole[:-3])  # Truncated.
  entry("4", entry_bytes((1, b"key"), (2, b"hlo")))  # No machine code.
  entry("5", whole, mode=0o666)  # Writable by others.
  (tmp_path / "planted.so").write_bytes(b"\x7fELF")
  xla_cache.prune(str(tmp_path), cap=2 * len(whole) - 1)
  assert sorted(os.listdir(tmp_path)) == sorted([kept, xla_cache.CHECKED_FILE])
  # Checked once: a file known by its size and time is not read again.
  xla_cache.prune(str(tmp_path), cap=1 << 20)
  assert sorted(os.listdir(tmp_path)) == sorted([kept, xla_cache.CHECKED_FILE])


def test_pruning_counts_the_folders_other_versions_left(tmp_path):
  """Another rnnstep, TensorFlow or CPU keys a folder of its own beside
  this one, which no process of this version reads: its entries count
  toward the cap, least recently used first, and a folder emptied goes;
  one another user could write is left alone."""
  xla = tmp_path / xla_cache.SUBDIR
  whole = entry_bytes((1, b"key"), (2, b"hlo"), (3, b"machine code"))

  def entry(key, name, age):
    (xla / key).mkdir(mode=0o700, parents=True, exist_ok=True)
    path = xla / key / f"xla_compile_cache__{name}__1__XLA_CPU_JIT.pb"
    path.write_bytes(whole)
    then = time.time() - age
    os.utime(path, (then, then))
    return path

  ours = entry("a" * 20, "1", age=10)
  recent = entry("b" * 20, "2", age=100)  # Another version's, kept.
  old = entry("b" * 20, "3", age=1000)
  older = entry("c" * 20, "4", age=2000)  # Its folder's only entry.
  (xla / ("c" * 20) / xla_cache.INDEX_FILE).write_text("{}")
  shared = entry("d" * 20, "5", age=3000)
  (xla / ("d" * 20)).chmod(0o777)
  fresh = entry("e" * 20, "6", age=4000)  # Its folder just made: it stays.
  then = time.time() - 2 * xla_cache._IDLE_FOLDER_SECONDS
  for key in "abcd":
    os.utime(xla / (key * 20), (then, then))
  xla_cache.prune(str(xla / ("a" * 20)), cap=2 * len(whole))
  assert ours.exists() and recent.exists() and shared.exists()
  assert not old.exists() and not older.exists() and not fresh.exists()
  assert not (xla / ("c" * 20)).exists() and (xla / ("e" * 20)).exists()
  # Not under a cache's `xla` folder: its siblings are not another key's.
  (tmp_path / ("0" * 20)).mkdir()
  stray = tmp_path / ("0" * 20) / ours.name
  stray.write_bytes(whole)
  (tmp_path / ("f" * 20)).mkdir()
  xla_cache.prune(str(tmp_path / ("f" * 20)), cap=0)
  assert stray.exists()


def test_a_cache_folder_writable_by_others_is_not_used(tmp_path, monkeypatch):
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(tmp_path / "cache"))
  (tmp_path / "cache").mkdir()
  (tmp_path / "cache").chmod(0o777)
  with pytest.raises(ValueError, match="not trusted"):
    xla_cache._trusted_folder()
  (tmp_path / "cache").chmod(0o700)
  folder = xla_cache._trusted_folder()
  assert folder.startswith(str(tmp_path / "cache" / xla_cache.SUBDIR))
  assert os.stat(folder).st_mode & 0o777 == 0o700


@pytest.mark.slow  # A process importing TensorFlow.
def test_a_process_exiting_while_a_program_compiles_keeps_its_status(tmp_path):
  script = EXIT_WHILE_COMPILING + "sys.exit(3)\n"
  result = subprocess.run(
      [sys.executable, "-c", script], capture_output=True, text=True,
      env=fresh_process_env(tmp_path), timeout=cli.TIMEOUT, check=False)
  assert result.returncode == 3, result.stderr[-2000:]
  assert "compiling 1" in result.stdout.splitlines()
  assert not entries(tmp_path)


def test_stable_names_number_a_trace_from_a_base_of_its_own():
  """The same trace gets the same names in any process; the same base asked
  for twice in one process keeps TensorFlow's numbers (no clash)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def trace():
    function = tf.function(lambda n: tf.while_loop(
        lambda i: i < n, lambda i: i + 1, [tf.constant(0)]))
    return function.get_concrete_function(tf.TensorSpec([], tf.int32))

  with generator_lib.stable_names("a test's trace"):
    first = trace()
  base = int(first.name.decode().rsplit("_", 1)[1])
  assert base >= generator_lib._NAME_BASE
  with generator_lib.stable_names("a test's trace"):
    again = trace()
  assert int(again.name.decode().rsplit("_", 1)[1]) < generator_lib._NAME_BASE
  assert int(trace().name.decode().rsplit("_", 1)[1]) < generator_lib._NAME_BASE
  assert first(tf.constant(3))[0].numpy() == again(tf.constant(3))[0].numpy()


def test_the_program_index_is_read_as_the_entries_are_trusted(
    tmp_path, monkeypatch):
  """`programs.json` names TensorFlow's entries of a program: written whole
  and owner-only, read only when ours, not writable by others, bounded and
  well formed, a key found only while its files are there (pruned with
  them)."""
  whole = entry_bytes((1, b"key"), (2, b"hlo"), (3, b"machine code"))
  name = "xla_compile_cache__1__2__XLA_CPU_JIT.pb"
  (tmp_path / name).write_bytes(whole)
  monkeypatch.setattr(xla_cache, "_enabled", [str(tmp_path)])
  assert xla_cache.entry_names() == {name}
  xla_cache.record_program("abc123", [name])
  index = tmp_path / xla_cache.INDEX_FILE
  assert index.stat().st_mode & 0o777 == 0o600
  assert xla_cache.has_program("abc123") and xla_cache.has_programs("abc")
  assert not xla_cache.has_program("abc") and not xla_cache.has_programs("x")
  good = index.read_bytes()
  for hostile in (b"[1, 2]", b"{", b'{"k": ["../../etc/passwd"]}',
                  b'{"k": "' + b"x" * xla_cache.MAX_INDEX_BYTES + b'"}'):
    index.write_bytes(hostile)
    assert xla_cache._read_index(str(tmp_path)) == {}
  index.write_bytes(good)
  index.chmod(0o666)  # Writable by others: not read.
  assert not xla_cache.has_program("abc123")
  index.chmod(0o600)
  assert xla_cache.has_program("abc123")
  (tmp_path / name).unlink()  # Its program pruned: the key is not there.
  assert not xla_cache.has_program("abc123")
  xla_cache.prune(str(tmp_path))
  assert xla_cache._read_index(str(tmp_path)) == {}
