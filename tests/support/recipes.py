"""The public recipes' models (tests/test_convert_recipes.py), built with real Keras.

`build_all(keras, out, keras2)` saves the keras.io char-LSTM recipe's model
and a textgenrnn-shaped graph in every file kind that Keras writes, with the
reference logits and greedy text; tf_keras builds them in a subprocess,
`python -m tests.support.recipes OUT` with TF_USE_LEGACY_KERAS=1.
`recipe_text()` is the recipe's text preparation (tests/test_window.py too).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXCERPT = os.path.join(REPO, "tests", "data",
                       "tinyshakespeare_heldout_excerpt.txt")
WINDOW = 12
UNITS = 16
TOLERANCE = 1e-5
GREEDY_STEPS = 30


def recipe_text():
  """The recipe's text preparation: lower case, newlines as spaces."""
  with open(EXCERPT, encoding="utf-8") as f:
    return f.read()[:3000].lower().replace("\n", " ")


def build_one_hot(keras, out, keras2: bool):
  """Saves the recipe's model in every file kind this Keras writes, and the
  reference; returns {"files": {kind: path}, "ref": path, "vocab": path}."""
  chars = sorted(set(recipe_text()))
  size = len(chars)
  model = keras.Sequential([
      keras.Input(shape=(WINDOW, size)), keras.layers.LSTM(UNITS),
      keras.layers.Dense(size, activation="softmax")])
  rng = np.random.default_rng(3)
  model.set_weights([rng.uniform(-0.8, 0.8, w.shape).astype(np.float32)
                     for w in model.get_weights()])
  prefix = os.path.join(out, "k2" if keras2 else "k3")
  files = {"keras": f"{prefix}.keras", "legacy_h5": f"{prefix}.h5"}
  model.save(files["keras"])
  model.save(files["legacy_h5"])
  if keras2:
    files["weights_h5"] = f"{prefix}_w.h5"
    files["tf_checkpoint"] = f"{prefix}_ckpt/ckpt_1"
    model.save_weights(files["tf_checkpoint"])  # The TF format (a prefix).
  else:
    files["weights_h5"] = f"{prefix}.weights.h5"
    files["tf_checkpoint"] = f"{prefix}_ckpt/ckpt"
    tf.train.Checkpoint(model=model).write(files["tf_checkpoint"])
  model.save_weights(files["weights_h5"])
  lstm, dense = model.layers
  probe = keras.Sequential([
      keras.Input(shape=(None, size)),
      keras.layers.LSTM(UNITS, return_sequences=True),
      keras.layers.Dense(size)])
  probe.layers[0].set_weights(lstm.get_weights())
  probe.layers[1].set_weights(dense.get_weights())

  def forward(ids):
    return np.asarray(probe(tf.one_hot(np.asarray(ids)[None], size)))[0]

  text = recipe_text()
  ids = [chars.index(c) for c in text[:40]]
  prompt = text[40:52]
  greedy = [chars.index(c) for c in prompt]
  for _ in range(GREEDY_STEPS):
    last = forward(greedy)[-1]
    top2 = np.sort(last)[-2:]
    assert top2[1] - top2[0] > 1e-4, "near tie on the greedy path; reseed"
    greedy.append(int(np.argmax(last)))
  ref = f"{prefix}.ref.npz"
  np.savez(ref, ids=np.array(ids), logits=forward(ids), prompt=np.array(prompt),
           greedy=np.array("".join(chars[i] for i in greedy[len(prompt):])))
  vocab = os.path.join(out, "vocab.json")
  with open(vocab, "w", encoding="utf-8") as f:
    json.dump(chars, f)
  return {"files": files, "ref": ref, "vocab": vocab, "chars": chars}


def build_textgenrnn_like(keras, out, keras2: bool):
  """textgenrnn's graph with its layer names, and its kind of vocab file."""

  class AttentionWeightedAverage(keras.layers.Layer):
    """textgenrnn's pooling layer: a softmax-weighted average over time."""

    def build(self, input_shape):
      self.W = self.add_weight(shape=(input_shape[-1], 1), name="W")  # pylint: disable=invalid-name

    def call(self, x):
      weights = tf.nn.softmax(tf.squeeze(tf.matmul(x, self.W), -1), axis=-1)
      return tf.reduce_sum(x * weights[..., None], axis=1)

  vocab_size, window = 12, 8
  inputs = keras.Input(shape=(window,), name="input")
  embedded = keras.layers.Embedding(vocab_size, 6, name="embedding")(inputs)
  rnn_1 = keras.layers.LSTM(8, return_sequences=True, name="rnn_1")(embedded)
  rnn_2 = keras.layers.LSTM(8, return_sequences=True, name="rnn_2")(rnn_1)
  joined = keras.layers.concatenate([embedded, rnn_1, rnn_2],
                                    name="rnn_concat")
  pooled = AttentionWeightedAverage(name="attention")(joined)
  outputs = keras.layers.Dense(vocab_size, activation="softmax",
                               name="output")(pooled)
  model = keras.Model(inputs, outputs)
  prefix = os.path.join(out, "textgenrnn_k2" if keras2 else "textgenrnn_k3")
  files = {"full_h5": f"{prefix}.h5"}
  model.save(files["full_h5"])  # Its config names the custom class.
  if keras2:  # textgenrnn's bundled weights: Keras 2 save_weights, HDF5.
    files["weights_hdf5"] = f"{prefix}_weights.hdf5"
  else:
    files["weights_hdf5"] = f"{prefix}.weights.h5"
  model.save_weights(files["weights_hdf5"])
  # textgenrnn's vocabulary file: {token: index}, with a '<s>' token.
  tokens = {"<s>": vocab_size - 1, **{c: i + 1 for i, c in
                                       enumerate("abcdefghij")}}
  vocab = os.path.join(out, "textgenrnn_vocab.json")
  with open(vocab, "w", encoding="utf-8") as f:
    json.dump(tokens, f)
  return {"files": files, "vocab": vocab}


def build_all(keras, out, keras2: bool):
  cases = {"one_hot": build_one_hot(keras, out, keras2),
           "textgenrnn": build_textgenrnn_like(keras, out, keras2)}
  with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
    json.dump(cases, f)
  return cases


if __name__ == "__main__":  # tf_keras, in a subprocess.
  import tf_keras  # pylint: disable=g-import-not-at-top
  build_all(tf_keras, sys.argv[1], keras2=True)
  sys.exit(0)
