"""Does XLA's CPU backend multiply by int8 weights without a float32 copy?

A loop of matrix-vector products (the 0.1B RWKV-7's head by default,
768 x 65,536) whose output feeds the next step's input, timed five
variants alternated over rounds (issue 62; the results are in
benchmarks/results/weights-dtype-epyc-zen4-2026-12.md):

    python tools/bench/xla_int8_gemv.py --inputs=768 --outputs=65536

  graph_f32       TF graph, float32 weights (`x[None] @ w`)
  xla_f32         the same under XLA
  xla_q_2d        XLA, int8 weights `x[None] @ cast(w) * scale`
  xla_q_1d        XLA, int8 weights, a rank-1 vector: `tensordot(x, cast(w))`
                  (XLA's CPU fusion puts a producer into a dot only then)
  xla_q_1d_inner  as xla_q_1d, with a zero XLA cannot prove (from the loop
                  counter) XORed into the int8 matrix, so that loop-invariant
                  code motion cannot hoist the convert out of the loop

`XLA_FLAGS=--xla_dump_to=DIR` shows which form XLA made of each
(`*cpu_after_optimizations.txt`).
"""

import statistics
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

_INPUTS = flags.DEFINE_integer("inputs", 768, "The vector's width.")
_OUTPUTS = flags.DEFINE_integer("outputs", 65536, "The products' width.")
_STEPS = flags.DEFINE_integer("steps", 50, "Products a call.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Alternated rounds.")


def variants(inputs, outputs, steps):
  rng = np.random.default_rng(0)
  weights = rng.standard_normal((inputs, outputs)).astype(np.float32) * 0.05
  scale = np.abs(weights).max(0) / 127
  quantized = np.clip(np.rint(weights / scale), -127, 127).astype(np.int8)
  w32, w8 = tf.constant(weights), tf.constant(quantized)
  s = tf.constant(scale.astype(np.float32))
  x0 = tf.constant(rng.standard_normal(inputs).astype(np.float32))

  def looped(product):
    def run(x):
      def body(i, x):
        return i + 1, tf.tanh(product(i, x)[:inputs])
      return tf.while_loop(lambda i, x: i < steps, body, (0, x))[1]
    return run

  def inner_zero(i):  # 0, but not a constant to XLA.
    return tf.cast(tf.minimum(i, 0), tf.int8)

  products = {
      "graph_f32": (False, lambda i, x: tf.matmul(x[None], w32)[0]),
      "xla_f32": (True, lambda i, x: tf.matmul(x[None], w32)[0]),
      "xla_q_2d": (True, lambda i, x: tf.matmul(
          x[None], tf.cast(w8, tf.float32))[0] * s),
      "xla_q_1d": (True, lambda i, x: tf.tensordot(
          x, tf.cast(w8, tf.float32), 1) * s),
      "xla_q_1d_inner": (True, lambda i, x: tf.tensordot(
          x, tf.cast(tf.bitwise.bitwise_xor(w8, inner_zero(i)), tf.float32),
          1) * s),
  }
  return {name: tf.function(looped(product), jit_compile=jit,
                            autograph=False)
          for name, (jit, product) in products.items()}, x0


def main(argv):
  del argv
  calls, x0 = variants(_INPUTS.value, _OUTPUTS.value, _STEPS.value)
  for name, call in calls.items():
    start = time.perf_counter()
    call(x0).numpy()
    print(f"{name}: first call {time.perf_counter() - start:.2f} s", flush=True)
  times = {name: [] for name in calls}
  for _ in range(_ROUNDS.value):
    for name, call in calls.items():
      start = time.perf_counter()
      call(x0).numpy()
      times[name].append((time.perf_counter() - start) / _STEPS.value * 1e3)
  for name, ms in times.items():
    print(f"{name:16s} {statistics.median(ms):8.3f} ms a step  "
          + " ".join(f"{t:.2f}" for t in ms))


if __name__ == "__main__":
  app.run(main)
