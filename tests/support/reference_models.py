"""Small real Keras models, and their rnnstep twins, shared by test files.

- `STACKS` / `stack_models(name)`: one model of every stack (GRU reset_after
  true/false, LSTM, SimpleRNN, GRU x2, LSTM -> GRU) over 65 characters
  (tests/test_generator.py, tests/test_numpy_reference.py).
- `sampling_model()`: a 21-id GRU with "[UNK]" as id 0 and a float64 numpy
  reference that bans it (tests/test_sampling.py, tests/test_constraints.py).
- `TINY_LAYERS`: the suite's everyday tiny architecture, GRU 32 over
  `kr.build`'s default 65 characters and D=16: that of `cli.write_model`'s
  files, so the in-process tests that build it (tests/test_api.py,
  tests/test_tuning.py) and those that load such a file share their
  programs on a worker (`tiers.FAMILIES`).
- `large_projection_model()`: a GRU whose output projection has
  `network.UNFUSED_PROJECTION_ELEMENTS` weights, which the xla path keeps
  out of XLA's output fusion at batch 1 (tests/test_generator.py,
  tests/test_saved_model.py).

Each is made once per process (lru_cache), so test files on one worker
share its traces and compiles.
"""

import functools

from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr

import rnnstep
from rnnstep.model import model_file
from rnnstep.model import network

STACKS = {
    "gru_reset_after": [kr.layer("gru", 48, True)],
    "gru_reset_before": [kr.layer("gru", 48, False)],
    "lstm": [kr.layer("lstm", 40)],
    "simple_rnn": [kr.layer("simple_rnn", 40)],
    "gru_x2": [kr.layer("gru", 32), kr.layer("gru", 24)],
    "lstm_then_gru": [kr.layer("lstm", 32), kr.layer("gru", 24, False)],
}


@functools.lru_cache(maxsize=None)
def stack_models(name):
  """(Keras model, rnnstep model) of STACKS[name]."""
  layers = STACKS[name]
  keras_model = kr.build(layers, vocab_size=65, embedding_dim=16, seed=7,
                         bias_scale=1.0)
  return keras_model, kr.rnnstep_model(keras_model, layers)


TINY_LAYERS = [kr.layer("gru", 32)]  # As cli.write_model's (V=65, D=16).

SAMPLING_LAYERS = [kr.layer("gru", 24)]


@functools.lru_cache(maxsize=None)
def sampling_model():
  """(rnnstep model, numpy reference) over "[UNK]" + "abcdefghij ,.;:!?-'\\n"."""
  keras_model = kr.build(SAMPLING_LAYERS, vocab_size=21, embedding_dim=8,
                         seed=2, bias_scale=1.5)
  vocab = ["[UNK]"] + list("abcdefghij ,.;:!?-'\n")
  model = rnnstep.Model(model_file.ModelConfig(8, tuple(SAMPLING_LAYERS)),
                        vocab, kr.weights_of(keras_model, SAMPLING_LAYERS))
  return model, nr.Reference(kr.weights_of(keras_model, SAMPLING_LAYERS),
                             SAMPLING_LAYERS, banned=[0])


LARGE_PROJECTION_LAYERS = [kr.layer("gru", 16)]


@functools.lru_cache(maxsize=None)
def large_projection_model():
  """(Keras model, rnnstep model): 16 units over as many characters as make
  a 16 x V projection of `network.UNFUSED_PROJECTION_ELEMENTS` weights."""
  layers = LARGE_PROJECTION_LAYERS
  keras_model = kr.build(
      layers, vocab_size=network.UNFUSED_PROJECTION_ELEMENTS // 16,
      embedding_dim=8, seed=5)
  return keras_model, kr.rnnstep_model(keras_model, layers)
