"""XLA programs compiled on a thread of their own while the graph path serves.

Under XLA (`paths.XLA`) the serving engine's one call a chunk,
`Programs.serve_fn`, is compiled once per shape: per batch bucket, prompt
width and table size (`request.build`). The bundled model's program takes
6-8 CPU seconds to compile, and a server of 64 slots has 14 of them (7
batch buckets x 2 prompt widths): compiled before the first answer, a
2-core Zen 3 answered `/health` after about 3 minutes. The same function
traced for the graph path (no XLA) is one trace for every shape (about 4
seconds).

So the engine answers from the start: a call whose XLA program is not
compiled yet runs the graph path's `serve_fn`, with the same arguments
(the very same request and carry arrays), while a `Compiler` compiles that
shape's XLA program on its own thread; once it is compiled, calls of that
shape run on XLA. Shapes a call has asked for come first, then the
warm-up's (every batch bucket and prompt width, as `Engine.warm_up` would
have compiled them before). The graph and XLA programs are one Python
function traced twice (`Programs._serve_impl`), take the same arguments and
give the same carry (both prime all but a row's last id), which lives on
the host between chunks: a row may run one chunk on the graph path and the
next under XLA, and its text is the same either way (README
"Reproducibility": the paths agree to float32 rounding).

One `Compiler` per XLA `Programs` (`for_programs`): the programs, and so
what has been compiled, are shared by every engine (lane) of the model's
architecture.
"""

import collections
import threading
import time
import weakref
from typing import Hashable

from absl import logging
import numpy as np
import tensorflow as tf


def shape_key(args) -> Hashable:
  """What XLA compiles a `serve_fn` call's program for: the shape of every
  argument, and the values XLA takes as constants (`request.capacity`, the
  output buffer's length, and the history's length).

  Args:
    args: `(request, carry, fresh, primes_only)`, `serve_fn`'s arguments
      but the weights (numpy arrays).
  """
  request = args[0]
  return (tuple(np.shape(x) for x in tf.nest.flatten(args)),
          int(request.capacity), int(request.lookback.history_length))


class Compiler:
  """Shapes of one XLA `serve_fn` compiled, and a thread compiling more.

  `ready(key)` says whether a shape's program is compiled; `want(...)`
  queues a shape with arguments to compile it with (a call of those
  shapes: it is run once, for one step, on the compiling thread). The thread
  starts when there is work and ends when there is none.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._ready = set()
    self._failed = set()
    # key -> (generator, args, owner), in the order they will be compiled.
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

  def want(self, key, generator, args, *, first: bool = False,
           owner=None) -> None:
    """Queues `key`'s program, to compile by calling `generator`'s
    `serve_fn` with `args` (for one step; the arrays are not changed).

    Args:
      key: `shape_key(args)`.
      generator: the XLA `Generator` whose `serve_fn` to compile.
      args: `serve_fn`'s arguments but the weights.
      first: ahead of the shapes queued before (a call asked for it).
      owner: what queued it (`forget` drops its shapes).
    """
    with self._lock:
      if (key in self._ready or key in self._failed
          or key == self._compiling):
        return
      if key not in self._queue:
        request = args[0]
        # One step is all a compile needs (the steps are not a constant).
        args = (request._replace(num_steps=np.int32(1)),) + tuple(args[1:])
        self._queue[key] = (generator, args, owner)
      if first:
        self._queue.move_to_end(key, last=False)
      if self._thread is None:
        self._thread = threading.Thread(target=self._work, daemon=True,
                                        name="rnnstep-compile")
        self._thread.start()

  def forget(self, owner) -> None:
    """Drops the shapes `owner` queued that are not being compiled yet."""
    with self._lock:
      for key in [k for k, v in self._queue.items() if v[2] is owner]:
        del self._queue[key]

  def _work(self) -> None:
    while True:
      with self._lock:
        if not self._queue:
          self._thread = None
          return
        key, (generator, args, _) = self._queue.popitem(last=False)
        self._compiling = key
      started = time.monotonic()
      try:
        generator.call("serve_fn", *args)
        done = self._ready
        logging.info("compiled a serving program in %.1f s",
                     time.monotonic() - started)
      except Exception as e:  # pylint: disable=broad-except
        # Its calls stay on the graph path, which gives the same text.
        logging.warning("compiling a serving program failed (its calls "
                        "stay on the graph path): %s",
                        str(e).splitlines()[0][:300] if str(e) else e)
        done = self._failed
      del generator, args
      with self._lock:
        done.add(key)
        self._compiling = None


_COMPILERS = weakref.WeakKeyDictionary()
_COMPILERS_LOCK = threading.Lock()


def for_programs(programs) -> Compiler:
  """The `Compiler` of an XLA `generator.Programs` (made once; it lives as
  long as the programs, whose compiled shapes it records)."""
  with _COMPILERS_LOCK:
    compiler = _COMPILERS.get(programs)
    if compiler is None:
      compiler = _COMPILERS[programs] = Compiler()
    return compiler
