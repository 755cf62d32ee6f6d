"""The layers above the recurrent stack that are not the output Dense's
product: the head's Dense activations and textgenrnn's attention."""

import tensorflow as tf

from rnnstep.model import model_file


# Keras's `backend.epsilon()`, which textgenrnn's attention adds to its sum.
KERAS_EPSILON = 1e-7


def attention_weighted_average(x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
  """textgenrnn's `AttentionWeightedAverage` over a window, time-major.

  Its `call` (minimaxir/textgenrnn, textgenrnn/AttentionWeightedAverage.py,
  no mask: textgenrnn's Embedding has none), per row:

      logits_t = x_t . W                      W: [channels, 1], no bias
      a_t      = exp(logits_t - max_t logits_t)
      w_t      = a_t / (sum_t a_t + epsilon)  epsilon = 1e-7 (Keras's)
      result   = sum_t w_t * x_t

  Args:
    x: float32 `[T, B, C]`, the concatenated embedding and layer outputs.
    kernel: `[C, 1]`, the layer's W.

  Returns:
    float32 `[B, C]`.
  """
  logits = tf.tensordot(x, tf.cast(kernel, x.dtype), [[2], [0]])[..., 0]
  weights = tf.exp(logits - tf.reduce_max(logits, 0, keepdims=True))
  weights = weights / (tf.reduce_sum(weights, 0, keepdims=True)
                       + KERAS_EPSILON)
  return tf.reduce_sum(x * weights[..., None], 0)


def _gelu(x):
  return tf.nn.gelu(x, approximate=False)  # Keras's default.


# `model_file.DENSE_ACTIVATIONS`, each as the op Keras computes it with.
ACTIVATIONS = {
    "linear": tf.identity, "relu": tf.nn.relu, "relu6": tf.nn.relu6,
    "sigmoid": tf.sigmoid, "tanh": tf.tanh, "softplus": tf.nn.softplus,
    "softsign": tf.nn.softsign, "elu": tf.nn.elu, "selu": tf.nn.selu,
    "exponential": tf.exp, "swish": tf.nn.silu, "silu": tf.nn.silu,
    "gelu": _gelu, "mish": lambda x: x * tf.tanh(tf.nn.softplus(x)),
    "leaky_relu": lambda x: tf.nn.leaky_relu(x, 0.2),
    "softmax": tf.nn.softmax}
assert tuple(ACTIVATIONS) == model_file.DENSE_ACTIVATIONS
