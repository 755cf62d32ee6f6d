"""The float64 numpy reference (tests/support/numpy_reference.py) agrees with real Keras.

It is the yardstick of the reduced-precision tests, so it is pinned here to
Keras' own float32 outputs on every stack kind, before anything trusts it.
"""

from absl.testing import parameterized
import numpy as np

from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support.reference_models import STACKS
from tests.support.reference_models import stack_models as models


class NumpyReferenceTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(n, n) for n in STACKS])
  def test_logits_and_greedy_match_keras(self, name):
    keras_model, model = models(name)
    reference = nr.Reference(kr.weights_of(keras_model, STACKS[name]),
                             STACKS[name])
    ids = np.random.default_rng(0).integers(0, 65, 60)
    want = keras_model(ids[None].astype(np.int32), training=False).numpy()[0]
    np.testing.assert_allclose(reference.logits(ids), want, atol=2e-5, rtol=0)
    batch = np.stack([ids, ids[::-1]])  # Rows of a batch are independent.
    np.testing.assert_allclose(reference.logits(batch),
                               [reference.logits(ids), reference.logits(ids[::-1])],
                               atol=1e-12, rtol=0)
    prompt = model.encode("ROMEO: ")
    self.assertEqual(reference.greedy(prompt, 60),
                     kr.greedy(keras_model, prompt, 60))

  def test_agreement_measure(self):
    keras_model, _ = models("gru_reset_after")
    reference = nr.Reference(kr.weights_of(keras_model, STACKS["gru_reset_after"]),
                             STACKS["gru_reset_after"])
    prompt = [1, 2, 3]
    greedy = reference.greedy(prompt, 30)
    self.assertEqual(reference.greedy_agreement(prompt, greedy), (1.0, 0.0, 30))
    flipped = list(greedy)
    flipped[7] = (flipped[7] + 1) % 65
    agreement, gap, first = reference.greedy_agreement(prompt, flipped)
    self.assertEqual(first, 7)
    self.assertGreater(gap, 0)
    self.assertLess(agreement, 1.0)
