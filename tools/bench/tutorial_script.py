"""The TensorFlow text-generation tutorial's generation script, as a process.

    python tools/bench/tutorial_script.py MODEL.npz NUM_STEPS [PROMPT]

What a reader of the tutorial runs to sample a trained model: import
TensorFlow and Keras 3, build the tutorial's `MyModel` (Embedding, GRU with
`return_state`, Dense) holding the model file's weights, wrap it in the
tutorial's `OneStep` (string ids through `StringLookup`, `[UNK]` masked,
`tf.random.categorical` on the last logits, one `tf.function` call per
character) and print prompt + NUM_STEPS characters. `tools/bench/cli.py`
times it as a whole process beside `rnnstep-generate` on the same weights.

The model file must hold one GRU layer (the tutorial's architecture), as the
bundled model does. The file is read with `rnnstep.model.model_file`, which
imports neither TensorFlow nor the rest of rnnstep (the tutorial restores a
checkpoint instead; both are a small part of the process).
"""

import os
import pathlib
import sys


def main(argv):
  model_path, num_steps = argv[1], int(argv[2])
  prompt = argv[3] if len(argv) > 3 else "ROMEO:"
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  # pylint: disable=g-import-not-at-top
  from rnnstep.model import model_file
  import keras
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top

  data = model_file.read(model_path)
  (layer,) = data.config.layers
  assert layer.kind == "gru", "the tutorial's model is one GRU layer"
  # The tutorial's vocabulary has "[UNK]" at id 0 (StringLookup's OOV id); a
  # model file without it (the bundled model) gets a lookup without OOV ids,
  # so that ids mean the same characters as in the file.
  has_unk = data.vocab[0] == "[UNK]"
  chars = list(data.vocab[1:] if has_unk else data.vocab)
  ids_from_chars = keras.layers.StringLookup(
      vocabulary=chars, mask_token=None, num_oov_indices=int(has_unk))
  chars_from_ids = keras.layers.StringLookup(
      vocabulary=ids_from_chars.get_vocabulary(), invert=True, mask_token=None,
      num_oov_indices=int(has_unk))
  vocab_size = len(ids_from_chars.get_vocabulary())
  assert vocab_size == len(data.vocab)

  class MyModel(keras.Model):  # The tutorial's model class (Keras 3).

    def __init__(self, vocab_size, embedding_dim, rnn_units):
      super().__init__()
      self.embedding = keras.layers.Embedding(vocab_size, embedding_dim)
      self.gru = keras.layers.GRU(rnn_units, return_sequences=True,
                                  return_state=True)
      self.dense = keras.layers.Dense(vocab_size)

    def call(self, inputs, states=None, return_state=False, training=False):
      x = self.embedding(inputs, training=training)
      x, states = self.gru(x, initial_state=states, training=training)
      x = self.dense(x, training=training)
      return (x, states) if return_state else x

  model = MyModel(vocab_size, data.config.embedding_dim, layer.units)
  model(tf.zeros([1, 1], tf.int32))  # Builds the weights.
  t = data.tensors
  model.embedding.set_weights([t["embedding"]])
  model.gru.set_weights([t["layer0_kernel"], t["layer0_recurrent_kernel"],
                         t["layer0_bias"]])
  model.dense.set_weights([t["dense_kernel"], t["dense_bias"]])

  class OneStep(keras.Model):  # The tutorial's OneStep.

    def __init__(self, model, chars_from_ids, ids_from_chars, temperature=1.0):
      super().__init__()
      self.temperature = temperature
      self.model = model
      self.chars_from_ids = chars_from_ids
      self.ids_from_chars = ids_from_chars
      self.prediction_mask = tf.zeros([vocab_size])
      if has_unk:  # As the tutorial: "[UNK]" is never generated.
        skip_ids = self.ids_from_chars(["[UNK]"])[:, None]
        sparse_mask = tf.SparseTensor(
            values=[-float("inf")] * len(skip_ids), indices=skip_ids,
            dense_shape=[vocab_size])
        self.prediction_mask = tf.sparse.to_dense(sparse_mask)

    @tf.function
    def generate_one_step(self, inputs, states=None):
      input_chars = tf.strings.unicode_split(inputs, "UTF-8")
      input_ids = self.ids_from_chars(input_chars).to_tensor()
      predicted_logits, states = self.model(inputs=input_ids, states=states,
                                            return_state=True)
      predicted_logits = predicted_logits[:, -1, :] / self.temperature
      predicted_logits = predicted_logits + self.prediction_mask
      predicted_ids = tf.random.categorical(predicted_logits, num_samples=1)
      predicted_ids = tf.squeeze(predicted_ids, axis=-1)
      return self.chars_from_ids(predicted_ids), states

  one_step_model = OneStep(model, chars_from_ids, ids_from_chars)
  states = None
  next_char = tf.constant([prompt])
  result = [next_char]
  for _ in range(num_steps):
    next_char, states = one_step_model.generate_one_step(next_char,
                                                         states=states)
    result.append(next_char)
  print(tf.strings.join(result)[0].numpy().decode("utf-8"))


if __name__ == "__main__":
  main(sys.argv)
