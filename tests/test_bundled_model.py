"""The bundled default model: installed with the package, small, and good enough.

Quality bar (issue 4): held-out mean NLL <= 1.60 nats/char on the last 10% of
tinyshakespeare, scored with `rnnstep.logits` over 256-character windows from a
zero state.

The corpus lives outside the repository (../shared), so the bar is also held
on an excerpt committed with the tests, which is always there:
tests/data/tinyshakespeare_heldout_excerpt.txt is 64 of the 435 held-out
windows (`numpy.linspace(0, 434, 64).round()`, 16 KB) from the held-out 10%
(the model trained on the first 90%; tools/train_reference.py). The model
scores 1.4605 on it and 1.4854 on all 435 windows, so the excerpt's bar is the
full bar moved by that difference: 1.60 - 0.025 = 1.575. Under CI (CI=true)
the full-corpus test fails, not skips, when the corpus is missing.
"""

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import rnnstep

CORPUS = (pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
          / "tinyshakespeare.txt")
EXCERPT = (pathlib.Path(__file__).resolve().parent / "data"
           / "tinyshakespeare_heldout_excerpt.txt")
WINDOW = 256


def held_out(text):
  return text[int(0.9 * len(text)):]


def excerpt_windows(held_out_text):
  """The excerpt's windows, as chosen from the held-out text."""
  count = len(held_out_text) // WINDOW
  return [held_out_text[i * WINDOW:(i + 1) * WINDOW]
          for i in np.linspace(0, count - 1, 64).round().astype(int)]


def mean_nll(model, text):
  """Mean NLL (nats/char) over consecutive 256-character windows of text."""
  ids = model.encode(text)
  windows = ids[:len(ids) // WINDOW * WINDOW].reshape(-1, WINDOW)
  logits = rnnstep.logits(model, windows)[:, :-1].astype(np.float64)
  peak = logits.max(-1, keepdims=True)
  log_norm = np.log(np.exp(logits - peak).sum(-1)) + peak[..., 0]
  target = np.take_along_axis(logits, windows[:, 1:, None], -1)[..., 0]
  return float((log_norm - target).mean())


class BundledModelTest(tf.test.TestCase):

  def test_size_and_vocab(self):
    self.assertLessEqual(os.path.getsize(rnnstep.bundled_model_path()), 16 << 20)
    model = rnnstep.load()
    self.assertLen(model.vocab, 65)
    self.assertEqual(model.vocab[:2], ("\n", " "))

  @pytest.mark.slow  # The whole held-out text; the excerpt's test is quick.
  def test_held_out_nll(self):
    if not CORPUS.exists():
      if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        self.fail(f"{CORPUS} is missing: the quality bar on the full held-out "
                  "text cannot run (CI is set, so this is not skipped)")
      self.skipTest(f"{CORPUS} is not here (the excerpt test still runs)")
    text = CORPUS.read_text()
    nll = mean_nll(rnnstep.load(), held_out(text))
    self.assertLessEqual(nll, 1.60)
    self.assertGreater(nll, 1.3)  # Sanity: not scoring the training text.
    # The committed excerpt is what it says it is.
    self.assertEqual(EXCERPT.read_text(), "".join(excerpt_windows(held_out(text))))

  def test_held_out_nll_on_the_committed_excerpt(self):
    text = EXCERPT.read_text()
    self.assertLen(text, 64 * WINDOW)
    nll = mean_nll(rnnstep.load(), text)
    self.assertLessEqual(nll, 1.575)
    self.assertGreater(nll, 1.3)


if __name__ == "__main__":
  tf.test.main()
