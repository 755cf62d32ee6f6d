"""What this CPU is, read without TensorFlow: the facts that decide the fastest path.

Which execution path wins (paths.py) turns on the matmul kernels TensorFlow's
oneDNN and XLA's CPU backend pick, and those turn on a few CPU features:
AMX tiles (oneDNN runs bfloat16 matmuls on them), AVX512-BF16 (bfloat16
arithmetic without AMX), AVX-512 and AVX2 (the float32 kernels' vector
width), and the cores the process may use. `info()` reads them from
/proc/cpuinfo (Linux); elsewhere only the model name is known and `kind()`
says "other".
"""

import functools
import os
from typing import NamedTuple, Tuple

# The features that change which matmul kernels TF and XLA use, as
# /proc/cpuinfo spells them.
FEATURES = ("amx_bf16", "amx_fp16", "amx_tile", "avx512_bf16", "avx512_fp16",
            "avx512f", "avx2", "fma")
# What `kind` answers, fastest reduced-precision hardware first.
KINDS = ("amx", "avx512_bf16", "avx512", "avx2", "other")


class Info(NamedTuple):
  """The CPU as far as path choice cares."""
  name: str                  # /proc/cpuinfo's "model name", else platform's
  features: Tuple[str, ...]  # those of FEATURES it has, in FEATURES order
  cores: int                 # cores this process may run on


@functools.lru_cache(maxsize=None)
def info() -> Info:
  """This machine's CPU (read once per process)."""
  name, flags = None, set()
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        field, _, value = line.partition(":")
        field = field.strip()
        if field == "model name" and name is None:
          name = value.strip()
        elif field == "flags" and not flags:
          flags = set(value.split())
        if name is not None and flags:
          break
  except OSError:  # Not Linux, or no /proc: the name alone is known.
    pass
  if not name:  # Imported only here: a warm rnnstep-generate reads this.
    import platform  # pylint: disable=g-import-not-at-top
    name = platform.processor() or platform.machine() or "unknown"
  return Info(name, tuple(f for f in FEATURES if f in flags), usable_cores())


def usable_cores() -> int:
  """The cores this process may use (its affinity mask, where it has one)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def kind(cpu: Info = None) -> str:
  """The CPU's kind for the path tables: one of KINDS.

  "amx": AMX tiles with bf16 (Sapphire Rapids and later); "avx512_bf16":
  AVX-512 with bf16 arithmetic, no AMX (Zen 4, Cooper Lake); "avx512": AVX-512
  without bf16 (Skylake-SP to Ice Lake); "avx2": AVX2 only (Zen 2/3, Haswell
  to Comet Lake); "other": none of these (another architecture, or no
  /proc/cpuinfo).
  """
  have = set((cpu or info()).features)
  if {"amx_tile", "amx_bf16"} <= have:
    return "amx"
  if "avx512_bf16" in have:
    return "avx512_bf16"
  if "avx512f" in have:
    return "avx512"
  if "avx2" in have:
    return "avx2"
  return "other"


def has_reduced_arithmetic(dtype: str, cpu: Info = None) -> bool:
  """Whether this CPU computes in `dtype` natively (so it can beat float32).

  bfloat16: AMX-BF16 or AVX512-BF16. float16: AMX-FP16 only (AVX512-FP16
  machines measured no float16 matmul faster than float32: docs/guide/performance.md).
  float32: always True.
  """
  have = set((cpu or info()).features)
  if dtype == "bfloat16":
    return bool({"amx_bf16", "avx512_bf16"} & have)
  if dtype == "float16":
    return "amx_fp16" in have
  return True
