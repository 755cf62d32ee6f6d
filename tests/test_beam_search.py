"""Beam search against a brute-force numpy beam search over a float64 forward.

The models are the bundled Shakespeare model (trained) and a small random one;
the reference (`decoding_reference.beam_search`) expands and sorts every
candidate in Python. Beams, their order and their scores must agree.
"""

import functools

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from tests.support import decoding_reference as dr
from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support.tiers import quick_cases

import rnnstep
from rnnstep.model import model_file

PATHS = (False, True, "elementwise")


@functools.lru_cache(maxsize=None)
def bundled():
  data = model_file.read(rnnstep.bundled_model_path())
  tensors, layers = nr.tensors_of_file(data)
  return rnnstep.load(), nr.Reference(tensors, layers)


@functools.lru_cache(maxsize=None)
def small():
  layers = [kr.layer("lstm", 24), kr.layer("gru", 16, False)]
  keras_model = kr.build(layers, vocab_size=66, embedding_dim=8, seed=11,
                         bias_scale=1.0)
  vocab = ["[UNK]"] + kr.default_vocab(65)
  model = rnnstep.Model(model_file.ModelConfig(8, tuple(layers)), vocab,
                        kr.weights_of(keras_model, layers))
  return model, nr.Reference(kr.weights_of(keras_model, layers), layers,
                             banned=[0])


class BeamSearchTest(tf.test.TestCase, parameterized.TestCase):

  def check(self, model, reference, prompts, num_steps, num_beams, jit,
            banned=(), **kwargs):
    stops = kwargs.get("stop", ())
    stops = [stops] if isinstance(stops, str) else list(stops)
    texts, scores = rnnstep.generate(
        model, prompts, num_steps, num_beams=num_beams,
        num_return_sequences=num_beams, return_scores=True, jit_compile=jit,
        **kwargs)
    for prompt, got_texts, got_scores in zip(prompts, texts, scores):
      want = dr.beam_search(
          reference, model.encode(prompt), num_steps, num_beams,
          stops=[model.encode(s) for s in stops], banned=banned,
          length_penalty=kwargs.get("length_penalty", 1.0),
          theta=kwargs.get("repetition_penalty", 1.0),
          window=kwargs.get("repetition_window", 0),
          ngram=kwargs.get("no_repeat_ngram_size", 0),
          frequency=kwargs.get("frequency_penalty", 0.0),
          presence=kwargs.get("presence_penalty", 0.0))
      self.assertEqual(got_texts[:len(want)],
                       [model.decode(ids) for ids, _, _ in want], prompt)
      for (ids, _, raw), text, score in zip(want, got_texts, got_scores):
        self.assertNear(score, raw, 1e-3, text)
        # The score is the model's own log-likelihood of the text.
        self.assertNear(score, dr.continuation_log_likelihood(
            reference, model.encode(prompt), ids), 1e-3)

  @parameterized.parameters(*PATHS)
  @pytest.mark.slow  # The bundled model; its other paths are exhaustive.
  @quick_cases(0)  # The graph path.
  def test_bundled_model_without_stops(self, jit):
    model, reference = bundled()
    self.check(model, reference, ["ROMEO:", "First Citizen:\nWe"], 12, 4, jit)

  @parameterized.parameters(*PATHS)
  @pytest.mark.slow  # The bundled model; its other paths are exhaustive.
  @quick_cases(2)  # The elementwise path.
  def test_bundled_model_with_stops_and_length_penalty(self, jit):
    model, reference = bundled()
    self.check(model, reference, ["KING RICHARD", "O, "], 20, 3, jit,
               stop=[" ", "\n"], length_penalty=0.5)

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_small_model_with_penalties(self, jit):
    model, reference = small()
    self.check(model, reference, ["HELLO", "A", "XYZZY"], 15, 5, jit,
               banned=[0], repetition_penalty=1.5, repetition_window=6,
               no_repeat_ngram_size=2, stop=["E", "QQ"], length_penalty=1.5)

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_small_model_with_openai_penalties(self, jit):
    """Each beam's own continuation is counted (the counts follow the
    beams' reordering), never the prompt."""
    model, reference = small()
    self.check(model, reference, ["HELLO", "A", "XYZZY"], 15, 4, jit,
               banned=[0], frequency_penalty=1.5, presence_penalty=0.5,
               repetition_penalty=1.2, stop=["E", "QQ"])

  @pytest.mark.slow  # A program per batch.
  def test_each_prompt_equals_itself_alone(self):
    model, _ = small()
    prompts = ["HELLO", "A", "XYZZY", "Q"]
    batch = rnnstep.generate(model, prompts, 25, num_beams=4,
                             num_return_sequences=2, stop="E")
    for prompt, texts in zip(prompts, batch):
      self.assertEqual(rnnstep.generate(model, prompt, 25, num_beams=4,
                                        num_return_sequences=2, stop="E"),
                       texts)

  def test_return_types(self):
    model, _ = small()
    self.assertIsInstance(rnnstep.generate(model, "AB", 5, num_beams=3), str)
    two = rnnstep.generate(model, "AB", 5, num_beams=3, num_return_sequences=2)
    self.assertLen(two, 2)
    nested = rnnstep.generate(model, ["AB", "C"], 5, num_beams=3,
                              num_return_sequences=2)
    self.assertEqual([len(x) for x in nested], [2, 2])
    texts, scores = rnnstep.generate(model, ["AB", "C"], 5, num_beams=3,
                                     num_return_sequences=2, return_scores=True)
    self.assertEqual(np.shape(scores), (2, 2))
    self.assertEqual(rnnstep.generate(model, ["AB"], 0, num_beams=3), [""])

  @pytest.mark.slow  # Two more beam programs traced: the default run.
  def test_deterministic_whatever_the_sampling_settings(self):
    model, _ = small()
    plain = rnnstep.generate(model, "AB", 20, num_beams=3)
    self.assertEqual(plain, rnnstep.generate(model, "AB", 20, num_beams=3,
                                             temperature=0.3, top_k=2,
                                             top_p=0.5, min_p=0.2, seed=9))


if __name__ == "__main__":
  tf.test.main()
