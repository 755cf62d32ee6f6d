"""The default execution path, measured on the machine at hand and remembered.

    import rnnstep
    model = rnnstep.load("model.npz")
    table = rnnstep.tune(model, batch_sizes=(1, 16, 64))   # a few s per batch
    rnnstep.generate(model, prompts, 500)                  # now takes the winner

Which path is fastest ("xla", "graph" or "elementwise") depends on the CPU
(AMX or not, AVX512-BF16, cache sizes), the core count, the TensorFlow
version, the model's shape, the compute dtype and the batch size: XLA's CPU
dot wins at batch 1 on every machine measured so far, but at 17-64 rows or in
bfloat16 the winner changes from one CPU model to the next. `api.default_path`
therefore asks this module first and falls back to its built-in table
(`api._FASTEST_PATHS`, measured on one machine) when nothing was measured.

Nothing here measures unless asked: `tune()` (or the `rnnstep-tune` command)
times every path and writes the winners to a small JSON cache; a plain
`rnnstep.generate` or `rnnstep-generate` only reads that cache (once per
process) and never spends time measuring.

The cache file is `tuning.json` in $RNNSTEP_CACHE_DIR, else
$XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep. Each entry is keyed by
  - the machine: CPU model name, which of amx_bf16 / amx_tile / avx512_bf16 /
    avx512f it has (/proc/cpuinfo), usable cores, TensorFlow version, and
    whether a GPU is visible;
  - the model: vocab size, embedding width, each layer's kind / units /
    reset_after, and the compute dtype;
  - the batch bucket: 1, 2-4, 5-8, 9-16, 17-32, 33-64, 65-128, 129-256 or
    >256 (the winner measured at one batch size stands for its bucket; the
    bounds follow the places where the winner changed on the machines
    measured: 16/17, 32/48, 64).
A different CPU, core count, TensorFlow version or model shape misses and the
table answers. The cache is JSON only (never pickle); a missing, unreadable or
corrupt file is ignored, and it is replaced atomically (temp file +
os.replace). RNNSTEP_TUNING=off (or 0/false/no) turns it off: the cache is
neither read nor written, and only the table answers.
"""

import datetime
import functools
import json
import math
import numbers
import os
import platform
import statistics
import time
from typing import Callable, Dict, Iterable, Optional

import tensorflow as tf

from rnnstep import paths
from rnnstep import staging

CACHE_FILE = "tuning.json"
FORMAT = "rnnstep-tuning"
VERSION = 1
# The candidate paths, as `jit_compile` values (rnnstep.generate's argument).
PATHS = {path: paths.jit_compile_of(path) for path in paths.CONCRETE}
# Upper bounds of the batch buckets; above the last is one open bucket.
BUCKET_BOUNDS = (1, 4, 8, 16, 32, 64, 128, 256)
# The CPU features that change which matmul kernels TF and XLA use.
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")
# A cache file larger than this is not ours (or is damaged): ignored.
MAX_CACHE_BYTES = 1 << 20
# Entries kept (newest first) when the cache is rewritten.
MAX_ENTRIES = 512
# Measuring defaults: seconds of timed rounds per batch size, and rounds.
DEFAULT_BUDGET_SECONDS = 3.0
MIN_ROUNDS, MAX_ROUNDS = 3, 9
_OFF = ("off", "0", "false", "no")
_PROMPT_LENGTH = 4

# Cache file path -> its entries, read once per process (see `_entries`).
_memo: Dict[str, Dict[str, dict]] = {}


def enabled() -> bool:
  """False when RNNSTEP_TUNING is off/0/false/no: the table alone decides."""
  return os.environ.get("RNNSTEP_TUNING", "").strip().lower() not in _OFF


def cache_dir() -> str:
  """$RNNSTEP_CACHE_DIR, else $XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep."""
  explicit = os.environ.get("RNNSTEP_CACHE_DIR")
  if explicit:
    return explicit
  xdg = os.environ.get("XDG_CACHE_HOME")
  if xdg:
    return os.path.join(xdg, "rnnstep")
  return os.path.join(os.path.expanduser("~"), ".cache", "rnnstep")


def cache_file() -> str:
  """The JSON file holding the measured winners."""
  return os.path.join(cache_dir(), CACHE_FILE)


def batch_bucket(batch_size: int) -> str:
  """The bucket naming `batch_size` in the cache key: '1', '2-4', ... '>256'."""
  lower = 1
  for upper in BUCKET_BOUNDS:
    if batch_size <= upper:
      return str(upper) if lower == upper else f"{lower}-{upper}"
    lower = upper + 1
  return f">{BUCKET_BOUNDS[-1]}"


@functools.lru_cache(maxsize=None)
def _cpu_info():
  """(CPU model name, the CPU_FLAGS it has), from /proc/cpuinfo when there is one."""
  name, have = None, set()
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        field, _, value = line.partition(":")
        field = field.strip()
        if field == "model name" and name is None:
          name = value.strip()
        elif field == "flags" and not have:
          have = set(value.split())
        if name is not None and have:
          break
  except OSError:  # Not Linux, or no /proc: the name alone keys the machine.
    pass
  name = name or platform.processor() or platform.machine() or "unknown"
  return name, tuple(flag for flag in CPU_FLAGS if flag in have)


def has_amx() -> bool:
  """Whether this CPU has AMX tiles (what the built-in path tables split on)."""
  return "amx_tile" in _cpu_info()[1]


def _usable_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def _gpu_visible() -> bool:
  return bool(tf.config.list_physical_devices("GPU"))


def machine_key() -> dict:
  """What about this machine decides the fastest path (part of each key)."""
  name, cpu_flags = _cpu_info()
  return {"cpu": name, "cpu_flags": list(cpu_flags), "cores": _usable_cores(),
          "tensorflow": tf.__version__,
          "device": "gpu" if _gpu_visible() else "cpu"}


def model_key(model) -> dict:
  """The model's shape and compute dtype (part of each key)."""
  return {"vocab_size": int(model.vocab_size),
          "embedding_dim": int(model.config.embedding_dim),
          "layers": [[layer.kind, int(layer.units), bool(layer.reset_after)]
                     for layer in model.config.layers],
          "dtype": model.compute_dtype.name}


def cache_key(model, batch_size: int, machine: Optional[dict] = None) -> str:
  """The cache entry's key: machine, model shape, dtype and batch bucket."""
  return json.dumps({"machine": machine or machine_key(),
                     "model": model_key(model),
                     "batch_bucket": batch_bucket(batch_size)},
                    sort_keys=True, separators=(",", ":"))


def cached_path(model, batch_size: int) -> Optional[str]:
  """The path measured fastest for this model and batch bucket, or None.

  None when tuning is off, nothing was measured for this key, or the cache
  cannot be read. Reads the cache file once per process; never measures.
  """
  if not enabled():
    return None
  entries = _entries(cache_file())
  if not entries:  # The common case, nothing tuned: no key to build.
    return None
  entry = entries.get(cache_key(model, batch_size))
  return entry["path"] if entry else None


def reload():
  """Forgets the cache read by this process: the next lookup reads the file."""
  _memo.clear()


def _entries(path: str) -> Dict[str, dict]:
  entries = _memo.get(path)
  if entries is None:
    entries = _read(path)
    _memo[path] = entries
  return entries


def _read(path: str) -> Dict[str, dict]:
  """The valid entries of the cache file; {} for anything unusable."""
  try:
    with open(path, "rb") as f:
      raw = f.read(MAX_CACHE_BYTES + 1)
    if len(raw) > MAX_CACHE_BYTES:
      return {}
    data = json.loads(raw.decode("utf-8"))
  except (OSError, ValueError):  # Missing, unreadable, not UTF-8 / JSON.
    return {}
  if (not isinstance(data, dict) or data.get("format") != FORMAT
      or data.get("version") != VERSION
      or not isinstance(data.get("entries"), dict)):
    return {}
  return {key: entry for key, entry in data["entries"].items()
          if isinstance(entry, dict) and entry.get("path") in PATHS}


def _write(path: str, new_entries: Dict[str, dict]):
  """Merges `new_entries` into the cache file, atomically.

  The file is re-read just before writing so that winners another process
  saved meanwhile are kept (two processes saving at the same instant can
  still lose one's entries: the last rename wins, whole).

  Raises:
    OSError: the cache directory or file cannot be written.
  """
  entries = _read(path)
  entries.update(new_entries)
  if len(entries) > MAX_ENTRIES:
    newest = sorted(entries, key=lambda k: str(entries[k].get("measured_at")),
                    reverse=True)[:MAX_ENTRIES]
    entries = {key: entries[key] for key in newest}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with staging.staged_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({"format": FORMAT, "version": VERSION, "entries": entries}, f,
                indent=1, sort_keys=True)
      f.write("\n")
  _memo[path] = entries


def default_num_steps(batch_size: int) -> int:
  """Steps per timed call: enough that per-call overhead does not dominate.

  200 up to batch 16, then fewer as each step costs more (3200 row-steps per
  call), never below 32: at batch 256 a tutorial-size step takes milliseconds,
  so 32 steps already dwarf the ~0.1-1 ms a call costs to enter.
  """
  return max(32, min(200, 3200 // batch_size))


def _probe_prompt(model) -> str:
  usable = [c for c in model.vocab if len(c) == 1 and c.isprintable()]
  usable = usable or [c for c in model.vocab if len(c) == 1]
  if not usable:
    raise ValueError("the model's vocabulary has no single characters to "
                     "build a prompt from")
  return "".join(usable[(7 * i) % len(usable)] for i in range(_PROMPT_LENGTH))


def _check_positive_int(name, value, allow_none=False):
  if allow_none and value is None:
    return
  if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
      or value < 1):
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def tune(model, batch_sizes: Iterable[int] = (1, 16, 32, 64, 256), *,
         num_steps: Optional[int] = None, rounds: Optional[int] = None,
         budget_seconds: float = DEFAULT_BUDGET_SECONDS, save: bool = True,
         progress: Optional[Callable[[str], None]] = None) -> dict:
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
      (`batch_bucket`): tune at the batch sizes you run.
    num_steps: characters per timed call; None scales with the batch
      (`default_num_steps`: 200 at small batches, down to 32).
    rounds: timed rounds; None fits them to `budget_seconds`.
    budget_seconds: seconds of timed rounds per batch size (when rounds=None).
    save: write the winners to the cache file (`cache_file()`). Ignored (never
      written) when RNNSTEP_TUNING is off.
    progress: called with a line of text before each measurement step.

  Returns:
    {"cache_file": the file written or None, "cache_error": why it could not
    be written or None, "machine": `machine_key()`, "model": `model_key()`,
    "results": [per batch size, in order: {"batch_size", "bucket",
    "num_steps", "rounds", "ms_per_1000_steps": {path: median ms per 1000
    steps of the whole batch}, "round_seconds": {path: [seconds per timed
    call]}, "fastest": path, "previous_default": the path jit_compile=None
    took before}]}.

  Raises:
    ValueError: a bad argument.
  """
  # Imported here: api imports this module (inside default_path).
  from rnnstep import api  # pylint: disable=g-import-not-at-top
  batch_sizes = list(batch_sizes)
  if not batch_sizes:
    raise ValueError("batch_sizes is empty; give at least one batch size")
  for batch in batch_sizes:
    _check_positive_int("batch_sizes", batch)
  _check_positive_int("num_steps", num_steps, allow_none=True)
  _check_positive_int("rounds", rounds, allow_none=True)
  if (not isinstance(budget_seconds, numbers.Real)
      or isinstance(budget_seconds, bool) or not math.isfinite(budget_seconds)
      or budget_seconds <= 0):
    raise ValueError(f"budget_seconds must be a finite number > 0, got "
                     f"{budget_seconds!r}")
  say = progress or (lambda line: None)
  prompt = _probe_prompt(model)
  machine = machine_key()
  results, new_entries = [], {}
  for batch in batch_sizes:
    previous = api.default_path(model, batch)
    steps = num_steps or default_num_steps(batch)
    prompts = [prompt] * batch

    def call(path, prompts=prompts, steps=steps):
      start = time.perf_counter()
      api.generate(model, prompts, steps, temperature=1.0, seed=1,
                   jit_compile=PATHS[path])
      return time.perf_counter() - start

    say(f"batch {batch}: warming up (compiling) {', '.join(PATHS)}")
    for path in PATHS:
      call(path)
    samples = {path: [] for path in PATHS}
    order = list(PATHS)
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
    row = {"batch_size": batch, "bucket": batch_bucket(batch),
           "num_steps": steps, "rounds": done, "ms_per_1000_steps": ms,
           "round_seconds": samples, "fastest": fastest,
           "previous_default": previous}
    results.append(row)
    new_entries[cache_key(model, batch, machine)] = {
        "path": fastest, "batch_size": batch, "num_steps": steps,
        "rounds": done, "ms_per_1000_steps": ms,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")}
  written, error = None, None
  if save and enabled():
    path = cache_file()
    try:
      _write(path, new_entries)
      written = path
    except OSError as e:
      error = (f"cannot write the tuning cache {path}: {e.strerror or e} (set "
               "RNNSTEP_CACHE_DIR to a writable directory)")
      # This process still uses what it measured.
      _entries(path).update(new_entries)
  return {"cache_file": written, "cache_error": error, "machine": machine,
          "model": model_key(model), "results": results}
