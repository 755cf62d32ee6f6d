"""The products of int8 weights (`weights_dtype="int8"`): XNNPACK's
dynamic-range arithmetic, on every TensorFlow path (issue #62).

An int8 matrix `w [..., K, N]` is `q * scale`, q int8 in [-127, 127] and a
float32 scale per output column (`reduced_weights`). A product `x @ w`
rounds each row of x `[..., K]` to int8 as LiteRT/XNNPACK's dynamic-range
fully-connected kernel does, sums exactly in int32 and scales back:

    low = min(0, min x)     high = max(0, max x)
    m = 255 / (high - low)                    (1 where high == low)
    zp = rint(clip(-128 - low*m  if (-128 + low*m) + (127 + high*m) > 0
                   else 127 - high*m, -128, 127))
    qx = clip(rint(x * m) + zp, -128, 127)    (rint: ties to even)
    y = (float32(sum_k qx_k q_kn - zp sum_k q_kn) * (1 / m)) * scale_n

(each operation rounded to float32 as written). That is what the int8
weights are for: XNNPACK's kernel reads a quarter of float32's bytes, so
the compiled artifact the command line serves an int8 model from decodes
~3x faster (`rnnstep.litert.export`: the artifact's products are XNNPACK's
own), and every path gives the same text because the integer sums are
exact whoever computes them. Here they are float32 matmuls of integer
values: each partial sum of at most `EXACT_TERMS` products of magnitude
<= 128 * 127 stays below 2**24, so any order of summation (oneDNN, Eigen,
XLA, TF32 on a GPU) gives the exact integer; longer rows are summed in
chunks, added in int32. The ops are written as no graph optimizer
rewrites them (no constant divisor, no chain of products to regroup:
`tools/bench/int8_products.py`), and a numpy form of the same arithmetic
(`int8_products.xnnpack_dynamic_int8`) equals LiteRT's bit for bit
(tests/test_weights_dtype_int8_arithmetic.py).

The input projection of layer 0 is not such a product: it is a table
(`Model.input_table`) computed once from the int8 weights' float32 values,
which a step gathers (as the artifact gathers its constant table).

A model holds each int8 matrix as an `Int8Kernel` (its q as float32
values, its scales and its columns' sums), which the cells hand to
`product`; inside `decoded_products()` (the LiteRT export's trace) a
product is `x @ (q * scale)`, which the converter folds into one float32
constant and the export rewrites into XNNPACK's int8 product.
"""

import contextlib
import threading
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from rnnstep.model import reduced_weights

# Most products a float32 partial sum may hold and stay an exact integer:
# each |qx q| <= 128 * 127 = 16,256, and 1,032 * 16,256 < 2**24.
EXACT_TERMS = 1032


class Int8Kernel(NamedTuple):
  """An int8 matrix `[..., K, N]` as the arithmetic reads it.

  Attributes:
    values: float32 `[..., K, N]`, the int8 q (integers in [-127, 127]).
    scales: float32 `[..., 1, N]`, a scale per output column.
    column_sums: int32 `[..., 1, N]`, each column's sum of q (what the
      zero point of the rounded rows takes off).
  """
  values: tf.Tensor
  scales: tf.Tensor
  column_sums: tf.Tensor


def parts(array: np.ndarray, name: str = "") -> Int8Kernel:
  """The `Int8Kernel` (numpy arrays) of an int8 matrix's float32 values
  (`reduced_weights.reduce(..., "int8", -2)`'s: rounding them again gives
  the same q and scales)."""
  q, scale = reduced_weights.encode(array, "int8", -2, name)
  return Int8Kernel(q.astype(np.float32), scale,
                    q.astype(np.int32).sum(-2, keepdims=True, dtype=np.int32))


def variables(array: np.ndarray, name: str) -> Int8Kernel:
  """An int8 matrix's `parts` as (non-trainable) variables, named
  `{name}_values` etc."""
  return Int8Kernel(*(
      tf.Variable(part, trainable=False, name=f"{name}_{field}")
      for field, part in zip(Int8Kernel._fields, parts(array, name))))


def decode(kernel: Int8Kernel) -> np.ndarray:
  """The float32 values of a numpy `Int8Kernel` (`reduced_weights.decode`)."""
  return reduced_weights.decode(kernel.values.astype(np.int8),
                                kernel.scales, "int8")


_DECODED = threading.local()


@contextlib.contextmanager
def decoded_products():
  """Within it (on this thread), `product` multiplies by the float32
  values `q * scale` (what the LiteRT converter folds and the export
  rewrites back to int8), not in the int8 arithmetic."""
  before = getattr(_DECODED, "on", False)
  _DECODED.on = True
  try:
    yield
  finally:
    _DECODED.on = before


def decoded(kernel: Int8Kernel) -> tf.Tensor:
  """The float32 matrix `q * scale`."""
  return kernel.values * kernel.scales


class Columns(NamedTuple):
  """Columns `[start, stop)` of an `Int8Kernel`, sliced where a product
  uses them (`columns` within `decoded_products()`)."""
  kernel: Int8Kernel
  start: int
  stop: int


def is_int8(weights) -> bool:
  return isinstance(weights, (Int8Kernel, Columns))


def numpy_values(weight) -> np.ndarray:
  """A weight variable's float32 values (an `Int8Kernel`'s decoded)."""
  if is_int8(weight):
    return decode(Int8Kernel(*(t.numpy() for t in weight)))
  return weight.numpy()


def decoded_layer(weights: dict) -> dict:
  """A layer's weights with each `Int8Kernel` as its float32 values."""
  return {name: decoded(w) if is_int8(w) else w
          for name, w in weights.items()}


def product_dtype(kernel):
  """The dtype a product by `kernel` computes in (an int8 one: float32)."""
  return tf.float32 if is_int8(kernel) else kernel.dtype


def cast(weights, dtype):
  """`tf.cast(weights, dtype)`; an `Int8Kernel` as it is (its product is
  the int8 arithmetic whatever the compute dtype)."""
  if is_int8(weights):
    return weights
  return tf.cast(weights, dtype)


def split(fn, weights):
  """`fn(weights)` for a function that splits a tensor into a list (its
  blocks, its column ranges); an `Int8Kernel`'s three parts split alike,
  zipped back into kernels."""
  if not is_int8(weights):
    return fn(weights)
  return [Int8Kernel(*p) for p in zip(*(fn(t) for t in weights))]


def columns(weights, start, stop):
  """Columns `[start, stop)` of a matrix (an `Int8Kernel`'s, with their
  scales and sums). Within `decoded_products()` an `Int8Kernel`'s are
  `Columns`, sliced by the product that uses them: a slice made outside a
  loop reaches the LiteRT converter as a loop operand, not a constant, and
  the product by it would stay float32 (`rnnstep.litert.int8_products`
  rewrites constants only)."""
  if not is_int8(weights):
    return weights[..., start:stop]
  if getattr(_DECODED, "on", False):
    return Columns(weights, start, stop)
  return Int8Kernel(*(t[..., start:stop] for t in weights))


def bytes_read(weights) -> int:
  """The bytes a product reads of a weight (an `Int8Kernel`: its int8 q
  and float32 scales, as the LiteRT artifact holds them)."""
  if is_int8(weights):
    return (weights.values.shape.num_elements()
            + 4 * weights.scales.shape.num_elements())
  return weights.shape.num_elements() * weights.dtype.size


def shape(weights) -> tf.TensorShape:
  """A matrix's shape (an `Int8Kernel`'s values')."""
  if isinstance(weights, Columns):
    return shape(weights.kernel)[:-1].concatenate(
        [weights.stop - weights.start])
  return (weights.values if is_int8(weights) else weights).shape


def _constant(value):
  return tf.constant(np.float32(value))


def rounded_rows(x):
  """x `[..., K]` -> (qx: float32 integers in [-128, 127], zero point
  `[..., 1]`, multiplier `[..., 1]`): XNNPACK's asymmetric rounding of
  each row (the module docstring)."""
  f = _constant
  low = tf.minimum(f(0), tf.reduce_min(x, -1, keepdims=True))
  high = tf.maximum(f(0), tf.reduce_max(x, -1, keepdims=True))
  multiplier = tf.where(low == high, f(1), f(255) / (high - low))
  low_scaled, high_scaled = low * multiplier, high * multiplier
  zero_point = tf.where((f(-128) + low_scaled) + (f(127) + high_scaled) > 0,
                        f(-128) - low_scaled, f(127) - high_scaled)
  zero_point = tf.round(tf.clip_by_value(zero_point, f(-128), f(127)))
  qx = tf.clip_by_value(tf.round(x * multiplier) + zero_point, f(-128),
                        f(127))
  return qx, zero_point, multiplier


def _integer_sums(qx, values):
  """int32 `sum_k qx_k values_kn` for qx `[R, K]`, values `[K, N]`, exact
  (see `EXACT_TERMS`)."""
  k = int(values.shape[0])
  if k <= EXACT_TERMS:
    return tf.cast(tf.matmul(qx, values), tf.int32)
  chunks = -(-k // EXACT_TERMS)
  while k % chunks:  # The fewest equal chunks of at most EXACT_TERMS.
    chunks += 1
  size = k // chunks
  # Reshaped, not sliced: a slice of the matrix in a loop's body is a copy
  # of it a step.
  per_chunk = tf.matmul(
      tf.transpose(tf.reshape(qx, [-1, chunks, size]), [1, 0, 2]),
      tf.reshape(values, [chunks, size, -1]))
  return tf.reduce_sum(tf.cast(per_chunk, tf.int32), 0)


def product(x, kernel: Int8Kernel):
  """`x [..., K] @ kernel` in XNNPACK's dynamic-range int8 arithmetic (the
  module docstring), float32 `[..., N]`; within `decoded_products()`,
  `x @ (q * scale)`."""
  x = tf.cast(x, tf.float32)
  rank = x.shape.rank
  if getattr(_DECODED, "on", False):
    w = (decoded(kernel.kernel)[..., kernel.start:kernel.stop]
         if isinstance(kernel, Columns) else decoded(kernel))
    if rank == 2:
      return tf.matmul(x, w)
    return tf.tensordot(x, w, [[rank - 1], [0]])
  qx, zero_point, multiplier = rounded_rows(x)
  rows = tf.reshape(qx, [-1, tf.shape(qx)[-1]])
  sums = tf.reshape(_integer_sums(rows, kernel.values),
                    tf.concat([tf.shape(qx)[:-1], [-1]], 0))
  sums -= tf.cast(zero_point, tf.int32) * kernel.column_sums[0]
  # Not `1 / multiplier` (a Reciprocal, approximate in Eigen), and the two
  # scales apart (MulNoNan: exact where the scale is not 0), as XNNPACK
  # multiplies: the graph optimizer regroups a chain of Muls.
  row_scale = tf.math.divide_no_nan(_constant(1), multiplier)
  return tf.math.multiply_no_nan(tf.cast(sums, tf.float32) * row_scale,
                                 kernel.scales[0])
