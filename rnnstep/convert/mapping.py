"""Finds Embedding -> recurrent layer(s) -> Dense in what a weights file holds.

`map_model` matches the `Contents` a reader listed:

  - with a chain (a model config, or one a reader worked out), the chain fixes
    the order and the layer kinds, and every stored shape is checked against it;
  - without one (subclassed models, weights-only files, TF checkpoints), the
    kinds come from variable names and shapes (a recurrent kernel [U, G*U] gives
    the kind with G gates, `kinds.BY_GATES`; a GRU bias [2, 3U] means
    reset_after), and the order is the one chain that fits the shapes:
    embedding width -> kernel rows, units -> next kernel rows, last units ->
    Dense rows, Dense columns = vocabulary rows. Any order the file itself
    records (Keras layer indices) must be respected; if more than one chain
    still fits, the file is refused.
"""

import dataclasses
import itertools
from typing import Dict, List, Optional, Tuple

import numpy as np

from rnnstep.convert.contents import Contents
from rnnstep.convert.contents import Group
from rnnstep.convert.contents import KIND_NAMES
from rnnstep.convert.contents import ONE_HOT_NAME
from rnnstep.convert.contents import ONE_HOT_NOTE
from rnnstep.convert.contents import Tensor
from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show
from rnnstep.model import kinds
from rnnstep.model import model_file

KIND_BY_GATES = kinds.BY_GATES
MAX_ORDER_SEARCH = 200_000


@dataclasses.dataclass
class MappedLayer:
  kind: str
  name: str
  tensors: Dict[str, Tensor]
  layer: Optional[model_file.LayerConfig] = None  # recurrent layers only
  # A bidirectional layer's backward copy's tensors, named as `tensors`.
  backward: Optional[Dict[str, Tensor]] = None
  activation: str = "linear"  # Dense layers only.

  @property
  def shapes(self) -> List[Tuple[int, ...]]:
    return [tuple(t.shape)
            for t in [*self.tensors.values(), *(self.backward or {}).values()]]


@dataclasses.dataclass
class MappedModel:
  """Embedding -> recurrent layers -> Dense, matched to stored tensors."""
  contents: Contents
  embedding: MappedLayer
  recurrent: List[MappedLayer]
  dense: MappedLayer
  notes: List[str]
  # Dense layers between the recurrent layers and `dense`.
  head: List[MappedLayer] = dataclasses.field(default_factory=list)
  # How a short window is filled (`model_file.PADDINGS`), where the
  # vocabulary says (`convert.vocabulary.pads_windows`).
  padding: Optional[str] = None

  @property
  def vocab_size(self) -> int:
    return int(self.embedding.tensors["embeddings"].shape[0])

  @property
  def config(self) -> model_file.ModelConfig:
    chain = self.contents.chain
    return model_file.ModelConfig(
        embedding_dim=int(self.embedding.tensors["embeddings"].shape[1]),
        layers=tuple(layer.layer for layer in self.recurrent),
        window=chain.window if chain is not None else None,
        head=tuple(model_file.HeadLayer(
            int(layer.tensors["kernel"].shape[1]), layer.activation)
                   for layer in self.head),
        padding=self.padding,
        attention=self.contents.attention is not None)

  @property
  def layers(self) -> List[MappedLayer]:
    return [self.embedding, *self.recurrent, *self.head, self.dense]

  def read_tensors(self) -> Dict[str, np.ndarray]:
    """Reads every tensor (guarded) into the model file's keys and layouts.

    A layer without bias gets zeros of the shape Keras would have used.
    """
    label = self.contents.label
    vocab_size = self.vocab_size
    out = {"embedding": self.embedding.tensors["embeddings"].read(label)}
    for i, mapped in enumerate(self.recurrent):
      directions = [("", mapped.tensors)]
      if mapped.backward is not None:
        directions.append((model_file.BACKWARD, mapped.backward))
      for prefix, tensors in directions:
        key = f"layer{i}_{prefix}"
        out[key + "kernel"] = tensors["kernel"].read(label)
        out[key + "recurrent_kernel"] = tensors["recurrent_kernel"].read(label)
        bias = tensors.get("bias")
        out[key + "bias"] = (bias.read(label) if bias is not None else
                             np.zeros(mapped.layer.bias_shape(), np.float32))
    if self.contents.attention is not None:
      out["attention_kernel"] = self.contents.attention.read(label)
    for j, mapped in enumerate(self.head):
      out[f"head{j}_kernel"] = mapped.tensors["kernel"].read(label)
      bias = mapped.tensors.get("bias")
      out[f"head{j}_bias"] = (
          bias.read(label) if bias is not None else
          np.zeros(mapped.tensors["kernel"].shape[1:], np.float32))
    out["dense_kernel"] = self.dense.tensors["kernel"].read(label)
    bias = self.dense.tensors.get("bias")
    out["dense_bias"] = (bias.read(label) if bias is not None
                         else np.zeros((vocab_size,), np.float32))
    return out


# ----------------------------------------------------------------- mapping


def map_model(contents: Contents) -> MappedModel:
  """Matches stored groups to Embedding -> recurrent layers -> Dense.

  Raises:
    ValueError: what was found, and why it cannot be mapped.
  """
  label = contents.label
  groups = [g for g in contents.groups if g.tensors]
  notes = list(contents.notes)
  chain = contents.chain
  bidirectional = [g for g in groups if g.hint == "bidirectional"]
  if bidirectional and (chain is None or chain.specs is None):
    raise safe_io.fail(label, f"found a bidirectional layer "
                       f"({bidirectional[0].describe()}) in a file without a "
                       "model config; rnnstep runs a Bidirectional layer only "
                       "from a saved model (its config says how the "
                       "directions merge and the window it reads)")
  if chain is not None and chain.specs is not None:
    notes.extend(chain.notes)
    if chain.specs[0].one_hot:
      groups.insert(0, _identity_embedding(chain.specs[0].input_dim, getattr(
          chain.specs[0], contents.key)))
    mapped = _map_with_config(groups, chain.specs, contents, label)
  else:
    if chain is not None:
      notes.extend(chain.notes)
    mapped = _map_by_shapes(groups, label)
    if mapped[0].name == ONE_HOT_NAME:
      notes.append(ONE_HOT_NOTE.format(mapped[0].tensors["embeddings"].shape[0])
                   + "; the file has no config, so this was inferred from the "
                   "shapes")
  embedding, recurrent, dense = mapped
  head = [layer for layer in recurrent if layer.kind == "dense"]
  recurrent = [layer for layer in recurrent if layer.kind != "dense"]
  _check_widths(embedding, recurrent, head + [dense], label,
                contents.attention)
  return MappedModel(contents, embedding, recurrent, dense, notes, head)


def _identity_embedding(size: int, name: str) -> Group:
  """The Group of the identity Embedding(V, V) a one-hot model implies."""
  return Group(name=name, tensors=[Tensor(
      path="identity (one-hot input)", shape=(size, size), role="embeddings",
      reader=lambda: np.eye(size, dtype=np.float32))], hint="embedding")


def _map_with_config(groups, specs, contents, label):
  by_key = {}
  for group in groups:
    by_key[group.name] = group
  used = set()
  layers = []
  for spec in specs:
    key = getattr(spec, contents.key)
    group = by_key.get(key)
    halves = [by_key.get(f"{key}/{half}_layer")
              for half in ("forward", "backward")]
    if group is None and spec.bidirectional and all(halves):
      # Keras 3 keeps a Bidirectional's layers apart, each under its path.
      used.update(half.name for half in halves)
      group = Group(key, halves[0].tensors + halves[1].tensors)
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


def _directions(group: Group, label) -> Tuple[Group, Group]:
  """A Bidirectional layer's group split into its forward and backward
  layers' variables, by their names (tf_keras: `forward_lstm/...`,
  `backward_lstm/...`; Keras 3: `forward_layer/...`, `backward_layer/...`).

  Raises:
    ValueError: a variable of neither direction, or unnamed variables.
  """
  parts = {"forward": [], "backward": []}
  for tensor in group.tensors:
    names = [part for part in tensor.path.split("/")
             if part.startswith(("forward_", "backward_"))]
    if not names:
      raise safe_io.fail(label, f"Bidirectional {group.describe()}: cannot "
                         f"tell which direction {show(tensor.path)} belongs "
                         "to")
    parts[names[-1].split("_", 1)[0]].append(tensor)
  return tuple(Group(f"{group.name} ({direction})", tensors)
               for direction, tensors in parts.items())


def _match_spec(group, spec, label) -> MappedLayer:
  where = f"{KIND_NAMES[spec.kind]} {show(spec.name)}"
  if spec.kind in ("embedding", "dense"):
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
    return MappedLayer("dense", group.name, tensors,
                       activation=spec.activation)
  if spec.bidirectional:
    forward, backward = _directions(group, label)
    mapped = _match_spec(forward, dataclasses.replace(spec,
                                                      bidirectional=False),
                         label)
    backward = _match_spec(backward, dataclasses.replace(
        spec, bidirectional=False), label)
    return dataclasses.replace(
        mapped, name=group.name, backward=backward.tensors,
        layer=dataclasses.replace(mapped.layer, bidirectional=True))
  tensors = from_cudnn_lstm(_assign_roles(group, spec.kind, label))
  kind, units, reset_after = _recurrent_shapes(group, tensors, label)
  # The shapes give the plain kind; the config may name its variant (relu).
  plain = kinds.KINDS[spec.kind].variant_of or spec.kind
  if kind != plain or units != spec.units:
    raise safe_io.fail(label, f"{where} with {spec.units} units: the stored "
                       f"weights {group.describe()} fit a "
                       f"{KIND_NAMES[kind]} with {units} units")
  kind = spec.kind
  if kinds.KINDS[spec.kind].has_reset_after:
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
                                 if kinds.KINDS[kind].has_reset_after else True)
  _check_bias(tensors, spec.use_bias, layer.bias_shape(), where, label)
  return MappedLayer(kind, group.name, tensors, layer)


def from_cudnn_lstm(tensors: Dict[str, Tensor]) -> Dict[str, Tensor]:
  """An LSTM's tensors as Keras 2's `CuDNNLSTM` stored them, in LSTM's layout.

  A `CuDNNLSTM` (Keras 2.0-2.3; textgenrnn's bundled weights) keeps two
  biases, `[8U]`, and its kernels in cuDNN's layout. Keras's HDF5 loader
  converts them when an `LSTM` loads them (tf_keras
  `hdf5_format._convert_rnn_weights`, `from_cudnn=True`), and so does this,
  exactly as it does: per gate block, the input kernel becomes
  `k.T.reshape(k.shape, order="F")` and the recurrent kernel `k.T`; the two
  biases are summed. Any other layer's tensors come back as they are.
  """
  kernel, recurrent, bias = (tensors.get(name) for name in (
      "kernel", "recurrent_kernel", "bias"))
  if kernel is None or recurrent is None or bias is None or len(
      recurrent.shape) != 2 or len(kernel.shape) != 2:
    units = None
  else:
    units = recurrent.shape[0]
  if units is None or tuple(recurrent.shape) != (units, 4 * units) or (
      tuple(bias.shape) != (8 * units,) or kernel.shape[1] != 4 * units):
    return tensors

  def blocks(tensor, transform):
    return Tensor(f"{tensor.path} (CuDNNLSTM layout)", tensor.shape,
                  tensor.role, lambda: np.hstack([
                      transform(block) for block in np.hsplit(
                          np.asarray(tensor.reader()), 4)]))

  summed = Tensor(f"{bias.path} (CuDNNLSTM's two biases, summed)",
                  (4 * units,), "bias",
                  lambda: np.sum(np.split(np.asarray(bias.reader()), 2),
                                 axis=0))
  return dict(tensors, bias=summed,
              kernel=blocks(kernel, lambda k: k.T.reshape(k.shape,
                                                          order="F")),
              recurrent_kernel=blocks(recurrent, lambda k: k.T))


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
  """(kind, units, reset_after or None) from a recurrent layer's shapes.

  The kind is the one whose declared tensor shapes (`kinds.Kind.
  tensor_shapes`) these are: first by the kernels, then the variant by the
  bias (None where the file has no bias or the kind has no variants).
  """
  kernel = tuple(tensors["kernel"].shape)
  units = tuple(tensors["recurrent_kernel"].shape)[0]
  kernels = ("kernel", "recurrent_kernel")
  matching = [kind for kind in kinds.PLAIN  # Variants are stored alike.
              if all(tuple(tensors[name].shape)
                     == kind.tensor_shapes(kernel[0], units)[name]
                     for name in kernels)]
  if not matching:
    raise safe_io.fail(label, f"{group.describe()} does not have the shapes of "
                       "a GRU, LSTM or SimpleRNN (kernel [D, G*U], recurrent "
                       "kernel [U, G*U] with G = 3, 4 or 1)")
  (kind,) = matching  # The gate count tells the kinds apart.
  bias = tensors.get("bias")
  if bias is None:
    return kind.name, units, None
  variants = (True, False) if kind.has_reset_after else (True,)
  for reset_after in variants:
    if tuple(bias.shape) == kind.tensor_shapes(kernel[0], units,
                                               reset_after)["bias"]:
      return (kind.name, units,
              reset_after if kind.has_reset_after else None)
  raise safe_io.fail(label, f"{group.describe()}: a {KIND_NAMES[kind.name]} "
                     f"with {units} units cannot have bias shape "
                     f"{tuple(bias.shape)}")


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
      tensors = from_cudnn_lstm(_assign_roles(group, "recurrent", label))
      kind, units, reset_after = _recurrent_shapes(group, tensors, label)
      if kinds.KINDS[kind].has_reset_after and reset_after is None:
        raise safe_io.fail(label, f"{KIND_NAMES[kind]} {group.describe()} has "
                           "no bias and the file has no config: cannot tell "
                           "reset_after")
      layer = model_file.LayerConfig(
          kind, units,
          bool(reset_after) if kinds.KINDS[kind].has_reset_after else True)
      recurrent.append((group, MappedLayer(kind, group.name, tensors, layer)))
  if not recurrent:
    raise safe_io.fail(label, f"found no recurrent layer; found: "
                       f"{_list_groups(groups)}")
  if len(recurrent) > model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{len(recurrent)} recurrent layers, more than "
                       f"{model_file.MAX_LAYERS}")
  others = [g for g in groups if classes[g.name] != "recurrent"]
  if len(others) == 1 and classes[others[0].name] in ("dense", "matrix"):
    # No Embedding stored: a one-hot model if the first recurrent layer's
    # inputs are as wide as the Dense's outputs (checked by the chain below).
    vocab = _assign_roles(others[0], "dense", label)["kernel"].shape[-1]
    others.insert(0, _identity_embedding(vocab, ONE_HOT_NAME))
    classes[ONE_HOT_NAME] = "embedding"
  pairs = []
  for emb, dense in itertools.permutations(others, 2):
    if classes[emb.name] in ("embedding", "matrix") and (
        classes[dense.name] in ("dense", "matrix")):
      pairs.append((emb, dense))
  if len(others) > 2:
    raise safe_io.fail(label, "the model is not a step-wise stack: besides the "
                       f"recurrent layers the file holds {_list_groups(others)}"
                       "; rnnstep maps Embedding (or one-hot inputs) -> "
                       "GRU/LSTM/SimpleRNN layer(s) -> Dense")
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


def _check_widths(embedding, recurrent, denses, label, attention=None):
  """Checks each layer takes the width the one below gives; `denses` are
  the head's Dense layers, then the output Dense; `attention` (textgenrnn's
  W) reads the embedding and every recurrent layer's outputs."""
  vocab, width = embedding.tensors["embeddings"].shape
  for mapped in recurrent:
    for tensors in (mapped.tensors, mapped.backward or {}):
      rows = tensors["kernel"].shape[0] if tensors else width
      if rows != width:
        raise safe_io.fail(label, f"{KIND_NAMES[mapped.kind]} "
                           f"{show(mapped.name)} takes inputs of width {rows} "
                           f"but gets {width}")
    width = mapped.layer.outputs
  below = "the last recurrent layer has"
  if attention is not None:
    width = embedding.tensors["embeddings"].shape[1] + sum(
        mapped.layer.outputs for mapped in recurrent)
    if attention.shape[0] != width:
      raise safe_io.fail(label, f"the attention's W has {attention.shape[0]} "
                         f"rows but the embedding and the recurrent layers "
                         f"give {width} channels")
    below = "the attention gives"
  for dense in denses:
    rows = dense.tensors["kernel"].shape[0]
    if rows != width:
      raise safe_io.fail(label, f"Dense {show(dense.name)} takes inputs of "
                         f"width {rows} but {below} {width} units")
    width, below = dense.tensors["kernel"].shape[1], "the Dense below has"
  dense = denses[-1]
  rows, cols = dense.tensors["kernel"].shape
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
