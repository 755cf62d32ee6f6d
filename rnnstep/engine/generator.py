"""Generator: the whole generation of a batch as one compiled TensorFlow call.

A `Generator` holds a model's compiled functions on one execution path
(`paths.py`): "xla" (the whole function is one XLA program), "graph" (a TF
graph, no XLA) or "elementwise" (a TF graph loop whose matmuls are TF's
oneDNN ops, with the rest of each step compiled by XLA as one small program a
layer; see `loop.choose_then_consume`).

The pipeline, as modules: the compiled loops (`loop.py`: priming, the decode
loop over a named `LoopState`) hand each step's logits to the option pipeline
(`pipeline.py`, over the declarations of `options.py`); the host side
(`host.py`) encodes prompts, builds the `request.Request` (the functions'
input signature), streams, distributes and slices the ids out. Nothing a user
changes retraces: every value is a tensor of a fixed signature, and under
XLA the shapes are bucketed (see `request.py`).

Only the final ids cross to the host. Streaming continues a generation chunk
by chunk with the state carried on device between calls; the sampling noise is
keyed by the global step, so the chunks join into exactly the one-shot text.
"""

import contextlib
import hashlib
import threading
import weakref
from typing import Hashable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from rnnstep.decoding import pipeline
from rnnstep.engine import beams
from rnnstep.engine import host
from rnnstep.engine import loop
from rnnstep.engine import paths
from rnnstep.engine import recompute
from rnnstep.engine import request as request_lib
from rnnstep.engine import window as window_lib
from rnnstep.engine import xla_cache
from rnnstep.model import cells
from rnnstep.model import graph_calls
from rnnstep.model import network as network_lib
from rnnstep.model.check import check_model


class Programs(tf.Module):
  """The compiled functions of one architecture on one path.

  Every function takes the model's weights (`Model.network_weights()`) as its
  first argument instead of capturing a model's variables, so all models of
  one `network.Architecture` share one `Programs` (`programs_for`): a second
  model of the same shape pays no trace and no compile.

  Args:
    model: the first model of the architecture (its shapes make the specs).
    path: "xla", "graph" or "elementwise" (see `paths.py`).
  """

  def __init__(self, model, path: str):
    super().__init__(name=f"programs_{path}")
    self.architecture = model.architecture
    self.path = path
    self.vocab_size = model.vocab_size
    self.jit_compile = path == paths.XLA
    state_sizes = state_sizes_of(model.config)
    weights_spec = model.weights_spec()
    request_spec = request_lib.spec(model.vocab_size, state_sizes)
    carry_spec = request_lib.carry_spec(state_sizes, model.vocab_size)
    # autograph=False: the bodies use tf.while_loop/tf.cond explicitly, and
    # skipping autograph's source conversion makes the first trace several
    # times faster.
    compiled = dict(jit_compile=self.jit_compile, autograph=False)
    self.generate_fn = tf.function(
        self._generate_impl, **compiled,
        input_signature=[weights_spec, request_spec])
    self.continue_fn = tf.function(
        self._continue_impl, **compiled,
        input_signature=[weights_spec, request_spec, carry_spec])
    self.beam_fn = tf.function(self._beam_impl, **compiled,
                               input_signature=[weights_spec, request_spec])
    # Windowed generation (`window.py`): k slots per row; k is a tensor
    # (under XLA a compile-time constant, one program per distinct k).
    window_spec = tf.TensorSpec([], tf.int32, name="window")
    self.window_fn = tf.function(
        self._window_impl, **compiled,
        input_signature=[weights_spec, request_spec, window_spec])
    self.window_continue_fn = tf.function(
        self._window_continue_impl, **compiled,
        input_signature=[weights_spec, request_spec, carry_spec, window_spec])
    # The server's one call per chunk (`rnnstep/serve/calls.py`):
    # rows admitted now are primed and join rows carried from earlier chunks,
    # each row at its own position (`carry_spec(per_row_step=True)`); a long
    # prompt's rows prime one piece a call (`primes_only`). Its rows come
    # from different requests: their look-back settings are per row.
    self.serve_fn = tf.function(
        self._serve_impl, **compiled, input_signature=[
            weights_spec,
            request_lib.spec(model.vocab_size, state_sizes,
                             per_row_lookback=True),
            request_lib.carry_spec(state_sizes, model.vocab_size,
                                   per_row_step=True),
            tf.TensorSpec([None], tf.bool, name="fresh"),
            tf.TensorSpec([None], tf.bool, name="primes_only")])
    self.step = tf.function(self._step_impl, **compiled, input_signature=[
        weights_spec, tf.TensorSpec([None], tf.int32, name="ids"),
        carry_spec.state])
    self._concrete_functions = {}
    # The one-tail variants (`one_tail`) traced in this process, by name.
    self._one_tail_functions = {}
    # Under XLA, the `shape_key`s called here (their programs compiled).
    self._compiled = set()

  def compiled(self, key) -> bool:
    """Whether the program of `key` (`shape_key`) was called in this
    process (XLA: compiled, or loaded from XLA's disk cache)."""
    return key in self._compiled

  def compile_key(self, name: str, args) -> Hashable:
    """What this path compiles a call's programs for (None on the graph
    path, which compiles nothing).

    Under XLA, `shape_key`: the whole function is one program per shape. On
    the elementwise path only the small XLA programs inside the TF graph
    compile (each cell's gate math; the loop's choose-and-consume call,
    `loop.choose_then_consume`), per shape of what reaches them: the batch,
    the stop automaton's and the pattern's state counts, the history's
    length; not the prompt's width (priming feeds them a column at a time)
    nor the output buffer's (the loop writes it outside them). The tail a
    call takes is chosen by values (`pipeline.takes_plain_tail`), and each
    tail is a program of its own. Measured with the bundled GRU (the files
    XLA's disk cache gained per call): a new prompt length or step count at
    a known batch compiles nothing; a new batch, stop string, top_k or
    repetition penalty does. A continuation's carry has the shapes its
    request gives it: the key reads the request (and a window's length).

    Args:
      name: the compiled function.
      args: its arguments but the weights (a request first), numpy.
    """
    name = self.program_name(name, args)
    if self.path == paths.XLA:
      return shape_key(args, name)
    if self.path == paths.GRAPH:
      return None
    request = args[0]
    plain = self._takes_plain_tail(request)
    request = request._replace(
        prompts=request.prompts._replace(ids=request.prompts.ids[:, :0]),
        capacity=np.int32(0))
    window = tuple(args[-1:]) if name.startswith("window") else ()
    return shape_key((request,) + window, name) + (bool(plain),)

  def _takes_plain_tail(self, request) -> bool:
    """Whether a request (numpy) takes the plain decode loop
    (`pipeline.takes_plain_tail`, as the loop decides it on device)."""
    parts = pipeline.active(request.sampling, request.lookback,
                            self.vocab_size)
    return bool(pipeline.takes_plain_tail(
        parts, request.want_scores,
        pipeline.is_constrained(request.constraint)))

  def program_name(self, name: str, args) -> str:
    """The function a call of `name` with `args` (a request first) runs.

    In a process that generates once (`one_tail`), a generation's call runs
    the variant of its function traced with only the decode loop its request
    takes, "generate_fn/plain" or "generate_fn/general" (`loop.run_decode`'s
    `plain`), unless XLA's disk cache holds the whole function's program for
    the call, which loads faster than half of it traces and compiles.
    """
    if not _ONE_TAIL or name not in ONE_TAIL_FUNCTIONS:
      return name
    if self.jit_compile and xla_cache.has_program(
        self.program_key(shape_key(args, name))):
      return name
    return f"{name}/{'plain' if self._takes_plain_tail(args[0]) else 'general'}"

  def index_prefix(self) -> str:
    """What every key of these programs in XLA's program index starts with
    (`program_key`): a digest of the architecture, path and TensorFlow's
    thread pools (XLA's programs are compiled for them)."""
    text = repr((self.architecture, self.path,
                 tf.config.threading.get_intra_op_parallelism_threads(),
                 tf.config.threading.get_inter_op_parallelism_threads()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

  def program_key(self, key) -> str:
    """What XLA's program index (`xla_cache.record_program`) knows the
    program of `key` (`shape_key`) by, in every process: `index_prefix`,
    then a digest of the function and shapes."""
    return self.index_prefix() + hashlib.sha256(
        repr(key).encode("utf-8")).hexdigest()[:16]

  def call(self, name: str, weights, *args):
    """Calls the concrete function `name`: on the graph path without
    Grappler (`graph_calls`); under XLA, the first call of a shape in this
    process records the program's files in XLA's program index
    (`xla_cache.record_program`); in a process that generates once, a
    generation's call runs the variant `program_name` says."""
    name = self.program_name(name, args)
    concrete = self.concrete(name)
    if self.path == paths.GRAPH:
      with graph_calls.without_grappler():
        return concrete(weights, *args)
    if not self.jit_compile:
      return concrete(weights, *args)
    key = shape_key(args, name)
    if key in self._compiled:
      return concrete(weights, *args)
    before = xla_cache.entry_names()
    result = concrete(weights, *args)
    self._compiled.add(key)
    written = xla_cache.entry_names() - before
    if written:  # Compiled here, not loaded from the disk cache.
      xla_cache.record_program(self.program_key(key), written)
    return result

  def traced(self, name: str) -> bool:
    """Whether `concrete(name)` has been traced."""
    return name in self._concrete_functions

  def concrete(self, name: str):
    """The one concrete function of the compiled function `name`.

    Host callers use it: binding a nested request to the polymorphic
    `tf.function`'s signature costs ~1 ms a call, which streaming in small
    chunks would pay every chunk.
    """
    concrete = self._concrete_functions.get(name)
    if concrete is None:
      with stable_names(f"{self.architecture!r}/{self.path}/{name}"):
        concrete = self._function(name).get_concrete_function()
      self._concrete_functions[name] = concrete
    return concrete

  def _function(self, name: str):
    """The compiled function `name`, or its one-tail variant
    ("generate_fn/plain", ...: `program_name`), made at first use."""
    base, _, tail = name.partition("/")
    if not tail:
      return getattr(self, name)
    function = self._one_tail_functions.get(name)
    if function is None:
      plain = tail == "plain"
      impl = {
          "generate_fn": lambda weights, request: self._generate(
              weights, request, plain),
          "continue_fn": lambda weights, request, carry: self._continue(
              weights, request, carry, plain),
          "window_fn": lambda weights, request, window: self._window(
              weights, request, window, plain),
          "window_continue_fn": lambda weights, request, carry, window: (
              self._window_continue(weights, request, carry, window, plain)),
      }[base]
      function = self._one_tail_functions[name] = tf.function(
          impl, jit_compile=self.jit_compile, autograph=False,
          input_signature=getattr(self, base).input_signature)
    return function

  # -- compiled bodies -------------------------------------------------------

  def _network(self, weights):
    return network_lib.network_of(
        self.architecture, weights,
        compile_elementwise=self.path == paths.ELEMENTWISE,
        one_xla_program=self.jit_compile)

  def _step_impl(self, weights, ids, state):
    return self._network(weights).step(ids, state)

  @property
  def _chooses_first(self) -> bool:
    """Whether the decode loop chooses an id, then consumes it (elementwise)."""
    return self.path == paths.ELEMENTWISE

  @property
  def unconsumed(self) -> int:
    """Prompt characters priming leaves to the first decode step (0 or 1).

    A `Carry`'s state has consumed all of its prompt but these: on the xla
    and graph paths the last character, which the first step consumes.
    """
    return 0 if self._chooses_first else 1

  def _generate_impl(self, weights, request: request_lib.Request
                     ) -> request_lib.Result:
    return self._generate(weights, request, plain=None)

  def _generate(self, weights, request, plain) -> request_lib.Result:
    """Primes, then decodes (`loop.run_decode`, whose `plain` says which
    of its loops are traced)."""
    network = self._network(weights)
    # Priming leaves each row's last character to the first decode step,
    # except where the loop chooses before it consumes.
    carry = loop.start_carry(network, request, unconsumed=self.unconsumed)
    return loop.run_decode(network, request, carry, self._chooses_first,
                           plain=plain)

  def _beam_impl(self, weights, request: request_lib.Request
                 ) -> beams.BeamResult:
    return beams.search(self._network(weights), request)

  def _continue_impl(self, weights, request, carry):
    return self._continue(weights, request, carry, plain=None)

  def _continue(self, weights, request, carry, plain):
    return loop.run_decode(self._network(weights), request, carry,
                           self._chooses_first, plain=plain)

  def _serve_impl(self, weights, request, carry, fresh, primes_only):
    """Primes the `fresh` rows' prompts, then decodes every row on.

    The other rows' prompts are one (ignored) character each, so priming
    costs the longest fresh prompt; their carried values are kept as they
    are. A fresh row primes from its carried state: zeros for a new row; for
    a prompt longer than a chunk, the state after its earlier pieces, so
    that a long prompt is primed a piece a call while the other rows decode
    (`rnnstep/serve/calls.py`). The result equals, row by row, `_generate_impl` for a
    fresh row and `_continue_impl` for a carried one: the same `start_carry`
    and `run_decode`, with each row's noise keyed by its own step.

    Args:
      weights: the model's weights.
      request: the `Request` of every row (its `lookback` per row, `[B]`,
        its `history_length` the width of `carry.history.ids`; its
        `initial_state` unused). Its stop automaton may join several
        requests' automata, each row starting at its own state.
      carry: the `Carry` (`step` per row). A fresh row's `state` is where its
        priming starts, its `history` the history after its whole prompt
        (made on the host, `processors.start`'s: a row whose prompt is
        primed in pieces sees no whole prompt here) and its `stop_state`
        its stop automaton's start in the joined table; its other values
        are unused.
      fresh: bool `[B]`, the rows whose prompt (or its next piece) starts
        here.
      primes_only: bool `[B]`, fresh rows that only prime (a piece that is
        not their prompt's last): they take no step, and their result's
        `carry.state` is the primed state (the rest of their row is
        meaningless).
    """
    network = self._network(weights)
    # Chunks of as many columns as keep their products over PRIME_CHUNK
    # rows (`request.chunk_columns`): the rows a call admits together
    # mostly prime short pieces.
    started = loop.start_carry(
        network, request._replace(initial_state=carry.state),
        unconsumed=self.unconsumed, batch_sized_chunks=True)

    def pick(new, old):
      mask = tf.reshape(fresh, [-1] + [1] * (len(old.shape) - 1))
      return tf.where(mask, new, old)

    merged = request_lib.Carry(
        state=tf.nest.map_structure(pick, started.state, carry.state),
        last_ids=pick(started.last_ids, carry.last_ids),
        # Every row's own: a fresh row's is its start (the host's, which
        # knows where its automaton lies in the joined table).
        stop_state=carry.stop_state,
        # A row that only primes is done from the start: it chooses nothing,
        # and a call of such rows alone takes no step.
        done=pick(started.done | primes_only, carry.done),
        step=tf.where(fresh, tf.zeros_like(carry.step), carry.step),
        history=carry.history,
        scores=pick(started.scores, carry.scores),
        dfa_state=pick(started.dfa_state, carry.dfa_state))

    def decode():
      result = loop.run_decode(network, request, merged, self._chooses_first,
                               logprobs=True)
      # The loop steps every row's cells, done or not: a priming row's state
      # is the one priming left.
      primed = tf.nest.map_structure(
          lambda new, old: tf.where(primes_only[:, None], new, old),
          started.state, result.carry.state)
      return result._replace(carry=result.carry._replace(state=primed))

    def prime_only():
      # Every row only primes: no step to take (and a loop of no steps has
      # no ids to stack).
      rows = tf.shape(fresh)[0]
      return request_lib.Result(
          ids=tf.zeros([rows, request.capacity], tf.int32),
          lengths=tf.zeros([rows], tf.int32), scores=merged.scores,
          carry=merged,
          # Zeros, rows first (`[B, C]`, `[B, C, K]`) as `decode`'s.
          logprobs=pipeline.step_logprobs(rows, request.capacity,
                                          network.vocab_size))

    return tf.cond(tf.reduce_all(primes_only), prime_only, decode)

  # Every path runs windows in `consume_then_choose`'s order; the elementwise
  # path's network still compiles each cell's gate math. A model that cannot
  # keep its windows in slots recomputes each (`recompute.py`): a fact of
  # the architecture, so each `Programs` runs one kind.
  def _window_impl(self, weights, request, window):
    return self._window(weights, request, window, plain=None)

  def _window(self, weights, request, window, plain):
    if self.architecture.config.recomputes:
      return recompute.generate(self._network(weights), request, window,
                                plain)
    return window_lib.generate(self._network(weights), request, window, plain)

  def _window_continue_impl(self, weights, request, carry, window):
    return self._window_continue(weights, request, carry, window, plain=None)

  def _window_continue(self, weights, request, carry, window, plain):
    if self.architecture.config.recomputes:  # The carried window holds k.
      return recompute.run_decode(self._network(weights), request, carry,
                                  plain)
    return window_lib.run_decode(self._network(weights), request, carry,
                                 window, plain)


# TensorFlow names a traced function and every function inside it (loop
# bodies, branches) by a process-wide counter (`ops.uid`), and the names are
# in the HLO that XLA's disk cache (`xla_cache.py`) keys a program on: so a
# program traced after other work (another function, another path) had
# other names and was compiled again in the next process. `stable_names`
# numbers one trace's names from a base of its own, the same in every
# process: a digest of what is traced, spaced `_NAME_SPACING` apart.
_NAME_SPACING = 1 << 20
_NAME_BASE = 1 << 52
_name_lock = threading.Lock()
_name_ranges = []  # [start, end) of the numbers each stable trace used.
_name_counter = threading.local()  # `.next`: the tracing thread's numbers.
_name_patched = []  # [whether TensorFlow's counter could be wrapped]


def _uid(original):
  def uid():
    numbers = getattr(_name_counter, "next", None)
    return original() if numbers is None else next(numbers)
  return uid


@contextlib.contextmanager
def stable_names(description: str):
  """Numbers the names of what this thread traces inside from a base given
  by `description` (what is traced: architecture, path, function), so the
  same trace has the same names in every process.

  Other threads keep TensorFlow's counter. A base whose numbers this
  process used already (the same function traced again) or that would
  overlap another trace's is not used: that trace keeps TensorFlow's names
  (its program is compiled again in the next process, nothing worse).
  """
  if getattr(_name_counter, "next", None) is not None:
    yield  # Inside another stable trace: its numbers.
    return
  digest = int(hashlib.sha256(description.encode("utf-8")).hexdigest(), 16)
  base = _NAME_BASE + digest % (1 << 30) * _NAME_SPACING
  with _name_lock:
    free = not any(start < base + _NAME_SPACING and base < end
                   for start, end in _name_ranges)
    if not _name_patched:  # Once: TensorFlow's counter, this thread's.
      try:
        from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
        ops.uid = _uid(ops.uid)
        _name_patched.append(True)
      except (ImportError, AttributeError):
        _name_patched.append(False)
    free = free and _name_patched[0]
    if free:
      used = [base, base + _NAME_SPACING]
      _name_ranges.append(used)
  if not free:
    yield
    return
  # A thread's first use of TensorFlow's default graph makes it, taking a
  # number: taken here, before the trace, on any thread.
  tf.compat.v1.get_default_graph()
  numbers = _name_counter.next = _Counting(base)
  try:
    yield
  finally:
    _name_counter.next = None
    with _name_lock:
      used[1] = max(used[1], numbers.last + 1)


class _Counting:
  """Numbers from `start` up, remembering the last one given."""

  def __init__(self, start: int):
    self.last = start - 1

  def __next__(self) -> int:
    self.last += 1
    return self.last


def shape_key(args, name: str = "serve_fn") -> Hashable:
  """What XLA compiles a call's program for: the function, the shape of
  every argument, and the values XLA takes as constants (`request.capacity`,
  the output buffer's length; the history's length; a window's length; the
  beam width).

  Args:
    args: the function's arguments but the weights (a request first).
    name: the compiled function (`Programs`' attribute).
  """
  request = args[0]
  constants = [int(request.capacity), int(request.lookback.history_length)]
  if name.startswith("window"):
    constants.append(int(args[-1]))
  if name == "beam_fn":
    constants.append(int(request.beams.num_beams))
  return (name, tuple(np.shape(x) for x in tf.nest.flatten(args)),
          tuple(constants))


def state_sizes_of(config):
  """Per layer, the widths of its state tensors; a recomputed model's state
  is its window's ids (`recompute.state_sizes`)."""
  if config.recomputes:
    return recompute.state_sizes()
  return [cells.state_sizes(layer) for layer in config.layers]


def prompt_logprobs_function(model) -> network_lib.BoundFunction:
  """The compiled teacher-forced log-probabilities of prompts (the serving
  engine's `echo` with `logprobs`).

  Of ids `[B, T]` (T >= 2; right-padded rows' values past their length are
  meaningless), `(chosen [B, T-1], top_ids [B, T-1, K], top_logprobs [B, T-1,
  K])`: at t, the log-probability of id t+1 after ids 0..t from a zero
  state, and the K (`pipeline.TOP_LOGPROBS`, or V where smaller) most likely
  ids' (`pipeline.top_logprobs`). Raw model values, as `generate`'s scores.

  A TF graph on every path (no XLA: any batch and length, one trace), built
  once per architecture; the model's weights are passed at each call.
  """
  architecture = model.architecture
  top = min(pipeline.TOP_LOGPROBS, model.vocab_size)

  def build():
    def prompt_logprobs(weights, ids):
      network = network_lib.network_of(architecture, weights)
      batch, length = tf.shape(ids)[0], tf.shape(ids)[1] - 1
      outputs, _ = network.unroll(ids[:, :-1], network.zero_state(batch))
      logits = tf.reshape(network.logits(outputs), [batch * length, -1])
      chosen = pipeline.log_probability(logits,
                                        tf.reshape(ids[:, 1:], [-1]))
      top_ids, top_values = pipeline.top_logprobs(logits, top)
      return (tf.reshape(chosen, [batch, length]),
              tf.reshape(top_ids, [batch, length, top]),
              tf.reshape(top_values, [batch, length, top]))
    return tf.function(prompt_logprobs, autograph=False, input_signature=[
        model.weights_spec(), tf.TensorSpec([None, None], tf.int32)])

  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, "prompt_logprobs", build),
      model.network_weights)


# The functions whose calls `one_tail` narrows to their request's loop.
ONE_TAIL_FUNCTIONS = ("generate_fn", "continue_fn", "window_fn",
                      "window_continue_fn")
_ONE_TAIL = []


@contextlib.contextmanager
def one_tail() -> Iterator[None]:
  """Inside it, this process generates once (rnnstep-generate), so each
  generation's programs are traced with only the decode loop its request
  takes (`Programs.program_name`): about half the trace and half of XLA's
  compile, paid per kind of request (plain, or with options or scores the
  plain loop lacks) rather than once for every request. The library keeps
  one program for every request: nothing a caller changes retraces."""
  _ONE_TAIL.append(True)
  try:
    yield
  finally:
    _ONE_TAIL.pop()


def programs_for(model, path: str) -> Programs:
  """The shared `Programs` of the model's architecture on a concrete path."""
  xla_cache.prune_once()  # Before TF loads a program from it.
  return network_lib.shared_function(
      model.architecture, f"programs/{path}", lambda: Programs(model, path))


class Generator(tf.Module):
  """Compiled generation over a `Model`, on one execution path.

  The compiled functions (usable inside other graphs: export, tf.distribute),
  each reading the model's weights at the call:

    generate_fn(request) -> Result            prime the prompts, then decode
    continue_fn(request, carry) -> Result     decode on from a Result's carry
                                              (the request's prompts unused)
    window_fn(request, window) -> Result      the same over windows of the
    window_continue_fn(request, carry, window)  last `window` characters
                                              (`window.py`; the continuation
                                              reads the prompts' lengths)

  Research code can also drive the model directly: `zero_state(batch)` and the
  compiled `step(ids, state) -> (logits, state)` run one timestep over explicit
  state, the same cell code the loop uses.

  The programs behind them are shared by every model of the same architecture
  and path (`Programs`, `programs_for`): a reloaded model generates without a
  new trace or compile.

  Args:
    model: an `rnnstep.Model`.
    path: "xla", "graph" or "elementwise" (see `paths.py`).
    hold_model: keep the model alive (False for `cached`, whose cache must not).

  Attributes:
    model: the Model.
    path: the execution path.
    jit_compile: whether each function is one XLA program (path "xla").
    chunked_prompts: whether its programs prime prompts in chunks
      (`loop.primes_in_chunks`; `request.build`'s `chunked_prompts`).
    programs: the shared `Programs`.
  """

  def __init__(self, model, path: str = paths.XLA, *, hold_model: bool = True):
    check_model(model)
    super().__init__(name=f"{model.name}_generator")
    if hold_model:
      self._held_model = model
    self._model_ref = weakref.ref(model)
    self.path = paths.check_concrete(path)
    self.jit_compile = self.path == paths.XLA
    # Under XLA such a model primes in chunks (`loop.primes_in_chunks`), and
    # its prompts are padded to `request.chunked_width`.
    self.chunked_prompts = self.jit_compile and network_lib.unrolls_blockwise(
        model.config)
    # Off one XLA program such a model's cells compile small programs at
    # each batch size's first call (`network.compiles_per_batch`).
    self.compiles_per_batch = (not self.jit_compile
                               and network_lib.compiles_per_batch(model.config))
    self.programs = programs_for(model, self.path)
    for name in ("generate_fn", "continue_fn", "beam_fn", "window_fn",
                 "window_continue_fn", "serve_fn", "step"):
      setattr(self, name, network_lib.BoundFunction(
          getattr(self.programs, name), self._network_weights,
          graph=self.path == paths.GRAPH))

  @property
  def model(self):
    return self._model_ref()

  def _network_weights(self):
    return self.model.network_weights()

  def call(self, name: str, *args):
    """Calls the compiled function `name` through its one concrete function
    (`Programs.call`)."""
    return self.programs.call(name, self._network_weights(), *args)

  def state_sizes(self):
    """Per layer, the widths of its state tensors (`state_sizes_of`)."""
    return state_sizes_of(self.model.config)

  def zero_state(self, batch_size: int):
    """The zero state for `batch_size` rows: one tuple of `[B, U]` per layer.

    Raises:
      ValueError: a model that is recomputed over windows (no state to step).
    """
    if self.model.config.recomputes:
      raise ValueError(f"zero_state: {window_lib.CANNOT_STEP}")
    return tuple(tuple(tf.zeros([batch_size, u]) for u in sizes)
                 for sizes in self.state_sizes())

  # -- host side (host.py) ---------------------------------------------------

  def request(self, prompts: Sequence[str], num_steps: int,
              options: request_lib.Options = request_lib.Options(),
              **buffer_steps) -> request_lib.Request:
    """`host.build_request` for this generator (see there)."""
    return host.build_request(self, prompts, num_steps, options,
                              **buffer_steps)

  def generate_ids(self, prompts: Sequence[str], num_steps: int,
                   options: request_lib.Options = request_lib.Options(), *,
                   strategy=None) -> host.Sequences:
    """`host.generate_ids` on this generator (see there)."""
    return host.generate_ids(self, prompts, num_steps, options,
                             strategy=strategy)

  def stream_ids(self, prompts: Sequence[str], num_steps: int, chunk_size: int,
                 options: request_lib.Options = request_lib.Options()
                 ) -> Iterator[host.Sequences]:
    """`host.stream_ids` on this generator (see there)."""
    return host.stream_ids(self, prompts, num_steps, chunk_size, options)


_CACHE = weakref.WeakKeyDictionary()


def cached(model, path: str) -> Generator:
  """The model's Generator for a concrete path, built once per model and path.

  The cache holds models weakly, and its generators do too: it never keeps a
  model alive by itself.
  """
  per_model = _CACHE.get(model)
  if per_model is None:
    per_model = _CACHE[model] = {}
  generator = per_model.get(path)
  if generator is None:
    generator = per_model[path] = Generator(model, path, hold_model=False)
  return generator
