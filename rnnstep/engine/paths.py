"""Execution paths: the ways one generation can run, by name.

  - "xla": the whole generation is one XLA program (fewest dispatches per
    step; XLA's float32 dots are as fast as TF's on most CPUs).
  - "graph": a plain TensorFlow graph, no XLA anywhere.
  - "elementwise": a TensorFlow graph loop whose matmuls are TF (oneDNN) ops,
    with the rest of a step (sampling, stopping, layer 0's gate math; each
    further layer's gate math) compiled by XLA as small programs (oneDNN runs
    bfloat16 matmuls on AMX; XLA's CPU backend does not).
  - "auto": the library picks one of the three for the model's dtype and the
    batch size (`default_path`).

Users name a path with the `jit_compile` argument (True, False, "elementwise"
or None); inside the library only these names travel.

This module owns the choice `jit_compile=None` makes: the winner `rnnstep.tune`
measured on this machine (read through `tuning_cache`, which needs no
TensorFlow), else a built-in table for a CPU of this kind (`cpu.kind`;
measured on three kinds, the others take a neighbour's). A server's lanes,
each on one thread beside the others, take their own table (`lane_path`).
It imports no measuring code: `tuning.py` sits above the API.
"""

import functools
import os

from absl import logging
import numpy as np

from rnnstep.engine import cpu
from rnnstep.engine import request
from rnnstep.engine import tuning_cache
from rnnstep import errors

XLA = "xla"
GRAPH = "graph"
ELEMENTWISE = "elementwise"
AUTO = "auto"

# The paths a Generator can run (AUTO is resolved before one is built).
CONCRETE = (XLA, GRAPH, ELEMENTWISE)
# Each concrete path's `jit_compile` value (rnnstep.generate's argument).
JIT_COMPILE = {XLA: True, GRAPH: False, ELEMENTWISE: ELEMENTWISE}


def from_jit_compile(jit_compile) -> str:
  """Maps a user's `jit_compile` value to a path name.

  Args:
    jit_compile: True (xla), False (graph), "elementwise", or None (auto).

  Returns:
    One of XLA, GRAPH, ELEMENTWISE, AUTO.

  Raises:
    errors.ArgumentError: any other value.
  """
  if jit_compile is None:
    return AUTO
  if isinstance(jit_compile, (bool, np.bool_)):
    return XLA if jit_compile else GRAPH
  if isinstance(jit_compile, str) and jit_compile == ELEMENTWISE:
    return ELEMENTWISE
  raise errors.ArgumentError(
      "jit_compile", f"jit_compile must be True, False, {ELEMENTWISE!r} or "
      f"None, got {jit_compile!r}")


def check_concrete(path: str) -> str:
  """Returns `path` if a Generator can run it.

  Raises:
    ValueError: not one of CONCRETE.
  """
  if path not in CONCRETE:
    raise ValueError(f"path must be one of {CONCRETE}, got {path!r}")
  return path


def jit_compile_of(path: str):
  """The `jit_compile` value that names a concrete path (the inverse mapping)."""
  return JIT_COMPILE[check_concrete(path)]


# -- the default path ----------------------------------------------------------

# Names the path `jit_compile=None` takes in this process, over the tuning
# cache and the tables: a deployment that wants no XLA compile at all (or one
# path for every call) sets it; the test suite pins "graph" so that the
# programs its calls compile do not depend on the CPU it runs on.
DEFAULT_PATH_ENV = "RNNSTEP_DEFAULT_PATH"


def pinned_path():
  """The path `RNNSTEP_DEFAULT_PATH` pins `jit_compile=None` to, else None.

  Raises:
    errors.ArgumentError: a value that names no path.
  """
  value = os.environ.get(DEFAULT_PATH_ENV, "").strip().lower()
  if not value:
    return None
  if value not in CONCRETE:
    raise errors.ArgumentError(
        DEFAULT_PATH_ENV, f"{DEFAULT_PATH_ENV} must be one of "
        f"{', '.join(CONCRETE)} (or unset), got {value!r}")
  return value


# The fastest path per CPU kind (`cpu.kind`) and compute dtype, as (largest
# batch size, path) bands, measured on 2-vCPU VMs with `python
# tools/benchmark.py --sections=paths,floors`: "amx" on Intel Sapphire
# Rapids, "avx512_bf16" on AMD EPYC Zen 4, "avx2" on AMD EPYC Zen 3
# (benchmarks/results/ has the runs; docs/guide/performance.md the summary).
# "avx512" (no bf16) and "other" were never measured: they take the nearest
# measured kind's bands.
_AMX = {
    "float32": ((16, XLA), (48, ELEMENTWISE), (None, XLA)),
    "float16": ((16, XLA), (48, ELEMENTWISE), (None, XLA)),
    "bfloat16": ((8, XLA), (None, ELEMENTWISE)),
}
_AVX512_BF16 = {
    "float32": ((32, XLA), (64, ELEMENTWISE), (None, XLA)),
    "float16": ((None, XLA),),
    "bfloat16": ((8, XLA), (None, ELEMENTWISE)),
}
_AVX2 = {
    "float32": ((16, XLA), (32, ELEMENTWISE), (None, XLA)),
    "float16": ((None, XLA),),
    "bfloat16": ((None, XLA),),
}
FASTEST_PATHS = {
    "amx": _AMX,
    "avx512_bf16": _AVX512_BF16,
    "avx512": dict(_AVX2, float32=_AVX512_BF16["float32"]),
    "avx2": _AVX2,
    "other": _AVX2,
}
# The kinds whose bands were measured, and the core count they were measured
# at (a table is a fallback for other core counts too: `rnnstep-tune`
# measures the machine at hand).
MEASURED_KINDS = ("amx", "avx512_bf16", "avx2")
MEASURED_CORES = 2
# XLA runs the batch padded to `request.batch_bucket`; above 16 rows padding
# by more than this makes a path that runs the exact batch faster (measured
# on a 2-vCPU EPYC Zen 4).
_MOST_XLA_PADDING = 1.15


# Cell kinds whose CPU paths are their own, not the tables' (measured on
# GRUs), read as the tables are. RWKV-7 (its 0.1B shape on a quiet 2-vCPU
# EPYC Zen 3): XLA's whole-generation program decodes fastest in float32;
# in a reduced precision the CPU has no arithmetic for, the graph path does.
KIND_PATHS = {
    "rwkv7": {"float32": ((None, XLA),), "bfloat16": ((None, GRAPH),),
              "float16": ((None, GRAPH),)},
}
# The same for a server's lanes of one intra-op thread (`lane_path`; a lane
# on TensorFlow's pools takes the library's path). RWKV-7 there takes the
# graph path: on a quiet 2-vCPU EPYC Zen 4 (its 0.1B shape, lanes of 16
# rows) a lane decoded 8 steps in 0.83 s on the graph path against 1.74 s
# under XLA, and XLA ran two lanes' calls one after the other where the
# graph path ran them side by side (benchmarks/results/serve-epyc-zen4-2026-12.md).
# A server runs RWKV-7 in one lane on the pools unless told otherwise
# (`serve/lanes.py`'s ONE_LANE_CELL_KINDS).
KIND_LANE_PATHS = {
    "rwkv7": {dtype: ((None, GRAPH),)
              for dtype in ("float32", "bfloat16", "float16")},
}


def _kind_bands(model, dtype: str, table=None):
  """The bands `table` (default `KIND_PATHS`) gives one of `model`'s layer
  kinds, else None."""
  table = KIND_PATHS if table is None else table
  for layer in model.config.layers:
    if layer.kind in table:
      return table[layer.kind][dtype]
  return None


def default_path(model, batch_size: int) -> str:
  """The path `jit_compile=None` takes: "xla", "graph" or "elementwise".

  The path `RNNSTEP_DEFAULT_PATH` names, where it is set (`pinned_path`).
  Else on a GPU, XLA. Otherwise a winner measured on this machine by
  `rnnstep.tune` (the tuning cache, `tuning_cache.cached_path`) comes first;
  then the bands of a cell kind with its own (`KIND_PATHS`); then the
  fastest measured on a CPU of this kind (`table_path`). Nothing is
  measured here (RNNSTEP_TUNING=off: the tables only). A reduced compute
  dtype on a CPU without its arithmetic is said once per process (a warning:
  it will not be faster than float32 here).

  For a float32 model every path is Keras-exact; sampled text can differ
  between paths only where rounding flips a draw (rare in float32; in
  bfloat16, expect texts to part after some dozens of characters), so pass
  `jit_compile` explicitly to reproduce a row across batch sizes that fall in
  different bands.

  Args:
    model: the `rnnstep.Model` (its shape and compute dtype).
    batch_size: the rows generated together (per device).

  Returns:
    One of CONCRETE.
  """
  pinned = pinned_path()
  if pinned is not None:
    return pinned
  if gpu_visible():
    # The bands are CPU measurements; on a GPU XLA's dots use the vendor
    # libraries (bf16 included) and the whole-XLA loop has the fewest launches.
    return XLA
  dtype = model.compute_dtype.name
  if slower_dtype_note(dtype):
    _warn_no_faster_than_float32(dtype)
  measured = tuning_cache.cached_path(model, batch_size)
  if measured is not None:
    return measured
  own = _kind_bands(model, dtype)
  if own is not None:
    return _band_path(own, batch_size)
  return table_path(dtype, batch_size)


def table_path(dtype: str, batch_size: int, kind: str = None) -> str:
  """The built-in tables' path for a compute dtype, batch size and CPU kind.

  Args:
    dtype: "float32", "bfloat16" or "float16".
    batch_size: rows generated together.
    kind: one of `cpu.KINDS`; None: this machine's (`cpu.kind()`).

  Returns:
    One of CONCRETE.
  """
  return _band_path(FASTEST_PATHS[kind or cpu.kind()][dtype], batch_size)


def _band_path(bands, batch_size: int) -> str:
  """The path of the band holding `batch_size`, with the padding rule."""
  for largest, path in bands:
    if largest is None or batch_size <= largest:
      break
  # Only where the elementwise path wins some band is it near enough to XLA
  # for padding to tip the balance (bfloat16 without bf16 arithmetic: never).
  if (path == XLA and batch_size > 16
      and any(p == ELEMENTWISE for _, p in bands)
      and request.batch_bucket(batch_size)
      > _MOST_XLA_PADDING * batch_size):
    return ELEMENTWISE
  return path


# -- the path for a server's lane ----------------------------------------------

# `rnnstep-serve` on a CPU splits its slots over lanes, one a core, each
# running its calls on one thread beside the others (rnnstep/serve/lanes.py),
# where the paths rank differently from FASTEST_PATHS' one call on every
# core; so lanes take their own (largest rows a lane, path) bands, measured on
# a 2-vCPU EPYC Zen 3 ("avx2": float32 and bfloat16) with as many concurrent
# one-thread `generate` calls as cores (`python tools/benchmark.py
# --sections=lanes`) and, for float32 above 16 rows, the server's own CPU a
# character. Kinds not measured this way take `_UNMEASURED_LANES`: XLA while
# a step is bound by its per-op dispatch, then the graph path, which compiles
# nothing per batch size.
_UNMEASURED_LANES = {dtype: ((8, XLA), (None, GRAPH))
                     for dtype in ("float32", "float16", "bfloat16")}
_AVX2_LANES = {
    "float32": ((16, XLA), (None, GRAPH)),
    "float16": ((None, XLA),),
    "bfloat16": ((None, XLA),),
}
LANE_PATHS = {
    "amx": _UNMEASURED_LANES,
    "avx512_bf16": _UNMEASURED_LANES,
    "avx512": _UNMEASURED_LANES,
    "avx2": _AVX2_LANES,
    "other": _UNMEASURED_LANES,
}
# The kinds (and dtypes) whose lane bands were measured.
MEASURED_LANE_KINDS = {"avx2": ("float32", "bfloat16")}


def lane_path(model, rows: int, lanes: int, threads: int = 1) -> str:
  """The path `jit_compile=None` takes for one lane of a server.

  A lane runs up to `rows` rows in calls of its own on `threads` intra-op
  threads while `lanes - 1` other lanes run theirs (`rnnstep-serve`'s lanes).
  A call on several threads is what the library's table measured: its
  path (`default_path`). On one thread, a
  winner `rnnstep-tune --lanes` measured here for as many lanes comes first
  (`tuning_cache.cached_path`), then a cell kind's own lane bands, then
  `lane_table_path` (on a GPU, XLA as always; a reduced dtype without its
  arithmetic is noted as by `default_path`).

  Args:
    model: the `rnnstep.Model` (its compute dtype).
    rows: the most rows one lane runs together.
    lanes: the lanes running at once (1 or more).
    threads: each lane's intra-op threads (TensorFlow's).

  Returns:
    One of CONCRETE.
  """
  if threads != 1 or gpu_visible() or pinned_path() is not None:
    return default_path(model, rows)
  dtype = model.compute_dtype.name
  own = _kind_bands(model, dtype, KIND_LANE_PATHS)
  if slower_dtype_note(dtype):
    _warn_no_faster_than_float32(dtype)
  measured = tuning_cache.cached_path(model, rows, lanes=lanes)
  if measured is not None:
    return measured
  if own is not None:
    return _band_path(own, rows)
  # The table's bands hold for a lane a core, as measured.
  return lane_table_path(dtype, rows)


def lane_table_path(dtype: str, rows: int, kind: str = None) -> str:
  """The lane table's path for a compute dtype, rows a lane and CPU kind.

  Args:
    dtype: "float32", "bfloat16" or "float16".
    rows: the rows one lane runs together.
    kind: one of `cpu.KINDS`; None: this machine's (`cpu.kind()`).

  Returns:
    One of CONCRETE.
  """
  return _band_path(LANE_PATHS[kind or cpu.kind()][dtype], rows)


# A process that runs one generation (`rnnstep-generate`) pays XLA's compile
# for that one call; up to this many steps the graph path finishes first
# where the table says XLA (whole processes on a 2-vCPU EPYC Zen 4 with the
# bundled model: `tools/benchmark.py --sections=cli`).
ONE_SHOT_GRAPH_MAX_STEPS = 2000

# XLA's gain a step grows with the rows while its compile stays a few
# seconds, so a one-shot run (a bulk job's batches count as one) of more rows
# x steps than this takes XLA (the first call's crossover, measured on a quiet
# 2-vCPU EPYC Zen 3 with the bundled model).
ONE_SHOT_GRAPH_MAX_ROW_STEPS = 131_072


# The elementwise path's small programs gain the bundled model little a
# step over the graph path (40 rows: within noise; 65 rows: ~10%), and a
# process pays their trace and compile: whole `rnnstep-generate
# --num_samples=40` processes on a 2-vCPU EPYC Zen 4 took 1.6 s (200
# steps), 1.3 s (1,000) and 0.7-2.9 s (3,000) longer on it than on the
# graph path, and 150 MB more
# (benchmarks/results/first-call-epyc-zen4-2026-12.md). So a one-shot
# run takes the graph path where the table says elementwise, up to this
# many steps (a bulk job's batches count as one run).
ONE_SHOT_GRAPH_MAX_ELEMENTWISE_STEPS = 5000


def one_shot_path(model, batch_size: int, num_steps: int) -> str:
  """The path for a process that runs one generation and exits.

  `default_path` is the fastest path once its programs are compiled, which
  is what a notebook, a server or a loop of calls pays off. A process that
  generates once (the command line) also pays the compile: for a float32
  model on a CPU, XLA's costs more than it saves up to
  `ONE_SHOT_GRAPH_MAX_STEPS` steps and `ONE_SHOT_GRAPH_MAX_ROW_STEPS` rows x
  steps, and the elementwise path's up to
  `ONE_SHOT_GRAPH_MAX_ELEMENTWISE_STEPS` steps, so such a run takes the
  graph path. In float32 the paths give the same text (README
  "Reproducibility").

  Args:
    model: the `rnnstep.Model`.
    batch_size: the rows generated together.
    num_steps: the steps the one call runs.

  Returns:
    One of CONCRETE.
  """
  path = default_path(model, batch_size)
  if (pinned_path() is not None or model.compute_dtype.name != "float32"
      or gpu_visible()):
    return path
  if path == XLA and (num_steps <= ONE_SHOT_GRAPH_MAX_STEPS
                      and batch_size * num_steps
                      <= ONE_SHOT_GRAPH_MAX_ROW_STEPS):
    return GRAPH
  if path == ELEMENTWISE and num_steps <= ONE_SHOT_GRAPH_MAX_ELEMENTWISE_STEPS:
    return GRAPH
  return path


def bulk_job_path(model, records: int, batch_size: int, num_steps: int) -> str:
  """The one path of every batch of a bulk job (`rnnstep-generate --input`).

  The job's batches count as one one-shot run (`one_shot_path`): the
  batch's rows and the steps of all its batches, so a compile is weighed
  against the whole job (the last, smaller batch takes its path too).

  Args:
    model: the `rnnstep.Model`.
    records: the job's records (all of them, done or not, so a resumed job
      keeps its path).
    batch_size: records per batch.
    num_steps: steps per record.
  """
  batches = -(-records // batch_size)
  return one_shot_path(model, min(batch_size, max(records, 1)),
                       num_steps * batches)


# The batch a bulk job (`rnnstep-generate --input`) runs when `rnnstep-tune`
# measured none here: throughput grows with the batch while the step is bound
# by reading the weights, then flattens (measured on a quiet 2-vCPU EPYC
# Zen 3).
BULK_BATCH_SIZE = 256


def bulk_batch_size(model) -> int:
  """The batch size with the most characters a second for a bulk job.

  The batch size `rnnstep.tune` measured here (for this model's shape and
  dtype) with the most rows x steps a second at its fastest path, else
  `BULK_BATCH_SIZE`. (A job's last batch may be smaller.)
  """
  measured = tuning_cache.measured(model)
  if not measured:
    return BULK_BATCH_SIZE
  return max(measured, key=lambda batch: batch / measured[batch])


def default_jit_compile(model, batch_size: int = 1):
  """`default_path` as a `jit_compile` value (True, False or "elementwise")."""
  return jit_compile_of(default_path(model, batch_size))


@functools.lru_cache(maxsize=None)
def gpu_visible() -> bool:
  """Whether TensorFlow sees a GPU (asked once per process)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return bool(tf.config.list_physical_devices("GPU"))


# The reduced dtypes already warned about in this process.
_warned = set()


def slower_dtype_note(dtype: str):
  """One line saying `dtype` will not beat float32 on this CPU, or None.

  None for float32, on a GPU, and on a CPU with the dtype's arithmetic. The
  command-line tools print it (their logging is quiet); the library logs it
  once per process (`default_path`).
  """
  if dtype == "float32" or gpu_visible() or cpu.has_reduced_arithmetic(dtype):
    return None
  needs = "AMX-BF16 or AVX512-BF16" if dtype == "bfloat16" else "AMX-FP16"
  return (f"{dtype} will not be faster than float32 on this CPU "
          f"({cpu.info().name}: no {needs}); it runs on its fastest path "
          "here, but float32 is as fast and exact")


def _warn_no_faster_than_float32(dtype: str):
  """Says once per process that `dtype` will not beat float32 on this CPU."""
  if dtype in _warned:
    return
  _warned.add(dtype)
  logging.warning("rnnstep: %s", slower_dtype_note(dtype))
