"""Independent numpy references for the decoding rules (tests only).

Written from the rules as stated (HF `generate`; docs/dev/decoding-options.md),
plainly and slowly, sharing no code with rnnstep: the repetition penalty,
OpenAI's frequency and presence penalties (vLLM's `apply_penalties`), the
n-gram ban, min-p / top-k / top-p supports, log-likelihood scores and a
brute-force beam search over a float64 forward (`numpy_reference.Reference`).
"""

import math

import numpy as np


def penalize(logits, history, theta, window):
  """The CTRL/HF repetition penalty over the last `window` ids (0 = all)."""
  logits = np.array(logits, np.float64)
  looked_at = history[-window:] if window else history
  for token in set(int(t) for t in looked_at):
    value = logits[token]
    logits[token] = value / theta if value > 0 else value * theta
  return logits


def ngram_banned(history, n):
  """The ids that would complete an n-gram already in `history` (HF)."""
  history = [int(t) for t in history]
  if n <= 0 or len(history) < n - 1:
    return set()
  recent = tuple(history[len(history) - n + 1:]) if n > 1 else ()
  banned = set()
  for start in range(len(history) - n + 1):
    if tuple(history[start:start + n - 1]) == recent:
      banned.add(history[start + n - 1])
  return banned


def penalize_openai(logits, continuation, frequency, presence):
  """OpenAI's penalties as vLLM applies them: for each id c times in the
  generated ids (the prompt's not counted), `- frequency * c`, then
  `- presence`."""
  logits = np.array(logits, np.float64)
  for token in set(int(t) for t in continuation):
    times = sum(int(t) == token for t in continuation)
    logits[token] -= frequency * times
    logits[token] -= presence
  return logits


def process(logits, history, *, banned=(), theta=1.0, window=0, ngram=0,
            frequency=0.0, presence=0.0, prompt_length=None):
  """[UNK] ban -> repetition penalty -> frequency and presence penalties
  (over `history[prompt_length:]`) -> n-gram ban, on raw logits `[V]`."""
  logits = np.array(logits, np.float64)
  logits[list(banned)] = -np.inf
  if theta != 1.0:
    logits = penalize(logits, history, theta, window)
  if frequency or presence:
    assert prompt_length is not None, "the penalties count the continuation"
    logits = penalize_openai(logits, history[prompt_length:], frequency,
                             presence)
  logits[list(ngram_banned(history, ngram))] = -np.inf
  return logits


def log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  finite = logits[np.isfinite(logits)]
  peak = finite.max()
  return logits - (peak + math.log(np.exp(finite - peak).sum()))


def support(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
            typical_p=1.0):
  """The ids a sample can draw after temperature, top-k, top-p, min-p and
  typical-p (HF's order)."""
  scaled = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-scaled, kind="stable")
  keep = np.isfinite(scaled)
  if 0 < top_k < len(scaled):
    kth = scaled[order[top_k - 1]]
    keep &= scaled >= kth
  if top_p < 1.0:
    probs = np.exp(log_softmax(np.where(keep, scaled, -np.inf)))
    mass, kept = 0.0, np.zeros_like(keep)
    for token in order:
      if not keep[token]:
        continue
      kept[token] = True
      mass += probs[token]
      if mass >= top_p:
        break
    keep = kept | (keep & (scaled >= scaled[kept].min()))
  if min_p > 0.0:
    peak = scaled[keep].max()
    keep &= scaled >= peak + math.log(min_p)
  if typical_p < 1.0:
    keep &= typical_kept(np.where(keep, scaled, -np.inf), typical_p)
  return set(np.flatnonzero(keep).tolist())


def typical_kept(scaled, mass):
  """HF's typical decoding (Meister et al. 2022) as a kept mask over `[V]`.

  With p the softmax and H = -sum p log p, ids are ordered by |-log p - H|
  (stably); the first position where the ordered probabilities' running sum
  reaches `mass` (or the last position) sets a threshold on |-log p - H|, and
  every id at or below it is kept.
  """
  log_p = log_softmax(scaled)
  p = np.exp(log_p)
  finite = np.isfinite(log_p)
  entropy = -float((p[finite] * log_p[finite]).sum())
  atypical = np.where(finite, np.abs(-log_p - entropy), np.inf)
  order = np.argsort(atypical, kind="stable")
  running = np.cumsum(p[order])
  last = min(int((running < mass).sum()), len(scaled) - 1)
  return atypical <= atypical[order[last]]


def continuation_log_likelihood(reference, prompt_ids, continuation):
  """sum log p(continuation[t] | prompt, continuation[:t]) under raw logits."""
  ids = list(prompt_ids) + list(continuation)
  logits = reference.logits(np.array(ids[:-1]))
  total = 0.0
  for t, token in enumerate(continuation):
    total += log_softmax(logits[len(prompt_ids) - 1 + t])[token]
  return total


def beam_search(reference, prompt_ids, num_steps, num_beams, *, stops=(),
                length_penalty=1.0, banned=(), theta=1.0, window=0, ngram=0,
                frequency=0.0, presence=0.0, stopped=None, allowed=None, complete=None):
  """Brute-force beam search (HF rules, early_stopping=False).

  Every step expands every live beam by every id, sorts all candidates, sets
  aside stop-completing ones among the k best as finished hypotheses (ranked
  by score / length**length_penalty, length = generated ids), and keeps the k
  best others as beams. Done when k are finished and the best beam cannot beat
  the worst of them; then live beams join.

  Token models (and patterns) say when a hypothesis stops by predicates over
  the generated ids, which the caller writes from the text:

  Args:
    stops: stop strings as id sequences (a character model's): a hypothesis
      stops when its ids end with one.
    stopped: instead of `stops`, `stopped(ids) -> bool`: whether the
      continuation `ids` holds a stop string (it may span tokens).
    allowed: `allowed(ids) -> bool`: whether the continuation stays inside a
      `regex=` pattern; the ids it leaves are -inf after the look-back rules,
      before the log-softmax.
    complete: `complete(ids) -> bool`: a match no id can extend (the
      hypothesis is finished, as one that met a stop string).

  Returns:
    The k hypotheses, best first: (ids, processed score, raw log-likelihood).
  """
  stops = [tuple(s) for s in stops]
  if stopped is None:
    def stopped(ids):
      return any(tuple(ids[-len(s):]) == s for s in stops if len(ids) >= len(s))
  state = reference.zero_state()
  for token in prompt_ids[:-1]:
    _, state = reference.step(int(token), state)
  # (score, raw, generated ids, state, last id)
  beams = [(0.0, 0.0, [], state, int(prompt_ids[-1]))]
  finished = []  # (normalized, score, raw, ids)

  def normalized(score, length):
    return score / (length ** length_penalty)

  for step in range(num_steps):
    candidates = []
    for b, (score, raw, ids, state, last) in enumerate(beams):
      logits, new_state = reference.step(last, state)
      history = list(prompt_ids) + ids
      processed = process(logits, history, banned=banned, theta=theta,
                          window=window, ngram=ngram, frequency=frequency,
                          presence=presence, prompt_length=len(prompt_ids))
      if allowed is not None:
        processed[[v for v in range(len(logits))
                   if not allowed(ids + [v])]] = -np.inf
      log_p = log_softmax(processed)
      raw_log_p = log_softmax(logits)
      for token in range(len(logits)):
        if np.isfinite(log_p[token]):
          candidates.append((score + log_p[token], b, token,
                             raw + raw_log_p[token], new_state))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    new_beams = []
    for rank, (score, b, token, raw, new_state) in enumerate(candidates):
      if len(new_beams) == num_beams:  # Every later rank is >= k.
        break
      ids = beams[b][2] + [token]
      if stopped(ids) or (complete is not None and complete(ids)):
        if rank < num_beams:
          finished.append((normalized(score, len(ids)), score, raw, ids))
        continue
      new_beams.append((score, raw, ids, new_state, token))
    finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
    beams = new_beams
    if not beams:  # Every candidate finished (a pattern's matches ended).
      break
    if (len(finished) == num_beams and
        normalized(beams[0][0], step + 1) <= finished[-1][0]):
      break
  else:
    for score, raw, ids, _, _ in beams:
      finished.append((normalized(score, len(ids)), score, raw, ids))
  finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
  return [(ids, score, raw) for _, score, raw, ids in finished]


# -- the sampling noise, from its spec (sampling.py's module docstring) -------
_MASK32 = 0xFFFFFFFF


def _fmix32(x):
  """MurmurHash3's finalizer on uint32 values, in Python integers."""
  x = np.asarray(x, np.uint64) & _MASK32
  x ^= x >> 16
  x = (x * 0x85EBCA6B) & _MASK32
  x ^= x >> 13
  x = (x * 0xC2B2AE35) & _MASK32
  return x ^ (x >> 16)


def row_key(seed, index):
  """A row's noise key for (seed, index): the low and high words of the 64-bit
  seed, then the index, each xor-ed in and mixed."""
  low, high = int(seed) & _MASK32, (int(seed) >> 32) & _MASK32
  key = _fmix32(low ^ 0x9E3779B9)
  key = _fmix32(key ^ high)
  return int(_fmix32(key ^ (int(index) & _MASK32)))


def gumbel_noise(key, step, vocab_size):
  """The Gumbel noise a row with `key` adds to its scaled logits at `step`."""
  step_key = _fmix32(key ^ _fmix32((int(step) + 0x632BE5AB) & _MASK32))
  salt = (np.arange(vocab_size, dtype=np.uint64) * 0x27D4EB2F
          + 0x165667B1) & _MASK32
  bits = _fmix32(step_key ^ salt)
  uniform = ((bits >> 8).astype(np.float64) + 0.5) / (1 << 24)
  return -np.log(-np.log(uniform))


# The 99.9% quantiles of chi-square by degrees of freedom (scipy.stats.chi2).
CHI2_999 = {0: 0.0, 1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52,
             6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59, 11: 31.26,
             12: 32.91, 13: 34.53, 14: 36.12, 15: 37.70, 16: 39.25, 17: 40.79,
             18: 42.31, 19: 43.82}
