"""XLA programs compiled on a thread of their own while the graph path runs.

Under XLA (`paths.XLA`) each compiled function (`Programs.generate_fn`,
`continue_fn`, `window_fn`, `beam_fn`, the serving engine's `serve_fn`) is
compiled once per shape: per batch bucket, prompt width, output capacity
and table size (`request.build`). The bundled model's program takes 3-8 CPU
seconds to compile, RWKV-7's at the 0.1B shape about a minute; the same
function traced for the graph path (no XLA) is one trace for every shape.

So no call waits on a compile it can avoid: a call whose XLA program is not
compiled yet runs the graph path's function with the same arguments (the
very same request and carry), while a `Compiler` compiles that shape's XLA
program on its own thread; once it is compiled, calls of that shape run on
XLA. The graph and XLA programs are one Python function traced twice, take
the same arguments and give the same carry (both prime all but a row's last
id): a generation may run one chunk on the graph path and the next under
XLA, and its text is the same either way (README "Reproducibility": the
paths agree to float32 rounding).

Two users:
  - the server's chunk calls (`rnnstep/serve/calls.py`) ask for
    `serve_fn`'s shapes, a call's first, then its warm-up's;
  - the library (`rnnstep.generate`, `rnnstep.stream` with
    `jit_compile=None` where that picks XLA) calls through `Background`.

One `Compiler` per XLA `Programs` (`for_programs`): the programs, and so
what has been compiled, are shared by every model of the architecture. A
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
  """Shapes of one XLA `Programs` compiled, and a thread compiling more.

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
    `name` with `args` (for one step; the arrays are not changed).

    Args:
      key: `shape_key(args, name)`.
      generator: the XLA `Generator` whose function to compile.
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
  """A model's XLA generator whose calls never wait on a compile.

  It stands in for the XLA `Generator` where the host side calls one
  (`host.generate_ids`, `host.stream_ids`: `call`, `model`, `path`,
  `jit_compile`, `chunked_prompts`, `state_sizes`, so requests are built with XLA's buckets).
  A call whose shape's program is compiled runs under XLA; any other runs
  the graph path's function with the same arguments while the `Compiler`
  compiles it (`MAX_PROGRAMS` at most; past that, the graph path).

  In a process that generates once (`generate_once`: rnnstep-generate),
  nothing is compiled (the process would not live to use it): a call runs
  under XLA where its program is in XLA's disk cache (`xla_cache.has_program`,
  loaded in seconds), else on the graph path, with the graph path's exact
  shapes when the generation's first call is not on disk.

  Args:
    model: the `rnnstep.Model`.
    compiles: whether calls not compiled queue their compile.
  """

  def __init__(self, model, compiles: bool = True):
    xla_cache.prune_once()  # Before TensorFlow loads a program from it.
    self.xla = generator_lib.cached(model, paths.XLA)
    self.graph = generator_lib.cached(model, paths.GRAPH)
    self.compiler = for_programs(self.xla.programs)
    self.compiles = compiles
    self.path = paths.XLA
    self.jit_compile = True
    # Requests are built with XLA's prompt widths, which the graph path
    # primes as well (its unroll stops at the longest prompt).
    self.chunked_prompts = self.xla.chunked_prompts
    self.programs = self.xla.programs

  @property
  def model(self):
    return self.xla.model

  def state_sizes(self):
    return self.xla.state_sizes()

  def generate_ids(self, prompts, num_steps, options, *, strategy=None):
    """`host.generate_ids` through `call` (no strategy)."""
    assert strategy is None, "a strategy's replicas run XLA in the foreground"
    if not self.compiles and not self._first_on_disk(prompts, num_steps,
                                                     options):
      return host.generate_ids(self.graph, prompts, num_steps, options)
    return host.generate_ids(self, prompts, num_steps, options)

  def stream_ids(self, prompts, num_steps, chunk_size, options):
    """`host.stream_ids` through `call`."""
    if not self.compiles and not self._first_on_disk(
        prompts, min(chunk_size, num_steps), options,
        capacity_steps=chunk_size, total_steps=num_steps):
      return host.stream_ids(self.graph, prompts, num_steps, chunk_size,
                             options)
    return host.stream_ids(self, prompts, num_steps, chunk_size, options)

  def _first_on_disk(self, prompts, num_steps, options,
                     **buffer_steps) -> bool:
    """Whether the first call of a generation (its request as `host` builds
    it for XLA) has its program compiled or on disk."""
    if not (self.compiler.compiled or xla_cache.has_programs(
        self.programs.index_prefix())):
      return False  # Nothing of this model's: no request built for XLA.
    request = host.build_request(self, prompts, num_steps, options,
                                 **buffer_steps)
    if options.num_beams > 1:
      return self._xla_ready(shape_key((request,), "beam_fn"))
    if options.window:
      return self._xla_ready(shape_key(
          (request, np.int32(options.window)), "window_fn"))
    return self._xla_ready(shape_key((request,), "generate_fn"))

  def _xla_ready(self, key) -> bool:
    """Whether `key`'s XLA program runs without compiling: compiled here,
    or (where this generator compiles nothing) on disk."""
    if self.compiler.ready(key) or self.programs.compiled(key):
      return True
    return not self.compiles and xla_cache.has_program(
        self.programs.program_key(key))

  def call(self, name: str, *args):
    """`Generator.call` on XLA if its program is ready, else on the graph
    path, queueing the program's compile."""
    key = shape_key(args, name)
    if self._xla_ready(key):
      return self.xla.call(name, *args)
    result = self.graph.call(name, *args)
    if self.compiles and not self.compiler.failed(key):
      self.compiler.want(key, self.xla, args, first=True, name=name)
    return result


_BACKGROUND = weakref.WeakKeyDictionary()
_GENERATES_ONCE = []


def generate_once() -> None:
  """Says this process generates once and exits (rnnstep-generate): its
  `Background`s compile nothing and take XLA only for programs on disk."""
  _GENERATES_ONCE[:] = [True]


def background(model) -> Background:
  """The model's `Background` (one per model, held weakly as
  `generator.cached`'s generators are)."""
  found = _BACKGROUND.get(model)
  if found is None:
    found = _BACKGROUND[model] = Background(
        model, compiles=not _GENERATES_ONCE)
  return found
