"""Writes the Keras TextVectorization fixtures of tests/test_tokens.py (needs
Keras 3, the test extras).

    python tools/make_keras_text_vectorization_fixtures.py     # into tests/data/keras_text_vectorization/
    python tools/make_keras_text_vectorization_fixtures.py --out=/tmp/x

A word-level language model whose vocabulary lives in the `.keras` file, the
way Keras 3 users build one: a `TextVectorization` layer adapted on the
corpus (its defaults: `lower_and_strip_punctuation`, `whitespace`; "" the
mask at id 0, "[UNK]" at id 1), and `Embedding -> GRU -> Dense` over its ids,
trained briefly on next-word prediction (padding targets weighted 0). Two
files, one per common form:

  - `direct.keras`: `Input(shape=(1,), dtype="string") -> TextVectorization
    -> Embedding -> GRU(return_sequences=True) -> Dense`, one Functional
    model (the vocabulary is the archive's `vocabulary.txt` asset);
  - `nested.keras`: the layer used outside a Sequential
    `Embedding -> LSTM -> Dense` trained on ids, then both saved as one
    end-to-end model (`Model(text, lm(vectorize(text)))`, keras.io's
    "end-to-end model" pattern), the vocabulary given to the layer at
    construction (kept in its config).

The Dense biases of "" and "[UNK]" are set low, so that greedy text never
chooses them. `reference.json` holds, per file, the model's logits for
`PROBE` (every position) and the greedy words of Keras's own loop from
`SEED`: call the model on the text so far, argmax at its last position,
append " " + the word, `NEXT_WORDS` times.
"""

import json
import os

import keras
import numpy as np
import tensorflow as tf

import fixture_dir  # tools/: the --out flag the fixture scripts share

LINES = ["The cat sat on the mat.", "The dog sat on the log!",
         "A cat and a dog ran to the mat, and the cat sat.",
         "The dog ran; the cat sat on the dog's mat."]
SEED = "The Cat, on the"
NEXT_WORDS = 12
PROBE = "The dog ran to the cat's MAT!"


def _next_word_data(vectorize):
  """Each line's ids, the next id as the target (padding weighted 0)."""
  ids = vectorize(tf.constant(LINES)).numpy()
  targets = np.concatenate([ids[:, 1:], np.zeros_like(ids[:, :1])], 1)
  return ids, targets, (targets > 0).astype("float32")


def _train(model, inputs, targets, weights):
  model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.02),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  model.fit(inputs, targets, sample_weight=weights, epochs=150, verbose=0)


def _ban_special(dense):
  kernel, bias = dense.get_weights()
  bias[:2] = -30.0  # "" (the mask) and "[UNK]".
  dense.set_weights([kernel, bias])


def _reference(model, vocab):
  """The model's logits for PROBE and Keras's greedy loop from SEED."""
  logits = model(tf.constant([[PROBE]])).numpy()[0]
  text, words = SEED, []
  for _ in range(NEXT_WORDS):
    step = model(tf.constant([[text]])).numpy()[0, -1]
    word = vocab[int(np.argmax(step))]
    words.append(word)
    text += " " + word
  return {"probe_logits": logits.tolist(), "greedy": words}


def main():
  out = fixture_dir.output_dir(__doc__, "keras_text_vectorization")
  keras.utils.set_random_seed(5)
  reference = {"seed": SEED, "next_words": NEXT_WORDS, "probe": PROBE}

  # One Functional model, strings in.
  vectorize = keras.layers.TextVectorization()
  vectorize.adapt(LINES)
  vocab = vectorize.get_vocabulary()
  size = len(vocab)
  text = keras.Input(shape=(1,), dtype="string")
  hidden = keras.layers.Embedding(size, 8)(vectorize(text))
  hidden = keras.layers.GRU(16, return_sequences=True)(hidden)
  dense = keras.layers.Dense(size)
  direct = keras.Model(text, dense(hidden))
  ids, targets, weights = _next_word_data(vectorize)
  _train(direct, tf.constant([[line] for line in LINES]), targets, weights)
  _ban_special(dense)
  direct.save(os.path.join(out, "direct.keras"))
  reference["direct"] = dict(_reference(direct, vocab), vocab=vocab)

  # The layer used outside, saved with the model in one file.
  vectorize = keras.layers.TextVectorization(vocabulary=vocab[2:])
  lm = keras.Sequential([keras.Input((None,), dtype="int64"),
                         keras.layers.Embedding(size, 8),
                         keras.layers.LSTM(16, return_sequences=True),
                         keras.layers.Dense(size)])
  _train(lm, ids, targets, weights)
  _ban_special(lm.layers[-1])
  text = keras.Input(shape=(1,), dtype="string")
  nested = keras.Model(text, lm(vectorize(text)))
  nested.save(os.path.join(out, "nested.keras"))
  reference["nested"] = dict(_reference(nested, vocab), vocab=vocab)

  with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(reference, f)
  print(f"wrote direct.keras, nested.keras and reference.json to {out}")


if __name__ == "__main__":
  main()
