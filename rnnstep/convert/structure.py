"""Finds Embedding -> recurrent layer(s) -> Dense in what a weights file holds.

The readers (`keras_v3`, `keras_v2_h5`, `tf_checkpoint`) turn a file into
`Contents`: the weight `Group`s it stores (one per layer, tensors in creation
order, not yet read), plus -- where the file has a model config -- the chain of
layers the config describes (`LayerSpec`s, read as data through an allow-list,
never deserialized). `map_model` then matches the two:

  - with a config, the config fixes the order and the layer kinds, and every
    stored shape is checked against it;
  - without one (subclassed models, weights-only files, TF checkpoints), the
    kinds come from variable names and shapes (a recurrent kernel [U, G*U] gives
    G = 3 GRU, 4 LSTM, 1 SimpleRNN; a GRU bias [2, 3U] means reset_after), and
    the order is the one chain that fits the shapes: embedding width -> kernel
    rows, units -> next kernel rows, last units -> Dense rows, Dense columns =
    vocabulary rows. Any order the file itself records (Keras layer indices)
    must be respected; if more than one chain still fits, the file is refused.

Anything else -- Bidirectional or wrapped layers, layers in between, activations
other than tanh/sigmoid, go_backwards, masking, custom or Lambda layers -- is
refused with a message saying what was found.

This module also holds the vocabulary rules (`vocab_from_corpus`,
`resolve_vocab`).
"""

import dataclasses
import itertools
import json
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from rnnstep import model_file
from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show

UNK_TOKEN = model_file.UNK_TOKEN

RECURRENT_CLASSES = {"GRU": "gru", "LSTM": "lstm", "SimpleRNN": "simple_rnn"}
KIND_NAMES = {"gru": "GRU", "lstm": "LSTM", "simple_rnn": "SimpleRNN",
              "embedding": "Embedding", "dense": "Dense"}
KIND_BY_GATES = {3: "gru", 4: "lstm", 1: "simple_rnn"}
# Layers that hold no weights and are the identity at inference.
IDENTITY_CLASSES = ("Dropout",)
MODEL_CLASSES = ("Sequential", "Functional", "Model")
MAX_ORDER_SEARCH = 200_000


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
  kind: str                  # 'embedding', 'gru', 'lstm', 'simple_rnn', 'dense'
  name: str                  # the layer name (the group key in HDF5 files)
  path: str                  # its Keras 3 weights path: layers/<snake>[_N]
  units: int                 # Embedding: output_dim; others: units
  input_dim: Optional[int] = None   # Embedding only
  use_bias: bool = True
  reset_after: Optional[bool] = None  # GRU only; None if the config omits it


@dataclasses.dataclass
class ConfigChain:
  """What a model config says: the class and, if usable, the layer chain."""
  model_class: str
  specs: Optional[List[LayerSpec]]  # None: a subclassed model (no usable config)
  notes: List[str]


@dataclasses.dataclass
class Contents:
  """What a reader found in a file."""
  label: str                       # the file, as messages name it
  format: str                      # human-readable format description
  groups: List[Group]
  chain: Optional[ConfigChain] = None
  key: str = "path"                # which LayerSpec field names a group
  notes: List[str] = dataclasses.field(default_factory=list)
  closers: List[Callable[[], None]] = dataclasses.field(default_factory=list)

  def close(self):
    """Releases the open file(s); the tensors cannot be read afterwards."""
    while self.closers:
      self.closers.pop()()


# --------------------------------------------------------------- mapped model


@dataclasses.dataclass
class MappedLayer:
  kind: str
  name: str
  tensors: Dict[str, Tensor]
  layer: Optional[model_file.LayerConfig] = None  # recurrent layers only

  @property
  def shapes(self) -> List[Tuple[int, ...]]:
    return [tuple(t.shape) for t in self.tensors.values()]


@dataclasses.dataclass
class MappedModel:
  """Embedding -> recurrent layers -> Dense, matched to stored tensors."""
  contents: Contents
  embedding: MappedLayer
  recurrent: List[MappedLayer]
  dense: MappedLayer
  notes: List[str]

  @property
  def vocab_size(self) -> int:
    return int(self.embedding.tensors["embeddings"].shape[0])

  @property
  def config(self) -> model_file.ModelConfig:
    return model_file.ModelConfig(
        embedding_dim=int(self.embedding.tensors["embeddings"].shape[1]),
        layers=tuple(layer.layer for layer in self.recurrent))

  @property
  def layers(self) -> List[MappedLayer]:
    return [self.embedding, *self.recurrent, self.dense]

  def read_tensors(self) -> Dict[str, np.ndarray]:
    """Reads every tensor (guarded) into the model file's keys and layouts.

    A layer without bias gets zeros of the shape Keras would have used.
    """
    label = self.contents.label
    vocab_size = self.vocab_size
    out = {"embedding": self.embedding.tensors["embeddings"].read(label)}
    for i, mapped in enumerate(self.recurrent):
      out[f"layer{i}_kernel"] = mapped.tensors["kernel"].read(label)
      out[f"layer{i}_recurrent_kernel"] = (
          mapped.tensors["recurrent_kernel"].read(label))
      bias = mapped.tensors.get("bias")
      out[f"layer{i}_bias"] = (bias.read(label) if bias is not None else
                               np.zeros(mapped.layer.bias_shape(), np.float32))
    out["dense_kernel"] = self.dense.tensors["kernel"].read(label)
    bias = self.dense.tensors.get("bias")
    out["dense_bias"] = (bias.read(label) if bias is not None
                         else np.zeros((vocab_size,), np.float32))
    return out


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
    for kind, names in (("gru", ("gru", "gru_cell")),
                        ("lstm", ("lstm", "lstm_cell")),
                        ("simple_rnn", ("simple_rnn", "simple_rnn_cell")),
                        ("embedding", ("embedding",)), ("dense", ("dense",))):
      if base in names:
        return kind
  return None


def snake_case(name: str) -> str:
  """Keras 3's `naming.to_snake_case`: 'SimpleRNN' -> 'simple_rnn'."""
  name = re.sub(r"\W+", "", name)
  name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
  return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


# --------------------------------------------------------------- model configs


def parse_json(text, label, what: str):
  """Decodes JSON as plain data (dicts, lists, strings, numbers)."""
  if isinstance(text, (bytes, bytearray)):
    try:
      text = bytes(text).decode("utf-8")
    except UnicodeDecodeError:
      raise safe_io.fail(label, f"{what} is not UTF-8 text") from None
  try:
    return json.loads(text)
  except (json.JSONDecodeError, RecursionError) as e:
    raise safe_io.fail(label, f"{what} is not valid JSON ({e})") from None


def parse_model_config(data, label, what: str = "the model config") -> ConfigChain:
  """Reads a Keras 2 or Keras 3 model config as data, through an allow-list.

  Args:
    data: the decoded JSON of `config.json` or the `model_config` attribute.
    label: the file, for messages.
    what: how messages name the config.

  Returns:
    A ConfigChain; `specs` is None for a subclassed model (its config says
    nothing usable about its layers).

  Raises:
    ValueError: the config describes a model rnnstep cannot run exactly.
  """
  if not isinstance(data, dict):
    raise safe_io.fail(label, f"{what} is not a JSON object")
  class_name = data.get("class_name")
  if not isinstance(class_name, str):
    raise safe_io.fail(label, f"{what} has no class_name")
  config = data.get("config")
  if class_name not in MODEL_CLASSES:
    return ConfigChain(class_name, None, [
        f"subclassed model {show(class_name)}: its config lists no layers, so "
        "the layers were inferred from the stored weights' names and shapes "
        "(its call() is assumed to be Embedding -> recurrent -> Dense)"])
  _check_builtin(data, label, what)
  if not isinstance(config, dict) or not isinstance(config.get("layers"), list):
    raise safe_io.fail(label, f"{what}: {class_name} config has no layer list")
  layers = config["layers"]
  if len(layers) > 4 * model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{what} lists {len(layers)} layers, too many")
  notes = []
  entries = [_layer_entry(entry, i, label) for i, entry in enumerate(layers)]
  if class_name == "Sequential":
    ordered = [e for e in entries if e["class_name"] != "InputLayer"]
    if len(ordered) + 1 < len(entries):
      raise safe_io.fail(label, f"{what}: Sequential model with more than one "
                         "InputLayer")
  else:
    ordered = _functional_chain(config, entries, label, what)
  counters: Dict[str, int] = {}
  paths = {}
  for entry in entries:  # Keras 3 numbers paths per class, over all layers.
    snake = snake_case(entry["class_name"])
    count = counters.get(snake, 0)
    counters[snake] = count + 1
    paths[id(entry)] = f"layers/{snake}" + (f"_{count}" if count else "")
  specs = []
  for entry in ordered:
    spec = _layer_spec(entry, paths[id(entry)], label, notes)
    if spec is not None:
      specs.append(spec)
  _check_chain(specs, label)
  return ConfigChain(class_name, specs, notes)


def _check_builtin(entry, label, what):
  """Refuses classes that a config marks as custom (user code)."""
  module = entry.get("module")
  registered = entry.get("registered_name")
  class_name = entry.get("class_name")
  if module is not None and (not isinstance(module, str) or not (
      module == "keras" or module.startswith(("keras.", "tf_keras.")))):
    raise safe_io.fail(label, f"{what}: {show(class_name)} comes from module "
                       f"{show(module)}, not Keras; refusing custom classes")
  if registered is not None and registered != class_name and not (
      class_name in MODEL_CLASSES and registered in MODEL_CLASSES):
    raise safe_io.fail(label, f"{what}: {show(class_name)} is registered as "
                       f"custom class {show(registered)}; refusing custom "
                       "classes")


def _layer_entry(entry, index, label) -> dict:
  if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
    raise safe_io.fail(label, f"model config layer {index} has no class_name")
  config = entry.get("config")
  if not isinstance(config, dict):
    raise safe_io.fail(label, f"model config layer {index} "
                       f"({show(entry['class_name'])}) has no config object")
  name = entry.get("name", config.get("name"))
  if not isinstance(name, str) or not name:
    raise safe_io.fail(label, f"model config layer {index} has no name")
  return {"class_name": entry["class_name"], "config": config, "name": name,
          "raw": entry}


def _layer_spec(entry, path, label, notes) -> Optional[LayerSpec]:
  """An allow-listed LayerSpec, None for an identity layer; refuses the rest."""
  cls = entry["class_name"]
  cfg = entry["config"]
  name = entry["name"]
  where = f"layer {show(name)} ({cls})"
  if cls == "Lambda":
    raise safe_io.fail(label, f"{where}: a Lambda layer holds arbitrary Python "
                       "code; rnnstep never runs code from a file and cannot "
                       "map it")
  if cls == "Bidirectional":
    raise safe_io.fail(label, f"{where}: bidirectional layers read the text "
                       "backwards too and cannot generate left to right; "
                       "rnnstep maps Embedding -> GRU/LSTM/SimpleRNN -> Dense")
  if cls in ("TimeDistributed", "RNN", "CuDNNGRU", "CuDNNLSTM", "ConvLSTM1D",
             "StackedRNNCells"):
    raise safe_io.fail(label, f"{where} cannot be mapped; rnnstep maps "
                       "Embedding -> GRU/LSTM/SimpleRNN -> Dense")
  if cls in IDENTITY_CLASSES:
    _check_builtin(entry["raw"], label, "the model config")
    notes.append(f"{cls} layer {show(name)} ignored (the identity at inference)")
    return None
  if cls != "Embedding" and cls != "Dense" and cls not in RECURRENT_CLASSES:
    raise safe_io.fail(label, f"{where} cannot be mapped: rnnstep maps "
                       "Embedding -> GRU/LSTM/SimpleRNN layers -> Dense only")
  _check_builtin(entry["raw"], label, "the model config")
  for key in ("lora_rank",):
    if cfg.get(key):
      raise safe_io.fail(label, f"{where} has {key}={cfg[key]!r}; LoRA layers "
                         "are not supported")
  if cfg.get("quantization_config") is not None or cfg.get("dtype") in (
      "int8", "int4", "float8"):
    raise safe_io.fail(label, f"{where} is quantized; not supported")
  _note_dtype(cfg, where, notes)
  if cls == "Embedding":
    if _get(cfg, "mask_zero", bool, False, label, where):
      raise safe_io.fail(label, f"{where} has mask_zero=True: id 0 would skip "
                         "timesteps, which rnnstep does not implement")
    return LayerSpec("embedding", name, path,
                     units=_get(cfg, "output_dim", int, None, label, where),
                     input_dim=_get(cfg, "input_dim", int, None, label, where))
  if cls == "Dense":
    activation = _get(cfg, "activation", str, "linear", label, where)
    if activation == "softmax":
      notes.append(f"{where}: softmax dropped; rnnstep works on the logits "
                   "(sampling probabilities are unchanged)")
    elif activation != "linear":
      raise safe_io.fail(label, f"{where} has activation {show(activation)}; the "
                         "output layer must be linear (logits) or softmax")
    return LayerSpec("dense", name, path,
                     units=_get(cfg, "units", int, None, label, where),
                     use_bias=_get(cfg, "use_bias", bool, True, label, where))
  kind = RECURRENT_CLASSES[cls]
  activation = _get(cfg, "activation", str, "tanh", label, where)
  if activation != "tanh":
    raise safe_io.fail(label, f"{where} has activation {show(activation)}; "
                       "rnnstep implements Keras's tanh only")
  if kind != "simple_rnn":
    recurrent_activation = _get(cfg, "recurrent_activation", str, "sigmoid",
                                label, where)
    if recurrent_activation == "hard_sigmoid":
      raise safe_io.fail(label, f"{where} has recurrent_activation "
                         "'hard_sigmoid' (old Keras default; Keras 2 and 3 "
                         "even compute it differently); rnnstep implements "
                         "sigmoid only")
    if recurrent_activation != "sigmoid":
      raise safe_io.fail(label, f"{where} has recurrent_activation "
                         f"{show(recurrent_activation)}; rnnstep implements "
                         "sigmoid only")
  for flag, why in (("go_backwards", "it reads the text backwards"),
                    ("time_major", "time-major inputs are not supported")):
    if _get(cfg, flag, bool, False, label, where):
      raise safe_io.fail(label, f"{where} has {flag}=True: {why}")
  if _get(cfg, "stateful", bool, False, label, where):
    notes.append(f"{where} is stateful; its saved state is not in the file, "
                 "rnnstep starts from zeros and carries the state itself")
  reset_after = None
  if kind == "gru":
    reset_after = _get(cfg, "reset_after", bool, None, label, where)
  return LayerSpec(kind, name, path,
                   units=_get(cfg, "units", int, None, label, where),
                   use_bias=_get(cfg, "use_bias", bool, True, label, where),
                   reset_after=reset_after)


def _note_dtype(cfg, where, notes):
  dtype = cfg.get("dtype")
  name = dtype
  if isinstance(dtype, dict):
    inner = dtype.get("config")
    name = inner.get("name") if isinstance(inner, dict) else None
  if isinstance(name, str) and name not in ("float32", "float64"):
    notes.append(f"{where} computed in {show(name)} under Keras; rnnstep "
                 "computes in float32 unless told otherwise")


_MISSING = object()


def _get(cfg, key, kind, default, label, where):
  value = cfg.get(key, _MISSING)
  if value is _MISSING or (value is None and default is not None):
    if default is None and kind is not bool:
      raise safe_io.fail(label, f"{where} has no {key} in its config")
    return default
  if kind is int:
    ok = isinstance(value, int) and not isinstance(value, bool) and (
        0 < value <= max(model_file.MAX_UNITS, model_file.MAX_VOCAB))
  elif kind is bool:
    ok = isinstance(value, bool) or (value is None and default is None)
  else:
    ok = isinstance(value, kind)
  if not ok:
    raise safe_io.fail(label, f"{where} has {key}={show(value)}, which rnnstep "
                       "cannot use")
  return value


def _functional_chain(config, entries, label, what) -> List[dict]:
  """Checks a Functional graph is one straight chain; returns it in order."""
  by_name = {}
  for entry in entries:
    if entry["name"] in by_name:
      raise safe_io.fail(label, f"{what} has two layers named "
                         f"{show(entry['name'])}")
    by_name[entry["name"]] = entry
  inputs = [e for e in entries if e["class_name"] == "InputLayer"]
  if len(inputs) != 1:
    raise safe_io.fail(label, f"{what}: a Functional model with {len(inputs)} "
                       "inputs; rnnstep maps a single input of ids")
  previous = inputs[0]["name"]
  chain = []
  for entry in entries:
    if entry is inputs[0]:
      continue
    sources = _inbound_sources(entry, label)
    if sources != [(previous, 0)]:
      found = ", ".join(f"{show(n)}[{i}]" for n, i in sources) or "nothing"
      raise safe_io.fail(label, f"{what}: layer {show(entry['name'])} takes "
                         f"{found}, not the output of {show(previous)}; only a "
                         "straight chain Embedding -> recurrent -> Dense can be "
                         "mapped")
    chain.append(entry)
    previous = entry["name"]
  outputs = _output_refs(config.get("output_layers"))
  if (previous, 0) not in outputs:
    raise safe_io.fail(label, f"{what}: the model's outputs do not include the "
                       f"last layer {show(previous)}")
  return chain


def _inbound_sources(entry, label) -> List[Tuple[str, int]]:
  """The (layer name, tensor index) pairs a Functional layer consumes."""
  nodes = entry["raw"].get("inbound_nodes")
  name = show(entry["name"])
  if not isinstance(nodes, list) or len(nodes) != 1:
    count = len(nodes) if isinstance(nodes, list) else 0
    raise safe_io.fail(label, f"layer {name} is called {count} times in the "
                       "model graph; only a straight chain can be mapped")
  node = nodes[0]
  refs = []
  if isinstance(node, dict):  # Keras 3: {"args": [...], "kwargs": {...}}
    _keras_history(node.get("args"), refs, 0)
    kwarg_refs = []
    _keras_history(node.get("kwargs"), kwarg_refs, 0)
    if kwarg_refs:
      raise safe_io.fail(label, f"layer {name} gets extra tensors (e.g. an "
                         "initial_state) from the graph; cannot be mapped")
  elif isinstance(node, list):  # Keras 2: [[name, node_index, tensor_index, kw]]
    for item in node:
      if (not isinstance(item, list) or len(item) < 3
          or not isinstance(item[0], str) or not isinstance(item[2], int)):
        raise safe_io.fail(label, f"layer {name} has unreadable inbound_nodes")
      if len(item) > 3 and item[3] and any(
          isinstance(v, (list, dict)) for v in item[3].values()
          if isinstance(item[3], dict)):
        raise safe_io.fail(label, f"layer {name} gets extra tensors (e.g. an "
                           "initial_state) from the graph; cannot be mapped")
      refs.append((item[0], item[2]))
  else:
    raise safe_io.fail(label, f"layer {name} has unreadable inbound_nodes")
  return refs


def _keras_history(value, refs, depth):
  if depth > 20:
    return
  if isinstance(value, dict):
    history = value.get("keras_history") if isinstance(
        value.get("keras_history"), list) else None
    if history is None and isinstance(value.get("config"), dict):
      history = value["config"].get("keras_history")
    if isinstance(history, list) and len(history) == 3 and isinstance(
        history[0], str) and isinstance(history[2], int):
      refs.append((history[0], history[2]))
      return
    for item in value.values():
      _keras_history(item, refs, depth + 1)
  elif isinstance(value, list):
    for item in value:
      _keras_history(item, refs, depth + 1)


def _output_refs(value) -> List[Tuple[str, int]]:
  if (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
      and isinstance(value[2], int)):
    return [(value[0], value[2])]
  if isinstance(value, list):
    return [ref for item in value for ref in _output_refs(item)]
  return []


def _check_chain(specs: List[LayerSpec], label):
  kinds = [s.kind for s in specs]
  described = " -> ".join(f"{KIND_NAMES[s.kind]} {show(s.name)}" for s in specs)
  if (len(specs) < 3 or kinds[0] != "embedding" or kinds[-1] != "dense"
      or any(k in ("embedding", "dense") for k in kinds[1:-1])):
    raise safe_io.fail(label, f"the model is {described or 'empty'}; rnnstep "
                       "maps Embedding -> GRU/LSTM/SimpleRNN layer(s) -> Dense")
  if len(specs) - 2 > model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{len(specs) - 2} recurrent layers, more than "
                       f"{model_file.MAX_LAYERS}")


# ----------------------------------------------------------------- mapping


def map_model(contents: Contents) -> MappedModel:
  """Matches stored groups to Embedding -> recurrent layers -> Dense.

  Raises:
    ValueError: what was found, and why it cannot be mapped.
  """
  label = contents.label
  groups = [g for g in contents.groups if g.tensors]
  bidirectional = [g for g in groups if g.hint == "bidirectional"]
  if bidirectional:
    raise safe_io.fail(label, f"found a bidirectional layer "
                       f"({bidirectional[0].describe()}); rnnstep runs one "
                       "direction, left to right, only")
  notes = list(contents.notes)
  chain = contents.chain
  if chain is not None and chain.specs is not None:
    notes.extend(chain.notes)
    mapped = _map_with_config(groups, chain.specs, contents, label)
  else:
    if chain is not None:
      notes.extend(chain.notes)
    mapped = _map_by_shapes(groups, label)
  embedding, recurrent, dense = mapped
  _check_widths(embedding, recurrent, dense, label)
  return MappedModel(contents, embedding, recurrent, dense, notes)


def _map_with_config(groups, specs, contents, label):
  by_key = {}
  for group in groups:
    by_key[group.name] = group
  used = set()
  layers = []
  for spec in specs:
    key = getattr(spec, contents.key)
    group = by_key.get(key)
    if group is None:
      raise safe_io.fail(label, f"the config lists {KIND_NAMES[spec.kind]} "
                         f"{show(spec.name)} but the file holds no weights for "
                         f"it (looked for {show(key)}); found: "
                         f"{_list_groups(groups)}")
    used.add(group.name)
    layers.append(_match_spec(group, spec, label))
  unused = [g for g in groups if g.name not in used]
  if unused:
    raise safe_io.fail(label, f"the file holds weights the config does not "
                       f"place in the chain: {_list_groups(unused)}")
  return layers[0], layers[1:-1], layers[-1]


def _match_spec(group, spec, label) -> MappedLayer:
  where = f"{KIND_NAMES[spec.kind]} {show(spec.name)}"
  tensors = _assign_roles(group, spec.kind, label)
  if spec.kind == "embedding":
    shape = tuple(tensors["embeddings"].shape)
    if shape != (spec.input_dim, spec.units):
      raise safe_io.fail(label, f"{where}: stored embeddings have shape {shape}, "
                         f"the config says ({spec.input_dim}, {spec.units})")
    return MappedLayer("embedding", group.name, tensors)
  if spec.kind == "dense":
    kernel = tuple(tensors["kernel"].shape)
    if len(kernel) != 2 or kernel[1] != spec.units:
      raise safe_io.fail(label, f"{where}: stored kernel has shape {kernel}, "
                         f"the config says {spec.units} units")
    _check_bias(tensors, spec.use_bias, (spec.units,), where, label)
    return MappedLayer("dense", group.name, tensors)
  kind, units, reset_after = _recurrent_shapes(group, tensors, label)
  if kind != spec.kind or units != spec.units:
    raise safe_io.fail(label, f"{where} with {spec.units} units: the stored "
                       f"weights {group.describe()} fit a "
                       f"{KIND_NAMES[kind]} with {units} units")
  if spec.kind == "gru":
    if spec.reset_after is not None:
      if "bias" in tensors and reset_after != spec.reset_after:
        raise safe_io.fail(label, f"{where}: config says reset_after="
                           f"{spec.reset_after} but the bias shape "
                           f"{tensors['bias'].shape} says otherwise")
      reset_after = spec.reset_after
    elif reset_after is None:
      raise safe_io.fail(label, f"{where}: cannot tell reset_after (no bias "
                         "and no reset_after in the config)")
  layer = model_file.LayerConfig(kind, units, bool(reset_after)
                                 if kind == "gru" else True)
  _check_bias(tensors, spec.use_bias, layer.bias_shape(), where, label)
  return MappedLayer(kind, group.name, tensors, layer)


def _check_bias(tensors, use_bias, shape, where, label):
  bias = tensors.get("bias")
  if use_bias and bias is None:
    raise safe_io.fail(label, f"{where}: the config says use_bias=True but the "
                       "file holds no bias (missing variable)")
  if not use_bias and bias is not None:
    raise safe_io.fail(label, f"{where}: the config says use_bias=False but the "
                       "file holds a bias")
  if bias is not None and tuple(bias.shape) != tuple(shape):
    raise safe_io.fail(label, f"{where}: bias has shape {tuple(bias.shape)}, "
                       f"expected {tuple(shape)}")


_WANTED = {"embedding": ("embeddings",), "dense": ("kernel", "bias"),
           "recurrent": ("kernel", "recurrent_kernel", "bias")}
_REQUIRED = {"embedding": ("embeddings",), "dense": ("kernel",),
             "recurrent": ("kernel", "recurrent_kernel")}


def _assign_roles(group: Group, kind: str, label) -> Dict[str, Tensor]:
  """Names each stored variable of a layer: by its name, else by position."""
  family = kind if kind in ("embedding", "dense") else "recurrent"
  wanted = _WANTED[family]
  where = f"{show(group.name)} ({KIND_NAMES.get(kind, kind)})"
  roles = [t.role for t in group.tensors]
  if all(r is not None for r in roles):
    out = {}
    for tensor in group.tensors:
      if tensor.role not in wanted:
        raise safe_io.fail(label, f"{where} holds an unexpected variable "
                           f"{show(tensor.path)}; found {group.describe()}")
      if tensor.role in out:
        raise safe_io.fail(label, f"{where} holds two {tensor.role} variables")
      out[tensor.role] = tensor
  elif all(r is None for r in roles):
    if len(group.tensors) > len(wanted):
      raise safe_io.fail(label, f"{where} holds {len(group.tensors)} variables, "
                         f"expected at most {len(wanted)}; found "
                         f"{group.describe()}")
    out = dict(zip(wanted, group.tensors))
  else:
    raise safe_io.fail(label, f"{where}: cannot tell its variables apart")
  out = {role: out[role] for role in wanted if role in out}
  missing = [r for r in _REQUIRED[family] if r not in out]
  if missing:
    raise safe_io.fail(label, f"{where} has no {' or '.join(missing)} (found "
                       f"{', '.join(sorted(out)) or 'nothing'}); a variable is "
                       "missing from the file")
  for role, tensor in out.items():
    want_ndim = 1 if role == "bias" and family == "dense" else 2
    if role == "bias" and family == "recurrent":
      ok = len(tensor.shape) in (1, 2)
    else:
      ok = len(tensor.shape) == want_ndim
    if not ok or any(d <= 0 for d in tensor.shape):
      raise safe_io.fail(label, f"{where}: {role} has shape {tuple(tensor.shape)}")
  return out


def _recurrent_shapes(group, tensors, label):
  """(kind, units, reset_after or None) from a recurrent layer's shapes."""
  kernel = tuple(tensors["kernel"].shape)
  recurrent = tuple(tensors["recurrent_kernel"].shape)
  units, width = recurrent
  gates = width // units if width % units == 0 else 0
  if gates not in KIND_BY_GATES or kernel[1] != width:
    raise safe_io.fail(label, f"{group.describe()} does not have the shapes of "
                       "a GRU, LSTM or SimpleRNN (kernel [D, G*U], recurrent "
                       "kernel [U, G*U] with G = 3, 4 or 1)")
  kind = KIND_BY_GATES[gates]
  bias = tensors.get("bias")
  reset_after = None
  if bias is not None:
    shape = tuple(bias.shape)
    if kind == "gru" and shape == (2, width):
      reset_after = True
    elif kind == "gru" and shape == (width,):
      reset_after = False
    elif shape != (width,):
      raise safe_io.fail(label, f"{group.describe()}: a {KIND_NAMES[kind]} "
                         f"with {units} units cannot have bias shape {shape}")
  return kind, units, reset_after


# --------------------------------------------------- mapping by names and shapes


def _classify(group: Group, label) -> str:
  """'embedding', 'dense', 'recurrent' or 'matrix' (one 2-D variable: either)."""
  roles = {t.role for t in group.tensors}
  shapes = [tuple(t.shape) for t in group.tensors]
  if roles & {"recurrent_kernel"}:
    return "recurrent"
  if "embeddings" in roles:
    return "embedding"
  if (group.cell or group.hint in KIND_BY_GATES.values()) and len(shapes) < 3:
    found = ", ".join(sorted(r or "?" for r in roles)) if None not in roles else (
        f"{len(shapes)} variables")
    raise safe_io.fail(label, f"recurrent layer {group.describe()} has no "
                       f"recurrent_kernel (found {found}); a variable is "
                       "missing from the file")
  if roles and roles <= {"kernel", "bias"} and None not in roles:
    return "dense"
  if None in roles and len(roles) == 1:
    if len(shapes) in (2, 3) and all(len(s) == 2 for s in shapes[:2]) and (
        shapes[0][1] == shapes[1][1] and shapes[1][0] <= shapes[1][1]):
      return "recurrent"
    if len(shapes) == 2 and len(shapes[0]) == 2 and shapes[1] == (shapes[0][1],):
      return "dense"
    if len(shapes) == 1 and len(shapes[0]) == 2:
      if group.hint in ("embedding", "dense"):
        return group.hint
      return "matrix"
  names = ", ".join(show(t.path) for t in group.tensors)
  raise safe_io.fail(label, f"found a layer that is not an Embedding, GRU, LSTM, "
                     f"SimpleRNN or Dense: {group.describe()} ({names}); rnnstep "
                     "maps Embedding -> recurrent layer(s) -> Dense only")


def _map_by_shapes(groups, label):
  if not groups:
    raise safe_io.fail(label, "found no layer weights in the file")
  classes = {g.name: _classify(g, label) for g in groups}
  recurrent = []
  for group in groups:
    if classes[group.name] == "recurrent":
      tensors = _assign_roles(group, "recurrent", label)
      kind, units, reset_after = _recurrent_shapes(group, tensors, label)
      if kind == "gru" and reset_after is None:
        raise safe_io.fail(label, f"GRU {group.describe()} has no bias and the "
                           "file has no config: cannot tell reset_after")
      layer = model_file.LayerConfig(kind, units, bool(reset_after)
                                     if kind == "gru" else True)
      recurrent.append((group, MappedLayer(kind, group.name, tensors, layer)))
  if not recurrent:
    raise safe_io.fail(label, f"found no recurrent layer; found: "
                       f"{_list_groups(groups)}")
  if len(recurrent) > model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{len(recurrent)} recurrent layers, more than "
                       f"{model_file.MAX_LAYERS}")
  others = [g for g in groups if classes[g.name] != "recurrent"]
  pairs = []
  for emb, dense in itertools.permutations(others, 2):
    if classes[emb.name] in ("embedding", "matrix") and (
        classes[dense.name] in ("dense", "matrix")):
      pairs.append((emb, dense))
  if len(others) != 2 or not pairs:
    raise safe_io.fail(label, "expected one Embedding and one Dense around the "
                       f"recurrent layers, found: {_list_groups(others) or 'none'}"
                       f" besides {_list_groups([g for g, _ in recurrent])}")
  solutions = []
  for emb, dense in pairs:
    emb_map = MappedLayer("embedding", emb.name,
                          _assign_roles(emb, "embedding", label))
    dense_map = MappedLayer("dense", dense.name,
                            _assign_roles(dense, "dense", label))
    vocab, dim = emb_map.tensors["embeddings"].shape
    rows, cols = dense_map.tensors["kernel"].shape
    if cols != vocab:
      continue
    for order in _chains(recurrent, dim, rows, label):
      solutions.append((emb_map, order, dense_map))
      if len(solutions) > 1:
        break
    if len(solutions) > 1:
      break
  if not solutions:
    raise safe_io.fail(label, "the stored shapes do not chain into Embedding "
                       "[V, D] -> recurrent layers -> Dense [U, V]: "
                       f"{_list_groups(groups)}")
  if len(solutions) > 1:
    raise safe_io.fail(label, "cannot tell the order of the layers: more than "
                       "one chain fits the stored shapes "
                       f"({_list_groups(groups)}) and the file records no "
                       "order; save the model with its config (a .keras file "
                       "or model.save('m.h5')) or use layers of different "
                       "widths")
  return solutions[0]


def _chains(recurrent, dim, last_units, label):
  """Yields orders of the recurrent layers whose shapes chain, respecting any
  order the file records."""
  count = len(recurrent)
  visits = [0]

  def allowed(index, placed):
    group = recurrent[index][0]
    if group.order is None:
      return True
    scheme, position = group.order
    for j, (other, _) in enumerate(recurrent):
      if j not in placed and j != index and other.order is not None and (
          other.order[0] == scheme and other.order[1] < position):
        return False
    return True

  def search(placed, width):
    visits[0] += 1
    if visits[0] > MAX_ORDER_SEARCH:
      raise safe_io.fail(label, "too many possible layer orders to search; "
                         "save the model with its config")
    if len(placed) == count:
      if width == last_units:
        yield [recurrent[i][1] for i in placed]
      return
    for i in range(count):
      if i in placed:
        continue
      mapped = recurrent[i][1]
      if mapped.tensors["kernel"].shape[0] != width or not allowed(i, placed):
        continue
      yield from search(placed + [i], mapped.layer.units)

  yield from search([], dim)


def _check_widths(embedding, recurrent, dense, label):
  vocab, width = embedding.tensors["embeddings"].shape
  for mapped in recurrent:
    rows = mapped.tensors["kernel"].shape[0]
    if rows != width:
      raise safe_io.fail(label, f"{KIND_NAMES[mapped.kind]} {show(mapped.name)} "
                         f"takes inputs of width {rows} but gets {width}")
    width = mapped.layer.units
  rows, cols = dense.tensors["kernel"].shape
  if rows != width:
    raise safe_io.fail(label, f"Dense {show(dense.name)} takes inputs of width "
                       f"{rows} but the last recurrent layer has {width} units")
  if cols != vocab:
    raise safe_io.fail(label, f"Dense {show(dense.name)} has {cols} outputs but "
                       f"the embedding has {vocab} rows; a char model needs "
                       "both to be the vocabulary size")
  if vocab > model_file.MAX_VOCAB:
    raise safe_io.fail(label, f"vocabulary of {vocab} rows, more than "
                       f"{model_file.MAX_VOCAB}")


def _list_groups(groups) -> str:
  shown = [g.describe() for g in groups[:12]]
  if len(groups) > 12:
    shown.append(f"... ({len(groups) - 12} more)")
  return "; ".join(shown)


# ----------------------------------------------------------------- vocabulary


def vocab_from_corpus(text: str) -> List[str]:
  """The tutorial's vocabulary: `sorted(set(text))`."""
  if not isinstance(text, str):
    raise ValueError(f"corpus text must be a str, got {type(text).__name__}")
  return sorted(set(text))


def resolve_vocab(chars: Sequence[str], vocab_size: int, source: str) -> List[str]:
  """Fits a character list to the model's vocabulary size.

  `chars` of exactly `vocab_size` entries are used as they are. One entry
  fewer, without "[UNK]", gets "[UNK]" at id 0 (the current TF tutorial's
  `StringLookup(mask_token=None)` layout).

  Raises:
    ValueError: the sizes do not match; the message gives both.
  """
  chars = list(chars)
  if len(chars) == vocab_size:
    return chars
  if len(chars) + 1 == vocab_size and (not chars or chars[0] != UNK_TOKEN):
    return [UNK_TOKEN] + chars
  has_unk = bool(chars) and chars[0] == UNK_TOKEN
  count = len(chars) - (1 if has_unk else 0)
  raise ValueError(
      f"vocabulary size mismatch: {source} gives {count} characters"
      f"{' plus [UNK]' if has_unk else ''} but the model's embedding has "
      f"{vocab_size} rows (it needs {vocab_size} characters, or "
      f"{vocab_size - 1} plus [UNK] at id 0)")
