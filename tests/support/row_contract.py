"""The batch contract, as a test assertion (tests only).

What rnnstep guarantees about a row (README "Reproducibility"; BUILD_NOTES
"What a row's text depends on"):

  - the same request (prompts, batch, settings, seed) on the same path and
    machine gives the same ids, bit for bit;
  - within any other batch, a row's logits equal the row alone to float32
    rounding only: the CPU's matmul kernel (oneDNN / Eigen / XLA) is chosen by
    the batch size and the instruction set and sums in its own order. So its
    text is the same as alone except where, at some step, the two best
    candidates tie to within that rounding, where either may win.

`assert_same_or_near_tie` checks the second against the independent float64
forward (`numpy_reference.Reference`) and the noise's own spec
(`decoding_reference.gumbel_noise`): two texts are equal, or they part at a
step whose two candidates score within `tolerance` of each other.
"""

import numpy as np

from tests.support import decoding_reference as dr

# Far above the float32 rounding a few dozen steps of recurrence pile up
# (measured batch-vs-alone logit gaps are ~1e-7..1e-5), far below a real
# disagreement (an error in the arithmetic moves logits by O(0.1)).
TOLERANCE = 1e-3


def parting_step(got, want):
  """The first index where two id sequences differ (None where they do not)."""
  for t, (a, b) in enumerate(zip(got, want)):
    if a != b:
      return t
  return None if len(got) == len(want) else min(len(got), len(want))


def assert_same_or_near_tie(reference, prompt_ids, got_ids, want_ids, *,
                            temperature=0.0, key=None, theta=1.0, window=0,
                            ngram=0, tolerance=TOLERANCE, message=""):
  """Asserts two continuations of one prompt are equal or part at a near-tie.

  Args:
    reference: the float64 `numpy_reference.Reference` of the model.
    prompt_ids: the prompt's ids.
    got_ids: one continuation's ids (e.g. the row in a batch).
    want_ids: the other's (e.g. the row alone).
    temperature: the row's temperature (0: greedy).
    key: the row's noise key (`decoding_reference.row_key`), when sampled.
    theta, window, ngram: the row's look-back settings.
    tolerance: how close the two candidates' scores must be.
    message: added to the failure.

  Raises:
    AssertionError: the continuations part where no near-tie explains it.
  """
  got_ids, want_ids = [int(i) for i in got_ids], [int(i) for i in want_ids]
  step = parting_step(got_ids, want_ids)
  if step is None:
    return
  if step >= min(len(got_ids), len(want_ids)):
    raise AssertionError(f"one continuation is a prefix of the other "
                         f"({len(got_ids)} vs {len(want_ids)} ids) {message}")
  history = list(prompt_ids) + got_ids[:step]
  logits = reference.logits(np.array(history))[-1]
  scores = dr.process(logits, history, banned=reference.banned, theta=theta,
                      window=window, ngram=ngram)
  if temperature > 0:
    scores = scores / temperature + dr.gumbel_noise(key, step, len(scores))
  a, b = got_ids[step], want_ids[step]
  gap = abs(scores[a] - scores[b])
  top = np.sort(scores[np.isfinite(scores)])[-2:]
  if not (gap <= tolerance * max(1.0, abs(scores[a]))
          and min(scores[a], scores[b]) >= top[0] - tolerance):
    raise AssertionError(
        f"continuations part at step {step} ({a} vs {b}) with a score gap of "
        f"{gap:.3g} (not a near-tie; best two {top}) {message}")
