"""Sampling: supports of min-p / top-k / top-p by drawing many rows, scores
against a float64 log-likelihood, and per-row settings (each row as alone)."""

from absl.testing import parameterized
from hypothesis import given, settings, strategies as st
import numpy as np
import pytest
import tensorflow as tf

from tests.support import decoding_reference as dr
from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support import reference_models
from tests.support import row_contract
from tests.support.tiers import quick_cases

import rnnstep
from rnnstep.decoding import sampling

PATHS = (False, True, "elementwise")
small = reference_models.sampling_model


class SupportTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*[dict(filters, jit_compile=path) for filters in (
      dict(min_p=0.1), dict(min_p=0.5), dict(top_k=3), dict(top_p=0.6),
      dict(top_k=5, top_p=0.8, min_p=0.05), dict(temperature=0.5, min_p=0.2),
      dict(temperature=2.0, top_p=0.9), dict(typical_p=0.5),
      dict(typical_p=0.9, temperature=0.7), dict(typical_p=0.2),
      dict(typical_p=0.8, min_p=0.02, top_k=12)) for path in PATHS])
  @pytest.mark.slow  # Thousands of rows a path: out of the quick tier.
  # One filter set on the graph path; the compiled paths (an XLA program
  # for 3,000 rows each) and the other sets are exhaustive. That the paths
  # draw the same rows is tests/test_generator.py's BatchTest.
  @quick_cases(0)
  def test_draws_cover_exactly_the_reference_support(self, jit_compile,
                                                     **filters):
    model, reference = small()
    prompt = "abc d"
    raw = reference.logits(model.encode(prompt))[-1]
    logits = dr.process(raw, [], banned=[0])
    want = dr.support(logits, **filters)
    probs = np.exp(dr.log_softmax(logits / filters.get("temperature", 1.0)))
    rows = 3000
    drawn = rnnstep.generate(model, [prompt] * rows, 1, seed=17,
                             jit_compile=jit_compile, **filters)
    got = {model.encode(t)[0] for t in drawn}
    self.assertLessEqual(got, want, f"{jit_compile} {filters}")
    # Every id in the support with a fair chance of being drawn was drawn.
    likely = {i for i in want
              if probs[i] / probs[list(want)].sum() > 5.0 / rows}
    self.assertLessEqual(likely, got, f"{jit_compile} {filters}")

  @parameterized.parameters(dict(top_k=6, min_p=0.05), dict(typical_p=0.6),
                            dict(typical_p=0.9, temperature=1.5))
  @quick_cases(0)
  @pytest.mark.slow  # Statistics over thousands of draws: the default run.
  def test_frequencies_follow_the_renormalized_support(self, **filters):
    model, reference = small()
    prompt = "abc d"
    logits = dr.process(reference.logits(model.encode(prompt))[-1], [],
                        banned=[0])
    keep = sorted(dr.support(logits, **filters))
    probs = np.exp(dr.log_softmax(logits[keep] / filters.get("temperature",
                                                             1.0)))
    rows = 6000
    drawn = rnnstep.generate(model, [prompt] * rows, 1, seed=4, **filters)
    self.assertLessEqual({model.encode(t)[0] for t in drawn}, set(keep))
    counts = np.array([sum(t == model.vocab[i] for t in drawn) for i in keep])
    expected = probs * rows
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # The 99.9% quantile of chi-square with len(keep) - 1 degrees of freedom.
    self.assertLess(chi2, dr.CHI2_999[len(keep) - 1], (counts, expected))


class ScoreTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_scores_are_the_float64_log_likelihood(self, jit):
    model, reference = small()
    prompts = ["abc", "j", "ha ha, ha"]
    for kwargs in (dict(temperature=0.7, top_k=4, seed=3),
                   dict(temperature=0.0, repetition_penalty=1.3),
                   dict(seed=[1, 2, 3], stop=[".", "!"]),
                   dict(seed=5, min_p=0.3, no_repeat_ngram_size=2)):
      texts, scores = rnnstep.generate(model, prompts, 40, return_scores=True,
                                       jit_compile=jit, **kwargs)
      for prompt, text, score in zip(prompts, texts, scores):
        want = dr.continuation_log_likelihood(
            reference, model.encode(prompt), model.encode(text))
        self.assertNear(score, want, 1e-3 * max(1.0, abs(want)), kwargs)
    single_text, single_score = rnnstep.generate(
        model, "abc", 10, seed=1, return_scores=True, jit_compile=jit)
    self.assertIsInstance(single_text, str)
    self.assertIsInstance(single_score, float)

  @pytest.mark.slow  # The default path's programs, generated and streamed.
  def test_stream_reports_scores_so_far(self):
    model, _ = small()
    texts, scores = rnnstep.generate(model, ["abc", "j"], 30, seed=8,
                                     return_scores=True)
    chunks = list(rnnstep.stream(model, ["abc", "j"], 30, chunk_size=7, seed=8,
                                 return_scores=True))
    self.assertEqual(["".join(c[0][i] for c in chunks) for i in range(2)], texts)
    self.assertAllClose(chunks[-1][1], scores, rtol=1e-6)


_SETTING = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    "top_k": st.sampled_from([0, 1, 3, 30]),
    "top_p": st.sampled_from([1.0, 0.9, 0.3]),
    "min_p": st.sampled_from([0.0, 0.05, 0.5]),
    "repetition_penalty": st.sampled_from([1.0, 1.3, 0.8]),
})


class PerRowTest(tf.test.TestCase):
  """Drawn batches (prompts, per-row settings, seeds; path, window, n-gram
  size): each row of a batch, generated or streamed, is the row alone. The
  default run draws 2 batches on the graph path (as the batch contract's
  other tests, tests/test_generator.py's `BatchTest`), the exhaustive tier 5
  on drawn paths (`PerRowExhaustiveTest`)."""

  examples = 2
  paths = (False,)

  @pytest.mark.slow  # Drawn batches (and, exhaustive, drawn paths).
  def test_each_row_equals_itself_alone(self):

    @settings(max_examples=self.examples, deadline=None)
    @given(rows=st.lists(st.tuples(st.text(alphabet="abcdej ,", min_size=1,
                                           max_size=9), _SETTING,
                                   st.integers(0, 2**40)),
                         min_size=1, max_size=5),
           path=st.sampled_from(self.paths), window=st.sampled_from([0, 4]),
           ngram=st.sampled_from([0, 3]))
    def check(rows, path, window, ngram):
      model, reference = small()
      prompts = [prompt for prompt, _, _ in rows]
      seeds = [seed for _, _, seed in rows]
      per_row = {name: [s[name] for _, s, _ in rows] for name in _SETTING_KEYS}
      common = dict(repetition_window=window, no_repeat_ngram_size=ngram,
                    jit_compile=path)
      batch = rnnstep.generate(model, prompts, 24, seed=seeds, **per_row,
                               **common)
      streamed = list(rnnstep.stream(model, prompts, 24, chunk_size=10,
                                     seed=seeds, **per_row, **common))
      self.assertEqual(["".join(c[i] for c in streamed)
                        for i in range(len(rows))], batch)
      for (prompt, setting, seed), text in zip(rows, batch):
        alone = rnnstep.generate(model, prompt, 24, seed=[seed], **setting,
                                 **common)
        if setting["top_k"] or setting["top_p"] < 1 or setting["min_p"]:
          # A filter's edge can also flip at a rounding tie; not modelled by
          # the near-tie check, and never seen: held to equality.
          self.assertEqual(alone, text, (prompt, setting, seed))
          continue
        row_contract.assert_same_or_near_tie(
            reference, model.encode(prompt), model.encode(text),
            model.encode(alone), temperature=setting["temperature"],
            key=dr.row_key(seed, 0), theta=setting["repetition_penalty"],
            window=window, ngram=ngram, message=(prompt, setting, seed))

    check()


@pytest.mark.exhaustive
class PerRowExhaustiveTest(PerRowTest):
  examples = 5
  paths = PATHS


class MixedRowsTest(tf.test.TestCase, parameterized.TestCase):
  """Greedy and sampled rows in one batch, on every path, generate and stream.

  The plain sampler takes one argmax over each row's own scores; a greedy row's
  must be its logits, whatever its neighbours draw. Prompts of three lengths
  also run the masked priming loop.
  """

  @parameterized.product(path=PATHS, caller=("generate", "stream"))
  @quick_cases(0, 1)  # The graph path, both callers.
  def test_greedy_rows_follow_the_float64_reference(self, path, caller):
    model, reference = small()
    prompts = ["abc", "j", "de ,a"]
    options = dict(temperature=[0.0, 0.9, 0.0], seed=[1, 2, 3],
                   jit_compile=path)
    if caller == "generate":
      texts = rnnstep.generate(model, prompts, 24, **options)
    else:
      chunks = list(rnnstep.stream(model, prompts, 24, chunk_size=10,
                                   **options))
      texts = ["".join(c[i] for c in chunks) for i in range(len(prompts))]
    for row in (0, 2):
      expected = reference.greedy(model.encode(prompts[row]), 24)
      self.assertEqual(texts[row], model.decode(expected), (row, path))
    alone = rnnstep.generate(model, [prompts[1]], 24, temperature=0.9,
                             seed=[2], jit_compile=path)
    row_contract.assert_same_or_near_tie(
        reference, model.encode(prompts[1]), model.encode(texts[1]),
        model.encode(alone[0]), temperature=0.9, key=dr.row_key(2, 0))


_SETTING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


class FirstMaxIndexTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(("eager", None), ("graph", False),
                                  ("xla", True))
  @quick_cases("eager", "graph")
  def test_is_numpys_argmax_ties_and_infinities_included(self, jit):
    rng = np.random.default_rng(5)
    scores = rng.normal(size=[64, 65]).astype(np.float32)
    scores[:16] = np.round(scores[:16])  # Many ties: the first one wins.
    scores[16:20, :30] = -np.inf
    scores[20, :] = -np.inf
    scores[20, 64] = 0.0
    scores[21, 7] = np.inf
    scores[21, 9] = np.inf
    fn = sampling.first_max_index
    if jit is not None:
      fn = tf.function(fn, jit_compile=jit, autograph=False)
    got = fn(tf.constant(scores)).numpy()
    self.assertEqual(got.dtype, np.int32)
    np.testing.assert_array_equal(got, np.argmax(scores, axis=-1))


def _whole_row_filters(scaled, top_k, top_p, typical_p):
  """top-k, top-p and typical over a full sort of each row (the filters'
  definition, written out: what they computed before sorting only heads)."""
  ordered = tf.sort(scaled, axis=-1, direction="DESCENDING")
  size = scaled.shape[-1]
  k = tf.where((top_k > 0) & (top_k < size), top_k, size)
  keep = lambda x, t: tf.where(x >= t[:, None], x, -float("inf"))
  by_k = keep(scaled, tf.gather(ordered, k - 1, batch_dims=1))
  ordered = tf.sort(by_k, axis=-1, direction="DESCENDING")
  before = tf.cumsum(tf.nn.softmax(ordered, -1), -1, exclusive=True)
  kept = tf.reduce_sum(tf.cast(before < top_p[:, None], tf.int32), -1)
  by_p = keep(by_k, tf.gather(ordered, tf.maximum(kept, 1) - 1, batch_dims=1))
  log_p = tf.nn.log_softmax(by_p, -1)
  p = tf.exp(log_p)
  entropy = -tf.reduce_sum(tf.where(p > 0, p * log_p, 0.0), -1, keepdims=True)
  atypical = tf.abs(-log_p - entropy)
  order = tf.argsort(atypical, axis=-1, stable=True)
  mass = tf.cumsum(tf.nn.softmax(tf.gather(by_p, order, batch_dims=1), -1), -1)
  last = tf.minimum(tf.reduce_sum(tf.cast(mass < typical_p[:, None], tf.int32),
                                  -1), size - 1)
  threshold = tf.gather(tf.gather(atypical, order, batch_dims=1), last,
                        batch_dims=1)
  by_typical = tf.where(atypical > threshold[:, None], -float("inf"), by_p)
  return by_k, by_p, by_typical


class SortedHeadTest(tf.test.TestCase, parameterized.TestCase):
  """Over a vocabulary larger than `SORTED_HEAD`, rows an earlier top-k left
  with few finite ids are sorted only that far: each filter's result is the
  whole-row sort's, bit for bit (ties, -inf and k past the head included)."""

  @parameterized.named_parameters(("graph", False), ("xla", True))
  @quick_cases("graph")
  def test_filters_equal_the_whole_row_sort(self, jit):
    head = sampling.SORTED_HEAD
    rng = np.random.default_rng(8)
    scaled = np.round(rng.normal(size=[6, 4 * head + 3]) * 3, 1)  # Ties.
    scaled[:, :2] = -np.inf  # Banned ids.
    scaled = tf.constant(scaled.astype(np.float32))

    def filters(scaled, top_k, top_p, typical_p):
      by_k = sampling.top_k_filter(scaled, top_k)
      by_p = sampling.top_p_filter(by_k, top_p)
      return by_k, by_p, sampling.typical_filter(by_p, typical_p)

    mine = tf.function(filters, jit_compile=jit, autograph=False)
    reference = tf.function(_whole_row_filters, jit_compile=jit,
                            autograph=False)
    top_p = tf.constant([0.3, 0.9, 0.999, 1.0, 0.5, 0.95])
    typical_p = tf.constant([0.9, 0.5, 0.99, 0.7, 1.0, 0.2])
    for top_k in ([40, 1, head, 7, 100, 40],      # Every row within the head.
                  [40, 0, head, 7, 100, 40],      # One row keeps everything.
                  [40, head + 1, 3, 7, 100, 9]):  # One row past the head.
      top_k = tf.constant(top_k)
      for got, want in zip(mine(scaled, top_k, top_p, typical_p),
                           reference(scaled, top_k, top_p, typical_p)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


class NoiseTest(tf.test.TestCase):

  def test_the_noise_follows_its_spec(self):
    # decoding_reference.gumbel_noise is written from sampling.py's docstring;
    # the batch-contract checks (tests/support/row_contract.py) rely on it.
    seeds = [0, 1, -1, 2**40 + 3, -2**63, 2**63 - 1]
    for seed in seeds:
      for index in (0, 5):
        key = sampling.row_keys(tf.constant([seed], tf.int64),
                                tf.constant([index]))
        self.assertEqual(int(key[0]), dr.row_key(seed, index))
        for step in (0, 17, 2**31 - 1):
          got = -np.log(-np.log(
              sampling.uniform_noise(key, tf.constant(step), 21).numpy()[0]))
          self.assertAllClose(got, dr.gumbel_noise(dr.row_key(seed, index),
                                                   step, 21), atol=1e-4, rtol=1e-5)


class BadValueTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ("zero_penalty", dict(repetition_penalty=0.0), "repetition_penalty must"),
      ("negative_penalty", dict(repetition_penalty=-1.0),
       "repetition_penalty must"),
      ("row_penalty", dict(prompts=["a", "b"], repetition_penalty=[1.0, 0.0]),
       r"repetition_penalty\[1\] must"),
      ("frequency_high", dict(frequency_penalty=2.5),
       r"frequency_penalty must be in \[-2, 2\]"),
      ("presence_nan", dict(presence_penalty=float("nan")),
       r"presence_penalty must be in \[-2, 2\]"),
      ("presence_row", dict(prompts=["a", "b"], presence_penalty=[0.0, -2.5]),
       r"presence_penalty\[1\] must be in \[-2, 2\]"),
      ("returns_over_beams", dict(num_beams=2, num_return_sequences=3),
       "num_return_sequences must"),
      ("list_length", dict(prompts=["a", "b"], temperature=[0.5]),
       "temperature lists 1 values for 2 prompts"),
      ("min_p_high", dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
      ("min_p_negative", dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
      ("typical_p_zero", dict(typical_p=0.0), r"typical_p must be in \(0, 1\]"),
      ("typical_p_high", dict(typical_p=1.5), r"typical_p must be in \(0, 1\]"),
      ("typical_p_row", dict(prompts=["a", "b"], typical_p=[0.5, float("nan")]),
       r"typical_p\[1\] must be in \(0, 1\]"),
      ("window", dict(repetition_window=-1), "repetition_window must"),
      ("ngram", dict(no_repeat_ngram_size=1.5), "no_repeat_ngram_size must"),
      ("beams_zero", dict(num_beams=0), "num_beams must"),
      ("beams_vocab", dict(num_beams=500), "num_beams must"),
      ("length_penalty", dict(num_beams=2, length_penalty=float("nan")),
       "length_penalty must"),
      ("scores", dict(return_scores="yes"), "return_scores must"),
  )
  def test_bad_value(self, overrides, pattern):
    model, _ = small()
    kwargs = dict(prompts="abc", num_steps=5)
    kwargs.update(overrides)
    prompts, num_steps = kwargs.pop("prompts"), kwargs.pop("num_steps")
    with self.assertRaisesRegex(ValueError, pattern) as ctx:
      rnnstep.generate(model, prompts, num_steps, **kwargs)
    self.assertNotIn("\n", str(ctx.exception))

  def test_beams_do_not_stream(self):
    model, _ = small()
    with self.assertRaisesRegex(ValueError, "num_beams=3: beam search does not "
                                "stream"):
      next(rnnstep.stream(model, "abc", 5, num_beams=3))


if __name__ == "__main__":
  tf.test.main()
