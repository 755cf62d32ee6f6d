"""Generator: the whole generation of a batch as one compiled TensorFlow call.

One call of the compiled function does, on device:

  1. prime: each row runs over its own prompt except the last character
     (`Network.unroll` with a mask, so padding never touches a row's state);
  2. decode: a `tf.while_loop` over steps that feeds the last id through
     embedding-table gather -> cells -> dense -> sampling, appends the new id to
     a TensorArray and advances the stop automaton; the loop ends after
     `num_steps` or when every row has met a stop string.

The compiled functions take one `request.Request` (a nest of tensors: the
input signature) and return a `request.Result`. Every caller builds its request
with `request.build`; `Generator.request` does so from Python values. Nothing a
user changes retraces: every value is a tensor of a fixed signature, and under
XLA the shapes are bucketed (see `request.py`).

It runs on one of three paths (`paths.py`): "xla" (the whole function is one
XLA program), "graph" (a TF graph, no XLA) or "elementwise" (a TF graph loop
whose matmuls are TF's oneDNN ops, with the rest of each step compiled by XLA
as one small program a layer; see `_choose_then_consume`).

Only the final ids cross to the host. Streaming continues a generation chunk
by chunk with the state carried on device between calls; the sampling noise is
keyed by the global step, so the chunks join into exactly the one-shot text.
"""

import functools
import os
import weakref
from typing import Iterator, List, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from rnnstep import beam_search
from rnnstep import cells
from rnnstep import paths
from rnnstep import processors
from rnnstep import request as request_lib
from rnnstep import sampling
from rnnstep import stopping

# Bytes kept per generated character and row, all copies included (the id
# buffer on device and its stacked copy, int32 each; the host id array; the
# decoded str), for refusing runs that cannot fit before anything is allocated.
BYTES_PER_GENERATED_CHAR = 16


def available_memory_bytes() -> Optional[int]:
  """MemAvailable from /proc/meminfo (None where unknown)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def check_output_fits(batch_size: int, num_steps: int) -> None:
  """Refuses a run whose output cannot fit in memory, before allocating it.

  Raises:
    ValueError: with the estimate and what is available.
  """
  need = batch_size * num_steps * BYTES_PER_GENERATED_CHAR
  have = available_memory_bytes()
  if have is not None and need > have:
    raise ValueError(
        f"{batch_size} rows x {num_steps} steps need about {need / 2**30:.1f} GiB "
        f"for the output but only {have / 2**30:.1f} GiB is available; generate "
        "fewer rows or steps, or stream the output in chunks")


class Generator(tf.Module):
  """Compiled generation over a `Model`, on one execution path.

  The compiled functions (usable inside other graphs: export, tf.distribute):

    generate_fn(request) -> Result            prime the prompts, then decode
    continue_fn(request, carry) -> Result     decode on from a Result's carry
                                              (the request's prompts unused)

  Research code can also drive the model directly: `zero_state(batch)` and the
  compiled `step(ids, state) -> (logits, state)` run one timestep over explicit
  state, the same cell code the loop uses.

  Args:
    model: an `rnnstep.Model`.
    path: "xla", "graph" or "elementwise" (see `paths.py`).
    hold_model: keep the model alive (False for `cached`, whose cache must not).

  Attributes:
    model: the Model.
    path: the execution path.
    jit_compile: whether each function is one XLA program (path "xla").
  """

  def __init__(self, model, path: str = paths.XLA, *, hold_model: bool = True):
    super().__init__(name=f"{model.name}_generator")
    if hold_model:
      self._held_model = model
    self._model_ref = weakref.ref(model)
    self.path = paths.check_concrete(path)
    self.jit_compile = self.path == paths.XLA
    if model.has_unk:
      banned = np.zeros([model.vocab_size], np.float32)
      banned[0] = -np.inf
      self._banned = tf.constant(banned)
    else:
      self._banned = None
    self._choosers = self._make_choosers()
    request_spec = request_lib.spec(model.vocab_size)
    carry_spec = request_lib.carry_spec(self._state_sizes(), model.vocab_size)
    # autograph=False: the bodies use tf.while_loop/tf.cond explicitly, and
    # skipping autograph's source conversion cuts the first trace from ~1.6 s
    # to ~0.2 s (measured).
    compiled = dict(jit_compile=self.jit_compile, autograph=False)
    self.generate_fn = tf.function(self._generate_impl, **compiled,
                                   input_signature=[request_spec])
    self.continue_fn = tf.function(self._continue_impl, **compiled,
                                   input_signature=[request_spec, carry_spec])
    self.beam_fn = tf.function(self._beam_impl, **compiled,
                               input_signature=[request_spec])
    self._concrete_functions = {}
    self.step = tf.function(self._step_impl, **compiled, input_signature=[
        tf.TensorSpec([None], tf.int32, name="ids"), carry_spec.state])

  @property
  def model(self):
    return self._model_ref()

  def _call(self, name: str, *args):
    """Calls the compiled function `name` through its one concrete function.

    Host callers use this: binding a nested request to the polymorphic
    `tf.function`'s signature costs ~1 ms a call, which streaming in small
    chunks would pay every chunk.
    """
    concrete = self._concrete_functions.get(name)
    if concrete is None:
      concrete = getattr(self, name).get_concrete_function()
      self._concrete_functions[name] = concrete
    return concrete(*args)

  def _state_sizes(self):
    return [cells.state_sizes(layer) for layer in self.model.config.layers]

  def zero_state(self, batch_size: int):
    """The zero state for `batch_size` rows: one tuple of `[B, U]` per layer."""
    return tuple(tuple(tf.zeros([batch_size, u]) for u in sizes)
                 for sizes in self._state_sizes())

  # -- compiled bodies -------------------------------------------------------

  def _network(self):
    return self.model.network(
        compile_elementwise=self.path == paths.ELEMENTWISE)

  def _step_impl(self, ids, state):
    return self._network().step(ids, state)

  def _generate_impl(self, request: request_lib.Request) -> request_lib.Result:
    network = self._network()
    prompt_ids, prompt_lengths = request.prompts
    batch = tf.shape(prompt_ids)[0]
    # Prime over all but each row's last character, which the first decode
    # step consumes; or over all of them where the decode loop chooses before
    # it consumes. The unroll stops at the longest prompt, not the bucketed
    # width; masked steps are free of effect on a row's state.
    unconsumed = 0 if self._chooses_first else 1
    mask = (tf.range(tf.shape(prompt_ids)[1])[None, :]
            < (prompt_lengths[:, None] - unconsumed))
    _, state = network.unroll(prompt_ids, network.zero_state(batch), mask,
                              steps=tf.reduce_max(prompt_lengths) - unconsumed)
    history = processors.start(
        prompt_ids, prompt_lengths, self.model.vocab_size, request.lookback,
        processors.in_use(request.sampling.repetition_penalty,
                          request.lookback))
    carry = request_lib.Carry(
        state=state,
        last_ids=tf.gather(prompt_ids, prompt_lengths - 1, batch_dims=1),
        stop_state=tf.zeros([batch], tf.int32),
        done=tf.zeros([batch], tf.bool),
        step=tf.constant(0),
        history=history,
        scores=tf.zeros([batch], tf.float32))
    return self._decode(network, request, carry)

  def _beam_impl(self, request: request_lib.Request) -> beam_search.BeamResult:
    return beam_search.search(self._network(), request, self._banned,
                              self.model.vocab_size)

  def _continue_impl(self, request, carry):
    return self._decode(self._network(), request, carry)

  def _decode(self, network, request: request_lib.Request,
              carry: request_lib.Carry) -> request_lib.Result:
    keys = sampling.row_keys(request.seeds.seeds, request.seeds.index)
    start = carry.step
    num_steps = tf.minimum(request.num_steps, request.capacity)
    # Loop invariants, computed once: which parts of the tail any row needs.
    parts = sampling.active(request.sampling, self.model.vocab_size)
    looks_back = processors.in_use(request.sampling.repetition_penalty,
                                   request.lookback)
    # When no row asks for a filter, min-p, a look-back rule or scores, the
    # loop whose step has no conditionals runs: XLA fuses its tail whole, and
    # default settings pay nothing for the options they do not use.
    plain = ~(parts.any_filtered | parts.any_min_p | looks_back
              | request.want_scores)
    loop = (self._choose_then_consume if self._chooses_first
            else self._consume_then_choose)

    def run(choose):
      def tail(logits, t, stop_state, done, lengths, history, scores):
        return choose(logits, t, start, stop_state, done, lengths, history,
                      scores, request.sampling, parts, keys, request.stops,
                      request.lookback, looks_back, request.want_scores,
                      network.input_table)

      # A fixed-size buffer on every path: under XLA `capacity` is a
      # compile-time constant; in graph mode unwritten slots stack as zeros.
      ids = tf.TensorArray(tf.int32, size=request.capacity,
                           element_shape=[None])
      end = loop(network, tail, num_steps, carry, ids)
      return end[:-1] + (tf.transpose(end[-1].stack()),)

    (steps, state, last_ids, stop_state, done, lengths, history, scores,
     ids) = tf.cond(plain, lambda: run(self._choosers[0]),
                    lambda: run(self._choosers[1]))
    return request_lib.Result(
        ids=ids, lengths=lengths, scores=scores,
        carry=request_lib.Carry(state, last_ids, stop_state, done,
                                start + steps, history, scores))

  @property
  def _chooses_first(self) -> bool:
    """Whether the decode loop chooses an id, then consumes it (see below)."""
    return self.path == paths.ELEMENTWISE

  @staticmethod
  def _consume_then_choose(network, tail, num_steps, carry, ids):
    """The decode loop of the xla and graph paths.

    A step consumes the last id (cells), then chooses the next (dense, tail).
    The carry's state has not yet consumed its `last_ids`.

    Returns:
      `(steps, state, last_ids, stop_state, done, lengths, history, scores,
      ids)`, ids still the TensorArray.
    """
    batch = tf.shape(carry.last_ids)[0]

    def cond(t, state, inputs, x_proj, stop_state, done, lengths, history,
             scores, ids):
      del state, inputs, x_proj, stop_state, lengths, history, scores, ids
      return (t < num_steps) & tf.logical_not(tf.reduce_all(done))

    def body(t, state, inputs, x_proj, stop_state, done, lengths, history,
             scores, ids):
      del inputs  # Its layer-0 projection, x_proj, was gathered last step.
      logits, state = network.step_projected(x_proj, state)
      chosen, x_proj, stop_state, done, lengths, history, scores = tail(
          logits, t, stop_state, done, lengths, history, scores)
      return (t + 1, state, chosen, x_proj, stop_state, done, lengths,
              history, scores, ids.write(t, chosen))

    (steps, state, last_ids, _, stop_state, done, lengths, history, scores,
     ids) = tf.while_loop(cond, body, (
         tf.constant(0), carry.state, carry.last_ids,
         network.first_projection(carry.last_ids), carry.stop_state,
         carry.done, tf.zeros([batch], tf.int32), carry.history,
         carry.scores, ids))
    return (steps, state, last_ids, stop_state, done, lengths, history,
            scores, ids)

  @staticmethod
  def _choose_then_consume(network, tail, num_steps, carry, ids):
    """The decode loop of the elementwise path: one XLA call a step.

    A step multiplies the state's h by the dense and layer 0's recurrent
    kernels (TF's oneDNN matmuls), then one compiled function chooses the
    next id (tail), gathers its layer-0 projection and runs layer 0's gate
    math on it, returning h already cast for the next step's matmuls (in
    reduced precision); layers above step as usual. Against two calls a step
    (gates; tail) this saves a call, the graph casts of h and the graph ops
    of the loop condition (measured on a GRU 1024, bfloat16 at batch 256:
    1.18x -> 1.09x the matmul floor in a micro loop). The same arithmetic in
    another order: the text is unchanged.

    The carry's state has consumed its `last_ids` (priming covers the whole
    prompt), so a continuation starts by choosing. The last step consumes an
    id no step chooses after: one layer step more than the other loop.

    Returns:
      As `_consume_then_choose`.
    """
    first_cell = network.cells[0]
    compute_dtype = first_cell.compute_dtype
    batch = tf.shape(carry.last_ids)[0]

    # In reduced precision the compiled call also returns layer 0's h cast
    # for the next step's matmuls, carried as `h_cast` (an empty tuple
    # otherwise: in float32 h is the state's own tensor, and a tensor
    # returned twice is copied by XLA, 4% of a float32 step at batch 64).
    casts = first_cell.fusable and compute_dtype != tf.float32

    def cast_h(first_state):
      return (tf.cast(first_state[0], compute_dtype),) if casts else ()

    @functools.partial(tf.function, jit_compile=True, autograph=False)
    def choose_and_consume(output_product, h_proj, first_state, t, stop_state,
                           done, lengths, history, scores):
      chosen, x_proj, stop_state, done, lengths, history, scores = tail(
          network.logits_of_product(output_product), t, stop_state, done,
          lengths, history, scores)
      if first_cell.fusable:
        first_state = first_cell.gate_math(x_proj, h_proj, first_state)
        x_proj = None  # Consumed here.
      # else two products a step: layer 0 steps after this call, on x_proj.
      return (chosen, x_proj, first_state, cast_h(first_state), stop_state,
              done, lengths, history, scores,
              tf.logical_not(tf.reduce_all(done)))

    def cond(t, state, h_cast, last_ids, stop_state, done, lengths, history,
             scores, running, ids):
      del state, h_cast, last_ids, stop_state, done, lengths, history
      del scores, ids
      return (t < num_steps) & running

    def body(t, state, h_cast, last_ids, stop_state, done, lengths, history,
             scores, running, ids):
      del last_ids, running
      h_first = h_cast[0] if casts else state[0][0]
      top = h_first if len(network.cells) == 1 else state[-1][0]
      h_proj = (first_cell.recurrent_product(h_first) if first_cell.fusable
                else None)
      (chosen, x_proj, first_state, h_cast, stop_state, done, lengths, history,
       scores, running) = choose_and_consume(
           network.output_product(top), h_proj, state[0], t, stop_state,
           done, lengths, history, scores)
      if not first_cell.fusable:
        _, first_state = first_cell.step(x_proj, first_state)
      _, state = network.advance_above(first_state[0],
                                       (first_state,) + tuple(state[1:]))
      return (t + 1, state, h_cast, chosen, stop_state, done, lengths,
              history, scores, running, ids.write(t, chosen))

    (steps, state, _, last_ids, stop_state, done, lengths, history, scores, _,
     ids) = tf.while_loop(cond, body, (
         tf.constant(0), carry.state, cast_h(carry.state[0]),
         carry.last_ids, carry.stop_state, carry.done,
         tf.zeros([batch], tf.int32), carry.history, carry.scores,
         tf.logical_not(tf.reduce_all(carry.done)), ids))
    return (steps, state, last_ids, stop_state, done, lengths, history,
            scores, ids)

  def _make_choosers(self):
    """The per-step tails after the logits: (plain, general).

    Both choose the next ids, gather their layer-0 input projections for the
    next step and advance the stop automaton and lengths; the general one also
    runs the look-back processors, the filters and the scores, each under a
    `tf.cond` on whether any row needs it. On the elementwise path each is
    compiled with layer 0's gate math (`_choose_then_consume`).

    The next step's table rows are gathered here, into a buffer of their own,
    rather than inside the next step's gate math: fused there, XLA's CPU
    backend does not vectorize the gather-fed sigmoid/tanh (measured on a GRU
    1024 at batch 1: 1.14-1.42x the time of the same step fed a plain buffer).
    """
    banned = self._banned

    def advance(chosen, t, stop_state, done, lengths, stops):
      stop_state = tf.gather_nd(stops.table, tf.stack([stop_state, chosen], 1))
      lengths = tf.where(done, lengths, t + 1)
      return stop_state, done | tf.gather(stops.accept, stop_state), lengths

    def plain(logits, t, start, stop_state, done, lengths, history, scores,
              params, parts, keys, stops, lookback, looks_back, want_scores,
              table):
      del lookback, looks_back, want_scores
      chosen = sampling.plain_next_ids(logits, params, keys, start + t, banned,
                                       parts)
      stop_state, done, lengths = advance(chosen, t, stop_state, done, lengths,
                                          stops)
      return (chosen, tf.gather(table, chosen), stop_state, done, lengths,
              history, scores)

    def general(logits, t, start, stop_state, done, lengths, history, scores,
                params, parts, keys, stops, lookback, looks_back, want_scores,
                table):
      raw = logits
      if banned is not None:
        logits = logits + banned
      logits = tf.cond(
          looks_back,
          lambda: processors.apply(logits, history, params.repetition_penalty,
                                   lookback),
          lambda: logits)
      chosen = sampling.next_ids(logits, params, keys, start + t, banned, parts)
      history = tf.cond(looks_back,
                        lambda: processors.append(history, chosen, lookback),
                        lambda: history)
      scores = tf.cond(
          want_scores,
          lambda: scores + tf.where(done, 0.0, log_probability(raw, chosen)),
          lambda: scores)
      stop_state, done, lengths = advance(chosen, t, stop_state, done, lengths,
                                          stops)
      return (chosen, tf.gather(table, chosen), stop_state, done, lengths,
              history, scores)

    return plain, general

  # -- host side ---------------------------------------------------------------

  def stop_automaton(self, stop: Sequence[str]) -> stopping.Automaton:
    """Compiles stop strings for this model's vocabulary.

    Raises:
      ValueError: an empty stop string, or one the model can never generate.
    """
    sequences = []
    for text in stop:
      if not text:
        raise ValueError("a stop string is empty; give at least one character")
      try:
        sequences.append(self.model.encode(text))
      except ValueError as e:
        raise ValueError(f"stop string {text!r} can never be generated: {e}") \
            from None
    return stopping.stop_automaton(sequences, self.model.vocab_size)

  def prompt_batch(self, prompts: Sequence[str]):
    """Encodes prompts into right-padded ids `[B, T]` and lengths `[B]`.

    Raises:
      ValueError: an empty prompt or one with a character outside the vocab.
    """
    encoded = []
    for i, prompt in enumerate(prompts):
      if not isinstance(prompt, str):
        raise ValueError(f"prompt {i} is a {type(prompt).__name__}, not a str")
      if not prompt:
        raise ValueError(f"prompt {i} is empty; give at least one character")
      try:
        encoded.append(self.model.encode(prompt))
      except ValueError as e:
        raise ValueError(f"prompt {i}: {e}") from None
    lengths = np.array([len(e) for e in encoded], np.int32)
    ids = np.zeros([len(encoded), int(lengths.max())], np.int32)
    for row, e in enumerate(encoded):
      ids[row, :len(e)] = e
    return ids, lengths

  def request(self, prompts: Sequence[str], num_steps: int,
              options: request_lib.Options = request_lib.Options(), *,
              capacity_steps=None, total_steps=None) -> request_lib.Request:
    """Builds the `Request` for Python values (see `request.build`).

    Args:
      prompts: the prompts, as str.
      num_steps: steps to generate (in this call).
      options: the `request.Options`.
      capacity_steps: the steps the output buffer must hold (streaming).
      total_steps: the steps of the whole generation (streaming).

    Returns:
      The Request; under XLA its batch is padded to a bucket.

    Raises:
      ValueError: an unusable prompt, stop string or seed list.
    """
    prompt_ids, lengths = self.prompt_batch(prompts)
    seeds, index = seed_rows(options.seed, len(prompts))
    return request_lib.build(
        prompt_ids, lengths, num_steps, options.sampling, seeds, index,
        self.stop_automaton(options.stop), bucket_shapes=self.jit_compile,
        capacity_steps=capacity_steps, total_steps=total_steps,
        repetition_window=options.repetition_window,
        no_repeat_ngram_size=options.no_repeat_ngram_size,
        num_beams=options.num_beams, length_penalty=options.length_penalty,
        want_scores=options.return_scores)

  def generate_ids(self, prompts: Sequence[str], num_steps: int,
                   options: request_lib.Options = request_lib.Options(), *,
                   strategy=None) -> "Sequences":
    """Generates continuations as ids, in one device call.

    Arguments are as for `rnnstep.generate` (already validated there).

    Returns:
      The `Sequences`: per prompt, `num_return_sequences` id arrays (one when
      sampling) and their scores; a row that met a stop string ends with it.
    """
    request = self.request(prompts, num_steps, options)
    batch, returned = len(prompts), options.num_return_sequences
    if num_steps == 0:
      return Sequences([[np.zeros([0], np.int32)] * returned] * batch,
                       [[0.0] * returned] * batch)
    check_output_fits(batch * options.num_beams, num_steps)
    beams = options.num_beams > 1

    def run(request, call=lambda name, *args: getattr(self, name)(*args)):
      if beams:
        return tuple(call("beam_fn", request))
      result = call("generate_fn", request)
      return result.ids, result.lengths, result.scores

    if strategy is not None:
      ids, lengths, scores = run_distributed(run, strategy, request)
    else:
      ids, lengths, scores = (x.numpy() for x in run(request, self._call))
    if not beams:  # One sequence per prompt.
      ids, lengths, scores = ids[:, None], lengths[:, None], scores[:, None]
    return Sequences(
        [[ids[p, j, :lengths[p, j]] for j in range(returned)]
         for p in range(batch)],
        [[float(scores[p, j]) for j in range(returned)] for p in range(batch)])

  def stream_ids(self, prompts: Sequence[str], num_steps: int, chunk_size: int,
                 options: request_lib.Options = request_lib.Options()
                 ) -> Iterator["Sequences"]:
    """Like `generate_ids`, yielding each row's new ids every `chunk_size` steps.

    The state (and the history the look-back rules read) stays on device
    between chunks; joined, the chunks equal the one-shot result for the same
    arguments. Sampling only (not beam search).

    Yields:
      `Sequences` holding each row's new ids (one array per row, not a list)
      and its score so far.
    """
    batch = len(prompts)
    request = self.request(prompts, min(chunk_size, num_steps), options,
                           capacity_steps=chunk_size, total_steps=num_steps)
    check_output_fits(batch, min(chunk_size, max(num_steps, 1)))
    carry, start = None, 0
    while start < num_steps:
      steps = min(chunk_size, num_steps - start)
      request = request._replace(num_steps=np.int32(steps))
      if carry is None:
        result = self._call("generate_fn", request)
      else:
        result = self._call("continue_fn", request, carry)
      ids, lengths = result.ids.numpy(), result.lengths.numpy()
      scores = result.scores.numpy()
      yield Sequences([ids[row, :lengths[row]] for row in range(batch)],
                      [float(scores[row]) for row in range(batch)])
      carry, start = result.carry, start + steps
      if bool(tf.reduce_all(carry.done)):
        return


class Sequences(NamedTuple):
  """Generated ids on the host.

  Attributes:
    ids: per prompt, a list of int32 arrays (the returned sequences, best
      first for beam search; one when sampling).
    scores: per prompt, each sequence's log-likelihood under the model (0.0
      unless scores were asked for, for sampling).
  """
  ids: List[List[np.ndarray]]
  scores: List[List[float]]


def log_probability(logits: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
  """log softmax(logits)[ids] per row: the model's own log-likelihood of ids."""
  return (tf.gather(logits, ids, batch_dims=1)
          - tf.reduce_logsumexp(logits, axis=-1))


def run_distributed(run, strategy, request: request_lib.Request):
  """Runs a request with its rows split evenly over a strategy's replicas.

  Every row keeps its own (seed, index) key, so the text equals the
  single-device text. Rows are padded with copies of row 0 to fill the last
  replica. Every worker of a multi-worker strategy gets all rows.

  Args:
    run: the compiled work, `run(request) -> tuple of tensors`, each with the
      rows as its first dimension.
    strategy: the `tf.distribute.Strategy`.
    request: the whole `Request`.

  Returns:
    `run`'s tensors for all rows as numpy arrays, rows in order (padding rows
    last).
  """
  replicas = strategy.num_replicas_in_sync
  batch = int(request.prompts.lengths.shape[0])
  per_replica = -(-batch // replicas)
  request = request_lib.pad_rows(request, per_replica * replicas)
  host = tf.nest.map_structure(np.asarray, request)

  def replica_values(ctx):
    first = ctx.replica_id_in_sync_group * per_replica
    return host.map_rows(lambda x: x[first:first + per_replica])

  # Each replica's own rows; the shared fields are the same on every replica.
  per_replica_request = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.nest.map_structure(tf.constant, replica_values(ctx)))

  # A plain callable: the strategy then calls it once per replica with that
  # replica's values (it would hand a tf.function the PerReplica wrappers).
  results = strategy.run(run, args=(per_replica_request,))
  # gather (not local results) so that every worker of a multi-worker
  # strategy gets all rows.
  return tuple(strategy.gather(x, axis=0).numpy() for x in results)


_CACHE = weakref.WeakKeyDictionary()


def cached(model, path: str) -> Generator:
  """The model's Generator for a concrete path, built once per model and path.

  The cache holds models weakly, and its generators do too: it never keeps a
  model alive by itself.
  """
  per_model = _CACHE.get(model)
  if per_model is None:
    per_model = _CACHE[model] = {}
  generator = per_model.get(path)
  if generator is None:
    generator = per_model[path] = Generator(model, path, hold_model=False)
  return generator


def seed_rows(seed, batch_size: int):
  """Maps the `seed` argument to per-row (seed, index) pairs.

  - None: a fresh random seed, rows indexed 0..B-1;
  - an int s: row i uses (s, i);
  - a sequence of B ints: row i uses (seeds[i], 0), so a row can be reproduced
    alone with its own seed.

  Returns:
    `(seeds int64 [B], index int32 [B])`.
  """
  if seed is None:
    seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
  if isinstance(seed, (int, np.integer)):
    return (np.full([batch_size], seed, np.int64),
            np.arange(batch_size, dtype=np.int32))
  seeds = np.asarray(list(seed), np.int64)
  if seeds.shape != (batch_size,):
    raise ValueError(f"seed lists {seeds.size} seeds for {batch_size} prompts; "
                     "give one int, or one per prompt")
  return seeds, np.zeros([batch_size], np.int32)
