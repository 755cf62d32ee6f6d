"""XLA's on-disk cache of compiled programs, in rnnstep's cache folder.

TensorFlow can keep the XLA programs it compiles on disk and load them in
the next process instead of compiling them again
(`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR`; TF 2.21 on CPU:
`tf.function(jit_compile=True)` writes one file per program,
`xla_compile_cache__<signature>__<HLO fingerprint>__XLA_CPU_JIT.pb`, and a
later process that lowers the same function to the same HLO loads it: the
bundled model's first XLA call, 3.2 s, takes 1.9 s in the next process, its
trace and lowering to HLO; the LLVM compile is gone). TensorFlow reads the
flags once, at its first function or device query (its passes and devices
read them, XLA or not), so `enable` sets it when `rnnstep.engine` is
imported; a process that used TensorFlow before has its flags read already
and is left as it is, and so is a `TF_XLA_FLAGS` that names its own
folder.

The folder is `<cache dir>/xla/<key>/` (the tuning cache's folder,
`tuning_cache.cache_dir`, as the LiteRT artifacts': $RNNSTEP_CACHE_DIR,
else $XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep), the key a digest of
the TensorFlow version, rnnstep's version and the CPU (model name and
`cpu.FEATURES`): a program compiled for one CPU's instructions is machine
code another CPU may not run. rnnstep's sources need no key of their own:
TensorFlow compares the whole HLO of an entry with the one it lowered
(changed code is another program). The HLO holds the names TensorFlow gave
the traced functions from a process-wide counter, so a program would be
found again only by a process that traced in the same order:
`generator.stable_names` numbers each trace of a `Programs` function from a
base of its own, the same in every process.

What TensorFlow checks: the entry's key (signature and HLO fingerprint,
device type) and, strictly, that its HLO equals the lowered one; then it
loads the executable's bytes as machine code, unchecked, and a file that
does not parse fails the call (the call, not the compile: `Background`
falls back to the graph path, an explicit `jit_compile=True` raises). So,
as for the LiteRT artifacts, nothing here is trusted that we did not
write: `enable` uses the folder only when it and its parents in the cache
are the running user's and not writable by group or others (made 0700),
and removes files owned by another user or writable by others, files that
are not TF's entries, and entries that are not complete (TF writes them in
place: a process killed while writing leaves a truncated file; checked
once per file, `_complete`, and remembered by size and time in
`checked.json`).

Which programs are on disk: TensorFlow's file names are digests only a
compile can make, so when rnnstep's call of a shape compiles a program
(`generator.Programs`) it records the files that appeared under a key of
its own (`record_program`: the architecture, path, function, shapes and
threads) in `programs.json` beside them, written whole (a temp file
renamed) under a lock on the folder. A process that generates once
(rnnstep-generate) asks `has_program` before choosing XLA over the graph
path (`compiling.Background`). The index is read as the entries are
trusted: ours, not writable by others, at most `MAX_INDEX_BYTES`, every
name a TensorFlow entry's; a key whose files are gone (pruned) is not
there.

Bounded as the LiteRT artifacts are: at each process's `enable`, entries
are removed least recently used first (by access or modification time)
until they hold at most $RNNSTEP_CACHE_MAX_MB (default `tuning_cache.DEFAULT_MAX_MB`),
counting the folders of other keys beside this one (`_other_keys`: another
rnnstep, TensorFlow or CPU, which no process of this one reads; each
upgrade left one behind, unbounded), which go once empty and idle.
RNNSTEP_XLA_CACHE=off (0, false, no) turns the cache off.
"""

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
import time
from typing import Iterable, Optional, Set

from rnnstep.engine import cpu
from rnnstep.engine import tuning_cache

SUBDIR = "xla"
SWITCH_ENV = "RNNSTEP_XLA_CACHE"
FLAG = "--tf_xla_persistent_cache_directory="
# The same cap as the LiteRT artifacts' (`tuning_cache.max_bytes`): the
# bundled model's program is about 1 MB.
max_bytes = tuning_cache.max_bytes
CHECKED_FILE = "checked.json"
INDEX_FILE = "programs.json"
# ~150 bytes a program: thousands of programs, far more than the cap holds.
MAX_INDEX_BYTES = 1 << 20
_ENTRY = re.compile(r"^xla_compile_cache__\d+__\d+__[A-Z_]+\.pb$")
# A key's folder name (`directory`).
_KEY_FOLDER = re.compile(r"^[0-9a-f]{20}$")
# Another key's folder is removed only if nothing in it changed for this
# long: a process of that key may have just made it and be about to write.
_IDLE_FOLDER_SECONDS = 3600

_lock = threading.Lock()
_enabled = []  # [folder or None] once `enable` ran.
_pruned = []  # [folder] once `prune_once` ran.


def enabled() -> bool:
  """False when RNNSTEP_XLA_CACHE is off/0/false/no."""
  return (os.environ.get(SWITCH_ENV, "").strip().lower()
          not in tuning_cache.OFF_VALUES)


def key() -> dict:
  """What a compiled program's machine code depends on besides its HLO."""
  this = cpu.info()
  return {"tensorflow": tuning_cache.installed_tensorflow_version(),
          "rnnstep": tuning_cache.installed_version("rnnstep"),
          "cpu": this.name, "cpu_flags": list(this.features)}


def directory() -> str:
  """This TensorFlow's, rnnstep's and CPU's folder of XLA programs."""
  text = json.dumps(key(), sort_keys=True, separators=(",", ":"))
  name = hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]
  return os.path.join(tuning_cache.cache_dir(), SUBDIR, name)



def enable() -> Optional[str]:
  """Points TensorFlow's persistent XLA cache at `directory()`, once per
  process; returns the folder (None: not used). Run when `rnnstep.engine`
  is imported: TensorFlow reads TF_XLA_FLAGS at its first function or
  device query, and the command lines and the server query devices before
  they load a model.

  A no-op where the cache is off, the platform is not POSIX, TF_XLA_FLAGS
  names a folder already, or the folder is not trusted (said once). The
  folder is pruned before the first compile (`prune_once`).
  """
  with _lock:
    if _enabled:
      return _enabled[0]
    folder = None
    if (enabled() and os.name == "posix"
        and FLAG not in os.environ.get("TF_XLA_FLAGS", "")):
      try:
        folder = _trusted_folder()
      except (OSError, ValueError) as e:
        _warn("XLA's program cache is not used: %s", e)
        folder = None
    if folder is not None:
      os.environ["TF_XLA_FLAGS"] = " ".join(filter(None, (
          os.environ.get("TF_XLA_FLAGS"), FLAG + folder)))
    _enabled.append(folder)
    return folder


def _warn(message: str, *args) -> None:
  # absl's logging imported here only: this module loads with
  # `rnnstep.engine`, on rnnstep-generate's TensorFlow-free warm path too.
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.warning(message, *args)


def prune_once() -> None:
  """`prune`s the folder `enable` chose, once per process, before
  TensorFlow compiles (loads) a program: `generator.programs_for` and
  `rnnstep.load` call it."""
  folder = enable()
  with _lock:
    if folder is None or _pruned:
      return
    _pruned.append(folder)
    try:
      prune(folder)
    except OSError as e:
      _warn("XLA's program cache was not pruned: %s", e)


def _trusted_folder() -> str:
  """Makes `directory()` and the folders above it in the cache (0700) and
  checks each is ours and not writable by others.

  Raises:
    OSError: one cannot be made.
    ValueError: one is not trusted.
  """
  folder = directory()
  outer = tuning_cache.cache_dir()
  os.makedirs(os.path.dirname(os.path.abspath(outer)), exist_ok=True)
  for path in (outer, os.path.dirname(folder), folder):
    with contextlib.suppress(FileExistsError):
      os.mkdir(path, 0o700)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
      raise ValueError(f"{path} is another user's or writable by others "
                       f"(mode {oct(st.st_mode & 0o777)}): not trusted")
  return folder


def _varint(data: bytes, pos: int):
  value = shift = 0
  while True:
    if pos >= len(data) or shift > 63:
      raise ValueError("truncated")
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, pos


def _complete(path: str) -> bool:
  """Whether `path` is a whole `XlaSerializedCacheEntry`: its fields key
  (1), hlo_module (2) and executable (3), each length-delimited, read to
  the file's end, the executable not empty. A truncated file fails (TF
  writes in place)."""
  with open(path, "rb") as f:
    data = f.read()
  lengths, pos = {}, 0
  try:
    while pos < len(data):
      tag, pos = _varint(data, pos)
      if tag & 7 != 2:
        return False
      length, pos = _varint(data, pos)
      pos += length
      if pos > len(data):
        return False
      lengths[tag >> 3] = length
  except ValueError:
    return False
  return 1 in lengths and 2 in lengths and lengths.get(3, 0) > 0


def _other_keys(folder: str):
  """The entries in the folders of other keys beside `folder` (under a
  `SUBDIR` folder only), as `(last used, size, path)`, and those folders
  idle for `_IDLE_FOLDER_SECONDS` (no file made or removed in them): only
  folders that are ours and not writable by others, only their regular
  files of ours named as TensorFlow's entries."""
  parent = os.path.dirname(os.path.abspath(folder))
  if os.path.basename(parent) != SUBDIR:
    return [], []
  found, folders = [], []
  for name in os.listdir(parent):
    other = os.path.join(parent, name)
    if other == os.path.abspath(folder) or not _KEY_FOLDER.match(name):
      continue
    with contextlib.suppress(OSError):
      st = os.lstat(other)
      if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
          or st.st_mode & 0o022):
        continue
      if st.st_mtime < time.time() - _IDLE_FOLDER_SECONDS:
        folders.append(other)
      for entry in os.listdir(other):
        path = os.path.join(other, entry)
        with contextlib.suppress(OSError):
          st = os.lstat(path)
          if (_ENTRY.match(entry) and stat.S_ISREG(st.st_mode)
              and st.st_uid == os.getuid()):
            found.append((max(st.st_atime, st.st_mtime), st.st_size, path))
  return found, folders


def _remove_if_empty(folder: str) -> None:
  """Removes another key's idle folder (`_other_keys`) that holds no
  entries any more (its index and checked files with it); one holding
  anything else (another process's temp file) stays."""
  with contextlib.suppress(OSError):
    if any(_ENTRY.match(name) for name in os.listdir(folder)):
      return
    for name in (CHECKED_FILE, INDEX_FILE):
      with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


def prune(folder: str, cap: Optional[int] = None) -> None:
  """Removes what `enable` must not let TensorFlow load (module docstring),
  then the least recently used entries, of this key's folder and the
  others' (`_other_keys`), until the rest fit in `cap` bytes (default
  `max_bytes()`); another key's folder goes once empty."""
  cap = max_bytes() if cap is None else cap
  checked_path = os.path.join(folder, CHECKED_FILE)
  try:
    with open(checked_path, encoding="utf-8") as f:
      checked = json.load(f)
    if not isinstance(checked, dict):
      checked = {}
  except (OSError, ValueError):
    checked = {}
  kept, now_checked = [], {}
  for name in os.listdir(folder):
    path = os.path.join(folder, name)
    if name in (CHECKED_FILE, INDEX_FILE) or name.startswith("."):
      continue  # Ours, or another process's `staging` temp file.
    try:
      st = os.lstat(path)
      seen = [st.st_size, st.st_mtime_ns]
      trusted = (_ENTRY.match(name) and os.path.isfile(path)
                 and not os.path.islink(path) and st.st_uid == os.getuid()
                 and not st.st_mode & 0o022)
      if trusted and checked.get(name) != seen:
        trusted = _complete(path)
      if not trusted:
        os.unlink(path)
        continue
    except OSError:
      continue
    now_checked[name] = seen
    kept.append((max(st.st_atime, st.st_mtime), st.st_size,
                 os.path.join(folder, name)))
  others, other_folders = _other_keys(folder)
  total = 0
  for _, size, path in sorted(kept + others, reverse=True):  # Most recent first.
    total += size
    if total > cap:
      with contextlib.suppress(OSError):
        os.unlink(path)
      if os.path.dirname(path) == folder:
        del now_checked[os.path.basename(path)]
  for other in other_folders:
    _remove_if_empty(other)
  if now_checked != checked:
    _write_json(checked_path, dict(sorted(now_checked.items())))
  with _locked(folder):
    index = _read_index(folder)
    kept = {key: files for key, files in index.items()
            if all(name in now_checked for name in files)}
    if kept != index:
      _write_json(os.path.join(folder, INDEX_FILE), kept)


def _write_json(path: str, value: dict) -> None:
  """Writes `value` to `path` whole (a temp file renamed), owner-only, in
  its order."""
  from rnnstep import staging  # pylint: disable=g-import-not-at-top
  with staging.staged_path(path, mode=0o600) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(value, f)


@contextlib.contextmanager
def _locked(folder: str):
  """Holds an exclusive lock on `folder` (the index's read and write)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  fd = os.open(folder, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # Releases the lock.


def _read_index(folder: str) -> dict:
  """`programs.json` (key -> TensorFlow's file names), or {} where it is
  missing, not ours, writable by others, too long or not such a map."""
  path = os.path.join(folder, INDEX_FILE)
  try:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
  except OSError:
    return {}
  with os.fdopen(fd, "rb") as f:
    st = os.fstat(f.fileno())
    if (st.st_uid != os.getuid() or st.st_mode & 0o022
        or not stat.S_ISREG(st.st_mode)
        or st.st_size > MAX_INDEX_BYTES):
      return {}
    data = f.read(MAX_INDEX_BYTES + 1)
  try:
    index = json.loads(data.decode("utf-8"))
  except ValueError:
    return {}
  if not isinstance(index, dict) or not all(
      isinstance(key, str) and isinstance(files, list) and files
      and all(isinstance(n, str) and _ENTRY.match(n) for n in files)
      for key, files in index.items()):
    return {}
  return index


def entry_names() -> Set[str]:
  """TensorFlow's entries in the folder now (none where the cache is off)."""
  folder = _enabled[0] if _enabled else None
  if folder is None:
    return set()
  try:
    return {name for name in os.listdir(folder) if _ENTRY.match(name)}
  except OSError:
    return set()


def record_program(key: str, files: Iterable[str]) -> None:
  """Records that the program of `key` (the caller's digest of what it
  compiled) is in `files`, the entries its compile wrote."""
  folder = _enabled[0] if _enabled else None
  files = sorted(files)
  if folder is None or not files:
    return
  try:
    with _locked(folder):
      index = _read_index(folder)
      index.pop(key, None)
      index[key] = files  # Last: the first kept when the index is full.
      while (len(index) > 1 and len(json.dumps(index)) > MAX_INDEX_BYTES):
        del index[next(iter(index))]
      _write_json(os.path.join(folder, INDEX_FILE), index)
  except OSError as e:
    _warn("XLA's program index was not written: %s", e)


def has_programs(prefix: str) -> bool:
  """Whether any program whose key starts with `prefix` is recorded."""
  folder = enable()
  return folder is not None and any(
      key.startswith(prefix) for key in _read_index(folder))


def has_program(key: str) -> bool:
  """Whether the program of `key` is on disk: recorded, and its files are
  there."""
  folder = enable()
  if folder is None:
    return False
  files = _read_index(folder).get(key)
  return bool(files) and all(
      os.path.isfile(os.path.join(folder, name)) for name in files)
