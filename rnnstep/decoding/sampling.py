"""Sampling: the draw, the noise and the filters' logits transforms, on device.

The options themselves (which exist, their order, their checks) are declared
in `options.py`; `pipeline.py` applies them in that order. This module holds
what a step's choice is made of, the same under graph mode and XLA:

  - temperature: `temperature == 0` is greedy argmax (first maximum on ties);
    otherwise logits are divided by it (`scale`);
  - the filters' transforms, each setting the ids outside its kept set to
    -inf: `top_k_filter` (ties at the k-th value are kept), `top_p_filter`
    (the smallest set of most likely ids whose probability reaches p),
    `min_p_filter` (probability at least min_p x the largest),
    `typical_filter` (typical decoding, HF's rule);
  - one draw by the Gumbel-max trick: `argmax(logits + Gumbel noise)` is an
    exact sample of `softmax(logits)`.

Randomness is a counter-based hash, not a stateful or op-specific RNG: the noise
for (row key, step, id) is `fmix32` (MurmurHash3's finalizer) chained over those
integers. It is therefore identical in graph mode and under XLA, for a
one-shot run and for the same run in chunks, and a row's noise depends only on
its own key, never on the batch it is in. Row keys come from `row_keys(seeds,
index)`: for `seed=s`, row i uses `(s, i)`.
"""

import tensorflow as tf

from rnnstep.decoding import options

# Logits are clipped here before sampling so that a tiny temperature cannot
# produce inf - inf = NaN in a filter's softmax.
_LOGIT_LIMIT = 1e30

# The per-row values of a request (`options.Params`), their dtypes and defaults.
# (PARAM_DTYPES, not DTYPES: `network.DTYPES` is the models' compute dtypes.)
Params = options.Params
PARAM_DTYPES = Params(*(tf.as_dtype(option.dtype)
                        for option in options.PER_ROW))
DEFAULTS = options.DEFAULTS


def _u32(value):
  return tf.constant(value, tf.uint32)


def fmix32(x: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finalizer: a bijective, well-mixing uint32 -> uint32."""
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
  x = x * _u32(0x85EBCA6B)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(13)))
  x = x * _u32(0xC2B2AE35)
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))


def row_keys(seeds: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
  """Derives one uint32 key per row from an int64 seed and an int32 row index.

  Args:
    seeds: int64 `[B]`, the seed of each row.
    index: int32 `[B]`, each row's index under its seed.

  Returns:
    uint32 `[B]`.
  """
  seeds = tf.convert_to_tensor(seeds, tf.int64)
  low = tf.cast(tf.bitwise.bitwise_and(seeds, tf.constant(0xFFFFFFFF, tf.int64)),
                tf.uint32)
  high = tf.cast(tf.bitwise.right_shift(seeds, tf.constant(32, tf.int64)),
                 tf.uint32)
  key = fmix32(tf.bitwise.bitwise_xor(low, _u32(0x9E3779B9)))
  key = fmix32(tf.bitwise.bitwise_xor(key, high))
  return fmix32(tf.bitwise.bitwise_xor(key, tf.cast(index, tf.uint32)))


def uniform_noise(keys: tf.Tensor, step: tf.Tensor, vocab_size: int) -> tf.Tensor:
  """Uniform floats in (0, 1), `[B, vocab_size]`, a pure function of (key, step, id)."""
  step_key = fmix32(tf.bitwise.bitwise_xor(
      keys, fmix32(tf.cast(step, tf.uint32) + _u32(0x632BE5AB))))
  ids = tf.range(vocab_size, dtype=tf.int32)
  id_salt = tf.cast(ids, tf.uint32) * _u32(0x27D4EB2F) + _u32(0x165667B1)
  bits = fmix32(tf.bitwise.bitwise_xor(step_key[:, None], id_salt[None, :]))
  # The top 24 bits, centred in their interval: never exactly 0 or 1.
  mantissa = tf.cast(tf.bitwise.right_shift(bits, _u32(8)), tf.float32)
  return (mantissa + 0.5) * (1.0 / (1 << 24))


# How many of a row's largest values a filter sorts when that is enough (see
# `_sorted_descending`): a full sort of a word vocabulary is the costliest
# part of a step, over ten times the 256 largest's (measured on a 2-vCPU EPYC
# Zen 4). 256 covers the usual top-k values.
SORTED_HEAD = 256


def _finite_count(scaled: tf.Tensor) -> tf.Tensor:
  """Each row's count of ids a filter has not set to -inf, int32 `[B]`."""
  return tf.reduce_sum(tf.cast(scaled != -float("inf"), tf.int32), -1)


def _sorted_descending(scaled: tf.Tensor, needed: tf.Tensor):
  """Each row sorted descending, `[B, V]`; only its head sorted when enough.

  When no row needs more than `SORTED_HEAD` leading values, those come from
  one `top_k` and the rest are -inf: the result is the full sort exactly
  (the same values in the same places) for the rows that need no more, which
  is every row whose ids beyond its `needed` are -inf. Otherwise (or for a
  vocabulary no larger than the head, a character model's) it is the full
  sort, as before.

  Args:
    scaled: float32 `[B, V]`.
    needed: int32 `[B]`, how many leading values each row needs exact.

  Returns:
    (float32 `[B, V]`, V).
  """
  vocab_size = scaled.shape[-1] or tf.shape(scaled)[-1]

  def full():
    return tf.sort(scaled, axis=-1, direction="DESCENDING")

  if not isinstance(vocab_size, int) or vocab_size <= SORTED_HEAD:
    return full(), vocab_size

  def head():
    values = tf.math.top_k(scaled, SORTED_HEAD).values
    rest = tf.fill([tf.shape(scaled)[0], vocab_size - SORTED_HEAD],
                   -float("inf"))
    return tf.concat([values, rest], -1)

  ordered = tf.cond(tf.reduce_max(needed) <= SORTED_HEAD, head, full)
  return tf.ensure_shape(ordered, scaled.shape), vocab_size


def _keep_at_least(scaled: tf.Tensor, threshold: tf.Tensor) -> tf.Tensor:
  return tf.where(scaled >= threshold[:, None], scaled, -float("inf"))


def top_k_filter(scaled: tf.Tensor, top_k: tf.Tensor) -> tf.Tensor:
  """Keeps each row's k largest logits (ties at the k-th kept); others -inf.

  Only the k-th largest value is read: a row keeping everything (k = 0 or
  >= V) needs no value sorted (its threshold, the row's least value, keeps
  every id), the others their first k (`_sorted_descending`).

  Args:
    scaled: float32 `[B, V]`, logits after temperature.
    top_k: int32 `[B]` (0 or >= V: everything kept).
  """
  vocab_size = scaled.shape[-1] or tf.shape(scaled)[-1]
  cut = (top_k > 0) & (top_k < vocab_size)
  ordered, _ = _sorted_descending(scaled, tf.where(cut, top_k, 0))
  k = tf.where(cut, top_k, vocab_size)
  # A row keeping everything keeps it at any threshold <= its least value;
  # -inf is one that the head (where its least value is not) also gives.
  threshold = tf.where(cut, tf.gather(ordered, k - 1, batch_dims=1),
                       -float("inf"))
  return _keep_at_least(scaled, threshold)


def top_p_filter(scaled: tf.Tensor, top_p: tf.Tensor) -> tf.Tensor:
  """Keeps the smallest set of most likely ids whose probability reaches p.

  The sorted row, its softmax and cumulative sum are those of the whole
  row (the same float32 sums); a row that an earlier filter (top-k) left
  with few finite ids is sorted only that far (`_sorted_descending`).

  Args:
    scaled: float32 `[B, V]`, logits after temperature (and top-k).
    top_p: float32 `[B]`.
  """
  ordered, _ = _sorted_descending(scaled, _finite_count(scaled))
  before = tf.cumsum(tf.nn.softmax(ordered, axis=-1), axis=-1, exclusive=True)
  # Keep ids whose preceding mass is below p; the first is always kept (its
  # preceding mass is 0 < p).
  kept = tf.reduce_sum(tf.cast(before < top_p[:, None], tf.int32), -1)
  return _keep_at_least(
      scaled, tf.gather(ordered, tf.maximum(kept, 1) - 1, batch_dims=1))


def min_p_filter(scaled: tf.Tensor, min_p: tf.Tensor) -> tf.Tensor:
  """Sets logits whose probability is below min_p x the largest to -inf.

  `p_i >= min_p * p_max` is `scaled_i >= max(scaled) + log(min_p)`, so no
  softmax is needed; a row with min_p 0 keeps everything (log 0 = -inf).
  """
  return _keep_at_least(scaled, tf.reduce_max(scaled, -1) + tf.math.log(min_p))


def typical_filter(scaled: tf.Tensor, typical_p: tf.Tensor) -> tf.Tensor:
  """Typical decoding (Meister et al. 2022), as HF's `TypicalLogitsWarper`.

  With log p the log-softmax of the row and H = -sum p log p its entropy,
  ids are ordered by |-log p - H| (most typical first); the smallest prefix
  whose probability reaches `typical_p` is kept, together with every id as
  typical as its last (at least one id). Ids already at -inf stay there.

  Args:
    scaled: float32 `[B, V]`, logits after temperature and the filters
      before it (top-k, top-p, min-p).
    typical_p: float32 `[B]` in (0, 1].
  """
  vocab_size = scaled.shape[-1] or tf.shape(scaled)[-1]
  log_p = tf.nn.log_softmax(scaled, axis=-1)
  p = tf.exp(log_p)
  entropy = -tf.reduce_sum(tf.where(p > 0, p * log_p, 0.0), -1, keepdims=True)
  atypical = tf.abs(-log_p - entropy)  # inf where scaled is -inf
  ordered_atypical, ordered_scaled = _typical_order(scaled, atypical)
  mass = tf.cumsum(tf.nn.softmax(ordered_scaled, -1), axis=-1)
  last = tf.minimum(
      tf.reduce_sum(tf.cast(mass < typical_p[:, None], tf.int32), -1),
      vocab_size - 1)
  threshold = tf.gather(ordered_atypical, last, batch_dims=1)
  return tf.where(atypical > threshold[:, None], -float("inf"), scaled)


def _typical_order(scaled: tf.Tensor, atypical: tf.Tensor):
  """`atypical` and `scaled` ordered by `atypical` ascending (ties by id).

  A full stable argsort; or, when no row has more than `SORTED_HEAD` finite
  ids (an earlier top-k), the first `SORTED_HEAD` of that order from one
  `top_k` (which puts the lower id first on ties, as the stable argsort,
  itself a `top_k` of the negated values, does) and then inf and -inf:
  every id past a row's finite ones has atypical inf and scaled -inf, so
  both results hold the same values in the same places.

  Returns:
    (ordered atypical, ordered scaled), float32 `[B, V]` each.
  """
  vocab_size = scaled.shape[-1]

  def full():
    order = tf.argsort(atypical, axis=-1, stable=True)
    return (tf.gather(atypical, order, batch_dims=1),
            tf.gather(scaled, order, batch_dims=1))

  if vocab_size is None or vocab_size <= SORTED_HEAD:
    return full()

  def head():
    order = tf.math.top_k(-atypical, SORTED_HEAD).indices
    rest = [tf.shape(scaled)[0], vocab_size - SORTED_HEAD]
    return (tf.concat([tf.gather(atypical, order, batch_dims=1),
                       tf.fill(rest, float("inf"))], -1),
            tf.concat([tf.gather(scaled, order, batch_dims=1),
                       tf.fill(rest, -float("inf"))], -1))

  ordered = tf.cond(
      tf.reduce_max(_finite_count(scaled)) <= SORTED_HEAD, head, full)
  return tuple(tf.ensure_shape(x, scaled.shape) for x in ordered)


def scale(logits: tf.Tensor, temperature: tf.Tensor,
          sampled_rows: tf.Tensor) -> tf.Tensor:
  """Logits / temperature for sampled rows, clipped; -inf (banned) stays -inf."""
  temperature = tf.where(sampled_rows, temperature, 1.0)[:, None]
  clipped = tf.clip_by_value(logits / temperature, -_LOGIT_LIMIT, _LOGIT_LIMIT)
  return tf.where(logits > -float("inf"), clipped, logits)


def first_max_index(scores: tf.Tensor) -> tf.Tensor:
  """The index of each row's first maximum, int32 `[B]`: `tf.argmax`'s answer.

  Written as a max and then the least index holding it: XLA's CPU backend runs
  `tf.argmax` (one reduction over value-index pairs) as scalar code with the
  sampling noise fused into it, but these two plain reductions vectorize. A
  row without a maximum (NaN) gets the last index.

  Args:
    scores: float32 `[B, V]`.
  """
  vocab_size = scores.shape[-1] or tf.shape(scores)[-1]
  top = tf.reduce_max(scores, axis=-1, keepdims=True)
  index = tf.where(scores == top, tf.range(vocab_size)[None, :], vocab_size - 1)
  return tf.reduce_min(index, axis=-1)


def perturbed(scaled: tf.Tensor, keys: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
  """scaled + Gumbel noise: its argmax is one draw from softmax(scaled)."""
  gumbel = -tf.math.log(-tf.math.log(
      uniform_noise(keys, step, scaled.shape[-1])))
  return scaled + gumbel


def draw(scaled: tf.Tensor, keys: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
  """One Gumbel-max draw from softmax(scaled) per row."""
  return first_max_index(perturbed(scaled, keys, step))
