"""Recomputed windows: the whole network over the last k ids, at each token.

Some models cannot be stepped, nor kept in `window.py`'s slots:

  - a Keras `Bidirectional` layer's backward copy reads the window from its
    end, so every new token changes every backward step;
  - a window shorter than the model's T that the recipe fills at the front
    with the pad id (TensorFlow in Practice's `pad_sequences(...,
    padding='pre')`: the padding is input, embedded, not masked) is not
    "fewer steps from a zero state";
  - textgenrnn's attention averages every step's outputs over the window,
    weighted by all of them.

Such a model (`model_file.ModelConfig.recomputes`) is run as its recipe runs
it: at each generated token, over the last k ids (k = T, the model's
window), pre-padded with id 0 as `pad_sequences` pads, through every layer
(`Network.window_logits`: forward over the k steps, backward over them
reversed, the layers above, the attention, the head, the output Dense). The cost per token
is therefore O(k) cell steps, k sequential steps per layer and direction,
against one for a stepped model.

It runs inside the same one device loop as every generation: the decode loop
is `loop.run_decode`'s, with this step in place of the stateful one, and
the option pipeline's tails unchanged (every option, stop strings, regex and
scores work). The carried state is the window itself, int32 `[B, k]` (the
state width `request.WINDOW_IDS`): a stream's next chunk goes on from it.
"""

import tensorflow as tf

from rnnstep.engine import loop
from rnnstep.engine import request as request_lib

# The pad id a short window is filled with: Keras `pad_sequences`'s default
# value, a legacy Tokenizer's reserved index 0.
PAD_ID = 0


def state_sizes():
  """The state widths of a recomputed model: one "layer" holding the window."""
  return [(request_lib.WINDOW_IDS,)]


def prime(prompts: request_lib.Prompts, window):
  """Each row's window after its whole prompt: its last `window` ids, filled
  at the front with `PAD_ID` where the prompt is shorter (`pad_sequences`
  with padding and truncating 'pre').

  Returns:
    int32 `[B, window]`.
  """
  positions = prompts.lengths[:, None] - window + tf.range(window)[None, :]
  taken = tf.gather(prompts.ids, tf.maximum(positions, 0), batch_dims=1)
  return tf.where(positions >= 0, taken, PAD_ID)


def recomputed_loop(network, tail, num_steps, carry, progress, ids):
  """`loop.consume_then_choose` with the window recomputed at each step.

  The carry's state is the window `[B, k]`, its last id the carry's
  `last_ids` (already in the window). A step runs the network over the
  window (`Network.window_logits`), chooses the next id, and slides it in.
  Signature as `loop.run_decode`'s loops.
  """

  def cond(s: loop.LoopState):
    return (s.step < num_steps) & tf.logical_not(tf.reduce_all(
        s.progress.done))

  def body(s: loop.LoopState):
    ((window_ids,),) = s.state
    logits = network.window_logits(window_ids)
    chosen, _, progress = tail(logits, s.step, s.progress)
    window_ids = tf.concat([window_ids[:, 1:], chosen[:, None]], 1)
    return loop.LoopState(s.step + 1, ((window_ids,),), chosen, (), progress,
                          (), s.ids.write(s.step, chosen))

  (end,) = tf.while_loop(cond, lambda s: (body(s),), (loop.LoopState(
      tf.constant(0), carry.state, carry.last_ids, (), progress, (), ids),))
  return end


def generate(network, request: request_lib.Request, window, plain=None):
  """A whole recomputed generation (`Generator.window_fn`'s body; `plain` as
  `loop.run_decode`'s)."""
  state = ((prime(request.prompts, window),),)
  carry = loop.start_carry(network, request, unconsumed=0, state=state)
  return run_decode(network, request, carry, plain)


def run_decode(network, request: request_lib.Request, carry, plain=None):
  """`loop.run_decode` over recomputed windows, on from `carry` (whose
  window holds k, the window length)."""
  return loop.run_decode(network, request, carry, chooses_first=False,
                         steps_loop=recomputed_loop, plain=plain)


def score(network, ids, window):
  """Teacher-forced logits `[B, T, V]` for ids `[B, T]`: position t holds
  the logits after the pre-padded window of the last `window` ids up to t."""
  length = tf.shape(ids)[1]
  logits = tf.TensorArray(tf.float32, size=length,
                          element_shape=[None, network.vocab_size])

  def column(t, logits):
    prompts = request_lib.Prompts(ids, tf.fill([tf.shape(ids)[0]], t + 1))
    return t + 1, logits.write(t, network.window_logits(prime(prompts,
                                                              window)))

  _, logits = tf.while_loop(lambda t, _: t < length, column,
                            (tf.constant(0), logits))
  return tf.transpose(logits.stack(), [1, 0, 2])
