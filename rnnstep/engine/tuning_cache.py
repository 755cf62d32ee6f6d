"""The tuning cache: which path was measured fastest here, read without TensorFlow.

`rnnstep.tune` (tuning.py, above the API) measures every path and writes the
winners here; `paths.default_path` reads them. This module only reads and
writes the file, so the path choice (paths.py) depends on no measuring code
and reading costs no TensorFlow import of its own.

The cache file is `tuning.json` in $RNNSTEP_CACHE_DIR, else
$XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep. Each entry is keyed by
  - the machine: CPU model name, which of `cpu.FEATURES` it has, usable
    cores, TensorFlow version, and whether a GPU is visible;
  - the model: vocab size, embedding width, each layer's kind / units /
    reset_after, and the compute dtype;
  - the batch range: 1, 2-4, 5-8, 9-16, 17-32, 33-64, 65-128, 129-256 or
    >256 (the winner measured at one batch size stands for its range; the
    bounds follow the places where the winner changed on the machines
    measured: 16/17, 32/48, 64);
  - for a server's lanes only (`rnnstep-tune --lanes=N`): "lanes": N, the
    calls that ran at once, each on one thread (the batch range is then a
    lane's rows). A key without it is one call on TensorFlow's threads.
A different CPU, core count, TensorFlow version or model shape misses and the
built-in table answers. The cache is JSON only (never pickle); a missing,
unreadable or corrupt file is ignored, and it is replaced atomically (temp
file + os.replace). RNNSTEP_TUNING=off (or 0/false/no) turns it off: the
cache is neither read nor written, and only the table answers.
"""

import json
import os
import sys
from typing import Dict, Optional

from rnnstep.engine import cpu
from rnnstep import staging

CACHE_FILE = "tuning.json"
FORMAT = "rnnstep-tuning"
# 2: the machine key names every feature of cpu.FEATURES (1 named four), and
# the batch part of a key is "batch_range".
VERSION = 2
# Upper bounds of the batch ranges; above the last is one open range.
BATCH_RANGE_BOUNDS = (1, 4, 8, 16, 32, 64, 128, 256)
# The paths an entry may name (paths.CONCRETE; not imported: paths imports us).
KNOWN_PATHS = ("xla", "graph", "elementwise")
# A cache file larger than this is not ours (or is damaged): ignored.
MAX_CACHE_BYTES = 1 << 20
# Entries kept (newest first) when the cache is rewritten.
MAX_ENTRIES = 512
OFF_VALUES = ("off", "0", "false", "no")  # An environment switch's "off".

# Cache file path -> its entries, read once per process (see `entries`).
_memo: Dict[str, Dict[str, dict]] = {}


def enabled() -> bool:
  """False when RNNSTEP_TUNING is off/0/false/no: the table alone decides."""
  return os.environ.get("RNNSTEP_TUNING", "").strip().lower() not in OFF_VALUES


# The cap on each of rnnstep's caches of compiled programs (the LiteRT
# artifacts, XLA's programs), in MB, unless $RNNSTEP_CACHE_MAX_MB says
# otherwise: ~64 LiteRT artifacts of the bundled model's size (7.6 MB).
DEFAULT_MAX_MB = 512
MAX_MB_ENV = "RNNSTEP_CACHE_MAX_MB"


def max_bytes() -> int:
  """The cap on a cache's total size: $RNNSTEP_CACHE_MAX_MB (a number >= 0;
  another value is ignored) or DEFAULT_MAX_MB, in bytes."""
  try:
    megabytes = float(os.environ.get(MAX_MB_ENV, DEFAULT_MAX_MB))
  except ValueError:
    megabytes = DEFAULT_MAX_MB
  if not megabytes >= 0:  # Negative or NaN.
    megabytes = DEFAULT_MAX_MB
  return int(megabytes * (1 << 20))


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


def batch_range(batch_size: int) -> str:
  """The range naming `batch_size` in a cache key: '1', '2-4', ... '>256'.

  (Not `request.batch_bucket`, the batch XLA pads to.)
  """
  lower = 1
  for upper in BATCH_RANGE_BOUNDS:
    if batch_size <= upper:
      return str(upper) if lower == upper else f"{lower}-{upper}"
    lower = upper + 1
  return f">{BATCH_RANGE_BOUNDS[-1]}"


# The distributions TensorFlow is installed as.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tf-nightly")


def _tensorflow_version() -> str:
  loaded = sys.modules.get("tensorflow")
  if loaded is not None and hasattr(loaded, "__version__"):
    return loaded.__version__
  return installed_tensorflow_version()


def installed_tensorflow_version() -> str:
  """The installed TensorFlow's version, without importing it; "unknown"."""
  for distribution in TENSORFLOW_DISTRIBUTIONS:
    version = installed_version(distribution)
    if version is not None:
      return version
  return "unknown"


def _normalized(name: str) -> str:
  """A distribution's name as PEP 503 compares them (a dist-info folder
  writes `-` and `.` as `_`)."""
  return name.lower().replace("-", "_").replace(".", "_")


def installed_version(distribution: str) -> Optional[str]:
  """An installed distribution's version, or None.

  Read from the name of its `NAME-VERSION.dist-info` folder on sys.path (the
  first, as `importlib.metadata` finds it), else by `importlib.metadata`
  (an egg or other layout): importing that costs a warm rnnstep-generate
  ~20 ms of its ~0.2 s on a 2-vCPU Zen 3.
  """
  wanted = _normalized(distribution)
  for entry in sys.path:
    for name in _dist_infos(entry or "."):
      found, _, version = name[:-len(".dist-info")].partition("-")
      if _normalized(found) == wanted and version:
        return version
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return None


_dist_info_memo: Dict[str, tuple] = {}


def _dist_infos(entry: str) -> tuple:
  """The `*.dist-info` names in a sys.path folder (listed once a process)."""
  if entry not in _dist_info_memo:
    try:
      names = os.listdir(entry)
    except OSError:  # Not a folder (a zip), or gone.
      names = []
    _dist_info_memo[entry] = tuple(n for n in names
                                   if n.endswith(".dist-info"))
  return _dist_info_memo[entry]


def machine_key(device: str = "cpu") -> dict:
  """What about this machine decides the fastest path (part of each key).

  Args:
    device: "gpu" when TensorFlow sees a GPU (`paths.gpu_visible`), else "cpu".
  """
  this = cpu.info()
  return {"cpu": this.name, "cpu_flags": list(this.features),
          "cores": this.cores, "tensorflow": _tensorflow_version(),
          "device": device}


def model_key(model) -> dict:
  """The model's shape and compute dtype (part of each key)."""
  return {"vocab_size": int(model.vocab_size),
          "embedding_dim": int(model.config.embedding_dim),
          "layers": [[layer.kind, int(layer.units), bool(layer.reset_after)]
                     for layer in model.config.layers],
          "dtype": model.compute_dtype.name}


def cache_key(model, batch_size: int, machine: Optional[dict] = None,
              lanes: Optional[int] = None) -> str:
  """The cache entry's key: machine, model shape, dtype and batch range.

  `lanes`: for a server's lanes, the calls running at once, one thread each
  (`batch_size` is then a lane's rows); None: one call.
  """
  key = {"machine": machine or machine_key(), "model": model_key(model),
         "batch_range": batch_range(batch_size)}
  if lanes is not None:
    key["lanes"] = int(lanes)
  return json.dumps(key, sort_keys=True, separators=(",", ":"))


def cached_path(model, batch_size: int,
                lanes: Optional[int] = None) -> Optional[str]:
  """The path measured fastest for this model and batch range, or None.

  None when tuning is off, nothing was measured for this key, or the cache
  cannot be read. Reads the cache file once per process; never measures.
  `lanes` as `cache_key`'s.
  """
  if not enabled():
    return None
  found = entries(cache_file())
  if not found:  # The common case, nothing tuned: no key to build.
    return None
  entry = found.get(cache_key(model, batch_size, lanes=lanes))
  return entry["path"] if entry else None


def measured(model) -> Dict[int, float]:
  """Each batch size measured here for the model (one call, not lanes), and
  its fastest path's milliseconds per 1000 steps of the whole batch.

  {} when tuning is off or nothing was measured. Reads no more than
  `cached_path`.
  """
  if not enabled():
    return {}
  found = entries(cache_file())
  if not found:
    return {}
  # As `cache_key` makes them (the machine as `cached_path` reads it).
  machine, shape = machine_key(), model_key(model)
  out = {}
  for key, entry in found.items():
    try:
      parsed = json.loads(key)
      if ("lanes" in parsed or parsed.get("machine") != machine
          or parsed.get("model") != shape):
        continue
      out[int(entry["batch_size"])] = min(
          float(ms) for ms in entry["ms_per_1000_steps"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
      continue  # An entry this version cannot read: not ours.
  return out


def reload():
  """Forgets the cache read by this process: the next lookup reads the file."""
  _memo.clear()


def entries(path: str) -> Dict[str, dict]:
  """The entries of the cache file `path`, read once per process."""
  found = _memo.get(path)
  if found is None:
    found = read(path)
    _memo[path] = found
  return found


def read(path: str) -> Dict[str, dict]:
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
          if isinstance(entry, dict) and entry.get("path") in KNOWN_PATHS}


def write(path: str, new_entries: Dict[str, dict]):
  """Merges `new_entries` into the cache file, atomically.

  The file is re-read just before writing so that winners another process
  saved meanwhile are kept (two processes saving at the same instant can
  still lose one's entries: the last rename wins, whole).

  Raises:
    OSError: the cache directory or file cannot be written.
  """
  merged = read(path)
  merged.update(new_entries)
  if len(merged) > MAX_ENTRIES:
    newest = sorted(merged, key=lambda k: str(merged[k].get("measured_at")),
                    reverse=True)[:MAX_ENTRIES]
    merged = {key: merged[key] for key in newest}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with staging.staged_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({"format": FORMAT, "version": VERSION, "entries": merged}, f,
                indent=1, sort_keys=True)
      f.write("\n")
  _memo[path] = merged


def remember(path: str, new_entries: Dict[str, dict]):
  """Makes `new_entries` answer in this process without writing them."""
  entries(path).update(new_entries)
