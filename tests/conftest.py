"""Shared test set-up: quiet TF logs, Keras on the TensorFlow backend."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from absl import flags  # pylint: disable=g-import-not-at-top

# absl's TestCase helpers (create_tempdir) read flags; pytest does not parse them.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()
