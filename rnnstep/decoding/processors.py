"""Logit processors that look back: the repetition, frequency and presence
penalties and the n-gram ban.

They read each row's history (prompt + continuation), which the decode loop
keeps on device as a `History`:

  ids        int32 `[B, L]`  the row's ids so far, from position 0;
  length     int32 `[B]`     how many of them are valid;
  counts     int32 `[B, V]`  occurrences of each id among the last
                             `repetition_window` ids (all of them for 0);
  generated  int32 `[B, V]`  occurrences of each id in the continuation
                             (the ids after the prompt).

The counts move with the window: the id entering and the id leaving it (read
from `ids`), so the penalty costs O(B·V) per step and no sort; `generated`
only gains the id entering.

Rules (as HF `RepetitionPenaltyLogitsProcessor` and
`NoRepeatNGramLogitsProcessor`, and vLLM's `apply_penalties` for OpenAI's two;
see docs/dev/decoding-options.md):

  - repetition penalty θ: for every distinct id in the window,
    `logit / θ if logit > 0 else logit * θ` (θ > 1 discourages repeats);
  - frequency penalty f, then presence penalty p (OpenAI's definition, in
    vLLM's order, after θ): `logit - f * c` and then `- p * (c > 0)`, c the
    id's count in the continuation. As vLLM (`output_bin_counts`), the
    prompt's ids are not counted, unlike θ's window;
  - no-repeat n-gram size n: an id that would complete an n-gram already
    present in the history gets -inf.

All are declared in `options.py` (stage HISTORY); none does any work, nor
keeps a history, for a request whose rows all have θ = 1, f = p = 0 and
n = 0: the loop asks `pipeline.looks_back` and skips them under `tf.cond`.
"""

from typing import NamedTuple

import tensorflow as tf


class Settings(NamedTuple):
  """The look-back settings: one per request, or one per row.

  The library's requests carry `[]` values (a request's rows share them);
  the server's scheduler's carry `[B]` values, so rows of different requests
  run in one batch (`rnnstep/serve/calls.py`). Every function here takes
  either: a `[]` value broadcasts over the rows.

  Attributes:
    repetition_window: int32 `[]` or `[B]`, ids the penalty looks back over
      (0 = all).
    no_repeat_ngram_size: int32 `[]` or `[B]`, n of the n-gram ban
      (0 = off).
    history_length: int32 `[]`, L, the history buffer's length: at least the
      prompt width plus every step of the generation when a look-back rule is
      in use, else 1. Under XLA it is a compile-time constant.
  """
  repetition_window: tf.Tensor
  no_repeat_ngram_size: tf.Tensor
  history_length: tf.Tensor


class History(NamedTuple):
  """Each row's ids so far (see the module docstring)."""
  ids: tf.Tensor
  length: tf.Tensor
  counts: tf.Tensor
  generated: tf.Tensor


def start(prompt_ids: tf.Tensor, prompt_lengths: tf.Tensor, vocab_size: int,
          settings: Settings, use: tf.Tensor) -> History:
  """The history after the prompts.

  Args:
    prompt_ids: int32 `[B, T]`, right-padded.
    prompt_lengths: int32 `[B]`.
    vocab_size: V.
    settings: the `Settings`.
    use: bool scalar, `pipeline.looks_back(...)`; when False the history is
      left empty.

  Returns:
    The `History`.
  """
  batch, width = tf.shape(prompt_ids)[0], tf.shape(prompt_ids)[1]
  length = settings.history_length

  def filled():
    ids = tf.pad(prompt_ids[:, :tf.minimum(width, length)],
                 [[0, 0], [0, tf.maximum(length - width, 0)]])
    position = tf.range(width)[None, :]
    window = settings.repetition_window  # [] or [B]: broadcasts either way.
    first = tf.where(window > 0, prompt_lengths - window, 0)[:, None]
    counted = (position < prompt_lengths[:, None]) & (position >= first)
    # expand_dims, not [:, :, None]: LiteRT's STRIDED_SLICE has no new axis.
    counts = tf.reduce_sum(
        tf.one_hot(prompt_ids, vocab_size, dtype=tf.int32)
        * tf.expand_dims(tf.cast(counted, tf.int32), -1), axis=1)
    return ids, counts

  def empty():
    return (tf.zeros([batch, length], tf.int32),
            tf.zeros([batch, vocab_size], tf.int32))

  ids, counts = tf.cond(use, filled, empty)
  return History(ids, prompt_lengths, counts, tf.zeros_like(counts))


def append(history: History, new_ids: tf.Tensor, settings: Settings) -> History:
  """Appends one id per row; the window's counts follow."""
  vocab_size = history.counts.shape[-1]
  batch = tf.shape(new_ids)[0]
  last = tf.shape(history.ids)[1] - 1
  rows = tf.range(batch)
  position = tf.minimum(history.length, last)
  ids = tf.tensor_scatter_nd_update(history.ids, tf.stack([rows, position], 1),
                                    new_ids)
  new = tf.one_hot(new_ids, vocab_size, dtype=tf.int32)
  counts = history.counts + new
  window = settings.repetition_window  # [] or [B]: broadcasts either way.
  leaving_at = history.length - window
  leaving = tf.gather(ids, tf.clip_by_value(leaving_at, 0, last), batch_dims=1)
  leaves = (window > 0) & (leaving_at >= 0)
  counts -= (tf.one_hot(leaving, vocab_size, dtype=tf.int32)
             * tf.cast(leaves, tf.int32)[:, None])
  return History(ids, history.length + 1, counts, history.generated + new)


def penalize(logits: tf.Tensor, penalty: tf.Tensor, history: History,
             settings: Settings) -> tf.Tensor:
  """The repetition penalty on logits `[B, V]` (after the `[UNK]` ban).

  Args:
    logits: float32 `[B, V]`.
    penalty: float32 `[B]`, θ per row (1 = off).
    history: the rows' `History` (its counts cover the window).
    settings: the `Settings` (unused: the window is in the counts).

  Returns:
    float32 `[B, V]`.
  """
  del settings
  seen = history.counts > 0
  theta = penalty[:, None]
  penalized = tf.where(logits > 0, logits / theta, logits * theta)
  return tf.where(seen & (theta != 1.0), penalized, logits)


def penalize_frequency(logits: tf.Tensor, penalty: tf.Tensor,
                       history: History, settings: Settings) -> tf.Tensor:
  """OpenAI's frequency penalty on logits `[B, V]` (after the repetition
  penalty): `logits - f * count`, count over the continuation only.

  Args:
    logits: float32 `[B, V]`.
    penalty: float32 `[B]`, f per row (0 = off).
    history: the rows' `History` (its `generated` counts).
    settings: the `Settings` (unused).

  Returns:
    float32 `[B, V]`.
  """
  del settings
  return logits - penalty[:, None] * tf.cast(history.generated, tf.float32)


def penalize_presence(logits: tf.Tensor, penalty: tf.Tensor,
                      history: History, settings: Settings) -> tf.Tensor:
  """OpenAI's presence penalty on logits `[B, V]` (after the frequency
  penalty): `logits - p` on every id the continuation holds (not the prompt's).

  Args:
    logits: float32 `[B, V]`.
    penalty: float32 `[B]`, p per row (0 = off).
    history: the rows' `History` (its `generated` counts).
    settings: the `Settings` (unused).

  Returns:
    float32 `[B, V]`.
  """
  del settings
  return logits - penalty[:, None] * tf.cast(history.generated > 0, tf.float32)


def ban_ngrams(logits: tf.Tensor, n: tf.Tensor, history: History,
               settings: Settings) -> tf.Tensor:
  """The n-gram ban on logits `[B, V]`: -inf on ids completing a seen n-gram.

  `n` is `[]` (the library: the pipeline runs this only when n > 0) or
  `[B]` (the serving engine: rows with n = 0 are left as they are).
  """
  del settings
  return logits + ngram_ban(history, n, logits.shape[-1])


def ngram_ban(history: History, n: tf.Tensor, vocab_size: int) -> tf.Tensor:
  """-inf on every id that would complete an n-gram already in the history.

  The last n-1 ids are compared with every earlier window of n-1 ids (one
  `[B, L]` comparison per id of the window); the id that followed a matching
  window is banned.

  Args:
    history: the rows' `History`.
    n: int32 `[]` (> 0), or `[B]`, one n per row (0: that row bans nothing).
    vocab_size: V.

  Returns:
    float32 `[B, V]`: 0 or -inf.
  """
  n = tf.convert_to_tensor(n)
  if n.shape.rank == 1:
    return _ngram_ban_per_row(history, n, vocab_size)
  ids, length = history.ids, history.length
  size = tf.shape(ids)[1]
  start = tf.range(size)[None, :]
  # Windows starting at j whose following id exists: j + n - 1 < length.
  match = start + n - 1 < length[:, None]

  def body(k, match):
    earlier = tf.gather(ids, tf.minimum(start + k, size - 1)[0], axis=1)
    recent = tf.gather(ids, tf.maximum(length - n + 1 + k, 0), batch_dims=1)
    return k + 1, match & (earlier == recent[:, None])

  _, match = tf.while_loop(lambda k, _: k < n - 1, body, (tf.constant(0), match))
  follower = tf.gather(ids, tf.minimum(start + n - 1, size - 1)[0], axis=1)
  return _ban_followers(match, follower, vocab_size)


def _ngram_ban_per_row(history: History, n: tf.Tensor,
                       vocab_size: int) -> tf.Tensor:
  """`ngram_ban` with one n per row (`[B]`; 0 = off for that row).

  The same comparisons as the one-n version, run to the largest n: at
  comparison k a row whose window is shorter (k >= its n - 1) keeps its
  match as it is, and a row's follower is the id n_row - 1 after the start.
  So each row's ban is exactly what `ngram_ban` gives it alone.
  """
  ids, length = history.ids, history.length
  size = tf.shape(ids)[1]
  start = tf.range(size)[None, :]
  rows_n = n[:, None]  # [B, 1]
  match = (start + rows_n - 1 < length[:, None]) & (rows_n > 0)

  def body(k, match):
    earlier = tf.gather(ids, tf.minimum(start + k, size - 1)[0], axis=1)
    # Clipped both ways: a row whose window ended before k reads any id
    # (its match is kept as it is), and an index past L would fail on a CPU.
    recent = tf.gather(ids, tf.clip_by_value(length - n + 1 + k, 0, size - 1),
                       batch_dims=1)
    compared = k < rows_n - 1
    return k + 1, match & (~compared | (earlier == recent[:, None]))

  _, match = tf.while_loop(lambda k, _: k < tf.reduce_max(n) - 1, body,
                           (tf.constant(0), match))
  follower = tf.gather(
      ids, tf.clip_by_value(start + rows_n - 1, 0, size - 1), batch_dims=1)
  return _ban_followers(match, follower, vocab_size)


def _ban_followers(match: tf.Tensor, follower: tf.Tensor,
                   vocab_size: int) -> tf.Tensor:
  """float32 `[B, V]`: -inf at each row's followers of a matching window.

  Args:
    match: bool `[B, L]`, the windows (by start) that match the row's last
      n - 1 ids.
    follower: int32 `[B, L]`, the id after each window.
    vocab_size: V.
  """
  batch = tf.shape(match)[0]
  rows = tf.broadcast_to(tf.range(batch)[:, None], tf.shape(follower))
  # A segment max over (row, id), not `tensor_scatter_nd_max`, which LiteRT
  # has no builtin for (UNSORTED_SEGMENT_MAX it has): an id no window
  # precedes gets the lowest int32, as unbanned as 0.
  banned = tf.math.unsorted_segment_max(
      tf.reshape(tf.cast(match, tf.int32), [-1]),
      tf.reshape(rows * vocab_size + follower, [-1]), batch * vocab_size)
  return tf.where(tf.reshape(banned, [batch, vocab_size]) > 0,
                  -float("inf"), 0.0)
