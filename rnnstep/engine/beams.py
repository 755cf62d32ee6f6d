"""Beam search inside the one on-device loop.

Standard beam search of width k over the log-probabilities of the processed
logits (`[UNK]` ban, the look-back options: repetition, frequency and
presence penalties, n-gram ban; then log-softmax), as HF
`generate(num_beams=k, do_sample=False)`. Temperature, top-k/p, min-p and the
seed do not apply. Beams are rows: prompt p's beams are rows p*k .. p*k+k-1.

Per step, for every prompt:

  1. every live beam is extended by every id: candidate score = beam score +
     log p(id), over `[k * V]` candidates (at the first step only beam 0 is
     live, so k distinct ids come out of it);
  2. a candidate that completes a stop string, or a `regex=` match that
     cannot go on, is a finished hypothesis; it is
     kept if it ranks among the k best candidates, in a pool of the k best
     finished hypotheses by `score / length**length_penalty` (length: the
     generated characters, the stop string included);
  3. the k best candidates that do not finish become the new beams; the state,
     history, id buffer and stop state are reordered by their parents.

A prompt is done when its pool holds k hypotheses and the best live beam's
`score / length**length_penalty` cannot beat the worst of them (HF's rule with
`early_stopping=False`). At the end the live beams of prompts not done join
the pool, and the pool is sorted best first. Without stop strings every
hypothesis is `num_steps` long and the best has the highest summed
log-probability.

With `regex=`, each beam carries its own DFA state (`constraints.py`):
candidates the pattern does not allow are -inf (after the look-back options,
before the log-softmax, as in sampling), and the state is reordered and
advanced with the beam.

Each hypothesis also carries its score under the raw logits (no ban,
penalties or processors): the model's own log-likelihood, which is what
`return_scores` reports.
"""

from typing import Any, NamedTuple

import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import pipeline
from rnnstep.decoding import processors
from rnnstep.decoding import stopping
from rnnstep.engine import loop
from rnnstep.engine import request as request_lib

_NEG_INF = -float("inf")


class BeamResult(NamedTuple):
  """Per prompt, its k hypotheses best first.

  Attributes:
    ids: int32 `[P, k, capacity]`.
    lengths: int32 `[P, k]`.
    scores: float32 `[P, k]`, the raw-logit log-likelihoods.
  """
  ids: tf.Tensor
  lengths: tf.Tensor
  scores: tf.Tensor


def _log_softmax(logits):
  out = tf.nn.log_softmax(logits, axis=-1)
  # A row whose every id is banned has no finite candidate (NaN otherwise).
  return tf.where(tf.math.is_nan(out), _NEG_INF, out)


def _normalized(scores, length, length_penalty):
  return scores / tf.pow(tf.cast(length, tf.float32), length_penalty)


class BeamState(NamedTuple):
  """The beam search loop's variables (P prompts, k beams, rows = P * k).

  Attributes:
    step: int32 `[]`, steps taken.
    state: the recurrent state, one tuple of `[rows, U]` per layer; it has
      not yet consumed `last_ids`.
    last_ids: int32 `[rows]`, each beam's last id.
    history: the `processors.History` of each beam.
    beam_scores: float32 `[P, k]`, each beam's summed processed
      log-probability (-inf: not live).
    raw_scores: float32 `[rows]`, each beam's raw-logit log-likelihood.
    stop_state: int32 `[rows]`, each beam's stop-automaton state.
    dfa_state: int32 `[rows]`, each beam's `constraints.Dfa` state.
    out: int32 `[rows, capacity]`, each beam's ids so far.
    pool: the `BeamResult` of the finished hypotheses kept.
    pool_rank: float32 `[P, k]`, the pool's normalized scores, best first
      (-inf: an empty slot).
    done: bool `[P]`, prompts whose pool no live beam can improve.
  """
  step: tf.Tensor
  state: tuple
  last_ids: tf.Tensor
  history: processors.History
  beam_scores: tf.Tensor
  raw_scores: tf.Tensor
  stop_state: tf.Tensor
  dfa_state: tf.Tensor
  out: tf.Tensor
  pool: BeamResult
  pool_rank: tf.Tensor
  done: tf.Tensor


class _Setup(NamedTuple):
  """What every step reads: the request's loop-invariant values.

  Attributes:
    network: the model's `Network`.
    k: int32 `[]`, the beam width.
    prompts: int32 `[]`, P.
    rows: int32 `[]`, P * k.
    capacity: int32 `[]`, the output buffer's length.
    length_penalty: float32 `[]` (see `request.Beams`).
    lookback: the request's `processors.Settings`.
    params: the per-row decoding values, one copy per beam.
    parts: the `pipeline.Active` rows, one copy per beam.
    looks_back: bool `[]`, some row needs the history.
    stops: the `stopping.Automaton`.
    constraint: the `constraints.Dfa` (its `start` per prompt).
    first_row: int32 `[P, 1]`, each prompt's beam 0 row.
    beam_of_row: int32 `[rows]`, each row's prompt.
  """
  network: Any
  k: tf.Tensor
  prompts: tf.Tensor
  rows: tf.Tensor
  capacity: tf.Tensor
  length_penalty: tf.Tensor
  lookback: processors.Settings
  params: Any
  parts: pipeline.Active
  looks_back: tf.Tensor
  stops: stopping.Automaton
  constraint: constraints.Dfa
  first_row: tf.Tensor
  beam_of_row: tf.Tensor

  def expand(self, x: tf.Tensor) -> tf.Tensor:
    """Per-prompt rows `[P, ...]` -> one copy per beam `[P * k, ...]`."""
    return tf.gather(x, self.beam_of_row)


class _Candidates(NamedTuple):
  """One step's `[P, k * V]` candidates: every live beam extended by every id.

  Attributes:
    scores: float32 `[P, k * V]`, beam score + processed log p(id).
    finishing: bool `[P, k * V]`, the candidates that end a hypothesis (a
      stop string completed, or a `regex=` match that cannot go on).
    raw_log_p: float32 `[rows, V]`, the raw logits' log-probabilities.
    next_stop: int32 `[rows, V]`, the stop state after each id.
    next_dfa: int32 `[rows, V]`, the DFA state after each id.
    state: the recurrent state after consuming `last_ids` (per parent row).
  """
  scores: tf.Tensor
  finishing: tf.Tensor
  raw_log_p: tf.Tensor
  next_stop: tf.Tensor
  next_dfa: tf.Tensor
  state: tuple


def search(network, request: request_lib.Request,
           primed=None) -> BeamResult:
  """Runs beam search for a request (see the module docstring).

  Args:
    network: the model's `Network` (its `banned` ids are never chosen).
    request: the `Request`; `request.beams.num_beams` is k.
    primed: each prompt's state after priming (`loop.prime`), where the
      caller primes (the LiteRT loop primes stepwise); None: primed here.

  Returns:
    The `BeamResult`.
  """
  setup = _setup(network, request)
  num_steps = tf.minimum(request.num_steps, setup.capacity)

  def cond(s: BeamState):
    return (s.step < num_steps) & ~tf.reduce_all(s.done)

  (end,) = tf.while_loop(cond, lambda s: (_step(setup, s),),
                         (_start(setup, request, primed),))
  return _best_first(setup, end)


def _setup(network, request: request_lib.Request) -> _Setup:
  """The `_Setup` of a request: its shapes, and its options per beam."""
  k = request.beams.num_beams
  prompts = tf.shape(request.prompts.ids)[0]
  parts = pipeline.active(request.sampling, request.lookback,
                          network.vocab_size)
  setup = _Setup(
      network=network, k=k, prompts=prompts, rows=prompts * k,
      capacity=request.capacity, length_penalty=request.beams.length_penalty,
      lookback=request.lookback, params=None, parts=parts,
      looks_back=pipeline.looks_back(parts), stops=request.stops,
      constraint=request.constraint,
      first_row=(tf.range(prompts) * k)[:, None],
      beam_of_row=tf.repeat(tf.range(prompts), k))
  # The look-back options' per-row values and rows, one copy per beam.
  return setup._replace(
      params=tf.nest.map_structure(setup.expand, request.sampling),
      parts=parts._replace(rows={name: setup.expand(rows)
                                 for name, rows in parts.rows.items()}))


def _start(setup: _Setup, request: request_lib.Request,
           primed=None) -> BeamState:
  """The first `BeamState`: each prompt primed once, then copied to its beams.

  Only beam 0 of each prompt is live at first, so the first step's k best
  candidates are k distinct ids out of it.
  """
  network, prompts, k, rows = setup.network, setup.prompts, setup.k, setup.rows
  prompt_ids, prompt_lengths = request.prompts
  state = primed if primed is not None else loop.prime(
      network, request.prompts, unconsumed=1,
      initial_state=request.initial_state)
  history = processors.start(prompt_ids, prompt_lengths, network.vocab_size,
                             request.lookback, setup.looks_back)
  return BeamState(
      step=tf.constant(0),
      state=tf.nest.map_structure(setup.expand, state),
      last_ids=setup.expand(tf.gather(prompt_ids, prompt_lengths - 1,
                                      batch_dims=1)),
      history=tf.nest.map_structure(setup.expand, history),
      beam_scores=tf.where(tf.range(k)[None, :] == 0, 0.0,
                           tf.fill([prompts, k], _NEG_INF)),
      raw_scores=tf.zeros([rows]),
      stop_state=tf.zeros([rows], tf.int32),
      dfa_state=setup.expand(request.constraint.start),
      out=tf.zeros([rows, setup.capacity], tf.int32),
      pool=BeamResult(tf.zeros([prompts, k, setup.capacity], tf.int32),
                      tf.zeros([prompts, k], tf.int32),
                      tf.zeros([prompts, k])),
      pool_rank=tf.fill([prompts, k], _NEG_INF),
      done=tf.zeros([prompts], tf.bool))


def _step(setup: _Setup, s: BeamState) -> BeamState:
  """One step of every prompt's search (the module docstring's 1-3)."""
  candidates = _score_candidates(setup, s)
  length = s.step + 1
  column = tf.range(setup.capacity) == s.step
  pool, pool_rank = _pool_finished(setup, s, candidates, length, column)
  beam_scores, parent, chosen = _select_beams(setup, candidates)
  s = _reorder(setup, s, candidates, parent, chosen, column)
  return s._replace(
      step=s.step + 1, beam_scores=beam_scores, pool=pool,
      pool_rank=pool_rank,
      done=_now_done(setup, s.done, beam_scores, pool_rank, length))


def _score_candidates(setup: _Setup, s: BeamState) -> _Candidates:
  """Steps the beams and scores every extension of each by every id.

  The processed logits (`[UNK]` ban, look-back options, the `regex=` DFA's
  disallowed ids at -inf) rank the candidates; the raw ones score them.
  """
  network, prompts, k = setup.network, setup.prompts, setup.k
  vocab_size = network.vocab_size
  logits, state = network.step(s.last_ids, s.state)
  raw_log_p = _log_softmax(logits)
  logits = pipeline.ban(logits, network.banned)
  logits = tf.cond(
      setup.looks_back,
      lambda: pipeline.look_back(logits, setup.params, setup.parts, s.history,
                                 setup.lookback),
      lambda: logits)
  next_dfa = tf.gather(setup.constraint.table, s.dfa_state)  # [rows, V]
  # A dead beam (-inf score) has no allowed id; its candidates stay -inf.
  logits = tf.where(next_dfa == constraints.DEAD, _NEG_INF, logits)
  scores = tf.reshape(
      tf.reshape(s.beam_scores, [setup.rows, 1]) + _log_softmax(logits),
      [prompts, k * vocab_size])
  stop_table, stop_accept = setup.stops
  next_stop = tf.gather(stop_table, s.stop_state)            # [rows, V]
  finishing = tf.reshape(tf.gather(stop_accept, next_stop)
                         | tf.gather(setup.constraint.ends, next_dfa),
                         [prompts, k * vocab_size])
  return _Candidates(scores, finishing, raw_log_p, next_stop, next_dfa, state)


def _parents_and_ids(setup: _Setup, index: tf.Tensor):
  """Candidate indices `[P, n]` -> (parent row, id), each `[P, n]`."""
  vocab_size = setup.network.vocab_size
  return setup.first_row + index // vocab_size, index % vocab_size


def _pool_finished(setup: _Setup, s: BeamState, candidates: _Candidates,
                   length, column):
  """Adds the step's finished hypotheses to each prompt's pool.

  A finishing candidate is a hypothesis if it ranks among the k best
  candidates (and its prompt is not done); the pool keeps the k best by
  normalized score.

  Args:
    setup: the `_Setup`.
    s: the step's `BeamState`.
    candidates: the step's `_Candidates`.
    length: int32 `[]`, a hypothesis' length after this step.
    column: bool `[capacity]`, this step's column of the id buffer.

  Returns:
    `(pool, pool_rank)`, as in `BeamState`.
  """
  prompts, k = setup.prompts, setup.k
  scores = candidates.scores
  kth_best = tf.math.top_k(scores, k).values[:, -1:]
  new_finished = tf.where(candidates.finishing & (scores >= kth_best)
                          & ~s.done[:, None], scores, _NEG_INF)
  fin_scores, fin_index = tf.math.top_k(new_finished, k)
  fin_parent, fin_id = _parents_and_ids(setup, fin_index)
  # expand_dims, not [..., None]: LiteRT's STRIDED_SLICE has no new axis.
  fin_ids = tf.where(column, tf.expand_dims(fin_id, -1),
                     tf.gather(s.out, fin_parent))
  fin_raw = (tf.gather(s.raw_scores, fin_parent)
             + tf.gather_nd(candidates.raw_log_p,
                            tf.stack([fin_parent, fin_id], -1)))
  merged_rank = tf.concat(
      [s.pool_rank, _normalized(fin_scores, length, setup.length_penalty)], 1)
  pool_rank, keep = tf.math.top_k(merged_rank, k)
  pool = BeamResult(
      ids=tf.gather(tf.concat([s.pool.ids, fin_ids], 1), keep, batch_dims=1),
      lengths=tf.gather(tf.concat([s.pool.lengths,
                                   tf.fill([prompts, k], length)], 1),
                        keep, batch_dims=1),
      scores=tf.gather(tf.concat([s.pool.scores, fin_raw], 1), keep,
                       batch_dims=1))
  return pool, pool_rank


def _select_beams(setup: _Setup, candidates: _Candidates):
  """The new beams: each prompt's k best candidates that do not finish.

  Returns:
    `(beam_scores [P, k], parent [rows], chosen [rows])`: the new beams'
    scores, the row each extends and the id it appends.
  """
  beam_scores, index = tf.math.top_k(
      tf.where(candidates.finishing, _NEG_INF, candidates.scores), setup.k)
  parent, chosen = _parents_and_ids(setup, index)
  return (beam_scores, tf.reshape(parent, [setup.rows]),
          tf.reshape(chosen, [setup.rows]))


def _reorder(setup: _Setup, s: BeamState, candidates: _Candidates, parent,
             chosen, column) -> BeamState:
  """`s` with every per-beam value taken from its parent, `chosen` appended.

  Args:
    setup: the `_Setup`.
    s: the step's `BeamState`.
    candidates: the step's `_Candidates` (the stepped state, next states).
    parent: int32 `[rows]`, the row each new beam extends.
    chosen: int32 `[rows]`, the id it appends.
    column: bool `[capacity]`, this step's column of the id buffer.

  Returns:
    The `BeamState` with its per-beam fields reordered; `step`, the scores,
    the pool and `done` are left as they were.
  """
  reorder = lambda x: tf.gather(x, parent)  # pylint: disable=unnecessary-lambda-assignment
  state = tf.nest.map_structure(reorder, candidates.state)
  history = tf.cond(
      setup.looks_back,
      lambda: processors.append(tf.nest.map_structure(reorder, s.history),
                                chosen, setup.lookback),
      lambda: s.history)
  picked = tf.stack([parent, chosen], -1)
  raw_scores = (tf.gather(s.raw_scores, parent)
                + tf.gather_nd(candidates.raw_log_p, picked))
  return s._replace(
      state=state, last_ids=chosen, history=history, raw_scores=raw_scores,
      stop_state=tf.gather_nd(candidates.next_stop, picked),
      dfa_state=tf.gather_nd(candidates.next_dfa, picked),
      out=tf.where(column, chosen[:, None], tf.gather(s.out, parent)))


def _now_done(setup: _Setup, done, beam_scores, pool_rank, length):
  """bool `[P]`: `done`, or no live beam can beat the prompt's worst pooled.

  HF's rule with `early_stopping=False`: the pool is full (its worst is
  finite) and the best live beam's normalized score is no better.
  """
  best_live = _normalized(beam_scores[:, 0], length, setup.length_penalty)
  return done | ((pool_rank[:, -1] > _NEG_INF)
                 & (best_live <= pool_rank[:, -1]))


def _best_first(setup: _Setup, end: BeamState) -> BeamResult:
  """Each prompt's k best hypotheses, best first.

  The live beams of prompts not done join the pool at their full length.
  """
  prompts, k = setup.prompts, setup.k
  live_rank = tf.where(end.done[:, None], _NEG_INF,
                       _normalized(end.beam_scores, end.step,
                                   setup.length_penalty))
  merged_rank = tf.concat([end.pool_rank, live_rank], 1)
  _, keep = tf.math.top_k(merged_rank, k)
  pool = end.pool
  return BeamResult(
      ids=tf.gather(tf.concat([pool.ids,
                               tf.reshape(end.out, [prompts, k, -1])], 1),
                    keep, batch_dims=1),
      lengths=tf.gather(tf.concat([pool.lengths,
                                   tf.fill([prompts, k], end.step)], 1),
                        keep, batch_dims=1),
      scores=tf.gather(tf.concat([pool.scores,
                                  tf.reshape(end.raw_scores, [prompts, k])],
                                 1),
                       keep, batch_dims=1))
