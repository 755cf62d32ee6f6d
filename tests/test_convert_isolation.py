"""The converter's readers run in a child: a crash or hang becomes a ValueError."""

import os
import signal
import time

import numpy as np
import tensorflow as tf

from rnnstep.convert import isolation


def _crash():
  os.kill(os.getpid(), signal.SIGSEGV)


def _hang():
  time.sleep(60)


def _refuse():
  raise ValueError("x.h5: refused for a reason")


def _arrays():
  return {"a": np.arange(3_000_000, dtype=np.float32)}


class IsolationTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    if not isolation.available():
      self.skipTest("no fork on this platform")

  def test_result_comes_back(self):
    out = isolation.run("x.h5", _arrays)
    np.testing.assert_array_equal(out["a"], np.arange(3_000_000, dtype=np.float32))

  def test_exception_comes_back(self):
    with self.assertRaisesRegex(ValueError, "refused for a reason"):
      isolation.run("x.h5", _refuse)

  def test_crash_is_a_one_line_refusal(self):
    with self.assertRaisesRegex(ValueError, r"x.h5: the file crashed its reader "
                                r"\(signal SIGSEGV\)"):
      isolation.run("x.h5", _crash)

  def test_hang_is_cut_off(self):
    # _hang sleeps 60 s: only the cut-off raises this.
    with self.assertRaisesRegex(ValueError, "did not finish in 1 s"):
      isolation.run("x.h5", _hang, timeout=1)


if __name__ == "__main__":
  tf.test.main()
