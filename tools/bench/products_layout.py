"""Which layout of a weight matrix do TensorFlow's products read faster?

Issue 62 (benchmarks/results/rwkv7-layout-epyc-zen5-2026-12.md): the
0.1B RWKV-7's big matrices are held `[out, in]` (`Kind.held_transposed`)
because XLA's matrix-vector product reads that layout faster; this times
both layouts, the weights arguments of the program as rnnstep's are.

    python tools/bench/products_layout.py --mode=gemv   # decode: x[1, 768]
    python tools/bench/products_layout.py --mode=gemm   # prefill: x[512, in]

gemv: per product, a chain of 1 x 768 x 65,536 (the head), 24 x 768 x
6,144, 192 x 768 x 768 and 768 x 768 x 192 products under XLA, W `[in,
out]` against `[out, in]` with `transpose_b`.
gemm: the 0.1B block's six matrices (4 x 768 x 768, 768 x 3,072, 3,072 x
768), four times, at --rows rows, in a TensorFlow graph (oneDNN) and under
XLA: `a @ W`, `a @ Wᵀ` (W held `[out, in]`) and `(W @ aᵀ)ᵀ`.
Variants alternate over --rounds; medians.
"""

import statistics
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

_MODE = flags.DEFINE_enum("mode", "gemv", ["gemv", "gemm"], "Which probe.")
_ROWS = flags.DEFINE_integer("rows", 512, "gemm: the inputs' rows.")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Alternated rounds.")

_RNG = np.random.default_rng(0)


def _matrix(rows, cols):
  return tf.constant((_RNG.standard_normal((rows, cols)) * 0.03)
                     .astype(np.float32))


def _chain(inputs, weights, product, jit):
  """A compiled function summing a slice of each product (none is dead)."""
  def chain(inputs, weights):
    total = 0.0
    for w in weights:
      total += tf.reduce_sum(product(inputs, w)[:2, :8])
    return total
  return tf.function(chain, jit_compile=jit)


def _time(variants, rounds, calls):
  """{name: median seconds a call} of (function, args) alternated."""
  for function, args in variants.values():
    function(*args)
    function(*args)
  times = {name: [] for name in variants}
  for _ in range(rounds):
    for name, (function, args) in variants.items():
      start = time.perf_counter()
      for _ in range(calls):
        function(*args).numpy()
      times[name].append((time.perf_counter() - start) / calls)
  return {name: statistics.median(t) for name, t in times.items()}


def gemv(rounds):
  x = _matrix(1, 768)
  for count, inputs, outputs in ((1, 768, 65536), (24, 768, 6144),
                                 (192, 768, 768), (768, 768, 192)):
    stored = [_matrix(inputs, outputs) for _ in range(count)]
    held = [tf.constant(np.ascontiguousarray(w.numpy().T)) for w in stored]
    seconds = _time({
        "[in, out]": (_chain(x, stored, tf.matmul, True), (x, stored)),
        "[out, in]": (_chain(x, held, lambda a, w: tf.matmul(
            a, w, transpose_b=True), True), (x, held)),
    }, rounds, 10)
    size = count * inputs * outputs * 4
    print(f"{count} x {inputs} x {outputs}: " + ", ".join(
        f"{name} {s * 1e6 / count:.1f} us a product ({size / s / 1e9:.1f} "
        f"GB/s)" for name, s in seconds.items()), flush=True)


def gemm(rounds, rows):
  shapes = [(768, 768)] * 4 + [(768, 3072), (3072, 768)]
  stored = [_matrix(i, o) for i, o in shapes] * 4
  held = [tf.constant(np.ascontiguousarray(w.numpy().T)) for w in stored]
  inputs = {768: _matrix(rows, 768), 3072: _matrix(rows, 3072)}
  forms = {
      "a @ W": (lambda _, w: tf.matmul(inputs[w.shape[0]], w), stored),
      "a @ W^T": (lambda _, w: tf.matmul(inputs[w.shape[1]], w,
                                         transpose_b=True), held),
      "(W @ a^T)^T": (lambda _, w: tf.transpose(tf.matmul(
          w, inputs[w.shape[1]], transpose_b=True)), held),
  }
  variants = {}
  for jit in (False, True):
    for name, (product, weights) in forms.items():
      variants[f"{'XLA' if jit else 'graph'} {name}"] = (
          _chain(None, weights, product, jit), (0.0, weights))
  for name, seconds in _time(variants, rounds, 1).items():
    print(f"{name}: {seconds * 1e3:.1f} ms", flush=True)


def main(argv):
  del argv
  if _MODE.value == "gemv":
    gemv(_ROUNDS.value)
  else:
    gemm(_ROUNDS.value, _ROWS.value)


if __name__ == "__main__":
  app.run(main)
