"""`regex=`: every row stays inside its pattern, by an independent matcher
(Python's `re`), with the model's probabilities renormalized over the allowed
ids (float64 reference), on every path, per row, streamed, in beams, and from
the CLI; bad patterns refused in one line."""

import functools
import itertools
import json
import os
import re
import subprocess
import sys

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from tests.support import cli
from tests.support import decoding_reference as dr
from tests.support import forkserver
from tests.support import reference_models
from tests.support.tiers import quick_cases

import rnnstep
from rnnstep.decoding import constraints
from rnnstep.engine import request as request_lib
from rnnstep import errors
from rnnstep.model import model_file

PATHS = (False, True, "elementwise")
# Vocabulary of `reference_models.sampling_model()`: "[UNK]" + "abcdefghij ,.;:!?-'\n".
WORDS = r"[a-e]+(, [a-e]+)*\."
CLAUSE = r"([a-e]+ )+[f-j]+\."
# Characters from which every prefix of WORDS / CLAUSE completes within
# three more (", a." / " f." at most).
COMPLETIONS = ("a", "f", ",", " ", ".")


small = reference_models.sampling_model


@functools.lru_cache(maxsize=None)
def is_prefix(pattern: str, text: str) -> bool:
  """Whether `text` extends to a full match (brute force over COMPLETIONS)."""
  return any(re.fullmatch(pattern, text + "".join(tail))
             for n in range(4)
             for tail in itertools.product(COMPLETIONS, repeat=n))


def assert_valid(test, pattern, texts, num_steps, stops=()):
  """Rows that ended early match fully; rows cut at num_steps or by a stop
  string are prefixes."""
  for text in texts:
    if len(text) < num_steps and not text.endswith(tuple(stops)):
      test.assertIsNotNone(re.fullmatch(pattern, text), (pattern, text))
    else:
      test.assertTrue(is_prefix(pattern, text), (pattern, text))


class CompileTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(WORDS, CLAUSE, r"(ab|c)*d?[hij]{2,3}", r"a\.|b+")
  def test_table_accepts_what_re_fullmatch_accepts(self, pattern):
    model, _ = small()
    dfa = constraints.combine(model, [pattern])
    rng = np.random.default_rng(0)
    chars = list("abcdefhij ,.")
    for _ in range(400):
      text = "".join(rng.choice(chars, size=rng.integers(1, 8)))
      state, alive = dfa.start[0], True
      for i in model.encode(text):
        state = dfa.table[state, i]
      alive = state != constraints.DEAD
      matched = re.fullmatch(pattern, text) is not None
      # A matching text is alive; a text that is alive is a prefix.
      if matched:
        self.assertTrue(alive, text)
      if dfa.ends[state]:
        self.assertTrue(matched, text)

  def test_rows_share_a_pattern_and_free_rows_start_free(self):
    model, _ = small()
    dfa = constraints.combine(model, [WORDS, None, CLAUSE, WORDS])
    self.assertEqual(dfa.start[0], dfa.start[3])
    self.assertEqual(dfa.start[1], constraints.FREE)
    self.assertTrue((dfa.table[constraints.FREE] == constraints.FREE).all())
    self.assertTrue((dfa.table[constraints.DEAD] == constraints.DEAD).all())
    # "[UNK]" (id 0) is never allowed.
    self.assertTrue((dfa.table[2:, 0] == constraints.DEAD).all())

  def test_xla_requests_bucket_the_states(self):
    model, _ = small()
    generator = rnnstep.Generator(model, "xla")
    sizes = set()
    for pattern in (WORDS, CLAUSE, "a"):
      request = generator.request(["ab"], 4, request_lib.Options(
          regex=(pattern,)))
      sizes.add(request.constraint.table.shape)
    self.assertEqual(sizes, {(16, model.vocab_size)})

  @parameterized.parameters(
      ("(a", "does not compile"), (r"(a)\1", "not supported"),
      ("z+", "matches no string"), ("", "only the empty string"),
      ("a{5000}", "4096"), ("a(?!b)c", "look-around"), ("(?i)a", "flags"),
      ("^a", "not supported"), (["a", 3], "must be a str"),
      (["a"] * 2, "lists 2 patterns for 1 prompts"),
      ("(ab|c){9000}", "has 27000 character positions with its repeats "
       "expanded, more than the limit of 8192"))
  @quick_cases(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
  def test_bad_patterns_are_refused_in_one_line(self, regex, words):
    model, _ = small()
    for call in (lambda: rnnstep.generate(model, "ab", 3, regex=regex),
                 lambda: next(rnnstep.stream(model, "ab", 3, regex=regex))):
      with self.assertRaises(errors.ArgumentError) as caught:
        call()
      message = str(caught.exception)
      self.assertEqual(caught.exception.argument, "regex")
      self.assertIn(words, message)
      self.assertNotIn("\n", message)
      if isinstance(regex, str):
        self.assertIn(repr(regex), message)


class GenerateTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_every_row_matches_its_pattern(self, jit):
    model, _ = small()
    for pattern, kwargs in ((WORDS, {}), (CLAUSE, dict(top_k=4, top_p=0.9)),
                            (WORDS, dict(repetition_penalty=1.5,
                                         no_repeat_ngram_size=2,
                                         stop=[";", "a, b"]))):
      texts = rnnstep.generate(model, ["abc d"] * 64, 24, seed=5,
                               jit_compile=jit, regex=pattern, **kwargs)
      assert_valid(self, pattern, texts, 24, kwargs.get("stop", ()))
      # Some rows end on their own by matching, some run to num_steps.
      if not kwargs:
        self.assertTrue(any(len(t) < 24 for t in texts), texts)

  @pytest.mark.exhaustive  # Every path.
  def test_the_pattern_wins_where_the_ngram_ban_leaves_nothing(self):
    model, _ = small()
    # After "aa" the 2-gram ban forbids the only character "a+" allows.
    for jit in PATHS:
      texts = rnnstep.generate(model, ["b", "c"], 12, seed=1, jit_compile=jit,
                               regex="a+", no_repeat_ngram_size=2)
      self.assertEqual(texts, ["a" * 12] * 2)

  def test_first_characters_follow_the_renormalized_model(self):
    model, reference = small()
    prompt = "abc d"
    logits = dr.process(reference.logits(model.encode(prompt))[-1], [],
                        banned=[0])
    for pattern, filters in ((r"[a-f,.]+", {}), (r"[b-h ]x?",
                                                 dict(temperature=0.7,
                                                      top_k=3))):
      allowed = [i for i, c in enumerate(model.vocab)
                 if i > 0 and is_prefix(pattern, c)]
      temperature = filters.get("temperature", 1.0)
      keep = sorted(dr.support(np.where(np.isin(np.arange(len(logits)),
                                                allowed), logits, -np.inf),
                               **filters))
      self.assertLessEqual(set(keep), set(allowed))
      probs = np.exp(dr.log_softmax(logits[keep] / temperature))
      rows = 4000
      drawn = rnnstep.generate(model, [prompt] * rows, 1, seed=9,
                               regex=pattern, **filters)
      counts = np.array([sum(t == model.vocab[i] for t in drawn)
                         for i in keep])
      self.assertEqual(counts.sum(), rows)
      expected = probs * rows
      chi2 = float(((counts - expected) ** 2 / expected).sum())
      self.assertLess(chi2, dr.CHI2_999[len(keep) - 1],
                      (pattern, counts, expected))

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_greedy_is_the_argmax_among_the_allowed_characters(self, jit):
    model, reference = small()
    prompt = "cab"
    text = rnnstep.generate(model, prompt, 20, temperature=0.0,
                            jit_compile=jit, regex=CLAUSE)
    ids = list(model.encode(prompt + text))
    logits = reference.logits(np.array(ids))  # Teacher forced, float64.
    for t in range(len(text)):
      allowed = [i for i, c in enumerate(model.vocab)
                 if i > 0 and is_prefix(CLAUSE, text[:t] + c)]
      row = logits[len(prompt) - 1 + t]
      want = max(allowed, key=lambda i: row[i])
      self.assertEqual(model.vocab[want], text[t], (t, text))

  @pytest.mark.exhaustive  # Every path (39 s); the default run has
  # test_rows_share_a_pattern_and_free_rows_start_free.
  def test_a_pattern_per_row_and_free_rows_as_alone(self):
    model, _ = small()
    patterns = [WORDS, None, CLAUSE, r"[hij]+!"]
    for jit in PATHS:
      texts = rnnstep.generate(model, ["abc d"] * 4, 20, seed=[1, 2, 3, 4],
                               jit_compile=jit, regex=patterns)
      for pattern, text, seed in zip(patterns, texts, [1, 2, 3, 4]):
        if pattern is None:  # The same text as without any pattern.
          self.assertEqual(text, rnnstep.generate(
              model, "abc d", 20, seed=seed, jit_compile=jit))
        else:
          assert_valid(self, pattern, [text], 20)
          self.assertEqual(text, rnnstep.generate(
              model, "abc d", 20, seed=seed, jit_compile=jit, regex=pattern))

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_stream_equals_generate(self, jit):
    model, _ = small()
    kwargs = dict(seed=3, regex=[WORDS, CLAUSE, None], jit_compile=jit,
                  top_k=6)
    want = rnnstep.generate(model, ["ab", "c", "dd"], 30, **kwargs)
    pieces = list(rnnstep.stream(model, ["ab", "c", "dd"], 30, chunk_size=7,
                                 **kwargs))
    self.assertEqual(["".join(p[r] for p in pieces) for r in range(3)], want)

  def test_scores_are_the_models_log_likelihood(self):
    model, reference = small()
    texts, scores = rnnstep.generate(model, ["abc d"] * 3, 12, seed=2,
                                     regex=WORDS, return_scores=True)
    for text, score in zip(texts, scores):
      want = dr.continuation_log_likelihood(reference, model.encode("abc d"),
                                            model.encode(text))
      self.assertAllClose(score, want, rtol=1e-4, atol=1e-4)

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_every_returned_beam_matches(self, jit):
    model, _ = small()
    for pattern in (WORDS, CLAUSE):
      beams = rnnstep.generate(model, ["abc d", "e"], 16, num_beams=4,
                               num_return_sequences=4, jit_compile=jit,
                               regex=pattern, stop=[";"])
      for texts in beams:
        assert_valid(self, pattern, texts, 16, [";"])

  @pytest.mark.slow  # rnnstep-generate subprocesses
  def test_the_cli_flag(self):
    model, _ = small()
    path = self.create_tempdir().full_path + "/small.npz"
    model_file.write(path, model.config, model.vocab, model.tensors())
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = forkserver.run(
        [sys.executable, "-m", "rnnstep.cli.generate", f"--weights={path}",
         "--prompt=abc d", "--prompt=e", "--num_samples=2", "--num_steps=20",
         f"--regex={WORDS}", f"--regex={CLAUSE}", "--seed=4",
         "--format=jsonl"], capture_output=True, text=True, timeout=300,
        cwd=root, env=cli.ENV)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    texts = [json.loads(line)["text"] for line in result.stdout.splitlines()]
    self.assertEqual(texts, rnnstep.generate(
        model, ["abc d", "abc d", "e", "e"], 20, seed=4,
        regex=[WORDS, WORDS, CLAUSE, CLAUSE]))
    bad = forkserver.run(
        [sys.executable, "-m", "rnnstep.cli.generate", f"--weights={path}",
         "--prompt=ab", "--regex=(a"], capture_output=True, text=True, timeout=300,
        cwd=root, env=cli.ENV)
    self.assertEqual(bad.returncode, 2)
    lines = [line for line in bad.stderr.splitlines()
             if not cli.TF_NOISE.fullmatch(line)]
    self.assertLen(lines, 1)
    self.assertIn("--regex", lines[0])
    self.assertIn("'(a'", lines[0])



def test_word_vocabulary_tables_are_sized_and_bounded(monkeypatch):
  """At wikitext-2's 33,278 words, a stop or regex table is S x V int32
  (133 KB a state): typical lists and patterns take a few states, and one
  over the limit is refused in one line before its table is built."""
  import types  # pylint: disable=g-import-not-at-top
  from rnnstep.decoding import stopping  # pylint: disable=g-import-not-at-top
  from rnnstep.model import vocabulary  # pylint: disable=g-import-not-at-top
  size = 33278
  words = ["<eos>"] + [f"w{i}" for i in range(1, size)]
  tokens = vocabulary.Tokens("words", words, {"newline": "<eos>"})
  stops = stopping.token_automaton([b" w1 w2"], tokens.pieces)
  # The trie of " w1 w2": the start and one state per byte.
  assert stops.table.shape == (7, size) and stops.table.dtype == np.int32
  many = [f" w{i} w{i + 1} w{i + 2}".encode() for i in range(100, 160)]
  with pytest.raises(ValueError, match=r"^the stop strings need a table of "
                     r"\d+ states x 33278 tokens \(\d+ MiB\), more than the "
                     r"limit of 64 MiB; give fewer or shorter stop strings$"):
    stopping.token_automaton(many, tokens.pieces)
  model = types.SimpleNamespace(is_characters=False, tokens=tokens,
                                has_unk=False, vocab=tuple(words))
  even = "( w[0-9]*[02468]|\n)+"  # Even-numbered words and newlines.
  dfa = constraints.combine(model, [even])
  # FREE, DEAD and the pattern's 3 states found between whole tokens (a
  # word's inner states are pruned: no token boundary reaches them).
  assert dfa.table.shape == (2 + 3, size)
  monkeypatch.setattr(constraints, "MAX_TABLE_BYTES", 512 << 10)
  with pytest.raises(errors.ArgumentError, match=r"the patterns need a table "
                     r"of 5 states x 33278 tokens \(1 MiB\), more than the "
                     r"limit of 0 MiB"):
    constraints.combine(model, [even])
  # Compiling walks interegular's states before pruning (" w12 w4" has 7 of
  # them, inner ones included): bounded as well, refused before the walk.
  monkeypatch.setattr(constraints, "MAX_COMPILE_BYTES", 6 * size * 4)
  with pytest.raises(errors.ArgumentError, match=r"regex '\( w1 w4\)' has 7 "
                     r"DFA states before pruning, a table of 1 MiB over 33278 "
                     r"tokens to compile, more than the limit of 0 MiB"):
    constraints.combine(model, ["( w1 w4)"])

if __name__ == "__main__":
  tf.test.main()
