"""The compiled-artifact cache's background fill: builds one entry.

`spawn_fill` starts it detached after a cold rnnstep-generate run has
written its text, isolated (`python -I`, in the cache folder, its sys.path
set by `cache.child_path`); by hand and by the tools: `python -m
rnnstep.litert.fill MODEL_PATH KEY_JSON`. `fill` holds the entry's lock,
exports the model (`_export`: a child saves its generation, this process
converts it) and writes the entry (`cache.write_entry`), with a large
artifact's weights packed for XNNPACK (`packed_weights`, in a child).
What an entry is and how a warm run trusts it: `rnnstep.litert.cache`.
"""

import contextlib
import json
import os
import sys

from rnnstep.litert import cache
from rnnstep import staging

# The child's program: the parent's sys.path (less its working directory)
# first, then the fill. `-I` ignores PYTHON* variables and the user's site,
# and, with -c, adds no script folder (3.11+; before, '': the cache folder).
_CHILD = ("import json, sys; sys.path[:0] = json.loads(sys.argv.pop(1)); "
          "from rnnstep.litert import fill; "
          "sys.exit(fill.main(sys.argv))")


def main(argv) -> int:
  """The child: `argv` is [program, MODEL_PATH, KEY_JSON]."""
  with contextlib.suppress(AttributeError, OSError):
    os.nice(10)  # Background work: the user's next command comes first.
  try:
    model_path, the_key = argv[1], json.loads(argv[2])
    print(fill(model_path, the_key))
    return 0
  except Exception as e:  # pylint: disable=broad-except
    # Detached, with no one to tell: the next cold run tries again.
    print(f"failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 1



def spawn_fill(model_path: str, the_key: dict):
  """Starts the detached child that builds the entry; does not wait.

  Its own session (Ctrl-C at the terminal does not reach it), no stdio, low
  priority, isolated (`python -I`, its working directory the cache folder:
  see `cache.child_path`). Errors starting it are ignored: the next run
  tries again.
  """
  with contextlib.suppress(OSError):
    folder = cache.ensure_directory()
    import subprocess  # pylint: disable=g-import-not-at-top
    subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-I", "-c", _CHILD, json.dumps(cache.child_path()),
         model_path, json.dumps(the_key, sort_keys=True)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        cwd=folder, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def _export(model_path: str, weights_dtype=None):
  """(flatbuffer, vocab, tokens JSON or None, primes_in_bulk, prime_bytes)
  of the model (imports TF); primes_in_bulk: the model's cell unrolls block
  by block (`network.unrolls_blockwise`: RWKV-7), so TensorFlow primes a
  prompt with each block's products over all of it at once; prime_bytes:
  the layers' weights, what a primed token costs in proportion, neither the
  embedding (of which it gathers a row) nor the head. Both are for
  `warm.prompt_crossover`.

  A child process loads the model (with `weights_dtype`, where the key
  has one) and saves its generation as a SavedModel
  (`_save_child`); this one converts that, never holding the model: the
  0.1B RWKV-7's conversion peaked at 8.8 GB with the model loaded in the
  same process (~11x its weights, TensorFlow's own ~0.6 GB aside), ~8.4x
  without it.

  Raises:
    ValueError: the export refuses the model (e.g. one recording a window).
    Exception: anything loading or converting raises.
  """
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix="rnnstep_litert_") as work:
    saved = os.path.join(work, "saved")
    child = subprocess.run(
        [sys.executable, "-I", "-c", _SAVE_CHILD,
         json.dumps(cache.child_path()),
         model_path, saved, os.path.join(work, "vocab.json"),
         json.dumps(weights_dtype)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, cwd=work, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    said = child.stderr.decode("utf-8", "replace").strip().splitlines()
    said = said[-1] if said else f"exit status {child.returncode}"
    if child.returncode == _REFUSED:
      raise ValueError(said)
    if child.returncode:
      raise RuntimeError(f"saving the model for conversion failed: {said}")
    with open(os.path.join(work, "vocab.json"), encoding="utf-8") as f:
      vocab, tokens, primes_in_bulk, prime_bytes = json.load(f)
    from rnnstep.litert import export  # pylint: disable=g-import-not-at-top
    return (export.convert_saved(saved), vocab, tokens, primes_in_bulk,
            prime_bytes)


# `_export`'s child: loads the model, saves its generation for the
# converter and its vocabulary beside; exit status _REFUSED with the
# export's refusal (a ValueError) as its last line on stderr.
_REFUSED = 3
_SAVE_CHILD = ("import json, sys; sys.path[:0] = json.loads(sys.argv.pop(1)); "
               "from rnnstep.litert import fill; "
               "sys.exit(fill.save_child(*sys.argv[1:]))")


def save_child(model_path: str, saved_dir: str, vocab_path: str,
               weights_dtype: str = "null") -> int:
  """`_export`'s child's work (imports TensorFlow): see `_SAVE_CHILD`."""
  # pylint: disable=g-import-not-at-top
  from rnnstep import api
  from rnnstep.litert import export
  from rnnstep.model import int8_arithmetic
  from rnnstep.model import network
  # pylint: enable=g-import-not-at-top
  try:
    model = api.load(model_path, weights_dtype=json.loads(weights_dtype))
    os.mkdir(saved_dir, 0o700)
    export.save_generation(model, saved_dir)
  except ValueError as e:
    print(cache.one_line(e), file=sys.stderr)
    return _REFUSED
  with open(vocab_path, "w", encoding="utf-8") as f:
    layers = [weights for weights in model.layer_weights
              + model.backward_weights if weights]
    json.dump([list(model.vocab),
               None if model.is_characters else model.tokens.to_json(),
               network.unrolls_blockwise(model.config),
               sum(int8_arithmetic.bytes_read(v)
                   for weights in layers for v in weights.values())], f)
  return 0


def fill(model_path: str, the_key: dict) -> str:
  """Builds the entry for `the_key` (the child's work); returns what it did.

  Holds the entry's lock while it works: a second child finds it held and
  leaves; the lock file is removed when done. An entry already valid is
  kept. The key must still be this process's key for `model_path` (before
  and after loading), else nothing is written. An export that fails is
  recorded with its reason (`read_manifest` then misses without rebuild).
  """
  import fcntl  # pylint: disable=g-import-not-at-top
  base = cache.entry_base(the_key)
  folder = os.path.dirname(base)
  if not os.path.isdir(folder):  # Made by the parent; gone: cache removed.
    return "no cache directory"
  try:
    cache.check_directory(folder)
  except cache.Miss as e:
    return str(e)
  with open(base + ".lock", "a+b") as lock:
    try:
      fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return "another process is building this entry"
    if _replaced(lock, base + ".lock"):  # Its builder finished meanwhile.
      return "another process is building this entry"
    try:
      return _fill_locked(model_path, the_key, base)
    finally:
      with contextlib.suppress(OSError):
        os.unlink(base + ".lock")  # Still ours and held: removed whole.


def _replaced(lock, path: str) -> bool:
  """Whether the lock file at `path` is no longer the one `lock` holds."""
  try:
    return os.stat(path).st_ino != os.fstat(lock.fileno()).st_ino
  except OSError:
    return True


def _fill_locked(model_path: str, the_key: dict, base: str) -> str:
  try:
    cache.lookup(the_key)
    return "already valid"
  except cache.Miss as e:
    if not e.rebuild:
      return "already recorded"
  weights_dtype = the_key.get("weights_dtype")
  if cache.key(model_path, cache.runtime_version() or "",
               weights_dtype) != the_key:
    return "key changed (model, rnnstep, TensorFlow or runtime)"
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  fields = {}
  try:
    (flatbuffer, vocab, tokens, primes_in_bulk,
     prime_bytes) = _export(model_path, weights_dtype)
  except ValueError as e:  # E.g. a model that records a window.
    fields["unsupported"] = cache.one_line(e)
  except Exception as e:  # pylint: disable=broad-except
    fields["failed"] = f"{type(e).__name__}: {cache.one_line(e)}"
  else:
    fields.update(flatbuffer=flatbuffer, vocab=vocab, tokens=tokens,
                  primes_in_bulk=primes_in_bulk, prime_bytes=prime_bytes)
    cap = cache.max_bytes(len(flatbuffer))
    if len(flatbuffer) > cap:  # It would be evicted at once.
      fields = {"unsupported": f"the artifact's {len(flatbuffer) >> 20} MB "
                f"exceed the cache's cap ({cache.MAX_MB_ENV}={cap >> 20})"}
  if cache.model_digest(model_path) != the_key["model"]:
    return "model file changed"
  cache.write_entry(the_key, model_path=model_path,
                    pack=packed_weights, **fields)
  return ("unsupported" if "unsupported" in fields
          else "failed" if "failed" in fields else "built")


# `packed_weights`' child: packs the flatbuffer at argv[1] into argv[2]
# (it imports ai_edge_litert only, where the fill has TensorFlow).
_PACK_CHILD = ("import json, sys; sys.path[:0] = json.loads(sys.argv.pop(1)); "
               "from rnnstep.litert import runner; "
               "runner.pack_weights(*sys.argv[1:])")


def packed_weights(base: str, flatbuffer_bytes: int) -> dict:
  """Packs the entry's flatbuffer's weights for XNNPACK into
  `base`.xnnpack (atomically, 0600; `runner.pack_weights` in a child) and
  returns the manifest's fields for it: none where packing failed or the
  entry would then pass an explicit cap (the artifact then runs on
  LiteRT's builtin kernels)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  try:
    with staging.staged_path(base + cache.PACKED_SUFFIX, mode=0o600) as tmp:
      os.unlink(tmp)  # LiteRT writes a file of its own there.
      child = subprocess.run(
          [sys.executable, "-I", "-c", _PACK_CHILD,
           json.dumps(cache.child_path()),
           base + ".tflite", tmp],
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL, cwd=os.path.dirname(base), check=False)
      if child.returncode or not os.path.isfile(tmp):
        raise OSError(f"packing exited {child.returncode}")
      packed_bytes = os.path.getsize(tmp)
      entry_bytes = flatbuffer_bytes + packed_bytes
      # `_fill_locked` admitted the flatbuffer alone; only an explicit cap
      # can be below the two (the default one is twice the largest entry).
      if entry_bytes > cache.max_bytes(entry_bytes):
        raise OSError("the packed weights would pass the cache's cap")
      # Hashed before the rename: the digest is of the bytes the child
      # wrote, whatever the entry's name holds later.
      fields = {"xnnpack_sha256": cache.file_sha256(tmp),
                "xnnpack_bytes": packed_bytes}
  except OSError:  # The temp file is gone (`staged_path`).
    return {}
  return fields


if __name__ == "__main__":
  sys.exit(main(sys.argv))
