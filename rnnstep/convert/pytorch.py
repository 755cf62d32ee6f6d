"""PyTorch recurrent models: a state dict's tensors mapped to the Keras layouts.

The tensors come from a state dict, or from a whole pickled module
(`torch.save(model)`) read as inert records and named as its `state_dict()`
would name them (`torch_state_dict.module_tensors`); both are mapped alike.

The model must be `nn.Embedding -> nn.GRU / nn.LSTM / nn.RNN (tanh or relu)
module(s) -> nn.Linear`, unidirectional, any `num_layers`, with or without bias, under
any module names (`encoder.weight`, `rnn.weight_ih_l0`, `decoder.weight`;
`embed.weight`, `gru.weight_hh_l1`, `fc.bias`; with a `module.` or `model.`
prefix). The chain is found from key patterns and shapes:

  - recurrent modules: `<m>.weight_ih_l{k}` [G*H, D_k], `<m>.weight_hh_l{k}`
    [G*H, H], optional `<m>.bias_ih_l{k}` / `<m>.bias_hh_l{k}` [G*H]; G (rows
    per hidden unit) gives the kind, `kinds.BY_TORCH_GATES`;
  - the embedding: a `<m>.weight` [V, D] without bias, D = the first layer's
    input width; the Linear: `<m>.weight` [V, H_last] (+ `<m>.bias` [V]);
  - several recurrent modules are ordered by their widths; if more than one
    order (or embedding/Linear assignment) fits, module names ("embed",
    "encoder" / "fc", "decoder", ...) and then the state dict's order decide
    the embedding and Linear; an ambiguous recurrent order is refused.

The mapping (exact; docs/dev/cell-kinds.md, gate orders): weights are
transposed; each kind's gate blocks are reordered from PyTorch's order to
Keras's (`kinds.Kind.torch_permutation`: GRU r,z,n -> z,r,h; LSTM i,f,g,o is
Keras i,f,c,o); the biases become Keras's (`kinds.Kind.torch_bias`): a GRU is
Keras `reset_after=True` with bias rows (input, recurrent); LSTM and RNN add
`bias_ih + bias_hh`. No bias: zeros. Linear [V, U] -> Dense kernel [U, V].

Refused in one line: bidirectional modules (`_reverse` keys), LSTM
`proj_size` (`weight_hr`), any tensor that is not part of such a chain. An
`nn.RNN(nonlinearity='relu')` has the same keys as a tanh one: a whole
pickled module's `nonlinearity` attribute says which (relu is its own kind,
`simple_rnn_relu`); a state dict alone cannot tell, and rnnstep assumes tanh,
the default (noted in its summary).
"""

import itertools
import re
from typing import Dict, List, Optional

import numpy as np

from rnnstep.convert import contents as contents_lib
from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show
from rnnstep.convert import safetensors_file
from rnnstep.convert import stored_tensors
from rnnstep.convert import torch_legacy
from rnnstep.convert import torch_state_dict
from rnnstep.convert import torch_zip
from rnnstep.model import kinds
from rnnstep.model import model_file

_RNN_KEY = re.compile(r"^(?:(.*)\.)?(weight_ih|weight_hh|bias_ih|bias_hh|"
                      r"weight_hr)_l(\d+)(_reverse)?$")
_PLAIN_KEY = re.compile(r"^(?:(.*)\.)?(weight|bias)$")
_EMBEDDING_NAMES = ("embed", "embedding", "embeddings", "encoder", "emb",
                    "tok_emb", "wte", "token_embedding", "lookup")
_DENSE_NAMES = ("fc", "linear", "decoder", "out", "output", "head", "lm_head",
                "proj", "dense", "classifier", "logits", "fc_out")
MAX_ORDERS = 10_000


def read(path, reader: str) -> contents_lib.Contents:
  """Lists what a PyTorch file holds, mapped to Keras layouts (not read yet).

  Args:
    path: the file.
    reader: 'zip', 'legacy' or 'safetensors'.
  """
  label = str(path)
  if reader == "safetensors":
    tensors, fmt, close = safetensors_file.read_safetensors(path)
    state = torch_state_dict.StateDict(tensors, [])
  else:
    read_fn = (torch_zip.read_zip if reader == "zip"
               else torch_legacy.read_legacy)
    obj, fmt, close = read_fn(path)
    try:
      state = torch_state_dict.find_state_dict(obj, label)
    except BaseException:
      close()
      raise
  try:
    groups, specs, notes = _map_state_dict(state.tensors, label,
                                           state.nonlinearities)
  except BaseException:
    close()
    raise
  chain = contents_lib.ConfigChain(f"PyTorch {state.source}", specs,
                                   state.notes + notes)
  return contents_lib.Contents(
      label=label, format=f"PyTorch {state.source} ({fmt}, "
      f"{len(state.tensors)} tensors)", groups=groups, chain=chain, key="name", closers=[close])


class _Recurrent:
  """One nn.GRU / nn.LSTM / nn.RNN module's layers."""

  def __init__(self, module, kind, hidden, layers, bias, first):
    self.module = module          # the module's name ('' at the top level)
    self.kind = kind              # a kinds.Kind
    self.hidden = hidden
    self.layers = layers          # [{'weight_ih': (key, tensor), ...}, ...]
    self.bias = bias
    self.first = first            # the position of its first key

  @property
  def input_width(self) -> int:
    return self.layers[0]["weight_ih"][1].shape[1]


def _map_state_dict(tensors: Dict[str, stored_tensors.StoredTensor], label,
                    nonlinearities: Optional[Dict[str, str]] = None):
  """Returns (groups, layer specs, notes) for the chain the keys describe.

  Args:
    tensors: the state dict.
    label: the file, for messages.
    nonlinearities: a whole module's nn.RNN modules' `nonlinearity`, by
      module path (`StateDict.nonlinearities`); an nn.RNN not in it is
      assumed tanh, with a note.
  """
  nonlinearities = nonlinearities or {}
  if not tensors:
    raise safe_io.fail(label, "the state dict holds no tensors")
  recurrent_keys: Dict[str, Dict[int, Dict[str, tuple]]] = {}
  plain: Dict[str, Dict[str, tuple]] = {}
  position: Dict[str, int] = {}
  unknown = []
  for index, (key, tensor) in enumerate(tensors.items()):
    match = _RNN_KEY.match(key)
    if match:
      module, param, layer, reverse = match.groups()
      module = module or ""
      if reverse:
        raise safe_io.fail(label, f"{show(key)}: a bidirectional RNN reads the "
                           "text backwards too and cannot generate left to "
                           "right; rnnstep maps unidirectional GRU/LSTM/RNN "
                           "modules only")
      if param == "weight_hr":
        raise safe_io.fail(label, f"{show(key)}: an LSTM with proj_size (its "
                           "hidden state is projected) is not supported")
      if int(layer) > model_file.MAX_LAYERS:
        raise safe_io.fail(label, f"{show(key)}: more than "
                           f"{model_file.MAX_LAYERS} layers")
      recurrent_keys.setdefault(module, {}).setdefault(int(layer), {})[param] = (
          key, tensor)
      position.setdefault(module, index)
      continue
    match = _PLAIN_KEY.match(key)
    if match:
      module = match.group(1) or ""
      plain.setdefault(module, {})[match.group(2)] = (key, tensor)
      position.setdefault(module, index)
      continue
    unknown.append(key)
  if unknown:
    shown = ", ".join(show(k, 40) for k in unknown[:6])
    raise safe_io.fail(label, f"the state dict holds tensors that are not "
                       f"part of Embedding -> GRU/LSTM/RNN -> Linear: {shown}"
                       f"{' ...' if len(unknown) > 6 else ''}")
  for key, tensor in tensors.items():
    if tensor.dtype not in stored_tensors.FLOAT_DTYPES:
      raise safe_io.fail(label, f"tensor {show(key)} has dtype {tensor.dtype}; "
                         "a module with integer state (e.g. BatchNorm) is not "
                         "part of Embedding -> GRU/LSTM/RNN -> Linear")
  if not recurrent_keys:
    raise safe_io.fail(label, "found no GRU/LSTM/RNN weights (keys like "
                       "'rnn.weight_ih_l0'); found: " + _list_keys(tensors))
  modules = [_recurrent_module(name, layers, position[name], label)
             for name, layers in recurrent_keys.items()]
  modules = _order_modules(modules, label)
  embedding, dense = _embedding_and_dense(plain, modules, position, label)
  groups, specs = [], []
  notes = []
  emb_key, emb = embedding["weight"]
  vocab, dim = emb.shape
  emb_name = _name(emb_key)
  groups.append(contents_lib.Group(name=emb_name, tensors=[contents_lib.Tensor(
      path=emb_key, shape=(vocab, dim), role="embeddings",
      reader=_plain_reader(emb, emb_key, label))]))
  specs.append(contents_lib.LayerSpec("embedding", emb_name, emb_name,
                                      units=dim, input_dim=vocab))
  for module in modules:
    kind = module.kind
    if kind.torch_module == "RNN":  # nn.RNN(nonlinearity='tanh' | 'relu')
      nonlinearity = nonlinearities.get(module.module)
      if nonlinearity is None:
        notes.append(f"nn.RNN {show(module.module or '(top level)')}: assumed "
                     "nonlinearity='tanh' (the default; a relu RNN has the "
                     "same keys and would be computed wrongly)")
      else:  # The pickled module's own attribute says which.
        kind = kinds.with_activation(kind.name, nonlinearity)
    for k, layer in enumerate(module.layers):
      name = f"{module.module}[l{k}]" if module.module else f"l{k}"
      group, spec = _recurrent_layer(name, kind, module.hidden, layer, label)
      groups.append(group)
      specs.append(spec)
  dense_key, weight = dense["weight"]
  dense_name = _name(dense_key)
  rows, cols = weight.shape
  dense_tensors = [contents_lib.Tensor(
      path=dense_key, shape=(cols, rows), role="kernel",
      reader=_transposed_reader(weight, dense_key, label))]
  if "bias" in dense:
    bias_key, bias = dense["bias"]
    dense_tensors.append(contents_lib.Tensor(
        path=bias_key, shape=tuple(bias.shape), role="bias",
        reader=_plain_reader(bias, bias_key, label)))
  groups.append(contents_lib.Group(name=dense_name, tensors=dense_tensors))
  specs.append(contents_lib.LayerSpec("dense", dense_name, dense_name,
                                      units=rows, use_bias="bias" in dense))
  if len(specs) - 2 > model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{len(specs) - 2} recurrent layers, more than "
                       f"{model_file.MAX_LAYERS}")
  return groups, specs, notes


def _name(key: str) -> str:
  return key.rsplit(".", 1)[0] if "." in key else key


def _recurrent_module(module, layers, first, label) -> _Recurrent:
  where = f"{show(module or '(top level)')}"
  count = len(layers)
  if sorted(layers) != list(range(count)):
    raise safe_io.fail(label, f"recurrent module {where} has layers "
                       f"{sorted(layers)}: a layer's weights are missing")
  kind = hidden = None
  has_bias = None
  out = []
  for k in range(count):
    params = layers[k]
    for needed in ("weight_ih", "weight_hh"):
      if needed not in params:
        raise safe_io.fail(label, f"recurrent module {where} has no "
                           f"{needed}_l{k}: a variable is missing")
    biased = ("bias_ih" in params, "bias_hh" in params)
    if biased[0] != biased[1]:
      raise safe_io.fail(label, f"recurrent module {where} layer {k} has only "
                         "one of bias_ih and bias_hh")
    if has_bias is not None and has_bias != biased[0]:
      raise safe_io.fail(label, f"recurrent module {where}: some layers have "
                         "biases and some do not")
    has_bias = biased[0]
    w_ih = params["weight_ih"][1].shape
    w_hh = params["weight_hh"][1].shape
    if len(w_hh) != 2 or len(w_ih) != 2 or w_hh[1] == 0 or (
        w_hh[0] % w_hh[1]) or w_hh[0] // w_hh[1] not in kinds.BY_TORCH_GATES:
      raise safe_io.fail(label, f"{show(params['weight_hh'][0])} has shape "
                         f"{w_hh}, not [G*H, H] of a GRU (G=3), LSTM (G=4) "
                         "or RNN (G=1)")
    layer_kind = kinds.KINDS[kinds.BY_TORCH_GATES[w_hh[0] // w_hh[1]]]
    if kind is not None and (layer_kind, w_hh[1]) != (kind, hidden):
      raise safe_io.fail(label, f"recurrent module {where}: its layers differ "
                         "in kind or width")
    kind, hidden = layer_kind, w_hh[1]
    if w_ih[0] != w_hh[0] or w_ih[1] == 0 or (k > 0 and w_ih[1] != hidden):
      raise safe_io.fail(label, f"{show(params['weight_ih'][0])} has shape "
                         f"{w_ih}; expected [{w_hh[0]}, "
                         f"{'D' if k == 0 else hidden}]")
    for param in ("bias_ih", "bias_hh"):
      if param in params and params[param][1].shape != (w_hh[0],):
        raise safe_io.fail(label, f"{show(params[param][0])} has shape "
                           f"{params[param][1].shape}, expected ({w_hh[0]},)")
    out.append(params)
  return _Recurrent(module, kind, hidden, out, bool(has_bias), first)


def _order_modules(modules: List[_Recurrent], label) -> List[_Recurrent]:
  """The one order of the recurrent modules whose widths chain."""
  if len(modules) == 1:
    return modules
  orders = []
  for count, order in enumerate(itertools.permutations(modules)):
    if count > MAX_ORDERS:
      raise safe_io.fail(label, "too many recurrent modules to order")
    if all(a.hidden == b.input_width for a, b in zip(order, order[1:])):
      orders.append(list(order))
  if not orders:
    raise safe_io.fail(label, "the recurrent modules' widths do not chain: "
                       + ", ".join(f"{show(m.module)} {m.input_width} -> "
                                   f"{m.hidden}" for m in modules))
  if len(orders) > 1:
    raise safe_io.fail(label, "cannot tell the order of the recurrent modules "
                       f"({', '.join(show(m.module) for m in modules)}): more "
                       "than one order fits their widths")
  return orders[0]


def _embedding_and_dense(plain, modules, position, label):
  """Picks the Embedding and the Linear among the plain modules."""
  first_input = modules[0].input_width
  last_hidden = modules[-1].hidden
  for module, params in plain.items():
    weight = params.get("weight")
    where = show(module or "(top level)")
    if weight is None:
      raise safe_io.fail(label, f"module {where} has a bias but no weight")
    if len(weight[1].shape) != 2:
      raise safe_io.fail(label, f"{show(weight[0])} has shape "
                         f"{weight[1].shape}; found a module that is not an "
                         "Embedding or a Linear")
    if "bias" in params and params["bias"][1].shape != (weight[1].shape[0],):
      raise safe_io.fail(label, f"{show(params['bias'][0])} has shape "
                         f"{params['bias'][1].shape}, expected "
                         f"({weight[1].shape[0]},)")
  if len(plain) != 2:
    found = ", ".join(f"{show(m or '(top level)')} {p['weight'][1].shape}"
                      for m, p in plain.items()) or "none"
    raise safe_io.fail(label, "expected one Embedding and one Linear around "
                       f"the recurrent modules, found: {found}")
  fits = []
  for emb, dense in itertools.permutations(plain, 2):
    e, d = plain[emb], plain[dense]
    if "bias" in e:
      continue
    vocab, dim = e["weight"][1].shape
    rows, cols = d["weight"][1].shape
    if dim == first_input and cols == last_hidden and rows == vocab:
      fits.append((emb, dense))
  if not fits:
    found = ", ".join(f"{show(m or '(top level)')} {p['weight'][1].shape}"
                      for m, p in plain.items())
    raise safe_io.fail(label, f"the shapes do not chain into Embedding [V, "
                       f"{first_input}] -> recurrent -> Linear [V, "
                       f"{last_hidden}]: found {found}")
  if len(fits) > 1:
    fits = _break_tie(fits, modules, position, label)
  emb, dense = fits[0]
  return plain[emb], plain[dense]


def _break_tie(fits, modules, position, label):
  """Both matrices fit either role: module names decide, then file order."""
  def role(name):
    leaf = name.rsplit(".", 1)[-1].lower()
    if leaf in _EMBEDDING_NAMES:
      return "embedding"
    if leaf in _DENSE_NAMES:
      return "dense"
    return None
  by_name = [(e, d) for e, d in fits
             if role(e) != "dense" and role(d) != "embedding" and (
                 role(e) == "embedding" or role(d) == "dense")]
  if len(by_name) == 1:
    return by_name
  rnn = min(m.first for m in modules)
  by_order = [(e, d) for e, d in fits if position[e] < rnn < position[d]]
  if len(by_order) == 1:
    return by_order
  raise safe_io.fail(label, "cannot tell the Embedding from the Linear: both "
                     f"{show(fits[0][0])} and {show(fits[0][1])} fit either "
                     "role; name them like 'embed' and 'fc'")


def _recurrent_layer(name, kind: kinds.Kind, hidden, layer, label):
  """A Group of Keras-layout tensors and its LayerSpec for one layer."""
  key_ih, w_ih = layer["weight_ih"]
  key_hh, w_hh = layer["weight_hh"]
  width = kind.gates * hidden
  permutation = kind.torch_permutation()
  tensors = [
      contents_lib.Tensor(path=key_ih, shape=(w_ih.shape[1], width),
                          role="kernel", reader=_gate_reader(
                              w_ih, key_ih, permutation, hidden, label)),
      contents_lib.Tensor(path=key_hh, shape=(hidden, width),
                          role="recurrent_kernel", reader=_gate_reader(
                              w_hh, key_hh, permutation, hidden, label)),
  ]
  if "bias_ih" in layer:
    key_bi, b_ih = layer["bias_ih"]
    key_bh, b_hh = layer["bias_hh"]
    shape = kind.bias_shape(hidden, reset_after=True)
    tensors.append(contents_lib.Tensor(
        path=f"{key_bi} + {key_bh}" if kind.torch_bias == "sum"
        else f"[{key_bi}; {key_bh}]", shape=shape, role="bias",
        reader=_bias_reader(kind, b_ih, key_bi, b_hh, key_bh, permutation,
                            hidden, label)))
  spec = contents_lib.LayerSpec(
      kind.name, name, name, units=hidden, use_bias="bias_ih" in layer,
      reset_after=True if kind.has_reset_after else None)
  return contents_lib.Group(name=name, tensors=tensors), spec


def _permute(array: np.ndarray, permutation, hidden) -> np.ndarray:
  """Reorders the gate blocks of `array`'s first axis (rows of `hidden`)."""
  return np.concatenate([array[p * hidden:(p + 1) * hidden]
                         for p in permutation], axis=0)


def _plain_reader(tensor, key, label):
  return lambda: tensor.read(label, key)


def _transposed_reader(tensor, key, label):
  return lambda: np.ascontiguousarray(tensor.read(label, key).T)


def _gate_reader(tensor, key, permutation, hidden, label):
  return lambda: np.ascontiguousarray(
      _permute(tensor.read(label, key), permutation, hidden).T)


def _bias_reader(kind, b_ih, key_ih, b_hh, key_hh, permutation, hidden, label):
  def read():
    input_bias = _permute(b_ih.read(label, key_ih), permutation, hidden)
    recurrent_bias = _permute(b_hh.read(label, key_hh), permutation, hidden)
    if kind.torch_bias == "rows":
      return np.stack([input_bias, recurrent_bias])
    return input_bias + recurrent_bias
  return read


def _list_keys(tensors) -> str:
  keys = [f"{show(k, 40)} {v.shape}" for k, v in list(tensors.items())[:8]]
  return ", ".join(keys) + (" ..." if len(tensors) > 8 else "")


def reader_kind(path, head: bytes, size: int) -> Optional[str]:
  """'legacy' or 'safetensors' if a non-zip file is one, else None."""
  if torch_legacy.is_legacy(head):
    return "legacy"
  if safetensors_file.is_safetensors(head, size):
    return "safetensors"
  return None
