"""The compiled device loops: priming, and the decode loop over a named state.

One generation call does, on device:

  1. `prime`: each row runs over its own prompt (all of it, or all but the
     last character, which the first decode step then consumes), masked so
     that padding never touches a row's state. Generation, beam search and
     the LiteRT loop all prime here;
  2. `run_decode`: a `tf.while_loop` over steps whose state is a `LoopState`;
     each step runs the cells and the projection, and hands the logits to a
     tail of the option pipeline (`pipeline.tails`), which chooses the next
     ids and advances each row's `pipeline.RowProgress`. The loop ends after
     `num_steps` or when every row has met a stop string.

Two orders of the same step (`consume_then_choose` for the xla and graph
paths, `choose_then_consume` for the elementwise path, see there) give the
same text.
"""

import functools
from typing import Any, NamedTuple, Optional

import tensorflow as tf

from rnnstep.decoding import pipeline
from rnnstep.decoding import processors
from rnnstep.engine import request as request_lib


class LoopState(NamedTuple):
  """The decode loop's variables.

  Attributes:
    step: int32 `[]`, steps taken in this call.
    state: the recurrent state, one tuple of `[B, U]` per layer.
    last_ids: int32 `[B]`, each row's last id.
    ahead: what the next step needs precomputed: layer 0's input projection
      of `last_ids` (`consume_then_choose`), or layer 0's h cast for the
      matmuls in reduced precision, else `()` (`choose_then_consume`).
    progress: the `pipeline.RowProgress`.
    running: bool `[]`, some row has not met a stop string
      (`choose_then_consume` computes it in its compiled call; `()` in the
      other loop, whose condition computes it).
    ids: the TensorArray of chosen ids, one `[B]` per step.
  """
  step: tf.Tensor
  state: tuple
  last_ids: tf.Tensor
  ahead: Any
  progress: pipeline.RowProgress
  running: Any
  ids: tf.TensorArray


def prime_mask(prompts: request_lib.Prompts, unconsumed: int) -> tf.Tensor:
  """bool `[B, T]`: the prompt positions a row's priming runs over."""
  width = tf.shape(prompts.ids)[1]
  return tf.range(width)[None, :] < (prompts.lengths[:, None] - unconsumed)


def prime(network, prompts: request_lib.Prompts, unconsumed: int, *,
          initial_state=None, stepwise: bool = False,
          batch_sized_chunks: bool = False):
  """The state after each row's prompt but its last `unconsumed` characters.

  Args:
    network: the model's `Network`.
    prompts: the `Prompts` (right-padded ids, lengths >= 1).
    initial_state: the state each row starts from (None: zeros).
    unconsumed: 1 where the first decode step consumes the last character,
      else 0.
    stepwise: with LiteRT's builtin ops (no TensorArray): one while loop
      over the columns through every layer instead of layer by layer; a
      network that unrolls block by block (RWKV-7), whose products then run
      over a chunk's rows at once, in chunks of `STEPWISE_PRIME_CHUNK`
      columns.
    batch_sized_chunks: a model priming in chunks (`primes_in_chunks`) takes
      chunks of `request.chunk_columns(batch)` columns rather than
      `PRIME_CHUNK` (the server's calls, whose pieces end where their
      prompts do, mostly short of the padded width).

  Returns:
    The state: one tuple of `[B, U]` per layer.
  """
  batch = tf.shape(prompts.ids)[0]
  mask = prime_mask(prompts, unconsumed)
  # Stops at the longest prompt, not the bucketed width; masked steps are
  # free of effect on a row's state.
  steps = tf.reduce_max(prompts.lengths) - unconsumed
  if initial_state is None:
    initial_state = network.zero_state(batch)
  # RWKV-7's unroll has builtin ops only (`RWKV7Cell.for_litert_converter`).
  if stepwise and all(cell.unrolls_blockwise for cell in network.cells):
    return _prime_in_chunks(network, prompts.ids, initial_state, mask, steps,
                            request_lib.STEPWISE_PRIME_CHUNK, static=True)
  if not stepwise and primes_in_chunks(network):
    chunk = (request_lib.chunk_columns(batch) if batch_sized_chunks
             else request_lib.PRIME_CHUNK)
    return _prime_in_chunks(network, prompts.ids, initial_state, mask, steps,
                            chunk)
  if not stepwise:
    _, state = network.unroll(prompts.ids, initial_state, mask, steps=steps)
    return state

  def column(t, state):
    _, new_state = network.advance(prompts.ids[:, t], state)
    keep = mask[:, t][:, None]
    return t + 1, tuple(
        tuple(tf.where(keep, new, old) for new, old in zip(new_layer, layer))
        for new_layer, layer in zip(new_state, state))

  _, state = tf.while_loop(lambda t, state: t < steps, column,
                           (tf.constant(0), initial_state))
  return state


def primes_in_chunks(network) -> bool:
  """Whether `prime` runs the prompt in chunks (`request.PRIME_CHUNK`): a
  network traced into one XLA program whose cell unrolls block by block
  (RWKV-7). Its unroll's products run over all of a sequence's rows at once,
  so under XLA, where shapes are static, it would cost the padded width and
  compile a program per width; in chunks it costs the prompt, rounded up to
  a chunk, and one program serves any width (`request.chunked_width`)."""
  return any(cell.unrolls_blockwise and cell.one_xla_program
             for cell in network.cells)


def _prime_in_chunks(network, ids, state, mask, steps, columns,
                     static=False):
  """`prime`'s unroll, `columns` columns at a time (at most the width; with
  `static`, exactly: the prompt is padded to whole chunks), for the first
  `steps` columns: a row's masked columns hold its state, so the chunks
  past its length (the padding) leave it as it was."""
  # Shapes of the inputs: compile-time constants to XLA.
  batch, width = tf.shape(ids)[0], tf.shape(ids)[1]
  chunk = columns if static else tf.minimum(columns, width)
  padding = -width % chunk
  count = (width + padding) // chunk
  chunks = lambda x: tf.transpose(tf.reshape(
      tf.pad(x, [[0, 0], [0, padding]]), [batch, count, chunk]), [1, 0, 2])
  ids, mask = chunks(ids), chunks(mask)

  def body(t, state):
    _, state = network.unroll(ids[t], state, mask[t])
    return t + 1, state

  _, state = tf.while_loop(lambda t, _: t < (steps + chunk - 1) // chunk,
                           body, (tf.constant(0), state))
  return state


def start_carry(network, request: request_lib.Request, unconsumed: int,
                state=None, batch_sized_chunks: bool = False
                ) -> request_lib.Carry:
  """The `Carry` of a fresh generation: primed state, history, zero scores.

  `state`, where given, is the primed state already (`window.prime`);
  `batch_sized_chunks`: as `prime`'s.
  """
  prompts = request.prompts
  batch = tf.shape(prompts.ids)[0]
  if state is None:
    state = prime(network, prompts, unconsumed,
                  initial_state=request.initial_state,
                  batch_sized_chunks=batch_sized_chunks)
  parts = pipeline.active(request.sampling, request.lookback,
                          network.vocab_size)
  history = processors.start(prompts.ids, prompts.lengths, network.vocab_size,
                             request.lookback, pipeline.looks_back(parts))
  return request_lib.Carry(
      state=state,
      last_ids=tf.gather(prompts.ids, prompts.lengths - 1, batch_dims=1),
      stop_state=tf.zeros([batch], tf.int32),
      done=tf.zeros([batch], tf.bool),
      step=tf.constant(0),
      history=history,
      scores=tf.zeros([batch], tf.float32),
      dfa_state=request.constraint.start)


def run_decode(network, request: request_lib.Request,
               carry: request_lib.Carry, chooses_first: bool,
               steps_loop=None, logprobs: bool = False, keys=None,
               ids_buffer=None, plain: Optional[bool] = None
               ) -> request_lib.Result:
  """Decodes `request.num_steps` steps (at most) on from `carry`.

  (Not `decode`: `Model.decode` turns ids into text.)

  Args:
    network: the model's `Network`.
    request: the `Request`.
    carry: where to start (`start_carry`, or a previous `Result.carry`).
    chooses_first: the elementwise path's loop (`choose_then_consume`).
    steps_loop: another loop of the same signature in place of either
      (`window.windows_loop`).
    logprobs: also record each step's log-probabilities
      (`pipeline.StepLogprobs`, written where the request wants scores) into
      the result's `logprobs`.
    keys: the rows' uint32 noise keys (default: from `request.seeds`; the
      LiteRT loop derives them from int32 seeds, `litert.row_keys`).
    ids_buffer: `ids_buffer(capacity, batch)` makes the buffer of chosen
      ids, an object with `write(step, ids [B])` (returning the buffer
      written) and `stack()` (`[C, B]`); default: a TensorArray. The LiteRT
      loop's has no TensorList ops (`litert.SliceBuffer`).
    plain: None: both decode loops are traced, and the request's values
      choose one when it runs (`pipeline.takes_plain_tail`); True or
      False: only the plain or the general one, for a caller that knows
      which its request takes (`generator.one_tail`: about half the trace
      and of XLA's compile).

  Returns:
    The `Result`.
  """
  start = carry.step
  num_steps = tf.minimum(request.num_steps, request.capacity)
  inv = pipeline.invariants(network, request, start, keys)
  loop = steps_loop or (choose_then_consume if chooses_first
                        else consume_then_choose)
  progress = pipeline.RowProgress(
      carry.stop_state, carry.done,
      tf.zeros(tf.shape(carry.last_ids), tf.int32), carry.history,
      carry.scores, carry.dfa_state,
      pipeline.step_logprobs(request.capacity, tf.shape(carry.last_ids)[0],
                             network.vocab_size) if logprobs else ())

  def run(tail, scores):
    # A fixed-size buffer on every path: under XLA `capacity` is a
    # compile-time constant; in graph mode unwritten slots stack as zeros.
    ids = (tf.TensorArray(tf.int32, size=request.capacity,
                          element_shape=[None]) if ids_buffer is None
           else ids_buffer(request.capacity, tf.shape(carry.last_ids)[0]))
    # The plain tail scores nothing: its loop carries no log-probabilities
    # (the zeros are returned as they are).
    end = loop(network, tail, num_steps, carry,
               progress if scores else progress._replace(logprobs=()), ids)
    return end._replace(ids=tf.transpose(end.ids.stack()),
                        progress=end.progress._replace(
                            logprobs=end.progress.logprobs if scores
                            else progress.logprobs))

  plain_tail, general_tail = pipeline.tails(inv)
  # When no row asks for an option the plain tail lacks, or for scores, the
  # loop whose step has no conditionals runs: XLA fuses its tail whole, and
  # default settings pay nothing for the options they do not use.
  if plain is None:
    end = tf.cond(inv.plain, lambda: run(plain_tail, False),
                  lambda: run(general_tail, True))
  else:
    end = run(plain_tail, False) if plain else run(general_tail, True)
  done = end.progress
  return request_lib.Result(
      ids=end.ids, lengths=done.lengths, scores=done.scores,
      logprobs=tf.nest.map_structure(  # Rows first, as `ids`.
          lambda x: tf.transpose(x, [1, 0] + list(range(2, x.shape.rank))),
          done.logprobs),
      carry=request_lib.Carry(end.state, end.last_ids, done.stop_state,
                              done.done, start + end.step, done.history,
                              done.scores, done.dfa_state))


def consume_then_choose(network, tail, num_steps, carry, progress, ids):
  """The decode loop of the xla and graph paths.

  A step consumes the last id (cells), then chooses the next (dense, tail).
  The carry's state has not yet consumed its `last_ids`.

  Returns:
    The final `LoopState` (ids still the TensorArray).
  """

  def cond(s: LoopState):
    return (s.step < num_steps) & tf.logical_not(tf.reduce_all(
        s.progress.done))

  def body(s: LoopState):
    # `ahead` is layer 0's projection of last_ids, gathered last step.
    logits, state = network.step_projected(s.ahead, s.state)
    chosen, x_proj, progress = tail(logits, s.step, s.progress)
    return LoopState(s.step + 1, state, chosen, x_proj, progress, (),
                     s.ids.write(s.step, chosen))

  (end,) = tf.while_loop(cond, lambda s: (body(s),), (LoopState(
      tf.constant(0), carry.state, carry.last_ids,
      network.first_projection(carry.last_ids), progress, (), ids),))
  return end


def choose_then_consume(network, tail, num_steps, carry, progress, ids):
  """The decode loop of the elementwise path: one XLA call a step.

  A step multiplies the state's h by the dense and layer 0's recurrent
  kernels (TF's oneDNN matmuls), then one compiled function chooses the
  next id (tail), gathers its layer-0 projection and runs layer 0's gate
  math on it, returning h already cast for the next step's matmuls (in
  reduced precision); layers above step as usual. Against two calls a step
  (gates; tail) this saves a call, the graph casts of h and the graph ops
  of the loop condition. The same arithmetic in another order: the text is
  unchanged.

  The carry's state has consumed its `last_ids` (priming covers the whole
  prompt), so a continuation starts by choosing. The last step consumes an
  id no step chooses after: one layer step more than the other loop.

  Returns:
    The final `LoopState` (ids still the TensorArray).
  """
  first_cell = network.cells[0]
  compute_dtype = first_cell.compute_dtype

  # In reduced precision the compiled call also returns layer 0's h cast
  # for the next step's matmuls, carried as `ahead` (an empty tuple
  # otherwise: in float32 h is the state's own tensor, and a tensor
  # returned twice is copied by XLA, 4% of a float32 step at batch 64).
  casts = first_cell.fusable and compute_dtype != tf.float32

  def cast_h(first_state):
    return (tf.cast(first_state[0], compute_dtype),) if casts else ()

  @functools.partial(tf.function, jit_compile=True, autograph=False)
  def choose_and_consume(output_product, h_proj, first_state, t, progress):
    chosen, x_proj, progress = tail(network.logits_of_product(output_product),
                                    t, progress)
    if first_cell.fusable:
      first_state = first_cell.gate_math(x_proj, h_proj, first_state)
      x_proj = None  # Consumed here.
    # else two products a step: layer 0 steps after this call, on x_proj.
    return (chosen, x_proj, first_state, cast_h(first_state), progress,
            tf.logical_not(tf.reduce_all(progress.done)))

  def body(s: LoopState):
    h_first = s.ahead[0] if casts else s.state[0][0]
    top = h_first if len(network.cells) == 1 else s.state[-1][0]
    h_proj = (first_cell.recurrent_product(h_first) if first_cell.fusable
              else None)
    chosen, x_proj, first_state, h_cast, progress, running = (
        choose_and_consume(network.output_product(top), h_proj, s.state[0],
                           s.step, s.progress))
    if not first_cell.fusable:
      _, first_state = first_cell.step(x_proj, first_state)
    _, state = network.advance_above(first_state[0],
                                     (first_state,) + tuple(s.state[1:]))
    return LoopState(s.step + 1, state, chosen, h_cast, progress, running,
                     s.ids.write(s.step, chosen))

  (end,) = tf.while_loop(
      lambda s: (s.step < num_steps) & s.running, lambda s: (body(s),),
      (LoopState(tf.constant(0), carry.state, carry.last_ids,
                 cast_h(carry.state[0]), progress,
                 tf.logical_not(tf.reduce_all(carry.done)), ids),))
  return end
