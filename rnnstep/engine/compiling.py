"""XLA programs compiled on a thread of their own while the graph path runs.

Under XLA (`paths.XLA`) each compiled function (`Programs.generate_fn`,
`continue_fn`, `window_fn`, `beam_fn`, the serving engine's `serve_fn`) is
compiled once per shape: per batch bucket, prompt width, output capacity
and table size (`request.build`). The bundled model's program takes 3-8 CPU
seconds to compile, RWKV-7's at the 0.1B shape about a minute; the same
function traced for the graph path (no XLA) is one trace for every shape.
The elementwise path (`paths.ELEMENTWISE`) is a TF graph whose small XLA
programs (each cell's gate math, the decode loop's choose-and-consume
call) compile per exact batch size, stop table and tail
(`Programs.compile_key`): 0.5-1.5 s for the bundled model's (the first
shape also traces the path).

So no call waits on a compile it can avoid: a call whose programs are not
compiled yet runs the graph path's function with the same arguments (the
very same request and carry), while a `Compiler` compiles that shape's
programs on its own thread; once they are compiled, calls of that shape run
on the target path. The graph and XLA programs are one Python function
traced twice, take the same arguments and give the same carry (both prime
all but a row's last id): a generation may run one chunk on the graph path
and the next under XLA, and its text is the same either way (README
"Reproducibility": the paths agree to float32 rounding). The elementwise
path's carry has consumed its last id: a generation keeps the path it
started on (`Background`).

Three users:
  - the server's chunk calls (`rnnstep/serve/calls.py`) ask for
    `serve_fn`'s shapes, a call's first, then its warm-up's;
  - the library (`rnnstep.generate`, `rnnstep.stream` with
    `jit_compile=None` where that picks XLA or the elementwise path) calls
    through `Background`;
  - scoring (`rnnstep.loglikelihood`, `loglikelihood_rolling` with
    `jit_compile=None` on a CPU: the elementwise path) calls per batch
    through `graph_while_compiling` (`scoring._caller`).

One `Compiler` per XLA or elementwise `Programs` (`for_programs`; scoring's
elementwise programs share the generation's): the programs, and so what
has been compiled, are shared by every model of the architecture. A
`Compiler` compiles at most `MAX_PROGRAMS` shapes; later shapes stay on the
graph path, which bounds the memory the compiled programs hold (the bundled
model's program is about 1 MB of machine code; a process's XLA programs are
never freed).

A process that exits while a program compiles would abort inside XLA
(measured: SIGABRT, "exception not rethrown", or a wait for the compile;
so does one whose exit handlers hand exit()'s status to `_exit` through
glibc's `on_exit`, since the compiling and tracing threads wake inside the
interpreter's finalization): `_exit_while_compiling`, registered with
`atexit` when the first compile starts, runs the other exit handlers,
flushes the output and leaves at once with `os._exit`. An exit handler
cannot read the process's status, so `sys.exit` is wrapped from then on to
remember it: the status is `sys.exit`'s, 1 after an uncaught exception, 0
otherwise (a `raise SystemExit(n)` is not seen: 0, or the status of an
earlier `sys.exit` whose exception was caught).
"""

import atexit
import collections
import os
import sys
import threading
import time
import weakref
from typing import Optional

from absl import logging
import numpy as np

from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import xla_cache

# The most programs one `Compiler` compiles (a server's warm-up asks for 14:
# 7 batch buckets x 2 prompt widths).
MAX_PROGRAMS = 64


# What XLA compiles a call's program for (the server's calls use it too).
shape_key = generator_lib.shape_key


class Compiler:
  """Shapes of one XLA or elementwise `Programs` compiled, and a thread
  compiling more.

  `ready(key)` says whether a shape's program is compiled; `want(...)`
  queues a shape with arguments to compile it with (a call of those
  shapes: it is run once, for one step, on the compiling thread). The thread
  starts when there is work and ends when there is none.
  """

  def __init__(self, max_programs: int = MAX_PROGRAMS):
    self._lock = threading.Lock()
    self._ready = set()
    self._failed = set()
    self._max_programs = max_programs
    # key -> (generator, name, args, owner), in the order they compile.
    self._queue = collections.OrderedDict()
    self._compiling = None  # The key being compiled now.
    self._thread = None

  def ready(self, key) -> bool:
    """Whether the program of `key` (`shape_key`) is compiled."""
    return key in self._ready  # A set's lookup: safe on any thread.

  def failed(self, key) -> bool:
    """Whether compiling `key` failed (its calls stay on the graph path)."""
    return key in self._failed

  @property
  def pending(self) -> int:
    """Programs queued or being compiled."""
    with self._lock:
      return len(self._queue) + (self._compiling is not None)

  @property
  def compiled(self) -> int:
    """Programs compiled (or failed) so far."""
    return len(self._ready) + len(self._failed)

  def want(self, key, generator, args, *, first: bool = False,
           owner=None, name: str = "serve_fn") -> bool:
    """Queues `key`'s program, to compile by calling `generator`'s function
    `name` with `args` (a generation's for one step; the arrays are not
    changed).

    Args:
      key: `Programs.compile_key(name, args)` (scoring's: its own).
      generator: the XLA or elementwise `Generator` whose function to
        compile (or anything with such a `call`: `scoring.Calls`).
      args: the function's arguments but the weights.
      first: ahead of the shapes queued before (a call asked for it).
      owner: what queued it (`forget` drops its shapes).
      name: the compiled function.

    Returns:
      Whether the program is compiled, queued or compiling; False when this
      compiler has reached `MAX_PROGRAMS` (the shape stays on the graph
      path).
    """
    with self._lock:
      if (key in self._ready or key in self._failed
          or key == self._compiling):
        return True
      if key not in self._queue:
        if (len(self._ready) + len(self._failed) + len(self._queue)
            + (self._compiling is not None)) >= self._max_programs:
          return False
        request = args[0]
        if hasattr(request, "num_steps"):  # A generation's request.
          # One step is all a compile needs (the steps are not a constant).
          args = (request._replace(num_steps=np.int32(1)),) + tuple(args[1:])
        self._queue[key] = (generator, name, args, owner)
      if first:
        self._queue.move_to_end(key, last=False)
      if self._thread is None:
        _exit_at_once_while_compiling()
        self._thread = threading.Thread(target=self._work, daemon=True,
                                        name="rnnstep-compile")
        self._thread.start()
      return True

  def forget(self, owner) -> None:
    """Drops the shapes `owner` queued that are not being compiled yet."""
    with self._lock:
      for key in [k for k, v in self._queue.items() if v[3] is owner]:
        del self._queue[key]

  def _work(self) -> None:
    while True:
      with self._lock:
        if not self._queue or _EXITING:
          self._thread = None
          return
        key, (generator, name, args, _) = self._queue.popitem(last=False)
        self._compiling = key
        _COMPILING.add(self)
      started = time.monotonic()
      try:
        # Held for the call: the generator keeps only a weak reference.
        model = getattr(generator, "model", True)
        if model is None:
          # Its model was freed while the shape waited: nothing to compile
          # with, and nothing wrong with the shape (another model of the
          # architecture may ask for it again).
          done = None
        else:
          generator.call(name, *args)
          done = self._ready
          logging.info("compiled an XLA program (%s) in %.1f s", name,
                       time.monotonic() - started)
      except Exception as e:  # pylint: disable=broad-except
        # Its calls stay on the graph path, which gives the same text.
        logging.warning("compiling an XLA program (%s) failed (its calls "
                        "stay on the graph path): %s", name,
                        str(e).splitlines()[0][:300] if str(e) else e)
        done = self._failed
      del generator, args, model
      with self._lock:
        if done is not None:
          done.add(key)
        self._compiling = None
        _COMPILING.discard(self)


_COMPILERS = weakref.WeakKeyDictionary()
_COMPILERS_LOCK = threading.Lock()
# Compilers whose thread is inside a compile (or its trace) now.
_COMPILING = weakref.WeakSet()
_EXIT_HANDLER = []
# Set (under every compiler's lock) when the process exits: no compile starts
# after the exit handler has looked for one running.
_EXITING = False


def for_programs(programs) -> Compiler:
  """The `Compiler` of an XLA `generator.Programs` (made once; it lives as
  long as the programs, whose compiled shapes it records)."""
  with _COMPILERS_LOCK:
    compiler = _COMPILERS.get(programs)
    if compiler is None:
      compiler = _COMPILERS[programs] = Compiler()
    return compiler


def wait_idle(timeout: Optional[float] = None) -> bool:
  """Waits until no program of this process is queued or compiling in the
  background, at most `timeout` seconds (None: as long as it takes).

  Returns:
    Whether every compiler is idle: a benchmark times settled calls after
    it, and the tests end each test with it, so that no compile outlives
    the test that started it.
  """
  deadline = None if timeout is None else time.monotonic() + timeout
  while True:
    with _COMPILERS_LOCK:
      compilers = list(_COMPILERS.values())
    if not any(compiler.pending for compiler in compilers):
      return True
    if deadline is not None and time.monotonic() >= deadline:
      return False
    time.sleep(0.05)


def _exit_at_once_while_compiling() -> None:
  """Registers `_exit_while_compiling` with atexit, once per process."""
  if not _EXIT_HANDLER:
    _EXIT_HANDLER.append(_exit_while_compiling)
    _remember_exit_status()
    atexit.register(_exit_while_compiling)


def _exit_while_compiling() -> None:
  """At exit, while a program compiles (or traces): the other exit handlers,
  then `os._exit` with the process's status (the interpreter's own exit
  would abort inside XLA; see the module docstring)."""
  global _EXITING
  with _COMPILERS_LOCK:
    compilers = list(_COMPILERS.values())
  # Under each compiler's lock, so that a compile thread between two shapes
  # either sees the flag and stops or is already in `_COMPILING` here.
  for compiler in compilers:
    with compiler._lock:  # pylint: disable=protected-access
      _EXITING = True
  _EXITING = True
  if not any(True for _ in _COMPILING):
    return
  atexit.unregister(_exit_while_compiling)
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  if getattr(sys, "last_value", None) is not None:  # Uncaught: printed.
    status = 1
  else:
    status = _exit_status(_EXIT_STATUS[0] if _EXIT_STATUS else None)
  os._exit(status)  # pylint: disable=protected-access


def _exit_status(code) -> int:
  """The status Python gives `sys.exit(code)`."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  return 1  # A message, printed already.


_EXIT_STATUS = []


def set_exit_status(code) -> None:
  """Tells `_exit_while_compiling` the status to leave with, for a program
  that ends by `raise SystemExit(code)` (pytest's `python -m pytest`)."""
  _EXIT_STATUS[:] = [code]


def _remember_exit_status() -> None:
  """Wraps `sys.exit` to remember its status: an exit handler cannot read
  it, and `_exit_while_compiling` must leave with it."""
  original = sys.exit

  def exit(code=None):  # pylint: disable=redefined-builtin
    _EXIT_STATUS[:] = [code]
    original(code)

  exit.__doc__ = original.__doc__
  sys.exit = exit


class Background:
  """A model's generator on a path that compiles (XLA, or the elementwise
  path's small XLA programs) whose calls never wait on a compile.

  It stands in for the target path's `Generator` where the host side calls
  one (`host.generate_ids`, `host.stream_ids`: `call`, `model`, `path`,
  `jit_compile`, `chunked_prompts`, `state_sizes`, so requests are built
  with the target's shapes). A call whose programs are compiled
  (`Programs.compile_key`) runs on the target path; any other runs the
  graph path's function with the same arguments while the `Compiler`
  compiles them (`MAX_PROGRAMS` at most; past that, the graph path).

  Under XLA that is decided call by call: the carries interchange. The
  elementwise path's carry has consumed its last id, the graph path's has
  not (`Programs.unconsumed`), so there a generation (a stream: all its
  calls) takes one path, chosen at its start: the target where the
  programs of its first call and of its continuations are compiled, else
  the graph path throughout, each call queueing its compile
  (`_GraphWhileCompiling`).

  In a process that generates once (`generate_once`: rnnstep-generate),
  nothing is compiled (the process would not live to use it): under XLA a
  call runs where its program is in XLA's disk cache
  (`xla_cache.has_program`, loaded in seconds), else on the graph path,
  with the graph path's exact shapes when the generation's first call is
  not on disk; the elementwise path's calls run on the graph path.

  Args:
    model: the `rnnstep.Model`.
    target: `paths.XLA` or `paths.ELEMENTWISE`.
    compiles: whether calls not compiled queue their compile.
  """

  def __init__(self, model, target: str = paths.XLA, compiles: bool = True):
    xla_cache.prune_once()  # Before TensorFlow loads a program from it.
    self.target = generator_lib.cached(model, target)
    self.graph = generator_lib.cached(model, paths.GRAPH)
    self.compiler = for_programs(self.target.programs)
    self.compiles = compiles
    self.path = target
    self.jit_compile = self.target.jit_compile
    # Requests are built with the target's prompt widths, which the graph
    # path primes as well (its unroll stops at the longest prompt).
    self.chunked_prompts = self.target.chunked_prompts
    self.programs = self.target.programs
    self.switches_mid_generation = (self.programs.unconsumed
                                    == self.graph.programs.unconsumed)

  @property
  def model(self):
    return self.target.model

  def state_sizes(self):
    return self.target.state_sizes()

  def generate_ids(self, prompts, num_steps, options, *, strategy=None):
    """`host.generate_ids` on the generation's runner (no strategy)."""
    assert strategy is None, "a strategy's replicas run XLA in the foreground"
    return host.generate_ids(self._runner(prompts, num_steps, options),
                             prompts, num_steps, options)

  def stream_ids(self, prompts, num_steps, chunk_size, options):
    """`host.stream_ids` on the stream's runner."""
    runner = self._runner(prompts, min(chunk_size, num_steps), options,
                          continues=num_steps > chunk_size,
                          capacity_steps=chunk_size, total_steps=num_steps)
    chunks = host.stream_ids(runner, prompts, num_steps, chunk_size, options)
    if isinstance(runner, _GraphWhileCompiling):
      return runner.compiling_after(chunks)
    return chunks

  def _runner(self, prompts, num_steps, options, *, continues=False,
              **buffer_steps):
    """What runs a generation's calls: this `Background` (call by call),
    the graph path's generator, the target's, or `_GraphWhileCompiling`."""
    if self.switches_mid_generation:
      if self.compiles or self._first_on_disk(prompts, num_steps, options,
                                              **buffer_steps):
        return self
      return self.graph
    if not self.compiles:
      return self.graph
    request = host.build_request(self, prompts, num_steps, options,
                                 **buffer_steps)
    name, args = _first_call(request, options)
    keys = [self.programs.compile_key(name, args)]
    if continues:
      keys.append(self.programs.compile_key(
          "window_continue_fn" if options.window else "continue_fn", args))
    if all(self._ready(key) for key in keys):
      return self.target
    return _GraphWhileCompiling(self, after=continues)

  def _first_on_disk(self, prompts, num_steps, options,
                     **buffer_steps) -> bool:
    """Whether the first call of a generation (its request as `host` builds
    it for XLA) has its program compiled or on disk."""
    if not (self.compiler.compiled or xla_cache.has_programs(
        self.programs.index_prefix())):
      return False  # Nothing of this model's: no request built for XLA.
    request = host.build_request(self, prompts, num_steps, options,
                                 **buffer_steps)
    name, args = _first_call(request, options)
    return self._ready(self.programs.compile_key(name, args))

  def _ready(self, key) -> bool:
    """Whether `key`'s programs run without compiling: compiled here, or
    (an XLA program, where this generator compiles nothing) on disk."""
    if self.compiler.ready(key) or self.programs.compiled(key):
      return True
    return (not self.compiles and self.path == paths.XLA
            and xla_cache.has_program(self.programs.program_key(key)))

  def call(self, name: str, *args, target: bool = True):
    """`Generator.call` on the target path if its programs are ready (and
    `target`), else on the graph path, queueing their compile."""
    key = self.programs.compile_key(name, args)
    if target and self._ready(key):
      return self.target.call(name, *args)
    return graph_while_compiling(self.compiler if self.compiles else None,
                                 key, self.target, self.graph, name, args)

  def queue(self, key, name: str, args) -> None:
    """Queues the compile of the target path's programs of `key`
    (`Programs.compile_key` of a call of `name` with `args`), unless
    compiling them failed before."""
    if self.compiles and not self.compiler.failed(key):
      self.compiler.want(key, self.target, args, first=True, name=name)


def graph_while_compiling(compiler, key, target, graph, name: str, args,
                          compile_args=None):
  """`graph.call(name, *args)`, queueing (first) the compile of `key`'s
  programs on `compiler`'s thread by `target.call(name, *compile_args)`
  (default: `args`), unless compiling them failed before or `compiler` is
  None."""
  result = graph.call(name, *args)
  if compiler is not None and not compiler.failed(key):
    compiler.want(key, target, args if compile_args is None else compile_args,
                  first=True, name=name)
  return result


def _first_call(request, options):
  """The name and arguments of a generation's first call (as `host` makes
  it)."""
  if options.num_beams > 1:
    return "beam_fn", (request,)
  if options.window:
    return "window_fn", (request, np.int32(options.window))
  return "generate_fn", (request,)


class _GraphWhileCompiling:
  """A generation on the graph path throughout, each call queueing the
  compile of its shape on its `Background`'s target path (whose carry the
  graph path's cannot continue).

  With `after` (a stream), the compiles are queued once the stream ends
  (`compiling_after`): only a later generation can use them, and compiling
  beside the stream's later chunks made a stream in the bundled GRU's
  elementwise band take 1.4x its graph-path time (1.0x with no compile;
  benchmarks/results/first-call-epyc-zen4-2026-12.md).
  """

  def __init__(self, background: Background, *, after: bool = False):
    self._background = background
    self.jit_compile = background.jit_compile
    self.chunked_prompts = background.chunked_prompts
    self.state_sizes = background.state_sizes
    # compile_key -> (name, args) of the calls to compile once the stream
    # ends: one call a shape (a stream's chunks share theirs).
    self._after = {} if after else None

  @property
  def model(self):
    return self._background.model

  def call(self, name: str, *args):
    if self._after is None:
      return self._background.call(name, *args, target=False)
    key = self._background.programs.compile_key(name, args)
    self._after.setdefault(key, (name, args))
    return self._background.graph.call(name, *args)

  def compiling_after(self, chunks):
    """`chunks` (a stream's), then the compiles of their calls' shapes,
    queued when the stream ends or is closed."""
    try:
      yield from chunks
    finally:
      if not (_EXITING or sys.is_finalizing()):
        for key, (name, args) in self._after.items():
          self._background.queue(key, name, args)
      self._after.clear()


_BACKGROUND = weakref.WeakKeyDictionary()
_GENERATES_ONCE = []


def generate_once() -> None:
  """Says this process generates once and exits (rnnstep-generate): its
  `Background`s compile nothing and take XLA only for programs on disk."""
  _GENERATES_ONCE[:] = [True]


def background(model, target: str = paths.XLA) -> Background:
  """The model's `Background` for a target path (one per model and path,
  held weakly as `generator.cached`'s generators are)."""
  per_model = _BACKGROUND.setdefault(model, {})
  found = per_model.get(target)
  if found is None:
    found = per_model[target] = Background(
        model, target, compiles=not _GENERATES_ONCE)
  return found
