"""The library API: argument checking with the caller's words, return types, load."""

import os
import pathlib
import tempfile
from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support import reference_models
from tests.support import tiers

import rnnstep
from rnnstep import api
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.model import model_file
from rnnstep.model import functions as functions_lib

LAYERS = reference_models.TINY_LAYERS


def small_model():
  return kr.rnnstep_model(kr.build(LAYERS, seed=2), LAYERS)


class GenerateArgumentsTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = small_model()

  @parameterized.named_parameters(
      ("negative_steps", dict(num_steps=-1), "num_steps must be a non-negative"),
      ("float_steps", dict(num_steps=2.5), "num_steps must be a non-negative"),
      ("bool_steps", dict(num_steps=True), "num_steps must be a non-negative"),
      ("negative_temperature", dict(temperature=-0.1), "temperature must be"),
      ("nan_temperature", dict(temperature=float("nan")), "temperature must be"),
      ("inf_temperature", dict(temperature=float("inf")), "temperature must be"),
      ("negative_top_k", dict(top_k=-1), "top_k must be"),
      ("float_top_k", dict(top_k=1.5), "top_k must be"),
      ("zero_top_p", dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
      ("big_top_p", dict(top_p=1.01), r"top_p must be in \(0, 1\]"),
      ("seed_text", dict(seed="abc"), "seed must be"),
      ("seed_too_big", dict(seed=2**64), "seed must be"),
      ("seed_list_length", dict(seed=[1, 2, 3]), "3 seeds for 1 prompts"),
      ("unknown_char", dict(prompts="HEllo"), r"prompt 0: character 'l'"),
      ("empty_prompt", dict(prompts=["A", ""]), "prompt 1 is empty"),
      ("empty_list", dict(prompts=[]), "empty list"),
      ("not_text", dict(prompts=5), "must be a str or a list"),
      # Token ids (#61): a list of ints is one prompt; ids are checked.
      ("list_of_floats", dict(prompts=[1.5, 2]),
       r"^prompts\[0\] must be a str or a list of token ids, got float"),
      ("id_outside_vocabulary", dict(prompts=[[1, 2], [3, 4, 65]]),
       r"^prompts\[1\]\[2\] = 65 is outside the vocabulary of 65 ids "
       r"\(0 to 64\)$"),
      ("negative_id", dict(prompts=[3, -1]),
       r"^prompts\[0\]\[1\] = -1 is not a token id"),
      ("empty_ids", dict(prompts=["A", []]),
       r"^prompts\[1\] is an empty list of token ids"),
      ("bad_stop", dict(stop=5), "stop must be"),
      ("empty_stop", dict(stop=""), "stop string is empty"),
      ("impossible_stop", dict(stop="zz"), "stop string 'zz' can never be"),
      ("jit_compile_text", dict(jit_compile="xla"), "jit_compile must be True"),
      ("jit_compile_int", dict(jit_compile=1), "jit_compile must be True"),
  )
  def test_bad_argument(self, overrides, pattern):
    kwargs = dict(prompts="HELLO", num_steps=5)
    kwargs.update(overrides)
    prompts, num_steps = kwargs.pop("prompts"), kwargs.pop("num_steps")
    with self.assertRaisesRegex(ValueError, pattern) as ctx:
      rnnstep.generate(self.model, prompts, num_steps, **kwargs)
    self.assertNotIn("\n", str(ctx.exception))

  def test_token_ids_give_the_text_of_the_same_prompt_as_a_string(self):
    """#61: ids where text goes: a list of ints is one prompt (its text
    returned alone), a list of id lists (or a 1-D/2-D array) a batch, mixed
    with str; greedy and seeded, generate and stream alike."""
    model = self.model
    texts = ["HELLO", "THE KING"]
    ids = [model.encode(t).tolist() for t in texts]
    for kwargs in (dict(temperature=0.0), dict(temperature=0.9, seed=5)):
      want = rnnstep.generate(model, texts, 12, **kwargs)
      self.assertEqual(rnnstep.generate(model, ids, 12, **kwargs), want)
      self.assertEqual(rnnstep.generate(model, [ids[0], texts[1]], 12,
                                        **kwargs), want)
      self.assertEqual(rnnstep.generate(model, np.array(ids[0]), 12,
                                        **kwargs), want[0])
      self.assertEqual(rnnstep.generate(model, ids[1], 12, **kwargs),
                       rnnstep.generate(model, texts[1], 12, **kwargs))
      self.assertEqual("".join(rnnstep.stream(model, ids[0], 12, chunk_size=5,
                                              **kwargs)), want[0])
    self.assertEqual(
        rnnstep.loglikelihood(model, [(ids[0], model.encode(" IS").tolist()),
                                      (ids[1], [])]),
        rnnstep.loglikelihood(model, [(texts[0], " IS"), (texts[1], "")]))
    self.assertEqual(rnnstep.loglikelihood_rolling(model, ids),
                     rnnstep.loglikelihood_rolling(model, texts))
    with self.assertRaisesRegex(ValueError, r"^pairs\[0\]\[1\]\[0\] = 99 is "
                                r"outside the vocabulary of 65 ids"):
      rnnstep.loglikelihood(model, [(ids[0], [99])])
    with self.assertRaisesRegex(ValueError, r"^texts\[1\]\[1\] = -2 is "
                                r"outside the vocabulary"):
      rnnstep.loglikelihood_rolling(model, [ids[0], [1, -2]])

  def test_output_too_large_is_refused_before_allocating(self):
    with self.assertRaisesRegex(ValueError, r"GiB for the output but only"):
      rnnstep.generate(self.model, ["A"] * 100000, 2**30)

  def test_chunk_size(self):
    for bad in (0, 2**31, 2**70, 1.5):
      with self.assertRaisesRegex(ValueError, "^chunk_size must be a positive "
                                  r"integer below 2\*\*31, got "):
        next(rnnstep.stream(self.model, "A", 5, chunk_size=bad))

  def test_what_is_not_a_path_is_refused_naming_the_argument(self):
    # An int would be taken for a file descriptor (open(0) reads stdin).
    root = self.create_tempdir().full_path
    state = os.path.join(root, "state.safetensors")
    rnnstep.save_state(state, self.model, rnnstep.prompt_state(self.model,
                                                               "AB"))
    weights = os.path.join(root, "m.weights.h5")
    kr.build(LAYERS, seed=2).save_weights(weights)
    callers = {
        "path": (rnnstep.load, "model or weights file"),
        "corpus": (lambda v: rnnstep.load(weights, corpus=v),
                   "training text file or folder"),
        "vocab": (lambda v: rnnstep.load(weights, vocab=v),
                  "vocabulary file's path or a list"),
        "load_state": (lambda v: rnnstep.load_state(v, self.model),
                       "state file"),
        "save_state": (lambda v: rnnstep.save_state(v, self.model, None),
                       "state file"),
        "export": (lambda v: rnnstep.export(self.model, v), "directory"),
        "export_web": (lambda v: rnnstep.export(self.model, v, format="web"),
                       "directory"),
        "export_litert": (lambda v: rnnstep.export_litert(self.model, v),
                          "directory"),
    }
    names = {"corpus": "corpus", "vocab": "vocab", "path": "path",
             "load_state": "path", "save_state": "path"}
    for caller, (call, what) in callers.items():
      argument = names.get(caller, "export_dir")
      for bad in (0, 3.5, b"model", "", ["x"] if caller != "vocab" else 7):
        with self.subTest(caller=caller, given=bad):
          pattern = (f"^vocab must be a {what} of the characters" if
                     caller == "vocab" else f"^{argument} must be a {what}'s "
                     r"path \(a non-empty str or os.PathLike\), got ")
          with self.assertRaisesRegex(ValueError, pattern) as e:
            call(bad)
          self.assertEqual(e.exception.argument, argument)
    self.assertEqual(sorted(os.listdir(root)), ["m.weights.h5",
                                                "state.safetensors"])
    with self.assertRaisesRegex(ValueError, r"^batch_size: \d+ rows of this "
                                "state need about .* GiB but only") as e:
      rnnstep.load_state(state, self.model, batch_size=2**70)
    self.assertEqual(e.exception.argument, "batch_size")
    for bad in (5, "16", None):
      with self.assertRaisesRegex(ValueError, "^batch_sizes must be a list of "
                                  "positive integers, got ") as e:
        rnnstep.tune(self.model, batch_sizes=bad)
      self.assertEqual(e.exception.argument, "batch_sizes")

  def test_a_strategy_that_is_not_one_is_refused_naming_it(self):
    for bad in ("mirrored", 2, True, [tf.distribute.get_strategy()]):
      with self.assertRaisesRegex(
          ValueError, "^strategy must be a tf.distribute.Strategy") as e:
        rnnstep.generate(self.model, "A", 5, strategy=bad)
      self.assertEqual(e.exception.argument, "strategy")

  def test_return_types(self):
    self.assertIsInstance(rnnstep.generate(self.model, "AB", 3), str)
    out = rnnstep.generate(self.model, ("AB", "C"), 3)
    self.assertIsInstance(out, list)
    self.assertEqual([len(t) for t in out], [3, 3])
    self.assertLen(rnnstep.generate(self.model, "AB", 3, seed=np.int64(4)), 3)

  def test_what_is_not_a_model_is_refused_saying_how_to_make_one(self):
    # Every public function taking a model, before it touches anything:
    # one line naming `model` (no AttributeError from deep inside).
    root = self.create_tempdir().full_path
    callers = {
        "generate": lambda m: rnnstep.generate(m, "A", 5),
        "stream": lambda m: next(rnnstep.stream(m, "A", 5)),
        "check_request": lambda m: api.check_request(m, "A", 5),
        "logits": lambda m: rnnstep.logits(m, [[1, 2]]),
        "loglikelihood": lambda m: rnnstep.loglikelihood(m, [("A", "B")]),
        "loglikelihood_rolling": lambda m: rnnstep.loglikelihood_rolling(
            m, ["AB"]),
        "hidden_states": lambda m: rnnstep.hidden_states(m, "AB"),
        "prompt_state": lambda m: rnnstep.prompt_state(m, "AB"),
        "save_state": lambda m: rnnstep.save_state(
            os.path.join(root, "s.safetensors"), m, None),
        "load_state": lambda m: rnnstep.load_state(
            os.path.join(root, "s.safetensors"), m),
        "export": lambda m: rnnstep.export(m, os.path.join(root, "saved")),
        "export_web": lambda m: rnnstep.export(m, os.path.join(root, "web"),
                                               format="web"),
        "export_litert": lambda m: rnnstep.export_litert(
            m, os.path.join(root, "litert")),
        "tune": lambda m: rnnstep.tune(m),
        "Generator": lambda m: rnnstep.Generator(m, "graph"),
    }
    keras_model = kr.build(LAYERS, seed=2)
    weights = os.path.join(root, "model.weights.h5")
    not_models = {
        "none": (None, r"got None: rnnstep\.load\(path\) makes one"),
        "path": (weights, r"got str: load the file first: rnnstep\.load\("),
        "keras": (keras_model,
                  r"got keras\.[\w.]*\.Functional: save its weights"),
    }
    for caller, call in callers.items():
      for kind, (value, pattern) in not_models.items():
        with self.subTest(caller=caller, given=kind):
          with self.assertRaisesRegex(
              ValueError, "^model must be an rnnstep.Model, " + pattern) as e:
            call(value)
          self.assertEqual(e.exception.argument, "model")
          self.assertNotIn("\n", str(e.exception))
    self.assertEqual(os.listdir(root), [])  # Nothing was written.
    # The Keras hint's recipe loads that model.
    keras_model.save_weights(weights)
    corpus = os.path.join(root, "train.txt")
    with open(corpus, "w", encoding="utf-8") as f:
      f.write("".join(kr.default_vocab(65)))
    self.assertIsInstance(rnnstep.load(weights, corpus=corpus), rnnstep.Model)


@pytest.mark.slow  # a SavedModel export
class LoadTest(tf.test.TestCase):

  def test_load_file_and_dtype(self):
    path = os.path.join(self.create_tempdir().full_path, "m.npz")
    config = model_file.ModelConfig(16, tuple(LAYERS))
    keras_model = kr.build(LAYERS, seed=2)
    model_file.write(path, config, kr.default_vocab(65),
                     kr.weights_of(keras_model, LAYERS))
    model = rnnstep.load(path)
    self.assertEqual(model.vocab, tuple(kr.default_vocab(65)))
    self.assertEqual(model.source, path)
    self.assertEqual(rnnstep.load(path, dtype="bfloat16").compute_dtype,
                     tf.bfloat16)
    with self.assertRaisesRegex(ValueError, "dtype must be one of"):
      rnnstep.load(path, dtype="int8")

  def test_missing_file(self):
    with self.assertRaisesRegex(FileNotFoundError, "no such model file"):
      rnnstep.load("/nonexistent/model.npz")

  def test_bundled_model(self):
    self.assertEqual(rnnstep.load().source, api.bundled_model_path())

  def test_memory_estimate(self):
    have = host.available_memory_bytes()
    self.assertGreater(have, 0)


STACK = [kr.layer("lstm", 12), kr.layer("gru", 10, reset_after=False),
         kr.layer("simple_rnn", 8)]


class HiddenStatesTest(tf.test.TestCase, parameterized.TestCase):
  """hidden_states and initial_state, against real Keras and float64 numpy."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # A real Keras file (LSTM -> GRU reset_after=False -> SimpleRNN), read by
    # rnnstep.load as a user would; Keras' every return_sequences output.
    cls.keras_model = kr.lively(kr.build(STACK, seed=5), recurrent_scale=1.5)
    path = os.path.join(tempfile.mkdtemp(prefix="hidden_states_"),
                        "stack.keras")
    cls.keras_model.save(path)
    cls.model = rnnstep.load(path, vocab=kr.default_vocab(65))
    recurrent = [l for l in cls.keras_model.layers
                 if isinstance(l, kr.keras.layers.RNN)]
    cls.keras_sequences = kr.keras.Model(cls.keras_model.inputs,
                                         [l.output for l in recurrent])
    cls.reference = nr.Reference(kr.weights_of(cls.keras_model, STACK), STACK)
    cls.ids = np.random.default_rng(3).integers(0, 65, (3, 25)).astype(np.int32)

  def reference_states(self, ids):
    """The float64 states after every position, per layer [h] or [h, c]."""
    state = self.reference.zero_state()
    per_step = []
    for t in range(ids.shape[1]):
      _, state = self.reference.step(ids[:, t], state)
      per_step.append(state)
    return [[np.stack([step[i][j] for step in per_step], 1)
             for j in range(len(per_step[0][i]))] for i in range(len(STACK))]

  def test_every_layer_matches_keras_and_float64(self):
    states = rnnstep.hidden_states(self.model, self.ids)
    self.assertEqual([sorted(layer) for layer in states],
                     [["c", "h"], ["h"], ["h"]])
    keras_outputs = self.keras_sequences(self.ids)
    for layer, want, spec in zip(states, keras_outputs, STACK):
      self.assertEqual(layer["h"].dtype, np.float32)
      self.assertEqual(layer["h"].shape, (3, 25, spec.units))
      self.assertAllClose(layer["h"], want, atol=1e-5, rtol=0)
    for layer, want in zip(states, self.reference_states(self.ids)):
      for name, values in zip(("h", "c"), want):  # The LSTM's c as well.
        self.assertAllClose(layer[name], values, atol=1e-5, rtol=0)
    # The state's pieces are lively enough to mean something.
    self.assertGreater(np.abs(states[0]["c"]).max(), 1.0)

  def test_padded_rows_equal_each_row_alone(self):
    texts = ["ABCDEFGHIJ", "XY", "HELLO THERE WORLD"]
    batch = rnnstep.hidden_states(self.model, texts)
    for row, text in enumerate(texts):
      alone = rnnstep.hidden_states(self.model, text)
      for got, want in zip(batch, alone):
        for name in want:
          n = len(text)
          # To float32 rounding: a matmul's rounding may depend on the batch.
          self.assertAllClose(got[name][row, :n], want[name][0], atol=1e-5,
                              rtol=0)
          # Padding holds the last real position's state, bit for bit.
          self.assertAllEqual(got[name][row, n:], np.broadcast_to(
              got[name][row, n - 1], got[name][row, n:].shape))

  def test_ids_forms_agree(self):
    rows = [self.ids[0, :7], self.ids[1, :3]]
    ragged = rnnstep.hidden_states(self.model, [list(r) for r in rows])
    for i, row in enumerate(rows):
      alone = rnnstep.hidden_states(self.model, row)  # 1-D: one row.
      self.assertAllClose(ragged[1]["h"][i, :len(row)], alone[1]["h"][0],
                          atol=1e-5, rtol=0)
    text = self.model.decode(self.ids[0])
    self.assertAllEqual(rnnstep.hidden_states(self.model, text)[2]["h"],
                        rnnstep.hidden_states(self.model, self.ids[:1])[2]["h"])

  def test_state_after_p1_carries_into_p2(self):
    p1s, p2 = ["ROMEO", "A", "THE KING"], " SPEAKS"
    after = [{k: v[:, -1] for k, v in layer.items()}
             for layer in rnnstep.hidden_states(self.model, p1s)]
    p2_ids = np.stack([self.model.encode(p2)] * len(p1s))
    carried = rnnstep.logits(self.model, p2_ids, initial_state=after)
    carried_states = rnnstep.hidden_states(self.model, [p2] * len(p1s),
                                           initial_state=after)
    for row, p1 in enumerate(p1s):
      whole_ids = self.model.encode(p1 + p2)
      whole = rnnstep.logits(self.model, whole_ids)[0, len(p1):]
      self.assertAllClose(carried[row], whole, atol=1e-5, rtol=0)
      # And against Keras' own logits of the whole text.
      self.assertAllClose(carried[row],
                          self.keras_model(whole_ids[None])[0, len(p1):],
                          atol=1e-5, rtol=0)
      whole_states = rnnstep.hidden_states(self.model, p1 + p2)
      for got, want in zip(carried_states, whole_states):
        for name in want:
          self.assertAllClose(got[name][row], want[name][0, len(p1):],
                              atol=1e-5, rtol=0)

  def test_zero_initial_state_is_the_default(self):
    zero = [{k: np.zeros_like(v[:, -1]) for k, v in layer.items()}
            for layer in rnnstep.hidden_states(self.model, self.ids)]
    self.assertAllClose(
        rnnstep.logits(self.model, self.ids, initial_state=zero),
        rnnstep.logits(self.model, self.ids), atol=1e-6, rtol=0)

  def test_states_too_large_are_refused_before_allocating(self):
    with mock.patch.object(host, "available_memory_bytes",
                           return_value=2**20):
      with self.assertRaisesRegex(ValueError, r"^texts_or_ids: 2 rows x 2000 "
                                  r"positions need about 0\.0 GiB .* but only "
                                  r"0\.0 GiB is available; pass fewer"):
        rnnstep.hidden_states(self.model, ["A" * 2000, "B"])
      rnnstep.hidden_states(self.model, "AB")  # Small enough.

  def test_compiled_equals_eager_and_never_retraces(self):
    network = self.model.network()
    ids = tf.constant(self.ids)
    mask = tf.sequence_mask([25, 4, 11], 25)
    eager, _ = network.unroll_states(ids, network.zero_state(3), mask)
    function = functions_lib.sequence_function(self.model)
    compiled, _ = function(ids, mask, network.zero_state(3))
    tf.nest.map_structure(
        lambda a, b: self.assertAllClose(a, b, atol=1e-6, rtol=0),
        eager, compiled)
    before = function.experimental_get_tracing_count()
    rnnstep.hidden_states(self.model, ["AB", "CDEFG"])
    rnnstep.hidden_states(self.model, "A")
    rnnstep.logits(self.model, self.ids[:, :5], initial_state=[
        {k: v[:, -1] for k, v in layer.items()}
        for layer in rnnstep.hidden_states(self.model, self.ids)])
    self.assertEqual(function.experimental_get_tracing_count(), before)

  @parameterized.named_parameters(
      ("not_a_list", 5, r"^initial_state is of type int; initial_state must "
       r"be \[\{'h': \[2, 12\], 'c': \[2, 12\]\}, \{'h': \[2, 10\]\}, "
       r"\{'h': \[2, 8\]\}\] of float32"),
      ("too_few_layers", "drop_last", r"^initial_state has 2 entries for 3"),
      ("not_a_dict", "list_first", r"^initial_state\[0\] is of type list"),
      ("missing_c", "drop_c", r"^initial_state\[0\] has keys \['h'\]"),
      ("float64", "float64",
       r"^initial_state\[1\]\['h'\] is float64 \[2, 10\]"),
      ("wrong_batch", "one_row",
       r"^initial_state\[2\]\['h'\] is float32 \[1, 8\]"),
      ("wrong_units", "transpose",
       r"^initial_state\[2\]\['h'\] is float32 \[8, 2\]"),
      ("ragged", "ragged", r"^initial_state\[2\]\['h'\] is a ragged"),
      ("nan", "nan", r"^initial_state\[0\]\['c'\] holds values that are not"),
  )
  def test_bad_initial_state(self, change, pattern):
    state = [{k: v[:, -1] for k, v in layer.items()}
             for layer in rnnstep.hidden_states(self.model, self.ids[:2])]
    edits = {
        "drop_last": lambda: state[:2],
        "list_first": lambda: [list(state[0].values())] + state[1:],
        "drop_c": lambda: [{"h": state[0]["h"]}] + state[1:],
        "float64": lambda: state[:1] + [{"h": state[1]["h"].astype(np.float64)}]
                           + state[2:],
        "one_row": lambda: state[:2] + [{"h": state[2]["h"][:1]}],
        "transpose": lambda: state[:2] + [{"h": state[2]["h"].T.copy()}],
        "ragged": lambda: state[:2] + [{"h": [[0.0] * 8, [0.0]]}],
        "nan": lambda: [{"h": state[0]["h"],
                         "c": np.full_like(state[0]["c"], np.nan)}] + state[1:],
    }
    bad = edits[change]() if isinstance(change, str) else change
    for call in (lambda: rnnstep.logits(self.model, self.ids[:2],
                                        initial_state=bad),
                 lambda: rnnstep.hidden_states(self.model, self.ids[:2],
                                               initial_state=bad)):
      with self.assertRaisesRegex(ValueError, pattern) as ctx:
        call()
      self.assertNotIn("\n", str(ctx.exception))

  @parameterized.named_parameters(
      ("empty_list", [], r"^texts_or_ids must be a non-empty \[batch, time\]"),
      ("empty_text", ["AB", ""], r"^texts_or_ids\[1\] is empty"),
      ("unknown_char", ["AB", "A\u00e9"], r"^texts_or_ids\[1\]: character "
       r"'\u00e9' \(U\+00E9\) at position 1 is not in the model's vocabulary"),
      ("mixed", ["AB", [1, 2]],
       r"^texts_or_ids\[1\] is a list; give a list of"),
      ("floats", np.zeros((2, 3)), r"^texts_or_ids must be integers"),
      ("out_of_range", [[1, 2], [3, 65]], r"^texts_or_ids\[1\] must lie in "
       r"\[0, 65\)"),
      ("scalar", 7, r"^texts_or_ids must be a non-empty \[batch, time\]"),
  )
  def test_bad_texts_or_ids(self, texts_or_ids, pattern):
    with self.assertRaisesRegex(ValueError, pattern) as ctx:
      rnnstep.hidden_states(self.model, texts_or_ids)
    self.assertNotIn("\n", str(ctx.exception))


if __name__ == "__main__":
  tf.test.main()


# Property-based: any argument values either raise the same ValueError on
# every path, or give num_steps characters per prompt whose content is checked:
# greedy rows equal a Keras greedy loop; seeded rows equal across paths (at
# temperatures where float32 rounding cannot plausibly flip a draw) and
# reproduce alone under their own seed.
import functools  # pylint: disable=g-import-not-at-top,g-bad-import-order
from hypothesis import given, settings, strategies as st  # pylint: disable=g-import-not-at-top,g-bad-import-order

PATHS = (False, True, "elementwise", None)
KERAS_STEPS = 100  # The most num_steps the strategy below draws.


@functools.lru_cache(maxsize=None)
def _models():
  keras_model = kr.lively(kr.build(LAYERS, seed=2))
  return keras_model, kr.rnnstep_model(keras_model, LAYERS)


def _model():
  return _models()[1]


@functools.lru_cache(maxsize=None)
def _keras_greedy(prompt):
  keras_model, model = _models()
  return model.decode(kr.greedy(keras_model, model.encode(prompt), KERAS_STEPS))


_NUMBER = (st.integers(-5, KERAS_STEPS) | st.floats(allow_nan=True, allow_infinity=True)
           | st.none() | st.booleans() | st.text(max_size=2))


@settings(max_examples=60, deadline=None)
@given(num_steps=st.integers(-3, 12) | _NUMBER, temperature=_NUMBER,
       top_k=_NUMBER, top_p=_NUMBER,
       seed=st.none() | st.integers(-2**64, 2**64) | st.lists(st.integers(), max_size=3),
       prompts=st.text(alphabet="ABC z", max_size=4)
       | st.lists(st.text(alphabet="ABC", max_size=3), max_size=3))
def test_arguments_validated_or_honoured(num_steps, temperature, top_k, top_p,
                                         seed, prompts):
  """Any values: the same one-line ValueError on every path, or honoured."""
  kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
  outcomes = {}
  for jit in PATHS:
    try:
      outcomes[jit] = rnnstep.generate(_model(), prompts, num_steps,
                                       jit_compile=jit, **kwargs)
    except ValueError as e:
      assert "\n" not in str(e)
      outcomes[jit] = e
  errors = {str(o) for o in outcomes.values() if isinstance(o, ValueError)}
  if errors:  # Validation does not depend on the path.
    assert len(errors) == 1 and all(isinstance(o, ValueError)
                                    for o in outcomes.values()), outcomes
    return
  _check_content(prompts, num_steps, kwargs, outcomes)


@st.composite
def _valid_calls(draw):
  prompt = st.text(alphabet="ABC ", min_size=1, max_size=4)
  prompts = draw(prompt | st.lists(prompt, min_size=1, max_size=3))
  rows = 1 if isinstance(prompts, str) else len(prompts)
  seed64 = st.integers(-2**63, 2**63 - 1)
  kwargs = dict(
      temperature=draw(st.just(0) | st.floats(0.05, 3.0)),
      top_k=draw(st.just(0) | st.integers(1, 70)),
      top_p=draw(st.just(1.0) | st.floats(0.05, 1.0)),
      seed=draw(st.none() | seed64 | st.lists(seed64, min_size=rows,
                                              max_size=rows)))
  return prompts, draw(st.integers(0, KERAS_STEPS)), kwargs


# Each drawn call runs every path (under XLA a new batch or width bucket
# compiles a program): the default run draws 2 calls, the exhaustive tier 20.
@pytest.mark.slow
@pytest.mark.parametrize("examples", tiers.quick_params([2, 20], 2))
def test_valid_arguments_give_checked_content_on_every_path(examples):

  @settings(max_examples=examples, deadline=None)
  @given(call=_valid_calls())
  def check(call):
    prompts, num_steps, kwargs = call
    outcomes = {jit: rnnstep.generate(_model(), prompts, num_steps,
                                      jit_compile=jit, **kwargs)
                for jit in PATHS}
    _check_content(prompts, num_steps, kwargs, outcomes)

  check()


def _check_content(prompts, num_steps, kwargs, outcomes):
  """Checks each path's output {jit_compile: generate's result}."""
  temperature, seed = kwargs["temperature"], kwargs["seed"]
  single = isinstance(prompts, str)
  prompt_list = [prompts] if single else prompts
  texts = {}
  for jit, out in outcomes.items():
    assert isinstance(out, str) == single, jit
    texts[jit] = [out] if single else out
    assert [len(t) for t in texts[jit]] == [num_steps] * len(prompt_list), jit
  if np.float32(temperature) == 0:  # Greedy: the Keras loop's text.
    want = [_keras_greedy(p)[:num_steps] for p in prompt_list]
    for jit, rows in texts.items():
      assert rows == want, jit
    return
  if seed is None:
    return  # Fresh randomness: nothing to compare with.
  # Float32 paths differ only in rounding (~1e-6 in the logits): a draw flips
  # with odds ~1e-6/temperature, so away from tiny temperatures they agree.
  if 0.5 <= temperature <= 3:
    assert all(rows == texts[False] for rows in texts.values()), texts
  # Row alone: with a seed list row i uses (seed[i], 0); with an int, row 0
  # uses (seed, 0) whatever the batch.
  rest = {k: v for k, v in kwargs.items() if k != "seed"}
  if isinstance(seed, list):
    alone = [rnnstep.generate(_model(), [p], num_steps, jit_compile=False,
                              seed=[s], **rest)[0]
             for p, s in zip(prompt_list, seed)]
    assert alone == texts[False]
  else:
    first = rnnstep.generate(_model(), prompt_list[:1], num_steps,
                             jit_compile=False, seed=seed, **rest)
    assert first[0] == texts[False][0]
