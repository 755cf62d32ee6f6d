"""Writes the TensorFlow-in-Practice word-recipe fixtures (Bidirectional LSTM,
a Dense head, pre-padded windows) of tests/test_recompute.py (needs tf_keras).

    python tools/make_tfip_fixtures.py               # into tests/data/tfip_words/
    python tools/make_tfip_fixtures.py --out=/tmp/x  # elsewhere

TensorFlow in Practice's "Generating Text with Neural Networks" (the
Shakespeare sonnets exercise), with its own code and its own library
(tf_keras, the Keras 2 it was written for): a legacy `Tokenizer` fitted on
the lines (`tokenizer.json`: its `to_json()`); every n-gram prefix of each
line padded with `pad_sequences(..., maxlen=max_len, padding='pre')`;
`Embedding(total_words, D, input_length=max_len-1) ->
Bidirectional(LSTM(U, return_sequences=True)) -> Dropout -> LSTM(U2) ->
Dense(total_words // 2, relu, kernel_regularizer=l2) -> Dense(total_words,
softmax)`, trained briefly, saved with `model.save("sonnets.h5")` (tiny
sizes: the fixture is tens of KB). The sonnets exercise's model is this one;
the poetry lab's (`Embedding -> Bidirectional(LSTM) -> Dense(softmax)`) is
`bidi.h5`, from the same data.

`reference.json` holds the recipe's own generation loop's text (re-tokenize
the seed, `pad_sequences([token_list], maxlen=max_len-1, padding='pre')`,
argmax of `model.predict`, append `" " + word`) from a seed shorter than the
window (so the padding is read) and from one longer (so the window is cut),
and `model.predict`'s probabilities for a few windows. The Dense bias at the
padding id 0 is set low, as in tools/make_keras_word_fixtures.py: the recipe
could otherwise choose padding (and print an empty word), which rnnstep
never generates.
"""

import json
import os

import numpy as np
import tf_keras
from tf_keras.preprocessing.sequence import pad_sequences
from tf_keras.preprocessing.text import Tokenizer

import fixture_dir  # tools/: the --out flag the fixture scripts share

# Sonnet 1, the exercise's corpus's first lines.
LINES = [
    "From fairest creatures we desire increase,",
    "That thereby beauty's rose might never die,",
    "But as the riper should by time decease,",
    "His tender heir might bear his memory:",
    "But thou, contracted to thine own bright eyes,",
    "Feed'st thy light's flame with self-substantial fuel,",
    "Making a famine where abundance lies,",
    "Thy self thy foe, to thy sweet self too cruel:",
]
SEEDS = ["From fairest", "But thou contracted to thine own bright eyes feed'st"]
NEXT_WORDS = 12
# Windows of ids probed for probabilities: a pre-padded one, a full one, one
# of padding only.
PROBES = ["thy sweet", "but as the riper should by time decease his tender",
          ""]


def recipe_loop(model, tokenizer, seed_text, max_len):
  """The recipe's own sampling loop (argmax), word for word."""
  for _ in range(NEXT_WORDS):
    token_list = tokenizer.texts_to_sequences([seed_text])[0]
    token_list = pad_sequences([token_list], maxlen=max_len - 1,
                               padding="pre")
    predicted = np.argmax(model.predict(token_list, verbose=0), axis=-1)
    output_word = ""
    for word, index in tokenizer.word_index.items():
      if index == predicted:
        output_word = word
        break
    seed_text += " " + output_word
  return seed_text


def main():
  out = fixture_dir.output_dir(__doc__, "tfip_words")
  tokenizer = Tokenizer()
  tokenizer.fit_on_texts(LINES)
  total_words = len(tokenizer.word_index) + 1
  input_sequences = []
  for line in LINES:
    token_list = tokenizer.texts_to_sequences([line])[0]
    for i in range(1, len(token_list)):
      input_sequences.append(token_list[:i + 1])
  max_len = max(len(x) for x in input_sequences)
  input_sequences = np.array(pad_sequences(input_sequences, maxlen=max_len,
                                           padding="pre"))
  predictors, label = input_sequences[:, :-1], input_sequences[:, -1]
  label = tf_keras.utils.to_categorical(label, num_classes=total_words)
  layers = tf_keras.layers
  tf_keras.utils.set_random_seed(5)
  models = {
      "sonnets.h5": tf_keras.Sequential([
          layers.Embedding(total_words, 12, input_length=max_len - 1),
          layers.Bidirectional(layers.LSTM(10, return_sequences=True)),
          layers.Dropout(0.2),
          layers.LSTM(8),
          layers.Dense(total_words // 2, activation="relu",
                       kernel_regularizer=tf_keras.regularizers.l2(0.01)),
          layers.Dense(total_words, activation="softmax")]),
      "bidi.h5": tf_keras.Sequential([
          layers.Embedding(total_words, 10, input_length=max_len - 1),
          layers.Bidirectional(layers.LSTM(8)),
          layers.Dense(total_words, activation="softmax")]),
  }
  reference = {"max_len": max_len, "seeds": SEEDS, "next_words": NEXT_WORDS,
               "probes": PROBES, "models": {}}
  for name, model in models.items():
    model.compile(loss="categorical_crossentropy",
                  optimizer=tf_keras.optimizers.Adam(learning_rate=0.02))
    model.fit(predictors, label, epochs=150, verbose=0)
    kernel, bias = model.layers[-1].get_weights()
    bias[0] = -30.0
    model.layers[-1].set_weights([kernel, bias])
    model.save(os.path.join(out, name), include_optimizer=False)
    windows = pad_sequences(tokenizer.texts_to_sequences(PROBES),
                            maxlen=max_len - 1, padding="pre")
    reference["models"][name] = {
        "texts": [recipe_loop(model, tokenizer, seed, max_len)
                  for seed in SEEDS],
        "windows": windows.tolist(),
        "probs": model.predict(windows, verbose=0).tolist()}
  with open(os.path.join(out, "tokenizer.json"), "w") as f:
    f.write(tokenizer.to_json())
  with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(reference, f, indent=1)
  print(f"wrote {', '.join(models)}, tokenizer.json and reference.json to "
        f"{out}")


if __name__ == "__main__":
  main()
