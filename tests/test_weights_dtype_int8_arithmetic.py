"""int8 x int8 products as one arithmetic on every runtime (issue #62):
tools/bench/int8_products.py's definitions against numpy, and rnnstep's
int8 products (`rnnstep.model.int8_arithmetic`, the artifact's
`rnnstep.litert.int8_products`) against them.

int8 weights decode faster only where the activations are rounded to int8
too and the products summed in int32 (LiteRT/XNNPACK's dynamic-range int8,
oneDNN's u8 x s8, llama.cpp's Q8_0). The int32 sums are exact, so such an
arithmetic can give one result on every runtime, if its float32 steps are
written as ops no compiler rewrites. These tests pin what step 2 of the
issue builds on, each against an independent numpy reference (int64
sums): TensorFlow's graph (`tf.linalg.matmul(int8, int8)` and oneDNN's
`QuantizedMatMulWithBias`) and XLA give the numpy int8 x int8 product bit
for bit; LiteRT/XNNPACK's dynamic-range fully-connected product equals
XNNPACK's arithmetic written in numpy bit for bit, and the converter keeps
rnnstep's int8 weights and scales as they are; and a TensorFlow graph
computes XNNPACK's arithmetic (on oneDNN's sums) to LiteRT's very bits.
"""

import numpy as np
import pytest
import tensorflow as tf

from rnnstep.model import reduced_weights
from tools.bench import int8_products


def weights(k, n, seed=0):
  """rnnstep's int8 weights of a random `[k, n]` kernel, as float32."""
  rng = np.random.default_rng(seed)
  return reduced_weights.reduce(
      (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "int8",
      -2)


def activations(k, rows=40, seed=1):
  """Random rows, and the edge cases: a zero row, a one-hot row, a row of
  one value (every element at the scale's extreme), halves of the scale."""
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 30, (rows, 1))
       ).astype(np.float32)
  x[0] = 0
  x[1] = 0
  x[1, 3] = -2.5
  x[2] = 7.0
  x[3] = (np.arange(k) % 255 - 127).astype(np.float32) * np.float32(0.5)
  return x


@pytest.mark.parametrize("how", ["s8s8", "onednn_u8s8"])
@pytest.mark.parametrize("k,n", [(64, 48), (200, 24)])
def test_graph_int8_products_equal_numpy(how, k, n):
  why = how == "onednn_u8s8" and int8_products.onednn_int8_inexact_why()
  if why:
    pytest.skip(why)
  array = weights(k, n)
  q, scale = int8_products.quantize_columns(array)
  x = activations(k)
  for const_in_body in (False, True):
    got = tf.function(int8_products.int8_product(array, how, const_in_body))(
        tf.constant(x)).numpy()
    np.testing.assert_array_equal(
        got, int8_products.numpy_int8_product(x, q, scale))


def test_xla_int8_product_equals_numpy():
  array = weights(96, 40)
  q, scale = int8_products.quantize_columns(array)
  x = activations(96)
  got = tf.function(int8_products.int8_product(array, "s8s8"),
                    jit_compile=True)(tf.constant(x)).numpy()
  np.testing.assert_array_equal(
      got, int8_products.numpy_int8_product(x, q, scale))


def test_int8_product_is_near_the_float32_product():
  """The arithmetic is the float32 product up to the activations' and the
  weights' rounding (a sanity check of the reference itself)."""
  array = weights(256, 32)
  q, scale = int8_products.quantize_columns(array)
  x = activations(256)[4:]
  want = x @ array
  got = int8_products.numpy_int8_product(x, q, scale)
  bound = np.abs(x).max(-1, keepdims=True) / 127 * np.abs(array).sum(0) / 2
  assert (np.abs(got - want) <= bound * 1.001 + 1e-6).all()


@pytest.mark.parametrize("k,n", [(64, 48), (768, 40), (3072, 24),
                                 (2000, 8)])
@pytest.mark.parametrize("jit", [False, True])
def test_rnnstep_int8_products_are_xnnpack_arithmetic(k, n, jit):
  """`int8_arithmetic.product` (an int8 model's every product, on the graph
  and XLA paths) equals XNNPACK's arithmetic in numpy bit for bit: rows of
  every size (chunked past 1,032 terms), batched or not, and the edge
  rows (zero, one-hot, constant, one-signed, tiny, huge)."""
  from rnnstep.model import int8_arithmetic  # pylint: disable=g-import-not-at-top
  array = weights(k, n)
  q, scale = int8_products.quantize_columns(array)
  kernel = int8_arithmetic.Int8Kernel(
      *(tf.constant(t) for t in int8_arithmetic.parts(array)))
  x = activations(k)
  x[5], x[6] = np.abs(x[5]), -np.abs(x[6])
  x[7] *= np.float32(1e-30)
  x[8] *= np.float32(1e30)
  want = int8_products.xnnpack_dynamic_int8(x, q.T, scale)
  product = tf.function(lambda x: int8_arithmetic.product(x, kernel),
                        jit_compile=jit, autograph=False)
  np.testing.assert_array_equal(product(tf.constant(x)).numpy(), want)
  np.testing.assert_array_equal(
      product(tf.constant(x.reshape(4, 10, k))).numpy().reshape(40, n), want)


@pytest.mark.slow  # A LiteRT conversion.
@pytest.mark.parametrize("buffers_after", [False, True])
def test_the_artifact_s_int8_products_are_the_library_s_bit_for_bit(
    buffers_after):
  """`rnnstep.litert.int8_products.rewrite` turns a float32 product by
  int8-valued weights (and its fused bias) into XNNPACK's int8 product:
  LiteRT's outputs are the library's, bit for bit, and the weights stored
  are the library's q and scales. `buffers_after`: the weights after the
  flatbuffer, as the converter writes a model past 2 GB."""
  from ai_edge_litert import interpreter as litert  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import int8_products as rewriting  # pylint: disable=g-import-not-at-top
  from rnnstep.model import int8_arithmetic  # pylint: disable=g-import-not-at-top
  k, n = 192, 40
  array = weights(k, n, seed=5)
  bias = np.random.default_rng(6).standard_normal(n).astype(np.float32)
  fn = tf.function(lambda x: tf.nn.relu(tf.matmul(x, tf.constant(array))
                                        + tf.constant(bias)),
                   input_signature=[tf.TensorSpec([1, k], tf.float32)])
  converter = tf.lite.TFLiteConverter.from_concrete_functions(
      [fn.get_concrete_function()], fn)
  converter._experimental_use_buffer_offset = buffers_after  # pylint: disable=protected-access
  flatbuffer, count = rewriting.rewrite(converter.convert())
  assert count == 1
  # The weights (and the bias) lie after the flatbuffer, or in it.
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  stored = schema.Model.GetRootAs(flatbuffer, 0)
  assert buffers_after == any(stored.Buffers(i).Offset() > 1
                              for i in range(stored.BuffersLength()))
  interpreter = litert.Interpreter(model_content=flatbuffer)
  interpreter.allocate_tensors()
  q, scale = int8_products.quantize_columns(array)
  stored = next(t for t in interpreter.get_tensor_details()
                if t["dtype"] == np.int8)
  np.testing.assert_array_equal(interpreter.get_tensor(stored["index"]).T, q)
  np.testing.assert_array_equal(
      stored["quantization_parameters"]["scales"].astype(np.float32), scale)
  kernel = int8_arithmetic.Int8Kernel(
      *(tf.constant(t) for t in int8_arithmetic.parts(array)))
  x = activations(k, seed=7)
  x[5], x[6] = np.abs(x[5]), -np.abs(x[6])
  want = tf.nn.relu(int8_arithmetic.product(tf.constant(x), kernel)
                    + bias).numpy()
  for row, expected in zip(x, want):
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"],
                           row[None])
    interpreter.invoke()
    np.testing.assert_array_equal(interpreter.get_tensor(
        interpreter.get_output_details()[0]["index"])[0], expected)


@pytest.mark.slow  # A LiteRT conversion: the numpy definition's pin.
def test_litert_dynamic_int8_is_xnnpack_arithmetic():
  from ai_edge_litert import interpreter as litert
  k, n = 160, 56
  array = weights(k, n)
  q, scale = int8_products.quantize_columns(array)
  interpreter = litert.Interpreter(
      model_content=int8_products.litert_product(array, True))
  interpreter.allocate_tensors()
  kernel = next(t for t in interpreter.get_tensor_details()
                if t["dtype"] == np.int8 and list(t["shape"]) == [n, k])
  stored = interpreter.get_tensor(kernel["index"])
  stored_scale = kernel["quantization_parameters"]["scales"]
  # The converter keeps rnnstep's int8 weights: the same q and scales.
  np.testing.assert_array_equal(stored.T, q)
  np.testing.assert_array_equal(stored_scale.astype(np.float32), scale)
  x = activations(k)
  x[5] = np.abs(x[5])  # All positive: the zero point at its end.
  x[6] = -np.abs(x[6])
  for row in x:
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"],
                           row[None])
    interpreter.invoke()
    got = interpreter.get_tensor(
        interpreter.get_output_details()[0]["index"])[0]
    np.testing.assert_array_equal(
        got, int8_products.xnnpack_dynamic_int8(row, stored, scale))


@pytest.mark.slow
@pytest.mark.exhaustive  # A benchmark tool's finding (LiteRT conversions).
def test_graph_computes_litert_dynamic_int8_bit_for_bit():
  """XNNPACK's arithmetic in a TensorFlow graph (oneDNN's u8 x s8 sums)
  gives LiteRT's outputs exactly: one int8 text on both is possible."""
  why = int8_products.onednn_int8_inexact_why()
  if why:
    pytest.skip(why)
  from ai_edge_litert import interpreter as litert
  k, n = 192, 40
  array = weights(k, n, seed=3)
  interpreter = litert.Interpreter(
      model_content=int8_products.litert_product(array, True))
  interpreter.allocate_tensors()
  x = activations(k, seed=4)
  x[5] = np.abs(x[5])
  x[6] = -np.abs(x[6])
  litert_rows = []
  for row in x:
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"],
                           row[None])
    interpreter.invoke()
    litert_rows.append(interpreter.get_tensor(
        interpreter.get_output_details()[0]["index"])[0])
  graph = tf.function(int8_products.xnnpack_int8_product(array))(
      tf.constant(x)).numpy()
  np.testing.assert_array_equal(graph, np.stack(litert_rows))
