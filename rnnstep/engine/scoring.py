"""Teacher-forced log-probabilities of given ids, batched by length bucket.

The compiled work of `rnnstep.loglikelihood` and
`rnnstep.loglikelihood_rolling`: rows of ids of any lengths are sorted by
length, grouped by `request.bucket` of their length and cut into batches;
each batch is one call of a compiled function of ids `[B, T]` (right-padded)
that returns, at every position t, the log-probability of id t+1 after ids
0..t from a zero state and whether it is the greedy choice there. The host
sums each row's scored positions in float64.

Every path runs it: "graph" (a TF graph: exact shapes, never retraced),
"xla" (one XLA program per padded shape: the length to its bucket, the batch
to `request.batch_bucket`) and "elementwise" (a TF graph whose gate math is
XLA-compiled, as generation's). The function is built once per
architecture and path and takes the model's weights at each call, like the
generation programs.

A model that generates over windows (`window.py`) is scored over the same
windows: position t's logits are those after the last k ids up to t, as its
generation sees them.
"""

from typing import List, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from rnnstep.decoding import pipeline
from rnnstep.decoding import sampling
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import recompute
from rnnstep.engine import request as request_lib
from rnnstep.engine import window as window_lib
from rnnstep import errors
from rnnstep.model import network as network_lib

# How many logits (batch x positions x vocabulary) one call holds at most:
# the batch of a length bucket is cut to fit (64 MiB of float32; the call
# holds a few such tensors at its peak). A row longer than this alone still
# runs, one row a call, if memory allows (`check_fits`).
LOGITS_PER_CALL = 1 << 24
# The largest batch of one call: past it a bigger batch measured no faster
# (the unroll's matmuls are already wide).
MAX_BATCH = 256
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


def function(model, path: str, windowed: bool) -> network_lib.BoundFunction:
  """The compiled `ids [B, T] (, window []) -> (logprobs, greedy)`.

  Args:
    model: the Model.
    path: a concrete path (`paths.CONCRETE`).
    windowed: whether it scores over windows (its second argument, int32
      `[]`, is the window k > 0).

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

    def network_of(weights):
      return network_lib.network_of(
          architecture, weights,
          compile_elementwise=path == paths.ELEMENTWISE,
          one_xla_program=path == paths.XLA)

    def stepped(weights, ids):
      network = network_of(weights)
      outputs, _ = network.unroll(ids[:, :-1],
                                  network.zero_state(tf.shape(ids)[0]))
      return scores_of(network, ids, network.logits(outputs))

    def over_windows(weights, ids, window):
      network = network_of(weights)
      score = (recompute.score if architecture.config.recomputes
               else window_lib.score)
      return scores_of(network, ids, score(network, ids[:, :-1], window))

    specs = [model.weights_spec(), tf.TensorSpec([None, None], tf.int32)]
    if windowed:
      specs.append(tf.TensorSpec([], tf.int32))
    return tf.function(over_windows if windowed else stepped,
                       jit_compile=path == paths.XLA, autograph=False,
                       input_signature=specs)

  name = f"loglikelihood/{path}/{'windows' if windowed else 'stepped'}"
  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, name, build),
      model.network_weights)


def batches(lengths: Sequence[int], vocab_size: int, xla: bool):
  """Splits rows into calls: `(row indices, padded T, padded B)` each.

  Rows are sorted by length and grouped by `request.bucket` of it (at most
  ~25% padding); a group is cut into batches of at most `MAX_BATCH` rows and
  `LOGITS_PER_CALL` logits. Under XLA every call's shape is its bucket's
  width and a power-of-two batch (`request.batch_bucket`): few programs.
  Elsewhere a call is exactly as wide as its longest row.
  """
  order = np.argsort(np.asarray(lengths), kind="stable")
  groups = {}
  for index in order.tolist():
    width = request_lib.bucket(lengths[index], request_lib.MIN_WIDTH)
    groups.setdefault(width, []).append(index)
  calls = []
  for width, members in groups.items():
    fits = max(1, LOGITS_PER_CALL // (width * vocab_size))
    size = min(MAX_BATCH, fits)
    if xla:  # A power of two: the full batches share one program.
      size = 1 << (size.bit_length() - 1)
    for begin in range(0, len(members), size):
      rows = members[begin:begin + size]
      if xla:
        calls.append((rows, width, request_lib.batch_bucket(len(rows))))
      else:
        calls.append((rows, max(lengths[i] for i in rows), len(rows)))
  return calls


def score(model, path: str, rows: Sequence[Row], window: int = 0) -> Scores:
  """Scores rows of ids, one compiled call per batch (`batches`).

  Args:
    model: the Model.
    path: a concrete path.
    rows: the `Row`s (checked: ids in range, start >= 1).
    window: k > 0 scores over windows of the last k ids; 0 over the whole
      row from a zero state.

  Returns:
    The `Scores`, in the rows' order.
  """
  compiled = function(model, path, windowed=bool(window))
  extra = (np.int32(window),) if window else ()
  lengths = [len(row.ids) for row in rows]
  logprobs = [0.0] * len(rows)
  greedy = [True] * len(rows)
  for members, width, batch in batches(lengths, model.vocab_size,
                                       path == paths.XLA):
    # At least two columns: one position to score (a row of one id scores
    # nothing, and its padding column is never read).
    width = max(width, 2)
    ids = np.zeros([batch, width], np.int32)
    for slot, index in enumerate(members):
      ids[slot, :lengths[index]] = rows[index].ids
    token_logprobs, token_greedy = compiled(ids, *extra)
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
