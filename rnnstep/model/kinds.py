"""The recurrent cell kinds rnnstep runs, described once.

Every fact about a kind that more than one module needs lives in `KINDS`:
the model file (`model_file`: gate count, bias shape, the config's `kind`),
the cells (`cells`: state tensors, which class computes it), and the
converter (`convert`: the Keras class names it maps, the PyTorch module and how
its weights map). A new kind is a new row here plus its cell class in
`cells.py`, or in a module of its own as RWKV-7's `rwkv7.py` (and, to
import it, any reader-specific handling).

This module imports nothing heavy (no TensorFlow), so the converter's forked
readers and `model_file` can use it.
"""

import dataclasses
from typing import Dict, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Kind:
  """One recurrent cell kind.

  Attributes:
    name: the model file's `kind` ('gru', 'lstm', 'simple_rnn').
    display: how messages name it ('GRU').
    gates: gate blocks G: the kernel is [D, G*U], the recurrent kernel [U, G*U].
    gate_order: the Keras column blocks, e.g. ('z', 'r', 'h').
    state_tensors: [B, U] tensors in its state: 1 (h) or 2 (h, c).
    has_reset_after: whether the `reset_after` variant flag applies (GRU).
    keras_classes: Keras layer class names that are this kind.
    cell_class: the class that computes it, in `cells.py` (RWKV-7's in
      `rwkv7.py`; `network.cell_class` finds it).
    torch_module: the PyTorch module class (`torch.nn.<name>`), or None.
    torch_gate_order: PyTorch's row blocks of `weight_ih_l{k}` / `weight_hh_l{k}`.
    torch_bias: how PyTorch's `bias_ih` and `bias_hh` become the Keras bias:
      'rows' stacks them as [2, G*U] (GRU reset_after: the recurrent bias of
      the candidate sits inside r * (...)); 'sum' adds them (they are plain
      additions in these equations).
    tensor_names: the layer's tensors (`tensor_shapes` gives their shapes):
      the model file's keys `layer{i}_{name}` and the cell's constructor
      arguments. `model_file`, `Model` and `network.make_cell` read them; a kind
      with other tensors declares them here (and its readers in `convert/`
      map them).
    reduced_tensors: the large matrices among `tensor_names`, which a
      weights dtype stores in fewer bits (`reduced_weights`); the rest
      (biases, norms, RWKV-7's LoRAs and vectors) stay float32.
    held_transposed: those of `reduced_tensors` a `Model` holds as
      `[..., out, in]`, the file's `[..., in, out]` transposed once at load
      (`Model.tensors` gives the file's back), and its cell multiplies with
      `cells.matmul(..., transposed=True)`: at batch 1 XLA's CPU
      matrix-vector product reads a 768-wide square matrix in that layout
      ~10% faster, and the 0.1B RWKV-7 decodes 1.12-1.20x as fast on the
      XLA path (benchmarks/results/rwkv7-layout-epyc-zen5-2026-12.md). An
      int8 model's kernels keep their own layout.
    activation: the candidate's (and an LSTM's output's) activation, Keras's
      `activation` (PyTorch's `nonlinearity`): one of `cells.ACTIVATIONS`.
    variant_of: for a kind that differs from another only in `activation`
      (stored alike, told apart by a config or a module's attribute), that
      kind's name; the lookups by class, gates and shapes give the plain
      kind, `with_activation` the variant.
  """
  name: str
  display: str
  gates: int
  gate_order: Tuple[str, ...]
  state_tensors: int
  has_reset_after: bool
  keras_classes: Tuple[str, ...]
  cell_class: str
  torch_module: Optional[str]
  torch_gate_order: Tuple[str, ...]
  torch_bias: str

  # The layer's tensors, in the model file's order (`layer{i}_{name}`), and
  # the keyword names of its cell class's constructor.
  tensor_names: Tuple[str, ...] = ("kernel", "recurrent_kernel", "bias")
  reduced_tensors: Tuple[str, ...] = ("kernel", "recurrent_kernel")
  held_transposed: Tuple[str, ...] = ()
  activation: str = "tanh"
  variant_of: Optional[str] = None
  # The sizes besides `units` a layer of this kind records in its config
  # (`LayerConfig.sizes`), each a positive int; none for the gated kinds.
  size_names: Tuple[str, ...] = ()

  def tensor_shapes(self, inputs: int, units: int, reset_after: bool = True,
                    sizes: Optional[Dict[str, int]] = None
                    ) -> Dict[str, Tuple[int, ...]]:
    """Each of the layer's tensors' shape, by name (`tensor_names` order).

    Args:
      inputs: D, the width of the layer's input.
      units: U.
      reset_after: the GRU variant flag.
      sizes: the kind's `size_names`, by name.
    """
    if self.name == "rwkv7":
      return rwkv7_shapes(units, sizes)
    width = self.gates * units
    return {"kernel": (inputs, width), "recurrent_kernel": (units, width),
            "bias": self.bias_shape(units, reset_after)}

  def state_sizes(self, units: int,
                  sizes: Optional[Dict[str, int]] = None) -> Tuple[int, ...]:
    """The widths of the `[B, width]` tensors of a layer's state."""
    if self.name == "rwkv7":
      return rwkv7_state_sizes(units, sizes)
    return (units,) * self.state_tensors

  def state_names(self, sizes: Optional[Dict[str, int]] = None
                  ) -> Tuple[str, ...]:
    """The names of the state's tensors (`hidden_states`, `initial_state`)."""
    if self.name == "rwkv7":
      return ("h",) + tuple(f"{name}{i}" for i in range(sizes["blocks"])
                            for name in RWKV7_BLOCK_STATE)
    return ("h", "c")[:self.state_tensors]

  def bias_shape(self, units: int, reset_after: bool = True) -> Tuple[int, ...]:
    """The Keras bias shape: [2, G*U] for GRU reset_after, else [G*U]."""
    width = self.gates * units
    if self.has_reset_after and reset_after:
      return (2, width)
    return (width,)

  def torch_permutation(self) -> Tuple[int, ...]:
    """For each Keras gate block, the PyTorch block that holds it."""
    return tuple(_TORCH_EQUIVALENT[self.variant_of or self.name].index(gate)
                 for gate in self.gate_order)


# RWKV-7's layer: its sizes, its tensors (L blocks of width C = H * N), and
# what each block keeps in the state. `kernel` is the input LayerNorm
# (block 0's ln0) as [gamma; beta]: like any layer 0 kernel it is folded
# into the input table (`Model.input_table`).
RWKV7_SIZES = ("blocks", "head_size", "ffn", "decay_lora", "a_lora",
               "v_lora", "gate_lora")
RWKV7_TENSORS = ("kernel", "ln", "mix", "vectors", "ln_x", "w1", "w2", "a1",
                 "a2", "v1", "v2", "g1", "g2", "receptance", "key", "value",
                 "output", "ffn_key", "ffn_value", "output_norm")
# The large matrices (`Kind.reduced_tensors`): R, K, V, O and the
# feed-forward's two; `kernel` here is the input LayerNorm, not a matrix.
RWKV7_REDUCED = ("receptance", "key", "value", "output", "ffn_key",
                 "ffn_value")
# Per block: the time mix's and the channel mix's previous normalized
# input (the token shifts) and the WKV matrix per head, flattened.
RWKV7_BLOCK_STATE = ("att_x", "wkv", "ffn_x")
# Rows of `mix` (the token-shift mixes) and of `vectors`, in order.
RWKV7_MIX = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "ffn_x_k")
RWKV7_VECTORS = ("w0", "a0", "v0", "k_k", "k_a", "r_k")


def rwkv7_shapes(units: int, sizes: Dict[str, int]
                 ) -> Dict[str, Tuple[int, ...]]:
  """The shapes of an RWKV-7 layer's tensors (`RWKV7_TENSORS`): per block
  stacked on a leading axis of `blocks`, matrices as `x @ W` ([in, out])."""
  c, n = units, sizes["blocks"]
  lora = {"w": sizes["decay_lora"], "a": sizes["a_lora"],
          "v": sizes["v_lora"], "g": sizes["gate_lora"]}
  shapes = {"kernel": (2, c), "ln": (n, 4, c), "mix": (n, len(RWKV7_MIX), c),
            "vectors": (n, len(RWKV7_VECTORS), c), "ln_x": (n, 2, c)}
  for name, rank in lora.items():
    shapes[f"{name}1"] = (n, c, rank)
    shapes[f"{name}2"] = (n, rank, c)
  for name in ("receptance", "key", "value", "output"):
    shapes[name] = (n, c, c)
  shapes.update(ffn_key=(n, c, sizes["ffn"]), ffn_value=(n, sizes["ffn"], c),
                output_norm=(2, c))
  return {name: shapes[name] for name in RWKV7_TENSORS}


def rwkv7_state_sizes(units: int, sizes: Dict[str, int]) -> Tuple[int, ...]:
  """h (the stack's normalized output), then per block `RWKV7_BLOCK_STATE`:
  [B, C], [B, H * N * N] (H heads of N), [B, C]."""
  return (units,) + (units, units * sizes["head_size"], units) * sizes[
      "blocks"]


KINDS: Dict[str, Kind] = {
    "gru": Kind(name="gru", display="GRU", gates=3, gate_order=("z", "r", "h"),
                state_tensors=1, has_reset_after=True, keras_classes=("GRU",),
                cell_class="GRUCell", torch_module="GRU",
                torch_gate_order=("r", "z", "n"), torch_bias="rows"),
    "lstm": Kind(name="lstm", display="LSTM", gates=4,
                 gate_order=("i", "f", "c", "o"), state_tensors=2,
                 has_reset_after=False, keras_classes=("LSTM",),
                 cell_class="LSTMCell", torch_module="LSTM",
                 torch_gate_order=("i", "f", "g", "o"), torch_bias="sum"),
    "simple_rnn": Kind(name="simple_rnn", display="SimpleRNN", gates=1,
                       gate_order=("h",), state_tensors=1,
                       has_reset_after=False, keras_classes=("SimpleRNN",),
                       cell_class="SimpleRNNCell", torch_module="RNN",
                       torch_gate_order=("h",), torch_bias="sum"),
    # Keras SimpleRNN(activation="relu"); PyTorch nn.RNN(nonlinearity="relu")
    # (word_language_model's RNN_RELU).
    "simple_rnn_relu": Kind(name="simple_rnn_relu", display="SimpleRNN(relu)",
                            gates=1, gate_order=("h",), state_tensors=1,
                            has_reset_after=False,
                            keras_classes=("SimpleRNN",),
                            cell_class="SimpleRNNCell", torch_module="RNN",
                            torch_gate_order=("h",), torch_bias="sum",
                            activation="relu", variant_of="simple_rnn"),
    # RWKV-7 "Goose" (docs/dev/cell-kinds.md): a whole stack of blocks as
    # one layer, since each block reads layer 0's value (v_first) in the
    # same token; KerasHub's RWKV7Backbone and the official RWKV-LM `.pth`.
    "rwkv7": Kind(name="rwkv7", display="RWKV-7", gates=0, gate_order=(),
                  state_tensors=0, has_reset_after=False, keras_classes=(),
                  cell_class="RWKV7Cell", torch_module=None,
                  torch_gate_order=(), torch_bias="sum",
                  tensor_names=RWKV7_TENSORS, size_names=RWKV7_SIZES,
                  reduced_tensors=RWKV7_REDUCED,
                  held_transposed=RWKV7_REDUCED),
}

# PyTorch's gate names spelled as Keras's: GRU n is Keras h, LSTM g is Keras c.
_TORCH_EQUIVALENT = {"gru": ("r", "z", "h"), "lstm": ("i", "f", "c", "o"),
                     "simple_rnn": ("h",)}

# Derived lookups, of the plain kinds (an activation variant is found from
# its plain kind by `with_activation`).
PLAIN = tuple(kind for kind in KINDS.values()
              if kind.variant_of is None and kind.gates)
BY_KERAS_CLASS = {cls: kind.name for kind in PLAIN for cls in kind.keras_classes}
BY_GATES = {kind.gates: kind.name for kind in PLAIN}
BY_TORCH_GATES = {kind.gates: kind.name for kind in PLAIN if kind.torch_module}


def with_activation(name: str, activation: str) -> Kind:
  """The kind that is `name`'s (or its plain kind's) with `activation`.

  Raises:
    ValueError: no such kind; the message lists the activations there are.
  """
  plain = get(name).variant_of or name
  family = [k for k in KINDS.values() if (k.variant_of or k.name) == plain]
  for kind in family:
    if kind.activation == activation:
      return kind
  raise ValueError(f"{KINDS[plain].display} with activation {activation!r} "
                   f"is not a kind rnnstep runs (it runs "
                   f"{', '.join(repr(k.activation) for k in family)})")


def get(name: str) -> Kind:
  """The Kind called `name`.

  Raises:
    ValueError: no such kind.
  """
  try:
    return KINDS[name]
  except (KeyError, TypeError):
    raise ValueError(f"unknown recurrent layer kind {name!r}; known kinds: "
                     f"{sorted(KINDS)}") from None
