"""The kind table: its derived facts, and that every reader of it agrees."""

import pytest

from rnnstep.model import cells
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import network


def test_pytorch_gate_permutations_are_the_documented_ones():
  # docs/dev/cell-kinds.md, gate orders: GRU [r|z|n] -> [z|r|h].
  assert kinds.KINDS["gru"].torch_permutation() == (1, 0, 2)
  assert kinds.KINDS["lstm"].torch_permutation() == (0, 1, 2, 3)
  assert kinds.KINDS["simple_rnn"].torch_permutation() == (0,)


def test_bias_shapes():
  assert kinds.KINDS["gru"].bias_shape(5) == (2, 15)
  assert kinds.KINDS["gru"].bias_shape(5, reset_after=False) == (15,)
  assert kinds.KINDS["lstm"].bias_shape(5, reset_after=True) == (20,)
  assert model_file.LayerConfig("simple_rnn", 5).bias_shape() == (5,)


def test_lookups_are_unambiguous_and_every_kind_has_a_cell():
  assert len(kinds.BY_GATES) == len(kinds.PLAIN)
  assert kinds.BY_KERAS_CLASS == {"GRU": "gru", "LSTM": "lstm",
                                  "SimpleRNN": "simple_rnn"}
  # An activation variant is found from its plain kind, and back.
  assert kinds.with_activation("simple_rnn", "relu").name == "simple_rnn_relu"
  assert kinds.with_activation("simple_rnn_relu", "tanh").name == "simple_rnn"
  with pytest.raises(ValueError, match=r"GRU with activation 'relu' is not a "
                     r"kind rnnstep runs \(it runs 'tanh'\)"):
    kinds.with_activation("gru", "relu")
  assert kinds.KINDS["simple_rnn_relu"].torch_permutation() == (0,)
  for kind in kinds.KINDS.values():
    assert issubclass(network.cell_class(kind), cells.Cell)
    assert kind.activation in cells.ACTIVATIONS
    if not kind.size_names:  # RWKV-7's state: tests/test_rwkv7.py.
      layer = model_file.LayerConfig(kind.name, 7)
      assert cells.state_sizes(layer) == (7,) * kind.state_tensors
    assert model_file.GATES[kind.name] == kind.gates


def test_unknown_kind():
  with pytest.raises(ValueError, match="unknown recurrent layer kind 'gru2'"):
    kinds.get("gru2")
