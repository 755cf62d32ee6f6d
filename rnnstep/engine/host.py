"""The host side of a generation: prompts in, a request built, ids out.

`Generator` (`generator.py`) owns the compiled functions; this module owns
what happens around one call on the host: encoding prompts and stop strings,
building the `request.Request` from the checked options, refusing an output
that cannot fit in memory before anything is allocated, calling the compiled
function once (or once per chunk when streaming, or once per replica under
`tf.distribute`), and slicing each row's ids out of the result.
"""

import os
from typing import Iterator, List, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import stopping
from rnnstep.engine import request as request_lib
from rnnstep import errors

# Bytes kept per generated character and row, all copies included (the id
# buffer on device and its stacked copy, int32 each; the host id array; the
# decoded str), for refusing runs that cannot fit before anything is allocated.
BYTES_PER_GENERATED_CHAR = 16


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


# Stop strings to the automaton over a model's ids: TensorFlow-free, so that
# rnnstep-generate's warm path builds the same tables (`rnnstep.litert.inputs`).
stop_automaton = stopping.compile_stops


def check_ids(model, ids, where: str, argument: str = "prompts"
              ) -> np.ndarray:
  """A sequence of token ids checked against the model's vocabulary, as
  int32; each id outside it refused by its index.

  Raises:
    errors.ArgumentError: naming `argument`, e.g. "prompts[1][3] = 70000 is
      outside the vocabulary of 65536 ids (0 to 65535)".
  """
  array = np.asarray(ids)
  if array.dtype.kind not in "iu":
    array = array.astype(np.int64)
  outside = np.flatnonzero((array < 0) | (array >= model.vocab_size))
  if outside.size:
    j = int(outside[0])
    raise errors.ArgumentError(
        argument, f"{where}[{j}] = {int(array[j])} is outside the vocabulary "
        f"of {model.vocab_size} ids (0 to {model.vocab_size - 1})")
  return array.astype(np.int32)


def prompt_text(model, prompt) -> str:
  """A prompt as text: itself, or its token ids decoded (a recipe
  vocabulary's text starts from its prompt's words; a server echoes it)."""
  return prompt if isinstance(prompt, str) else model.decode(prompt)


def prompt_batch(model, prompts: Sequence[str]):
  """Encodes prompts into right-padded ids `[B, T]` and lengths `[B]`.

  A prompt of token ids (a tuple of int, `records.check_prompts`) is taken
  as it is, each id checked against the vocabulary.

  Raises:
    errors.ArgumentError: an empty prompt or one with a character outside the
      vocabulary; an id outside it.
  """
  encoded = []
  for i, prompt in enumerate(prompts):
    if isinstance(prompt, (tuple, list, np.ndarray)) and len(prompt):
      encoded.append(check_ids(model, prompt, f"prompts[{i}]"))
      continue
    if not isinstance(prompt, str):
      raise errors.ArgumentError(
          "prompts", f"prompt {i} is a {type(prompt).__name__}, not a str")
    if not prompt and "start" not in model.tokens.rules:  # Else one token.
      raise errors.ArgumentError(
          "prompts", f"prompt {i} is empty; give at least one character")
    try:
      encoded.append(model.encode(prompt))
    except ValueError as e:
      raise errors.ArgumentError("prompts", f"prompt {i}: {e}") from None
    if not len(encoded[-1]):  # A token model's prompt of no words.
      raise errors.ArgumentError(
          "prompts", f"prompt {i} ({prompt!r}) gives no tokens; give at "
          "least one word the model knows")
  lengths = np.array([len(e) for e in encoded], np.int32)
  ids = np.zeros([len(encoded), int(lengths.max())], np.int32)
  for row, e in enumerate(encoded):
    ids[row, :len(e)] = e
  return ids, lengths


def build_request(generator, prompts: Sequence[str], num_steps: int,
                  options: request_lib.Options = request_lib.Options(), *,
                  capacity_steps=None, total_steps=None) -> request_lib.Request:
  """Builds the `Request` for Python values (see `request.build`).

  Args:
    generator: the `Generator` it is for (its model and path).
    prompts: the prompts, as str or token ids (`prompt_batch`).
    num_steps: steps to generate (in this call).
    options: the `request.Options`.
    capacity_steps: the steps the output buffer must hold (streaming).
    total_steps: the steps of the whole generation (streaming).

  Returns:
    The Request; under XLA its batch is padded to a bucket.

  Raises:
    ValueError: an unusable prompt, stop string, seed list or pattern.
  """
  prompt_ids, lengths = prompt_batch(generator.model, prompts)
  seeds, index = seed_rows(options.seed, len(prompts))
  return request_lib.build(
      request_lib.Prompts(prompt_ids, lengths), num_steps, options,
      seeds=request_lib.Seeds(seeds, index),
      stops=stop_automaton(generator.model, options.stop),
      bucket_shapes=generator.jit_compile,
      chunked_prompts=generator.chunked_prompts,
      state_sizes=generator.state_sizes(),
      constraint=(constraints.combine(generator.model, options.regex)
                  if options.regex else None),
      capacity_steps=capacity_steps, total_steps=total_steps)


def generate_ids(generator, prompts: Sequence[str], num_steps: int,
                 options: request_lib.Options = request_lib.Options(), *,
                 strategy=None) -> "Sequences":
  """Generates continuations as ids, in one device call.

  `generator` runs it; the other arguments are as for `rnnstep.generate`
  (already validated there).

  Returns:
    The `Sequences`: per prompt, `num_return_sequences` id arrays (one when
    sampling) and their scores; a row that met a stop string ends with it.
  """
  request = build_request(generator, prompts, num_steps, options)
  batch, returned = len(prompts), options.num_return_sequences
  if num_steps == 0:
    return Sequences([[np.zeros([0], np.int32)] * returned] * batch,
                     [[0.0] * returned] * batch)
  check_output_fits(batch * options.num_beams, num_steps)
  beams = options.num_beams > 1

  def run(request, call=lambda name, *args: getattr(generator, name)(*args)):
    if beams:
      return tuple(call("beam_fn", request))
    if options.window:
      result = call("window_fn", request, np.int32(options.window))
    else:
      result = call("generate_fn", request)
    return result.ids, result.lengths, result.scores

  if strategy is not None:
    ids, lengths, scores = run_distributed(run, strategy, request)
  else:
    ids, lengths, scores = (x.numpy() for x in run(request, generator.call))
  if not beams:  # One sequence per prompt.
    ids, lengths, scores = ids[:, None], lengths[:, None], scores[:, None]
  return Sequences(
      [[ids[p, j, :lengths[p, j]] for j in range(returned)]
       for p in range(batch)],
      [[float(scores[p, j]) for j in range(returned)] for p in range(batch)])


def stream_ids(generator, prompts: Sequence[str], num_steps: int,
               chunk_size: int,
               options: request_lib.Options = request_lib.Options()
               ) -> Iterator["Sequences"]:
  """Like `generate_ids`, yielding each row's new ids every `chunk_size` steps.

  The state (and the history the look-back rules read) stays on device
  between chunks; joined, the chunks equal the one-shot result for the same
  arguments. Sampling only (not beam search).

  Yields:
    `Sequences` holding each row's new ids (one array per row, not a list)
    and its score so far.
  """
  batch = len(prompts)
  request = build_request(generator, prompts, min(chunk_size, num_steps),
                          options, capacity_steps=chunk_size,
                          total_steps=num_steps)
  check_output_fits(batch, min(chunk_size, max(num_steps, 1)))
  carry, start = None, 0
  while start < num_steps:
    steps = min(chunk_size, num_steps - start)
    request = request._replace(num_steps=np.int32(steps))
    if options.window:  # The windows' slots are the carried state.
      window = np.int32(options.window)
      result = (generator.call("window_fn", request, window) if carry is None
                else generator.call("window_continue_fn", request, carry,
                                    window))
    elif carry is None:
      result = generator.call("generate_fn", request)
    else:
      result = generator.call("continue_fn", request, carry)
    ids, lengths = result.ids.numpy(), result.lengths.numpy()
    scores = result.scores.numpy()
    yield Sequences([ids[row, :lengths[row]] for row in range(batch)],
                    [float(scores[row]) for row in range(batch)])
    carry, start = result.carry, start + steps
    if bool(tf.reduce_all(carry.done)):
      return


class Sequences(NamedTuple):
  """Generated ids on the host.

  Attributes:
    ids: per prompt, a list of int32 arrays (the returned sequences, best
      first for beam search; one when sampling).
    scores: per prompt, each sequence's log-likelihood under the model (0.0
      unless scores were asked for, for sampling).
  """
  ids: List[List[np.ndarray]]
  scores: List[List[float]]


def run_distributed(run, strategy, request: request_lib.Request, *row_args):
  """Runs a request with its rows split evenly over a strategy's replicas.

  Every row keeps its own (seed, index) key, so the text equals the
  single-device text. Rows are padded with copies of row 0 to fill the last
  replica. Every worker of a multi-worker strategy gets all rows.

  Args:
    run: the compiled work, `run(request, *row_args) -> tuple of tensors`,
      each with the rows as its first dimension.
    strategy: the `tf.distribute.Strategy`.
    request: the whole `Request`.
    *row_args: more arguments of `run`, each a nest of host arrays whose
      first dimension is the request's rows (the serving engine's carry),
      split with them.

  Returns:
    `run`'s tensors for all rows as numpy arrays, rows in order (padding rows
    last).
  """
  replicas = strategy.num_replicas_in_sync
  batch = int(request.prompts.lengths.shape[0])
  per_replica = -(-batch // replicas)
  request = request_lib.pad_rows(request, per_replica * replicas)
  host = tf.nest.map_structure(np.asarray, request)
  index = np.concatenate([np.arange(batch),
                          np.zeros([per_replica * replicas - batch], np.int64)])
  row_args = tf.nest.map_structure(lambda x: np.asarray(x)[index], row_args)

  def replica_values(ctx):
    first = ctx.replica_id_in_sync_group * per_replica
    take = lambda x: x[first:first + per_replica]
    return (host.map_rows(take),) + tf.nest.map_structure(take, row_args)

  # Each replica's own rows; the shared fields are the same on every replica.
  per_replica_args = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.nest.map_structure(tf.constant, replica_values(ctx)))

  # A plain callable: the strategy then calls it once per replica with that
  # replica's values (it would hand a tf.function the PerReplica wrappers).
  results = strategy.run(run, args=tuple(per_replica_args))
  # gather (not local results) so that every worker of a multi-worker
  # strategy gets all rows.
  return tuple(strategy.gather(x, axis=0).numpy() for x in results)


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
    raise errors.ArgumentError(
        "seed", f"seed lists {seeds.size} seeds for {batch_size} prompts; "
        "give one int, or one per prompt")
  return seeds, np.zeros([batch_size], np.int32)


# SplitMix64's constants (Steele, Lea and Flood, "Fast splittable
# pseudorandom number generators", OOPSLA 2014; Vigna's splitmix64.c).
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_UINT64 = (1 << 64) - 1


def record_seed(base_seed: int, index: int) -> int:
  """The seed of record `index` of a bulk job that gave it none.

  A job over many records (`rnnstep-generate --input`,
  `rnnstep.pipelines`) runs each record as the one-row `generate(model,
  prompt, n, seed=s)` call; a record without its own seed gets
  `s = record_seed(base_seed, index)`, so that a rerun, a resumed run or
  another runner gives it the same text whatever batch it lands in.

  It is output `index + 1` of SplitMix64 started at `base_seed` (as an
  unsigned 64-bit state), shifted right by one bit: a non-negative int
  below 2**63. In Python:

      z = (base_seed + (index + 1) * 0x9E3779B97F4A7C15) % 2**64
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
      z = (z ^ (z >> 27)) * 0x94D049BB133111EB % 2**64
      seed = (z ^ (z >> 31)) >> 1

  Args:
    base_seed: the job's seed, a 64-bit integer (negative allowed).
    index: the record's index in the job, counted from 0.

  Returns:
    The record's seed, in [0, 2**63).

  Raises:
    errors.ArgumentError: a base seed outside 64 bits, or a negative or
      non-integer index.
  """
  def is_int(value):
    return (isinstance(value, (int, np.integer))
            and not isinstance(value, (bool, np.bool_)))

  if not is_int(base_seed) or not -2**63 <= base_seed < 2**64:
    raise errors.ArgumentError(
        "base_seed", f"base_seed must be a 64-bit integer, got {base_seed!r}")
  if not is_int(index) or index < 0:
    raise errors.ArgumentError(
        "index", f"index must be a non-negative integer, got {index!r}")
  z = (int(base_seed) + (int(index) + 1) * _GOLDEN_GAMMA) & _UINT64
  z = ((z ^ (z >> 30)) * _MIX[0]) & _UINT64
  z = ((z ^ (z >> 27)) * _MIX[1]) & _UINT64
  return (z ^ (z >> 31)) >> 1
