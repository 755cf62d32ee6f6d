"""Generator: the whole generation of a batch as one compiled TensorFlow call.

One call of the compiled function does, on device:

  1. prime: each row runs over its own prompt except the last character
     (`Network.unroll` with a mask, so padding never touches a row's state);
  2. decode: a `tf.while_loop` over steps that feeds the last id through
     embedding-table gather -> cells -> dense -> sampling, appends the new id to
     a TensorArray and advances the stop automaton; the loop ends after
     `num_steps` or when every row has met a stop string.

Three ways to run it (`Generator(model, jit_compile=...)`):

  - `True` ("xla"): the whole function is one XLA program. Fastest for float32
    (fewest dispatches per step; XLA's float32 dots are as fast as TF's).
  - `False` ("graph"): plain TensorFlow graph, no XLA anywhere.
  - `"elementwise"`: a TensorFlow graph loop whose matmuls are TF (oneDNN) ops,
    with each cell's gate math and the sampling/stopping tail compiled by XLA as
    small programs. For bfloat16 at large batches: oneDNN runs bf16 matmuls on
    AMX (XLA's CPU backend does not), and the XLA pieces fuse what would
    otherwise be ~20 graph ops per step.

Only the final ids cross to the host. Every tunable (prompt lengths, batch
size, steps, temperature, top-k, top-p, seeds, stop strings) is a tensor of a
fixed signature, so nothing retraces; under XLA the executable is compiled per
input *shape*, so prompt lengths and output buffers are padded to buckets
(see `bucket`) to keep those compilations few.

Streaming continues a generation chunk by chunk with the state carried on
device between calls; the sampling noise is keyed by the global step, so the
chunks join into exactly the one-shot text.
"""

import dataclasses
import os
from typing import Iterator, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from rnnstep import cells
from rnnstep import sampling
from rnnstep import stopping

# Bytes kept per generated character and row, all copies included (the id
# buffer on device and its stacked copy, int32 each; the host id array; the
# decoded str), for refusing runs that cannot fit before anything is allocated.
BYTES_PER_GENERATED_CHAR = 16

# The paths `jit_compile` names (see the module docstring).
XLA, GRAPH, ELEMENTWISE = "xla", "graph", "elementwise"


def mode_name(jit_compile) -> str:
  """Maps a `jit_compile` value (True, False or "elementwise") to its path.

  Raises:
    ValueError: any other value.
  """
  if isinstance(jit_compile, (bool, np.bool_)):
    return XLA if jit_compile else GRAPH
  if isinstance(jit_compile, str) and jit_compile == ELEMENTWISE:
    return ELEMENTWISE
  raise ValueError(f"jit_compile must be True, False, {ELEMENTWISE!r} or None, "
                   f"got {jit_compile!r}")


def bucket(n: int, minimum: int = 16) -> int:
  """Rounds n up so that at most ~25% is padding: few distinct XLA shapes."""
  n = max(int(n), minimum)
  granule = max(1 << max(n.bit_length() - 3, 0), 1)
  return -(-n // granule) * granule


def available_memory_bytes() -> Optional[int]:
  """MemAvailable from /proc/meminfo (None where unknown)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def check_output_fits(batch_size: int, num_steps: int) -> None:
  """Refuses a run whose output cannot fit in memory, before allocating it.

  Raises:
    ValueError: with the estimate and what is available.
  """
  need = batch_size * num_steps * BYTES_PER_GENERATED_CHAR
  have = available_memory_bytes()
  if have is not None and need > have:
    raise ValueError(
        f"{batch_size} rows x {num_steps} steps need about {need / 2**30:.1f} GiB "
        f"for the output but only {have / 2**30:.1f} GiB is available; generate "
        "fewer rows or steps, or stream the output in chunks")


@dataclasses.dataclass
class Carry:
  """What a continued generation carries between chunks (device tensors)."""
  state: tuple
  last_ids: tf.Tensor
  stop_state: tf.Tensor
  done: tf.Tensor
  next_step: int


class Generator(tf.Module):
  """Compiled generation over a `Model`.

  Research code can also drive the model directly: `zero_state(batch)` and the
  compiled `step(ids, state) -> (logits, state)` run one timestep over explicit
  state, the same cell code the loop uses.

  The compiled functions, for use inside other graphs (export, tf.distribute):

    generate_fn(prompt_ids [B, T], prompt_lengths [B], num_steps, buffer_shape,
                temperature, top_k, top_p, seeds [B], seed_index [B],
                stop_table [S, V], stop_accept [S]) -> dict
    continue_fn(state, last_ids, stop_state, done, start_step, num_steps,
                buffer_shape, <the same sampling arguments>) -> dict

  The dict holds "ids" [B, capacity], "lengths" [B] (valid ids per row),
  "steps", and what a continuation needs: "state", "last_ids", "stop_state",
  "done". `buffer_shape` only carries the output capacity in its shape (XLA
  needs it static); in graph mode pass an empty one.

  Args:
    model: an `rnnstep.Model`.
    jit_compile: True compiles the functions with XLA; False runs them as TF
      graphs; "elementwise" runs TF graphs with the elementwise parts compiled
      by XLA (see the module docstring).

  Attributes:
    mode: "xla", "graph" or "elementwise".
    jit_compile: whether each function is one XLA program (mode "xla").
  """

  def __init__(self, model, jit_compile=True):
    super().__init__(name=f"{model.name}_generator")
    self.model = model
    self.mode = mode_name(jit_compile)
    self.jit_compile = self.mode == XLA
    vocab_size = model.vocab_size
    banned = np.zeros([vocab_size], np.float32)
    if model.has_unk:
      banned[0] = -np.inf
    self._banned = tf.constant(banned) if model.has_unk else None
    state_spec = tuple(
        tuple(tf.TensorSpec([None, units], tf.float32) for units in sizes)
        for sizes in self._state_sizes())
    sampling_spec = [
        tf.TensorSpec([], tf.float32, name="temperature"),
        tf.TensorSpec([], tf.int32, name="top_k"),
        tf.TensorSpec([], tf.float32, name="top_p"),
        tf.TensorSpec([None], tf.int64, name="seeds"),
        tf.TensorSpec([None], tf.int32, name="seed_index"),
        tf.TensorSpec([None, vocab_size], tf.int32, name="stop_table"),
        tf.TensorSpec([None], tf.bool, name="stop_accept"),
    ]
    buffer_spec = [tf.TensorSpec([], tf.int32, name="num_steps"),
                   tf.TensorSpec([None], tf.bool, name="buffer_shape")]
    jit = self.jit_compile
    # autograph=False: the bodies use tf.while_loop/tf.cond explicitly, and
    # skipping autograph's source conversion cuts the first trace from ~1.6 s
    # to ~0.2 s (measured).
    self.generate_fn = tf.function(
        self._generate_impl, jit_compile=jit, autograph=False, input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="prompt_ids"),
            tf.TensorSpec([None], tf.int32, name="prompt_lengths"),
            *buffer_spec, *sampling_spec])
    self.continue_fn = tf.function(
        self._continue_impl, jit_compile=jit, autograph=False, input_signature=[
            state_spec,
            tf.TensorSpec([None], tf.int32, name="last_ids"),
            tf.TensorSpec([None], tf.int32, name="stop_state"),
            tf.TensorSpec([None], tf.bool, name="done"),
            tf.TensorSpec([], tf.int32, name="start_step"),
            *buffer_spec, *sampling_spec])
    self.step = tf.function(
        self._step_impl, jit_compile=jit, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.int32, name="ids"), state_spec])

  def _state_sizes(self):
    return [cells.state_sizes(layer) for layer in self.model.config.layers]

  def zero_state(self, batch_size: int):
    """The zero state for `batch_size` rows: one tuple of `[B, U]` per layer."""
    return tuple(tuple(tf.zeros([batch_size, u]) for u in sizes)
                 for sizes in self._state_sizes())

  # -- compiled bodies -------------------------------------------------------

  def _network(self):
    return self.model.network(compile_elementwise=self.mode == ELEMENTWISE)

  def _step_impl(self, ids, state):
    return self._network().step(ids, state)

  def _generate_impl(self, prompt_ids, prompt_lengths, num_steps, buffer_shape,
                     temperature, top_k, top_p, seeds, seed_index, stop_table,
                     stop_accept):
    network = self._network()
    batch = tf.shape(prompt_ids)[0]
    # Prime over all but each row's last character; that one is the first input.
    # (The unroll spans every column, so it is never empty; masked steps are free
    # of effect on a row's state.)
    mask = (tf.range(tf.shape(prompt_ids)[1])[None, :]
            < (prompt_lengths[:, None] - 1))
    _, state = network.unroll(prompt_ids, network.zero_state(batch), mask)
    last_ids = tf.gather(prompt_ids, prompt_lengths - 1, batch_dims=1)
    return self._decode(network, state, last_ids,
                        tf.zeros([batch], tf.int32), tf.zeros([batch], tf.bool),
                        tf.constant(0), num_steps, buffer_shape, temperature,
                        top_k, top_p, seeds, seed_index, stop_table, stop_accept)

  def _continue_impl(self, state, last_ids, stop_state, done, start_step,
                     num_steps, buffer_shape, temperature, top_k, top_p, seeds,
                     seed_index, stop_table, stop_accept):
    return self._decode(self._network(), state, last_ids, stop_state, done,
                        start_step, num_steps, buffer_shape, temperature, top_k,
                        top_p, seeds, seed_index, stop_table, stop_accept)

  def _decode(self, network, state, last_ids, stop_state, done, start_step,
              num_steps, buffer_shape, temperature, top_k, top_p, seeds,
              seed_index, stop_table, stop_accept):
    params = sampling.SamplingParams(temperature, top_k, top_p)
    keys = sampling.row_keys(seeds, seed_index)
    batch = tf.shape(last_ids)[0]
    if self.jit_compile:
      # XLA needs a static size: the buffer's shape is a compile-time constant.
      ids = tf.TensorArray(tf.int32, size=tf.shape(buffer_shape)[0],
                           element_shape=[None])
    else:
      ids = tf.TensorArray(tf.int32, size=0, dynamic_size=True,
                           element_shape=[None])
    lengths = tf.zeros([batch], tf.int32)
    banned = self._banned

    def choose(logits, t, stop_state, done, lengths, params, keys, stop_table,
               stop_accept):
      """Samples the next ids and advances the stop automaton and lengths."""
      chosen = sampling.next_ids(logits, params, keys, start_step + t, banned)
      stop_state = tf.gather_nd(stop_table, tf.stack([stop_state, chosen], 1))
      lengths = tf.where(done, lengths, t + 1)
      done = done | tf.gather(stop_accept, stop_state)
      return chosen, stop_state, done, lengths

    if self.mode == ELEMENTWISE:
      choose = tf.function(choose, jit_compile=True, autograph=False)

    def cond(t, state, inputs, stop_state, done, lengths, ids):
      del state, inputs, stop_state, lengths, ids
      return (t < num_steps) & tf.logical_not(tf.reduce_all(done))

    def body(t, state, inputs, stop_state, done, lengths, ids):
      logits, state = network.step(inputs, state)
      chosen, stop_state, done, lengths = choose(
          logits, t, stop_state, done, lengths, params, keys, stop_table,
          stop_accept)
      return t + 1, state, chosen, stop_state, done, lengths, ids.write(t, chosen)

    steps, state, last_ids, stop_state, done, lengths, ids = tf.while_loop(
        cond, body, (tf.constant(0), state, last_ids, stop_state, done, lengths,
                     ids))
    return {"ids": tf.transpose(ids.stack()), "lengths": lengths,
            "steps": steps, "state": state, "last_ids": last_ids,
            "stop_state": stop_state, "done": done}

  # -- host side ---------------------------------------------------------------

  def _buffer(self, num_steps: int) -> np.ndarray:
    size = bucket(num_steps) if self.jit_compile else 0
    return np.zeros([size], bool)

  def _stop_tables(self, stop: Sequence[str]):
    sequences = []
    for text in stop:
      if not text:
        raise ValueError("a stop string is empty; give at least one character")
      try:
        sequences.append(self.model.encode(text))
      except ValueError as e:
        raise ValueError(f"stop string {text!r} can never be generated: {e}") \
            from None
    return stopping.stop_automaton(sequences, self.model.vocab_size)

  def _sampling_args(self, batch, temperature, top_k, top_p, seed, stop):
    seeds, index = seed_rows(seed, batch)
    table, accept = self._stop_tables(stop)
    return (np.float32(temperature), np.int32(top_k), np.float32(top_p),
            seeds, index, table, accept)

  def prompt_batch(self, prompts: Sequence[str]):
    """Encodes prompts into padded ids `[B, T]` and lengths `[B]`.

    Raises:
      ValueError: an empty prompt or one with a character outside the vocab.
    """
    encoded = []
    for i, prompt in enumerate(prompts):
      if not isinstance(prompt, str):
        raise ValueError(f"prompt {i} is a {type(prompt).__name__}, not a str")
      if not prompt:
        raise ValueError(f"prompt {i} is empty; give at least one character")
      try:
        encoded.append(self.model.encode(prompt))
      except ValueError as e:
        raise ValueError(f"prompt {i}: {e}") from None
    lengths = np.array([len(e) for e in encoded], np.int32)
    width = int(lengths.max())
    if self.jit_compile:
      width = bucket(width, minimum=8)
    ids = np.zeros([len(encoded), width], np.int32)
    for row, e in enumerate(encoded):
      ids[row, :len(e)] = e
    return ids, lengths

  def generate_ids(self, prompts: Sequence[str], num_steps: int, *,
                   temperature=1.0, top_k=0, top_p=1.0, seed=None,
                   stop=(), strategy=None) -> List[np.ndarray]:
    """Generates continuations as id arrays, one per prompt, in one device call.

    Arguments are as for `rnnstep.generate` (already validated there).

    Returns:
      One int32 array per prompt; a row that met a stop string ends with it.
    """
    prompt_ids, lengths = self.prompt_batch(prompts)
    args = self._sampling_args(len(prompts), temperature, top_k, top_p, seed, stop)
    if num_steps == 0:
      return [np.zeros([0], np.int32) for _ in prompts]
    check_output_fits(len(prompts), num_steps)
    steps, buffer = np.int32(num_steps), self._buffer(num_steps)
    if strategy is not None:
      return self._generate_distributed(strategy, prompt_ids, lengths, steps,
                                        buffer, *args)
    out = self.generate_fn(prompt_ids, lengths, steps, buffer, *args)
    ids, row_lengths = out["ids"].numpy(), out["lengths"].numpy()
    return [ids[row, :n] for row, n in enumerate(row_lengths)]

  def _generate_distributed(self, strategy, prompt_ids, lengths, num_steps,
                            buffer, temperature, top_k, top_p, seeds, index,
                            stop_table, stop_accept):
    """Splits the rows evenly over the strategy's replicas; results in order.

    Every row keeps its own (seed, index) key, so the text equals the
    single-device text. Rows are padded with copies of row 0 to fill the last
    replica; the copies are dropped.
    """
    replicas = strategy.num_replicas_in_sync
    batch = len(lengths)
    per_replica = -(-batch // replicas)
    padding = per_replica * replicas - batch

    def padded(array):
      return np.concatenate([array, np.repeat(array[:1], padding, 0)])

    def split(array):
      array = padded(array)
      return strategy.experimental_distribute_values_from_function(
          lambda ctx: tf.constant(array[ctx.replica_id_in_sync_group * per_replica:
                                        (ctx.replica_id_in_sync_group + 1)
                                        * per_replica]))

    def replica_fn(*args):
      out = self.generate_fn(*args)
      ids = out["ids"]
      # Every replica's buffer gets the same width (graph mode stops early when
      # all its rows have stopped), so the replicas' rows can be gathered.
      ids = tf.pad(ids, [[0, 0], [0, tf.maximum(num_steps - tf.shape(ids)[1], 0)]])
      return ids, out["lengths"]

    # A plain callable: the strategy then calls it once per replica with that
    # replica's values (it would hand a tf.function the PerReplica wrappers).
    ids, lengths = strategy.run(replica_fn, args=(
        split(prompt_ids), split(lengths), num_steps, buffer, temperature, top_k,
        top_p, split(seeds), split(index), stop_table, stop_accept))
    # gather (not local results) so that every worker of a multi-worker
    # strategy gets all rows.
    ids = strategy.gather(ids, axis=0).numpy()
    lengths = strategy.gather(lengths, axis=0).numpy()
    return [ids[row, :n] for row, n in enumerate(lengths[:batch])]

  def stream_ids(self, prompts: Sequence[str], num_steps: int, chunk_size: int,
                 *, temperature=1.0, top_k=0, top_p=1.0, seed=None,
                 stop=()) -> Iterator[List[np.ndarray]]:
    """Like `generate_ids`, yielding each row's new ids every `chunk_size` steps.

    The state stays on device between chunks; joined, the chunks equal the
    one-shot result for the same arguments.
    """
    prompt_ids, lengths = self.prompt_batch(prompts)
    batch = len(prompts)
    args = self._sampling_args(batch, temperature, top_k, top_p, seed, stop)
    check_output_fits(batch, min(chunk_size, max(num_steps, 1)))
    carry = None
    while (carry.next_step if carry else 0) < num_steps:
      start = carry.next_step if carry else 0
      steps = min(chunk_size, num_steps - start)
      buffer = self._buffer(chunk_size)
      if carry is None:
        out = self.generate_fn(prompt_ids, lengths, np.int32(steps), buffer, *args)
      else:
        out = self.continue_fn(carry.state, carry.last_ids, carry.stop_state,
                               carry.done, np.int32(start), np.int32(steps),
                               buffer, *args)
      ids, row_lengths = out["ids"].numpy(), out["lengths"].numpy()
      yield [ids[row, :n] for row, n in enumerate(row_lengths)]
      carry = Carry(out["state"], out["last_ids"], out["stop_state"],
                    out["done"], start + steps)
      if bool(tf.reduce_all(out["done"])):
        return


def seed_rows(seed, batch_size: int):
  """Maps the `seed` argument to per-row (seed, index) pairs.

  - None: a fresh random seed, rows indexed 0..B-1;
  - an int s: row i uses (s, i);
  - a sequence of B ints: row i uses (seeds[i], 0), so a row can be reproduced
    alone with its own seed.

  Returns:
    `(seeds int64 [B], index int32 [B])`.
  """
  if seed is None:
    seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
  if isinstance(seed, (int, np.integer)):
    return (np.full([batch_size], seed, np.int64),
            np.arange(batch_size, dtype=np.int32))
  seeds = np.asarray(list(seed), np.int64)
  if seeds.shape != (batch_size,):
    raise ValueError(f"seed lists {seeds.size} seeds for {batch_size} prompts; "
                     "give one int, or one per prompt")
  return seeds, np.zeros([batch_size], np.int32)
