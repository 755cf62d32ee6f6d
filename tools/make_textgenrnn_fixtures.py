"""Writes the textgenrnn fixtures of tests/test_recompute.py with textgenrnn's
own code (needs tf_keras and textgenrnn's source files).

    git -C MIRROR show HEAD:textgenrnn/model.py > SRC/model.py   # and
    # AttentionWeightedAverage.py, utils.py (minimaxir/textgenrnn, MIT)
    python tools/make_textgenrnn_fixtures.py --src=SRC               # into tests/data/textgenrnn/
    python tools/make_textgenrnn_fixtures.py --src=SRC --out=/tmp/x  # elsewhere

textgenrnn's modules are imported unchanged from `--src` (as the package
`textgenrnn`, without its `__init__`, which needs scikit-learn), under
`TF_USE_LEGACY_KERAS=1` so that their `tensorflow.keras` is tf_keras, the
Keras 2 they were written for:

  - the vocabulary is built as `textgenrnn.train_new_model` builds it: a
    `Tokenizer(filters='', lower=False, char_level=True)` fitted on the
    texts, then the meta token `<s>` after the last character; written as
    `textgenrnn_vocab.json` (its `word_index`) and `textgenrnn_config.json`;
  - the model is `model.textgenrnn_model(num_classes, cfg)` at tiny sizes
    (2 LSTM layers of 8, embeddings of 6, windows of 10; and a bidirectional
    one), with random weights scaled for lively text, saved with
    `model.save_weights` (`textgenrnn_weights.hdf5`, as its
    `save_model_weights` does);
  - the reference: `utils.textgenrnn_generate(..., temperature=0.0,
    prefix=...)` (its argmax loop: `<s>` + the prefix, pre-padded to the
    window, `model.predict`, append the character) and `model.predict`'s
    probabilities for a few windows.

The output bias of the padding id 0 and of `<s>` is set low: textgenrnn's
argmax could otherwise choose the padding (and fail on it) or end the text.

A word-level model (`word_level=True`, `textgenrnn_words/`) is made the
same way, its vocabulary as `train_new_model` builds one for it: a
`Tokenizer(filters='', lower=True, char_level=False)` fitted on the texts
as they are (WORD_TEXTS space their punctuation, so that the words include
it), then `<s>`. Its reference holds, per prefix, the text its argmax loop
returns (`word_texts`, re-spaced by its regexes), the prefix as it writes it
with no word generated (`written`: the same call with max_gen_length=0),
and the number of words the loop generated (`steps`).
"""

import argparse
import importlib
import json
import os
import sys
import types

os.environ["TF_USE_LEGACY_KERAS"] = "1"

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np

TEXTS = ["the cat sat on the mat.", "a dog ran to the log!",
         "the hat is on the cat, and the dog sat."]
PREFIXES = ["the c", "a dog ran to the mat and"]
WORD_TEXTS = ['the cat sat on the mat .', 'a dog ran to the log !',
              'the hat said " hi " to the cat , and the dog sat .',
              "( the dog ) ran to the cat's [ hat ] : yes ; no ?",
              "$ 5 for the hat _ ok @ you % done - it's a cat ' s mat"]
# A plain prefix, unknown words and a trailing punctuation mark (an empty
# last word), an open quote, an open bracket, a line end, and none.
WORD_PREFIXES = ["The cat sat", "Hello, Zebra dog.", 'the hat said " hi',
                 "( the", "the dog\nran", ""]
WORD_CONFIG = dict(rnn_layers=2, rnn_size=8, rnn_bidirectional=False,
                   max_length=10, max_words=10000, dim_embeddings=6,
                   word_level=True, single_text=False)
MAX_GEN_LENGTH = 30
CONFIGS = {
    "textgenrnn": dict(rnn_layers=2, rnn_size=8, rnn_bidirectional=False,
                       max_length=10, max_words=10000, dim_embeddings=6,
                       word_level=False, single_text=False),
    "textgenrnn_bidi": dict(rnn_layers=1, rnn_size=6, rnn_bidirectional=True,
                            max_length=10, max_words=10000,
                            dim_embeddings=6, word_level=False,
                            single_text=False),
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--src", required=True,
                      help="a folder with textgenrnn's model.py, "
                      "AttentionWeightedAverage.py and utils.py")
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
      "textgenrnn"))
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  package = types.ModuleType("textgenrnn")
  package.__path__ = [args.src]
  sys.modules["textgenrnn"] = package
  model_lib = importlib.import_module("textgenrnn.model")
  utils = importlib.import_module("textgenrnn.utils")
  import tf_keras
  from tf_keras.preprocessing.sequence import pad_sequences
  from tf_keras.preprocessing.text import Tokenizer

  tokenizer = Tokenizer(filters="", lower=False, char_level=True)
  tokenizer.fit_on_texts(TEXTS)
  vocab = dict(tokenizer.word_index)
  vocab["<s>"] = len(vocab) + 1
  indices_char = {index: char for char, index in vocab.items()}
  reference = {"prefixes": PREFIXES, "max_gen_length": MAX_GEN_LENGTH,
               "models": {}}
  rng = np.random.default_rng(7)
  for name, cfg in CONFIGS.items():
    tf_keras.utils.set_random_seed(1)
    model = model_lib.textgenrnn_model(len(vocab) + 1, cfg=cfg)
    weights = [rng.normal(0, 1.2, w.shape).astype(np.float32)
               for w in model.get_weights()]
    weights[-1][0] = weights[-1][vocab["<s>"]] = -30.0  # The output bias.
    model.set_weights(weights)
    _write(os.path.join(args.out, name), model, vocab, cfg, name)
    texts = [utils.textgenrnn_generate(
        model, vocab, indices_char, temperature=0.0,
        maxlen=cfg["max_length"], max_gen_length=MAX_GEN_LENGTH,
        prefix=prefix)[0] for prefix in PREFIXES]
    windows = [["<s>", *"the"], list("og ran to the")]
    encoded = np.concatenate([utils.textgenrnn_encode_sequence(
        w[-cfg["max_length"]:], vocab, cfg["max_length"]) for w in windows])
    assert (encoded == pad_sequences(
        [[vocab[c] for c in w] for w in windows],
        maxlen=cfg["max_length"])).all()
    reference["models"][name] = {
        "texts": texts, "windows": encoded.tolist(),
        "probs": model.predict(encoded, verbose=0).tolist()}
  reference["word"] = _word_level(args.out, model_lib, utils, rng)
  with open(os.path.join(args.out, "reference.json"), "w") as f:
    json.dump(reference, f, indent=1)
  print(f"wrote {', '.join(CONFIGS)} and reference.json to {args.out}")


def _write(directory, model, vocab, cfg, name):
  """textgenrnn's three files for one model, as its own code names them."""
  os.makedirs(directory, exist_ok=True)
  model.save_weights(os.path.join(directory, "textgenrnn_weights.hdf5"))
  with open(os.path.join(directory, "textgenrnn_vocab.json"), "w",
            encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
  with open(os.path.join(directory, "textgenrnn_config.json"), "w",
            encoding="utf-8") as f:
    json.dump(dict(cfg, name=name), f, ensure_ascii=False)


def _word_level(out, model_lib, utils, rng):
  """The word-level model, its files and its reference (see the module)."""
  import tf_keras
  from tf_keras.preprocessing.text import Tokenizer
  cfg = WORD_CONFIG
  tokenizer = Tokenizer(filters="", lower=True, char_level=False)
  tokenizer.fit_on_texts(WORD_TEXTS)
  vocab = {k: v for k, v in tokenizer.word_index.items()
           if v <= cfg["max_words"]}
  vocab["<s>"] = len(vocab) + 1
  indices_char = {index: word for word, index in vocab.items()}
  tf_keras.utils.set_random_seed(2)
  model = model_lib.textgenrnn_model(len(vocab) + 1, cfg=cfg)
  weights = [rng.normal(0, 1.2, w.shape).astype(np.float32)
             for w in model.get_weights()]
  weights[-1][0] = weights[-1][vocab["<s>"]] = -30.0
  model.set_weights(weights)
  _write(os.path.join(out, "textgenrnn_words"), model, vocab, cfg,
         "textgenrnn_words")

  def generate(prefix, max_gen_length):
    return utils.textgenrnn_generate(
        model, vocab, indices_char, temperature=0.0,
        maxlen=cfg["max_length"], word_level=True,
        max_gen_length=max_gen_length, prefix=prefix)[0]

  texts = [generate(p, MAX_GEN_LENGTH) for p in WORD_PREFIXES]
  written = [generate(p, 0) for p in WORD_PREFIXES]
  # Its loop: `<s>` and the prefix's words, then words up to max_gen_length.
  steps = [MAX_GEN_LENGTH - 1 - (len(utils.re.sub(" {2,}", " ", utils.re.sub(
      "([{}])".format(PUNCT), r" \1 ", p)).split(" ")) if p else 0)
           for p in WORD_PREFIXES]
  windows = [["<s>", "the", "cat"], ["the", "dog", ")", "ran", "to", "the",
                                     "mat", ".", "", "zebra", "hat"]]
  encoded = np.concatenate([utils.textgenrnn_encode_sequence(
      w[-cfg["max_length"]:], vocab, cfg["max_length"]) for w in windows])
  return {"prefixes": WORD_PREFIXES, "texts": texts, "written": written,
          "steps": steps, "windows": encoded.tolist(),
          "probs": model.predict(encoded, verbose=0).tolist()}


# textgenrnn_generate's prefix punctuation (textgenrnn/utils.py), to count
# the words its loop starts from.
PUNCT = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\\n\\t\'‘’“”’–—'


if __name__ == "__main__":
  main()
