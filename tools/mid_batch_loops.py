"""What a GRU step costs over the matmul floor at mid batches: micro loops.

USAGE (from the repo root):
  python tools/mid_batch_loops.py                          # B=16,32,64, U=1024
  python tools/mid_batch_loops.py --batch_sizes=32 --rounds=15
  python tools/mid_batch_loops.py --units=32 --steps=5 --rounds=1   # smoke run

Every loop is the floor's (`tools/bench/runners.Floor`: h@R [U, 3U] and
h@W_out [U, V] a step, steps kept sequential), with one thing changed:

  floor_graph   TF's MatMul (oneDNN, or Eigen where TF turns oneDNN off), and
                h = tanh(h@R's first U columns), as graph ops;
  floor_xla     the same loop compiled whole by XLA (XLA's dot);
  tanh_call     floor_graph with its tanh done by one XLA call a step: what
                calling compiled code from a graph loop costs by itself;
  gru_graph     floor_graph with the GRU gate math (reset_after) as graph ops;
  gru_call      floor_graph with the gate math as one XLA call a step (the
                elementwise path's structure, without its sampler).

All run in one process, `--rounds` interleaved rounds, medians in µs a step,
and each loop's ratio to floor_graph paired by round. BUILD_NOTES.md ("AMD
EPYC Zen 3") has what it showed there.
"""

import os
import statistics
import sys
import time

from absl import app
from absl import flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["16", "32", "64"],
                                 "Rows per loop.")
_UNITS = flags.DEFINE_integer("units", 1024, "GRU units U.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 65, "Output width V.",
                              lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 200, "Steps per loop.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Interleaved rounds.",
                               lower_bound=1)

LOOPS = ("floor_graph", "floor_xla", "tanh_call", "gru_graph", "gru_call")


def make_loops(tf, units, vocab_size, steps):
  """{name: tf.function(h [B, U]) -> h} for every loop of LOOPS."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)

  def constant(*shape, scale):
    return tf.constant(rng.normal(size=shape).astype("float32") * scale)

  recurrent = constant(units, 3 * units, scale=units**-0.5)
  dense = constant(units, vocab_size, scale=units**-0.5)
  table = constant(vocab_size, 3 * units, scale=0.1)

  def gru(h_proj, h, x_proj):
    x_z, x_r, x_h = tf.split(x_proj, 3, axis=1)
    h_z, h_r, h_h = tf.split(h_proj, 3, axis=1)
    z = tf.sigmoid(x_z + h_z)
    r = tf.sigmoid(x_r + h_r)
    return z * h + (1 - z) * tf.tanh(x_h + r * h_h)

  def floor_tanh(h_proj, h, x_proj):
    del h, x_proj
    return tf.tanh(h_proj[:, :units])

  compiled = {fn: tf.function(fn, jit_compile=True, autograph=False)
              for fn in (gru, floor_tanh)}
  update = {"floor_graph": floor_tanh, "floor_xla": floor_tanh,
            "tanh_call": compiled[floor_tanh], "gru_graph": gru,
            "gru_call": compiled[gru]}

  def loop_of(name):
    def loop(h):
      x_proj = tf.gather(table, tf.zeros([tf.shape(h)[0]], tf.int32))

      def body(i, h):
        h_proj = tf.matmul(h, recurrent)
        out = tf.matmul(h, dense)
        # The dense product feeds the next step, as logits feed sampling.
        return i + 1, update[name](h_proj, h, x_proj) + 0 * out[:, :1]

      return tf.while_loop(lambda i, h: i < steps, body, (0, h))[1]

    return tf.function(loop, jit_compile=name == "floor_xla", autograph=False)

  return {name: loop_of(name) for name in LOOPS}


def main(argv):
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Each batch size builds its loops anew, on purpose: not a retrace to warn of.
  tf.get_logger().setLevel("ERROR")
  tools = os.path.dirname(os.path.abspath(__file__))
  sys.path[:0] = [tools, os.path.dirname(tools)]
  from bench import machine  # pylint: disable=g-import-not-at-top
  facts = machine.machine_facts(tf, None)
  print(f"machine: {facts['cpu']} | {facts['cores']} cores | kind "
        f"{facts['cpu_kind']} | oneDNN {facts['onednn']} | TF "
        f"{facts['tensorflow']} | load average "
        f"{' '.join(f'{x:.2f}' for x in facts['loadavg_start'])}")
  print(f"## mid-batch loops: µs a step (median of {_ROUNDS.value} rounds, "
        f"{_STEPS.value} steps, U={_UNITS.value}, V={_VOCAB.value}); "
        "x floor_graph paired by round")
  header = f"{'batch':>5} " + " ".join(f"{n:>17}" for n in LOOPS)
  print(header)
  print("-" * len(header))
  for batch in map(int, _BATCH_SIZES.value):
    h = tf.constant(np.random.default_rng(1).normal(
        size=(batch, _UNITS.value)).astype(np.float32) * 0.1)
    loops = make_loops(tf, _UNITS.value, _VOCAB.value, _STEPS.value)
    for loop in loops.values():  # Warm-up: trace, compile, first run.
      loop(h).numpy()
    seconds = {name: [] for name in LOOPS}
    for r in range(_ROUNDS.value):
      order = LOOPS[r % len(LOOPS):] + LOOPS[:r % len(LOOPS)]
      for name in order:
        start = time.perf_counter()
        loops[name](h).numpy()
        seconds[name].append(time.perf_counter() - start)
    cells = []
    for name in LOOPS:
      us = statistics.median(seconds[name]) / _STEPS.value * 1e6
      ratio = statistics.median(
          t / f for t, f in zip(seconds[name], seconds["floor_graph"]))
      cells.append(f"{us:>9.1f} ({ratio:4.2f}x)")
    print(f"{batch:>5} " + " ".join(f"{c:>17}" for c in cells))


if __name__ == "__main__":
  app.run(main)
