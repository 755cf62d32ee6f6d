"""The default execution path, measured on the machine at hand and remembered.

    import rnnstep
    model = rnnstep.load("model.npz")
    table = rnnstep.tune(model, batch_sizes=(1, 16, 64))   # a few s per batch
    rnnstep.generate(model, prompts, 500)                  # now takes the winner

Which path is fastest ("xla", "graph" or "elementwise") depends on the CPU
(AMX or not, AVX512-BF16, AVX-512, cache sizes), the core count, the
TensorFlow version, the model's shape, the compute dtype and the batch size:
XLA's CPU dot wins at batch 1 on every machine measured so far, but at 17-64
rows or in bfloat16 the winner changes from one CPU model to the next.
`paths.default_path` therefore asks the tuning cache first
(`tuning_cache.py`: where it lives, its keys, its format) and falls back to
its built-in tables (`paths.FASTEST_PATHS`, one per CPU kind measured).

This module measures, and sits above the API (it times `api.generate`):
nothing imports it but the `rnnstep.tune` name and `rnnstep-tune`. Nothing
measures unless asked: `tune()` times every path and writes the winners to
the cache; a plain `rnnstep.generate` or `rnnstep-generate` only reads it
(once per process) and never spends time measuring.
"""

import collections.abc
import datetime
import math
import numbers
import statistics
import threading
import time
from typing import Callable, Iterable, Optional

from rnnstep import api
from rnnstep import errors
from rnnstep.engine import paths
from rnnstep.engine import tuning_cache
from rnnstep.model.check import check_model

# Measuring defaults: seconds of timed rounds per batch size, and rounds.
DEFAULT_BUDGET_SECONDS = 3.0
MIN_ROUNDS, MAX_ROUNDS = 3, 9
_PROMPT_LENGTH = 4


def default_num_steps(batch_size: int) -> int:
  """Steps per timed call: enough that per-call overhead does not dominate.

  200 up to batch 16, then fewer as each step costs more (3200 row-steps per
  call), never below 32: at batch 256 a tutorial-size step takes milliseconds,
  so 32 steps already dwarf the ~0.1-1 ms a call costs to enter.
  """
  return max(32, min(200, 3200 // batch_size))


def _probe_prompt(model) -> str:
  if model.is_characters:
    usable = [c for c in model.vocab if len(c) == 1 and c.isprintable()]
    usable = usable or [c for c in model.vocab if len(c) == 1]
  else:  # Tokens whose text reads back as themselves (not a byte's half).
    usable = []
    for i in range(int(model.has_unk), min(model.vocab_size, 512)):
      piece = model.decode([i])
      try:
        if piece and model.encode(piece).tolist() == [i]:
          usable.append(piece)
      except ValueError:
        pass
    usable = [p for p in usable if p.strip().isprintable()] or usable
  if not usable:
    raise ValueError("the model's vocabulary has no single characters (or "
                     "tokens) to build a prompt from")
  return "".join(usable[(7 * i) % len(usable)] for i in range(_PROMPT_LENGTH))


def _check_positive_int(name, value, allow_none=False):
  if allow_none and value is None:
    return
  if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
      or value < 1):
    raise errors.ArgumentError(
        name, f"{name} must be a positive integer, got {value!r:.60}")


def _concurrently(lanes: int, call: Callable[[int], None]) -> None:
  """Runs call(0) ... call(lanes - 1) at once, a thread each (as a server's
  lanes run their calls); re-raises the first failure."""
  failures = []

  def lane(i):
    try:
      call(i)
    except BaseException as e:  # pylint: disable=broad-except
      failures.append(e)

  threads = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  if failures:
    raise failures[0]


def _check_lanes(lanes) -> None:
  """Lanes are measured as a server runs them: one intra-op thread a call."""
  _check_positive_int("lanes", lanes, allow_none=True)
  if lanes is None:
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.config.threading.get_intra_op_parallelism_threads() != 1:
    raise ValueError(
        "lanes: each lane runs on one thread; tune them in a process whose "
        "TensorFlow has one intra-op thread (rnnstep-tune --lanes sets it; "
        "or tf.config.threading.set_intra_op_parallelism_threads(1) before "
        "TensorFlow runs anything)")


def tune(model, batch_sizes: Iterable[int] = (1, 16, 32, 64, 256), *,
         num_steps: Optional[int] = None, rounds: Optional[int] = None,
         budget_seconds: float = DEFAULT_BUDGET_SECONDS, save: bool = True,
         progress: Optional[Callable[[str], None]] = None,
         lanes: Optional[int] = None) -> dict:
  """Measures every path for `model` at each batch size; remembers the winners.

  Per batch size: one warm-up call per path (traces and compiles it), then
  rounds that run the paths interleaved (xla, graph, elementwise, then the
  next round starting one further along), each a `rnnstep.generate` of
  `num_steps` characters per row at temperature 1. The winner is the path with
  the lowest median. Rounds continue until `budget_seconds` of timed rounds
  are spent (at least 3, at most 9) unless `rounds` fixes the count, so a
  batch size costs its compile time plus about `budget_seconds`.

  Args:
    model: an `rnnstep.Model` (its compute dtype is part of the key).
    batch_sizes: batch sizes to measure; each stands for its bucket
      (`tuning_cache.batch_range`): tune at the batch sizes you run.
    num_steps: characters per timed call; None scales with the batch
      (`default_num_steps`: 200 at small batches, down to 32).
    rounds: timed rounds; None fits them to `budget_seconds`.
    budget_seconds: seconds of timed rounds per batch size (when rounds=None).
    save: write the winners to the cache file (`tuning_cache.cache_file()`).
      Ignored (never
      written) when RNNSTEP_TUNING is off.
    progress: called with a line of text before each measurement step.
    lanes: measure for `rnnstep-serve`'s lanes instead of one call: each
      timed call is `lanes` concurrent `generate` calls of the batch size
      (a lane's rows), one thread each, and the winners are kept for lanes
      (`paths.lane_path`). The process must run TensorFlow on one intra-op
      thread. None: one call, for `generate` (`paths.default_path`).

  Returns:
    {"cache_file": the file written or None, "cache_error": why it could not
    be written or None, "machine": `tuning_cache.machine_key()`, "model":
    `tuning_cache.model_key()`, "results": [per batch size, in order:
    {"batch_size", "batch_range",
    "num_steps", "rounds", "ms_per_1000_steps": {path: median ms per 1000
    steps of the whole batch (with lanes, of the lanes together)},
    "round_seconds": {path: [seconds per timed call]}, "fastest": path,
    "previous_default": the path jit_compile=None took before}], "lanes":
    `lanes`}.

  Raises:
    ValueError: a bad argument.
  """
  check_model(model)
  if isinstance(batch_sizes, (str, bytes, dict)) or not isinstance(
      batch_sizes, collections.abc.Iterable):
    raise errors.ArgumentError(
        "batch_sizes", "batch_sizes must be a list of positive integers, got "
        f"{errors.kind_of(batch_sizes)}")
  batch_sizes = list(batch_sizes)
  if not batch_sizes:
    raise errors.ArgumentError(
        "batch_sizes", "batch_sizes is empty; give at least one batch size")
  for batch in batch_sizes:
    _check_positive_int("batch_sizes", batch)
  _check_positive_int("num_steps", num_steps, allow_none=True)
  _check_positive_int("rounds", rounds, allow_none=True)
  _check_lanes(lanes)
  if (not isinstance(budget_seconds, numbers.Real)
      or isinstance(budget_seconds, bool) or not math.isfinite(budget_seconds)
      or budget_seconds <= 0):
    raise ValueError(f"budget_seconds must be a finite number > 0, got "
                     f"{budget_seconds!r}")
  say = progress or (lambda line: None)
  prompt = _probe_prompt(model)
  machine = tuning_cache.machine_key("gpu" if paths.gpu_visible() else "cpu")
  results, new_entries = [], {}
  for batch in batch_sizes:
    previous = (paths.default_path(model, batch) if lanes is None
                else paths.lane_path(model, batch, lanes))
    steps = num_steps or default_num_steps(batch)
    prompts = [prompt] * batch

    def call(path, prompts=prompts, steps=steps):
      start = time.perf_counter()
      one = lambda lane: api.generate(model, prompts, steps, temperature=1.0,
                                      seed=1 + lane,
                                      jit_compile=paths.JIT_COMPILE[path])
      if lanes is None:
        one(0)
      else:
        _concurrently(lanes, one)
      return time.perf_counter() - start

    say(f"batch {batch}: warming up (compiling) {', '.join(paths.CONCRETE)}")
    for path in paths.CONCRETE:
      call(path)
    samples = {path: [] for path in paths.CONCRETE}
    order = list(paths.CONCRETE)
    spent, done = 0.0, 0
    while True:
      say(f"batch {batch}: round {done + 1}, {steps} steps")
      shift = done % len(order)
      for path in order[shift:] + order[:shift]:
        seconds = call(path)
        samples[path].append(seconds)
        spent += seconds
      done += 1
      if rounds is not None:
        if done >= rounds:
          break
      elif done >= MAX_ROUNDS or (done >= MIN_ROUNDS and
                                  spent * (done + 1) / done > budget_seconds):
        break
    ms = {path: statistics.median(secs) * 1e6 / steps
          for path, secs in samples.items()}
    fastest = min(ms, key=ms.get)
    row = {"batch_size": batch, "batch_range": tuning_cache.batch_range(batch),
           "num_steps": steps, "rounds": done, "ms_per_1000_steps": ms,
           "round_seconds": samples, "fastest": fastest,
           "previous_default": previous}
    results.append(row)
    new_entries[tuning_cache.cache_key(model, batch, machine, lanes)] = {
        "path": fastest, "batch_size": batch, "num_steps": steps,
        "rounds": done, "ms_per_1000_steps": ms,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")}
  written, error = None, None
  if save and tuning_cache.enabled():
    path = tuning_cache.cache_file()
    try:
      tuning_cache.write(path, new_entries)
      written = path
    except OSError as e:
      error = (f"cannot write the tuning cache {path}: {e.strerror or e} (set "
               "RNNSTEP_CACHE_DIR to a writable directory)")
      # This process still uses what it measured.
      tuning_cache.remember(path, new_entries)
  return {"cache_file": written, "cache_error": error, "machine": machine,
          "model": tuning_cache.model_key(model), "results": results,
          "lanes": lanes}
