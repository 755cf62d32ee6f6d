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
`../shared/design/keras-formats.md`); results agree with Keras to float32
rounding (bias additions are regrouped, which moves the last bit at most).

Reduced precision: with `compute_dtype` bfloat16 or float16 the matmul operands
are cast to it and the products come back as float32; states, gates and biases
stay float32.
"""

from typing import Tuple

import tensorflow as tf

State = Tuple[tf.Tensor, ...]


class Cell:
  """Interface shared by the cells.

  Attributes:
    units: the width of the output (and of each state tensor).
    state_size: one entry per state tensor, each `units`.
  """

  units: int
  state_size: Tuple[int, ...]

  def __init__(self, kernel, recurrent_kernel, compute_dtype=tf.float32):
    self.compute_dtype = tf.as_dtype(compute_dtype)
    self.units = int(recurrent_kernel.shape[0])
    # None where the input projection is precomputed elsewhere (layer 0's table).
    self.kernel = None if kernel is None else tf.cast(kernel, self.compute_dtype)
    self.recurrent_kernel = tf.cast(recurrent_kernel, self.compute_dtype)

  def zero_state(self, batch_size) -> State:
    """Returns the all-zero initial state (Keras' default) for `batch_size` rows."""
    return tuple(tf.zeros([batch_size, size], tf.float32) for size in self.state_size)

  def project_inputs(self, inputs: tf.Tensor) -> tf.Tensor:
    """Returns `inputs @ kernel + input_bias` for inputs of shape `[..., D]`."""
    return _matmul(inputs, self.kernel, self.compute_dtype) + self.input_bias

  def step(self, x_proj: tf.Tensor, state: State) -> Tuple[tf.Tensor, State]:
    """Advances one timestep.

    Args:
      x_proj: `project_inputs(x_t)`, shape `[B, G*units]`.
      state: the previous state, a tuple of `[B, units]` tensors.

    Returns:
      `(output [B, units], new_state)`.
    """
    raise NotImplementedError


def _matmul(a, w, compute_dtype):
  """`a @ w` with `a` cast to the weights' dtype and the result in float32.

  Kept free of a fused bias add: XLA's CPU backend runs a matvec with an addend
  on a single thread (see BUILD_NOTES.md), a plain one on all of them.
  """
  if compute_dtype == tf.float32:
    if a.shape.rank == 2:
      return tf.matmul(a, w)
    return tf.tensordot(a, w, [[a.shape.rank - 1], [0]])
  a = tf.cast(a, compute_dtype)
  if a.shape.rank == 2:
    return tf.cast(tf.matmul(a, w), tf.float32)
  return tf.cast(tf.tensordot(a, w, [[a.shape.rank - 1], [0]]), tf.float32)


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
               compute_dtype=tf.float32):
    super().__init__(kernel, recurrent_kernel, compute_dtype)
    units = self.units
    self.state_size = (units,)
    self.reset_after = reset_after
    bias = tf.convert_to_tensor(bias, tf.float32)
    if reset_after:
      self.input_bias = bias[0] + tf.concat([bias[1, :2 * units],
                                             tf.zeros([units])], 0)
      self.candidate_bias = bias[1, 2 * units:]
    else:
      self.input_bias = bias
      self.recurrent_gates = self.recurrent_kernel[:, :2 * units]
      self.recurrent_candidate = self.recurrent_kernel[:, 2 * units:]

  def step(self, x_proj, state):
    (h,) = state
    units = self.units
    x_gates, x_candidate = x_proj[:, :2 * units], x_proj[:, 2 * units:]
    if self.reset_after:
      h_proj = _matmul(h, self.recurrent_kernel, self.compute_dtype)
      zr = tf.sigmoid(x_gates + h_proj[:, :2 * units])
      z, r = zr[:, :units], zr[:, units:]
      n = tf.tanh(x_candidate + r * (h_proj[:, 2 * units:] + self.candidate_bias))
    else:
      zr = tf.sigmoid(x_gates + _matmul(h, self.recurrent_gates,
                                        self.compute_dtype))
      z, r = zr[:, :units], zr[:, units:]
      n = tf.tanh(x_candidate + _matmul(r * h, self.recurrent_candidate,
                                        self.compute_dtype))
    h_new = z * h + (1.0 - z) * n
    return h_new, (h_new,)


class LSTMCell(Cell):
  """Keras LSTM, gate blocks `[i | f | c | o]` in K `[D, 4U]`, R `[U, 4U]`, b `[4U]`.

    i, f, g, o = split(x @ K + h @ R + b)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')

  State is `(h, c)`. `unit_forget_bias` only initializes b; the stored bias is
  used as is.
  """

  def __init__(self, kernel, recurrent_kernel, bias, compute_dtype=tf.float32):
    super().__init__(kernel, recurrent_kernel, compute_dtype)
    self.state_size = (self.units, self.units)
    self.input_bias = tf.convert_to_tensor(bias, tf.float32)

  def step(self, x_proj, state):
    h, c = state
    units = self.units
    gates = x_proj + _matmul(h, self.recurrent_kernel, self.compute_dtype)
    # One sigmoid over all four blocks (the c block's is unused) costs fewer ops
    # than gathering the three gate blocks first.
    gate = tf.sigmoid(gates)
    i, f, o = gate[:, :units], gate[:, units:2 * units], gate[:, 3 * units:]
    c_new = f * c + i * tf.tanh(gates[:, 2 * units:3 * units])
    h_new = o * tf.tanh(c_new)
    return h_new, (h_new, c_new)


class SimpleRNNCell(Cell):
  """Keras SimpleRNN, K `[D, U]`, R `[U, U]`, b `[U]`: `h' = tanh(x @ K + b + h @ R)`."""

  def __init__(self, kernel, recurrent_kernel, bias, compute_dtype=tf.float32):
    super().__init__(kernel, recurrent_kernel, compute_dtype)
    self.state_size = (self.units,)
    self.input_bias = tf.convert_to_tensor(bias, tf.float32)

  def step(self, x_proj, state):
    (h,) = state
    h_new = tf.tanh(x_proj + _matmul(h, self.recurrent_kernel, self.compute_dtype))
    return h_new, (h_new,)


# How many [B, units] tensors each kind's state holds: (h,) or (h, c).
STATE_TENSORS = {"gru": 1, "lstm": 2, "simple_rnn": 1}


def state_sizes(layer_config) -> Tuple[int, ...]:
  """The state tensor widths of a `model_file.LayerConfig`'s cell."""
  return (layer_config.units,) * STATE_TENSORS[layer_config.kind]


def make_cell(layer_config, kernel, recurrent_kernel, bias,
              compute_dtype=tf.float32) -> Cell:
  """Builds the cell for a `model_file.LayerConfig` from its three tensors."""
  if layer_config.kind == "gru":
    return GRUCell(kernel, recurrent_kernel, bias, layer_config.reset_after,
                   compute_dtype)
  if layer_config.kind == "lstm":
    return LSTMCell(kernel, recurrent_kernel, bias, compute_dtype)
  if layer_config.kind == "simple_rnn":
    return SimpleRNNCell(kernel, recurrent_kernel, bias, compute_dtype)
  raise ValueError(f"unknown recurrent layer kind {layer_config.kind!r}")
