"""The option pipeline: one step's logits -> the next ids, per row.

The decode loops (`loop.py`) know nothing of any option: each step they hand
the logits to a tail made here, which applies the declared options
(`options.py`) in their one order and advances each row's bookkeeping:

  1. the `[UNK]` ban (`ban`: -inf at id 0 where the vocabulary has one);
  2. the HISTORY options (repetition, frequency and presence penalties,
     n-gram ban), under one `tf.cond` on whether any row looks back
     (`look_back`);
  2b. the `regex=` constraint (`constrain`, under a `tf.cond` on whether any
     row has a pattern): -inf at the ids leading to a dead DFA state. After
     the look-back options and before the temperature and filters, where HF
     applies `prefix_allowed_tokens_fn`, so a row's distribution is the
     model's (as penalized) renormalized over the ids its pattern allows;
  3. the choice (`choose`): greedy rows take their first maximum; sampled rows
     divide by their temperature, pass the FILTER options (top-k, top-p,
     min-p, typical-p), each under a `tf.cond` on whether any row uses it,
     and draw once by the Gumbel-max trick;
  4. the history, the scores (the raw logits' log-likelihood), the stop
     automaton and the constraint DFA advance (`RowProgress`); a row whose DFA
     state accepts with no live continuation is done, as at a stop string.
     Where the caller keeps per-step log-probabilities (`StepLogprobs`: the
     serving engine, for OpenAI's `logprobs`), the same step also records
     each chosen id's raw log-probability and the `TOP_LOGPROBS` most likely
     ids', under the scores' condition.

What a request needs is loop-invariant, so it is computed once per call
(`invariants`): which rows each option acts on, whether any does, and whether
the request can take the `plain` tail — the conditional-free step XLA fuses
whole — because no row needs an option that tail does not run (only the
temperature, `Option.plain`), no row has a pattern, and no one wants scores.
"""

from typing import Any, Dict, NamedTuple

import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import options
from rnnstep.decoding import processors
from rnnstep.decoding import sampling
from rnnstep.decoding import stopping


# The most alternatives a step records (OpenAI's `logprobs` is at most 5).
TOP_LOGPROBS = 5


class StepLogprobs(NamedTuple):
  """Per-step log-probabilities of the raw model distribution, time-major
  buffers of a call's `capacity` steps (what `log_probability` scores: the
  values of a row's ids add up to its score).

  Attributes:
    chosen: float32 `[C, B]`, each step's chosen id's.
    top_ids: int32 `[C, B, K]`, each step's K most likely ids (K =
      `TOP_LOGPROBS`, or V where it is smaller), most likely first (ties: the
      lower id first).
    top_logprobs: float32 `[C, B, K]`, theirs.
  """
  chosen: tf.Tensor
  top_ids: tf.Tensor
  top_logprobs: tf.Tensor


def step_logprobs(capacity, batch, vocab_size: int) -> StepLogprobs:
  """Zeroed `StepLogprobs` buffers of `capacity` steps over `batch` rows."""
  top = min(TOP_LOGPROBS, vocab_size)
  return StepLogprobs(tf.zeros([capacity, batch], tf.float32),
                      tf.zeros([capacity, batch, top], tf.int32),
                      tf.zeros([capacity, batch, top], tf.float32))


def record_logprobs(logprobs: StepLogprobs, t: tf.Tensor, raw: tf.Tensor,
                    token: tf.Tensor) -> StepLogprobs:
  """`logprobs` with step `t`'s values written.

  Args:
    logprobs: the buffers.
    t: int32 `[]`, the call's step.
    raw: float32 `[B, V]`, the model's logits.
    token: float32 `[B]`, the chosen ids' `log_probability`.
  """
  top_ids, top_values = top_logprobs(raw, logprobs.top_ids.shape[-1])
  at = tf.reshape(t, [1, 1])
  return StepLogprobs(
      tf.tensor_scatter_nd_update(logprobs.chosen, at, token[None]),
      tf.tensor_scatter_nd_update(logprobs.top_ids, at, top_ids[None]),
      tf.tensor_scatter_nd_update(logprobs.top_logprobs, at,
                                  top_values[None]))


class RowProgress(NamedTuple):
  """Each row's progress through a decode: what every step advances.

  Attributes:
    stop_state: int32 `[B]`, the row's stop-automaton state.
    done: bool `[B]`, rows that have met a stop string.
    lengths: int32 `[B]`, ids generated in this call up to the row's end.
    history: the `processors.History` (ids so far, the penalties' counts).
    scores: float32 `[B]`, each row's log-likelihood so far (0 unless the
      request wants scores).
    dfa_state: int32 `[B]`, the row's `constraints.Dfa` state.
    logprobs: the call's `StepLogprobs` (written where the request wants
      scores), or `()`: not kept (every caller but the serving engine).
  """
  stop_state: tf.Tensor
  done: tf.Tensor
  lengths: tf.Tensor
  history: processors.History
  scores: tf.Tensor
  dfa_state: tf.Tensor
  logprobs: Any = ()


class Active(NamedTuple):
  """Which rows each option acts on (loop-invariant).

  Attributes:
    sampled_rows: bool `[B]`, rows with temperature > 0 (the others greedy).
    any_sampled: bool `[]`.
    rows: {option name: bool `[B]`} for the per-row HISTORY and FILTER options.
    any: {option name: bool `[]`} for every HISTORY and FILTER option.
  """
  sampled_rows: tf.Tensor
  any_sampled: tf.Tensor
  rows: Dict[str, tf.Tensor]
  any: Dict[str, tf.Tensor]


def active(params: options.Params, settings: processors.Settings,
           vocab_size: int) -> Active:
  """The `Active` rows of a request's values.

  Args:
    params: the per-row values, each `[B]`.
    settings: the look-back values, `[]` or `[B]` (None: none in use).
    vocab_size: V.
  """
  sampled = params.temperature > 0.0
  rows, any_ = {}, {}
  for option in options.HISTORY_OPTIONS + options.FILTERS:
    if option.per_row:
      rows[option.name] = option.active(getattr(params, option.name),
                                        vocab_size)
      any_[option.name] = tf.reduce_any(rows[option.name])
    elif settings is not None:
      # A request's one value (`[]`), or the serving engine's per row (`[B]`:
      # the option's transform leaves the rows it is off for as they are).
      any_[option.name] = tf.reduce_any(
          option.active(getattr(settings, option.name)))
  return Active(sampled, tf.reduce_any(sampled), rows, any_)


def looks_back(parts: Active) -> tf.Tensor:
  """Whether any row needs the history (bool scalar)."""
  return _any_of(parts, options.HISTORY_OPTIONS)


def _any_of(parts: Active, declared) -> tf.Tensor:
  flags = [parts.any[o.name] for o in declared if o.name in parts.any]
  return tf.reduce_any(tf.stack(flags)) if flags else tf.constant(False)


class Invariants(NamedTuple):
  """What a call's steps share (computed once, before the loop).

  Attributes:
    params: the per-row values (`options.Params`).
    parts: their `Active` rows.
    keys: uint32 `[B]` noise keys.
    start: int32 `[]`, the global step of this call's first step.
    stops: the `stopping.Automaton` tensors.
    settings: the `processors.Settings`.
    looks_back: bool `[]`, any row needs the history.
    want_scores: bool `[]`.
    plain: bool `[]`, the `plain` tail gives this request's text.
    table: `[V, G*U_0]`, layer 0's input projection per id.
    banned: float32 `[V]` (-inf on `[UNK]`), or None.
    constraint: the `constraints.Dfa` tensors.
    constrained: bool `[]`, some row has a pattern.
  """
  params: options.Params
  parts: Active
  keys: tf.Tensor
  start: tf.Tensor
  stops: stopping.Automaton
  settings: processors.Settings
  looks_back: tf.Tensor
  want_scores: tf.Tensor
  plain: tf.Tensor
  table: tf.Tensor
  banned: Any
  constraint: constraints.Dfa
  constrained: tf.Tensor


def invariants(network, request, start, keys=None) -> Invariants:
  """The `Invariants` of a request on a network, from global step `start`
  (`keys`: the rows' noise keys, default from the request's seeds)."""
  parts = active(request.sampling, request.lookback, network.vocab_size)
  back = looks_back(parts)
  constrained = is_constrained(request.constraint)
  plain = takes_plain_tail(parts, request.want_scores, constrained)
  return Invariants(
      params=request.sampling, parts=parts,
      keys=(sampling.row_keys(request.seeds.seeds, request.seeds.index)
            if keys is None else keys),
      start=start, stops=request.stops, settings=request.lookback,
      looks_back=back, want_scores=request.want_scores, plain=plain,
      table=network.input_table, banned=network.banned,
      constraint=request.constraint, constrained=constrained)


def takes_plain_tail(parts: Active, want_scores, constrained) -> tf.Tensor:
  """Whether the `plain` tail gives a request's text (bool scalar): no row
  uses an option that tail does not run, no one wants scores and no row has
  a pattern. Which tail runs is chosen by these values, not by shapes, so
  the elementwise path, whose tails are XLA programs of their own, compiles
  each tail when a call first takes it (`generator.Programs.compile_key`)."""
  general = [o for o in options.HISTORY_OPTIONS + options.FILTERS
             if not o.plain]
  return ~(_any_of(parts, general) | want_scores | constrained)


def is_constrained(dfa: constraints.Dfa) -> tf.Tensor:
  """Whether some row has a pattern (bool scalar): not every row is FREE."""
  return tf.reduce_any(dfa.start != constraints.FREE)


def constrain(logits: tf.Tensor, before_history: tf.Tensor, next_states,
              done: tf.Tensor) -> tf.Tensor:
  """-inf at the ids a row's pattern does not allow (see the module doc).

  Where the look-back options leave a row no allowed id (the n-gram ban can),
  the pattern wins: the row falls back to its logits before them.

  Args:
    logits: float32 `[B, V]`, after the ban and the HISTORY options.
    before_history: float32 `[B, V]`, after the ban only (None where no row
      looks back: nothing to fall back from).
    next_states: int32 `[B, V]`, each row's DFA state after each id.
    done: bool `[B]`: finished rows (no allowed id; left unmasked, their ids
      are not returned).
  """
  allowed = (next_states != constraints.DEAD) | done[:, None]
  masked = tf.where(allowed, logits, -float("inf"))
  if before_history is None:  # No row looks back.
    return masked
  stuck = ~tf.reduce_any(masked > -float("inf"), axis=1, keepdims=True)
  return tf.where(stuck, tf.where(allowed, before_history, -float("inf")),
                  masked)


def ban(logits: tf.Tensor, banned) -> tf.Tensor:
  """The `[UNK]` ban: `banned` (-inf at id 0) added, where the model has one."""
  return logits if banned is None else logits + banned


def look_back(logits: tf.Tensor, params: options.Params, parts: Active,
              history: processors.History,
              settings: processors.Settings) -> tf.Tensor:
  """The HISTORY options, in order, each on the rows (or request) using it."""
  for option in options.HISTORY_OPTIONS:
    fn = option.transform()
    if option.per_row:
      values = getattr(params, option.name)
      logits = tf.where(parts.rows[option.name][:, None],
                        fn(logits, values, history, settings), logits)
    else:
      value = getattr(settings, option.name)
      logits = tf.cond(parts.any[option.name],
                       lambda fn=fn, logits=logits, value=value: fn(
                           logits, value, history, settings),
                       lambda logits=logits: logits)
  return logits


def choose(logits: tf.Tensor, params: options.Params, parts: Active,
           keys: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
  """The next id of every row, each by its own settings.

  Greedy rows (temperature 0) take their first maximum; sampled rows divide
  by their temperature, pass the FILTER options and draw. A row's choice
  depends only on its own logits, values, key and the step: the batch-wide
  `tf.cond`s only skip work no row needs.

  Args:
    logits: float32 `[B, V]`, after the ban and the HISTORY options.
    params: the per-row values.
    parts: their `Active` rows.
    keys: uint32 `[B]` row keys (`sampling.row_keys`).
    step: int32 scalar, the global step (the noise's counter).

  Returns:
    int32 `[B]`.
  """
  greedy = sampling.first_max_index(logits)

  def filtered(scaled):
    for option in options.FILTERS:
      rows, fn = parts.rows[option.name], option.transform()
      values = getattr(params, option.name)
      scaled = tf.cond(
          parts.any[option.name],
          lambda fn=fn, rows=rows, values=values, scaled=scaled: tf.where(
              rows[:, None], fn(scaled, values), scaled),
          lambda scaled=scaled: scaled)
    return scaled

  def sample():
    scaled = sampling.scale(logits, params.temperature, parts.sampled_rows)
    # One conditional for a request no filter acts on (a penalty alone, say),
    # rather than one per filter: each costs a few us a step at batch 1.
    scaled = tf.cond(_any_of(parts, options.FILTERS),
                     lambda: filtered(scaled), lambda: scaled)
    return sampling.draw(scaled, keys, step)

  chosen = tf.cond(parts.any_sampled, sample, lambda: greedy)
  return tf.where(parts.sampled_rows, chosen, greedy)


def plain_choose(logits: tf.Tensor, params: options.Params, parts: Active,
                 keys: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
  """`choose` for requests no FILTER or HISTORY option acts on: no conditionals.

  The same choice (greedy where temperature is 0, else the same draw); the
  noise is computed even for an all-greedy batch, which costs less than a
  conditional in a compiled loop. One index search over each row's own scores
  (a greedy row's are its logits), not two and a select: fewer kernels a step
  under XLA.
  """
  perturbed = sampling.perturbed(
      sampling.scale(logits, params.temperature, parts.sampled_rows), keys,
      step)
  return sampling.first_max_index(
      tf.where(parts.sampled_rows[:, None], perturbed, logits))


def log_probability(logits: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
  """log softmax(logits)[ids] per row: the model's own log-likelihood of ids."""
  return (tf.gather(logits, ids, batch_dims=1)
          - tf.reduce_logsumexp(logits, axis=-1))


def top_logprobs(logits: tf.Tensor, k: int):
  """The k most likely ids of log softmax(logits) and their values, over the
  last axis (most likely first; ties: the lower id first), computed as
  `log_probability` computes one id's.

  Returns:
    `(int32 ids, float32 values)`, each `logits.shape[:-1] + [k]`.
  """
  top, ids = tf.math.top_k(logits, k=k)
  return ids, top - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)


def _advance_stops(chosen, t, progress: RowProgress, stops) -> RowProgress:
  stop_state = tf.gather_nd(stops.table,
                            tf.stack([progress.stop_state, chosen], 1))
  return progress._replace(
      stop_state=stop_state,
      done=progress.done | tf.gather(stops.accept, stop_state),
      lengths=tf.where(progress.done, progress.lengths, t + 1))


def tails(inv: Invariants):
  """The per-step tails after the logits: `(plain, general)`.

  Each is `tail(logits, t, progress) -> (chosen, x_proj, progress)`: it
  chooses the next ids, gathers their layer-0 input projections for the next
  step and advances the `RowProgress`. The loop runs `plain` when
  `inv.plain`, else `general` (which also looks back and scores). On the
  elementwise path each is compiled with layer 0's gate math.

  The next step's table rows are gathered here, into a buffer of their own,
  rather than inside the next step's gate math: fused there, XLA's CPU
  backend does not vectorize the gather-fed sigmoid/tanh.
  """

  def plain(logits, t, progress):
    chosen = plain_choose(ban(logits, inv.banned), inv.params, inv.parts,
                          inv.keys, inv.start + t)
    return (chosen, tf.gather(inv.table, chosen),
            _advance_stops(chosen, t, progress, inv.stops))

  def general(logits, t, progress):
    raw = logits
    banned = logits = ban(logits, inv.banned)
    logits = tf.cond(
        inv.looks_back,
        lambda: look_back(logits, inv.params, inv.parts, progress.history,
                          inv.settings),
        lambda: logits)

    def constrained(looked_back):
      return constrain(logits, banned if looked_back else None,
                       tf.gather(inv.constraint.table, progress.dfa_state),
                       progress.done)

    logits = tf.cond(
        inv.constrained,
        lambda: tf.cond(inv.looks_back, lambda: constrained(True),
                        lambda: constrained(False)),
        lambda: logits)
    chosen = choose(logits, inv.params, inv.parts, inv.keys, inv.start + t)
    history = tf.cond(
        inv.looks_back,
        lambda: processors.append(progress.history, chosen, inv.settings),
        lambda: progress.history)

    def scored():
      token = log_probability(raw, chosen)
      logprobs = progress.logprobs
      if logprobs:  # Kept by the caller: this step's values recorded.
        logprobs = record_logprobs(logprobs, t, raw, token)
      return (progress.scores + tf.where(progress.done, 0.0, token),
              logprobs)

    scores, logprobs = tf.cond(
        inv.want_scores, scored,
        lambda: (progress.scores, progress.logprobs))
    dfa_state = tf.gather_nd(inv.constraint.table,
                             tf.stack([progress.dfa_state, chosen], 1))
    progress = _advance_stops(chosen, t, progress._replace(
        history=history, scores=scores, dfa_state=dfa_state,
        logprobs=logprobs), inv.stops)
    # A row whose continuation can only end here is done (its `lengths`
    # already counts this id: `_advance_stops` reads the old `done`).
    progress = progress._replace(
        done=progress.done | tf.gather(inv.constraint.ends, dfa_state))
    return chosen, tf.gather(inv.table, chosen), progress

  return plain, general
