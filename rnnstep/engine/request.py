"""The generation request: one typed description of what to generate.

A `Request` is a nest of tensors (prompts, per-row sampling settings and seeds,
the stop automaton, the step count and the output capacity). It is the
`input_signature` of the compiled generation functions (`spec`), and `build`
is the one function that makes one, for every caller: `rnnstep.generate` and
`stream` (host values), tf.distribute (which splits a built request by rows)
and the SavedModel export (inside the serving graph). `build` is written in
TensorFlow ops, so it runs eagerly on host values and traces into a graph alike.

Shapes are bucketed here, once, for the paths that compile per shape:

  - `capacity`, the length of the output buffer, is
    `bucket(num_steps, MIN_CAPACITY)` on every path. Under XLA it is a
    compile-time constant (XLA compiles once per distinct value), in graph
    mode the size of the TensorArray; either way it means the same thing and
    the loop never writes past it.
  - With `bucket_shapes`, the stop automaton's and the regex DFA's state
    counts are padded to a bucket with unreachable states, so a new set of
    stop strings or a new pattern compiles nothing new.
  - With `bucket_shapes` (the XLA path), the prompt width is padded to
    `bucket(width, MIN_WIDTH)` and the batch to `batch_bucket(batch)` with
    copies of row 0, so a sweep over batch sizes 1..64 compiles 7 programs.
    Rows never interact, so padding never changes a real row; callers keep
    the first `batch` rows of the result.
  - With `chunked_prompts` too (a model that unrolls block by block, RWKV-7,
    whose XLA program primes in chunks of `PRIME_CHUNK` columns,
    `loop.prime`), the prompt width is padded to a power of two instead
    (`chunked_width`): one program serves every prompt from half its width
    up, and padding costs at most one chunk's priming.

`Carry` is what a continued generation (streaming) carries between calls.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.decoding import processors
from rnnstep.decoding import sampling as sampling_lib
from rnnstep.decoding import stopping


@dataclasses.dataclass(frozen=True)
class Options:
  """A generation's settings as the API checked them (Python values).

  `host.build_request` (`Generator.request`) turns them, with the prompts, into a `Request`
  (through `build`). The SavedModel's serving graph fills the fields it serves
  with scalar tensors instead, checked there in the graph.

  Attributes:
    sampling: `sampling_lib.Params` of scalars, or of one value per prompt.
    seed: None, an int, or one int per prompt (see `host.seed_rows`).
    stop: stop strings.
    repetition_window: see `processors.Settings`.
    no_repeat_ngram_size: see `processors.Settings`.
    num_beams: beam width (1: sample).
    length_penalty: see `Beams`.
    num_return_sequences: hypotheses returned per prompt (<= num_beams).
    return_scores: also return each sequence's log-likelihood.
    initial_state: None (the zero state), or the state each row's prompt is
      primed from: one tuple of float32 `[B, U]` arrays per layer (checked by
      `api.check_initial_state`).
    window: 0 steps the model statefully; k > 0 reads it in windows of the
      last k characters (`window.py`; the API resolves the model's default).
    regex: one pattern (None: none) per prompt, or () for none
      (`constraints.check`).
  """
  sampling: sampling_lib.Params = sampling_lib.DEFAULTS
  seed: Any = None
  stop: Sequence[str] = ()
  repetition_window: int = 0
  no_repeat_ngram_size: int = 0
  num_beams: int = 1
  length_penalty: float = 1.0
  num_return_sequences: int = 1
  return_scores: bool = False
  initial_state: Any = None
  window: int = 0
  regex: Sequence[Any] = ()


class Prompts(NamedTuple):
  """Encoded prompts: `ids` int32 `[B, T]` right-padded, `lengths` int32 `[B]` >= 1."""
  ids: tf.Tensor
  lengths: tf.Tensor


class Seeds(NamedTuple):
  """Row noise keys' sources: `seeds` int64 `[B]`, `index` int32 `[B]`.

  For `seed=s` row i uses (s, i); with a list of seeds row i uses (seeds[i], 0),
  so that a row reproduces alone (see `sampling.row_keys`).
  """
  seeds: tf.Tensor
  index: tf.Tensor


class Beams(NamedTuple):
  """Beam search settings (`beams.py`), shared by all rows.

  Attributes:
    num_beams: int32 `[]`, k (1 = sampling; the beam function needs k > 1).
      Under XLA a compile-time constant.
    length_penalty: float32 `[]`, finished hypotheses rank by
      score / length**length_penalty.
  """
  num_beams: tf.Tensor
  length_penalty: tf.Tensor


class Request(NamedTuple):
  """One generation, as tensors.

  Attributes:
    prompts: the `Prompts` (per row).
    initial_state: the state each row's priming starts from (per row): one
      tuple of float32 `[B, U]` per layer (zeros unless the caller gave one).
    sampling: `sampling_lib.Params`, each `[B]` (per row).
    seeds: the `Seeds` (per row).
    stops: `stopping.Automaton` (shared by all rows; the serving engine
      joins its rows' automata into one, each row starting at its own
      state, `Carry.stop_state`).
    lookback: `processors.Settings` (shared by all rows; per row, `[B]`
      values, in the serving engine's `Programs.serve_fn`).
    beams: `Beams` (shared; read by the beam search function only).
    want_scores: bool `[]`, accumulate each row's log-likelihood.
    num_steps: int32 `[]`, the steps to run (<= capacity).
    capacity: int32 `[]`, the output buffer's length.
    constraint: the `constraints.Dfa` (its `start` per row, the rest
      shared).
  """
  prompts: Prompts
  initial_state: tuple
  sampling: sampling_lib.Params
  seeds: Seeds
  stops: stopping.Automaton
  lookback: processors.Settings
  beams: Beams
  want_scores: tf.Tensor
  num_steps: tf.Tensor
  capacity: tf.Tensor
  constraint: constraints.Dfa

  def map_rows(self, fn: Callable[[tf.Tensor], tf.Tensor]) -> "Request":
    """Applies `fn` to every per-row tensor (batch first); the rest is kept.

    The look-back settings are per row where they have a rank of 1 (the
    serving engine's, `spec(per_row_lookback=True)`), else shared.
    """
    lookback = self.lookback
    per_row = lambda x: fn(x) if len(x.shape) == 1 else x
    return self._replace(
        prompts=tf.nest.map_structure(fn, self.prompts),
        initial_state=tf.nest.map_structure(fn, self.initial_state),
        sampling=tf.nest.map_structure(fn, self.sampling),
        seeds=tf.nest.map_structure(fn, self.seeds),
        lookback=lookback._replace(
            repetition_window=per_row(lookback.repetition_window),
            no_repeat_ngram_size=per_row(lookback.no_repeat_ngram_size)),
        constraint=self.constraint._replace(start=fn(self.constraint.start)))


class Carry(NamedTuple):
  """What a generation hands to its continuation (device tensors).

  Attributes:
    state: the recurrent state, one tuple of `[B, U]` tensors per layer.
      On the xla and graph paths it has not yet consumed `last_ids`; on the
      elementwise path it has (`loop.choose_then_consume`): a carry
      continues only on the path that made it.
    last_ids: int32 `[B]`, each row's last id.
    stop_state: int32 `[B]`, each row's stop-automaton state.
    done: bool `[B]`, rows that have met a stop string.
    step: int32 `[]`, the global step the continuation starts at (`[B]`,
      one per row, for the serving engine's `Programs.serve_fn`: the noise
      of step t of a row is keyed by its own position, `sampling.py`).
    history: the `processors.History` (ids so far and the penalties' counts).
    scores: float32 `[B]`, each row's log-likelihood so far (0 unless the
      request wants scores).
    dfa_state: int32 `[B]`, each row's `constraints.Dfa` state.
  """
  state: tuple
  last_ids: tf.Tensor
  stop_state: tf.Tensor
  done: tf.Tensor
  step: tf.Tensor
  history: processors.History
  scores: tf.Tensor
  dfa_state: tf.Tensor


class Result(NamedTuple):
  """What a compiled generation returns.

  Attributes:
    ids: int32 `[B, capacity]`; row r's ids are `ids[r, :lengths[r]]`.
    lengths: int32 `[B]`, valid ids per row (a stopped row ends with its stop
      string).
    scores: float32 `[B]`, each row's log-likelihood of its ids (see
      `Carry.scores`).
    carry: the `Carry` for a continuation.
    logprobs: the serving engine's per-step log-probabilities, rows first
      (`pipeline.StepLogprobs` of `[B, capacity]` and `[B, capacity, K]`;
      written where `want_scores`), or `()` (every other caller).
  """
  ids: tf.Tensor
  lengths: tf.Tensor
  scores: tf.Tensor
  carry: Carry
  logprobs: Any = ()


# A state width that stands for a recomputed window's ids (`recompute.py`):
# that state tensor is int32 `[B, k]`, for any k, not float32 `[B, U]`.
WINDOW_IDS = "window_ids"


def _state_spec(state_sizes):
  return tuple(tuple(tf.TensorSpec([None, None], tf.int32)
                     if units == WINDOW_IDS else
                     tf.TensorSpec([None, units], tf.float32)
                     for units in sizes) for sizes in state_sizes)


def spec(vocab_size: int, state_sizes, *,
         per_row_lookback: bool = False) -> Request:
  """The `Request` of `TensorSpec`s: the compiled functions' signature.

  Args:
    vocab_size: V.
    state_sizes: per layer, the widths of its state tensors (`cells.state_sizes`).
    per_row_lookback: `repetition_window` and `no_repeat_ngram_size` are
      int32 `[B]`, one per row (the serving engine's rows come from
      different requests), not one `[]`.
  """
  rows = [None]
  lookback = rows if per_row_lookback else []
  return Request(
      prompts=Prompts(tf.TensorSpec([None, None], tf.int32, "prompt_ids"),
                      tf.TensorSpec(rows, tf.int32, "prompt_lengths")),
      initial_state=_state_spec(state_sizes),
      sampling=sampling_lib.Params(*[
          tf.TensorSpec(rows, dtype, name) for name, dtype
          in sampling_lib.PARAM_DTYPES._asdict().items()]),
      seeds=Seeds(tf.TensorSpec(rows, tf.int64, "seeds"),
                  tf.TensorSpec(rows, tf.int32, "seed_index")),
      stops=stopping.Automaton(
          tf.TensorSpec([None, vocab_size], tf.int32, "stop_table"),
          tf.TensorSpec([None], tf.bool, "stop_accept")),
      lookback=processors.Settings(
          tf.TensorSpec(lookback, tf.int32, "repetition_window"),
          tf.TensorSpec(lookback, tf.int32, "no_repeat_ngram_size"),
          tf.TensorSpec([], tf.int32, "history_length")),
      beams=Beams(tf.TensorSpec([], tf.int32, "num_beams"),
                  tf.TensorSpec([], tf.float32, "length_penalty")),
      want_scores=tf.TensorSpec([], tf.bool, "want_scores"),
      num_steps=tf.TensorSpec([], tf.int32, "num_steps"),
      capacity=tf.TensorSpec([], tf.int32, "capacity"),
      constraint=constraints.Dfa(
          tf.TensorSpec([None, vocab_size], tf.int32, "regex_table"),
          tf.TensorSpec([None], tf.bool, "regex_ends"),
          tf.TensorSpec(rows, tf.int32, "regex_start")))


def carry_spec(state_sizes, vocab_size: int, *,
               per_row_step: bool = False) -> Carry:
  """The `Carry` of `TensorSpec`s for per-layer state widths `state_sizes`.

  Args:
    state_sizes: per layer, the widths of its state tensors.
    vocab_size: V.
    per_row_step: `step` is int32 `[B]`, each row's own position (the
      serving engine's rows start at different moments), not one `[]`.
  """
  rows = [None]
  return Carry(
      state=_state_spec(state_sizes),
      last_ids=tf.TensorSpec(rows, tf.int32),
      stop_state=tf.TensorSpec(rows, tf.int32),
      done=tf.TensorSpec(rows, tf.bool),
      step=tf.TensorSpec(rows if per_row_step else [], tf.int32),
      history=processors.History(
          tf.TensorSpec([None, None], tf.int32),
          tf.TensorSpec(rows, tf.int32),
          tf.TensorSpec([None, vocab_size], tf.int32),
          tf.TensorSpec([None, vocab_size], tf.int32)),
      scores=tf.TensorSpec(rows, tf.float32),
      dfa_state=tf.TensorSpec(rows, tf.int32))


# The smallest output buffer and look-back history, in ids. Under XLA their
# lengths are compile-time constants, so every distinct bucket is a compile
# (seconds); 64 ids per row cost next to nothing per step (the loop runs
# `num_steps`, not `capacity`; the n-gram ban's one `[B, L]` compare), so
# every request of up to 64 steps (a stream's chunks, a short completion)
# shares one program.
MIN_CAPACITY = 64
# The smallest padded prompt width under XLA (a compile-time constant too):
# every prompt of up to 16 characters shares one program. Priming stops at the
# longest prompt, so padding costs only the batched input projection of the
# layers above the first.
MIN_WIDTH = 16
# The columns of a prompt that a model unrolling block by block (RWKV-7)
# primes at once under XLA (`loop.prime`): its big products run over a
# chunk's rows, and the loop over chunks stops at the chunk holding the
# longest prompt's end, so a width padded to a power of two costs at most
# one chunk more than the prompt itself. A prompt narrower than a chunk is
# one chunk of its own (bucketed) width. Each chunk reads the weights again:
# 128 primed a 512-token prompt of the 0.1B shape within noise of one unroll
# on a quiet 2-vCPU Zen 4, 64 10% slower.
PRIME_CHUNK = 128
# The columns a LiteRT artifact of such a model primes at once (`loop.prime`
# stepwise), its products over all of a chunk's rows and its state update
# unrolled (`RWKV7Cell.for_litert_converter`). A chunk reads the weights
# once, and its loop runs to the chunk holding the longest prompt's end,
# so a short prompt costs a whole chunk. On the 0.1B shape, one thread, a
# 2-vCPU Zen 5 (benchmarks/results/litert-chunked-priming-epyc-zen5-2026-12.md):
# a 512-token prompt primed at 1.86 ms a token in chunks of 32 and 2.44 in
# chunks of 16 (float32; int8 1.02 and 1.19; token by token 10.4 and 3.9),
# a 4-token prompt in 61 and 38 ms (int8 35 and 21; token by token 30 and
# 13); the conversion took as long.
STEPWISE_PRIME_CHUNK = 32


def chunk_columns(batch):
  """The columns of one priming chunk over `batch` rows in the server's
  calls (`loop.prime`'s `batch_sized_chunks`): `PRIME_CHUNK // batch`, at least
  `MIN_WIDTH` (`PRIME_CHUNK` for one row). The loop over chunks stops at the
  chunk holding the longest piece's end, and the rows a call admits
  together mostly prime short pieces (the text after a cached prefix: a
  chat's last message), whose padding up to the width cost as much as
  their own columns in a chunk of `PRIME_CHUNK`; a narrower chunk spares
  it, while its products still run over `PRIME_CHUNK` rows or more, so the
  weights are read once for as many rows as a single row's chunk has.
  `batch`: an int, or a scalar tensor (a compile-time constant under XLA,
  whose batch is bucketed)."""
  if isinstance(batch, int):
    return max(MIN_WIDTH, PRIME_CHUNK // max(batch, 1))
  return tf.maximum(MIN_WIDTH, PRIME_CHUNK // tf.maximum(batch, 1))


def bucket(n: int, minimum: int = 16) -> int:
  """Rounds n up so that at most ~25% is padding: few distinct XLA shapes."""
  n = max(int(n), minimum)
  granule = max(1 << max(n.bit_length() - 3, 0), 1)
  return -(-n // granule) * granule


def chunked_width(n: int) -> int:
  """The padded prompt width of a chunk-primed model under XLA: the power of
  two >= max(n, MIN_WIDTH) (a multiple of `PRIME_CHUNK` from it up)."""
  return 1 << (max(int(n), MIN_WIDTH) - 1).bit_length()


def batch_bucket(n: int) -> int:
  """The padded batch under XLA: a power of two up to 64, then `bucket(n, 64)`."""
  n = max(int(n), 1)
  if n <= 64:
    return 1 << (n - 1).bit_length()
  return bucket(n, 64)


def _bucket_tensor(n: tf.Tensor, minimum: int) -> tf.Tensor:
  """`bucket` in TensorFlow ops (int32 scalar in and out), for `build`."""
  n = tf.maximum(tf.cast(n, tf.int64), minimum)
  powers = tf.bitwise.left_shift(tf.constant(1, tf.int64),
                                 tf.range(63, dtype=tf.int64))
  bit_length = tf.reduce_sum(tf.cast(n >= powers, tf.int64))
  granule = tf.bitwise.left_shift(tf.constant(1, tf.int64),
                                  tf.maximum(bit_length - 3, 0))
  rounded = (n + granule - 1) // granule * granule
  return tf.cast(tf.minimum(rounded, np.iinfo(np.int32).max), tf.int32)


def _chunked_width_tensor(n: tf.Tensor) -> tf.Tensor:
  """`chunked_width` in TensorFlow ops."""
  powers = tf.bitwise.left_shift(1, tf.range(31))
  return tf.reduce_min(tf.where(powers >= tf.maximum(n, MIN_WIDTH), powers,
                                powers[-1]))


def _batch_bucket_tensor(n: tf.Tensor) -> tf.Tensor:
  """`batch_bucket` in TensorFlow ops."""
  powers = tf.constant([1, 2, 4, 8, 16, 32, 64], tf.int32)
  power = tf.reduce_min(tf.where(powers >= n, powers, 64))
  return tf.where(n <= 64, power, _bucket_tensor(n, 64))


class _ArrayOps(NamedTuple):
  """The few array operations `build` needs, on the host or in a graph.

  On the host (eager callers) they are numpy, so building a request costs
  microseconds rather than dozens of eager TF ops (milliseconds); inside a
  graph (the SavedModel's serving function) they are TF ops.
  """
  array: Callable       # (value, tf dtype) -> array
  broadcast: Callable   # (scalar or [B] value, tf dtype, B) -> [B]
  rows: Callable        # (array) -> number of rows
  columns: Callable     # (array) -> number of columns
  bucket: Callable      # (n, minimum) -> `bucket(n, minimum)`
  batch_bucket: Callable
  chunked_width: Callable
  any: Callable         # (bool array) -> bool
  where: Callable       # (bool, a, b) -> a or b
  pad_columns: Callable  # (ids [B, T], width) -> [B, width]
  take_rows: Callable   # (array, index [R]) -> array[index]
  padded_row_index: Callable  # (B, R) -> [0, 1, .., B-1, 0, .., 0] (R long)
  zeros: Callable       # (rows, width) -> float32 zeros [rows, width]


_HOST = _ArrayOps(
    array=lambda value, dtype: np.asarray(value, dtype.as_numpy_dtype),
    broadcast=lambda value, dtype, rows: np.broadcast_to(
        np.asarray(value, dtype.as_numpy_dtype), [rows]),
    rows=lambda x: x.shape[0],
    columns=lambda x: x.shape[1],
    bucket=lambda n, minimum: np.int32(bucket(int(n), minimum)),
    batch_bucket=lambda n: batch_bucket(int(n)),
    chunked_width=lambda n: np.int32(chunked_width(int(n))),
    any=lambda x: bool(np.any(x)),
    where=lambda c, a, b: np.int32(a if c else b),
    pad_columns=lambda ids, width: np.pad(
        ids, [[0, 0], [0, width - ids.shape[1]]]),
    take_rows=lambda x, index: np.take(x, index, axis=0),
    padded_row_index=lambda batch, rows: np.concatenate(
        [np.arange(batch), np.zeros([rows - batch], np.int64)]),
    zeros=lambda rows, width: (np.zeros([rows, 0], np.int32)
                               if width == WINDOW_IDS else
                               np.zeros([rows, width], np.float32)))

_GRAPH = _ArrayOps(
    array=tf.convert_to_tensor,
    broadcast=lambda value, dtype, rows: tf.broadcast_to(
        tf.cast(value, dtype), [rows]),
    rows=lambda x: tf.shape(x)[0],
    columns=lambda x: tf.shape(x)[1],
    bucket=_bucket_tensor,
    batch_bucket=_batch_bucket_tensor,
    chunked_width=_chunked_width_tensor,
    any=tf.reduce_any,
    where=tf.where,
    pad_columns=lambda ids, width: tf.pad(
        ids, [[0, 0], [0, width - tf.shape(ids)[1]]]),
    take_rows=tf.gather,
    padded_row_index=lambda batch, rows: tf.concat(
        [tf.range(batch), tf.zeros([rows - batch], tf.int32)], 0),
    zeros=lambda rows, width: (tf.zeros([rows, 0], tf.int32)
                               if width == WINDOW_IDS else
                               tf.zeros([rows, width], tf.float32)))


def build(prompts: Prompts, num_steps, options: Options, *, seeds: Seeds,
          stops: stopping.Automaton, bucket_shapes: bool, state_sizes,
          constraint=None, capacity_steps=None, total_steps=None,
          chunked_prompts: bool = False) -> Request:
  """Builds the `Request` that the compiled generation functions take.

  Runs on host values (numpy arrays, Python numbers; the request is then
  numpy arrays, converted when the compiled function is called) or, inside a
  `tf.function`, traces into the graph (the SavedModel export), with the
  same result. It checks nothing: its callers pass checked values (the API's
  `Options`, or the serving graph's own checks).

  Args:
    prompts: the `Prompts` (int `[B, T]` right-padded ids, int `[B]` lengths,
      each >= 1), as host values or tensors.
    num_steps: int scalar, steps to generate.
    options: the `Options` whose fields a request holds: `sampling` (scalars,
      every row alike, or `[B]` values), `initial_state`,
      `repetition_window`, `no_repeat_ngram_size`, `num_beams`,
      `length_penalty` and `return_scores` (`repetition_window` and
      `no_repeat_ngram_size` one value, or `[B]` values for the serving
      engine's per-row signature). Its `seed`, `stop` and `regex`
      reach it as `seeds`, `stops` and `constraint`, which need the model to
      make; `window` and `num_return_sequences` are the caller's.
    seeds: the rows' `Seeds` (int64 `[B]` seeds, int32 `[B]` index).
    stops: the `stopping.Automaton`.
    bucket_shapes: pad the prompt width and the batch to buckets (XLA).
    state_sizes: per layer, the widths of its state tensors.
    constraint: the rows' `constraints.Dfa` (host arrays, or tensors in a
      served graph; default: none).
      Under `bucket_shapes` its states are padded to a bucket (unreachable
      `DEAD` rows), so a new pattern compiles nothing new.
    capacity_steps: the steps the output buffer must hold (default:
      num_steps); streaming sizes it for a whole chunk.
    total_steps: the steps of the whole generation (default: num_steps);
      streaming sizes the history for all its chunks.
    chunked_prompts: the model primes in chunks under XLA (RWKV-7,
      `loop.prime`): with `bucket_shapes`, the prompt width is padded to
      `chunked_width`, not `bucket`.

  Returns:
    The `Request`; its batch may be larger than `B` (padding rows at the end).
  """
  ops = _HOST if tf.executing_eagerly() else _GRAPH
  ids = ops.array(prompts.ids, tf.int32)
  lengths = ops.array(prompts.lengths, tf.int32)
  batch = ops.rows(ids)
  params = sampling_lib.Params(*[
      ops.broadcast(value, dtype, batch)
      for value, dtype in zip(options.sampling, sampling_lib.PARAM_DTYPES)])
  num_steps = ops.array(num_steps, tf.int32)
  capacity = ops.bucket(num_steps if capacity_steps is None
                        else capacity_steps, MIN_CAPACITY)
  if bucket_shapes:
    ids = ops.pad_columns(ids, ops.chunked_width(ops.columns(ids))
                          if chunked_prompts else
                          ops.bucket(ops.columns(ids), MIN_WIDTH))
  ngram = ops.array(options.no_repeat_ngram_size, tf.int32)
  looks_back = ops.any(ngram > 0)
  for option in options_lib.HISTORY_OPTIONS:
    if option.per_row:  # Their `active` reads no vocabulary size.
      looks_back = looks_back | ops.any(
          option.active(getattr(params, option.name), None))
  steps = num_steps if total_steps is None else ops.array(total_steps,
                                                          tf.int32)
  history_length = ops.where(
      looks_back, ops.bucket(ops.columns(ids) + steps, MIN_CAPACITY), 1)
  if options.initial_state is None:
    initial_state = tuple(tuple(ops.zeros(batch, units) for units in sizes)
                          for sizes in state_sizes)
  else:
    initial_state = tf.nest.map_structure(
        lambda x: ops.array(x, tf.float32),
        tuple(map(tuple, options.initial_state)))
  request = Request(
      prompts=Prompts(ids, lengths), initial_state=initial_state,
      sampling=params,
      seeds=Seeds(ops.array(seeds.seeds, tf.int64),
                  ops.array(seeds.index, tf.int32)),
      stops=_stop_states(ops, stops, bucket_shapes),
      lookback=processors.Settings(
          ops.array(options.repetition_window, tf.int32), ngram,
          history_length),
      beams=Beams(ops.array(options.num_beams, tf.int32),
                  ops.array(options.length_penalty, tf.float32)),
      want_scores=ops.array(options.return_scores, tf.bool),
      num_steps=num_steps, capacity=capacity,
      constraint=_constraint(ops, constraint, batch,
                             int(stops.table.shape[1]), bucket_shapes))
  if bucket_shapes:
    request = pad_rows(request, ops.batch_bucket(batch))
  return request


def pad_stop_states(stops: stopping.Automaton) -> stopping.Automaton:
  """A host automaton with its state count padded to `bucket(S, 16)`.

  The padding states are unreachable (no state leads to them) and never
  accept, so every row's stops are unchanged; under XLA the state count is a
  shape, so a new set of stop strings then compiles nothing new. A count
  already at a bucket is returned as it is (`bucket` is idempotent).
  """
  return stopping.Automaton(*pad_states(stops.table, stops.accept, 0))


def pad_states(table: np.ndarray, flags: np.ndarray, fill: int,
               states: int = 0):
  """A host state table `[S, V]` and its per-state flags `[S]`, padded to
  `states` (default: `bucket(S, 16)`) states whose moves all lead to `fill`
  and whose flags are False (unchanged when S is that many already). A
  table of tensors (built in a served graph) is padded in TensorFlow ops to
  `bucket(S, 16)`.

  Args:
    table: int32 `[S, V]`.
    flags: bool `[S]` (accepting, or ending).
    fill: the state every padding state's moves lead to.
    states: the padded count (>= S); 0: `bucket(S, 16)`.

  Returns:
    `(table, flags)`, padded.
  """
  if isinstance(table, tf.Tensor):  # The SavedModel's: built in its graph.
    padding = _bucket_tensor(tf.shape(flags)[0], 16) - tf.shape(flags)[0]
    return (tf.concat([table, tf.fill([padding, tf.shape(table)[1]],
                                      tf.constant(fill, table.dtype))], 0),
            tf.concat([flags, tf.zeros([padding], tf.bool)], 0))
  padding = (states or bucket(len(flags), 16)) - len(flags)
  if not padding:
    return table, flags
  return (np.concatenate([table, np.full([padding, table.shape[1]], fill,
                                         np.int32)]),
          np.concatenate([flags, np.zeros([padding], bool)]))


def _stop_states(ops, stops: stopping.Automaton,
                 bucket_shapes) -> stopping.Automaton:
  """The request's stop automaton, states bucketed under XLA."""
  if bucket_shapes:
    stops = pad_stop_states(stops)
  return stopping.Automaton(ops.array(stops.table, tf.int32),
                            ops.array(stops.accept, tf.bool))


def _constraint(ops, dfa, batch, vocab_size: int,
                bucket_shapes) -> constraints.Dfa:
  """The request's `constraints.Dfa`: given (host) or none, states bucketed."""
  if dfa is None:  # Every row FREE.
    free = constraints.unconstrained(1, vocab_size)
    return constraints.Dfa(ops.array(free.table, tf.int32),
                           ops.array(free.ends, tf.bool),
                           ops.broadcast(constraints.FREE, tf.int32, batch))
  table, ends = dfa.table, dfa.ends
  if bucket_shapes:  # Its state count is an XLA shape.
    table, ends = pad_states(table, ends, constraints.DEAD)
  return constraints.Dfa(ops.array(table, tf.int32), ops.array(ends, tf.bool),
                         ops.array(dfa.start, tf.int32))


def pad_rows(request: Request, rows) -> Request:
  """Pads every per-row array to `rows` rows with copies of row 0.

  Host arrays stay numpy; tensors stay tensors.
  """
  ops = _HOST if isinstance(request.prompts.lengths, np.ndarray) else _GRAPH
  index = ops.padded_row_index(ops.rows(request.prompts.lengths), rows)
  return request.map_rows(lambda x: ops.take_rows(x, index))
