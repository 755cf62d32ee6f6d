"""Writes the Keras word-model fixtures of tests/test_tokens.py (needs Keras
and tf_keras, the test extras).

    python tools/make_keras_word_fixtures.py               # into tests/data/keras_words/
    python tools/make_keras_word_fixtures.py --out=/tmp/x  # elsewhere

TensorFlow in Practice's word recipe ("Generating Text with Neural
Networks"), with its own code: a legacy `Tokenizer` fitted on the lines
(`tokenizer.json`: its `to_json()`), `Embedding -> LSTM -> Dense(softmax)`
over windows of `WINDOW` ids (the recipe's Bidirectional is left out:
rnnstep runs unidirectional stacks), trained briefly as the recipe trains
(every n-gram prefix of each line), saved as `words.keras`, and the
recipe's own generation loop (re-tokenize the seed, keep
the last `WINDOW` ids padded at the front, argmax, append " " + word) from
`SEED` (`reference.json`: its text, and the model's probabilities for one
window). The Dense bias at the padding id 0 is set low: the recipe could
otherwise choose padding (and print an empty word), which rnnstep never
generates.
"""

import json
import os

import keras
import numpy as np
from tf_keras.preprocessing.text import Tokenizer

import fixture_dir  # tools/: the --out flag the fixture scripts share

LINES = ["The cat sat on the mat.", "The dog sat on the log!",
         "A cat and a dog ran to the mat, and the cat sat."]
WINDOW = 4
SEED = "The Cat sat on the"
NEXT_WORDS = 10
PROBE = "cat sat on the"


def main():
  out = fixture_dir.output_dir(__doc__, "keras_words")
  tokenizer = Tokenizer(oov_token="<oov>")
  tokenizer.fit_on_texts(LINES)
  total_words = len(tokenizer.word_index) + 1
  keras.utils.set_random_seed(3)
  model = keras.Sequential([
      keras.Input((WINDOW,)), keras.layers.Embedding(total_words, 8),
      keras.layers.LSTM(16),
      keras.layers.Dense(total_words, activation="softmax")])
  # The recipe's training: every n-gram prefix of each line, padded at the
  # front to WINDOW + 1, the last id the label.
  input_sequences = []
  for line in LINES:
    token_list = tokenizer.texts_to_sequences([line])[0]
    for i in range(1, len(token_list)):
      input_sequences.append(token_list[:i + 1])
  input_sequences = keras.utils.pad_sequences(
      input_sequences, maxlen=WINDOW + 1, padding="pre")
  xs, labels = input_sequences[:, :-1], input_sequences[:, -1]
  ys = keras.utils.to_categorical(labels, num_classes=total_words)
  model.compile(loss="categorical_crossentropy",
                optimizer=keras.optimizers.Adam(learning_rate=0.01))
  model.fit(xs, ys, epochs=200, verbose=0)
  kernel, bias = model.layers[-1].get_weights()
  bias[0] = -30.0
  model.layers[-1].set_weights([kernel, bias])
  model.save(os.path.join(out, "words.keras"))
  with open(os.path.join(out, "tokenizer.json"), "w") as f:
    f.write(tokenizer.to_json())

  seed_text = SEED
  for _ in range(NEXT_WORDS):
    token_list = tokenizer.texts_to_sequences([seed_text])[0]
    token_list = keras.utils.pad_sequences([token_list], maxlen=WINDOW,
                                           padding="pre")
    predicted = np.argmax(model.predict(token_list, verbose=0), axis=-1)
    output_word = ""
    for word, index in tokenizer.word_index.items():
      if index == predicted:
        output_word = word
        break
    seed_text += " " + output_word
  probe = tokenizer.texts_to_sequences([PROBE])[0]
  with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump({"seed": SEED, "next_words": NEXT_WORDS, "text": seed_text,
               "window": WINDOW, "probe_ids": probe,
               "probe_probs": model.predict(np.array([probe]),
                                            verbose=0)[0].tolist(),
               "zebra_ids": tokenizer.texts_to_sequences(["The zebra!"])[0]},
              f, indent=1)
  print(f"wrote words.keras, tokenizer.json and reference.json to {out}")


if __name__ == "__main__":
  main()
