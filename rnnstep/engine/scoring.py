"""Teacher-forced log-probabilities of given ids, batched by length.

The compiled work of `rnnstep.loglikelihood` and
`rnnstep.loglikelihood_rolling`: rows of ids of any lengths are sorted by
length and cut into batches of similar lengths (`batches`); each batch is
one call of a compiled function of ids `[B, T]` (right-padded) and the state
each row starts from, that returns, at every position t, the log-probability
of id t+1 after ids 0..t and whether it is the greedy choice there. The host
sums each row's scored positions in float64. A context that several rows
share is run once (`score`).

Where the time goes (the bundled GRU 768): layer 0's input projection is a
`[V, 3U]` table (`Model.input_table`), gathered, so a step is the recurrent
matmul `[B, U] x [U, 3U]` plus the gate math; the Dense layer and the
log-softmax run once over all positions after the loop. The recurrent
matmuls alone are ~2/3 of the time at a batch of 1024.

Every path runs it: "graph" (a TF graph: exact shapes, never retraced),
"xla" (one XLA program per padded shape: the length to its bucket, the batch
to `request.batch_bucket`) and "elementwise" (a TF graph whose gate math is
XLA-compiled, as generation's; `default_path`). The functions are built once
per architecture and path and take the model's weights at each call, like
the generation programs.

A model that generates over windows (`window.py`) is scored over the same
windows: position t's logits are those after the last k ids up to t, as its
generation sees them.
"""

from typing import List, NamedTuple, Sequence
import weakref

import numpy as np
import tensorflow as tf

from rnnstep.decoding import pipeline
from rnnstep.decoding import sampling
from rnnstep.engine import compiling
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import recompute
from rnnstep.engine import request as request_lib
from rnnstep.engine import window as window_lib
from rnnstep import errors
from rnnstep.model import functions as functions_lib
from rnnstep.model import network as network_lib

# How many logits (batch x positions x vocabulary) one call holds at most:
# the batch of a length bucket is cut to fit (64 MiB of float32; the call
# holds a few such tensors at its peak). A row longer than this alone still
# runs, one row a call, if memory allows (`check_fits`).
LOGITS_PER_CALL = 1 << 24
# The same for the top layer's outputs (batch x positions x units), which the
# call keeps for the Dense layer after its loop (128 MiB of float32).
OUTPUTS_PER_CALL = 1 << 25
# The largest batch of one call on the graph and elementwise paths, and under
# XLA (whose programs are per shape, so its batches are powers of two).
# The recurrent matmul is most of a step and runs faster a row at 1024 rows
# than at 256 (measured on 2 AVX2 cores with the bundled model).
MAX_BATCH = 1024
XLA_MAX_BATCH = 256
# Copies of a call's logits alive at its peak (logits, log-softmax, the
# greedy comparison's temporaries).
_LOGIT_COPIES = 4


class Row(NamedTuple):
  """One sequence to score.

  Attributes:
    ids: int32 `[T]`, T >= 1.
    start: the first position whose id is scored (>= 1: id 0 is read from
      the zero state and has no probability); ids from `start` to T-1 are.
  """
  ids: np.ndarray
  start: int


class Scores(NamedTuple):
  """Per row: the summed log-probability (nats) and whether every scored id
  was the greedy choice (True for a row with nothing scored)."""
  logprobs: List[float]
  greedy: List[bool]


def default_path(window: int) -> str:
  """The path `jit_compile=None` scores on.

  The path `RNNSTEP_DEFAULT_PATH` names, where it is set. Over windows,
  XLA (as `generate`'s windows). Otherwise on a GPU XLA, and
  on a CPU "elementwise": scoring is the recurrent matmul at a large batch,
  whichever path runs it, and TF's matmul plus the fused gate math measured
  fastest there (the bundled model, 2 AVX2 cores: 10-20% ahead of XLA, whose
  bucketed shapes also pad more, and of the plain graph; see
  benchmarks/results/bulk-epyc-zen3-2026-12.md). Generation's table
  (`paths.default_path`) measures decode steps, not this.
  """
  pinned = paths.pinned_path()
  if pinned is not None:
    return pinned
  if window or paths.gpu_visible():
    return paths.XLA
  return paths.ELEMENTWISE


def function(model, path: str, windowed: bool) -> network_lib.BoundFunction:
  """The compiled `ids [B, T], state (or window []) -> (logprobs, greedy)`.

  Args:
    model: the Model.
    path: a concrete path (`paths.CONCRETE`).
    windowed: whether it scores over windows (its second argument, int32
      `[]`, is the window k > 0); else the second argument is the state each
      row starts from (`functions.state_spec`: zeros for a whole row).

  Returns:
    A `BoundFunction` returning float32 `[B, T-1]` (at t, log p(ids[:, t+1]
    | ids[:, :t+1])) and bool `[B, T-1]` (whether ids[:, t+1] is the first
    maximum of the logits there, "[UNK]" banned: what greedy decoding
    chooses).
  """
  architecture = model.architecture
  path = paths.check_concrete(path)

  def build():
    def scores_of(network, ids, logits):
      batch, length = tf.shape(ids)[0], tf.shape(ids)[1] - 1
      flat = tf.reshape(logits, [batch * length, network.vocab_size])
      targets = tf.reshape(ids[:, 1:], [-1])
      logprobs = pipeline.log_probability(flat, targets)
      choosable = flat if network.banned is None else flat + network.banned
      greedy = tf.equal(sampling.first_max_index(choosable), targets)
      return (tf.reshape(logprobs, [batch, length]),
              tf.reshape(greedy, [batch, length]))

    def stepped(weights, ids, state):
      network = _network(architecture, weights, path)
      outputs, _ = network.unroll(ids[:, :-1], state)
      return scores_of(network, ids, network.logits(outputs))

    def over_windows(weights, ids, window):
      network = _network(architecture, weights, path)
      score = (recompute.score if architecture.config.recomputes
               else window_lib.score)
      return scores_of(network, ids, score(network, ids[:, :-1], window))

    specs = [model.weights_spec(), tf.TensorSpec([None, None], tf.int32),
             (tf.TensorSpec([], tf.int32) if windowed
              else functions_lib.state_spec(model))]
    return _traced(tf.function(over_windows if windowed else stepped,
                               jit_compile=path == paths.XLA,
                               autograph=False, input_signature=specs),
                   architecture, name)

  name = f"loglikelihood/{path}/{'windows' if windowed else 'stepped'}"
  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, name, build),
      model.network_weights, graph=path == paths.GRAPH)


def prefix_function(model, path: str) -> network_lib.BoundFunction:
  """The compiled `ids [B, T], mask [B, T] -> state`: each row's state after
  its ids (right-padded; the mask False on padding), from a zero state."""
  architecture = model.architecture
  path = paths.check_concrete(path)

  def build():
    def prefix_state(weights, ids, mask):
      network = _network(architecture, weights, path)
      _, state = network.unroll(ids, network.zero_state(tf.shape(ids)[0]),
                                mask)
      return state

    return _traced(tf.function(prefix_state, jit_compile=path == paths.XLA,
                               autograph=False, input_signature=[
                                   model.weights_spec(),
                                   tf.TensorSpec([None, None], tf.int32),
                                   tf.TensorSpec([None, None], tf.bool)]),
                   architecture, name)

  name = f"loglikelihood/{path}/prefix"
  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, name, build),
      model.network_weights, graph=path == paths.GRAPH)


# The names of scoring's functions (`Calls.call`).
STEPPED = "stepped"
WINDOWS = "windows"
PREFIX = "prefix"


class Calls:
  """Scoring's compiled functions of one model on one path, called by name
  (`STEPPED`: `function`, `WINDOWS`: over windows, `PREFIX`:
  `prefix_function`) as a `compiling.Compiler` calls a generator's; the
  model is held weakly, as a cached generator's is."""

  def __init__(self, model, path: str):
    self._model = weakref.ref(model)
    self.path = paths.check_concrete(path)

  @property
  def model(self):
    return self._model()

  def call(self, name: str, *args):
    if name == PREFIX:
      compiled = prefix_function(self.model, self.path)
    else:
      compiled = function(self.model, self.path, windowed=name == WINDOWS)
    return compiled(*args)


def _caller(model, path: str, background: bool):
  """What `score` calls its functions through: `(name, *args) -> outputs`.

  With `background` (the elementwise path or XLA, which `jit_compile=None`
  took), a batch whose programs are not compiled runs on the graph path
  while they compile on `compiling`'s thread; later batches of that shape
  run on the path taken. The elementwise path's small XLA programs (each
  cell's gate math) compile per batch size, not per length (measured with
  the bundled GRU: a longer text at a known batch adds nothing to XLA's disk
  cache), so its compile runs the batch's first two columns; an XLA program
  is one per padded shape (and window), compiled with the batch itself.
  """
  on_path = Calls(model, path)
  if not background:
    return on_path.call
  graph = Calls(model, paths.GRAPH)
  compiler = compiling.for_programs(generator_lib.programs_for(model, path))

  def call(name, ids, extra):
    if path == paths.XLA:
      key = (f"loglikelihood/{name}", ids.shape,
             tuple(np.shape(x) for x in tf.nest.flatten(extra)),
             int(extra) if name == WINDOWS else None)
      columns = None
    else:
      key = (f"loglikelihood/{name}", ids.shape[0])
      columns = (ids[:, :2], extra[:, :2] if name == PREFIX else extra)
    if compiler.ready(key):
      return on_path.call(name, ids, extra)
    return compiling.graph_while_compiling(compiler, key, on_path, graph,
                                           name, (ids, extra), columns)

  return call


def _traced(function, architecture, name: str):
  """`function` (of one input signature) traced now, its names numbered as
  the generation programs' are (`generator.stable_names`), so its XLA
  programs are found in XLA's disk cache by the next process."""
  with generator_lib.stable_names(f"{architecture!r}/{name}"):
    function.get_concrete_function()
  return function


def _network(architecture, weights, path):
  return network_lib.network_of(
      architecture, weights, compile_elementwise=path == paths.ELEMENTWISE,
      one_xla_program=path == paths.XLA)


def batches(lengths: Sequence[int], vocab_size: int, xla: bool,
            units: int = 0):
  """Splits rows into calls: `(row indices, padded T, padded B)` each.

  Rows are sorted by length. Under XLA every call's shape is a length
  bucket's width (`request.bucket`, at most ~25% padding) and a power-of-two
  batch of at most `XLA_MAX_BATCH` (`request.batch_bucket`): few programs.
  Elsewhere consecutive rows of the sorted order make a call of at most
  `MAX_BATCH`, exactly as wide as its longest row: rows of a call differ in
  length by little, so little of it is padding. Either way a call holds at
  most `LOGITS_PER_CALL` logits and `OUTPUTS_PER_CALL` outputs of `units`.
  """
  order = np.argsort(np.asarray(lengths), kind="stable")
  if xla:
    groups = {}
    for index in order.tolist():
      width = request_lib.bucket(lengths[index], request_lib.MIN_WIDTH)
      groups.setdefault(width, []).append(index)
    calls = []
    for width, members in groups.items():
      # A power of two: the full batches share one program.
      size = _fits(width, vocab_size, units, XLA_MAX_BATCH)
      size = 1 << (size.bit_length() - 1)
      for begin in range(0, len(members), size):
        rows = members[begin:begin + size]
        calls.append((rows, width, request_lib.batch_bucket(len(rows))))
    return calls
  # Longest first, so each call's width (its first row's) sets its size.
  remaining = order[::-1].tolist()
  calls = []
  while remaining:
    width = lengths[remaining[0]]
    size = _fits(width, vocab_size, units, MAX_BATCH)
    # Even calls: the last of a run of full ones is not a small remainder.
    size = -(-len(remaining) // -(-len(remaining) // size))
    rows, remaining = remaining[:size], remaining[size:]
    calls.append((rows, width, len(rows)))
  return calls


def _fits(width, vocab_size, units, most):
  """The rows of `width` a call holds (at least 1, at most `most`)."""
  fits = LOGITS_PER_CALL // (width * vocab_size)
  if units:
    fits = min(fits, OUTPUTS_PER_CALL // (width * units))
  return max(1, min(most, fits))


def _shared_contexts(rows: Sequence[Row]):
  """The contexts to run once: those of two rows or more.

  Returns:
    `(prefixes, owner)`: the distinct prefixes (each a shared context's ids
    but its last, which the rows' own calls read so as to score their first
    scored id), and per row the index of its prefix or -1.
  """
  counts = {}
  for row in rows:
    if row.start > 1:
      key = row.ids[:row.start - 1].tobytes()
      counts[key] = counts.get(key, 0) + 1
  index_of, prefixes, owner = {}, [], []
  for row in rows:
    key = row.ids[:row.start - 1].tobytes() if row.start > 1 else None
    if counts.get(key, 0) < 2:
      owner.append(-1)
      continue
    if key not in index_of:
      index_of[key] = len(prefixes)
      prefixes.append(row.ids[:row.start - 1])
    owner.append(index_of[key])
  return prefixes, owner


def _prefix_states(call, model, path, prefixes, units):
  """Each prefix's state after its ids, as numpy `StackState` rows
  (`call`: `_caller`'s)."""
  lengths = [len(ids) for ids in prefixes]
  states = None
  for members, width, batch in batches(lengths, model.vocab_size,
                                       path == paths.XLA, units):
    ids = np.zeros([batch, width], np.int32)
    mask = np.zeros([batch, width], bool)
    for slot, index in enumerate(members):
      ids[slot, :lengths[index]] = prefixes[index]
      mask[slot, :lengths[index]] = True
    state = tf.nest.map_structure(lambda x: x.numpy(), call(PREFIX, ids, mask))
    if states is None:
      states = tf.nest.map_structure(
          lambda x: np.zeros((len(prefixes),) + x.shape[1:], x.dtype), state)
    for target, value in zip(tf.nest.flatten(states),
                             tf.nest.flatten(state)):
      target[members] = value[:len(members)]
  return states


def score(model, path: str, rows: Sequence[Row], window: int = 0, *,
          background: bool = False) -> Scores:
  """Scores rows of ids, one compiled call per batch (`batches`).

  A context that two rows or more share (lm-evaluation-harness's
  multiple-choice tasks: one context, several continuations) is run once:
  its state after all but its last id is computed in calls of its own
  (`prefix_function`), and each row runs on from it over the rest of its
  ids. That is the same arithmetic as running the row whole; only the
  batches' float32 rounding differs (README "Reproducibility").

  Args:
    model: the Model.
    path: a concrete path.
    rows: the `Row`s (checked: ids in range, start >= 1).
    window: k > 0 scores over windows of the last k ids; 0 over the whole
      row from a zero state.
    background: on the elementwise path or XLA, run a batch whose programs
      are not compiled on the graph path while they compile (`_caller`); the paths
      agree to float32 rounding (README "Reproducibility").

  Returns:
    The `Scores`, in the rows' order.
  """
  call = _caller(model, path, background)
  name = WINDOWS if window else STEPPED
  # The widest layer's outputs (both directions'), for `batches`' bound.
  units = max(layer.units * (1 + layer.bidirectional)
              for layer in model.config.layers)
  owner, states = [-1] * len(rows), None
  if not window:
    prefixes, owner = _shared_contexts(rows)
    if prefixes:
      states = _prefix_states(call, model, path, prefixes, units)
      # The rest of each such row, read from its context's state.
      rows = [row if at < 0 else Row(row.ids[row.start - 1:], 1)
              for row, at in zip(rows, owner)]
  lengths = [len(row.ids) for row in rows]
  logprobs = [0.0] * len(rows)
  greedy = [True] * len(rows)
  for members, width, batch in batches(lengths, model.vocab_size,
                                       path == paths.XLA, units):
    # At least two columns: one position to score (a row of one id scores
    # nothing, and its padding column is never read).
    width = max(width, 2)
    ids = np.zeros([batch, width], np.int32)
    for slot, index in enumerate(members):
      ids[slot, :lengths[index]] = rows[index].ids
    if window:
      extra = np.int32(window)
    else:
      extra = tf.nest.map_structure(
          lambda spec: np.zeros([batch, spec.shape[1]], np.float32),
          functions_lib.state_spec(model))
      if states is not None:
        for slot, index in enumerate(members):
          if owner[index] >= 0:
            for target, value in zip(tf.nest.flatten(extra),
                                     tf.nest.flatten(states)):
              target[slot] = value[owner[index]]
    token_logprobs, token_greedy = call(name, ids, extra)
    token_logprobs = token_logprobs.numpy().astype(np.float64)
    token_greedy = token_greedy.numpy()
    for slot, index in enumerate(members):
      # Position t scores id t+1: ids start..T-1 are positions start-1..T-2.
      scored = slice(rows[index].start - 1, lengths[index] - 1)
      logprobs[index] = float(token_logprobs[slot, scored].sum())
      greedy[index] = bool(token_greedy[slot, scored].all())
  return Scores(logprobs, greedy)


def check_fits(model, longest: int, name: str) -> None:
  """Refuses rows whose one-row call cannot fit in memory.

  Raises:
    errors.ArgumentError: naming `name`, with the estimate.
  """
  need = longest * model.vocab_size * 4 * _LOGIT_COPIES
  have = host.available_memory_bytes()
  if have is not None and need > have:
    raise errors.ArgumentError(
        name, f"{name}: a text of {longest} tokens needs about "
        f"{need / 2**30:.1f} GiB for its logits but only "
        f"{have / 2**30:.1f} GiB is available; score it in shorter pieces")
