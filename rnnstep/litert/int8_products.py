"""An int8 model's products in the LiteRT artifact: XNNPACK's own int8
fully-connected kernel (issue #62).

`weights_dtype="int8"` multiplies in XNNPACK's dynamic-range arithmetic
(`rnnstep.model.int8_arithmetic`), so the artifact can run each such
product on the kernel that defines it, reading a quarter of the bytes.
The export traces an int8 model's products as `x @ (q * scale)` (the
converter folds each matrix into a float32 constant) and `rewrite` turns
those constants back into what the library holds, int8 q with a float32
scale per output channel, each FULLY_CONNECTED then dynamic-range
(XNNPACK rounds its input rows to int8 as it runs). Nothing else changes:
the rest stays float32 as in a float32 model's artifact (the input table,
biases, RWKV-7's LoRAs and vectors), so the artifact's arithmetic is the
library's, product for product.

Which constants: a FULLY_CONNECTED's weights `[N, K]` whose every row is
exactly `q * s`, q int8 with max |q| = 127 (or a row of zeros), as
`reduced_weights.encode` stores an int8 model's matrices; a float32
matrix is never so (every value an exact multiple of its row's scale)
unless it was rounded to int8. A bias the converter fused into such a
product becomes an ADD after it, as the library adds it (XNNPACK would
add a fused bias in the same rounding as the scale, a fused
multiply-add).

TensorFlow's LiteRT schema (`tensorflow.lite.python.schema_py_generated`,
the flatbuffer's object API, as TensorFlow's converter uses it) reads and
writes the flatbuffer. A model past 2 GB (the converter then keeps the
weights after the flatbuffer, each buffer an offset and a size) is written
back so, its buffers after the rewritten flatbuffer.
"""

from typing import Dict, List, Optional, Tuple

import numpy as np

from rnnstep.model import reduced_weights


# Where a buffer kept after the flatbuffer starts (a multiple of this).
_ALIGNMENT = 64


def _schema():
  from tensorflow.lite.python import schema_py_generated  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  return schema_py_generated


def int8_rows(weights: np.ndarray) -> Optional[Tuple[np.ndarray,
                                                     np.ndarray]]:
  """(q int8 `[N, K]`, float32 scales `[N]`) where every row of the float32
  `weights [N, K]` is exactly its int8 q times its scale, else None."""
  if weights.ndim != 2 or not weights.size:
    return None
  q, scale = reduced_weights.encode(weights, "int8", -1, "weights")
  if not np.array_equal(reduced_weights.decode(q, scale, "int8"), weights):
    return None
  largest = np.abs(q.astype(np.int16)).max(-1)
  if not np.all((largest == reduced_weights.INT8_MAX) | (scale[:, 0] == 0)):
    return None
  return q, scale[:, 0]


def rewrite(flatbuffer: bytes) -> Tuple[bytes, int]:
  """The flatbuffer with each int8-valued FULLY_CONNECTED weight as int8
  (see the module docstring); returns (flatbuffer, products rewritten).

  """
  schema = _schema()
  model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(flatbuffer, 0))
  outside = any((b.offset or 0) > 1 for b in model.buffers)
  for buffer in model.buffers:  # Read what lies after the flatbuffer.
    if (buffer.offset or 0) > 1:
      buffer.data = np.frombuffer(flatbuffer, np.uint8, buffer.size,
                                  buffer.offset)
      buffer.offset, buffer.size = 0, 0
  codes = [max(code.builtinCode, code.deprecatedBuiltinCode)
           for code in model.operatorCodes]
  # A float32 buffer -> (its int8 buffer, the scales).
  rewritten: Dict[int, Tuple[int, np.ndarray]] = {}
  count = 0
  for graph in model.subgraphs:
    operators: List = []
    for op in graph.operators:
      operators.append(op)
      if codes[op.opcodeIndex] != schema.BuiltinOperator.FULLY_CONNECTED:
        continue
      weights = graph.tensors[op.inputs[1]]
      if weights.type != schema.TensorType.FLOAT32:
        continue
      int8 = _int8_buffer(model, weights, rewritten)
      if int8 is None:
        continue
      q_buffer, scales = int8
      weights.type = schema.TensorType.INT8
      weights.buffer = q_buffer
      quantization = schema.QuantizationParametersT()
      quantization.scale = scales.tolist()
      quantization.zeroPoint = [0] * len(scales)
      quantization.quantizedDimension = 0
      weights.quantization = quantization
      options = op.builtinOptions
      options.asymmetricQuantizeInputs = True
      count += 1
      if len(op.inputs) > 2 and op.inputs[2] >= 0:
        operators.extend(_bias_after(schema, model, codes, graph, op))
    graph.operators = operators
  still_read = {t.buffer for graph in model.subgraphs for t in graph.tensors
                if t.type != schema.TensorType.INT8}
  for old in set(rewritten) - still_read:  # Float32 copies no one reads.
    model.buffers[old].data = None
  if outside:
    return _packed_with_buffers_after(model), count
  return _packed(model, len(flatbuffer)), count


def _packed(model, size: int = 1024) -> bytes:
  import flatbuffers  # pylint: disable=g-import-not-at-top
  builder = flatbuffers.Builder(size)
  builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
  return bytes(builder.Output())


def _packed_with_buffers_after(model) -> bytes:
  """The model with every buffer's data after the flatbuffer (offsets and
  sizes, as the converter writes a model past 2 GB)."""
  outside = []  # (buffer, its bytes)
  for buffer in model.buffers:
    if buffer.data is not None and len(buffer.data):
      outside.append((buffer, np.asarray(buffer.data, np.uint8)))
      buffer.offset, buffer.size = 2, len(buffer.data)  # Set below.
    else:
      buffer.offset, buffer.size = 0, 0
    buffer.data = None
  # Offsets are fixed-size fields: the placeholders' length is the final one.
  head = len(_packed(model))
  position = head
  for buffer, _ in outside:
    buffer.offset = position = -(-position // _ALIGNMENT) * _ALIGNMENT
    position += buffer.size
  out = bytearray(position)
  packed = _packed(model)
  if len(packed) != head:
    raise RuntimeError("the rewritten flatbuffer's length moved")
  out[:head] = packed
  for buffer, data in outside:
    out[buffer.offset:buffer.offset + buffer.size] = data.tobytes()
  return bytes(out)


def _int8_buffer(model, weights, rewritten):
  """(the int8 buffer's index, the scales) for a weights tensor whose
  float32 buffer is int8-valued, else None; each buffer converted once."""
  index = weights.buffer
  if index in rewritten:
    return rewritten[index]
  data = model.buffers[index].data
  found = None
  if data is not None and len(data):
    # A view of the buffer's bytes, not a copy (a 0.1B model's are 135 MB).
    values = np.ascontiguousarray(data, np.uint8).view("<f4").reshape(
        weights.shape)
    rows = int8_rows(values)
    if rows is not None:
      buffer = _schema().BufferT()
      buffer.data = rows[0].view(np.uint8).ravel()
      model.buffers.append(buffer)
      found = (len(model.buffers) - 1, rows[1])
  if found is not None:
    rewritten[index] = found
  return found


# The activations an ADD fuses as a FULLY_CONNECTED does; a TANH is an
# op of its own after it.
_ADD_FUSES = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


def _bias_after(schema, model, codes, graph, op):
  """Moves a FULLY_CONNECTED's bias (and its activation) into an ADD of
  its output (and a TANH after it); returns the ops that now follow it.

  Raises:
    ValueError: an activation neither an ADD nor a TANH op computes.
  """
  kinds = schema.ActivationFunctionType
  activation = op.builtinOptions.fusedActivationFunction
  name = next(k for k, v in vars(kinds).items() if v == activation)
  if name not in _ADD_FUSES + ("TANH",):
    raise ValueError(f"an int8 product's fused activation {name} is not "
                     "one the artifact can apply after its bias")
  output = op.outputs[0]
  product = _like(schema, graph, output, b"/int8_product")
  add = _operator(schema, _opcode(model, codes, schema.BuiltinOperator.ADD),
                  [product, op.inputs[2]], [output])
  add.builtinOptionsType = schema.BuiltinOptions.AddOptions
  add.builtinOptions = schema.AddOptionsT()
  op.builtinOptions.fusedActivationFunction = kinds.NONE
  op.inputs = [op.inputs[0], op.inputs[1], -1]
  op.outputs = [product]
  if name != "TANH":
    add.builtinOptions.fusedActivationFunction = activation
    return [add]
  biased = _like(schema, graph, output, b"/biased")
  add.outputs = [biased]
  return [add, _operator(
      schema, _opcode(model, codes, schema.BuiltinOperator.TANH), [biased],
      [output])]


def _like(schema, graph, index, suffix) -> int:
  """A new float32 tensor shaped as tensor `index`; returns its index."""
  like = graph.tensors[index]
  tensor = schema.TensorT()
  tensor.shape = list(like.shape)
  tensor.shapeSignature = (None if like.shapeSignature is None
                           else list(like.shapeSignature))
  tensor.type = schema.TensorType.FLOAT32
  tensor.buffer = 0
  tensor.name = (like.name or b"") + suffix
  graph.tensors.append(tensor)
  return len(graph.tensors) - 1


def _operator(schema, opcode, inputs, outputs):
  op = schema.OperatorT()
  op.opcodeIndex = opcode
  op.inputs = list(inputs)
  op.outputs = list(outputs)
  return op


def _opcode(model, codes, builtin) -> int:
  """The index of `builtin`'s operator code, added where missing."""
  if builtin in codes:
    return codes.index(builtin)
  schema = _schema()
  code = schema.OperatorCodeT()
  code.builtinCode = builtin
  code.deprecatedBuiltinCode = min(builtin, 127)
  code.version = 1
  model.operatorCodes.append(code)
  codes.append(builtin)
  return len(codes) - 1


