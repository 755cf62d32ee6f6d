"""The bundled default model: installed with the package, small, and good enough.

Quality bar (issue 4): held-out mean NLL <= 1.60 nats/char on the last 10% of
tinyshakespeare, scored with `rnnstep.logits` over 256-character windows from a
zero state.
"""

import os
import pathlib

import numpy as np
import tensorflow as tf

import rnnstep

CORPUS = (pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
          / "tinyshakespeare.txt")


class BundledModelTest(tf.test.TestCase):

  def test_size_and_vocab(self):
    self.assertLessEqual(os.path.getsize(rnnstep.bundled_model_path()), 16 << 20)
    model = rnnstep.load()
    self.assertLen(model.vocab, 65)
    self.assertEqual(model.vocab[:2], ("\n", " "))

  def test_held_out_nll(self):
    if not CORPUS.exists():
      self.skipTest(f"{CORPUS} is not here")
    text = CORPUS.read_text()
    held_out = text[int(0.9 * len(text)):]
    model = rnnstep.load()
    ids = model.encode(held_out)
    windows = ids[:len(ids) // 256 * 256].reshape(-1, 256)
    logits = rnnstep.logits(model, windows)[:, :-1].astype(np.float64)
    peak = logits.max(-1, keepdims=True)
    log_norm = np.log(np.exp(logits - peak).sum(-1)) + peak[..., 0]
    target = np.take_along_axis(logits, windows[:, 1:, None], -1)[..., 0]
    nll = float((log_norm - target).mean())
    self.assertLessEqual(nll, 1.60)
    self.assertGreater(nll, 1.3)  # Sanity: not scoring the training text.


if __name__ == "__main__":
  tf.test.main()
