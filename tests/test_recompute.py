"""Recomputed windows (rnnstep/engine/recompute.py) on TensorFlow in
Practice's word recipe: a Bidirectional LSTM (and a second LSTM and a relu
Dense head), pre-padded windows, a legacy Tokenizer's words.

The fixtures are the recipe's own model and loop, run by tf_keras
(tools/make_tfip_fixtures.py): every number and word here is compared with
what tf_keras and the recipe computed, never with rnnstep's own.
"""

import functools
import os
import json
import pathlib
import re
import shutil
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests.support import cli
from tests.support.tiers import quick_params

import rnnstep
from rnnstep import convert
from rnnstep import errors
from rnnstep.litert import export as litert
from rnnstep.exporters import web
from rnnstep.model import vocabulary

DATA = pathlib.Path(__file__).parent / "data" / "tfip_words"
REFERENCE = json.loads((DATA / "reference.json").read_text())
SEEDS = REFERENCE["seeds"]
STEPS = REFERENCE["next_words"]
SONNETS, BIDI = "sonnets.h5", "bidi.h5"


@functools.lru_cache(maxsize=None)
def load(name):
  return rnnstep.load(DATA / name, vocab=DATA / "tokenizer.json")


def recipe_texts(name):
  return REFERENCE["models"][name]["texts"]


def test_the_recipe_graph_is_read_from_the_file():
  """Bidirectional over LSTM, Dropout skipped, a second LSTM, the relu head,
  the fixed input length and pre-padding (the vocabulary is a Tokenizer's)."""
  config = load(SONNETS).config
  assert [(layer.kind, layer.units, layer.bidirectional)
          for layer in config.layers] == [("lstm", 10, True),
                                          ("lstm", 8, False)]
  assert [(h.units, h.activation) for h in config.head] == [(26, "relu")]
  assert (config.window, config.padding) == (REFERENCE["max_len"] - 1, "pre")
  assert config.recomputes
  summary = convert.describe(DATA / SONNETS)
  assert any("Dropout layer 'dropout' ignored" in note
             for note in summary.notes)
  assert load(BIDI).config.head == ()


@pytest.mark.parametrize("name", [SONNETS, BIDI])
def test_logits_match_the_recipe_model(name):
  """The windows tf_keras predicted on (pre-padded, full, padding only):
  log-probabilities within 1e-5 (logits up to their softmax's constant)."""
  reference = REFERENCE["models"][name]
  logits = np.asarray(rnnstep.logits(
      load(name), np.array(reference["windows"], np.int32)), np.float64)
  got = logits[:, -1] - np.log(np.exp(logits[:, -1]).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, np.log(reference["probs"]), atol=1e-5)


def test_keras_3_files_of_stacked_bidirectional_layers_match_keras(tmp_path):
  """Keras 3 (a backward_layer in its config, each direction's weights under
  its own path in a .keras archive): Bidirectional GRU (return_sequences,
  merged per step) under a Bidirectional LSTM, and a gelu head."""
  keras = pytest.importorskip("keras")
  keras.utils.set_random_seed(1)
  size = len(load(BIDI).vocab)
  model = keras.Sequential([
      keras.Input((9,)), keras.layers.Embedding(size, 6),
      keras.layers.Bidirectional(keras.layers.GRU(5, return_sequences=True)),
      keras.layers.Bidirectional(keras.layers.LSTM(4)),
      keras.layers.Dense(7, activation="gelu"),
      keras.layers.Dense(size, activation="softmax")])
  windows = np.random.RandomState(0).randint(0, size, (3, 9)).astype(np.int32)
  windows[0, :4] = 0  # Pre-padded.
  want = np.log(model.predict(windows, verbose=0))
  model.save(tmp_path / "m.keras")
  loaded = rnnstep.load(tmp_path / "m.keras", vocab=DATA / "tokenizer.json")
  assert [layer.bidirectional for layer in loaded.config.layers] == [True,
                                                                     True]
  logits = np.asarray(rnnstep.logits(loaded, windows), np.float64)[:, -1]
  got = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.slow  # A recipe's model on the graph path by default (8-14 s).
@pytest.mark.parametrize("path", quick_params([False, True, "elementwise"],
                                              False))
def test_greedy_words_are_the_recipe_loop_s(path):
  """Both seeds (shorter than the window: padded; longer: cut) in one batch,
  word for word, on every path, by generate and by stream (the poetry lab's
  model on the graph path only: its programs are compiled once more)."""
  for name in (SONNETS, BIDI) if path is False else (SONNETS,):
    model = load(name)
    texts = rnnstep.generate(model, SEEDS, STEPS, temperature=0,
                             jit_compile=path)
    assert [s + t for s, t in zip(SEEDS, texts)] == recipe_texts(name)
  streamed = "".join(rnnstep.stream(load(SONNETS), SEEDS[0], STEPS,
                                    chunk_size=5, temperature=0,
                                    jit_compile=path))
  assert SEEDS[0] + streamed == recipe_texts(SONNETS)[0]


def test_sampling_is_the_same_on_a_strategy_and_alone():
  model = load(SONNETS)
  kwargs = dict(temperature=0.9, seed=4, repetition_penalty=1.3,
                jit_compile=False)
  alone = rnnstep.generate(model, SEEDS, STEPS, **kwargs)
  assert rnnstep.generate(model, SEEDS, STEPS,
                          strategy=tf.distribute.get_strategy(),
                          **kwargs) == alone


def test_unknown_prompt_words_are_refused_naming_them(capsys):
  """The recipe's Tokenizer has no oov_token: where texts_to_sequences drops
  the words it lacks, rnnstep refuses the prompt in one line naming them
  (issue #34: a prompt is never silently changed), by generate and by
  stream, and says nothing else."""
  model = rnnstep.load(DATA / BIDI, vocab=DATA / "tokenizer.json")
  assert "unknown" not in model.tokens.rules
  for call in (rnnstep.generate, lambda *a: list(rnnstep.stream(*a))):
    with pytest.raises(errors.ArgumentError) as e:
      call(model, ["From fairest", "From zebra fairest unicorn"], STEPS)
    assert e.value.argument == "prompts"
    assert str(e.value) == (
        "prompt 1: words 'zebra', 'unicorn' are not in the model's "
        "vocabulary (which has no out-of-vocabulary token); remove or "
        "replace them")
  assert capsys.readouterr().err == ""


def test_what_a_recomputed_model_cannot_do_is_refused_in_one_line():
  model = load(BIDI)
  for call, argument in [
      (lambda: rnnstep.generate(model, "from", 3, window=0), "window"),
      (lambda: rnnstep.generate(model, "from", 3, num_beams=2), "num_beams"),
      (lambda: rnnstep.hidden_states(model, "from"), "texts_or_ids")]:
    with pytest.raises(errors.ArgumentError) as e:
      call()
    assert e.value.argument == argument and "\n" not in str(e.value)
  for export, lacks in [(litert.convert, "steps a model statefully"),
                        (web.check_exportable, "no web export")]:
    with pytest.raises(ValueError, match=lacks) as e:
      export(model)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_command_lines_convert_then_generate_the_recipe_words(tmp_path):
  """`rnnstep-convert` then `rnnstep-generate` on its output; and
  textgenrnn's word-level weights file given to `rnnstep-generate` (its
  vocabulary and config found beside it), with a prefix it writes as typed:
  the prompt and the continuation are textgenrnn's returned string."""
  out = tmp_path / "sonnets.npz"
  generate = cli.command("rnnstep-generate", "rnnstep.cli.generate")
  assert WORDS["prefixes"][0].lower() == WORDS["written"][0]
  cli.ok(cli.run_binary(
      cli.command("rnnstep-convert", "rnnstep.cli.convert"),
      [f"--input={DATA / SONNETS}", f"--vocab={DATA / 'tokenizer.json'}",
       f"--output={out}"]))
  words = cli.ok(cli.run_binary(generate, [
      f"--weights={out}", f"--prompt={SEEDS[1]}", f"--num_steps={STEPS}",
      "--temperature=0"]))
  textgenrnn_text = cli.ok(cli.run_binary(generate, [
      "--weights="
      f"{TEXTGENRNN_DATA / 'textgenrnn_words' / 'textgenrnn_weights.hdf5'}",
      f"--prompt={WORDS['written'][0]}", f"--num_steps={WORDS['steps'][0]}",
      "--temperature=0"]))
  assert words.rstrip("\n") == recipe_texts(SONNETS)[1]
  assert textgenrnn_text.rstrip("\n") == WORDS["texts"][0]


# Serves each (export directory, prompts, steps) greedily; prints the texts.
SERVE_SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("rnnstep", "keras", "tf_keras"):
      sys.modules[name] = None
    import tensorflow as tf
    out = []
    for export_dir, prompts, steps in json.loads(sys.argv[1]):
      loaded = tf.saved_model.load(export_dir)
      texts = loaded.signatures["serving_default"](
          prompts=tf.constant(prompts), num_steps=tf.constant(steps),
          temperature=tf.constant(0.0), seed=tf.constant(0, tf.int64))["text"]
      out.append([t.decode() for t in texts.numpy()])
    print(json.dumps(out))
    """)


@pytest.mark.exhaustive  # Two exports (a minute); test_saved_model's tier
# exports a model on every path by default.
def test_the_saved_model_serves_the_recipes_texts(tmp_path):
  """Served without rnnstep or Keras: the TF-in-Practice loop's words,
  textgenrnn's loop's characters (its `<s>` and character tokens in graph
  ops) and its word-level string (its prefix split and re-spacing in graph
  ops; the prefix whose open quote the words close)."""
  rnnstep.export(load(BIDI), str(tmp_path / "bidi"))
  rnnstep.export(textgenrnn(TEXTGENRNN), str(tmp_path / "textgenrnn"))
  rnnstep.export(textgenrnn_words(), str(tmp_path / "textgenrnn_words"))
  words, chars, (textgenrnn_text,) = cli.run_script(SERVE_SCRIPT, json.dumps([
      (str(tmp_path / "bidi"), SEEDS, STEPS),
      (str(tmp_path / "textgenrnn"), PREFIXES, TEXTGENRNN_STEPS),
      (str(tmp_path / "textgenrnn_words"), [WORDS["prefixes"][2]],
       WORDS["steps"][2])]))
  assert [s + t for s, t in zip(SEEDS, words)] == recipe_texts(BIDI)
  assert_textgenrnn_texts(TEXTGENRNN, chars)
  assert textgenrnn_word_text(2, textgenrnn_text) == WORDS["texts"][2]


# ------------------------------------------------------------- textgenrnn

TEXTGENRNN_DATA = pathlib.Path(__file__).parent / "data" / "textgenrnn"
TEXTGENRNN_REFERENCE = json.loads(
    (TEXTGENRNN_DATA / "reference.json").read_text())
PREFIXES = TEXTGENRNN_REFERENCE["prefixes"]
# textgenrnn's loop stops at max_gen_length tokens, `<s>` and the prefix
# included: the longest continuation any prefix gets.
TEXTGENRNN_STEPS = TEXTGENRNN_REFERENCE["max_gen_length"] - 1 - min(
    map(len, PREFIXES))
TEXTGENRNN, TEXTGENRNN_BIDI = "textgenrnn", "textgenrnn_bidi"


@functools.lru_cache(maxsize=None)
def textgenrnn(name):
  """Its weights file; the vocabulary beside it is found by its name."""
  return rnnstep.load(TEXTGENRNN_DATA / name / "textgenrnn_weights.hdf5")


def assert_textgenrnn_texts(name, continuations):
  want = TEXTGENRNN_REFERENCE["models"][name]["texts"]
  got = [p + t for p, t in zip(PREFIXES, continuations)]
  assert [g[:len(w)] for g, w in zip(got, want)] == want


def test_textgenrnn_files_are_read_as_its_code_builds_them():
  model = textgenrnn(TEXTGENRNN)
  config = model.config
  assert (config.attention, config.window, config.padding) == (True, 10,
                                                               "pre")
  assert [(layer.kind, layer.bidirectional) for layer in config.layers] == [
      ("lstm", False), ("lstm", False)]
  assert textgenrnn(TEXTGENRNN_BIDI).config.layers[0].bidirectional
  # `<s>` starts every text; an unknown character is the padding id 0, as
  # `vocab.get(x, 0)` makes it; characters join without spaces.
  start = model.vocab.index("<s>")
  assert model.encode("t\u00e9").tolist() == [start, model.vocab.index("t"),
                                               0]
  assert model.decode([start, model.vocab.index("t")]) == "t"


@pytest.mark.parametrize("name", [TEXTGENRNN, TEXTGENRNN_BIDI])
def test_textgenrnn_logits_match_its_own_layer_code(name):
  """AttentionWeightedAverage over concat([embedded, rnn_1, ...]), from its
  code run by tf_keras (tools/make_textgenrnn_fixtures.py)."""
  reference = TEXTGENRNN_REFERENCE["models"][name]
  logits = np.asarray(rnnstep.logits(
      textgenrnn(name), np.array(reference["windows"], np.int32)),
                      np.float64)[:, -1]
  got = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, np.log(reference["probs"]), atol=1e-5)


def test_cudnn_lstm_weights_convert_as_keras_loads_them(tmp_path):
  """textgenrnn's bundled weights come from Keras 2.1's CuDNNLSTM (two
  biases, cuDNN's kernel layout). The fixture's weights, taken to that
  layout by tf_keras's own converter, give the same logits."""
  h5py = pytest.importorskip("h5py")
  hdf5_format = pytest.importorskip("tf_keras.src.saving.legacy.hdf5_format")

  class CuDNNLSTM:  # pylint: disable=too-few-public-methods
    """What the converter reads of its target layer: the class name."""

  directory = tmp_path / TEXTGENRNN
  shutil.copytree(TEXTGENRNN_DATA / TEXTGENRNN, directory)
  with h5py.File(directory / "textgenrnn_weights.hdf5", "r+") as f:
    for layer in ("rnn_1", "rnn_2"):
      names = list(f[layer].attrs["weight_names"])  # tf_keras writes str.
      cudnn = hdf5_format._convert_rnn_weights(  # pylint: disable=protected-access
          CuDNNLSTM(), [f[layer][name][()] for name in names])
      for name, array in zip(names, cudnn):
        del f[layer][name]
        f[layer][name] = array
  model = rnnstep.load(directory / "textgenrnn_weights.hdf5")
  reference = TEXTGENRNN_REFERENCE["models"][TEXTGENRNN]
  logits = np.asarray(rnnstep.logits(
      model, np.array(reference["windows"], np.int32)), np.float64)[:, -1]
  got = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, np.log(reference["probs"]), atol=1e-5)


@pytest.mark.slow  # A recipe's model on the graph path by default (8-14 s).
@pytest.mark.parametrize("path", quick_params([False, True, "elementwise"],
                                              False))
def test_textgenrnn_greedy_text_is_its_loop_s(path):
  """Its `textgenrnn_generate(temperature=0.0, prefix=...)`, character for
  character, by generate (both models on the graph path) and stream."""
  for name in (TEXTGENRNN, TEXTGENRNN_BIDI) if path is False else (
      TEXTGENRNN_BIDI,):
    assert_textgenrnn_texts(name, rnnstep.generate(
        textgenrnn(name), PREFIXES, TEXTGENRNN_STEPS, temperature=0,
        jit_compile=path))
  streamed = ["".join(rnnstep.stream(
      textgenrnn(TEXTGENRNN_BIDI), prefix, TEXTGENRNN_STEPS, chunk_size=7,
      temperature=0, jit_compile=path)) for prefix in PREFIXES]
  assert_textgenrnn_texts(TEXTGENRNN_BIDI, streamed)


# ------------------------------------------------- textgenrnn, word level

WORDS = TEXTGENRNN_REFERENCE["word"]


@functools.lru_cache(maxsize=None)
def textgenrnn_words():
  """The word-level model (`word_level=True` in the config beside it)."""
  return rnnstep.load(TEXTGENRNN_DATA / "textgenrnn_words" /
                      "textgenrnn_weights.hdf5")


def textgenrnn_word_text(prefix_index, continuation):
  """textgenrnn's returned string as rnnstep gives it: the prefix as
  textgenrnn writes it (its `written`), up to where the words re-space it,
  then the continuation."""
  written = WORDS["written"][prefix_index]
  want = WORDS["texts"][prefix_index]
  return written[:len(os.path.commonprefix([written, want]))] + continuation


def test_textgenrnn_word_level_files_and_logits():
  """Its config's word_level, its Tokenizer's words (the `recipe` rule:
  textgenrnn's prefix split, an empty or unknown word id 0, as
  `vocab.get(x, 0)` makes it), and logits from its own layer code."""
  model = textgenrnn_words()
  assert model.tokens.rules == {"recipe": "textgenrnn", "start": "<s>",
                                "oov": "[UNK]"}
  ids = model.encode("Hello, dog.").tolist()
  assert ids == [model.vocab.index(w) for w in ("<s>", "[UNK]", ",", "dog",
                                                ".", "[UNK]")]
  logits = np.asarray(rnnstep.logits(
      model, np.array(WORDS["windows"], np.int32)), np.float64)[:, -1]
  got = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(got, np.log(WORDS["probs"]), atol=1e-5)
  # The vocabulary in memory (`textgen.vocab`) reads as its file.
  in_memory = rnnstep.load(
      TEXTGENRNN_DATA / "textgenrnn_words" / "textgenrnn_weights.hdf5",
      vocab=json.loads((TEXTGENRNN_DATA / "textgenrnn_words" /
                        "textgenrnn_vocab.json").read_text()))
  assert (in_memory.vocab, in_memory.tokens.rules) == (model.vocab,
                                                       model.tokens.rules)


@pytest.mark.slow  # A recipe's model on the graph path by default (8-14 s).
@pytest.mark.parametrize("path", quick_params([False, True, "elementwise"],
                                              False))
def test_textgenrnn_word_level_text_is_its_loop_s(path):
  """Its `textgenrnn_generate(temperature=0.0, word_level=True, prefix=...)`
  word for word, and its returned string (re-spaced; an open quote closed by
  the words; a leading space; a prefix's empty last word), by generate and
  by stream (every prefix on the graph path, and on a strategy; on the
  others, the quote's)."""
  model = textgenrnn_words()
  rows = range(len(WORDS["prefixes"])) if path is False else (2,)
  for i in rows:
    prefix, steps = WORDS["prefixes"][i], WORDS["steps"][i]
    text = rnnstep.generate(model, prefix, steps, temperature=0,
                            jit_compile=path)
    assert textgenrnn_word_text(i, text) == WORDS["texts"][i]
    if i == 2 and path is False:  # On a strategy too.
      assert rnnstep.generate(model, prefix, steps, temperature=0,
                              jit_compile=path,
                              strategy=tf.distribute.get_strategy()) == text
    if i in (2, 5):  # The quote's and no prefix's: streamed too.
      chunks = list(rnnstep.stream(model, prefix, steps, chunk_size=3,
                                   temperature=0, jit_compile=path))
      assert "".join(chunks) == text


def test_textgenrnn_word_level_stream_never_takes_back_text():
  """Random words (punctuation, quotes, line ends, an empty first and last
  prompt word): every chunk is final, and the chunks end as textgenrnn's
  own regexes (copied from its `textgenrnn_generate`) re-space the words."""

  def textgenrnn_respace(text_joined):
    # textgenrnn/utils.py's, verbatim but for "\\]" and "\\[" (its "\]" and
    # "\[", the same strings, which newer Pythons warn about).
    left_punct = "!%),.:;?@\\]_}\\n\\t'"
    right_punct = "$(\\[_\\n\\t'"
    punct = '\\n\\t'
    text_joined = re.sub(" ([{}]) ".format(punct), r'\1', text_joined)
    text_joined = re.sub(" ([{}])".format(left_punct), r'\1', text_joined)
    text_joined = re.sub("([{}]) ".format(right_punct), r'\1', text_joined)
    text_joined = re.sub('" (.+?) "', r'"\1"', text_joined)
    return text_joined

  words = ["a", "bc", '"', "(", ")", ".", "_", "'", "$", "\n", "\t", "[",
           "]", "x'", '"y']
  tokens = vocabulary.Tokens("words", ["[UNK]", *words, "<s>"],
                             {"recipe": "textgenrnn", "start": "<s>",
                              "oov": "[UNK]"})
  rng = np.random.default_rng(3)
  for _ in range(300):
    prompt = "".join(rng.choice([" ", "a", '"', ".", "(", "\n", "b c"],
                                rng.integers(0, 6)))
    ids = rng.integers(1, len(words) + 1, rng.integers(1, 14))
    stream = tokens.stream(prompt=prompt)
    got = "".join(stream.push(ids[k:k + 1]) for k in range(len(ids)))
    got += stream.finish()
    assert got == tokens.text(ids, prompt=prompt)
    prompt_words = vocabulary.textgenrnn_words(prompt)
    written = textgenrnn_respace(" ".join(prompt_words))
    whole = textgenrnn_respace(" ".join(
        prompt_words + [tokens.vocab[i] for i in ids]))
    assert written[:len(os.path.commonprefix([written, whole]))] + got == (
        whole)
    for k in range(len(ids) + 1):
      settled = vocabulary.textgenrnn_settled(
          prompt_words + [tokens.vocab[i] for i in ids[:k]])
      assert whole.startswith(settled)


def test_what_a_textgenrnn_word_model_cannot_do_is_refused_in_one_line():
  model = textgenrnn_words()
  for argument, kwargs in [("stop", dict(stop="x")),
                           ("regex", dict(regex="[a-z ]*"))]:
    with pytest.raises(errors.ArgumentError) as e:
      rnnstep.generate(model, "the", 3, **kwargs)
    assert e.value.argument == argument and "\n" not in str(e.value)


def test_textgenrnn_word_level_graph_ops_split_and_respace_as_the_host():
  """The SavedModel's graph ops (`token_ops.GraphTokens`): random prompts
  (cased, punctuation, its curly quotes and dashes, line ends, spaces) give
  `Tokens.encode`'s ids, and random words after them `Tokens.text`'s
  continuation (which the tests above hold to textgenrnn's own)."""
  from rnnstep.exporters import token_ops  # pylint: disable=g-import-not-at-top
  tokens = textgenrnn_words().tokens
  graph = token_ops.GraphTokens(tokens)
  rng = np.random.default_rng(5)
  alphabet = list("the CAT Dog hat ,.!\"'()[]_$:\n\t“”–") + ["  ", "zebra"]
  prompts = ["".join(rng.choice(alphabet, rng.integers(0, 9)))
             for _ in range(60)]
  encoded = graph.encode(tf.constant(prompts))[0]
  assert encoded.to_list() == [tokens.encode(p).tolist() for p in prompts]
  ids = rng.integers(1, len(tokens.vocab), [60, 9]).astype(np.int32)
  lengths = rng.integers(0, 10, [60]).astype(np.int32)
  texts = graph.continuation(tf.constant(prompts), ids, lengths).numpy()
  assert [t.decode() for t in texts] == [
      tokens.text(row[:n], prompt=p) for p, row, n in zip(prompts, ids,
                                                          lengths)]
