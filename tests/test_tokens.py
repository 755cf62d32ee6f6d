"""Token vocabularies (#34): words, bytes and subword models, end to end.

References are independent of rnnstep's numbers: the float64 numpy forward
(`tests/support/numpy_reference.py`) for greedy ids; Python's `str.find` on
the uncut text for where a stop string cuts; the finite language of a
pattern, enumerated, for the regex table; the `tokenizers` library's own
`decode` for subword text; and pytorch/examples word_language_model's own
model and loop (fixtures and reference outputs written by
tools/make_word_lm_fixtures.py with torch) and TensorFlow in Practice's
Keras `Tokenizer` recipe (tools/make_keras_word_fixtures.py) for the
readers.

All generation tests share one tiny architecture (Embedding(256, 8) ->
GRU(16) -> Dense(256)): a word, a byte and a subword model of 256 tokens
share their compiled programs.
"""

import functools
import itertools
import json
import os
import pathlib
import re

import numpy as np
import pytest

import rnnstep
from rnnstep import convert
from rnnstep import errors
from rnnstep.decoding import stopping
from rnnstep.model import model_file
from rnnstep.model import vocabulary
from tests.support import cli
from tests.support import decoding_reference
from tests.support import numpy_reference
from tests.support import token_models
from tests.support.tiers import quick_params

WORD_LM = pathlib.Path(__file__).parent / "data" / "word_lm"
KERAS_WORDS = pathlib.Path(__file__).parent / "data" / "keras_words"
TOKEN_TORCH = pathlib.Path(__file__).parent / "data" / "token_torch"
CONFIG = token_models.CONFIG
WORDS = token_models.WORDS


@pytest.fixture(scope="module")
def word_file(tmp_path_factory):
  return token_models.write_words(tmp_path_factory.mktemp("tokens")
                                  / "words.npz")


@pytest.fixture(scope="module")
def word_model(word_file):
  return rnnstep.load(word_file)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
  return rnnstep.load(token_models.write_bytes(
      tmp_path_factory.mktemp("tokens") / "bytes.npz"))


@pytest.fixture(scope="module")
def word_reference(word_file):
  return numpy_reference.Reference(
      *numpy_reference.tensors_of_file(model_file.read(word_file)))


def _train_bpe():
  return token_models.train_bpe(pytest.importorskip("tokenizers"))


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
  """`(tokenizer, trained tokens, model file)` of a subword model."""
  return token_models.write_bpe(tmp_path_factory.mktemp("tokens") / "bpe.npz",
                                pytest.importorskip("tokenizers"))


def _words_of(text):
  """A word model's text read back as words (its newline is `<eos>`)."""
  return text.replace("\n", " <eos> ").split()


def _word_text(ids):
  """The word model's continuation text, as word_language_model prints it
  (written here from the recipe, not from rnnstep's pieces)."""
  return "".join("\n" if WORDS[i] == "<eos>" else " " + WORDS[i]
                 for i in ids)


def _cut(text, stops):
  """`text` cut at the end of the first stop string in it (str.find)."""
  ends = [text.find(s) + len(s) for s in stops if s in text]
  return text[:min(ends)] if ends else text


# ------------------------------------------------------------ vocabularies


def test_word_rules_split_as_the_recipes_do():
  lm = vocabulary.Tokens("words", ["<eos>", "a", "b"], {"newline": "<eos>"})
  # word_language_model: whitespace split, <eos> per line end.
  assert lm.encode("a  b\nb\n").tolist() == [1, 2, 0, 2, 0]
  keras = vocabulary.Tokens(
      "words", ["[pad]", "<oov>", "hello", "world"],
      {"lower": True, "filters": "!,\n", "split": " ", "oov": "<oov>"})
  # Keras Tokenizer: lowercased, filters removed, the OOV token for the rest.
  assert keras.encode("Hello, World!\nthere").tolist() == [2, 3, 1]
  with pytest.raises(ValueError, match=r"^word 'c' is not in the model's "
                     "vocabulary") as e:
    lm.encode("a c")
  assert "\n" not in str(e.value)
  assert lm.decode([1, 2, 0, 1]) == " a b\n a"
  # Several: the first five distinct ones, then how many more; one line.
  with pytest.raises(ValueError, match=r"^words 'c', 'd', 'e', 'f', 'g' and "
                     r"2 more are not in the model's vocabulary \(which has "
                     r"no out-of-vocabulary token\); remove or replace them$"):
    lm.encode("a c d c e f\ng h i")
  # A file converted before #34 records the rule "unknown": "drop" for a
  # Keras Tokenizer without oov_token: it loads, refuses the same, and the
  # rule is not written again.
  old = vocabulary.Tokens.from_json(
      {"kind": "words", "lower": True, "filters": "!", "split": " ",
       "oov": None, "unknown": "drop"}, ["[UNK]", "hello"], "old.npz")
  with pytest.raises(ValueError, match=r"^word 'zebra' is not in the model's"):
    old.encode("Hello zebra!")
  assert "unknown" not in old.to_json() and "unknown" not in old.file_json()


def test_bad_tokens_rules_are_refused_in_one_line():
  for kind, vocab, rules, match in [
      ("sentences", ["a"], {}, "kind 'sentences' is unknown"),
      ("words", ["a"], {"stem": True}, r"rules \['stem'\] are unknown"),
      ("words", ["a"], {"oov": "<unk>"}, "names '<unk>', which is not"),
      ("bytes", ["a"], {}, "must be the 256 bytes"),
      ("subword", ["a"], {"tokenizer": "{"}, "does not load")]:
    with pytest.raises(ValueError, match=match) as e:
      vocabulary.Tokens(kind, vocab, rules, "m.npz")
    assert str(e.value).startswith("m.npz: ") and "\n" not in str(e.value)


def test_bytes_stream_never_splits_a_character():
  tokens = vocabulary.Tokens("bytes", vocabulary.bytes_vocab())
  text = "naïve 漢字 ok 😀!"
  ids = tokens.encode(text)
  assert len(ids) == len(text.encode("utf-8"))
  for size in (1, 2, 3):
    stream = tokens.stream()
    chunks = [stream.push(ids[i:i + size]) for i in range(0, len(ids), size)]
    assert "".join(chunks) + stream.finish() == text
    assert all("\ufffd" not in c for c in chunks)
  # Cut off inside a character: it reads as U+FFFD, once, at the end.
  assert tokens.text(ids[:-2]) == text[:-2] + "\ufffd"


def test_stop_cut_is_exact_and_spans_chunks():
  tokens = vocabulary.Tokens("words", WORDS, {"newline": "<eos>"})
  ids = tokens.encode("the cat sat\non the mat")
  full = tokens.decode(ids)
  for stop in ["t s", "at\n o", "mat", "he c"]:
    end = full.find(stop) + len(stop)
    assert tokens.text(ids, [stop]) == full[:end]
    stream = tokens.stream([stop])
    assert "".join(stream.push([i]) for i in ids) == full[:end]


def test_stop_table_matches_a_search_of_the_text():
  """The [S, V] table over token pieces ends a row exactly at the first token
  whose text completes a stop string (found here by str.find)."""
  tokens = vocabulary.Tokens("words", WORDS[:9], {"newline": "<eos>"})
  stops = ["t s", "at\n", "dog ran", "a"]
  automaton = stopping.token_automaton([s.encode() for s in stops],
                                       tokens.pieces)
  rng = np.random.default_rng(0)
  for _ in range(300):
    ids = rng.integers(1, 9, size=6)
    ids[rng.random(6) < 0.2] = 0
    state, ended = 0, None
    for t, token in enumerate(ids):
      state = automaton.table[state, token]
      if automaton.accept[state]:
        ended = t
        break
    text, expected = "", None
    for t, token in enumerate(ids):
      text += tokens.pieces[token].decode()
      if any(s in text for s in stops):
        expected = t
        break
    assert ended == expected, (ids, text)


def _random_stops(rng, alphabet, count):
  """Up to `count` stop strings over `alphabet`, with repeats and prefixes
  of one another (states the automaton shares)."""
  stops = ["".join(rng.choice(list(alphabet), rng.integers(1, 7)))
           for _ in range(rng.integers(0, count + 1))]
  if stops and rng.random() < 0.4:
    stops.append(stops[0][:max(1, len(stops[0]) // 2)])
  if stops and rng.random() < 0.3:
    stops.append(stops[-1])
  return stops


def _graph_stops(model):
  """The SavedModel's stop tables of `model`, as a traced function."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rnnstep.exporters import saved_model  # pylint: disable=g-import-not-at-top
  module = saved_model.ServingModule(model)
  return module.stops, tf.function(
      lambda stops: module.stops.automaton(stops)[0], autograph=False,
      input_signature=[tf.TensorSpec([None], tf.string)])


def test_served_stop_automaton_is_the_host_s(word_model, byte_model):
  """The SavedModel builds the stop automaton in graph ops from the strings;
  its tables equal the host's (`host.stop_automaton`), state for state, for
  characters (over ids), words and bytes (over each token's bytes)."""
  from rnnstep.engine import host  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  for model, alphabet in ((rnnstep.load(), "the cat:\nROME!"),
                          (word_model, "the cat\nsw1"),
                          (byte_model, "ab é\n\x01")):
    _, automaton = _graph_stops(model)
    for _ in range(25):
      stops = _random_stops(rng, alphabet, 4)
      got = automaton([s.encode() for s in stops] or np.zeros([0], bytes))
      want = host.stop_automaton(model, stops)
      np.testing.assert_array_equal(got.table.numpy(), want.table, str(stops))
      np.testing.assert_array_equal(got.accept.numpy(), want.accept)


def test_served_stop_table_over_its_limit_fails_the_call(word_model,
                                                        monkeypatch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(stopping, "MAX_TABLE_BYTES", 3100)
  _, automaton = _graph_stops(word_model)
  automaton([b"at"])  # 3 states x 256 tokens x 4 bytes fit; 4 states not.
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"stop: the stop "
                     r"strings need a table of\] \[4\] \[states x\] \[256"):
    automaton([b"abc"])


def test_served_stop_cut_is_str_find_s(word_model):
  """The SavedModel cuts a token row's text where `str.find` finds the first
  stop string's end, the row ending (as on device) at the token it ends in."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tables, automaton = _graph_stops(word_model)
  pieces = word_model.tokens.pieces
  rng = np.random.default_rng(6)
  for _ in range(30):
    stops = _random_stops(rng, "the cat\nsw1", 3) or ["at"]
    table = automaton([s.encode() for s in stops])
    ids = rng.integers(0, 9, size=[4, 8])
    ids[rng.random(ids.shape) < 0.3] = 0
    lengths = []
    for row in ids:  # The device's end: the token a stop ends in.
      state, length = 0, len(row)
      for t, token in enumerate(row):
        state = int(table.table[state, token])
        if table.accept[state]:
          length = t + 1
          break
      lengths.append(length)
    joined = [b"".join(pieces[i] for i in row[:n])
              for row, n in zip(ids, lengths)]
    got = tables.cut(tf.constant(joined), tf.constant(ids, tf.int32),
                     tf.constant(lengths, tf.int32), tf.constant(stops))
    want = [_cut(text.decode(), stops) for text in joined]
    assert [t.decode() for t in got.numpy()] == want, stops


def test_stop_strings_over_their_length_limit_are_refused(word_model):
  # The bound that keeps the served graph's automaton build small.
  with pytest.raises(errors.ArgumentError, match=r"^the stop strings are "
                     r"4097 bytes of UTF-8 together, more than the limit of "
                     r"4096; give fewer or shorter ones$"):
    rnnstep.generate(word_model, ["the"], 1, stop=["cat " * 1023, "abc", "é"])


def test_stop_table_over_its_limit_is_refused(monkeypatch):
  monkeypatch.setattr(stopping, "MAX_TABLE_BYTES", 1000)
  with pytest.raises(ValueError, match=r"^the stop strings need a table of "
                     r"4 states x 256 tokens \(0 MiB\), more than"):
    stopping.token_automaton([b"abc"], [bytes([b]) for b in range(256)])


def test_model_file_versions(tmp_path, word_file):
  # A character model is still format 1, with no tokens member.
  chars = [chr(c) for c in range(32, 32 + 256)]
  model_file.write(tmp_path / "c.npz", CONFIG, chars, token_models.tensors(1))
  with np.load(tmp_path / "c.npz") as z:
    assert int(z["format_version"]) == 1 and "tokens" not in z.files
  with np.load(word_file) as z:
    members = dict(z)
  assert int(members["format_version"]) == 2
  assert json.loads(str(members["tokens"])) == {"kind": "words",
                                                "newline": "<eos>"}
  read = model_file.read(word_file)
  assert read.tokens.kind == "words" and read.vocab == WORDS
  # A format 1 file has no tokens member; a format 2 file needs one.
  for version, drop, match in [(1, None, "vocab entry 0 is '<eos>'"),
                               (2, "tokens", "missing tokens")]:
    bad = dict(members, format_version=np.int64(version))
    bad.pop(drop, None)
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match=match):
      model_file.read(tmp_path / "bad.npz")


def test_regex_over_tokens_against_its_enumerated_language():
  """A token is allowed iff some string of the pattern's (finite) language
  starts with the text so far plus the token's piece."""
  from rnnstep.decoding import constraints  # pylint: disable=g-import-not-at-top

  class Model:  # What `constraints.combine` reads of a model.
    tokens = vocabulary.Tokens("words", WORDS[:9] + ["ca", "t"],
                               {"newline": "<eos>"})
    vocab, has_unk, is_characters = tokens.vocab, False, False

  pattern = r"( (cat|dog|ca))( (sat|ran)t?){1,2}\n"
  language = ["".join(p) for n in (1, 2) for p in itertools.product(
      [" cat", " dog", " ca"], *[[" sat", " ran", " satt", " rant"]] * n,
      ["\n"])]
  dfa = constraints.combine(Model, [pattern])
  pieces = [p.decode() for p in Model.tokens.pieces]
  frontier = [("", int(dfa.start[0]))]
  for _ in range(4):
    nxt = []
    for text, state in frontier:
      for v, piece in enumerate(pieces):
        allowed = dfa.table[state, v] != constraints.DEAD
        assert allowed == any(s.startswith(text + piece) for s in language), (
            text, piece)
        if allowed:
          nxt.append((text + piece, int(dfa.table[state, v])))
          assert dfa.ends[dfa.table[state, v]] == (text + piece in language)
    frontier = nxt


# -------------------------------------------------------------- generation


def test_word_model_generates_words(word_model, word_file):
  prompt = "the cat\nsat"
  ids = word_model.encode(prompt)
  reference = numpy_reference.Reference(
      *numpy_reference.tensors_of_file(model_file.read(word_file)))
  expected = [WORDS[i] for i in reference.greedy(ids, 12)]
  text = rnnstep.generate(word_model, prompt, 12, temperature=0.0,
                          jit_compile=False)
  assert _words_of(text) == expected
  # A stop string spanning tokens: the text is cut exactly at its end.
  stop = expected[3][1:] + (" " if expected[4] != "<eos>" else "\n")
  end = text.find(stop) + len(stop)
  cut = rnnstep.generate(word_model, [prompt] * 2, 12, temperature=0.0,
                         stop=[stop], jit_compile=False)
  assert cut == [text[:end]] * 2
  chunks = list(rnnstep.stream(word_model, prompt, 12, temperature=0.0,
                               chunk_size=5, stop=stop, jit_compile=False))
  assert "".join(chunks) == text[:end]


@pytest.mark.slow
def test_byte_model_streams_whole_characters(byte_model):
  text = rnnstep.generate(byte_model, "héllo", 40, seed=5, jit_compile=False)
  chunks = list(rnnstep.stream(byte_model, "héllo", 40, seed=5, chunk_size=3,
                               jit_compile=False))
  assert "".join(chunks) == text
  # Chunks are whole UTF-8: no U+FFFD but where the bytes are not UTF-8.
  assert sum(c.count("\ufffd") for c in chunks) == text.count("\ufffd")
  assert rnnstep.generate(byte_model, "é", 0) == ""
  # A pattern's non-ASCII characters: refused in one line saying why.
  with pytest.raises(errors.ArgumentError, match=r"regex 'caf\u00e9' matches "
                     r"no string over the model's vocabulary; its non-ASCII "
                     r"characters are split over tokens \(bytes\)"):
    rnnstep.generate(byte_model, "a", 4, regex="caf\u00e9")


@pytest.mark.slow
def test_xla_and_elementwise_give_the_graph_text(word_model):
  """The token tables are host-side inputs of the unchanged compiled loops:
  an XLA and an elementwise run with a stop string spanning words and a
  pattern check that they go through as a character model's do
  (tests/test_paths.py compares every path on character models)."""
  prompts, pattern = ["the cat", "a dog ran"], r"( [a-z]+)+"
  free = rnnstep.generate(word_model, prompts, 8, seed=7, regex=pattern,
                          repetition_penalty=1.3, jit_compile=False)
  assert all(re.fullmatch(pattern, text) for text in free), free
  stop = free[1][4:7]  # Spans words or ends inside one.
  texts = [rnnstep.generate(word_model, prompts, 8, seed=7, regex=pattern,
                            repetition_penalty=1.3, stop=stop,
                            jit_compile=jit)
           for jit in (False, True, "elementwise")]
  assert texts[0] == texts[1] == texts[2]
  assert texts[0][1] == free[1][:free[1].find(stop) + len(stop)]


# -------------------------------------------------- word_language_model


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lstm", "gru", "rnn_tanh", "rnn_relu",
                                  "lstm_tied"])
def test_word_language_model_matches_the_recipe(name):
  reference = np.load(WORD_LM / "reference.npz")
  model = rnnstep.load(WORD_LM / f"{name}.pt", corpus=WORD_LM / "corpus")
  assert model.vocab == tuple(json.loads((WORD_LM / "vocab.json").read_text()))
  logits = np.asarray(rnnstep.logits(model, [reference["ids"]]))[0]
  log_probs = logits - np.log(np.exp(
      logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)
                              ) - logits.max(-1, keepdims=True)
  np.testing.assert_allclose(log_probs, reference[f"{name}_logp"], atol=2e-5)
  text = rnnstep.generate(model, "the cat", 30, temperature=0.0,
                          jit_compile=False)
  assert _words_of(text) == str(reference[f"{name}_greedy"]).split()
  if name.startswith("rnn_"):  # nn.RNN's nonlinearity picks the kind.
    assert model.config.layers[0].kind == (
        "simple_rnn_relu" if name == "rnn_relu" else "simple_rnn")


@pytest.mark.slow
def test_word_language_model_converts(tmp_path):
  out = tmp_path / "gru.npz"
  summary = convert.convert(WORD_LM / "gru.pt", out,
                            vocab=WORD_LM / "vocab.json")
  assert "13 words" in str(summary)
  assert "characters" not in str(summary)  # Its ids are words.
  model = rnnstep.load(out)
  assert model.tokens.kind == "words"
  assert model.tokens.rules == {"newline": "<eos>"}
  result = cli.run_binary(
      cli.command("rnnstep-generate", "rnnstep.cli.generate"),
      [f"--weights={out}", "--prompt=the cat", "--num_steps=8",
       "--temperature=0"])
  reference = np.load(WORD_LM / "reference.npz")
  # The command line prints the prompt, the text and a line end.
  assert _words_of(cli.ok(result)[:-1]) == (
      ["the", "cat"] + str(reference["gru_greedy"]).split()[:8])


# ------------------------------------------------------------------ subword


@pytest.mark.slow
def test_subword_model_decodes_as_its_tokenizer(bpe_file):
  bpe, trained, path = bpe_file
  model = rnnstep.load(path)
  prompt = "the cat sat"
  assert model.encode(prompt).tolist() == bpe.encode(prompt).ids
  rng = np.random.default_rng(2)
  ids = [int(i) for i in rng.integers(0, trained, 200)]
  assert model.decode(ids) == bpe.decode(ids)
  # Greedy ids from the numpy forward, decoded by the library after the
  # prompt: rnnstep's text is what the library prints.
  prompt_ids = bpe.encode(prompt).ids
  reference = numpy_reference.Reference(*numpy_reference.tensors_of_file(
      model_file.read(path)))
  expected = bpe.decode(prompt_ids + reference.greedy(prompt_ids, 24))
  assert expected.startswith(prompt)
  generated = rnnstep.generate(model, prompt, 24, temperature=0.0,
                               jit_compile=False)
  assert prompt + generated == expected
  stop = generated[5:8]
  cut = rnnstep.generate(model, prompt, 24, temperature=0.0, stop=stop,
                         jit_compile=False)
  assert cut == generated[:generated.find(stop) + len(stop)]


def test_subword_pieces_continue_text_as_the_tokenizer_decodes():
  """A Metaspace BPE (sentencepiece's form: a lone "▁" token decodes to
  nothing alone, to a space after another token) and a WordPiece ("##"):
  a prompt's text plus the pieces of random ids is `decode(prompt + ids)`."""
  import random  # pylint: disable=g-import-not-at-top
  tokenizers = pytest.importorskip("tokenizers")
  text = ("Très bien, merci! 北京 are cities. The naïve señor ate "
          "jalapeños 🌶️ at the café. I'm sure you don't.\n") * 3
  metaspace = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
  metaspace.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
  metaspace.decoder = tokenizers.decoders.Metaspace()
  metaspace.train_from_iterator([text], tokenizers.trainers.BpeTrainer(
      vocab_size=90, special_tokens=["<unk>"]))
  wordpiece = tokenizers.Tokenizer(tokenizers.models.WordPiece(
      unk_token="[UNK]"))
  wordpiece.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  wordpiece.decoder = tokenizers.decoders.WordPiece()
  wordpiece.train_from_iterator([text], tokenizers.trainers.WordPieceTrainer(
      vocab_size=90, special_tokens=["[UNK]"]))
  rng = random.Random(0)
  for tokenizer in (metaspace, wordpiece):
    size = tokenizer.get_vocab_size()
    tokens = vocabulary.Tokens(
        "subword", [tokenizer.id_to_token(i) for i in range(size)],
        {"tokenizer": tokenizer.to_str()})
    prompt = tokenizer.encode("The naïve").ids
    for _ in range(200):
      ids = [rng.randrange(size) for _ in range(rng.randint(1, 6))]
      assert "The naïve" + tokens.text(ids) == tokenizer.decode(
          prompt + ids), [tokenizer.id_to_token(i) for i in ids]


# ------------------------------------------------------ beams and strategy


def _check_beams(model, reference, prompts, text_of, num_steps, jit, *,
                 stop=(), regex=None, allowed=None, complete=None,
                 **decoding):
  """Every returned beam (text and score) against the brute-force beam
  search of tests/support/decoding_reference.py over the float64 forward.

  The reference knows a token model's stop strings and pattern only through
  `text_of` (ids -> the continuation's text, written independently of
  rnnstep's pieces): a hypothesis stops once its text holds a stop string,
  `allowed(text)` says whether a text stays inside the pattern, and
  `complete(ids)` whether a match can go on.
  """
  beams = 3
  texts, scores = rnnstep.generate(
      model, prompts, num_steps, num_beams=beams, num_return_sequences=beams,
      return_scores=True, jit_compile=jit, stop=list(stop), regex=regex,
      **decoding)
  for prompt, got_texts, got_scores in zip(prompts, texts, scores):
    want = decoding_reference.beam_search(
        reference, model.encode(prompt), num_steps, beams,
        stopped=lambda ids: any(s in text_of(ids) for s in stop),
        allowed=allowed and (lambda ids: allowed(text_of(ids))),
        complete=complete,
        length_penalty=decoding.get("length_penalty", 1.0),
        theta=decoding.get("repetition_penalty", 1.0),
        ngram=decoding.get("no_repeat_ngram_size", 0))
    assert got_texts == [_cut(text_of(ids), stop) for ids, _, _ in want], (
        prompt, got_texts)
    for (_, _, raw), score in zip(want, got_scores):
      assert abs(score - raw) < 1e-3, (prompt, score, raw)
  return texts


# Every path: the graph's, the elementwise path (the other loop's order) and
# XLA (the graph's loop as one program; a few seconds of compiling here).
@pytest.mark.parametrize("jit", quick_params([False, "elementwise", True], False))
def test_beams_on_a_word_model_match_the_reference(word_model, word_reference,
                                                   jit):
  prompts = ["the cat", "a dog ran"]
  # Stop strings that span two words (" w139 w46", " w105 w101" start the
  # best beams), penalties and a length penalty.
  texts = _check_beams(word_model, word_reference, prompts, _word_text, 10,
                       jit, stop=["9 w4", "5 w1"], repetition_penalty=1.3,
                       no_repeat_ngram_size=2, length_penalty=0.8)
  assert any(t.endswith(("9 w4", "5 w1")) for row in texts for t in row)
  # A pattern of one to four words, which ends a hypothesis at four, with a
  # stop string spanning words.
  pattern = re.compile(r"( [a-z]+){1,4}")
  allowed = lambda text: pattern.fullmatch(text) is not None
  texts = _check_beams(
      word_model, word_reference, prompts, _word_text, 8, jit,
      stop=["t t"], regex=pattern.pattern, allowed=allowed,
      complete=lambda ids: len(ids) == 4, repetition_penalty=1.5)
  assert all(allowed(t) or t.endswith("t t") for row in texts for t in row)


@pytest.mark.slow
def test_beams_on_a_bpe_model_match_the_reference(bpe_file):
  bpe, _, path = bpe_file
  model = rnnstep.load(path)
  reference = numpy_reference.Reference(*numpy_reference.tensors_of_file(
      model_file.read(path)))
  text_of = bpe.decode  # The tokenizers library's own decoding.
  prompts = ["the cat", "a dog"]
  # Letters and spaces only (every prefix is a match): the text is the
  # trained merges', and stop strings can span tokens.
  pattern = re.compile(r"[a-z ]+")
  texts = _check_beams(
      model, reference, prompts, text_of, 12, False, stop=["t m", "c a"],
      regex=pattern.pattern,
      allowed=lambda text: pattern.fullmatch(text) is not None,
      repetition_penalty=1.3, no_repeat_ngram_size=3)
  assert any(t.endswith(("t m", "c a")) for row in texts for t in row), texts


# Two logical CPUs (set before TensorFlow starts): a word and a BPE model,
# sampled with stop strings spanning tokens, a pattern and the look-back
# rules, and beams, split over a MirroredStrategy's replicas; each text must
# equal the one-device text (README "Reproducibility").
STRATEGY_SCRIPT = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import rnnstep
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
runs = json.loads(sys.argv[1])
out = []
for path, prompts, jit, kwargs in runs:
  model = rnnstep.load(path)
  one = rnnstep.generate(model, prompts, 16, jit_compile=jit, **kwargs)
  two = rnnstep.generate(model, prompts, 16, jit_compile=jit,
                         strategy=strategy, **kwargs)
  out.append([one, two])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_strategy_on_token_models_equals_one_device(word_file, bpe_file):
  sampled = dict(seed=5, stop=["t t", "5 w", "at"], regex=r"[a-z0-9 ]+",
                 repetition_penalty=1.3, no_repeat_ngram_size=2)
  beams = dict(num_beams=3, num_return_sequences=2, stop=["9 w4", "t t"])
  # Three prompts over two replicas: the last replica gets a padding row.
  # The graph path: the token tables are host-side inputs of the loops that
  # tests/test_distribute.py splits over replicas on every path.
  runs = [(path, prompts, False, kwargs)
          for path, prompts in ((word_file, ["the cat", "a dog ran", "on"]),
                                (bpe_file[2], ["the cat", "a dog", "on the"]))
          for kwargs in (sampled, beams)]
  results = cli.run_script(STRATEGY_SCRIPT, json.dumps(runs))
  for (path, _, _, kwargs), (one, two) in zip(runs, results, strict=True):
    assert one == two, (path, kwargs, one, two)
  # The stop strings cut some rows (the runs test what they claim to).
  assert any(t.endswith(("t t", "5 w", "at")) for one, _ in results[::2]
             for t in one)


# ------------------------------------------------------- inspect, exports


@pytest.mark.slow
def test_inspect_shows_tokens(word_model):
  from rnnstep.inspect import analysis  # pylint: disable=g-import-not-at-top
  from rnnstep.inspect import page  # pylint: disable=g-import-not-at-top
  result = analysis.analyze(word_model, "the cat\nsat", num_neurons=2)
  assert result.text == (" the", " cat", "\n", " sat")
  assert result.features["newline"].tolist() == [0, 0, 1, 0]
  assert set(result.top_chars(0)) <= {" " + w for w in WORDS[1:]} | {"\n"}
  assert '"text":[" the"," cat","\\n"," sat"]' in page.render(result, "w")


# The rule sets the graph's tokenizer must follow as `Tokens.encode` does:
# word_language_model's newline token, Keras Tokenizer rules (lower, filters,
# a separator, the OOV token), whitespace splitting with Python's wider
# whitespace, and all of them together.
GRAPH_RULES = [
    (WORDS, {"newline": "<eos>"}),
    (["[UNK]", "<oov>", "the", "cat", "café", "i̇x", "a\\b", "ας"],
     {"lower": True, "filters": "!,.\n\t<>", "split": " ", "oov": "<oov>"}),
    (["[UNK]", "<oov>", "the", "cat", "café"],
     {"lower": False, "filters": "!,", "split": "\\", "oov": "<oov>"}),
    (["<oov>", "the", "cat", "CAT", "\x85x"],
     {"filters": "", "split": None, "oov": "<oov>"}),
    (["<eos>", "the", "cat", "dog"],
     {"newline": "<eos>", "lower": True, "filters": "!\n", "split": None}),
    (["", "[UNK]", "the", "cat", "café", "ΑΣ"],
     {"text_vectorization": {"standardize": "lower_and_strip_punctuation",
                             "split": "whitespace"}, "oov": "[UNK]"}),
    (["", "[UNK]", "t", "h", "e", "C", "é", "\u3000"],
     {"text_vectorization": {"standardize": "strip_punctuation",
                             "split": "character"}, "oov": "[UNK]"}),
    # Keras `Tokenizer(char_level=True)`: lowered, then each character.
    (["[UNK]", "~", "t", "h", "e", " ", "c", "a", "é", "i", "\u0307", "σ"],
     {"char_level": True, "lower": True, "oov": "~"}),
]


@pytest.mark.slow  # The SavedModel's graph tokenizer (an export's part).
def test_graph_tokenizer_encodes_and_decodes_as_the_host():
  """The SavedModel's string signatures tokenize with graph ops
  (`token_ops.GraphTokens`): random texts over cased, accented, Greek
  final-sigma, filtered, backslash and Unicode-whitespace characters give
  `Tokens.encode`'s ids, or fail where it raises; random ids decode to
  `Tokens.text`, U+FFFD included."""
  import random  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rnnstep.exporters import token_ops  # pylint: disable=g-import-not-at-top
  alphabet = list("the cat CAT Café ÇAFÉ İX ΑΣ,.!\n\t\\<>") + [
      "\x85", "\u3000", "\x1c", "<eos>", "dog", "  "]
  rng = random.Random(0)
  refused = 0
  for vocab, rules in GRAPH_RULES + [(None, None)]:
    tokens = (vocabulary.Tokens("bytes", vocabulary.bytes_vocab())
              if vocab is None else vocabulary.Tokens("words", vocab, rules))
    graph = token_ops.GraphTokens(tokens)
    encode = tf.function(lambda p, graph=graph: graph.encode(p)[0].to_tensor(-9),
                         input_signature=[tf.TensorSpec([None], tf.string)])
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
             for _ in range(300)]
    good, bad = [], []
    for text in texts:
      try:
        good.append((text, tokens.encode(text).tolist()))
      except ValueError:
        bad.append(text)
    good, empty = ([g for g in good if g[1]], [t for t, i in good if not i])
    got = encode(tf.constant([t for t, _ in good])).numpy()
    for (text, want), row in zip(good, got):
      assert [i for i in row.tolist() if i != -9] == want, (rules, text)
    for text in (bad + empty)[:5]:  # Refused as the host refuses them.
      with pytest.raises(tf.errors.InvalidArgumentError):
        encode(tf.constant([text]))
      refused += 1
    if rules is not None and "oov" not in rules:  # Named, as the host does.
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=re.escape(token_ops.UNKNOWN_WORD)
                         + r"\] \[zebra unicorn\]"):
        encode(tf.constant(["the zebra cat\nunicorn zebra", "the cat"]))
    ids = np.random.default_rng(0).integers(0, len(tokens.vocab), [40, 7])
    lengths = np.random.default_rng(1).integers(0, 8, [40])
    texts = graph.decode(ids.astype(np.int32), lengths.astype(np.int32))
    assert [t.decode() for t in texts.numpy()] == [
        tokens.text(row[:n]) for row, n in zip(ids, lengths)]
  assert refused >= 5  # Unknown words without an OOV token, no words.


# Serves token models' exports where rnnstep cannot be imported: strings in
# and out for a word model, ids in (encoded by the tokenizers library from
# the export's own tokenizer.json) for a subword model.
SERVE_SCRIPT = r"""
import json, os, sys
for name in ("rnnstep", "keras", "tf_keras"):
  sys.modules[name] = None
import tensorflow as tf
words_dir, bpe_dir, options, dtypes, constrained = json.loads(sys.argv[1])
def decoding(**kwargs):
  return {k: tf.constant(v, dtypes[k]) for k, v in dict(options, **kwargs).items()}
out = {}
words = tf.saved_model.load(words_dir)
prompts = tf.constant(["the cat\nsat", "a dog ran", "on"])
steps = tf.constant(12)
texts = lambda t: [x.decode() for x in t.numpy()]
out["signatures"] = sorted(words.signatures)
out["greedy"] = texts(words.signatures["serving_default"](
    prompts=prompts, num_steps=steps, temperature=tf.constant(0.0),
    seed=tf.constant(0, tf.int64))["text"])
penalized = words.signatures["generate_decoding"](
    prompts=prompts, num_steps=steps, **decoding(
        temperature=0.9, seed=3, repetition_penalty=1.4, no_repeat_ngram_size=2))
out["penalized"] = [texts(penalized["text"]), penalized["logprob"].numpy().tolist()]
out["beams"] = texts(words.signatures["generate_decoding"](
    prompts=prompts, num_steps=steps, **decoding(num_beams=3))["text"])
vocab = json.load(open(os.path.join(words_dir, "assets", "tokens.json")))
ids = words.signatures["generate_ids"](
    prompt_ids=tf.constant([[vocab["vocab"].index("a"),
                             vocab["vocab"].index("dog")]]),
    prompt_lengths=tf.constant([2]), num_steps=steps, **decoding(seed=7))
out["ids"] = [ids["ids"].numpy().tolist(), texts(ids["text"])]
def constraints(stop, regex):
  return dict(stop=tf.constant(stop, tf.string, [len(stop)]),
              regex=tf.constant(regex))
out["constrained"] = []
for case, stop, regex in constrained["words"]:
  got = words.signatures["generate_constrained"](
      prompts=prompts, num_steps=steps, **decoding(**case),
      **constraints(stop, regex))
  out["constrained"].append([texts(got["text"]),
                             got["logprob"].numpy().tolist()])
try:
  words.signatures["serving_default"](
      prompts=tf.constant(["the zebra"]), num_steps=steps,
      temperature=tf.constant(1.0), seed=tf.constant(1, tf.int64))
  out["error"] = None
except tf.errors.InvalidArgumentError as e:
  out["error"] = e.message
import tokenizers
bpe = tokenizers.Tokenizer.from_file(os.path.join(bpe_dir, "assets",
                                                  "tokenizer.json"))
encoded = [bpe.encode(p).ids for p in ["the cat sat", "a dog"]]
width = max(map(len, encoded))
loaded = tf.saved_model.load(bpe_dir)
out["bpe_signatures"] = sorted(loaded.signatures)
served = loaded.signatures["serving_default"]
got = served(prompt_ids=tf.constant([e + [0] * (width - len(e)) for e in encoded]),
             prompt_lengths=tf.constant([len(e) for e in encoded]),
             num_steps=steps, **decoding(seed=2, top_k=20))
out["bpe"] = [texts(got["text"]), [bpe.decode(row) for row in got["ids"].numpy().tolist()]]
out["bpe_constrained"] = []
for case, stop, regex in constrained["bpe"]:
  got = loaded.signatures["generate_ids_constrained"](
      prompt_ids=tf.constant([e + [0] * (width - len(e)) for e in encoded]),
      prompt_lengths=tf.constant([len(e) for e in encoded]),
      num_steps=steps, **decoding(**case), **constraints(stop, regex))
  out["bpe_constrained"].append([texts(got["text"]),
                                 got["logprob"].numpy().tolist()])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_saved_model_serves_token_models_without_rnnstep(word_model, bpe_file,
                                                         tmp_path):
  """A word model strings in and out (a byte model's graph ops are the
  graph tokenizer test's), a subword model ids in."""
  from tests import test_saved_model as sm  # pylint: disable=g-import-not-at-top
  bpe_model = rnnstep.load(bpe_file[2])
  dirs = [str(tmp_path / name) for name in ("words", "bpe")]
  patterns = {"words": "( (the|a|cat|dog|sat|on|mat|ran|w[0-9]))+",
              "bpe": "[a-z ]+[.]"}
  for model, export_dir, name in zip((word_model, bpe_model), dirs,
                                     patterns):
    rnnstep.export(model, export_dir, regex=patterns[name])
  prompts = ["the cat\nsat", "a dog ran", "on"]
  bpe_prompts = ["the cat sat", "a dog"]
  library = functools.partial(rnnstep.generate, word_model, prompts, 12,
                              jit_compile=False)
  bpe_library = functools.partial(rnnstep.generate, bpe_model, bpe_prompts,
                                  12, jit_compile=False)
  # Stop strings spanning tokens, from each row's own sampled text (so that
  # each row meets one): sampled with penalties, then with the pattern, and
  # with beams and the pattern.
  sampled = dict(temperature=0.9, seed=3, repetition_penalty=1.3,
                 no_repeat_ngram_size=2)
  constrained = {}
  for name, generate in (("words", library), ("bpe", bpe_library)):
    stops = [text[len(text) // 2 - 1:len(text) // 2 + 2]
             for text in generate(**sampled)]
    constrained[name] = [[sampled, stops, ""],
                         [sampled, stops, patterns[name]],
                         [dict(num_beams=3), stops, patterns[name]]]
  out = cli.run_script(SERVE_SCRIPT, json.dumps(
      dirs + [sm.DECODING_DEFAULTS, sm.DECODING_DTYPES, constrained]))
  for name, generate in (("words", library), ("bpe", bpe_library)):
    key = "constrained" if name == "words" else "bpe_constrained"
    for (case, stops, regex), got in zip(constrained[name], out[key],
                                         strict=True):
      texts, scores = generate(**case, stop=stops, regex=regex or None,
                               return_scores=True)
      assert got[0] == texts, (name, case)
      np.testing.assert_allclose(got[1], scores, rtol=1e-5)
    # Each row met a stop string: its text ends with one.
    assert all(any(text.endswith(s) for s in constrained[name][0][1])
               for text in out[key][0][0] if text), out[key][0][0]
  assert out["signatures"] == ["generate_constrained", "generate_decoding",
                               "generate_ids", "generate_ids_constrained",
                               "generate_top_k_top_p", "serving_default"]
  assert out["greedy"] == library(temperature=0.0)
  texts, scores = library(temperature=0.9, seed=3, repetition_penalty=1.4,
                          no_repeat_ngram_size=2, return_scores=True)
  assert out["penalized"][0] == texts
  np.testing.assert_allclose(out["penalized"][1], scores, rtol=1e-5)
  assert out["beams"] == library(num_beams=3)
  ids, text = out["ids"]
  assert text == rnnstep.generate(word_model, ["a dog"], 12, seed=7,
                                  jit_compile=False)
  assert [WORDS[i] for i in ids[0]] == _words_of(text[0])
  from rnnstep.exporters import token_ops  # pylint: disable=g-import-not-at-top
  assert f"{token_ops.UNKNOWN_WORD}] [zebra]" in out["error"]
  assert out["bpe_signatures"] == ["generate_ids", "generate_ids_constrained",
                                   "serving_default"]
  want = rnnstep.generate(bpe_model, ["the cat sat", "a dog"], 12, seed=2,
                          top_k=20, jit_compile=False)
  assert out["bpe"] == [want, want]  # The tokenizers library agrees.


@pytest.mark.slow
def test_cli_stops_patterns_penalties_and_beams_on_token_models(word_file,
                                                                bpe_file):
  """rnnstep-generate on a word and a BPE model: stop strings spanning
  tokens with a pattern and penalties (streamed in chunks), and beams with
  the pattern, give `rnnstep.generate`'s texts."""
  runs, expected = {}, {}
  for name, path, prompts, pattern in (
      ("words", word_file, ["the cat", "a dog ran"], r"( [a-z0-9]+)+"),
      ("bpe", bpe_file[2], ["the cat", "a dog"], r"[a-z .]+")):
    model = rnnstep.load(path)
    library = functools.partial(rnnstep.generate, model, prompts, 12,
                                jit_compile=False)
    sampled = dict(seed=4, temperature=0.9, repetition_penalty=1.3,
                   no_repeat_ngram_size=2, regex=pattern)
    stops = [text[len(text) // 2 - 1:len(text) // 2 + 2]
             for text in library(**sampled)]
    cases = {"sampled": dict(sampled, stop=stops),
             "beams": dict(num_beams=3, regex=pattern, stop=stops)}
    for case, options in cases.items():
      flags = [f"--weights={path}", "--num_steps=12", "--nojit_compile",
               "--format=jsonl", *(f"--prompt={p}" for p in prompts),
               *(f"--stop={s}" for s in options["stop"])]
      flags += [f"--{k}={v}" for k, v in options.items() if k != "stop"]
      if case == "sampled":
        flags += ["--stream", "--chunk_size=3"]
      runs[f"{name}_{case}"] = (flags, False)
      expected[f"{name}_{case}"] = library(**options)
    # Each row's stop string is from its own text: every row stops at one.
    assert all(text.endswith(tuple(stops))
               for text in expected[f"{name}_sampled"]), name
  results = cli.run_concurrently(
      cli.command("rnnstep-generate", "rnnstep.cli.generate"), runs)
  for run, want in expected.items():
    records = [json.loads(line) for line in cli.ok(results[run]).splitlines()]
    assert [r["text"] for r in records] == want, run


# Exhaustive (a LiteRT conversion and a fresh interpreter, 5 CPU-s): the
# default run keeps the warm command line on characters
# (tests/test_fast_path.py) and on RWKV-7's world vocabulary
# (tests/test_rwkv7.py), and the warm runner on words in process
# (tests/test_litert_options.py).
@pytest.mark.exhaustive
def test_cli_fast_path_serves_a_word_model_as_the_library(word_file,
                                                          tmp_path,
                                                          monkeypatch):
  """The compiled-artifact cache (rnnstep/litert/cache.py) records a
  token model's vocabulary in its manifest: a warm run encodes and decodes
  words as the library does, without TensorFlow."""
  pytest.importorskip("ai_edge_litert.interpreter")
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import fill as compiled_fill  # pylint: disable=g-import-not-at-top
  from tests import test_fast_path  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(tmp_path))
  the_key = compiled_cache.key(word_file, compiled_cache.runtime_version())
  os.makedirs(os.path.dirname(compiled_cache.entry_base(the_key)))
  assert compiled_fill.fill(word_file, the_key) == "built"
  prompts = ["the cat", "a dog ran"]
  result = test_fast_path.cli(tmp_path, [
      f"--weights={word_file}", *(f"--prompt={p}" for p in prompts),
      "--num_samples=2", "--num_steps=12", "--seed=7", "--temperature=0.8",
      "--verbose"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "fast path" in test_fast_path.verbose_line(result)
  model = rnnstep.load(word_file)
  want = rnnstep.generate(model, [p for p in prompts for _ in range(2)], 12,
                          seed=7, temperature=0.8, jit_compile=False)
  assert result.stdout == test_fast_path.render(want, 7, prompts)
  # A word the vocabulary lacks: the TensorFlow path, with its own error
  # (forked: TensorFlow's import is not what this run is about).
  unknown = test_fast_path.cli(tmp_path, [
      f"--weights={word_file}", "--prompt=the zebra", "--verbose"], fork=True)
  assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
  assert ("--prompt='the zebra': word 'zebra' is not in the model's "
          "vocabulary") in unknown.stderr, unknown.stderr[-3000:]


@pytest.mark.slow
def test_litert_runs_a_relu_word_model_the_web_export_refuses_it(tmp_path):
  """The LiteRT export (what rnnstep-export --format=tflite writes) of
  word_language_model's RNN_RELU (a word model; the kind simple_rnn_relu):
  the interpreter's ids are the recipe's greedy words and the library's
  seeded ones, decoded by the exported tokens.json's rules; the web runtime,
  which has no relu step, refuses it in one line."""
  pytest.importorskip("ai_edge_litert.interpreter")
  from rnnstep.litert import export as litert  # pylint: disable=g-import-not-at-top
  from rnnstep.exporters import web  # pylint: disable=g-import-not-at-top
  from tests.support import litert_interpreter  # pylint: disable=g-import-not-at-top
  reference = np.load(WORD_LM / "reference.npz")
  model = rnnstep.load(WORD_LM / "rnn_relu.pt", corpus=WORD_LM / "corpus")
  out = tmp_path / "litert"
  rnnstep.export_litert(model, out)
  assert sorted(p.name for p in out.iterdir()) == [
      "model.tflite", "tokens.json", "vocab.json"]
  tokens = json.loads((out / "tokens.json").read_text(encoding="utf-8"))
  assert tokens == {"kind": "words", "newline": "<eos>",
                    "vocab": list(model.vocab)}
  flatbuffer = (out / litert.MODEL_FILE).read_bytes()
  greedy = litert_interpreter.run(flatbuffer, model, ["the cat"], 30)
  assert _words_of(greedy[0]) == str(reference["rnn_relu_greedy"]).split()
  prompts = ["the cat\nsat", "a dog ran"]
  for options in (dict(temperature=0.9, seed=3),
                  dict(temperature=1.0, top_k=5, top_p=0.9, seed=-3)):
    assert litert_interpreter.run(flatbuffer, model, prompts, 20,
                                  **options) == rnnstep.generate(
                                      model, prompts, 20, jit_compile=False,
                                      **options)
  chars = rnnstep.Model(
      model_file.ModelConfig(4, (model_file.LayerConfig("simple_rnn_relu", 6),)),
      list("abc"), {k: np.zeros(s, np.float32) for k, s in model_file.ModelConfig(
          4, (model_file.LayerConfig("simple_rnn_relu", 6),)).expected_shapes(
              3).items()})
  with pytest.raises(ValueError, match=r"layer 0 is SimpleRNN\(relu\), which "
                     "the web export does not run") as e:
    web.check_exportable(chars)
  assert "\n" not in str(e.value)


# ------------------------------------------------------ Keras word models


@pytest.mark.slow
def test_keras_tokenizer_word_model_matches_the_recipe():
  """TensorFlow in Practice's word recipe (tools/make_keras_word_fixtures.py
  ran its code): a legacy `Tokenizer`'s JSON, an Embedding -> LSTM ->
  Dense(softmax) over windows of T ids, and its own loop's text."""
  reference = json.loads((KERAS_WORDS / "reference.json").read_text())
  model = rnnstep.load(KERAS_WORDS / "words.keras",
                       vocab=KERAS_WORDS / "tokenizer.json")
  assert model.config.window == reference["window"]
  assert model.tokens.rules["oov"] == "<oov>"
  assert model.encode("The zebra!").tolist() == reference["zebra_ids"]
  text = rnnstep.generate(model, reference["seed"], reference["next_words"],
                          temperature=0.0, jit_compile=False)
  assert reference["seed"] + text == reference["text"]
  logits = np.asarray(rnnstep.logits(model, [reference["probe_ids"]]))[0, -1]
  probs = np.exp(logits - logits.max())
  np.testing.assert_allclose(probs / probs.sum(), reference["probe_probs"],
                             atol=2e-5)


@pytest.mark.slow  # Builds and trains a Keras model (7 s).
def test_keras_char_level_tokenizer_model_matches_the_recipe(tmp_path):
  """A legacy `Tokenizer(char_level=True)`'s JSON (Keras char-RNN
  tutorials): each character a token, lowered, unknown ones its OOV token;
  logits and the recipe's loop (texts_to_sequences, argmax, append the
  character) as Keras computes them, on an untrained tiny GRU."""
  import keras  # pylint: disable=g-import-not-at-top
  from tf_keras.preprocessing.text import Tokenizer  # pylint: disable=g-import-not-at-top
  tokenizer = Tokenizer(char_level=True, oov_token="~")
  tokenizer.fit_on_texts(["The Café, the cat.", "a cat sat; the end!"])
  size = len(tokenizer.word_index) + 1
  keras.utils.set_random_seed(1)
  net = keras.Sequential([keras.Input((None,)),
                          keras.layers.Embedding(size, 4),
                          keras.layers.GRU(8, return_sequences=True),
                          keras.layers.Dense(size)])
  net.save(tmp_path / "chars.keras")
  (tmp_path / "tokenizer.json").write_text(tokenizer.to_json())
  model = rnnstep.load(tmp_path / "chars.keras",
                       vocab=tmp_path / "tokenizer.json")
  seed = "THE CAFÉ zz"  # Capitals lowered; "z" is the OOV token.
  ids = tokenizer.texts_to_sequences([seed])[0]
  assert model.encode(seed).tolist() == ids
  np.testing.assert_allclose(rnnstep.logits(model, [ids])[0],
                             net.predict(np.array([ids]), verbose=0)[0],
                             atol=2e-5)
  text = seed
  for _ in range(6):  # The recipe's loop, its Dense bias at padding aside.
    logits = net.predict(np.array([tokenizer.texts_to_sequences([text])[0]]),
                         verbose=0)[0, -1]
    text += tokenizer.index_word[int(np.argmax(logits[1:])) + 1]
  assert seed + rnnstep.generate(model, seed, 6, temperature=0.0,
                                 jit_compile=False) == text


# ------------------------------------------- Keras TextVectorization models

KERAS_TEXT = pathlib.Path(__file__).parent / "data" / "keras_text_vectorization"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["direct", "nested"])
def test_text_vectorization_model_matches_keras(name, tmp_path):
  """tools/make_keras_text_vectorization_fixtures.py: a TextVectorization
  layer inside the .keras file (a Functional model; or used outside a
  Sequential LM and saved with it as one end-to-end model), its vocabulary
  read from the archive (an asset; the config): logits within 2e-5 of
  Keras's, greedy words equal to Keras's own loop on strings."""
  reference = json.loads((KERAS_TEXT / "reference.json").read_text())
  want = reference[name]
  model = rnnstep.load(KERAS_TEXT / f"{name}.keras")
  assert model.vocab == tuple(want["vocab"])
  assert model.tokens.rules == {
      "text_vectorization": {"standardize": "lower_and_strip_punctuation",
                             "split": "whitespace"}, "oov": "[UNK]"}
  logits = np.asarray(rnnstep.logits(model, [model.encode(
      reference["probe"])]))[0]
  np.testing.assert_allclose(logits, want["probe_logits"], atol=2e-5)
  text = rnnstep.generate(model, reference["seed"], reference["next_words"],
                          temperature=0.0, jit_compile=False)
  assert text.split() == want["greedy"]
  # rnnstep-convert needs no --vocab for it; the file keeps the rules.
  summary = convert.convert(KERAS_TEXT / f"{name}.keras", tmp_path / "m.npz")
  assert "TextVectorization" in str(summary)
  assert rnnstep.load(tmp_path / "m.npz").tokens.rules == model.tokens.rules
  with pytest.raises(ValueError, match="holds its own vocabulary") as e:
    rnnstep.load(KERAS_TEXT / f"{name}.keras", vocab=want["vocab"])
  assert "\n" not in str(e.value)
  from tests.test_convert_errors import run_cli  # pylint: disable=g-import-not-at-top
  assert run_cli(f"--input={KERAS_TEXT / f'{name}.keras'}",
                 f"--output={tmp_path / 'cli.npz'}") == 0
  # Saved as legacy HDF5, which keeps no assets and a nested model's weights
  # in one group: refused in one line, saying to keep the .keras file.
  keras = pytest.importorskip("keras")
  keras.saving.load_model(KERAS_TEXT / f"{name}.keras").save(tmp_path / "m.h5")
  with pytest.raises(ValueError, match="save the model as .keras") as e:
    rnnstep.load(tmp_path / "m.h5")
  assert "\n" not in str(e.value)


def test_text_vectorization_rules_are_keras_s():
  """Every built-in standardize x split of a real Keras TextVectorization
  layer, adapted: its ids for random texts (cased, punctuated, accented,
  Unicode and ASCII whitespace) equal `Tokens.encode`'s and the graph
  tokenizer's (the SavedModel's)."""
  import random  # pylint: disable=g-import-not-at-top
  keras = pytest.importorskip("keras")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rnnstep.convert import vocabulary as convert_vocabulary  # pylint: disable=g-import-not-at-top
  from rnnstep.exporters import token_ops  # pylint: disable=g-import-not-at-top
  alphabet = list("the Cat sat ÉTÉ café, dog! ran. it's a-b") + [
      "\t", "\n", "\u3000", "\x85", "  "]
  rng = random.Random(1)
  corpus = ["".join(rng.choice(alphabet) for _ in range(20)) for _ in range(30)]
  texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
           for _ in range(60)]
  for standardize in vocabulary.TEXT_VECTORIZATION["standardize"]:
    for split in vocabulary.TEXT_VECTORIZATION["split"]:
      layer = keras.layers.TextVectorization(standardize=standardize,
                                             split=split)
      layer.adapt(corpus)
      tokens = convert_vocabulary.text_vectorization_tokens(
          {"standardize": standardize, "split": split},
          layer.get_vocabulary(), "layer")
      graph = token_ops.GraphTokens(tokens)
      usable = [t for t in texts if tokens.encode(t).size]
      got = np.asarray(layer(tf.constant(usable)))
      if split is None:  # One token per text, the mask id 0 included.
        keras_ids = [row.tolist() for row in got.reshape(len(usable), -1)]
      else:  # Padded with the mask id 0, which no token maps to.
        keras_ids = [row[row != 0].tolist() for row in got]
      graph_ids = graph.encode(tf.constant(usable))[0].to_list()
      for text, want, from_graph in zip(usable, keras_ids, graph_ids):
        assert tokens.encode(text).tolist() == want, (standardize, split, text)
        assert from_graph == want, (standardize, split, text)


def test_text_vectorization_configs_rnnstep_cannot_run_are_refused():
  """One line each: a custom (callable) standardize or split, ngrams, another
  output_mode, a vocabulary file outside the archive, and a last recurrent
  layer that returns only its last output."""
  import zipfile  # pylint: disable=g-import-not-at-top
  from rnnstep.convert import keras_config  # pylint: disable=g-import-not-at-top
  with zipfile.ZipFile(KERAS_TEXT / "direct.keras") as archive:
    config = json.loads(archive.read("config.json"))
  assert keras_config.parse_model_config(config, "m").text_vectorization
  custom = {"module": "builtins", "class_name": "function",
            "config": "my_standardize", "registered_name": "function"}
  for layer, field, value, match in [
      (1, "standardize", custom, "custom standardize function"),
      (1, "split", custom, "custom split function"),
      (1, "standardize", "lower_and_strip", "standardize='lower_and_strip'"),
      (1, "ngrams", 2, "has ngrams=.*needs ngrams=None"),
      (1, "output_mode", "multi_hot", "output_mode='multi_hot'"),
      (1, "vocabulary", "/data/vocab.txt", "outside the archive"),
      (3, "return_sequences", False, "return_sequences=False behind a "
       "TextVectorization layer")]:
    changed = json.loads(json.dumps(config))
    changed["config"]["layers"][layer]["config"][field] = value
    with pytest.raises(ValueError, match=match) as e:
      keras_config.parse_model_config(changed, "m")
    assert "\n" not in str(e.value), e.value


# ------------------------------------------- byte-level and BPE PyTorch models


def _log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  peak = logits.max(-1, keepdims=True)
  return logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))


@pytest.mark.slow
@pytest.mark.parametrize("name,vocab", [("bytes", "bytes.json"),
                                        ("bpe", "tokenizer.json")])
def test_byte_and_bpe_torch_models_match_torch(name, vocab):
  """tools/make_token_torch_fixtures.py: a byte-level GRU and a 2-layer LSTM
  over a tokenizers byte-level BPE, their logits and greedy text by torch."""
  reference = np.load(TOKEN_TORCH / "reference.npz")
  weights = TOKEN_TORCH / ("bytes_gru.pt" if name == "bytes" else
                           "bpe_lstm.pt")
  model = rnnstep.load(weights, vocab=TOKEN_TORCH / vocab)
  assert model.tokens.kind == ("bytes" if name == "bytes" else "subword")
  logits = np.asarray(rnnstep.logits(model, [reference[f"{name}_ids"]]))[0]
  np.testing.assert_allclose(_log_softmax(logits), reference[f"{name}_logp"],
                             atol=2e-5)
  prompt = "the poet said"
  text = rnnstep.generate(model, prompt, 40, temperature=0.0,
                          jit_compile=False)
  if name == "bytes":
    assert text == str(reference["bytes_text"])
  else:
    assert prompt + text == str(reference["bpe_text"])


def test_serve_refuses_unknown_words_naming_them_then_serves(word_model):
  """rnnstep-serve's HTTP app on a word model without an OOV token: a prompt
  word it lacks is a 400 naming the field `prompt` and the word, in one
  line; the next request is answered (max_tokens 0: nothing to run, so the
  scheduler is never started and nothing compiles)."""
  from tests.support import serve_process  # pylint: disable=g-import-not-at-top
  if not serve_process.stack_installed():
    pytest.skip("the serving stack is not installed")
  from rnnstep.serve import app  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import scheduler  # pylint: disable=g-import-not-at-top
  from starlette import testclient  # pylint: disable=g-import-not-at-top
  served = app.Server(word_model, scheduler.Scheduler(
      word_model, path="graph", max_batch=2, chunk_steps=4, max_queue=2,
      max_tokens_limit=8), model_id="words")
  served.ready = True
  with testclient.TestClient(served.app) as client:
    refused = client.post("/v1/completions", json={
        "prompt": ["the cat", "the zebra\nunicorn"], "max_tokens": 4})
    answered = client.post("/v1/completions", json={
        "prompt": "the cat", "max_tokens": 0})
  assert refused.status_code == 400, refused.text
  assert refused.json()["error"]["param"] == "prompt"
  assert refused.json()["error"]["message"] == (
      "prompt 1: words 'zebra', 'unicorn' are not in the model's vocabulary "
      "(which has no out-of-vocabulary token); remove or replace them")
  assert answered.status_code == 200, answered.text


@pytest.mark.slow
def test_serve_scheduler_sends_whole_characters():
  """rnnstep-serve's scheduler decodes each row incrementally: no chunk
  splits a character, and the text is generate's, cut at the stop string;
  its updates and the HTTP `usage` count tokens, not characters; a
  request's checks never hold the HTTP app's event loop."""
  byte_model = rnnstep.load(TOKEN_TORCH / "bytes_gru.pt",
                            vocab=TOKEN_TORCH / "bytes.json")
  import asyncio  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import httpx  # pylint: disable=g-import-not-at-top
  from rnnstep.decoding import options  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import app  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import completion  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import scheduler  # pylint: disable=g-import-not-at-top
  from starlette import testclient  # pylint: disable=g-import-not-at-top
  prompt = "the poet said"  # Its greedy text: " 😀 and left the café.\n...".
  expected = rnnstep.generate(byte_model, prompt, 30, temperature=0.0,
                              jit_compile=False)
  # Two requests of different stop strings in one batch (their token
  # automata joined into one table).
  stops = ["caf", "eft th"]
  server = scheduler.Scheduler(byte_model, path="graph", max_batch=2,
                               chunk_steps=3, max_queue=2,
                               max_tokens_limit=30)
  server.start()
  pieces, finished = [[], []], [threading.Event(), threading.Event()]
  tokens = [0, 0]

  def sink(update, k):
    pieces[k].append(update.text)
    tokens[k] += update.tokens
    if update.finish_reason:
      finished[k].set()

  try:
    for k, stop in enumerate(stops):
      server.submit(completion.Completion(
          [byte_model.encode(prompt)], [options.DEFAULTS._replace(
              temperature=0.0)], seed=1, max_tokens=30,
          shared=completion.Shared(stop=(stop,)), want_scores=False,
          sink=lambda update, k=k: sink(update, k)))
    assert all(event.wait(120) for event in finished)
    # The HTTP app on the same scheduler: `usage` counts tokens (bytes here),
    # the prompt once for its n choices, not characters ("é" is 2 bytes,
    # "😀" 4).
    served = app.Server(byte_model, server, model_id="bytes")
    served.ready = True
    with testclient.TestClient(served.app) as client:
      body = client.post("/v1/completions", json={
          "prompt": "the café", "n": 2, "max_tokens": 30,
          "temperature": 0}).json()
    # A slow check (a long regex's table over a large vocabulary: seconds)
    # runs off the event loop: /health answers meanwhile.
    check = rnnstep.api.check_record

    # The check waits until /health has answered: on the event loop it
    # would block the answer, and wait out its 60 s for nothing.
    check_started, health_answered = threading.Event(), threading.Event()
    answered_first = []

    def slow_check(*args, **kwargs):
      check_started.set()
      answered_first.append(health_answered.wait(60))
      return check(*args, **kwargs)

    async def health_while_checking():
      async with httpx.AsyncClient(transport=httpx.ASGITransport(
          app=served.app), base_url="http://rnnstep") as client:
        post = asyncio.ensure_future(client.post("/v1/completions", json={
            "prompt": "the", "max_tokens": 2}))
        await asyncio.to_thread(check_started.wait, 60)
        health = await client.get("/health")
        health_answered.set()
        return (health.status_code, (await post).status_code,
                answered_first)

    rnnstep.api.check_record = slow_check
    try:
      assert asyncio.run(health_while_checking()) == (200, 200, [True])
    finally:
      rnnstep.api.check_record = check
  finally:
    server.close(10)
  for k, stop in enumerate(stops):
    text = expected[:expected.find(stop) + len(stop)]
    assert "".join(pieces[k]) == text
    assert "😀" in "".join(pieces[k]) and "\ufffd" not in "".join(pieces[k])
    assert tokens[k] == len(text.encode("utf-8"))  # The row's ids.
  assert server.stats.mixed_chunks > 0
  assert [c["text"] for c in body["choices"]] == [rnnstep.generate(
      byte_model, "the café", 30, temperature=0.0, jit_compile=False)] * 2
  assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 2 * 30,
                           "total_tokens": 9 + 2 * 30}


def test_seeded_sampling_follows_the_softmax(word_model, word_file):
  """One sampled word for 2000 rows (seed, row) against the float64
  forward's softmax: a chi-square test at p = 0.001 (Wilson-Hilferty)."""
  rows = 2000
  texts = rnnstep.generate(word_model, ["the cat"] * rows, 1, seed=11,
                           jit_compile=False)
  index = {piece: i for i, piece in enumerate(
      p.decode() for p in word_model.tokens.pieces)}
  counts = np.bincount([index[t] for t in texts], minlength=256)
  reference = numpy_reference.Reference(
      *numpy_reference.tensors_of_file(model_file.read(word_file)))
  logits = reference.logits(word_model.encode("the cat"))[-1]
  probs = np.exp(logits - logits.max())
  expected = rows * probs / probs.sum()
  small = expected < 5  # Pooled, as the test needs.
  observed = np.append(counts[~small], counts[small].sum())
  expected = np.append(expected[~small], expected[small].sum())
  statistic = float(((observed - expected) ** 2 / expected).sum())
  k = len(observed) - 1
  critical = k * (1 - 2 / (9 * k) + 3.09 * np.sqrt(2 / (9 * k))) ** 3
  assert statistic < critical, (statistic, critical)
