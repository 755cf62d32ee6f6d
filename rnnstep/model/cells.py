"""The recurrent math, written once: Keras-exact GRU, LSTM and SimpleRNN steps.

Every cell splits its work the same way, so that the input side can be batched
(over all timesteps when scoring, or precomputed as a `[V, G*U]` table for the
first layer) while the recurrent side runs once per step:

  x_proj = cell.project_inputs(x)              # x @ K + (folded) bias
  output, new_state = cell.step(x_proj, state)

Cells are plain objects over tensors, built from a model's weights inside each
compiled function, so the weights are read once per call and the loop body only
captures them. The equations and gate orders are those of Keras 2 and 3 with
`activation='tanh'`, `recurrent_activation='sigmoid'` (see
docs/dev/cell-kinds.md); results agree with Keras to float32
rounding (bias additions are regrouped, which moves the last bit at most).

Reduced precision: with `compute_dtype` bfloat16 or float16 the matmul operands
are cast to it and the products come back as float32; states, gates and biases
stay float32.

Each `step` is matmuls plus pure elementwise functions: for most cells one
product `recurrent_product(h)` and then `gate_math` (GRU with
reset_after=False has two of each). With `compile_elementwise=True` those
functions run as small XLA programs while the matmuls stay TensorFlow ops:
that keeps TF's oneDNN matmuls (which use AMX for bfloat16; XLA's CPU backend
does not) and still fuses the gate math into one pass instead of a dozen graph
ops (see `paths.ELEMENTWISE`).
"""

from typing import NamedTuple, Tuple

import tensorflow as tf

from rnnstep.model import int8_arithmetic
from rnnstep.model import kinds
from rnnstep.model import sixteen_bit

State = Tuple[tf.Tensor, ...]

# The activations a kind may name (`kinds.Kind.activation`): Keras's and
# PyTorch's, which compute these exactly so.
ACTIVATIONS = {"tanh": tf.tanh, "relu": tf.nn.relu}


class TableRows(NamedTuple):
  """An input projection not yet gathered: rows `ids` of `table`.

  `step` takes one in place of `x_proj` so that the gather runs inside the
  gate function: compiled, it is fused into the same pass instead of costing
  a separate TF gather a step.
  """
  table: tf.Tensor
  ids: tf.Tensor


def gather_rows(x_proj):
  """Gathers a `TableRows`; returns a gathered `[B, G*U]` projection as it is."""
  if isinstance(x_proj, TableRows):
    return tf.gather(x_proj.table, x_proj.ids)
  return x_proj


class Cell:
  """Interface shared by the cells.

  Attributes:
    units: the width of the output (and of each state tensor).
    state_size: one entry per state tensor, each `units`.
  """

  units: int
  state_size: Tuple[int, ...]
  # Whether a step is one product of h (`recurrent_product`) followed by
  # elementwise math only (`gate_math`): the elementwise path then compiles
  # that math together with the choice of the id the step consumes (see
  # `generator.py`). GRU with reset_after=False multiplies twice.
  fusable = True
  # Whether the cell runs a sequence itself, `unroll` (`network._unroll_cell`
  # calls it where no state is recorded), rather than step by step.
  unrolls_blockwise = False
  # Whether the cell is traced into one XLA program (the "xla" path; set by
  # `network.network_of`), where graph functions of its own would be inlined.
  one_xla_program = False
  # Whether the cell, outside one XLA program, runs small XLA programs of its
  # own, compiled at each batch size's first call (RWKV-7: a block's step,
  # the state update over a prompt).
  compiles_per_batch = False

  def __init__(self, kernel, recurrent_kernel, compute_dtype=tf.float32,
               compile_elementwise=False, activation="tanh"):
    self.compute_dtype = tf.as_dtype(compute_dtype)
    # The candidate's activation (an LSTM's cell output's too), by its kind.
    self.activation = ACTIVATIONS[activation]
    self.compile_elementwise = compile_elementwise
    self.recurrent_kernel = int8_arithmetic.cast(recurrent_kernel,
                                                 self.compute_dtype)
    self.units = int(int8_arithmetic.shape(self.recurrent_kernel)[0])
    # None where the input projection is precomputed elsewhere (layer 0's table).
    self.kernel = None if kernel is None else int8_arithmetic.cast(
        kernel, self.compute_dtype)

  def zero_state(self, batch_size) -> State:
    """Returns the all-zero initial state (Keras' default) for `batch_size` rows."""
    return tuple(tf.zeros([batch_size, size], tf.float32) for size in self.state_size)

  def project_inputs(self, inputs: tf.Tensor) -> tf.Tensor:
    """Returns `inputs @ kernel + input_bias` for inputs of shape `[..., D]`."""
    return matmul(inputs, self.kernel, self.compute_dtype) + self.input_bias

  def _product(self, a, w):
    """`a @ w` in the compute dtype; the elementwise functions widen it."""
    return matmul(a, w, self.compute_dtype, float32_result=False)

  def _elementwise(self, fn):
    """`fn` itself, or `fn` compiled by XLA when the cell compiles its gate math."""
    if not self.compile_elementwise:
      return fn
    return tf.function(fn, jit_compile=True, autograph=False)

  def step(self, x_proj: tf.Tensor, state: State) -> Tuple[tf.Tensor, State]:
    """Advances one timestep.

    Args:
      x_proj: `project_inputs(x_t)`, shape `[B, G*units]`, or a `TableRows`.
      state: the previous state, a tuple of `[B, units]` tensors.

    Returns:
      `(output [B, units], new_state)`; the output is the new state's h.
    """
    new_state = self._update(x_proj, self.recurrent_product(state[0]), state)
    return new_state[0], new_state

  def recurrent_product(self, h: tf.Tensor) -> tf.Tensor:
    """`h @ recurrent_kernel` in the compute dtype (h may be cast already)."""
    return self._product(h, self.recurrent_kernel)

  def gate_math(self, x_proj, h_proj: tf.Tensor, state: State) -> State:
    """The elementwise rest of a fusable step: the new state.

    Args:
      x_proj: as for `step`.
      h_proj: `recurrent_product(state[0])`.
      state: the previous state.
    """
    raise NotImplementedError


def matmul(a, w, compute_dtype, float32_result=True, transposed=False,
           in_xla=False):
  """`a @ w` with `a` cast to the weights' dtype (the cells' and the Dense's).

  The result is float32, or with `float32_result=False` left in the compute
  dtype for an elementwise function to widen (`as_float32`): then the cast runs
  inside that function's fused pass, not as a graph op of its own. (Either way
  the product was rounded to the compute dtype by the matmul.)

  Kept free of a fused bias add: XLA's CPU backend runs a matvec with an addend
  on a single thread (see docs/guide/performance.md), a plain one on all of them.

  An `int8_arithmetic.Int8Kernel` (an int8 model's matrix) multiplies in
  its int8 arithmetic, float32 whatever the compute dtype; a 16-bit matrix
  under float32 arithmetic is widened inside the product
  (`sixteen_bit.product`).

  Args:
    a: `[..., D]` inputs (float32, or the compute dtype already).
    w: `[D, N]` weights in the compute dtype (`[N, D]` with `transposed`),
      16-bit ones under float32 arithmetic, or an `Int8Kernel` (whatever
      `transposed` says).
    compute_dtype: the dtype the product runs in.
    float32_result: widen the product to float32 here.
    transposed: `w` is held `[N, D]` (`Kind.held_transposed`).
    in_xla: the product is traced inside an XLA program (`sixteen_bit`).

  Returns:
    `[..., N]`, float32 or (`float32_result=False`) the compute dtype.
  """
  if int8_arithmetic.is_int8(w):
    return int8_arithmetic.product(a, w)
  if sixteen_bit.widened_in_product(w, compute_dtype):
    return sixteen_bit.product(a, w, transposed, in_xla)
  if compute_dtype != tf.float32:
    a = tf.cast(a, compute_dtype)
  if a.shape.rank == 2:
    product = tf.matmul(a, w, transpose_b=transposed)
  else:
    product = tf.tensordot(a, w, [[a.shape.rank - 1], [int(transposed)]])
  return tf.cast(product, tf.float32) if float32_result else product


def as_float32(x):
  return tf.cast(x, tf.float32)  # No op when x is float32 already.


class GRUCell(Cell):
  """Keras GRU, gate blocks `[z | r | h]` in K `[D, 3U]` and R `[U, 3U]`.

  `reset_after=True` (the Keras 2.3+ default; cuDNN and PyTorch compatible),
  bias b `[2, 3U]` = (input bias, recurrent bias):

    xz, xr, xh = split(x @ K + b[0])      hz, hr, hn = split(h @ R + b[1])
    z = sigmoid(xz + hz)                  r = sigmoid(xr + hr)
    n = tanh(xh + r * hn)
    h' = z * h + (1 - z) * n

  The z and r recurrent biases are folded into the input projection (they are
  plain additions there); the candidate's recurrent bias stays inside `r * (...)`.

  `reset_after=False`, bias b `[3U]` (input only):

    xz, xr, xh = split(x @ K + b)
    z = sigmoid(xz + h @ R[:, :U])        r = sigmoid(xr + h @ R[:, U:2U])
    n = tanh(xh + (r * h) @ R[:, 2U:])
    h' = z * h + (1 - z) * n
  """

  def __init__(self, kernel, recurrent_kernel, bias, reset_after=True,
               compute_dtype=tf.float32, compile_elementwise=False,
               activation="tanh"):
    super().__init__(kernel, recurrent_kernel, compute_dtype,
                     compile_elementwise, activation)
    units = self.units
    self.state_size = (units,)
    self.reset_after = reset_after
    bias = tf.convert_to_tensor(bias, tf.float32)
    if reset_after:
      self.input_bias = bias[0] + tf.concat([bias[1, :2 * units],
                                             tf.zeros([units])], 0)
      self.candidate_bias = bias[1, 2 * units:]
      self._update = self._elementwise(self.gate_math)
    else:
      self.fusable = False
      self.input_bias = bias
      self.recurrent_gates = int8_arithmetic.columns(self.recurrent_kernel,
                                                     0, 2 * units)
      self.recurrent_candidate = int8_arithmetic.columns(
          self.recurrent_kernel, 2 * units, 3 * units)
      self._reset = self._elementwise(self._gates_z_and_reset_h)
      self._candidate = self._elementwise(self._gates_candidate)

  def step(self, x_proj, state):
    if self.reset_after:
      return super().step(x_proj, state)
    (h,) = state
    x_proj = gather_rows(x_proj)  # Used by both functions: gathered once.
    z, reset_h = self._reset(x_proj, self._product(h, self.recurrent_gates), h)
    h_new = self._candidate(
        x_proj, self._product(reset_h, self.recurrent_candidate), z, h)
    return h_new, (h_new,)

  # The elementwise parts (see the class docstring for the equations).

  def gate_math(self, x_proj, h_proj, state):
    """reset_after=True only."""
    units = self.units
    (h,) = state
    x_proj, h_proj = gather_rows(x_proj), as_float32(h_proj)
    zr = tf.sigmoid(x_proj[:, :2 * units] + h_proj[:, :2 * units])
    z, r = zr[:, :units], zr[:, units:]
    n = self.activation(x_proj[:, 2 * units:]
                        + r * (h_proj[:, 2 * units:] + self.candidate_bias))
    return (z * h + (1.0 - z) * n,)

  def _gates_z_and_reset_h(self, x_proj, h_proj_gates, h):
    units = self.units
    zr = tf.sigmoid(x_proj[:, :2 * units] + as_float32(h_proj_gates))
    return zr[:, :units], zr[:, units:] * h

  def _gates_candidate(self, x_proj, reset_h_proj, z, h):
    n = self.activation(x_proj[:, 2 * self.units:] + as_float32(reset_h_proj))
    return z * h + (1.0 - z) * n


class LSTMCell(Cell):
  """Keras LSTM, gate blocks `[i | f | c | o]` in K `[D, 4U]`, R `[U, 4U]`, b `[4U]`.

    i, f, g, o = split(x @ K + h @ R + b)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')

  State is `(h, c)`. `unit_forget_bias` only initializes b; the stored bias is
  used as is.
  """

  def __init__(self, kernel, recurrent_kernel, bias, compute_dtype=tf.float32,
               compile_elementwise=False, activation="tanh"):
    super().__init__(kernel, recurrent_kernel, compute_dtype,
                     compile_elementwise, activation)
    self.state_size = (self.units, self.units)
    self.input_bias = tf.convert_to_tensor(bias, tf.float32)
    self._update = self._elementwise(self.gate_math)

  def gate_math(self, x_proj, h_proj, state):
    units = self.units
    _, c = state
    gates = gather_rows(x_proj) + as_float32(h_proj)
    # One sigmoid over all four blocks (the c block's is unused) costs fewer ops
    # than gathering the three gate blocks first.
    gate = tf.sigmoid(gates)
    i, f, o = gate[:, :units], gate[:, units:2 * units], gate[:, 3 * units:]
    c_new = f * c + i * self.activation(gates[:, 2 * units:3 * units])
    return o * self.activation(c_new), c_new


class SimpleRNNCell(Cell):
  """Keras SimpleRNN, K `[D, U]`, R `[U, U]`, b `[U]`:
  `h' = activation(x @ K + b + h @ R)`, tanh (the default) or relu."""

  def __init__(self, kernel, recurrent_kernel, bias, compute_dtype=tf.float32,
               compile_elementwise=False, activation="tanh"):
    super().__init__(kernel, recurrent_kernel, compute_dtype,
                     compile_elementwise, activation)
    self.state_size = (self.units,)
    self.input_bias = tf.convert_to_tensor(bias, tf.float32)
    self._update = self._elementwise(self.gate_math)

  def gate_math(self, x_proj, h_proj, state):
    del state  # h enters only through h_proj.
    return (self.activation(gather_rows(x_proj) + as_float32(h_proj)),)


def state_sizes(layer_config) -> Tuple[int, ...]:
  """The state tensor widths of a `model_file.LayerConfig`'s cell."""
  return kinds.get(layer_config.kind).state_sizes(layer_config.units,
                                                  layer_config.size)


def state_names(layer_config) -> Tuple[str, ...]:
  """The names of a `model_file.LayerConfig`'s state tensors ("h", "c")."""
  return kinds.get(layer_config.kind).state_names(layer_config.size)
