"""int8 x int8 products on this CPU: which runtime is faster than float32?
(issue #62: int8 weights that decode faster than float32).

    python tools/bench/int8_products.py
    python tools/bench/int8_products.py --shapes=768x65536 --rounds=7
    python tools/bench/int8_products.py --check_only

The products of the 0.1B RWKV-7 shape at batch 1 (768x768, 768x3072,
3072x768, 768x65536), each as a loop of --steps products at batch 1 whose
output feeds the next product's input (so nothing is cached or folded),
timed per product, in alternated rounds (the order rotated each round);
each variant's ratio to the TF graph's float32 product is the median over
rounds of that round's ratio (paired: a shared machine's drift mostly
cancels within a round).

int8 x int8 here means (`quantize_rows`, `int8_product`): the weights
rnnstep's int8 weights (per output column), the activations rounded per
row to int8 too (symmetric: multiplier = 127 / max|row|,
q = round(x * multiplier), scale = 1 / multiplier), the products summed
exactly in int32, then `float32(sum) * (row scale * column scale)`. The
int32 sums are exact, so any runtime that computes them gives the same
float32 result bit for bit. The variants:

  graph_f32: `tf.matmul` in a graph `tf.while_loop` (the weights captured:
    what rnnstep's programs read, their weights being arguments);
  graph_f32_const: the same, the weights constants of the loop's body;
  graph_s8s8: `tf.linalg.matmul(int8, int8, output_type=tf.int32)`;
  graph_onednn_u8s8: oneDNN's `QuantizedMatMulWithBias` (u8 x s8 -> s32:
    the int8 activations shifted by 128, the shift's columns' sums taken
    off after), the weights constants of the body (with the weights an
    argument oneDNN reorders them at every call: --onednn_argument);
  xla_f32, xla_s8s8: the f32 and s8 x s8 products under XLA;
  litert_f32, litert_dynamic_int8: one product as a LiteRT flatbuffer
    (the weights its constants), float32 and dynamic-range int8
    (`Optimize.DEFAULT`), run by XNNPACK, one invocation a product;
    litert_dynamic_int8_builtin: the same flatbuffer on TFLite's built-in
    kernels (no XNNPACK).

LiteRT's dynamic-range int8 is not the arithmetic above: it rounds each
activation row asymmetrically (a zero point). `xnnpack_dynamic_int8`
writes XNNPACK's arithmetic in numpy, `xnnpack_int8_product` in a
TensorFlow graph on oneDNN's sums; --check_only (and every run, first)
prints whether each runtime's outputs equal their numpy definition bit for
bit over 100 random rows.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SHAPES = "768x768,768x3072,3072x768,768x65536"
VARIANTS = ("graph_f32", "graph_f32_const", "graph_s8s8",
            "graph_onednn_u8s8", "xla_f32", "xla_s8s8", "litert_f32",
            "litert_dynamic_int8", "litert_dynamic_int8_builtin")
INT8_MAX = 127


def quantize_columns(array):
  """float32 `[K, N]` -> (int8 q, float32 scale `[N]`): rnnstep's int8
  weights (`reduced_weights.encode`: symmetric per output column)."""
  from rnnstep.model import reduced_weights
  q, scale = reduced_weights.encode(array, "int8", -2, "kernel")
  return q, scale[0]


def quantize_rows(x):
  """float32 `[B, K]` -> (int8 q, float32 scale `[B, 1]`), in TensorFlow:
  each row symmetric, multiplier = 127 / max|row|, q = round(x *
  multiplier), scale = 1 / multiplier (a zero row: 0 and 0).
  `numpy_int8_product` is the same in numpy.

  Written as TensorFlow's graph optimizer leaves it: it turns `x / 127`
  into `x * (1 / 127)` and `1 / x` into a Reciprocal (approximate in
  Eigen), and regroups a chain of products to bring a
  constant to the smaller operand (`(sum * row) * column` into
  `sum * (row * column)`, and `(row * c1) * c2` into `row * (c1 * c2)`),
  either of which changes the last bit of some results. So no constant
  divides, none stands in a chain of products, and the two scales
  multiply first (`int8_product`)."""
  import tensorflow as tf
  largest = tf.reduce_max(tf.abs(x), -1, keepdims=True)
  multiplier = tf.math.divide_no_nan(tf.constant(np.float32(INT8_MAX)),
                                     largest)
  return (tf.cast(tf.round(x * multiplier), tf.int8),
          tf.math.divide_no_nan(tf.constant(np.float32(1)), multiplier))


def numpy_int8_product(x, q, scale):
  """The int8 x int8 product in numpy (exact integer sums), the reference
  every runtime's `int8_product` must equal bit for bit."""
  x = np.asarray(x, np.float32)
  largest = np.abs(x).max(-1, keepdims=True)
  with np.errstate(divide="ignore"):
    multiplier = np.where(largest > 0, np.float32(INT8_MAX) / largest,
                          np.float32(0)).astype(np.float32)
    row_scale = np.where(multiplier > 0, np.float32(1) / multiplier,
                         np.float32(0)).astype(np.float32)
  qx = np.rint(x * multiplier)
  # float64 products of integers: exact (every sum is far below 2**53).
  sums = (qx.astype(np.float64) @ q.astype(np.float64)).astype(np.float32)
  return sums * (row_scale * scale)


def onednn_int8_inexact_why():
  """Why oneDNN's u8 x s8 sums cannot be exact in this process, or None.

  They are exact only through VNNI (`vpdpbusd` adds in int32). TensorFlow
  turns oneDNN off on CPUs without VNNI, BF16 or AMX (the AVX2 machines),
  where `QuantizedMatMulWithBias` fails; limited to AVX2
  (`ONEDNN_MAX_CPU_ISA`), oneDNN adds pairs of products in int16, which
  saturates (benchmarks/results/int8-onednn-avx2-epyc-zen5-2026-12.md).
  """
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
  if not _pywrap_util_port.IsMklEnabled():
    return ("TensorFlow runs without oneDNN here (its default on CPUs "
            "without VNNI, BF16 or AMX; or TF_ENABLE_ONEDNN_OPTS=0)")
  isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
  if isa != "ALL" and not any(s in isa for s in ("VNNI", "BF16", "AMX")):
    return f"ONEDNN_MAX_CPU_ISA={isa} leaves oneDNN no VNNI"
  return None


def int8_product(array, how, const_in_body=False):
  """(x -> x @ array) as the int8 x int8 product (the module docstring),
  `how`: "s8s8" (`tf.linalg.matmul(..., output_type=tf.int32)`) or
  "onednn_u8s8" (`QuantizedMatMulWithBias`); `const_in_body`: the weights
  made constants where the product is traced (inside a loop's body),
  rather than one captured tensor."""
  import tensorflow as tf
  q, scale = quantize_columns(np.asarray(array, np.float32))
  captured = None if const_in_body else tf.constant(q)
  weights = lambda: tf.constant(q) if captured is None else captured
  if how == "s8s8":
    int32_product = lambda qx: tf.linalg.matmul(qx, weights(),
                                                output_type=tf.int32)
  else:
    shift = (128 * q.astype(np.int64).sum(0)).astype(np.int32)
    zero_bias = np.zeros(q.shape[1], np.int32)

    def int32_product(qx):
      shifted = tf.cast(tf.cast(qx, tf.int32) + 128, tf.uint8)
      # min_a = 0: the u8 values are taken as they are (no zero point).
      sums = tf.raw_ops.QuantizedMatMulWithBias(
          a=tf.bitcast(shifted, tf.quint8),
          b=tf.bitcast(weights(), tf.qint8),
          bias=tf.bitcast(tf.constant(zero_bias), tf.qint32),
          min_a=tf.constant(0.0), max_a=tf.constant(255.0),
          min_b=tf.constant(-127.0), max_b=tf.constant(127.0),
          Toutput=tf.qint32)[0]
      return tf.bitcast(sums, tf.int32) - shift

  def product(x):
    qx, x_scale = quantize_rows(x)
    return tf.cast(int32_product(qx), tf.float32) * (x_scale * scale)
  return product


def xnnpack_dynamic_int8(x, q_out_in, scale):
  """LiteRT/XNNPACK's dynamic-range fully-connected product in numpy: each
  row of x `[..., K]` rounded asymmetrically to int8 (XNNPACK's
  `xnn_f32_qd8_asymmetric_quantization_params`: a zero point, the
  multiplier 255 / (max(0, max x) - min(0, min x))), exact integer sums
  with the int8 weights `[N, K]` (the converter's: symmetric per output
  channel), then `(float32(sum) * (1 / multiplier)) * scale`."""
  f = np.float32
  x = np.asarray(x, f)
  low = np.minimum(f(0), x.min(-1, keepdims=True))
  high = np.maximum(f(0), x.max(-1, keepdims=True))
  with np.errstate(divide="ignore"):
    multiplier = np.where(low == high, f(1), f(255) / (high - low)).astype(f)
  low_scaled, high_scaled = low * multiplier, high * multiplier
  zero_point = np.where((f(-128) + low_scaled) + (f(127) + high_scaled) > 0,
                        f(-128) - low_scaled, f(127) - high_scaled)
  zero_point = np.rint(np.clip(zero_point, f(-128), f(127)))
  qx = np.clip(np.rint(x * multiplier) + zero_point, -128, 127)
  w = q_out_in.astype(np.float64)
  # float64 products of integers: exact (every sum is far below 2**53).
  sums = qx.astype(np.float64) @ w.T - zero_point.astype(np.float64) * w.sum(1)
  return (sums.astype(f) * (f(1) / multiplier)) * scale


def xnnpack_int8_product(array):
  """XNNPACK's dynamic-range arithmetic (`xnnpack_dynamic_int8`) in
  TensorFlow, the int32 sums by oneDNN's u8 x s8 (an asymmetric int8 row
  plus 128 is a u8 row; 128 and the zero point come off in int32), the
  weights constants of the graph: x `[B, K]` -> x @ array."""
  import tensorflow as tf
  from rnnstep.model import int8_arithmetic
  q, column_scale = quantize_columns(np.asarray(array, np.float32))
  column_sums = q.astype(np.int32).sum(0)
  zero_bias = np.zeros(q.shape[1], np.int32)
  f = lambda value: tf.constant(np.float32(value))

  def product(x):
    # The rows rounded as rnnstep's int8 products round them.
    qx, zero_point, multiplier = int8_arithmetic.rounded_rows(x)
    shifted = tf.cast(tf.cast(qx, tf.int32) + 128, tf.uint8)
    sums = tf.raw_ops.QuantizedMatMulWithBias(
        a=tf.bitcast(shifted, tf.quint8), b=tf.constant(q, tf.qint8),
        bias=tf.bitcast(tf.constant(zero_bias), tf.qint32),
        min_a=f(0), max_a=f(255), min_b=f(-127), max_b=f(127),
        Toutput=tf.qint32)[0]
    offset = tf.cast(zero_point, tf.int32) + 128
    sums = tf.bitcast(sums, tf.int32) - offset * column_sums
    # Not `1 / multiplier`: the graph optimizer makes that a Reciprocal,
    # which Eigen computes approximately (off in the last bit).
    row_scale = tf.math.divide_no_nan(f(1), multiplier)
    # XNNPACK multiplies by the row's scale first. MulNoNan (exact where the
    # scale is not 0) keeps the two products apart: the graph optimizer
    # regroups a chain of Muls of different shapes (`quantize_rows`).
    return tf.math.multiply_no_nan(tf.cast(sums, tf.float32) * row_scale,
                                   column_scale)
  return product


class TfLoop:
  """--steps products in one `tf.while_loop` (graph or XLA), each output
  feeding the next input."""

  def __init__(self, array, variant, steps):
    import tensorflow as tf
    k, n = array.shape
    xla = variant.startswith("xla")
    if variant.endswith("f32_const"):
      product = lambda x: tf.matmul(x, tf.constant(array))
    elif variant.endswith("f32"):
      kernel = tf.constant(array)
      product = lambda x: tf.matmul(x, kernel)
    else:
      how = "onednn_u8s8" if "onednn" in variant else "s8s8"
      product = int8_product(array, how,
                             const_in_body=(how == "onednn_u8s8"
                                            and not ARGS.onednn_argument))

    def feed(x, y):
      y = y[:, :k] if n >= k else tf.tile(y, [1, k // n])
      return x + y * 1e-3

    def loop(x):
      return tf.while_loop(lambda t, x: t < steps,
                           lambda t, x: (t + 1, feed(x, product(x))),
                           (0, x))[1]
    self.fn = tf.function(loop, jit_compile=xla, autograph=False)
    self.x = tf.constant(np.random.default_rng(1).standard_normal(
        (1, k)).astype(np.float32))

  def run(self):
    self.fn(self.x).numpy()


def litert_product(array, dynamic_int8):
  """One product's flatbuffer (the weights its constants)."""
  import tensorflow as tf
  k = array.shape[0]
  fn = tf.function(lambda x: tf.matmul(x, tf.constant(array)),
                   input_signature=[tf.TensorSpec([1, k], tf.float32)])
  converter = tf.lite.TFLiteConverter.from_concrete_functions(
      [fn.get_concrete_function()], fn)
  if dynamic_int8:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
  return converter.convert()


class LiteRTLoop:
  """--steps invocations of one product's flatbuffer, each output feeding
  the next input."""

  def __init__(self, array, variant, steps):
    from ai_edge_litert import interpreter as litert
    flatbuffer = litert_product(array, "int8" in variant)
    options = {}
    if variant.endswith("builtin"):
      options["experimental_op_resolver_type"] = (
          litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    self.it = litert.Interpreter(model_content=flatbuffer,
                                 num_threads=os.cpu_count(), **options)
    self.it.allocate_tensors()
    self.k, self.n, self.steps = array.shape[0], array.shape[1], steps

  def run(self):
    it = self.it
    inp = it.get_input_details()[0]["index"]
    out = it.get_output_details()[0]["index"]
    x = np.full([1, self.k], 0.1, np.float32)
    for _ in range(self.steps):
      it.set_tensor(inp, x)
      it.invoke()
      y = it.get_tensor(out)
      y = y[:, :self.k] if self.n >= self.k else np.tile(y, [1,
                                                             self.k // self.n])
      x = x + y * np.float32(1e-3)


def check(array, rows=100):
  """{runtime: whether its outputs equal the numpy definition bit for bit}
  over `rows` random rows."""
  import tensorflow as tf
  from ai_edge_litert import interpreter as litert
  rng = np.random.default_rng(2)
  x = rng.standard_normal((rows, array.shape[0])).astype(np.float32)
  q, scale = quantize_columns(array)
  want = numpy_int8_product(x, q, scale)
  found = {}
  for how in ("s8s8", "onednn_u8s8"):
    for xla in (False, True) if how == "s8s8" else (False,):
      got = tf.function(int8_product(array, how, const_in_body=True),
                        jit_compile=xla)(tf.constant(x)).numpy()
      found[f"{'xla' if xla else 'graph'}_{how} == numpy int8 x int8"] = (
          np.array_equal(got, want))
  flatbuffer = litert_product(array, True)
  xnnpack = tf.function(xnnpack_int8_product(array))
  got = xnnpack(tf.constant(x)).numpy()
  want = xnnpack_dynamic_int8(x, q.T, scale)
  found["graph_onednn_u8s8, XNNPACK's arithmetic == numpy XNNPACK dynamic "
        "int8"] = np.array_equal(got, want)
  for name, options in [("litert_dynamic_int8", {}), (
      "litert_dynamic_int8_builtin",
      {"experimental_op_resolver_type":
       litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES})]:
    it = litert.Interpreter(model_content=flatbuffer, **options)
    it.allocate_tensors()
    weights = next(t for t in it.get_tensor_details()
                   if t["dtype"] == np.int8 and list(t["shape"]) == [
                       array.shape[1], array.shape[0]])
    wq = it.get_tensor(weights["index"])
    wscale = weights["quantization_parameters"]["scales"].astype(np.float32)
    same = 0
    for row in x:
      it.set_tensor(it.get_input_details()[0]["index"], row[None])
      it.invoke()
      got = it.get_tensor(it.get_output_details()[0]["index"])[0]
      same += np.array_equal(got, xnnpack_dynamic_int8(row, wq, wscale))
    found[f"{name} == numpy XNNPACK dynamic int8 (rows)"] = f"{same}/{rows}"
    found[f"{name}: the converter's int8 weights == rnnstep's"] = (
        np.array_equal(wq.T, q) and np.array_equal(wscale, scale))
  return found


def main():
  global ARGS
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default=SHAPES)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=0,
                      help="products a timed call (0: about 400 MB of "
                      "float32 weights read a call, at least 10)")
  parser.add_argument("--onednn_argument", action="store_true",
                      help="graph_onednn_u8s8 with the weights a captured "
                      "tensor, not constants of the body")
  parser.add_argument("--check_only", action="store_true")
  ARGS = parser.parse_args()
  sys.path.insert(0, ROOT)
  from rnnstep.model import reduced_weights
  print(f"machine: {os.cpu_count()} CPUs, load "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset)')}",
        flush=True)
  rng = np.random.default_rng(0)
  variants = [v for v in ARGS.variants.split(",") if v]
  for shape in ARGS.shapes.split(","):
    k, n = (int(d) for d in shape.split("x"))
    # The int8 model's weights (their float32 values), which the float32
    # variants multiply as they are and the converter rounds back to the
    # same int8 values and scales.
    array = reduced_weights.reduce(
        (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
        "int8", -2)
    for name, result in check(array).items():
      print(f"  {shape} check: {name}: {result}", flush=True)
    if ARGS.check_only:
      continue
    steps = ARGS.steps or max(10, int(4e8 / (4 * k * n)))
    loops = {}
    for v in variants:
      loops[v] = (LiteRTLoop if v.startswith("litert") else TfLoop)(
          array, v, steps)
      start = time.perf_counter()
      loops[v].run()
      print(f"  {shape} {v}: first call {time.perf_counter() - start:.1f} s",
            flush=True)
    times = {v: [] for v in variants}
    for r in range(ARGS.rounds):
      for v in variants[r % len(variants):] + variants[:r % len(variants)]:
        start = time.perf_counter()
        loops[v].run()
        times[v].append((time.perf_counter() - start) / steps * 1e3)
    base = times.get("graph_f32")
    print(f"\n{shape}, {steps} products a call, load "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| variant | ms a product (median) | rounds | x graph_f32 (paired) |")
    print("|---|---|---|---|")
    for v in variants:
      ratio = (statistics.median(a / b for a, b in zip(times[v], base))
               if base else float("nan"))
      print(f"| {v} | {statistics.median(times[v]):.3f} | "
            f"{' '.join(f'{t:.2f}' for t in times[v])} | {ratio:.2f} |",
            flush=True)
    print(flush=True)
    del loops


ARGS = None

if __name__ == "__main__":
  sys.exit(main())
