"""Window generation: each next character from the last k characters, from zero.

A model built for fixed windows (the keras.io char-LSTM recipe: its Input
fixes T timesteps and its last recurrent layer returns only the last output)
was trained, and is sampled by its recipe, on the last T characters from a
zero state: `model.predict(one_hot(text[-T:]))` per character. Stepping it
statefully samples from another distribution. Its model file records
`window: T` (`ModelConfig.window`), and generation then reads it that way by
default (`resolve`); `window=k` reads any model so.

Run naively, each character costs T sequential cell steps. Here it costs one:
every row keeps `k` windows in flight, in slots, as extra rows of the state
(`[B*k, U]` per state tensor; row r's slot j is state row `r*k + j`). The
character at position p (0-based, over prompt + continuation):

  1. resets slot `p mod k` to the zero state: a window starts at p;
  2. is consumed by every slot of its row: one cell step over `B*k` rows (the
     input projection is the same table row broadcast over the slots);
  3. leaves slot `(p + 1) mod k` holding exactly the last k characters
     `p-k+1 .. p` (it started at p-k+1), whose top output alone goes through
     the Dense layer: the logits for position p+1 (`B` rows, not `B*k`).

That slot is reset by the next character, so it is recycled as the newest
window. Before p = k-1 no window is full: the slot read then has never been
reset and holds the whole text so far from the zero state, which is what the
recipe's own loop would compute on a seed shorter than its window (Keras
masks nothing there, so the recipe itself needs a seed of at least T
characters; with one the two agree exactly).

The decode loop is `loop.run_decode`'s, with this step in place of the stateful
one (`windows_loop`), and the option pipeline's tails unchanged: every option,
stop strings and scores work as they do statefully. It is one
`tf.while_loop`; `k` is a tensor (under XLA a compile-time constant, like the
output capacity: one program per distinct k, and the model's own k is the
usual one).
"""


import tensorflow as tf

from rnnstep.engine import loop
from rnnstep.engine import recompute
from rnnstep.engine import request as request_lib
from rnnstep import errors
from rnnstep.model import model_file
from rnnstep.model import network as network_lib


def resolve(model, window) -> int:
  """The window a call runs: `window` given, else the model's own, else 0.

  Raises:
    errors.ArgumentError: a window above the model file format's bound, or
      0 for a model that is recomputed over windows (it cannot be stepped).
  """
  if window is None:
    return int(model.config.window or 0)
  if window > model_file.MAX_WINDOW:
    raise errors.ArgumentError(
        "window", f"window must be at most {model_file.MAX_WINDOW} (as a "
        f"model file's), got {window}")
  if not window and model.config.recomputes:
    raise errors.ArgumentError("window", f"window=0: {CANNOT_STEP}; give no "
                               "window (the model's own) or window=k > 0")
  return int(window)


# Why a recomputed model (`recompute.py`) has no stateful step.
CANNOT_STEP = ("this model cannot be stepped statefully (a bidirectional "
               "layer reads its window from the end, an attention layer "
               "reads every step of it, or its windows are padded at the "
               "front): it is run over its whole window at each token")


# Why beam search takes no window (here and in the served graph's check).
BEAMS_STEP_STATEFULLY = "beam search steps the model statefully"


def check_beams(window: int, num_beams: int, model_window) -> None:
  """Refuses beam search over windows (it steps the model statefully).

  Raises:
    errors.ArgumentError: naming num_beams.
  """
  if window and num_beams > 1:
    whose = (" (the window the model records)" if model_window == window
             else "")
    raise errors.ArgumentError(
        "num_beams", f"num_beams={num_beams} with window={window}{whose}: "
        f"{BEAMS_STEP_STATEFULLY}; pass window=0 for beam search, or "
        "num_beams=1")


def zero_slots(network, batch, window):
  """The zero state of `batch` rows' `window` slots: `[batch*window, U]`s."""
  return network.zero_state(batch * window)


def slot_step(network, x_proj, state, positions, window):
  """Consumes one character per row in every slot of the row.

  Args:
    network: the `Network`.
    x_proj: float32 `[B, G*U_0]`, layer 0's input projection of the ids.
    state: the slots' state, one tuple of `[B*window, U]` per layer.
    positions: int32 `[B]`, the position of the consumed character.
    window: int32 `[]`, k.

  Returns:
    `(logits [B, V], state)`: the logits of the full window (the last k
    characters, fewer before position k-1), and the slots' new state.
  """
  batch = tf.shape(positions)[0]
  slots = tf.range(window)[None, :]
  fresh = tf.reshape(tf.equal(slots, (positions % window)[:, None]), [-1, 1])
  state = tuple(tuple(tf.where(fresh, tf.zeros_like(s), s) for s in layer)
                for layer in state)
  width = tf.shape(x_proj)[1]
  rows = tf.reshape(tf.broadcast_to(x_proj[:, None, :],
                                    [batch, window, width]),
                    [batch * window, width])
  top, state = network.advance_projected(rows, state)
  full = tf.range(batch) * window + (positions + 1) % window
  return network.logits(tf.gather(top, full)), state


def prime(network, prompts: request_lib.Prompts, window, unconsumed: int = 1):
  """The slots after each row's prompt but its last `unconsumed` characters.

  Prompts start at position 0, so column t is position t for every row;
  a row's columns past its own prompt leave its slots as they are.

  Returns:
    The slots' state, one tuple of `[B*window, U]` per layer.
  """
  batch = tf.shape(prompts.ids)[0]
  steps = tf.reduce_max(prompts.lengths) - unconsumed
  keep_rows = lambda t: tf.reshape(tf.broadcast_to(
      (t < prompts.lengths - unconsumed)[:, None], [batch, window]), [-1, 1])

  def column(t, state):
    _, new_state = slot_step(
        network, tf.gather(network.input_table, prompts.ids[:, t]), state,
        tf.fill([batch], t), window)
    keep = keep_rows(t)
    return t + 1, tuple(
        tuple(tf.where(keep, new, old) for new, old in zip(new_layer, layer))
        for new_layer, layer in zip(new_state, state))

  _, state = tf.while_loop(lambda t, state: t < steps, column,
                           (tf.constant(0),
                            zero_slots(network, batch, window)))
  return state


def windows_loop(network, tail, num_steps, carry, progress, ids, *,
                 window, prompt_lengths):
  """`loop.consume_then_choose` with the windowed step (`slot_step`).

  A step consumes each row's last id at its position (prompt length - 1 +
  the global step) in every slot, then chooses the next id from the full
  window's logits. Signature as `loop.run_decode`'s loops, plus `window` and the
  rows' `prompt_lengths` (which fix each row's positions).
  """
  first_position = prompt_lengths - 1 + carry.step

  def cond(s: loop.LoopState):
    return (s.step < num_steps) & tf.logical_not(tf.reduce_all(
        s.progress.done))

  def body(s: loop.LoopState):
    logits, state = slot_step(network, s.ahead, s.state,
                              first_position + s.step, window)
    chosen, x_proj, progress = tail(logits, s.step, s.progress)
    return loop.LoopState(s.step + 1, state, chosen, x_proj, progress, (),
                          s.ids.write(s.step, chosen))

  (end,) = tf.while_loop(cond, lambda s: (body(s),), (loop.LoopState(
      tf.constant(0), carry.state, carry.last_ids,
      network.first_projection(carry.last_ids), progress, (), ids),))
  return end


def generate(network, request: request_lib.Request, window, plain=None):
  """A whole windowed generation (`Generator.window_fn`'s body; `plain` as
  `loop.run_decode`'s)."""
  state = prime(network, request.prompts, window)
  carry = loop.start_carry(network, request, unconsumed=1, state=state)
  return run_decode(network, request, carry, window, plain)


def run_decode(network, request: request_lib.Request, carry, window,
               plain=None):
  """`loop.run_decode` over windows, on from a windowed `carry`."""

  def steps_loop(*args):
    return windows_loop(*args, window=window,
                        prompt_lengths=request.prompts.lengths)

  return loop.run_decode(network, request, carry, chooses_first=False,
                         steps_loop=steps_loop, plain=plain)


def score(network, ids, window):
  """Teacher-forced window logits `[B, T, V]` for ids `[B, T]`.

  Position t holds the logits after the last `window` ids up to t
  (`ids[:, max(0, t-window+1) : t+1]`) from a zero state.
  """
  batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
  logits = tf.TensorArray(tf.float32, size=length,
                          element_shape=[None, network.vocab_size])

  def column(t, state, logits):
    out, state = slot_step(network, tf.gather(network.input_table, ids[:, t]),
                           state, tf.fill([batch], t), window)
    return t + 1, state, logits.write(t, out)

  _, _, logits = tf.while_loop(
      lambda t, *_: t < length, column,
      (tf.constant(0), zero_slots(network, batch, window), logits))
  return tf.transpose(logits.stack(), [1, 0, 2])


def score_function(model):
  """The model's compiled `(ids [B, T], window []) -> logits [B, T, V]`.

  One TF graph call with a fixed signature, built once per architecture (the
  model's weights are passed at each call, as `functions.sequence_function`).
  """
  architecture = model.architecture

  # A model that recomputes its windows scores each one whole.
  scores = (recompute.score if architecture.config.recomputes else score)

  def build():
    def window_score(weights, ids, window):
      return scores(network_lib.network_of(architecture, weights), ids, window)
    return tf.function(window_score, autograph=False, input_signature=[
        model.weights_spec(), tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([], tf.int32)])

  return network_lib.BoundFunction(
      network_lib.shared_function(architecture, "window_score", build),
      model.network_weights)
