"""The library API: argument checking with the caller's words, return types, load."""

import os

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from tests import keras_reference as kr

import rnnstep
from rnnstep import api
from rnnstep import generator as generator_lib
from rnnstep import model_file

LAYERS = [kr.layer("gru", 16)]


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
      ("list_of_ints", dict(prompts=[1, 2]), "prompt 0 is a int"),
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

  def test_output_too_large_is_refused_before_allocating(self):
    with self.assertRaisesRegex(ValueError, r"GiB for the output but only"):
      rnnstep.generate(self.model, ["A"] * 100000, 2**30)

  def test_chunk_size(self):
    with self.assertRaisesRegex(ValueError, "chunk_size must be a positive"):
      next(rnnstep.stream(self.model, "A", 5, chunk_size=0))

  def test_return_types(self):
    self.assertIsInstance(rnnstep.generate(self.model, "AB", 3), str)
    out = rnnstep.generate(self.model, ("AB", "C"), 3)
    self.assertIsInstance(out, list)
    self.assertEqual([len(t) for t in out], [3, 3])
    self.assertLen(rnnstep.generate(self.model, "AB", 3, seed=np.int64(4)), 3)


class ExportDefaultPathTest(tf.test.TestCase):

  # None exports the library's portable default, the plain graph.
  def test_export_with_jit_compile_none_serves_the_graph_text(self):
    model = small_model()
    export_dir = os.path.join(self.create_tempdir().full_path, "served")
    rnnstep.export(model, export_dir, jit_compile=None)
    served = tf.saved_model.load(export_dir).signatures["serving_default"]
    prompts = ["HELLO", "A", "THE KING"]
    text = served(prompts=tf.constant(prompts), num_steps=tf.constant(40),
                  temperature=tf.constant(0.8),
                  seed=tf.constant(5, tf.int64))["text"]
    self.assertEqual([t.decode() for t in text.numpy()],
                     rnnstep.generate(model, prompts, 40, temperature=0.8,
                                      seed=5, jit_compile=False))


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
    have = generator_lib.available_memory_bytes()
    self.assertGreater(have, 0)


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


@settings(max_examples=20, deadline=None)
@given(call=_valid_calls())
def test_valid_arguments_give_checked_content_on_every_path(call):
  prompts, num_steps, kwargs = call
  outcomes = {jit: rnnstep.generate(_model(), prompts, num_steps,
                                    jit_compile=jit, **kwargs)
              for jit in PATHS}
  _check_content(prompts, num_steps, kwargs, outcomes)


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
