"""16-bit weights read as 16 bits: `weights_dtype` float16 and bfloat16 of
the kinds that hold their matrices `[out, in]` (RWKV-7; issue #62).

A batch-1 decode step reads every large matrix once, so its speed is the
bytes it reads. Such a model holds those matrices (`Kind.held_transposed`)
and its head, `[V, U]`, in 16 bits, and widens them to float32 inside each
product: an output is a dot product along one contiguous row, which XLA's
CPU backend emits as one loop with the convert in it, reading 2 bytes a
weight. Inputs, products and accumulation stay float32, and the weights'
values are the model's (`reduced_weights`), so the logits are the float32
programs' on the rounded weights, to float32 rounding.

Inside a generation's loop XLA would undo it, so a product is fenced
(`_fenced_product`): loop-invariant code motion would hoist the weight's
convert out of the loop (which then reads float32 again), so the weight
passes through an optimization barrier together with the product's input,
which changes every step; the product's consumer would join it in an
output fusion, which takes no convert, so the product passes through a
barrier of its own; and the ops making the input would be fused into the
product's loop, recomputed for every output, so the input is made apart
(`_kept_apart`). That is one row's product. XLA's CPU dot over several
rows takes no convert, so it needs the widened copy anyway: a prompt's
products over a chunk's rows and a decode step's over a batch of rows are
not fenced, and XLA hoists the copy out of the loop, made once a call
rather than once a chunk or a step (the copies of every matrix were live
at once in the loop's body either way). Outside one XLA program (the
graph path's head and priming, the elementwise path) a product is a small
XLA program of its own (`_compiled_product`).

The other kinds, and any model whose arithmetic is not float32 (`dtype`),
hold float32 values (or the compute dtype's) as before.
"""

import tensorflow as tf

from rnnstep.model import int8_arithmetic

WEIGHTS_DTYPES = ("float16", "bfloat16")


def optimization_barrier(*tensors):
  """XLA's `opt-barrier`: its outputs are its inputs, never fused across.
  Only inside an XLA program; TensorFlow exposes it only in its tf2xla
  module (loaded by `import tensorflow`: importing it here costs nothing)."""
  from tensorflow.compiler.tf2xla.python import xla  # pylint: disable=g-import-not-at-top
  return xla.optimization_barrier(*tensors)


def widened_in_product(weights, compute_dtype) -> bool:
  """Whether `weights` is a 16-bit matrix that a float32 product widens."""
  return (not int8_arithmetic.is_int8(weights)
          and tf.as_dtype(weights.dtype) in (tf.float16, tf.bfloat16)
          and tf.as_dtype(compute_dtype) == tf.float32)


def cast(weights, dtype):
  """`int8_arithmetic.cast`, but a 16-bit matrix under float32 arithmetic
  as it is: its products widen it (`product`)."""
  if widened_in_product(weights, dtype):
    return tf.convert_to_tensor(weights)
  return int8_arithmetic.cast(weights, dtype)


def product(a, w, transposed: bool, in_xla: bool):
  """`a [..., K] @ w` in float32 for a 16-bit `w` (`[K, N]`, or `[N, K]`
  with `transposed`): inside an XLA program (`in_xla`) fenced for one row
  (read as 16 bits), plain for several (widened where XLA hoists the copy
  out of the loop); else a small XLA program of its own.

  Returns:
    float32 `[..., N]`.
  """
  a = tf.cast(a, tf.float32)
  rows = tf.reshape(a, [-1, a.shape[-1]]) if a.shape.rank != 2 else a
  if in_xla:
    count = rows.shape[0]
    if count is not None:
      out = (_fenced_product if count == 1 else _hoistable_product)(
          rows, w, transposed)
    else:  # A compile-time constant to XLA, which drops the other branch.
      out = tf.cond(tf.shape(rows)[0] > 1,
                    lambda: _hoistable_product(rows, w, transposed),
                    lambda: _fenced_product(rows, w, transposed))
  else:
    out = _compiled_product(rows, w, transposed)
  if a.shape.rank == 2:
    return out
  return tf.reshape(out, tf.concat([tf.shape(a)[:-1], tf.shape(out)[-1:]],
                                   0))


def _hoistable_product(a, w, transposed):
  return tf.matmul(a, tf.cast(w, tf.float32), transpose_b=transposed)


def _fenced_product(a, w, transposed):
  w, a = optimization_barrier(w, a)
  (out,) = optimization_barrier(
      tf.matmul(_kept_apart(a), tf.cast(w, tf.float32),
                transpose_b=transposed))
  return out


def _kept_apart(a):
  """`a`, exactly, made where XLA keeps it out of the product's loop.

  XLA's CPU backend removes the barriers before it fuses, and fuses the
  cheap elementwise ops that make a product's input into the product's
  loop, which recomputes them for every output (the 0.1B's O products,
  whose input is the group norm's, ran 5x as long as R's). A divide is
  expensive to its fusion, which keeps it out of a loop that reuses its
  elements; the divisor, 1 + min(|a_0|, 0), is 1 (NaN where `a` holds one)
  but no constant XLA can fold, and x / 1 is x."""
  return a / (1.0 + tf.minimum(tf.abs(a[..., :1]), 0.0))


@tf.function(autograph=False, jit_compile=True)
def _compiled_product(a, w, transposed):
  return tf.matmul(a, tf.cast(w, tf.float32), transpose_b=transposed)
