"""The TensorFlow tutorial's generation loops around a Keras 3 model (baselines)."""

import os

from bench import weights as weights_lib


def build_keras_model(weights):
  """The tutorial's model class (Keras 3), holding `weights`.

  The class is the tests' copy of the tutorial's MyModel
  (tests/support/keras_models.py), at the benchmark's size.
  """
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests.support import keras_models  # pylint: disable=g-import-not-at-top
  model = keras_models.tutorial_model(
      keras, keras3=True, vocab_size=weights.vocab_size,
      embedding_dim=weights.embedding_dim, rnn_units=weights.units)
  model(tf.zeros([1, 1], tf.int32))  # Builds the weights.
  t = weights.tensors
  model.embedding.set_weights([t["embedding"]])
  model.gru.set_weights([t["layer0_kernel"], t["layer0_recurrent_kernel"],
                         t["layer0_bias"]])
  model.dense.set_weights([t["dense_kernel"], t["dense_bias"]])
  return model


class EagerKeras:
  """The old tutorial loop: model(x) eagerly per char, then tf.random.categorical."""

  def __init__(self, keras_model, weights, settings):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf = tf
    self.model = keras_model
    self.mask = tf.constant(weights_lib.banned_mask(weights))
    self.temperature = settings.temperature
    self.steps = settings.eager_steps

  def __call__(self, prompt_ids, seed):
    # No tf.random.set_seed here: it clears TensorFlow's eager kernel cache, so
    # the next call of ANY tf.function re-instantiates (re-optimizes) its graph
    # (~0.15 s for rnnstep's): the global seed is set once, in main().
    del seed
    tf = self.tf
    x = tf.constant(prompt_ids)
    states = None
    out = []
    for _ in range(self.steps):
      logits, states = self.model(x, states=states, return_state=True)
      logits = logits[:, -1, :] / self.temperature + self.mask
      x = tf.random.categorical(logits, num_samples=1, dtype=tf.int32)
      out.append(x)
    return tf.concat(out, 1).numpy()


class OneStepKeras:
  """The tutorial's OneStep: one tf.function call per character."""

  def __init__(self, keras_model, weights, settings):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf = tf
    self.model = keras_model
    self.mask = tf.constant(weights_lib.banned_mask(weights))
    self.temperature = settings.temperature
    self.steps = settings.onestep_steps
    self.generate_one_step = tf.function(self._generate_one_step)

  def _generate_one_step(self, input_ids, states=None):
    tf = self.tf
    predicted_logits, states = self.model(inputs=input_ids, states=states,
                                          return_state=True)
    predicted_logits = predicted_logits[:, -1, :] / self.temperature
    predicted_logits = predicted_logits + self.mask
    predicted_ids = tf.random.categorical(predicted_logits, num_samples=1,
                                          dtype=tf.int32)
    return predicted_ids, states

  def __call__(self, prompt_ids, seed):
    del seed  # See EagerKeras: the global seed is set once, in main().
    tf = self.tf
    ids = tf.constant(prompt_ids)
    states = None
    out = []
    for _ in range(self.steps):
      ids, states = self.generate_one_step(ids, states=states)
      out.append(ids)
    return tf.concat(out, 1).numpy()

