"""Each cell against the real Keras 3 layer, eagerly and inside tf.function."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests.support import keras_reference  # pylint: disable=unused-import (sets backend)
import keras

from rnnstep.model import cells
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import network

CASES = [
    ("gru_reset_after", "gru", True),
    ("gru_reset_before", "gru", False),
    ("lstm", "lstm", True),
    ("simple_rnn", "simple_rnn", True),
    ("simple_rnn_relu", "simple_rnn_relu", True),
]


def keras_layer(kind, units, reset_after):
  if kind == "gru":
    return keras.layers.GRU(units, return_sequences=True, return_state=True,
                            reset_after=reset_after)
  if kind == "lstm":
    return keras.layers.LSTM(units, return_sequences=True, return_state=True)
  return keras.layers.SimpleRNN(units, return_sequences=True, return_state=True,
                                activation=kinds.get(kind).activation)


class CellTest(tf.test.TestCase, parameterized.TestCase):

  def _run(self, kind, reset_after, use_function, compile_elementwise=False):
    keras.utils.set_random_seed(1)
    batch, steps, dim, units = 3, 9, 7, 12
    x = np.random.default_rng(2).normal(0, 1, [batch, steps, dim]).astype(np.float32)
    layer = keras_layer(kind, units, reset_after)
    expected = layer(x)
    weights = layer.get_weights()
    weights[-1] = np.random.default_rng(3).normal(0, 0.5, weights[-1].shape).astype(
        np.float32)
    layer.set_weights(weights)
    expected = [t.numpy() for t in layer(x)]
    cell = network.make_cell(model_file.LayerConfig(kind, units, reset_after),
                           dict(zip(kinds.get(kind).tensor_names, weights)),
                           compile_elementwise=compile_elementwise)

    def unroll(x):
      x_proj = cell.project_inputs(x)
      state = cell.zero_state(batch)
      outputs = []
      for t in range(steps):
        output, state = cell.step(x_proj[:, t], state)
        outputs.append(output)
      return tf.stack(outputs, 1), state

    fn = tf.function(unroll) if use_function else unroll
    outputs, state = fn(tf.constant(x))
    return expected, outputs, state

  @parameterized.named_parameters(
      *[(f"{name}_{mode}", kind, ra, mode != "eager", mode == "xla_gates")
        for name, kind, ra in CASES
        for mode in ("eager", "function", "xla_gates")])
  def test_matches_keras(self, kind, reset_after, use_function,
                         compile_elementwise):
    expected, outputs, state = self._run(kind, reset_after, use_function,
                                         compile_elementwise)
    self.assertAllClose(expected[0], outputs, atol=1e-6, rtol=0)
    # Keras returns (seq, h) for GRU/SimpleRNN and (seq, h, c) for LSTM.
    for want, got in zip(expected[1:], state):
      self.assertAllClose(want, got, atol=1e-6, rtol=0)

  def test_state_sizes(self):
    k, r, b = (np.zeros([4, 12]), np.zeros([3, 12]), np.zeros([12]))
    self.assertEqual(cells.LSTMCell(k, r, b).state_size, (3, 3))
    self.assertEqual(cells.GRUCell(np.zeros([4, 9]), np.zeros([3, 9]),
                                   np.zeros([9]), reset_after=False).state_size, (3,))

  def test_bfloat16_close_to_float32(self):
    rng = np.random.default_rng(0)
    k, r = rng.normal(0, .3, [5, 24]), rng.normal(0, .3, [8, 24])
    b = rng.normal(0, .3, [2, 24])
    x = tf.constant(rng.normal(0, 1, [2, 5]), tf.float32)
    full = cells.GRUCell(k, r, b)
    half = cells.GRUCell(k, r, b, compute_dtype=tf.bfloat16)
    state = full.zero_state(2)
    state = (tf.constant(rng.normal(0, .5, [2, 8]), tf.float32),)
    want, _ = full.step(full.project_inputs(x), state)
    got, _ = half.step(half.project_inputs(x), state)
    self.assertEqual(got.dtype, tf.float32)
    self.assertAllClose(want, got, atol=3e-2)


if __name__ == "__main__":
  tf.test.main()
