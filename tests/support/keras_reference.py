"""Real Keras 3 models as the reference that rnnstep must match (tests only).

`build(layers, vocab_size, embedding_dim, seed)` makes
Embedding -> recurrent layers -> Dense with Keras' own initializers, and
`rnnstep_model(keras_model, layers, vocab)` copies its weights, as raw arrays,
into an `rnnstep.Model` without going through any file or converter, so these
tests pin the kernel alone.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import network as model_lib

GRU = model_file.LayerConfig("gru", 0, True)


def layer(kind, units, reset_after=True):
  return model_file.LayerConfig(kind, units, reset_after)


def build(layers, vocab_size=65, embedding_dim=16, seed=0, bias_scale=0.3):
  """A Keras 3 model `ids [B, T] -> logits [B, T, V]` with random weights.

  Biases (zero at Keras init) are set to random values so that every bias
  term of the cell equations is exercised.
  """
  keras.utils.set_random_seed(seed)
  inputs = keras.Input(shape=(None,), dtype="int32")
  x = keras.layers.Embedding(vocab_size, embedding_dim)(inputs)
  for spec in layers:
    if spec.kind == "gru":
      x = keras.layers.GRU(spec.units, return_sequences=True,
                           reset_after=spec.reset_after)(x)
    elif spec.kind == "lstm":
      x = keras.layers.LSTM(spec.units, return_sequences=True)(x)
    else:  # SimpleRNN, tanh or relu (`kinds.Kind.activation`).
      x = keras.layers.SimpleRNN(
          spec.units, return_sequences=True,
          activation=kinds.get(spec.kind).activation)(x)
  outputs = keras.layers.Dense(vocab_size)(x)
  model = keras.Model(inputs, outputs)
  rng = np.random.default_rng(seed)
  for lay in model.layers:
    weights = lay.get_weights()
    if weights and not isinstance(lay, keras.layers.Embedding):
      weights[-1] = rng.normal(0, bias_scale, weights[-1].shape).astype(np.float32)
      lay.set_weights(weights)
  return model


def lively(keras_model, embedding_scale=40.0, recurrent_scale=3.0,
           dense_scale=3.0, deep_kernel_scale=5.0):
  """Scales a `build` model's weights so that greedy text depends on the prompt.

  At Keras' initial scales a random model's greedy text is one character
  repeated whatever the prompt, which lets a wrong prompt, state or path
  through unseen; these scales give varied, prompt-dependent text that is
  still not chaotic for GRU and LSTM stacks (float32 rounding does not part
  Keras and rnnstep). A tanh SimpleRNN turns chaotic near recurrent_scale 2:
  use 1.5 there.

  Args:
    keras_model: a model made by `build`.
    embedding_scale: for the embedding (the first layer's input).
    recurrent_scale: for every recurrent kernel.
    dense_scale: for the output kernel.
    deep_kernel_scale: for the input kernels of the second layer on.

  Returns:
    The same model, for chaining.
  """
  recurrent = 0
  for lay in keras_model.layers:
    weights = lay.get_weights()
    if isinstance(lay, keras.layers.Embedding):
      lay.set_weights([weights[0] * embedding_scale])
    elif len(weights) == 3:
      kernel_scale = deep_kernel_scale if recurrent else 1.0
      recurrent += 1
      lay.set_weights([weights[0] * kernel_scale, weights[1] * recurrent_scale,
                       weights[2]])
    elif len(weights) == 2:
      lay.set_weights([weights[0] * dense_scale, weights[1]])
  return keras_model


def weights_of(keras_model, layers):
  """The model-file tensor dict of a model made by `build`."""
  weight_layers = [l for l in keras_model.layers if l.get_weights()]
  tensors = {"embedding": weight_layers[0].get_weights()[0]}
  for i in range(len(layers)):
    kernel, recurrent_kernel, bias = weight_layers[1 + i].get_weights()
    tensors[f"layer{i}_kernel"] = kernel
    tensors[f"layer{i}_recurrent_kernel"] = recurrent_kernel
    tensors[f"layer{i}_bias"] = bias
  tensors["dense_kernel"], tensors["dense_bias"] = weight_layers[-1].get_weights()
  return tensors


def from_weights(tensors, layers):
  """A Keras model made by `build`, holding a model-file tensor dict's weights.

  For model files written without Keras (e.g. tests/support/cli.py's
  `write_model`): the same weights in a real Keras model, as the reference.
  """
  vocab_size, embedding_dim = tensors["embedding"].shape
  keras_model = build(layers, vocab_size, embedding_dim)
  weight_layers = [l for l in keras_model.layers if l.get_weights()]
  weight_layers[0].set_weights([tensors["embedding"]])
  for i in range(len(layers)):
    weight_layers[1 + i].set_weights([tensors[f"layer{i}_{part}"] for part in
                                      ("kernel", "recurrent_kernel", "bias")])
  weight_layers[-1].set_weights([tensors["dense_kernel"], tensors["dense_bias"]])
  return keras_model


def default_vocab(vocab_size):
  return [chr(ord(" ") + i) for i in range(vocab_size)]


def rnnstep_model(keras_model, layers, vocab=None, dtype="float32"):
  """An rnnstep Model holding the same weights as `keras_model`."""
  embedding = keras_model.layers[1].get_weights()[0]
  vocab = vocab or default_vocab(embedding.shape[0])
  config = model_file.ModelConfig(int(embedding.shape[1]), tuple(layers))
  return model_lib.Model(config, vocab, weights_of(keras_model, layers), dtype)


def greedy(keras_model, prompt_ids, num_steps, banned=()):
  """Keras greedy decoding by re-running the model on the whole sequence.

  Slow (quadratic) but plainly correct: no state handling to get wrong.
  """
  forward = tf.function(lambda x: keras_model(x, training=False)[0, -1],
                        input_signature=[tf.TensorSpec([1, None], tf.int32)])
  ids = list(prompt_ids)
  out = []
  for _ in range(num_steps):
    logits = forward(np.array([ids], np.int32)).numpy()
    logits[list(banned)] = -np.inf
    ids.append(int(np.argmax(logits)))
    out.append(ids[-1])
  return out
