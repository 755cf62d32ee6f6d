"""Model and Network: logits against real Keras models, masking, step == unroll."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests.support import keras_reference as kr

import rnnstep

STACKS = {
    "gru_reset_after": [kr.layer("gru", 32, True)],
    "gru_reset_before": [kr.layer("gru", 32, False)],
    "lstm": [kr.layer("lstm", 24)],
    "simple_rnn": [kr.layer("simple_rnn", 24)],
    "simple_rnn_relu": [kr.layer("simple_rnn_relu", 24)],
    "gru_x2": [kr.layer("gru", 24), kr.layer("gru", 20)],
    "lstm_then_gru_reset_before": [kr.layer("lstm", 24), kr.layer("gru", 16, False)],
}


def random_ids(batch, steps, vocab_size, seed=0):
  return np.random.default_rng(seed).integers(0, vocab_size, [batch, steps]).astype(
      np.int32)


class LogitsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*STACKS.items())
  def test_logits_match_keras(self, layers):
    keras_model = kr.build(layers, vocab_size=65, embedding_dim=16)
    model = kr.rnnstep_model(keras_model, layers)
    ids = random_ids(4, 40, 65)
    want = keras_model(ids, training=False).numpy()
    got = rnnstep.logits(model, ids)
    self.assertEqual(got.dtype, np.float32)
    self.assertEqual(got.shape, (4, 40, 65))
    self.assertLessEqual(np.abs(got - want).max(), 1e-5)

  def test_step_equals_unroll(self):
    layers = STACKS["lstm_then_gru_reset_before"]
    model = kr.rnnstep_model(kr.build(layers), layers)
    ids = random_ids(3, 12, 65, seed=1)
    network = model.network()
    state = network.zero_state(3)
    stepped = []
    for t in range(12):
      logits, state = network.step(tf.constant(ids[:, t]), state)
      stepped.append(logits)
    self.assertAllClose(tf.stack(stepped, 1), rnnstep.logits(model, ids),
                        atol=1e-6, rtol=0)

  def test_padding_never_touches_a_row(self):
    # Same shapes, same kernels: whatever ids fill row 1's masked positions,
    # its state is bit-identical (a masked step holds the state exactly).
    layers = STACKS["gru_x2"]
    model = kr.rnnstep_model(kr.build(layers), layers)
    network = model.network()
    ids = random_ids(2, 10, 65, seed=2)
    other_padding = ids.copy()
    other_padding[1, 4:] = random_ids(1, 6, 65, seed=3)
    lengths = np.array([10, 4])
    mask = tf.constant(np.arange(10)[None, :] < lengths[:, None])
    _, masked = network.unroll(tf.constant(ids), network.zero_state(2), mask)
    _, repadded = network.unroll(tf.constant(other_padding),
                                 network.zero_state(2), mask)
    _, alone = network.unroll(tf.constant(ids[1:, :4]), network.zero_state(1))
    for got, same_shapes, one_row in zip(tf.nest.flatten(masked),
                                         tf.nest.flatten(repadded),
                                         tf.nest.flatten(alone)):
      np.testing.assert_array_equal(got[1:].numpy(), same_shapes[1:].numpy())
      # Other shapes may meet another matmul kernel, which sums in another
      # order (1 float32 ulp, 3e-8, on an AMD Zen 3): equal to rounding only.
      self.assertAllClose(got[1:], one_row, atol=1e-6, rtol=0)

  def test_encode_decode(self):
    layers = STACKS["gru_reset_after"]
    model = kr.rnnstep_model(kr.build(layers), layers)
    self.assertEqual(model.decode(model.encode("HELLO, WORLD")), "HELLO, WORLD")
    with self.assertRaisesRegex(ValueError, r"'z' \(U\+007A\) at position 3"):
      model.encode("ABCz")

  def test_logits_argument_errors(self):
    layers = STACKS["gru_reset_after"]
    model = kr.rnnstep_model(kr.build(layers), layers)
    with self.assertRaisesRegex(ValueError, r"must lie in \[0, 65\)"):
      rnnstep.logits(model, [[1, 2, 65]])
    with self.assertRaisesRegex(ValueError, "integers"):
      rnnstep.logits(model, [[1.5]])
    with self.assertRaisesRegex(ValueError, "non-empty"):
      rnnstep.logits(model, np.zeros([1, 0], np.int32))

  def test_bfloat16_fidelity(self):
    layers = STACKS["gru_reset_after"]
    keras_model = kr.build(layers)
    ids = random_ids(2, 30, 65)
    full = rnnstep.logits(kr.rnnstep_model(keras_model, layers), ids)
    half = rnnstep.logits(kr.rnnstep_model(keras_model, layers, dtype="bfloat16"),
                          ids)
    self.assertLess(np.abs(full - half).max(), 0.1)


if __name__ == "__main__":
  tf.test.main()
