"""rnnstep-generate --cache_info and --cache_clear: the compiled-artifact
cache (`rnnstep.litert.cache`) listed or emptied, on stdout.

Neither imports TensorFlow nor the interpreter.
"""

import sys
import time

from rnnstep.litert import cache as artifact_cache


def run(info: bool, clear: bool, out=None) -> int:
  """--cache_info (list) or --cache_clear (remove, then list what is left
  when --cache_info is given too); returns the exit status."""
  out = out or sys.stdout
  folder = artifact_cache.directory()
  if clear:
    count, size = artifact_cache.clear()
    out.write(f"removed {_entries(count)} ({_megabytes(size)}) from "
              f"{folder}\n")
    if not info:
      return 0
  found = artifact_cache.entries()
  out.write(f"compiled-artifact cache: {folder}, cap "
            f"{_megabytes(artifact_cache.max_bytes())} "
            f"({artifact_cache.cap_source()})\n")
  for entry in found:
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used))
    # A model's entries of other weights are the same path: say which.
    weights = (f" --weights_dtype={entry.weights_dtype}"
               if entry.weights_dtype else "")
    out.write(f"  {entry.name}  {_megabytes(entry.bytes):>9}  used {used}  "
              f"{entry.status}  {entry.model}{weights}\n")
  out.write(f"{_entries(len(found))}, "
            f"{_megabytes(sum(e.bytes for e in found))}\n")
  return 0


def _entries(count: int) -> str:
  return f"{count} entr{'y' if count == 1 else 'ies'}"


def _megabytes(size: int) -> str:
  return f"{size / (1 << 20):.1f} MB"
