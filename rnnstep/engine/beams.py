"""Beam search inside the one on-device loop.

Standard beam search of width k over the log-probabilities of the processed
logits (`[UNK]` ban, repetition penalty, n-gram ban; then log-softmax), as HF
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

from typing import NamedTuple

import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import pipeline
from rnnstep.decoding import processors
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


def search(network, request: request_lib.Request) -> BeamResult:
  """Runs beam search for a request (see the module docstring).

  Args:
    network: the model's `Network` (its `banned` ids are never chosen).
    request: the `Request`; `request.beams.num_beams` is k.

  Returns:
    The `BeamResult`.
  """
  vocab_size = network.vocab_size
  k = request.beams.num_beams
  length_penalty = request.beams.length_penalty
  prompt_ids, prompt_lengths = request.prompts
  prompts = tf.shape(prompt_ids)[0]
  rows = prompts * k
  capacity = request.capacity
  num_steps = tf.minimum(request.num_steps, capacity)
  lookback = request.lookback
  parts = pipeline.active(request.sampling, lookback, vocab_size)
  looks_back = pipeline.looks_back(parts)
  stop_table, stop_accept = request.stops
  dfa_table, dfa_ends = request.constraint.table, request.constraint.ends

  # Prime each prompt once, then give each of its k beams a copy.
  state = loop.prime(network, request.prompts, unconsumed=1,
                     initial_state=request.initial_state)
  history = processors.start(prompt_ids, prompt_lengths, vocab_size, lookback,
                             looks_back)
  beam_of_row = tf.repeat(tf.range(prompts), k)
  expand = lambda x: tf.gather(x, beam_of_row)  # pylint: disable=unnecessary-lambda-assignment
  state = tf.nest.map_structure(expand, state)
  history = tf.nest.map_structure(expand, history)
  # The look-back options' per-row values and rows, one copy per beam.
  params = tf.nest.map_structure(expand, request.sampling)
  parts = parts._replace(rows={name: expand(rows)
                               for name, rows in parts.rows.items()})
  last_ids = expand(tf.gather(prompt_ids, prompt_lengths - 1, batch_dims=1))
  # Only beam 0 of each prompt is live at first.
  beam_scores = tf.where(tf.range(k)[None, :] == 0, 0.0,
                         tf.fill([prompts, k], _NEG_INF))
  raw_scores = tf.zeros([rows])
  stop_state = tf.zeros([rows], tf.int32)
  dfa_state = expand(request.constraint.start)
  out = tf.zeros([rows, capacity], tf.int32)
  pool = BeamResult(tf.zeros([prompts, k, capacity], tf.int32),
                    tf.zeros([prompts, k], tf.int32), tf.zeros([prompts, k]))
  pool_rank = tf.fill([prompts, k], _NEG_INF)  # normalized; -inf = empty
  done = tf.zeros([prompts], tf.bool)
  first_row = (tf.range(prompts) * k)[:, None]

  def body(t, state, last_ids, history, beam_scores, raw_scores, stop_state,
           dfa_state, out, pool, pool_rank, done):
    logits, state = network.step(last_ids, state)
    raw_log_p = _log_softmax(logits)
    logits = pipeline.ban(logits, network.banned)
    logits = tf.cond(
        looks_back,
        lambda: pipeline.look_back(logits, params, parts, history, lookback),
        lambda: logits)
    next_dfa = tf.gather(dfa_table, dfa_state)              # [rows, V]
    # A dead beam (-inf score) has no allowed id; its candidates stay -inf.
    logits = tf.where(next_dfa == constraints.DEAD, _NEG_INF, logits)
    candidates = tf.reshape(
        tf.reshape(beam_scores, [rows, 1]) + _log_softmax(logits),
        [prompts, k * vocab_size])
    next_stop = tf.gather(stop_table, stop_state)          # [rows, V]
    finishing = tf.reshape(tf.gather(stop_accept, next_stop)
                           | tf.gather(dfa_ends, next_dfa),
                           [prompts, k * vocab_size])
    length = t + 1

    def parents_and_ids(index):
      return first_row + index // vocab_size, index % vocab_size

    # Finished hypotheses: stop-completing candidates among the k best.
    kth_best = tf.math.top_k(candidates, k).values[:, -1:]
    new_finished = tf.where(finishing & (candidates >= kth_best)
                            & ~done[:, None], candidates, _NEG_INF)
    fin_scores, fin_index = tf.math.top_k(new_finished, k)
    fin_parent, fin_id = parents_and_ids(fin_index)
    column = tf.range(capacity) == t
    fin_ids = tf.where(column, fin_id[..., None], tf.gather(out, fin_parent))
    fin_raw = (tf.gather(raw_scores, fin_parent)
               + tf.gather_nd(raw_log_p, tf.stack([fin_parent, fin_id], -1)))
    merged_rank = tf.concat(
        [pool_rank, _normalized(fin_scores, length, length_penalty)], 1)
    pool_rank, keep = tf.math.top_k(merged_rank, k)
    pool = BeamResult(
        ids=tf.gather(tf.concat([pool.ids, fin_ids], 1), keep, batch_dims=1),
        lengths=tf.gather(tf.concat([pool.lengths,
                                     tf.fill([prompts, k], length)], 1),
                          keep, batch_dims=1),
        scores=tf.gather(tf.concat([pool.scores, fin_raw], 1), keep,
                         batch_dims=1))

    # The new beams: the k best candidates that do not finish.
    beam_scores, index = tf.math.top_k(
        tf.where(finishing, _NEG_INF, candidates), k)
    parent, chosen = parents_and_ids(index)
    parent, chosen = tf.reshape(parent, [rows]), tf.reshape(chosen, [rows])
    reorder = lambda x: tf.gather(x, parent)  # pylint: disable=unnecessary-lambda-assignment
    state = tf.nest.map_structure(reorder, state)
    history = tf.cond(
        looks_back,
        lambda: processors.append(tf.nest.map_structure(reorder, history),
                                  chosen, lookback),
        lambda: history)
    raw_scores = (tf.gather(raw_scores, parent)
                  + tf.gather_nd(raw_log_p, tf.stack([parent, chosen], -1)))
    stop_state = tf.gather_nd(next_stop, tf.stack([parent, chosen], -1))
    dfa_state = tf.gather_nd(next_dfa, tf.stack([parent, chosen], -1))
    out = tf.where(column, chosen[:, None], tf.gather(out, parent))

    # A prompt is done once no live beam can beat its worst finished one.
    best_live = _normalized(beam_scores[:, 0], length, length_penalty)
    done = done | ((pool_rank[:, -1] > _NEG_INF)
                   & (best_live <= pool_rank[:, -1]))
    return (t + 1, state, chosen, history, beam_scores, raw_scores, stop_state,
            dfa_state, out, pool, pool_rank, done)

  def cond(t, *loop_vars):
    return (t < num_steps) & ~tf.reduce_all(loop_vars[-1])

  (steps, _, _, _, beam_scores, raw_scores, _, _, out, pool, pool_rank,
   done) = tf.while_loop(cond, body, (
       tf.constant(0), state, last_ids, history, beam_scores, raw_scores,
       stop_state, dfa_state, out, pool, pool_rank, done))

  # The live beams of prompts not done join the pool at their full length.
  live_rank = tf.where(done[:, None], _NEG_INF,
                       _normalized(beam_scores, steps, length_penalty))
  merged_rank = tf.concat([pool_rank, live_rank], 1)
  _, keep = tf.math.top_k(merged_rank, k)
  return BeamResult(
      ids=tf.gather(tf.concat([pool.ids, tf.reshape(out, [prompts, k, -1])], 1),
                    keep, batch_dims=1),
      lengths=tf.gather(tf.concat([pool.lengths,
                                   tf.fill([prompts, k], steps)], 1),
                        keep, batch_dims=1),
      scores=tf.gather(tf.concat([pool.scores,
                                  tf.reshape(raw_scores, [prompts, k])], 1),
                       keep, batch_dims=1))
