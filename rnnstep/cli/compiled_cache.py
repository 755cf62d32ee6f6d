"""The compiled-artifact cache: rnnstep-generate without TensorFlow on a warm run.

A fresh `rnnstep-generate` pays seconds before its first character: importing
TensorFlow (~4.4 s on a 2-vCPU Zen 3), tracing and compiling the loop (~3-4 s)
and TF's teardown. The loop it runs can also be a LiteRT flatbuffer
(`rnnstep.exporters.litert`: builtin ops only, the whole generation in one
call, the library's text for the same seed), which the `ai_edge_litert`
interpreter runs from a process that imports only numpy: ~0.3-0.5 s in all.

So the command keeps one exported flatbuffer per model file here, and a run
whose request the flatbuffer serves (`servable` in cli/generate.py) runs it
instead of TensorFlow. A run that finds no valid entry generates on the
TensorFlow path as before and, once its text is written, starts a detached
child (`python -m rnnstep.cli.cache_fill`, `spawn_fill`) that builds the
entry for the next run; the user's command does not wait for it. The
flatbuffer is run by `rnnstep.exporters.litert_runner`.

Entries live in `<cache dir>/litert/` (the tuning cache's directory:
$RNNSTEP_CACHE_DIR, else $XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep), one
per key, named by the key's sha256:

  NAME.tflite   the flatbuffer
  NAME.json     the manifest: the full key, the flatbuffer's sha256 and size,
                the vocabulary (and a token model's kind and rules,
                `Tokens.to_json`, so that a warm run tokenizes and decodes
                as the library does); or, for a model the export refuses (a
                model recording a window), {"unsupported": reason}
  NAME.lock     held (flock) by the child that builds the entry

The key (`key`) is everything the artifact's bytes or validity depend on:
the model file's sha256, rnnstep's version and a digest of its sources
(outside cli/: a changed loop or sampler is a different artifact even before
a release), the runtime (ai_edge_litert's version), the CPU (model name and
the features of `cpu.FEATURES`) and the export's options. Another version,
CPU or model file names another entry, and an entry whose manifest holds
another key is not used.

Nothing here is trusted: `lookup` reads the manifest (JSON only, size-capped),
checks its key, reads the flatbuffer and checks its sha256 against the
manifest before the interpreter sees a byte; anything missing, corrupt or
stale is a miss, and the next cold run rebuilds it. Writes are atomic
(`staging.staged_path`: temp file + os.replace), flatbuffer first and manifest
last, so a reader never sees a manifest whose artifact is not complete; two
children filling one entry are serialised by the lock (the second one exits),
and the export is reproducible (the same bytes from a fresh process), so even
last-writer-wins would leave identical content.

This module imports neither TensorFlow nor the interpreter at module level:
the fast path (`litert_runner.run_artifact`) imports `ai_edge_litert` and
numpy only (and, for a token model, `rnnstep.model.vocabulary`, which imports
no TensorFlow; a subword model's `tokenizers`), the child imports TensorFlow
to export.
"""

import contextlib
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from typing import Optional, Tuple

from rnnstep.engine import cpu
from rnnstep.engine import tuning_cache
from rnnstep.exporters import litert_runner
import rnnstep
from rnnstep import staging

FORMAT = "rnnstep-litert-cache"
VERSION = 1
SUBDIR = "litert"
RUNTIME_DISTRIBUTION = "ai-edge-litert"
MAX_MANIFEST_BYTES = 16 << 20  # A manifest holds the vocabulary (<= 1M chars).
_CHUNK = 1 << 20


class Miss(Exception):
  """No usable entry; the message says why (for --verbose).

  Attributes:
    rebuild: whether building the entry would help (False when the export
      refuses this model, as its manifest records).
  """

  def __init__(self, reason: str, rebuild: bool = True):
    super().__init__(reason)
    self.rebuild = rebuild


def file_sha256(path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_CHUNK), b""):
      digest.update(chunk)
  return digest.hexdigest()


def sources_digest() -> str:
  """sha256 over rnnstep's own sources outside cli/ (the export's code)."""
  root = os.path.dirname(os.path.abspath(rnnstep.__file__))
  digest = hashlib.sha256()
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs
                        if d not in ("cli", "__pycache__", "data"))
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(directory, name)
      digest.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f:
        digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()


def runtime_version() -> Optional[str]:
  """ai_edge_litert's version, or None when it is not installed."""
  try:
    return importlib.metadata.version(RUNTIME_DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    return None


def key(model_path: str, runtime: str) -> dict:
  """The cache key of the artifact for the model file at `model_path`."""
  this = cpu.info()
  return {"format": FORMAT, "version": VERSION,
          "model_sha256": file_sha256(model_path),
          "rnnstep": rnnstep.__version__, "rnnstep_sources": sources_digest(),
          "runtime": f"{RUNTIME_DISTRIBUTION} {runtime}",
          "cpu": this.name, "cpu_flags": list(this.features),
          "export": litert_runner.EXPORT_OPTIONS}


def entry_name(the_key: dict) -> str:
  text = json.dumps(the_key, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def entry_base(the_key: dict) -> str:
  """The entry's path without its suffix (.tflite, .json, .lock)."""
  return os.path.join(tuning_cache.cache_dir(), SUBDIR, entry_name(the_key))


def read_manifest(base: str, the_key: dict) -> dict:
  """The entry's manifest, checked against `the_key`; raises Miss."""
  try:
    with open(base + ".json", "rb") as f:
      raw = f.read(MAX_MANIFEST_BYTES + 1)
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
  vocab = manifest.get("vocab")
  if (not isinstance(manifest.get("tflite_sha256"), str)
      or not isinstance(manifest.get("tflite_bytes"), int)
      or not isinstance(vocab, list) or not vocab
      or not all(isinstance(c, str) for c in vocab)
      or not isinstance(manifest.get("tokens"), (str, type(None)))):
    raise Miss("cache manifest corrupt")
  return manifest


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
  """(flatbuffer bytes, manifest) of a valid entry; raises Miss."""
  base = entry_base(the_key)
  manifest = read_manifest(base, the_key)
  try:
    with open(base + ".tflite", "rb") as f:
      flatbuffer = f.read(manifest["tflite_bytes"] + 1)
  except OSError as e:
    raise Miss(f"compiled artifact unreadable ({e.strerror or e})") from None
  if (len(flatbuffer) != manifest["tflite_bytes"]
      or hashlib.sha256(flatbuffer).hexdigest() != manifest["tflite_sha256"]):
    raise Miss("compiled artifact does not match its manifest's sha256 "
               "(corrupt or truncated)")
  return flatbuffer, manifest


def spawn_fill(model_path: str, the_key: dict):
  """Starts the detached child that builds the entry; does not wait.

  Its own session (Ctrl-C at the terminal does not reach it), no stdio, low
  priority. Errors starting it are ignored: the next run tries again.
  """
  base = entry_base(the_key)
  with contextlib.suppress(OSError):
    os.makedirs(os.path.dirname(base), exist_ok=True)
    subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "rnnstep.cli.cache_fill", model_path,
         json.dumps(the_key, sort_keys=True)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def fill(model_path: str, the_key: dict) -> str:
  """Builds the entry for `the_key` (the child's work); returns what it did.

  Holds the entry's lock while it works: a second child finds it held and
  leaves. An entry already valid is kept. The model file must still hash to
  the key's sha256 (before and after loading), else nothing is written.
  """
  import fcntl  # pylint: disable=g-import-not-at-top
  base = entry_base(the_key)
  directory = os.path.dirname(base)
  if not os.path.isdir(directory):  # Made by the parent; gone: cache removed.
    return "no cache directory"
  with open(base + ".lock", "a+b") as lock:
    try:
      fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return "another process is building this entry"
    try:
      lookup(the_key)
      return "already valid"
    except Miss:
      pass
    if file_sha256(model_path) != the_key["model_sha256"]:
      return "model file changed"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from rnnstep.exporters import litert  # pylint: disable=g-import-not-at-top
    model = rnnstep.load(model_path)
    if file_sha256(model_path) != the_key["model_sha256"]:
      return "model file changed"
    manifest = {"format": FORMAT, "version": VERSION, "key": the_key}
    try:
      flatbuffer = litert.convert(model)
    except ValueError as e:  # E.g. a model that records a window.
      manifest["unsupported"] = str(e)
    else:
      with staging.staged_path(base + ".tflite") as tmp:
        with open(tmp, "wb") as f:
          f.write(flatbuffer)
      manifest.update(tflite_sha256=hashlib.sha256(flatbuffer).hexdigest(),
                      tflite_bytes=len(flatbuffer), vocab=list(model.vocab),
                      tokens=(None if model.is_characters
                              else model.tokens.to_json()))
    with staging.staged_path(base + ".json") as tmp:
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False, sort_keys=True)
    return "unsupported" if "unsupported" in manifest else "built"
