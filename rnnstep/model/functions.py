"""A model's compiled whole-sequence functions with states: every
position's states and logits, and the final state alone.

Each is one `tf.function` with a fixed signature, built once per architecture
(`network.shared_function`) and bound to a model's weights
(`network.BoundFunction`): nothing retraces for a new batch, length, state or
model of the same shape. The library's logits and states and the inspection
call them; `Model.score` (logits without states) is `network.score_function`,
and generation has its own loops (`rnnstep.engine`).
"""

import tensorflow as tf

from rnnstep.model import cells as cells_lib
from rnnstep.model import network as network_lib


STATE_NAMES = ("h", "c")


def state_spec(model: network_lib.Model):
  """The `tf.TensorSpec`s of a `StackState` of any batch: per layer, one
  float32 `[None, size]` per state tensor."""
  return tuple(
      tuple(tf.TensorSpec([None, size], tf.float32)
            for size in cells_lib.state_sizes(layer))
      for layer in model.config.layers)


def sequence_function(model: network_lib.Model) -> network_lib.BoundFunction:
  """The model's compiled `(ids, mask, state) -> (sequences, logits)`.

  One TF graph call (`Network.unroll_states` then the Dense layer) with a
  fixed signature, built once per architecture (the model's weights are
  passed at each call): nothing retraces for a new batch size, length, state
  or model of the same shape.

  Args:
    model: the Model.

  Returns:
    A `BoundFunction` of `ids` int32 `[B, T]`, `mask` bool `[B, T]` (False
    on padding) and `state` (a `StackState` of float32 `[B, U]`) that returns
    `(sequences, logits)`: `unroll_states`' sequences, and the logits `[B, T,
    V]` after every position (at a padding position, those of the held state).
  """
  architecture = model.architecture

  def build():
    def sequences_and_logits(weights, ids, mask, state):
      network = network_lib.network_of(architecture, weights)
      sequences, _ = network.unroll_states(ids, state, mask)
      return sequences, network.logits(sequences[-1][0])

    return tf.function(
        sequences_and_logits, autograph=False, input_signature=[
            model.weights_spec(), tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([None, None], tf.bool), state_spec(model)])

  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, "sequences", build),
      model.network_weights)


def final_state_function(model: network_lib.Model) -> network_lib.BoundFunction:
  """The model's compiled `(ids, mask, state) -> final state`.

  `Network.unroll`'s final state alone: what `sequence_function` gives at
  the last position, without holding every position's state (a long
  prompt's RWKV-7 states would fill memory). Built once per architecture,
  with the same signature (nothing retraces for a new batch, length or
  state).

  Returns:
    A `BoundFunction` of `ids` int32 `[B, T]`, `mask` bool `[B, T]` (False
    on padding: a row's state is held there) and `state` (a `StackState`)
    that returns the `StackState` after each row.
  """
  architecture = model.architecture

  def build():
    def final_state(weights, ids, mask, state):
      network = network_lib.network_of(architecture, weights)
      _, final = network.unroll(ids, state, mask)
      return final

    return tf.function(
        final_state, autograph=False, input_signature=[
            model.weights_spec(), tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([None, None], tf.bool), state_spec(model)])

  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, "final_state", build),
      model.network_weights)
