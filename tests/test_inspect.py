"""rnnstep.inspect.analysis: the analysis numbers against a float64 numpy forward pass,
the text properties on hand-checked strings, and the ranking on states built
to have known answers."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr

import rnnstep
from rnnstep.inspect import analysis as inspect
from rnnstep.model import model_file
from rnnstep.model import functions as functions_lib

LAYERS = [kr.layer("lstm", 12), kr.layer("gru", 10)]
# 65 characters with a newline, so that texts have lines.
VOCAB = ["\n"] + [chr(32 + i) for i in range(64)]
TEXT = ('FIRST CITIZEN:\nBEFORE WE PROCEED, "HEAR" ME (SPEAK).\nALL:\n'
        'SPEAK, SPEAK.\n')


def small_model(unk=False):
  keras_model = kr.lively(kr.build(LAYERS, seed=4), recurrent_scale=1.5)
  vocab = (["[UNK]"] + VOCAB[1:]) if unk else VOCAB
  return keras_model, kr.rnnstep_model(keras_model, LAYERS, vocab)


def softmax(logits, banned=()):
  logits = np.array(logits, np.float64)
  logits[..., list(banned)] = -np.inf
  exp = np.exp(logits - logits.max(-1, keepdims=True))
  return exp / exp.sum(-1, keepdims=True)


class AnalyzeTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.keras_model, cls.model = small_model()
    cls.reference = nr.Reference(kr.weights_of(cls.keras_model, LAYERS), LAYERS)

  def reference_run(self, ids):
    """float64 (states per layer [h] or [h, c] at every position, logits)."""
    state, steps, logits = self.reference.zero_state(), [], []
    for token in ids:
      out, state = self.reference.step(int(token), state)
      steps.append(state)
      logits.append(out)
    states = [[np.stack([s[i][j] for s in steps])
               for j in range(len(steps[0][i]))] for i in range(len(LAYERS))]
    return states, np.stack(logits)

  def test_numbers_match_float64(self):
    analysis = inspect.analyze(self.model, TEXT)
    ids = self.model.encode(TEXT)
    states, logits = self.reference_run(ids)
    for layer, want in zip(analysis.states, states):
      for name, values in zip(("h", "c"), want):
        self.assertAllClose(layer[name], values, atol=1e-5, rtol=0)
    probs = softmax(logits)
    # The top 5 are the reference's 5 largest probabilities, in order.
    self.assertEqual(analysis.top_ids.shape, (len(TEXT), inspect.TOP_K))
    self.assertAllClose(analysis.top_probs,
                        -np.sort(-probs, -1)[:, :inspect.TOP_K], atol=1e-5)
    self.assertAllClose(np.take_along_axis(probs, analysis.top_ids, -1),
                        analysis.top_probs, atol=1e-5)
    self.assertAllClose(analysis.next_probs[:-1],
                        probs[np.arange(len(TEXT) - 1), ids[1:]], atol=1e-5)
    self.assertTrue(np.isnan(analysis.next_probs[-1]))
    self.assertEqual(analysis.top_chars(0),
                     [VOCAB[i] for i in analysis.top_ids[0]])
    # An LSTM cell is read as tanh(c); h as it is.
    self.assertAllClose(analysis.activation(inspect.Neuron(0, 3, "c")),
                        np.tanh(states[0][1][:, 3]), atol=1e-5)
    self.assertAllClose(analysis.activation(inspect.Neuron(1, 7)),
                        states[1][0][:, 7], atol=1e-5)

  def test_unk_is_never_guessed(self):
    keras_model, model = small_model(unk=True)
    analysis = inspect.analyze(model, "ABC DEF " * 3)
    logits = nr.Reference(kr.weights_of(keras_model, LAYERS), LAYERS).logits(
        model.encode("ABC DEF " * 3))
    probs = softmax(logits, banned=[0])
    self.assertNotIn(0, analysis.top_ids)
    self.assertAllClose(analysis.top_probs,
                        -np.sort(-probs, -1)[:, :inspect.TOP_K], atol=1e-5)

  def test_carries_on_from_an_initial_state(self):
    first, second = "ROMEO:\n", "BUT, SOFT!"
    after = [{k: v[:, -1] for k, v in layer.items()}
             for layer in rnnstep.hidden_states(self.model, first)]
    carried = inspect.analyze(self.model, second, initial_state=after)
    whole = inspect.analyze(self.model, first + second)
    neuron = inspect.Neuron(0, 5, "c")
    self.assertAllClose(carried.activation(neuron),
                        whole.activation(neuron)[len(first):], atol=1e-5)
    self.assertAllClose(carried.top_probs, whole.top_probs[len(first):],
                        atol=1e-5)

  def test_offers_chosen_neurons_first_then_ranked(self):
    analysis = inspect.analyze(self.model, TEXT,
                               ["1:4", inspect.Neuron(0, 2, "c")],
                               num_neurons=6)
    offered = analysis.offered
    self.assertLen(offered, 8)
    self.assertEqual([o.neuron for o in offered[:2]],
                     [inspect.Neuron(1, 4), inspect.Neuron(0, 2, "c")])
    self.assertEqual({o.reason for o in offered[:2]}, {"chosen"})
    self.assertLen({o.neuron for o in offered}, 8)  # Each neuron once.
    for o in offered:
      values = analysis.activation(o.neuron)
      self.assertAllClose(o.std, values.std(), atol=1e-6)
      if o.feature is not None:
        self.assertAllClose(
            o.correlation,
            np.corrcoef(values, analysis.features[o.feature])[0, 1], atol=1e-6)
      if o.reason == "selective":
        self.assertGreaterEqual(abs(o.correlation), inspect.MIN_CORRELATION)
    self.assertEqual(str(offered[1].neuron), "0:2:c")

  @parameterized.named_parameters(
      ("empty", dict(text=""), "text must be a non-empty str"),
      ("unknown", dict(text="A\u00e9"), r"character '\u00e9' \(U\+00E9\) at "
       "position 1"),
      ("bad_neuron", dict(neurons=["0:1", "3:1"]), r"neurons\[1\]='3:1': the "
       r"model has 2 recurrent layer\(s\)"),
      ("bad_unit", dict(neurons=[(1, 10)]), r"neurons\[0\]='1:10': layer 1 has "
       "10 units"),
      ("cell_of_gru", dict(neurons=["1:0:c"]), "only an LSTM layer has a cell "
       "state c; layer 1 is a GRU"),
      ("malformed", dict(neurons=["0-1"]), "expected LAYER:UNIT"),
      ("num_neurons", dict(num_neurons=-1),
       "num_neurons must be a non-negative"),
  )
  def test_bad_arguments(self, kwargs, pattern):
    kwargs = dict(dict(text="ABC"), **kwargs)
    with self.assertRaisesRegex(ValueError, pattern) as ctx:
      inspect.analyze(self.model, **kwargs)
    self.assertNotIn("\n", str(ctx.exception))

  def test_retraces_never(self):
    function = functions_lib.sequence_function(self.model)
    inspect.analyze(self.model, "AB")
    before = function.experimental_get_tracing_count()
    inspect.analyze(self.model, TEXT)
    self.assertEqual(function.experimental_get_tracing_count(), before)


class FeaturesTest(tf.test.TestCase):

  def test_hand_checked(self):
    text = 'AB "c" (d)\nx y'
    got = {name: feature(text).tolist()
           for name, feature in inspect.FEATURES.items()}
    self.assertEqual(got["newline"], [0] * 10 + [1] + [0] * 3)
    self.assertEqual(got["space"], [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0])
    self.assertEqual(got["position in line"],
                     [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3])
    self.assertEqual(got["position in word"],
                     [1, 2, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 1])
    self.assertEqual(got["inside quotes or brackets"],
                     [0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0])
    self.assertEqual(got["line in capitals"],
                     [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    self.assertEqual(got["capital letter"], [1, 1] + [0] * 12)
    self.assertEqual(sum(got["punctuation"]), 4)
    self.assertEqual(sum(got["vowel"]), 1)

  def test_rank_finds_planted_neurons(self):
    """States built so that each answer is known: unit 3 is the newline
    detector, unit 0 the loudest noise, unit 1 constant."""
    text = "AB\nCD EF\nG\n" * 4
    rng = np.random.default_rng(0)
    t = len(text)
    h = rng.normal(0, 0.05, (t, 5)).astype(np.float32)
    h[:, 0] = rng.uniform(-1, 1, t)          # Loud, but tracks nothing.
    h[:, 1] = 0.5                            # Constant: r is 0, not NaN.
    h[:, 3] = [0.9 if c == "\n" else -0.9 for c in text]
    states = [{"h": h}]
    features = {name: f(text) for name, f in inspect.FEATURES.items()}
    offered = inspect.rank(states, features, 3)
    self.assertEqual(offered[0].neuron, inspect.Neuron(0, 3))
    self.assertEqual((offered[0].reason, offered[0].feature), ("selective",
                                                                "newline"))
    self.assertAllClose(offered[0].correlation, 1.0)
    self.assertEqual(offered[-1].reason, "variable")
    self.assertIn(inspect.Neuron(0, 0), [o.neuron for o in offered])
    self.assertNotIn(inspect.Neuron(0, 1), [o.neuron for o in offered])
    self.assertNotIn(inspect.Neuron(0, 3), [
        o.neuron for o in inspect.rank(states, features, 5,
                                       exclude={inspect.Neuron(0, 3)})])

  def test_parse_neuron(self):
    layers = (model_file.LayerConfig("lstm", 8, True),)
    self.assertEqual(inspect.parse_neuron("0:7", layers), inspect.Neuron(0, 7))
    self.assertEqual(inspect.parse_neuron("0:7:c", layers),
                     inspect.Neuron(0, 7, "c"))
    for bad in ("0", "0:8", "1:0", "0:1:x", "-1:2", "a:b", "0:1:c:d"):
      with self.assertRaises(ValueError):
        inspect.parse_neuron(bad, layers)


if __name__ == "__main__":
  tf.test.main()
