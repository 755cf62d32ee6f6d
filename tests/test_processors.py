"""The look-back rules (repetition, frequency and presence penalties, n-gram
ban) against numpy references.

The rules are checked on random logits and histories, eagerly and compiled
(graph and XLA), then step by step along generated text: every chosen id must
be the argmax of the reference's processed logits for its prefix.
"""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from tests.support import decoding_reference as dr
from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support.tiers import quick_cases

import rnnstep
from rnnstep.decoding import pipeline
from rnnstep.decoding import processors
from rnnstep.decoding import sampling

V = 7


def _history(rows, length, capacity, rng, vocab=V):
  ids = np.zeros([len(rows), capacity], np.int32)
  for r, row in enumerate(rows):
    ids[r, :len(row)] = row
  return ids, np.array([len(r) for r in rows], np.int32)


def _apply(logits, ids, lengths, theta, window, ngram, mode):
  """processors.start + the pipeline's look-back stage, as numpy, in `mode`."""
  settings = processors.Settings(tf.constant(window), tf.constant(ngram),
                                 tf.constant(ids.shape[1]))

  def run(logits, ids, lengths, theta):
    history = processors.start(ids, lengths, V, settings, tf.constant(True))
    params = sampling.DEFAULTS._replace(repetition_penalty=theta)
    params = sampling.Params(*[tf.broadcast_to(tf.cast(v, d), tf.shape(theta))
                               for v, d in zip(params, sampling.PARAM_DTYPES)])
    parts = pipeline.active(params, settings, V)
    return pipeline.look_back(logits, params, parts, history, settings)

  if mode != "eager":
    run = tf.function(run, jit_compile=mode == "xla", autograph=False)
  return run(tf.constant(logits, tf.float32), ids, lengths,
             tf.constant(theta, tf.float32)).numpy()


class RulesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters("eager", "graph", "xla")
  @quick_cases(0)  # Eager (graph and XLA: slow).
  def test_random_histories_match_the_reference(self, mode):
    rng = np.random.default_rng(0)
    for trial in range(20):
      rows = [list(rng.integers(0, V, rng.integers(1, 14))) for _ in range(3)]
      logits = rng.normal(0, 2, [3, V]).astype(np.float32)
      theta = rng.choice([1.0, 1.3, 0.7, 2.0], 3).astype(np.float32)
      window = int(rng.choice([0, 1, 3, 8]))
      ngram = int(rng.choice([0, 1, 2, 3, 4]))
      ids, lengths = _history(rows, 16, 16, rng)
      got = _apply(logits, ids, lengths, theta, window, ngram, mode)
      for r, row in enumerate(rows):
        want = dr.process(logits[r], row, theta=float(theta[r]), window=window,
                          ngram=ngram)
        self.assertAllClose(got[r], want, rtol=1e-6,
                            msg=f"trial {trial} row {r}: {row} {window} {ngram}")

  @parameterized.parameters("eager", "graph")
  def test_per_row_settings_match_the_reference(self, mode):
    """The serving engine's `[B]` look-back settings: each row's window and
    n-gram size its own (0: off for that row), beside rows of other ones."""
    rng = np.random.default_rng(1)
    for trial in range(8):
      rows = [list(rng.integers(0, V, rng.integers(1, 14))) for _ in range(5)]
      logits = rng.normal(0, 2, [5, V]).astype(np.float32)
      theta = rng.choice([1.0, 1.3, 0.7], 5).astype(np.float32)
      window = rng.choice([0, 1, 3, 8], 5).astype(np.int32)
      ngram = rng.choice([0, 1, 2, 3, 5], 5).astype(np.int32)
      ids, lengths = _history(rows, 16, 16, rng)
      got = _apply(logits, ids, lengths, theta, window, ngram, mode)
      for r, row in enumerate(rows):
        want = dr.process(logits[r], row, theta=float(theta[r]),
                          window=int(window[r]), ngram=int(ngram[r]))
        self.assertAllClose(got[r], want, rtol=1e-6,
                            msg=f"trial {trial} row {r}: {row} {window[r]} "
                            f"{ngram[r]}")

  @parameterized.parameters("eager", "graph", "xla")
  @quick_cases(0)  # Eager (graph and XLA: slow).
  def test_openai_penalties_count_the_continuation_only(self, mode):
    """frequency_penalty and presence_penalty (per row, beside θ and the
    n-gram ban) against vLLM's rule: the prompt's ids are not counted."""
    rng = np.random.default_rng(2)
    for trial in range(12):
      rows = [list(rng.integers(0, V, rng.integers(1, 8))) for _ in range(4)]
      steps = int(rng.integers(0, 8))
      continuation = rng.integers(0, V, [4, steps]).astype(np.int32)
      logits = rng.normal(0, 2, [4, V]).astype(np.float32)
      values = dict(
          repetition_penalty=rng.choice([1.0, 1.3], 4),
          frequency_penalty=rng.choice([0.0, 0.5, -0.7, 2.0], 4),
          presence_penalty=rng.choice([0.0, 1.1, -2.0], 4))
      window, ngram = int(rng.choice([0, 3])), int(rng.choice([0, 2]))
      ids, lengths = _history(rows, 16, 16, rng)
      settings = processors.Settings(tf.constant(window), tf.constant(ngram),
                                     tf.constant(16))

      def run(logits, ids, lengths, continuation, values):
        history = processors.start(ids, lengths, V, settings,
                                   tf.constant(True))
        for t in range(steps):
          history = processors.append(history, continuation[:, t], settings)
        params = sampling.Params(*[
            tf.cast(values[name], dtype) if name in values
            else tf.fill([4], tf.cast(default, dtype))
            for name, default, dtype in zip(sampling.Params._fields,
                                            sampling.DEFAULTS,
                                            sampling.PARAM_DTYPES)])
        parts = pipeline.active(params, settings, V)
        return pipeline.look_back(logits, params, parts, history, settings)

      if mode != "eager":
        run = tf.function(run, jit_compile=mode == "xla", autograph=False)
      got = run(tf.constant(logits), ids, lengths, continuation,
                {k: tf.constant(v, tf.float32) for k, v in values.items()})
      for r, row in enumerate(rows):
        want = dr.process(
            logits[r], row + list(continuation[r]),
            theta=float(np.float32(values["repetition_penalty"][r])),
            window=window, ngram=ngram, prompt_length=len(row),
            frequency=float(np.float32(values["frequency_penalty"][r])),
            presence=float(np.float32(values["presence_penalty"][r])))
        self.assertAllClose(got[r], want, rtol=1e-6, atol=1e-5,
                            msg=f"trial {trial} row {r}: {row} "
                            f"{continuation[r]} {values}")

  def test_append_moves_the_window(self):
    settings = processors.Settings(tf.constant(3), tf.constant(0),
                                   tf.constant(12))
    ids = np.array([[1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    history = processors.start(ids, np.array([3], np.int32), V, settings,
                               tf.constant(True))
    row = [1, 2, 2]
    for token in [3, 3, 1, 5, 5, 5, 2]:
      history = processors.append(history, tf.constant([token]), settings)
      row.append(token)
      want = np.bincount(row[-3:], minlength=V)
      self.assertAllEqual(history.counts[0], want)
      self.assertAllEqual(history.ids[0, :len(row)], row)
      self.assertEqual(int(history.length[0]), len(row))
      self.assertAllEqual(history.generated[0],
                          np.bincount(row[3:], minlength=V))


def _model():
  layers = [kr.layer("gru", 32)]
  keras_model = kr.build(layers, vocab_size=12, embedding_dim=8, seed=5,
                         bias_scale=1.0)
  vocab = list("ab cdefghij.")
  model = kr.rnnstep_model(keras_model, layers, vocab=vocab)
  return model, nr.Reference(kr.weights_of(keras_model, layers), layers)


class GenerationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(False, True, "elementwise")
  @quick_cases(0)  # The graph path.
  def test_each_greedy_step_is_the_reference_argmax(self, jit):
    model, reference = _model()
    prompts = ["ab ab ab", "c", "jihgf"]
    cases = [dict(repetition_penalty=1.5, repetition_window=4),
             dict(no_repeat_ngram_size=3),
             dict(repetition_penalty=[1.2, 1.0, 3.0], no_repeat_ngram_size=2),
             dict(repetition_penalty=1.4)]
    for case in cases:
      self._assert_greedy_steps_are_the_reference_argmax(
          model, reference, prompts, case, jit)

  @parameterized.parameters(False, True, "elementwise")
  @quick_cases(0)  # The graph path.
  def test_openai_penalties_greedy_steps_are_the_reference_argmax(self, jit):
    model, reference = _model()
    prompts = ["ab ab ab", "c", "jihgf"]
    cases = [dict(frequency_penalty=0.8),
             dict(presence_penalty=1.5, no_repeat_ngram_size=4),
             dict(frequency_penalty=[0.5, 0.0, -0.3],
                  presence_penalty=[0.0, 1.0, 0.7], repetition_penalty=1.2,
                  repetition_window=3)]
    for case in cases:
      self._assert_greedy_steps_are_the_reference_argmax(
          model, reference, prompts, case, jit)

  def _assert_greedy_steps_are_the_reference_argmax(self, model, reference,
                                                    prompts, case, jit):
    texts = rnnstep.generate(model, prompts, 30, temperature=0.0,
                             jit_compile=jit, **case)

    def of_row(name, r, default):
      value = case.get(name, default)
      return value[r] if isinstance(value, list) else value

    for r, (prompt, text) in enumerate(zip(prompts, texts)):
      history = list(model.encode(prompt))
      prompt_length = len(history)
      logits_all = reference.logits(np.array(history + list(model.encode(text))))
      for t, token in enumerate(model.encode(text)):
        raw = logits_all[len(history) - 1]
        want = dr.process(raw, history,
                          theta=of_row("repetition_penalty", r, 1.0),
                          window=case.get("repetition_window", 0),
                          ngram=case.get("no_repeat_ngram_size", 0),
                          frequency=of_row("frequency_penalty", r, 0.0),
                          presence=of_row("presence_penalty", r, 0.0),
                          prompt_length=prompt_length)
        ordered = np.sort(want[np.isfinite(want)])
        self.assertEqual(int(np.argmax(want)), int(token),
                         f"{case} row {r} step {t}: gap "
                         f"{ordered[-1] - ordered[-2] if len(ordered) > 1 else 0}")
        history.append(int(token))

  @pytest.mark.slow  # The default path's programs.
  def test_ngram_ban_removes_repeats_that_greedy_makes(self):
    model, _ = _model()
    plain = rnnstep.generate(model, "ab ab ab", 60, temperature=0.0)
    banned = rnnstep.generate(model, "ab ab ab", 60, temperature=0.0,
                              no_repeat_ngram_size=3)
    text = "ab ab ab" + banned
    # Every 3-gram that ends in the continuation is new (the prompt's own
    # repeats were there before).
    for end in range(len("ab ab ab"), len(text)):
      self.assertNotIn(text[end - 2:end + 1], text[:end], end)
    self.assertNotEqual(plain, banned)

  @parameterized.parameters(False, True, "elementwise")
  @quick_cases(0)  # The graph path.
  def test_stream_carries_the_history(self, jit):
    model, _ = _model()
    kwargs = dict(seed=3, repetition_penalty=1.6, repetition_window=5,
                  no_repeat_ngram_size=3, jit_compile=jit)
    whole = rnnstep.generate(model, ["ab", "c d"], 50, **kwargs)
    chunks = list(rnnstep.stream(model, ["ab", "c d"], 50, chunk_size=7,
                                 **kwargs))
    self.assertEqual(["".join(c[i] for c in chunks) for i in range(2)], whole)

  @parameterized.parameters(False, True, "elementwise")
  @quick_cases(0)  # The graph path.
  def test_stream_carries_the_continuations_counts(self, jit):
    """The frequency and presence penalties count every chunk's ids (the
    history's `generated` travels in the carry), never the prompt's."""
    model, _ = _model()
    kwargs = dict(seed=4, frequency_penalty=[0.6, -0.4],
                  presence_penalty=[0.9, 0.3], jit_compile=jit)
    whole = rnnstep.generate(model, ["ab", "c d"], 50, **kwargs)
    chunks = list(rnnstep.stream(model, ["ab", "c d"], 50, chunk_size=7,
                                 **kwargs))
    self.assertEqual(["".join(c[i] for c in chunks) for i in range(2)], whole)


if __name__ == "__main__":
  tf.test.main()
