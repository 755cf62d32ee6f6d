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


class DefaultPathTest(tf.test.TestCase):

  def test_paths_by_dtype_and_batch(self):
    if api._gpu_visible():  # pylint: disable=protected-access
      self.skipTest("with a GPU the default is XLA at every batch")
    config = model_file.ModelConfig(16, tuple(LAYERS))
    tensors = kr.weights_of(kr.build(LAYERS, seed=2), LAYERS)
    vocab = kr.default_vocab(65)
    full = rnnstep.Model(config, vocab, tensors)
    half = rnnstep.Model(config, vocab, tensors, dtype="bfloat16")
    for batch in (1, 16, 64, 256, 10**6):
      self.assertEqual(api.default_path(full, batch), "xla")
    self.assertEqual(api.default_path(full, 32), "elementwise")
    self.assertEqual(api.default_path(half, 1), "xla")
    self.assertEqual(api.default_path(half, 256), "elementwise")
    self.assertEqual(api.default_jit_compile(half, 256), "elementwise")
    # The bands have no gaps: every batch size maps to a path.
    for batch in range(1, 600):
      self.assertIn(api.default_path(half, batch),
                    ("xla", "graph", "elementwise"))
    # The default path runs (its text is the explicit path's text).
    self.assertEqual(
        rnnstep.generate(half, ["AB"] * 256, 5, seed=1)[-1],
        rnnstep.generate(half, ["AB"] * 256, 5, seed=1,
                         jit_compile="elementwise")[-1])


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


# Property-based: any argument values either raise ValueError up front or give
# exactly num_steps characters per prompt.
from hypothesis import given, settings, strategies as st  # pylint: disable=g-import-not-at-top,g-bad-import-order

_MODEL = None


def _model():
  global _MODEL
  if _MODEL is None:
    _MODEL = small_model()
  return _MODEL


_NUMBER = (st.integers(-5, 100) | st.floats(allow_nan=True, allow_infinity=True)
           | st.none() | st.booleans() | st.text(max_size=2))


@settings(max_examples=60, deadline=None)
@given(num_steps=st.integers(-3, 12) | _NUMBER, temperature=_NUMBER,
       top_k=_NUMBER, top_p=_NUMBER,
       seed=st.none() | st.integers(-2**64, 2**64) | st.lists(st.integers(), max_size=3),
       prompts=st.text(alphabet="ABC z", max_size=4)
       | st.lists(st.text(alphabet="ABC", max_size=3), max_size=3))
def test_arguments_validated_or_honoured(num_steps, temperature, top_k, top_p,
                                         seed, prompts):
  try:
    out = rnnstep.generate(_model(), prompts, num_steps, temperature=temperature,
                           top_k=top_k, top_p=top_p, seed=seed,
                           jit_compile=False)
  except ValueError as e:
    assert "\n" not in str(e)
    return
  texts = [out] if isinstance(prompts, str) else out
  assert all(len(t) == num_steps for t in texts)
