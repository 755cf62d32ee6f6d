"""Where one generate call spends its time: device time per op, from a profile.

USAGE (from the repo root):
  python tools/profile_ops.py                       # bundled model, B=1, xla
  python tools/profile_ops.py --batch_size=256 --num_chars=100 --path=elementwise
  python tools/profile_ops.py --weights=my.npz --dtype=bfloat16 --top=30

Runs `rnnstep.generate` twice to warm up, then once under the TensorFlow
profiler, and prints for each thread the ops with the most time: total ms,
calls, and µs per call. Under XLA each fusion and dot shows up by its HLO name
(`XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true` is set here before
TensorFlow loads); compare the names with the optimized HLO
(`XLA_FLAGS=--xla_dump_to=DIR`). Profiling inflates some ops (the bfloat16
oneDNN matmuls most): use it to see what runs and how often, and
`tools/benchmark.py` for times.
"""

import collections
import glob
import os
import sys
import tempfile

from absl import app
from absl import flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_enable_xprof_traceme=true").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WEIGHTS = flags.DEFINE_string("weights", None,
                               "Model file (default: the bundled model).")
_DTYPE = flags.DEFINE_enum("dtype", "float32",
                           ["float32", "bfloat16", "float16"], "Compute dtype.")
_PATH = flags.DEFINE_enum("path", "xla", ["xla", "graph", "elementwise", "auto"],
                          "The execution path (auto: the default's choice).")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows per call.", lower_bound=1)
_NUM_CHARS = flags.DEFINE_integer("num_chars", 200, "Characters per row.",
                                  lower_bound=1)
_PROMPT = flags.DEFINE_string("prompt", "ROMEO:", "The prompt of every row.")
_TOP = flags.DEFINE_integer("top", 15, "Ops shown per thread.", lower_bound=1)
_MIN_MS = flags.DEFINE_float("min_ms", 1.0,
                             "Threads with less time in total are left out.")


def op_times(xspace):
  """Yields (plane/line name, {op name: [picoseconds, calls]}) per thread."""
  for plane in xspace.planes:
    names = {key: meta.name for key, meta in plane.event_metadata.items()}
    for line in plane.lines:
      totals = collections.defaultdict(lambda: [0, 0])
      for event in line.events:
        total = totals[names.get(event.metadata_id, "?")]
        total[0] += event.duration_ps
        total[1] += 1
      yield f"{plane.name} / {line.name}", totals


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top

  model = rnnstep.load(_WEIGHTS.value, dtype=_DTYPE.value)
  jit = None if _PATH.value == "auto" else paths.jit_compile_of(_PATH.value)

  def run():
    rnnstep.generate(model, [_PROMPT.value] * _BATCH.value, _NUM_CHARS.value,
                     seed=1, jit_compile=jit)

  run()
  run()
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    run()
    tf.profiler.experimental.stop()
    found = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    xspace = xplane_pb2.XSpace()
    with open(found[0], "rb") as f:
      xspace.ParseFromString(f.read())
  print(f"# {_PATH.value}, {_DTYPE.value}, batch {_BATCH.value}, "
        f"{_NUM_CHARS.value} chars after {_PROMPT.value!r}")
  for thread, totals in op_times(xspace):
    total_ms = sum(ps for ps, _ in totals.values()) / 1e9
    if total_ms < _MIN_MS.value:
      continue
    print(f"\n## {thread}: {total_ms:.1f} ms")
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])
    for name, (ps, calls) in ranked[:_TOP.value]:
      print(f"{ps / 1e9:10.2f} ms {calls:6d}x {ps / 1e6 / calls:9.1f} us  "
            f"{name[:100]}")


if __name__ == "__main__":
  app.run(main)
