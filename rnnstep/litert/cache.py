"""The compiled-artifact cache: rnnstep-generate without TensorFlow on a warm run.

A fresh `rnnstep-generate` pays seconds before its first character: importing
TensorFlow (~4.4 s on a 2-vCPU Zen 3), tracing and compiling the loop (~3-4 s)
and TF's teardown. The loop it runs can also be a LiteRT flatbuffer
(`rnnstep.litert.export`: builtin ops only, the whole generation in one
call, the library's text for the same seed), which the `ai_edge_litert`
interpreter runs from a process that imports only numpy: ~0.3-0.5 s in all.

So the command keeps one exported flatbuffer per model here, and a run
whose request the flatbuffer serves (`rnnstep.litert.warm`, the warm path)
runs it instead of TensorFlow. A run that finds no valid entry generates on
the TensorFlow path as before and, once its text is written, starts a
detached child (`rnnstep.litert.fill`, its `spawn_fill`) that builds the
entry for the next run; the user's command does not wait for it. The
flatbuffer is run by `rnnstep.litert.runner`.

Entries live in `<cache dir>/litert/` (the tuning cache's directory:
$RNNSTEP_CACHE_DIR, else $XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep;
both folders made 0700), one per key, named by the key's sha256:

  NAME.tflite   the flatbuffer
  NAME.json     the manifest: the full key, the flatbuffer's sha256 and size,
                the vocabulary (and a token model's kind and rules,
                `Tokens.to_json`, so that a warm run tokenizes and decodes
                as the library does), whether the model primes block by
                block (`primes_in_bulk`: RWKV-7, whose long prompts the warm
                path leaves to TensorFlow, `warm.prompt_crossover`) and the
                bytes of the layers' weights, what a primed token costs in
                proportion (`prime_bytes`); or, for a model the export refuses (a
                model recording a window), {"unsupported": reason}; or, for
                an export that failed, {"failed": reason}. Neither is
                retried until the key changes (`--cache_clear` forgets
                them).
  NAME.xnnpack  an artifact past `runner.BUILTIN_KERNELS_FROM_BYTES`: its
                weights packed for XNNPACK (`runner.pack_weights`, by the
                child after the export; its sha256 and size in the
                manifest), which each run maps instead of packing a copy
  NAME.lock     held (flock) by the child that builds the entry, removed by
                it when done

The key (`key`) is everything the artifact's bytes or validity depend on:
the sha256 of every file the loader reads (`model_files`: a folder's every
file, e.g. a char-rnn-tensorflow save folder's config.pkl, chars_vocab.pkl,
`checkpoint` and weights), the TensorFlow version (its converter writes the
bytes), rnnstep's version and a digest of its sources (outside cli/: a
changed loop or sampler is a different artifact even before a release), the
runtime (ai_edge_litert's version), the CPU (model name and the features of
`cpu.FEATURES`) and the export's options. Another version, CPU or model
names another entry, and an entry whose manifest holds another key is not
used.

The cache is bounded: after each fill, entries are removed least recently
used first (a warm run's lookup touches its manifest) until they hold at
most `max_bytes` ($RNNSTEP_CACHE_MAX_MB, else the larger of
`tuning_cache.DEFAULT_MAX_MB` and twice the largest entry); locks and temp files
left by killed children are removed too. `rnnstep-generate --cache_info`
lists the entries, `--cache_clear` removes them.

Nothing here is trusted: `open_entry` (and `lookup`) ignores an entry (and
the folder) owned by another user or writable by group or others (on a
shared $RNNSTEP_CACHE_DIR anyone could otherwise plant an artifact: the
manifest's sha256 proves integrity, not origin), reads the manifest (JSON
only, size-capped), checks its key, opens the flatbuffer (and its packed
weights) and checks its size and sha256 against the manifest through the
open file before the runtime sees a byte, and the runtime reads that open
file (/proc/self/fd/N); anything missing, corrupt or stale is a miss, and
the next cold run rebuilds it. The sha256 is remembered by the file's stat
as the key's are (`_Digests`: any write changes the ctime, so one changed
byte is still seen) and not taken again while that stat holds. Writes are
atomic (`staging.staged_path`: temp file + os.replace, mode 0600),
flatbuffer and packed weights first and manifest last, so a reader never
sees a manifest whose artifact is not complete; two children filling one
entry are serialised by the lock (the second one exits), and the export
is reproducible (the same bytes from a fresh process), so even
last-writer-wins would leave identical content. The child runs isolated
(`python -I`, its working directory the cache folder, its sys.path the
parent's less the working directory), so a stray `numpy.py` where the
user ran the command is not imported.

This module imports neither TensorFlow nor the interpreter at module level:
the fast path (`runner.run_artifact`) imports `ai_edge_litert` and
numpy only (and, for a token model, `rnnstep.model.vocabulary`, which imports
no TensorFlow; a subword model's `tokenizers`), the child imports TensorFlow
to export.
"""

import collections
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from typing import Callable, List, Optional, Tuple

from rnnstep.engine import cpu
from rnnstep.engine import tuning_cache
from rnnstep.litert import runner
from rnnstep import staging
from rnnstep import version

# The rnnstep package folder (whose sources `sources_digest` keys on).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = "rnnstep-litert-cache"
# 2: the key names every file the loader reads and the TensorFlow version.
VERSION = 2
SUBDIR = "litert"
RUNTIME_DISTRIBUTION = "ai-edge-litert"
MAX_MANIFEST_BYTES = 16 << 20  # A manifest holds the vocabulary (<= 1M chars).
# The explicit cap on the entries' total size (`max_bytes`).
MAX_MB_ENV = tuning_cache.MAX_MB_ENV
# Converting held about this many bytes per byte of the model's float32
# weights (TensorFlow's LiteRT converter on the 0.1B RWKV-7, 12 blocks x
# 768, 729 MB of weights, a 766 MB artifact: 8.8 GB peak with the model
# loaded in the converting process, 6.1 GB in `fill._export`'s, whose child
# loads it, 175 s; kept at 12 for the converter's own variation).
CONVERT_BYTES_PER_WEIGHT_BYTE = 12
# A model folder with more files or bytes than this is not cached (hashing it
# would cost each warm run more than it saves).
MAX_MODEL_FILES = 1000
MAX_MODEL_BYTES = 4 << 30
# The files textgenrnn saves beside `<name>_weights.hdf5`, which the converter
# reads (`convert.textgenrnn.vocab_beside`, its `_config.json`).
TEXTGENRNN_WEIGHTS = "_weights.hdf5"
TEXTGENRNN_SIDECARS = ("_vocab.json", "_config.json")
# A TF checkpoint's files (`convert.tf_checkpoint.is_checkpoint_file`).
_CHECKPOINT_FILE = re.compile(r"\.index$|\.data-\d+-of-\d+$")
# An entry's files: the key's sha256 (40 hex digits) and a suffix.
_ENTRY_FILE = re.compile(r"^([0-9a-f]{40})\.(json|tflite|xnnpack|lock)$")
# The suffix of an entry's weights packed for XNNPACK (`runner.pack_weights`).
PACKED_SUFFIX = ".xnnpack"
# The files an entry's size counts (`entries`, `max_bytes`).
_COUNTED_SUFFIXES = (".json", ".tflite", PACKED_SUFFIX)
# Temp files older than this are left by a killed writer.
_STALE_TEMP_SECONDS = 3600
_CHUNK = 1 << 20
DIGESTS_FILE = "digests.json"
MAX_DIGESTS = 2000
# A file changed less than this before its digest was taken may change again
# within the same timestamp tick: its digest is not remembered ("racy git").
_RACY_SECONDS = 2.0


class Miss(Exception):
  """No usable entry; the message says why (for --verbose).

  Attributes:
    rebuild: whether building the entry would help (False when the export
      refuses this model or failed, as its manifest records).
  """

  def __init__(self, reason: str, rebuild: bool = True):
    super().__init__(reason)
    self.rebuild = rebuild


def file_sha256(path) -> str:
  with open(path, "rb") as f:
    return _stream_sha256(f)


def _stream_sha256(f) -> str:
  """The sha256 of what is left to read of the open file `f`."""
  digest = hashlib.sha256()
  for chunk in iter(lambda: f.read(_CHUNK), b""):
    digest.update(chunk)
  return digest.hexdigest()


def model_files(model_path: str) -> List[Tuple[str, str]]:
  """(name in the key, path) of every file the loader reads for `model_path`.

  Found by name, without importing the converters (which import
  TensorFlow):
    - a folder (a char-rnn-tensorflow save folder, a TF checkpoint folder, an
      unzipped .keras): every file in it, by its path inside;
    - a TF checkpoint prefix or one of its files: every file in its folder
      (the checkpoint's shards, the `checkpoint` file, a char-rnn-tensorflow
      folder's config.pkl and chars_vocab.pkl);
    - textgenrnn's `<name>_weights.hdf5`: it, and `<name>_vocab.json` and
      `<name>_config.json` where they exist;
    - any other file: itself, named "" (so a copy keys as the original).

  Raises:
    OSError: `model_path` or a file of it cannot be read.
    ValueError: a folder with more than MAX_MODEL_FILES files or
      MAX_MODEL_BYTES bytes.
  """
  path = os.path.abspath(model_path)
  if os.path.isdir(path):
    return _folder_files(path)
  directory, name = os.path.split(path)
  if _CHECKPOINT_FILE.search(name) or (not os.path.exists(path) and
                                       os.path.isfile(path + ".index")):
    return [(f"{name}:", path)] + _folder_files(directory, recursive=False)
  files = [("", path)]
  if name.endswith(TEXTGENRNN_WEIGHTS):
    stem = name[:-len(TEXTGENRNN_WEIGHTS)]
    files += [(suffix, os.path.join(directory, stem + suffix))
              for suffix in TEXTGENRNN_SIDECARS
              if os.path.isfile(os.path.join(directory, stem + suffix))]
  return files


def _folder_files(folder: str, recursive: bool = True
                  ) -> List[Tuple[str, str]]:
  """Every regular file under `folder` (or only in it), not into linked
  folders, sorted; raises ValueError past the limits of `model_files`."""
  found = []
  total = 0
  for directory, subdirs, files in os.walk(folder):
    subdirs[:] = sorted(subdirs) if recursive else []
    for name in sorted(files):
      path = os.path.join(directory, name)
      if not os.path.isfile(path):
        continue
      total += os.path.getsize(path)
      found.append((os.path.relpath(path, folder).replace(os.sep, "/"), path))
      if len(found) > MAX_MODEL_FILES or total > MAX_MODEL_BYTES:
        raise ValueError(f"{folder} holds more than {MAX_MODEL_FILES} files "
                         f"or {MAX_MODEL_BYTES >> 30} GB: not cached")
  return found


def model_digest(model_path: str, digests=None) -> list:
  """[[name, sha256], ...] of `model_files(model_path)`; a prefix's entry
  (the checkpoint named) has no sha256. Raises as `model_files`.

  Args:
    model_path: as `model_files`'.
    digests: a `_Digests` that remembers files' digests, or None.
  """
  sha256 = digests.sha256 if digests else file_sha256
  return [[name, "" if name.endswith(":") else sha256(path)]
          for name, path in model_files(model_path)]


def sources_digest(root: Optional[str] = None, digests=None) -> str:
  """sha256 over rnnstep's own sources outside cli/ (the export's code).

  Args:
    root: the package folder; default: the rnnstep imported.
    digests: a `_Digests` that remembers files' digests, or None.
  """
  root = root or PACKAGE_ROOT
  digest = hashlib.sha256()
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs
                        if d not in ("cli", "__pycache__", "data"))
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(directory, name)
      digest.update(os.path.relpath(path, root).encode() + b"\0")
      digest.update(bytes.fromhex(digests.sha256(path) if digests
                                  else file_sha256(path)))
  return digest.hexdigest()


def runtime_version() -> Optional[str]:
  """ai_edge_litert's version, or None when it is not installed."""
  return tuning_cache.installed_version(RUNTIME_DISTRIBUTION)


def key(model_path: str, runtime: str,
        weights_dtype: Optional[str] = None) -> dict:
  """The cache key of the artifact for the model at `model_path` (loaded
  with `weights_dtype`, where given: rnnstep-generate's --weights_dtype).

  Raises:
    OSError, ValueError: as `model_files`.
  """
  this = cpu.info()
  digests = _Digests()
  the_key = {"format": FORMAT, "version": VERSION,
             "model": model_digest(model_path, digests),
             "tensorflow": tuning_cache.installed_tensorflow_version(),
             "rnnstep": version.__version__,
             "rnnstep_sources": sources_digest(digests=digests),
             "runtime": f"{RUNTIME_DISTRIBUTION} {runtime}",
             "cpu": this.name, "cpu_flags": list(this.features),
             "export": runner.EXPORT_OPTIONS}
  if weights_dtype is not None:  # Without it, the keys of before.
    the_key["weights_dtype"] = weights_dtype
  digests.save()
  return the_key


def entry_name(the_key: dict) -> str:
  text = json.dumps(the_key, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def directory() -> str:
  """The folder holding the entries."""
  return os.path.join(tuning_cache.cache_dir(), SUBDIR)


def entry_base(the_key: dict) -> str:
  """The entry's path without its suffix (.tflite, .json, .lock)."""
  return os.path.join(directory(), entry_name(the_key))


def ensure_directory() -> str:
  """Makes the cache folder and its `litert/`, each 0700; returns the latter.

  Raises:
    OSError: it cannot be made.
  """
  inner = directory()
  outer = os.path.dirname(inner)
  os.makedirs(os.path.dirname(outer) or ".", exist_ok=True)
  for folder in (outer, inner):
    with contextlib.suppress(FileExistsError):
      os.mkdir(folder, 0o700)
  return inner


def _user() -> int:
  """The user whose entries are trusted: the one running."""
  return os.getuid()


def _check_trusted(st: os.stat_result, what: str):
  """Raises Miss unless `st` is the running user's and not writable by
  group or others (POSIX only: elsewhere, where `fill` cannot lock, no entry
  is written)."""
  if os.name != "posix":
    return
  if st.st_uid != _user():
    raise Miss(f"{what} is owned by another user (uid {st.st_uid}): not "
               "trusted")
  if st.st_mode & 0o022:
    raise Miss(f"{what} is writable by others (mode "
               f"{oct(st.st_mode & 0o777)}): not trusted")


def check_directory(folder: str):
  try:
    st = os.stat(folder)
  except FileNotFoundError:
    raise Miss("no compiled artifact for this model yet") from None
  except OSError as e:
    raise Miss(f"cache folder unreadable ({e.strerror or e})") from None
  _check_trusted(st, f"the cache folder {folder}")


def _read_trusted(path: str, limit: int, what: str) -> bytes:
  """At most `limit` + 1 bytes of `path`, once its owner and mode pass.

  Raises:
    FileNotFoundError: no such file.
    OSError: unreadable.
    Miss: not trusted.
  """
  with open(path, "rb") as f:
    _check_trusted(os.fstat(f.fileno()), what)
    return f.read(limit + 1)


def read_manifest(base: str, the_key: dict) -> dict:
  """The entry's manifest, checked against `the_key`; raises Miss."""
  try:
    raw = _read_trusted(base + ".json", MAX_MANIFEST_BYTES,
                        "the cache manifest")
  except FileNotFoundError:
    raise Miss("no compiled artifact for this model yet") from None
  except OSError as e:
    raise Miss(f"cache manifest unreadable ({e.strerror or e})") from None
  try:
    if len(raw) > MAX_MANIFEST_BYTES:
      raise ValueError("too large")
    manifest = json.loads(raw.decode("utf-8"))
  except ValueError:
    raise Miss("cache manifest corrupt") from None
  if not isinstance(manifest, dict) or manifest.get("key") != the_key:
    raise Miss("cache entry was made for another key (version, CPU or model)")
  if "unsupported" in manifest:
    raise Miss(f"the compiled artifact cannot serve this model: "
               f"{manifest['unsupported']}", rebuild=False)
  if "failed" in manifest:
    raise Miss(f"the compiled artifact's export failed ({manifest['failed']})"
               "; not retried until the model, rnnstep, TensorFlow or the "
               "runtime changes (--cache_clear retries)", rebuild=False)
  vocab = manifest.get("vocab")
  if (not isinstance(manifest.get("tflite_sha256"), str)
      or not isinstance(manifest.get("tflite_bytes"), int)
      or ("xnnpack_sha256" in manifest
          and (not isinstance(manifest["xnnpack_sha256"], str)
               or not isinstance(manifest.get("xnnpack_bytes"), int)))
      or not isinstance(vocab, list) or not vocab
      or not all(isinstance(c, str) for c in vocab)
      or not isinstance(manifest.get("tokens"), (str, type(None)))
      or not isinstance(manifest.get("primes_in_bulk", False), bool)
      or type(manifest.get("prime_bytes", 0)) is not int  # Not a bool.
      or manifest.get("prime_bytes", 0) < 0):
    raise Miss("cache manifest corrupt")
  return manifest


class _Digests:
  """sha256 of files, remembered by their stat in `litert/digests.json`.

  A warm run keys on ~75 source files and the model's files: reading and
  hashing them all costs it ~15 ms of its ~0.25 s on a 2-vCPU Zen 3; it
  checks its entry's flatbuffer and packed weights too (`open_entry`: 1.3
  GB at the 0.1B RWKV-7, ~0.6 s of hashing a run). A remembered digest
  is used only while the file's size, mtime, ctime, inode and device are
  those it was taken with; a write changes the ctime (which no user call
  can set back), and a file modified within `_RACY_SECONDS` of hashing is
  not remembered, so one changed byte is always seen. The file is trusted
  as an entry is (owner, mode) and written atomically; a lost update only
  costs a re-hash.
  """

  def __init__(self):
    self.path = os.path.join(directory(), DIGESTS_FILE)
    self.known = {}
    self.added = {}
    with contextlib.suppress(OSError, ValueError, Miss):
      raw = _read_trusted(self.path, MAX_MANIFEST_BYTES, "the digests file")
      data = json.loads(raw.decode("utf-8"))
      if isinstance(data, dict):
        self.known = data

  def sha256(self, path: str, f=None) -> str:
    """`path`'s sha256; with `f`, the file open there, stat and read
    through `f` (the file checked is the file used)."""
    st = os.fstat(f.fileno()) if f else os.stat(path)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    found = self.known.get(path)
    if (isinstance(found, list) and len(found) == 2 and found[0] == stamp
        and isinstance(found[1], str)):
      return found[1]
    if f is None:
      digest = file_sha256(path)
    else:
      digest = _stream_sha256(f)
    newest = max(st.st_mtime_ns, st.st_ctime_ns) / 1e9
    if time.time() - newest > _RACY_SECONDS:
      self.added[path] = [stamp, digest]
    return digest

  def save(self):
    """Writes the digests learnt, where the cache folder exists and is
    trusted; errors are ignored."""
    if not self.added:
      return
    with contextlib.suppress(OSError, Miss):
      check_directory(os.path.dirname(self.path))
      merged = dict(self.known)
      merged.update(self.added)
      kept = list(merged.items())[-MAX_DIGESTS:]
      with staging.staged_path(self.path, mode=0o600) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
          json.dump(dict(kept), f)
      self.known, self.added = dict(kept), {}


def tokens_of(manifest: dict):
  """A token model's `vocabulary.Tokens` from its manifest; None for a
  character model. Raises Miss where the recorded vocabulary is unusable."""
  if manifest.get("tokens") is None:
    return None
  from rnnstep.model import vocabulary  # pylint: disable=g-import-not-at-top
  try:
    return vocabulary.Tokens.from_json(json.loads(manifest["tokens"]),
                                       manifest["vocab"])
  except ValueError as e:
    raise Miss(f"cache manifest's vocabulary unusable ({e})") from None


def enabled() -> bool:
  """False when RNNSTEP_COMPILED_CACHE is off/0/false/no (as --nocache).

  The environment's switch serves whole test suites and scripts that run the
  tool many times and want no background exports (tests/conftest.py).
  """
  return (os.environ.get("RNNSTEP_COMPILED_CACHE", "").strip().lower()
          not in tuning_cache.OFF_VALUES)


def lookup(the_key: dict) -> Tuple[bytes, dict]:
  """(flatbuffer bytes, manifest) of a valid entry (`open_entry`'s);
  raises Miss."""
  with open_entry(the_key) as artifact:
    return artifact.read(), artifact.manifest


class Artifact:
  """A valid entry's files, open and checked (`open_entry`).

  `path` (and `weight_cache`) name the files that were checked, not what
  their names hold by the time the runtime opens them (/proc/self/fd/N
  where the system has it). `close`, or a `with` block, releases them.

  Attributes:
    manifest: the entry's manifest.
    path: the flatbuffer's.
    weight_cache: its weights packed for XNNPACK (`runner.pack_weights`),
      or None where the entry has none.
  """

  def __init__(self, manifest: dict, flatbuffer, packed=None):
    self.manifest = manifest
    self._files = [f for f in (flatbuffer, packed) if f is not None]
    self.path = _path_of(flatbuffer)
    self.weight_cache = None if packed is None else _path_of(packed)

  def read(self) -> bytes:
    """The flatbuffer's bytes."""
    self._files[0].seek(0)
    return self._files[0].read()

  def close(self):
    for f in self._files:
      f.close()

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()


def open_entry(the_key: dict) -> Artifact:
  """The valid entry for `the_key`, its files checked and left open; raises
  Miss.

  The flatbuffer and its packed weights are each opened once, checked
  (owner and mode, then size and sha256 against the manifest) through that
  open file, and run through it. A hit marks the entry used (its
  manifest's mtime), for the cap's LRU.
  """
  base = entry_base(the_key)
  check_directory(os.path.dirname(base))
  manifest = read_manifest(base, the_key)
  digests = _Digests()
  flatbuffer = _open_checked(base + ".tflite", manifest["tflite_bytes"],
                             manifest["tflite_sha256"], "compiled artifact",
                             digests)
  packed = None
  if "xnnpack_sha256" in manifest:
    try:
      packed = _open_checked(base + PACKED_SUFFIX, manifest["xnnpack_bytes"],
                             manifest["xnnpack_sha256"], "packed-weights file",
                             digests)
    except BaseException:
      flatbuffer.close()
      raise
  digests.save()
  with contextlib.suppress(OSError):
    os.utime(base + ".json")
  return Artifact(manifest, flatbuffer, packed)


def _open_checked(path: str, size: int, sha256: str, what: str, digests):
  """`path` open for reading, once its owner and mode pass and its bytes
  are `size` long with this sha256 (the `_Digests`' remembered one while
  the open file's stat is the one it was taken with); raises Miss."""
  try:
    f = open(path, "rb")  # pylint: disable=consider-using-with
  except OSError as e:
    raise Miss(f"{what} unreadable ({e.strerror or e})") from None
  try:
    st = os.fstat(f.fileno())
    _check_trusted(st, f"the {what}")
    if st.st_size != size or digests.sha256(path, f) != sha256:
      raise Miss(f"{what} does not match its manifest's sha256 (corrupt "
                 "or truncated)")
  except OSError as e:
    f.close()
    raise Miss(f"{what} unreadable ({e.strerror or e})") from None
  except BaseException:
    f.close()
    raise
  return f


def _path_of(f) -> str:
  """A path that opens the file `f` has open, whatever its name holds now
  (Linux's /proc/self/fd), else its name."""
  fd_path = f"/proc/self/fd/{f.fileno()}"
  return fd_path if os.path.exists(fd_path) else f.name


def child_path() -> List[str]:
  """The background child's sys.path: the folder this rnnstep was imported
  from, then the parent's sys.path less '' and relative entries and less
  the working directory (where a stray `numpy.py` may lie)."""
  root = os.path.dirname(PACKAGE_ROOT)
  try:
    here = os.path.realpath(os.getcwd())
  except OSError:
    here = None
  out = [root]
  for entry in sys.path:
    if (entry and os.path.isabs(entry) and entry not in out
        and os.path.realpath(entry) != here):
      out.append(entry)
  return out


def size_refusal(weight_bytes: int, available_memory: Optional[int]
                 ) -> Tuple[Optional[str], bool]:
  """Why the artifact of a model with `weight_bytes` of float32 weights is
  not built, before converting, and whether to record it; (None, False)
  when it may be.

  The flatbuffer holds every weight at least once, so weights over an
  explicit cap (`max_bytes`: the default one grows to admit them) make an
  artifact that would be evicted at once (recorded: not tried again until
  the key changes, as a refused export is). A conversion needing more than
  `available_memory` (about `CONVERT_BYTES_PER_WEIGHT_BYTE` x the weights)
  is not started this time.
  """
  cap = max_bytes(weight_bytes)
  if weight_bytes > cap:
    return (f"its float32 weights alone ({_megabytes(weight_bytes)} MB) "
            f"exceed the cache's cap ({MAX_MB_ENV}={_megabytes(cap)})"), True
  need = CONVERT_BYTES_PER_WEIGHT_BYTE * weight_bytes
  if available_memory is not None and need > available_memory:
    return (f"converting needs about {need / 2**30:.1f} GB, "
            f"{available_memory / 2**30:.1f} GB is available"), False
  return None, False


def max_bytes(admitting: int = 0) -> int:
  """The cap on the entries' total size, in bytes.

  $RNNSTEP_CACHE_MAX_MB where set (`tuning_cache.max_bytes`). Otherwise it
  follows the models its user runs: the larger of the default
  (`tuning_cache.DEFAULT_MAX_MB`, 512 MB) and twice the largest entry (its
  flatbuffer, packed weights and manifest, as `entries` counts it: a
  manifest holds the vocabulary, 645 kB for the world vocabulary's), one
  kept or the `admitting` bytes about to be, so that the largest model and
  another of its size stay (the 0.1B RWKV-7's artifact alone is 766 MB, its
  packed weights 563 MB; its float32 and 16-bit artifacts are the same
  bytes). The
  memory converting needs (`size_refusal`) bounds what is built; packed
  weights that would take an entry past an explicit cap are not kept
  (`fill.packed_weights`).
  """
  if MAX_MB_ENV in os.environ:
    return tuning_cache.max_bytes()
  sizes = collections.Counter()  # An entry's bytes, as `entries` counts them.
  with contextlib.suppress(OSError):
    folder = directory()
    for name in os.listdir(folder):
      match = _ENTRY_FILE.match(name)
      if match and "." + match.group(2) in _COUNTED_SUFFIXES:
        with contextlib.suppress(OSError):
          sizes[match.group(1)] += os.path.getsize(os.path.join(folder, name))
  largest = max([admitting, *sizes.values()])
  return max(tuning_cache.max_bytes(), 2 * largest)


def cap_source() -> str:
  """Where `max_bytes` comes from, in words (`--cache_info`): unset, the
  cap follows the entries, which "($RNNSTEP_CACHE_MAX_MB)" would misname as
  a value the user set."""
  if MAX_MB_ENV in os.environ:
    return f"${MAX_MB_ENV}"
  return (f"twice the largest entry, at least {tuning_cache.DEFAULT_MAX_MB} "
          f"MB; ${MAX_MB_ENV} sets it")


def _megabytes(n: int) -> str:
  megabytes = n / 2**20
  return f"{megabytes:.0f}" if megabytes >= 10 else f"{megabytes:.2g}"


def one_line(error: BaseException) -> str:
  return " ".join(str(error).split())[:500] or type(error).__name__


def write_entry(the_key: dict, *, flatbuffer: Optional[bytes] = None,
                vocab=None, tokens: Optional[str] = None,
                primes_in_bulk: bool = False, prime_bytes: int = 0,
                unsupported: Optional[str] = None,
                failed: Optional[str] = None, model_path: str = "",
                pack: Optional[Callable[[str, int], dict]] = None):
  """Writes an entry (flatbuffer first, manifest last, each atomically and
  0600), then trims the cache to its cap (`prune`).

  With `pack` (`fill.packed_weights`), a flatbuffer past
  `runner.BUILTIN_KERNELS_FROM_BYTES` gets its weights packed for XNNPACK
  before the manifest: `pack(base, flatbuffer_bytes)` returns the
  manifest's fields for them.
  """
  base = entry_base(the_key)
  manifest = {"format": FORMAT, "version": VERSION, "key": the_key,
              "model_path": model_path}
  if unsupported is not None:
    manifest["unsupported"] = unsupported
  elif failed is not None:
    manifest["failed"] = failed
  else:
    with staging.staged_path(base + ".tflite", mode=0o600) as tmp:
      with open(tmp, "wb") as f:
        f.write(flatbuffer)
    manifest.update(tflite_sha256=hashlib.sha256(flatbuffer).hexdigest(),
                    tflite_bytes=len(flatbuffer), vocab=list(vocab),
                    tokens=tokens, primes_in_bulk=bool(primes_in_bulk),
                    prime_bytes=int(prime_bytes))
    with contextlib.suppress(OSError):
      os.unlink(base + PACKED_SUFFIX)  # An earlier build's.
    if pack and len(flatbuffer) > runner.BUILTIN_KERNELS_FROM_BYTES:
      manifest.update(pack(base, len(flatbuffer)))
  with staging.staged_path(base + ".json", mode=0o600) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(manifest, f, ensure_ascii=False, sort_keys=True)
  prune()



# `weights_dtype`: the one its key records (`key`), None for the model's own.
Entry = collections.namedtuple(
    "Entry", "name bytes last_used status model weights_dtype")


def entries() -> List[Entry]:
  """The cache's entries, most recently used first (`--cache_info`).

  `status`: "built", "unsupported: why", "failed: why" or "unreadable".
  """
  folder = directory()
  try:
    names = os.listdir(folder)
  except OSError:
    return []
  found = []
  for name in names:
    match = _ENTRY_FILE.match(name)
    if not match or match.group(2) != "json":
      continue
    base = os.path.join(folder, match.group(1))
    size = 0
    for suffix in _COUNTED_SUFFIXES:
      with contextlib.suppress(OSError):
        size += os.path.getsize(base + suffix)
    try:
      last_used = os.path.getmtime(base + ".json")
      with open(base + ".json", "rb") as f:
        manifest = json.loads(f.read(MAX_MANIFEST_BYTES).decode("utf-8"))
      status = ("built" if "tflite_sha256" in manifest else
                f"unsupported: {manifest['unsupported']}"
                if "unsupported" in manifest else
                f"failed: {manifest.get('failed')}")
      model = str(manifest.get("model_path", ""))
      weights_dtype = manifest.get("key", {}).get("weights_dtype")
      weights_dtype = None if weights_dtype is None else str(weights_dtype)
    except (OSError, ValueError, AttributeError, TypeError):
      last_used, status, model, weights_dtype = 0.0, "unreadable", "", None
    found.append(Entry(match.group(1), size, last_used, status, model,
                       weights_dtype))
  return sorted(found, key=lambda e: e.last_used, reverse=True)


def _remove(base: str):
  for suffix in (".json", ".tflite", PACKED_SUFFIX, ".lock"):
    with contextlib.suppress(OSError):
      os.unlink(base + suffix)


def _held(base: str) -> bool:
  """Whether a child is building this entry now (its lock is held)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  try:
    with open(base + ".lock", "rb") as lock:
      try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        return True
      return False
  except OSError:
    return False


def prune(cap: Optional[int] = None) -> List[str]:
  """Trims the cache to `cap` bytes (default `max_bytes()`): removes the
  least recently used entries first, then locks no child holds whose entry
  is gone and temp files left by killed writers. Returns the names removed.
  """
  cap = max_bytes() if cap is None else cap
  folder = directory()
  removed = []
  total = 0
  for entry in entries():
    total += entry.bytes
    if total > cap and not _held(os.path.join(folder, entry.name)):
      _remove(os.path.join(folder, entry.name))
      removed.append(entry.name)
  try:
    names = os.listdir(folder)
  except OSError:
    return removed
  now = time.time()
  for name in names:
    path = os.path.join(folder, name)
    match = _ENTRY_FILE.match(name)
    with contextlib.suppress(OSError):
      if match and match.group(2) == "lock":
        base = path[:-len(".lock")]
        if not os.path.exists(base + ".json") and not _held(base):
          os.unlink(path)
      elif (name.startswith(".") and name.endswith(".tmp")
            and now - os.path.getmtime(path) > _STALE_TEMP_SECONDS):
        os.unlink(path)
  return removed


def clear() -> Tuple[int, int]:
  """Removes every entry no child is building, and the remembered digests;
  returns (entries, bytes) removed."""
  folder = directory()
  count = size = 0
  for entry in entries():
    base = os.path.join(folder, entry.name)
    if not _held(base):
      _remove(base)
      count += 1
      size += entry.bytes
  with contextlib.suppress(OSError):
    os.unlink(os.path.join(folder, DIGESTS_FILE))
  prune()
  return count, size
