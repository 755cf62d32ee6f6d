"""What a reader found in a weights file: layers of stored variables, not read yet.

The readers (`keras_v3`, `keras_v2_h5`, `tf_checkpoint`, `pytorch`) turn a file
into `Contents`: the weight `Group`s it stores (one per layer, tensors in
creation order, not yet read), plus -- where the file has a model config, or
the reader has worked out the chain itself -- the chain of layers it describes
(`LayerSpec`s). `mapping.map_model` then matches the two. This module also
holds the naming helpers the readers share, and `Summary`: what
`convert.describe` found or `convert.convert` wrote.
"""

import dataclasses
import json
import re
from typing import Callable, List, Optional, Tuple

import numpy as np

from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show
from rnnstep.model import kinds
from rnnstep.model import model_file

# How messages name each layer kind.
KIND_NAMES = {**{name: kind.display for name, kind in kinds.KINDS.items()},
              "embedding": "Embedding", "dense": "Dense"}

# How a one-hot model's implied identity Embedding is named and explained.
ONE_HOT_NAME = "(one-hot input)"
ONE_HOT_NOTE = ("no Embedding: the first recurrent layer is fed one-hot "
                "vectors of {0}; written as an identity Embedding({0}, {0}) "
                "(exact: x_onehot @ kernel == kernel[id])")


# ---------------------------------------------------------------- file contents


@dataclasses.dataclass
class Tensor:
  """One stored variable, not read yet.

  Attributes:
    path: where the file keeps it (for messages).
    shape: the declared shape.
    role: 'embeddings', 'kernel', 'recurrent_kernel' or 'bias' when the file
      names the variable, else None (Keras 3 stores `vars/0, 1, ...`).
    reader: returns the array (guarded by the reader that made it).
  """
  path: str
  shape: Tuple[int, ...]
  role: Optional[str]
  reader: Callable[[], np.ndarray]

  def read(self, label) -> np.ndarray:
    array = np.asarray(self.reader())
    if tuple(array.shape) != tuple(self.shape):
      raise safe_io.fail(label, f"{show(self.path)} read with shape "
                         f"{array.shape}, declared {self.shape}")
    if array.dtype.kind != "f":
      raise safe_io.fail(label, f"{show(self.path)} has dtype {array.dtype}, "
                         "expected float weights")
    return array.astype(np.float32)


@dataclasses.dataclass
class Group:
  """The variables of one layer, in creation order.

  Attributes:
    name: the layer's place in the file ('layers/gru_1', 'gru',
      'layer_with_weights-1', ...).
    tensors: its variables.
    hint: the layer kind suggested by names ('embedding', 'gru', ...), if any.
    order: (scheme, index) when the file records the layer's position; two
      groups' indices are comparable only within one scheme.
    cell: whether the variables sat under a recurrent `cell`.
  """
  name: str
  tensors: List[Tensor]
  hint: Optional[str] = None
  order: Optional[Tuple[str, int]] = None
  cell: bool = False

  def describe(self) -> str:
    shapes = ", ".join(str(tuple(t.shape)) for t in self.tensors)
    return f"{show(self.name)} [{shapes}]"


@dataclasses.dataclass
class LayerSpec:
  """Allow-listed facts about one layer of a config's chain."""
  kind: str                  # 'embedding', a `kinds.KINDS` name, 'dense'
  name: str                  # the layer name (the group key in HDF5 files)
  path: str                  # its Keras 3 weights path: layers/<snake>[_N]
  units: int                 # Embedding: output_dim; others: units
  input_dim: Optional[int] = None   # Embedding only
  use_bias: bool = True
  reset_after: Optional[bool] = None  # GRU only; None if the config omits it
  # Embedding only: the model has none and feeds one-hot vectors [T, V] to its
  # first recurrent layer; `x_onehot @ K == K[id]`, so it is exactly an
  # identity Embedding(V, V) that no file stores.
  one_hot: bool = False
  # Recurrent only: wrapped in Keras Bidirectional (merge_mode "concat").
  bidirectional: bool = False
  # Dense only: its activation (a head layer's; the output's is linear or
  # softmax).
  activation: str = "linear"


@dataclasses.dataclass
class ConfigChain:
  """What a model config says: the class and, if usable, the layer chain."""
  model_class: str
  specs: Optional[List[LayerSpec]]  # None: a subclassed model (no usable config)
  notes: List[str]
  # The fixed timesteps T of a model built for windows (its Input fixes T and
  # its last recurrent layer has return_sequences=False), else None.
  window: Optional[int] = None
  # A Keras TextVectorization layer in front of the Embedding (string
  # inputs): its path and the settings `keras_config.text_vectorization`
  # read, its vocabulary (None: stored in the archive's assets); else None.
  text_vectorization: Optional[dict] = None


@dataclasses.dataclass
class Contents:
  """What a reader found in a file."""
  label: str                       # the file, as messages name it
  format: str                      # human-readable format description
  groups: List[Group]
  chain: Optional[ConfigChain] = None
  key: str = "path"                # which LayerSpec field names a group
  notes: List[str] = dataclasses.field(default_factory=list)
  # The vocabulary the file holds itself (a TextVectorization layer's), a
  # `vocabulary.Tokens`; None: the file holds none.
  tokens: Optional[object] = None
  closers: List[Callable[[], None]] = dataclasses.field(default_factory=list)
  # The vocabulary the file itself holds (characters in id order), where it
  # holds one (char-rnn-tensorflow's chars_vocab.pkl), else None.
  vocab: Optional[List[str]] = None
  # textgenrnn's AttentionWeightedAverage W [channels, 1] (`textgenrnn`),
  # else None.
  attention: Optional[Tensor] = None

  def close(self):
    """Releases the open file(s); the tensors cannot be read afterwards."""
    while self.closers:
      self.closers.pop()()


# -------------------------------------------------------------------- summaries


@dataclasses.dataclass
class LayerSummary:
  """One layer as found in the file.

  Attributes:
    kind: 'embedding', 'gru', 'lstm', 'simple_rnn' or 'dense'.
    name: where the file keeps it ('layers/gru', 'gru_1', 'layer_with_weights-1').
    shapes: the stored variables' shapes, in creation order.
    detail: e.g. 'units=1024, reset_after=True'.
  """
  kind: str
  name: str
  shapes: List[Tuple[int, ...]]
  detail: str

  def __str__(self):
    shapes = ", ".join(str(s) for s in self.shapes)
    return (f"{KIND_NAMES[self.kind]:<10} {show(self.name)}: "
            f"{self.detail}; stored {shapes}")


@dataclasses.dataclass
class Summary:
  """What `describe` found, or what `convert` wrote.

  Attributes:
    input_path: the file or directory given.
    format: the format found, e.g. 'Keras 3.15.1 .keras archive (Sequential)'.
    layers: Embedding, recurrent layer(s), Dense, in order.
    config: the rnnstep ModelConfig.
    vocab_size: the embedding's rows (and the Dense's outputs).
    embedding_dim: the embedding width.
    num_parameters: the model's parameter count.
    notes: things worth knowing (ignored layers, assumptions, [UNK]).
    vocab: the vocabulary written (None for `describe`).
    output_path: the model file written (None for `describe`).
    tokens: the vocabulary's kind and rules where it is not characters.
    weights_dtype: what the file written stores its large matrices in
      (`reduced_weights`).
  """
  input_path: str
  format: str
  layers: List[LayerSummary]
  config: model_file.ModelConfig
  vocab_size: int
  embedding_dim: int
  num_parameters: int
  notes: List[str]
  vocab: Optional[List[str]] = None
  output_path: Optional[str] = None
  tokens: Optional[object] = None
  weights_dtype: str = "float32"

  @property
  def has_unk(self) -> Optional[bool]:
    if self.vocab is None:
      return None
    return self.vocab[0] == model_file.UNK_TOKEN

  def __str__(self):
    lines = [f"input:      {self.input_path}", f"format:     {self.format}",
             "layers:"]
    lines += [f"  {layer}" for layer in self.layers]
    if self.tokens is not None:  # Its ids are words, bytes or pieces.
      lines.append(f"vocab size: {self.vocab_size} (embedding rows, one a "
                   "token)")
    else:
      lines.append(f"vocab size: {self.vocab_size} (embedding rows; a corpus "
                   f"with {self.vocab_size} distinct characters, or "
                   f"{self.vocab_size - 1} plus [UNK] at id 0)")
    lines.append(f"parameters: {self.num_parameters:,}")
    if self.vocab is not None and self.tokens is not None:
      shown = " ".join(self.vocab)  # Words: shown apart.
      lines.append(f"vocab:      {len(self.vocab)} {self.tokens.kind}: "
                   f"{json.dumps(shown[:80], ensure_ascii=False)}")
    elif self.vocab is not None:
      shown = "".join(self.vocab[1:] if self.has_unk else self.vocab)
      lines.append(f"vocab:      {len(self.vocab)} entries"
                   f"{' ([UNK] at id 0)' if self.has_unk else ''}: "
                   f"{json.dumps(shown[:80], ensure_ascii=False)}")
    if self.output_path is not None:
      lines.append(f"output:     {self.output_path}")
      if self.weights_dtype != "float32":
        lines.append(f"weights:    {self.weights_dtype} (the large "
                     "matrices; the rest float32)")
    if self.notes:
      lines.append("notes:")
      lines += [f"  - {note}" for note in self.notes]
    return "\n".join(lines)


# ------------------------------------------------------------- names and roles


_ROLE_NAMES = {"embeddings": "embeddings", "kernel": "kernel",
               "recurrent_kernel": "recurrent_kernel", "bias": "bias"}


def role_from_name(name: str) -> str:
  """'gru/gru_cell/kernel:0' -> 'kernel'; '_embeddings' -> 'embeddings'.

  Unknown names come back as they are (and are refused when matched).
  """
  leaf = name.rsplit("/", 1)[-1]
  leaf = re.sub(r":\d+$", "", leaf)
  return _ROLE_NAMES.get(leaf.lstrip("_"), leaf)


def hint_from_name(name: str) -> Optional[str]:
  """The layer kind a Keras auto-generated name suggests, if any."""
  parts = [re.sub(r"_\d+$", "", re.sub(r":\d+$", "", part))
           for part in name.lower().split("/")]
  for base in parts:
    if base in ("forward_layer", "backward_layer", "bidirectional") or (
        base.startswith(("forward_", "backward_"))):
      return "bidirectional"
  for base in reversed(parts):
    for kind, names in _HINT_NAMES:
      if base in names:
        return kind
  return None


def snake_case(name: str) -> str:
  """Keras 3's `naming.to_snake_case`: 'SimpleRNN' -> 'simple_rnn'."""
  name = re.sub(r"\W+", "", name)
  name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
  return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


# Keras's default layer names per kind: 'gru', 'gru_cell', 'simple_rnn', ...
_HINT_NAMES = tuple(
    (kind.name, tuple(name for cls in kind.keras_classes
                      for name in (snake_case(cls), f"{snake_case(cls)}_cell")))
    for kind in kinds.PLAIN) + (("embedding", ("embedding",)),
                                         ("dense", ("dense",)))
