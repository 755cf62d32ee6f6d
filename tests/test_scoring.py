"""`rnnstep.loglikelihood` and `loglikelihood_rolling` against an independent
float64 numpy forward pass (tests/support/numpy_reference.py) of the same
weights, on a character model and a word model, on every path; `is_greedy`
against the reference's own greedy continuation; and `record_seed`."""

import numpy as np
import pytest

import rnnstep
from rnnstep import errors
from rnnstep.engine import paths
from rnnstep.engine import scoring
from rnnstep.engine import tuning_cache
from rnnstep.model import model_file
from tests.support import cli
from tests.support import numpy_reference as nr
from tests.support import token_models
from tests.support.tiers import quick_params

TOLERANCE = 1e-4  # Per pair, nats (issue 49).
# Contexts and continuations of many lengths: several length buckets.
CHAR_PAIRS = [("ROMEO:", " O"), ("To be, or ", "not to be"), ("K", "ING"),
              ("First Citizen:\n", "Before we proceed any further, hear me "
               "speak."), ("a", ""), ("Hark! ", "x" * 40), ("ab", "c")]
WORD_PAIRS = [("the cat", " sat on the mat"), ("a dog", " ran"),
              ("the", " cat\nthe dog ran on a mat"), ("dog", "")]


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
  path = tmp_path_factory.mktemp("scoring") / "chars.npz"
  cli.write_model(path, seed=3)
  return rnnstep.load(path), reference_of(path)


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
  path = token_models.write_words(tmp_path_factory.mktemp("scoring")
                                  / "words.npz")
  return rnnstep.load(path), reference_of(path)


def reference_of(path):
  return nr.Reference(*nr.tensors_of_file(model_file.read(str(path))))


def log_softmax(logits):
  peak = logits.max(-1, keepdims=True)
  return logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))


def expected(reference, context_ids, continuation_ids, window=0):
  """(logprob, is_greedy) of the continuation after the context, float64."""
  ids = np.concatenate([context_ids, continuation_ids]).astype(int)
  if not len(continuation_ids):
    return 0.0, True
  if window:  # Each position's logits after the last `window` ids alone.
    logits = np.stack([reference.logits(ids[max(0, t - window + 1):t + 1])[-1]
                       for t in range(len(ids) - 1)])
  else:
    logits = reference.logits(ids[:-1])
  positions = np.arange(len(context_ids) - 1, len(ids) - 1)
  logprob = log_softmax(logits)[positions, ids[positions + 1]].sum()
  greedy = all(logits[t].argmax() == ids[t + 1] for t in positions)
  return float(logprob), bool(greedy)


def check(got, want):
  assert len(got) == len(want)
  for (logprob, greedy), (want_logprob, want_greedy) in zip(got, want):
    assert isinstance(logprob, float) and isinstance(greedy, bool)
    assert abs(logprob - want_logprob) <= TOLERANCE, (logprob, want_logprob)
    assert greedy == want_greedy


@pytest.mark.parametrize("path", quick_params(paths.CONCRETE, paths.GRAPH))
def test_characters_match_the_float64_reference(char_model, path):
  model, reference = char_model
  # The reference's greedy continuations: is_greedy true; each with its
  # last character changed: false.
  greedy_pairs = []
  for context in ("ROMEO:", "To be", "Q"):
    ids = reference.greedy(model.encode(context), 9)
    text = model.decode(ids)
    other = model.decode([(ids[-1] + 1) % model.vocab_size])
    greedy_pairs += [(context, text), (context, text[:-1] + other)]
  pairs = CHAR_PAIRS + greedy_pairs
  texts = ["ROMEO: O", "To be, or not to be, that is the question", "x"]
  if path != paths.GRAPH:  # One width bucket: one XLA program each.
    pairs = [pair for pair in pairs if len("".join(pair)) <= 16]
    texts = [text for text in texts if len(text) <= 16]
  assert [expected(reference, model.encode(c), model.encode(x))[1]
          for c, x in greedy_pairs] == [True, False] * 3
  want = [expected(reference, model.encode(c), model.encode(x))
          for c, x in pairs]
  got = rnnstep.loglikelihood(model, pairs, jit_compile=paths.jit_compile_of(
      path))
  check(got, want)
  # The library's own greedy decoding agrees.
  assert rnnstep.generate(model, "ROMEO:", 9, temperature=0,
                          jit_compile=False) == greedy_pairs[0][1]
  # Rolling: every token after the first.
  rolling = rnnstep.loglikelihood_rolling(
      model, texts, jit_compile=paths.jit_compile_of(path))
  for text, value in zip(texts, rolling):
    ids = model.encode(text)
    want_value = expected(reference, ids[:1], ids[1:])[0]
    assert abs(value - want_value) <= TOLERANCE


def test_words_match_the_float64_reference(word_model):
  model, reference = word_model
  want = [expected(reference, model.encode(c),
                   model.encode(c + x)[len(model.encode(c)):])
          for c, x in WORD_PAIRS]
  check(rnnstep.loglikelihood(model, WORD_PAIRS, jit_compile=False), want)
  # A greedy word continuation, and a changed one.
  ids = reference.greedy(model.encode("the cat"), 6)
  pairs = [("the cat", model.decode(ids)),
           ("the cat", model.decode(ids[:-1] + [(ids[-1] + 1) % 256]))]
  got = rnnstep.loglikelihood(model, pairs, jit_compile=False)
  assert [g for _, g in got] == [True, False]
  check(got, [expected(reference, model.encode("the cat"), ids),
              expected(reference, model.encode("the cat"),
                       ids[:-1] + [(ids[-1] + 1) % 256])])


def test_windows_score_as_generation_sees_them(tmp_path):
  path = tmp_path / "window.npz"
  cli.write_model(path, seed=3, window=5)
  model, reference = rnnstep.load(path), reference_of(path)
  pairs = CHAR_PAIRS[:4]
  want = [expected(reference, model.encode(c), model.encode(x), window=5)
          for c, x in pairs]
  check(rnnstep.loglikelihood(model, pairs, jit_compile=False), want)


def test_one_trace_per_path_for_new_values(char_model):
  model, _ = char_model
  compiled = [scoring.function(model, paths.GRAPH, windowed=False),
              scoring.prefix_function(model, paths.GRAPH)]
  # A shared context runs once, in calls of its own (prefix_function).
  rnnstep.loglikelihood(model, [("ab", "cd"), ("ab", "c")], jit_compile=False)
  before = [f.experimental_get_tracing_count() for f in compiled]
  rnnstep.loglikelihood(model, CHAR_PAIRS + [("Who's there?", " Nay")] * 70,
                        jit_compile=False)
  rnnstep.loglikelihood_rolling(model, ["Long " * 50], jit_compile=False)
  assert [f.experimental_get_tracing_count() for f in compiled] == before


def test_batches_cut_by_length_and_memory():
  lengths = [3, 40, 5, 300, 4, 41]
  calls = scoring.batches(lengths, 65, xla=False)
  assert sorted(i for rows, _, _ in calls for i in rows) == list(range(6))
  for rows, width, batch in calls:
    assert width == max(lengths[i] for i in rows) and batch == len(rows)
  # Consecutive rows of the length order in even calls (no small remainder).
  lengths = [1 + i % 80 for i in range(2500)]
  calls = scoring.batches(lengths, 65, xla=False)
  assert [batch for _, _, batch in calls] == [834, 833, 833]
  assert [width for _, width, _ in calls] == [80, 54, 27]
  xla = scoring.batches([7] * 300, 65, xla=True)
  assert [(len(rows), width, batch) for rows, width, batch in xla] == [
      (256, 16, 256), (44, 16, 64)]
  # A large vocabulary, or wide outputs: fewer rows a call.
  wide = scoring.batches([100] * 10, 50_000, xla=False)
  assert max(batch for _, _, batch in wide) == scoring.LOGITS_PER_CALL // (
      100 * 50_000)
  wide = scoring.batches([100] * 2000, 65, xla=False, units=768)
  assert len(wide) == -(-2000 // (scoring.OUTPUTS_PER_CALL // (100 * 768)))


@pytest.mark.parametrize("call, message", [
    (lambda m: rnnstep.loglikelihood(m, []), "pairs must be a non-empty"),
    (lambda m: rnnstep.loglikelihood(m, [("a", "b", "c")]), "pairs[0] must"),
    (lambda m: rnnstep.loglikelihood(m, [("a", "b"), ("", "b")]),
     "pairs[1]: the context gives no tokens"),
    (lambda m: rnnstep.loglikelihood(m, [("a", "b€")]),
     "pairs[0]: character"),
    (lambda m: rnnstep.loglikelihood(m, [("a", "b")], jit_compile="fast"),
     "jit_compile"),
    (lambda m: rnnstep.loglikelihood_rolling(m, "abc"), "texts must be"),
    (lambda m: rnnstep.loglikelihood_rolling(m, ["ab", ""]),
     "texts[1] gives no tokens"),
])
def test_bad_arguments_are_one_line(char_model, call, message):
  with pytest.raises(errors.ArgumentError) as raised:
    call(char_model[0])
  assert message in str(raised.value) and "\n" not in str(raised.value)


def test_record_seed_is_splitmix64():
  # SplitMix64 from state 1234567: its first output is 6457827717110365317
  # (Vigna's splitmix64.c).
  assert rnnstep.record_seed(1234567, 0) == 6457827717110365317 >> 1
  seeds = [rnnstep.record_seed(-5, i) for i in range(1000)]
  assert len(set(seeds)) == 1000 and all(0 <= s < 2**63 for s in seeds)
  for bad in [(1.5, 0), (0, -1), (2**64, 0), (0, True)]:
    with pytest.raises(errors.ArgumentError):
      rnnstep.record_seed(*bad)


def test_bulk_batch_size_is_the_tuned_fastest(char_model, tmp_path,
                                               monkeypatch):
  model, _ = char_model
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(tmp_path))
  tuning_cache.reload()
  try:
    assert paths.bulk_batch_size(model) == paths.BULK_BATCH_SIZE
    # Rows a second at the fastest path: 64 rows in 300 ms beat 256 in 1,400
    # and 16 in 100; another model's and a server lane's entries are not
    # this job's.
    entries = {tuning_cache.cache_key(model, batch): {
        "path": "graph", "batch_size": batch,
        "ms_per_1000_steps": {"graph": ms, "xla": ms * 2}}
               for batch, ms in ((16, 100), (64, 300), (256, 1400))}
    entries[tuning_cache.cache_key(model, 128, lanes=2)] = {
        "path": "xla", "batch_size": 128, "ms_per_1000_steps": {"xla": 1}}
    tuning_cache.write(tuning_cache.cache_file(), entries)
    assert paths.bulk_batch_size(model) == 64
  finally:
    tuning_cache.reload()
