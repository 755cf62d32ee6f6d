"""The state dict in what a `torch.save` file holds: a dict of tensors, a
checkpoint dict holding one, or a whole pickled module read as records.

A whole module (`torch.save(model)`) comes out of the restricted unpickler as
a tree of `unpickler.InertRecord`s, each holding the attribute dict that BUILD
gave it; `module_tensors` walks the records' `_parameters`, `_buffers` and
`_modules` dicts and names the tensors as `state_dict()` would. No tensor's
data is read here: only what the file declares.

Every refusal is a `safe_io.Refusal` (a ValueError) naming the file.
"""

import collections
import dataclasses
from typing import Dict

from rnnstep.convert import safe_io
from rnnstep.convert import stored_tensors
from rnnstep.convert import unpickler
from rnnstep.convert.safe_io import show
from rnnstep.convert.stored_tensors import StoredTensor
from rnnstep.convert.unpickler import InertRecord

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net")


@dataclasses.dataclass
class StateDict:
  """The tensors of a state dict, in file order, and where they were found.

  Attributes:
    tensors: {name: tensor}, named as `state_dict()` names them.
    notes: things worth knowing (where the state dict was found).
    source: 'state dict', or "whole module 'model.CharRNN'".
    nonlinearities: a whole module's `nn.RNN` modules' `nonlinearity`
      ('tanh' or 'relu'), by module path as the keys name it ('rnn'; '' at
      the top); a state dict alone does not say.
  """
  tensors: Dict[str, StoredTensor]
  notes: list
  source: str = "state dict"
  nonlinearities: Dict[str, str] = dataclasses.field(default_factory=dict)


MAX_MODULE_DEPTH = 64


def find_state_dict(obj, label) -> StateDict:
  """The state dict in what a file holds: the object itself, a pickled module
  (read as records), or a checkpoint dict's 'state_dict' / 'model_state_dict'
  / 'model' / ... entry holding either.

  Args:
    obj: what `torch_zip.read_zip` or `torch_legacy.read_legacy` read.
    label: the file, for messages.

  Returns:
    The tensors, with notes saying where they were found.

  Raises:
    ValueError: no dict of tensors or module there.
  """
  if isinstance(obj, StoredTensor):
    raise safe_io.fail(label, "holds a single tensor, not a state dict")
  if isinstance(obj, InertRecord):
    return module_tensors(obj, label)
  if not isinstance(obj, dict):
    raise safe_io.fail(label, f"holds a {type(obj).__name__}, not a state dict "
                       "(a dict of tensors)")
  notes = []
  if not any(isinstance(v, StoredTensor) for v in obj.values()):
    found = [k for k in STATE_DICT_KEYS if _is_module(obj.get(k)) or (
        isinstance(obj.get(k), dict) and any(
            isinstance(v, StoredTensor) for v in obj[k].values()))]
    if not found:
      keys = ", ".join(show(k, 30) for k in list(obj)[:8]) or "nothing"
      raise safe_io.fail(label, f"holds no tensors (a dict of {keys}); expected "
                         "a state dict (torch.save(model.state_dict(), PATH)) "
                         "or a whole module (torch.save(model, PATH))")
    note = f"read the {{}} under the key {show(found[0])}"
    if _is_module(obj[found[0]]):
      state = module_tensors(obj[found[0]], label)
      state.notes.insert(0, note.format(state.source))
      return state
    notes.append(note.format("state dict"))
    obj = obj[found[0]]
  tensors = collections.OrderedDict()
  skipped = 0
  for key, value in obj.items():
    if not isinstance(key, str):
      raise safe_io.fail(label, f"the state dict has a non-string key "
                         f"{show(key)}")
    if isinstance(value, StoredTensor):
      tensors[key] = value
    else:
      skipped += 1
  if skipped:
    notes.append(f"ignored {skipped} entries that are not tensors")
  return StateDict(tensors, notes)


def _is_module(value) -> bool:
  """Whether a record looks like an nn.Module (its state has _modules and
  _parameters dicts)."""
  return (isinstance(value, InertRecord) and isinstance(value.state, dict)
          and isinstance(value.state.get("_parameters"), dict)
          and isinstance(value.state.get("_modules"), dict))


def module_tensors(root: InertRecord, label) -> StateDict:
  """The tensors of a pickled nn.Module tree, named as `state_dict()` names
  them: each module's parameters, then its persistent buffers, then its
  submodules' (depth first), under the `_modules` path joined by dots
  (`encoder.weight`, `rnn.weight_ih_l0`, `layers.0.bias`).

  Args:
    root: the top-level module's record.
    label: the file, for messages.

  Returns:
    The tensors, with a note that the module was read as data.

  Raises:
    ValueError: the record is not a module, or a parameter, buffer or
      submodule is something other than a tensor / module (or None).
  """
  if not _is_module(root):
    raise safe_io.fail(label, f"holds a pickled {show(root.qualified_name)} "
                       "that is not an nn.Module (no _parameters and _modules "
                       "in its attributes)")
  tensors = collections.OrderedDict()
  nonlinearities = {}
  visiting = set()

  def walk(record, prefix, depth):
    path = show(prefix[:-1] or "(top level)")
    if not _is_module(record):
      raise safe_io.fail(label, f"module {path} is {_describe(record)}, not an "
                         "nn.Module (no _parameters and _modules in its "
                         "attributes)")
    where = f"module {path} ({show(record.qualified_name)})"
    if depth > MAX_MODULE_DEPTH or id(record) in visiting:
      raise safe_io.fail(label, f"{where}: modules nested too deeply or in a "
                         "cycle")
    visiting.add(id(record))
    state = record.state
    # The keys of nn.RNN(nonlinearity='relu') are a tanh one's: only the
    # attribute tells them apart.
    if record.qualified_name.rsplit(".", 1)[-1] == "RNN":
      nonlinearity = state.get("nonlinearity", "tanh")
      if nonlinearity not in ("tanh", "relu"):
        raise safe_io.fail(label, f"{where} is an nn.RNN with nonlinearity="
                           f"{show(nonlinearity)}; PyTorch's are 'tanh' and "
                           "'relu'")
      nonlinearities[prefix[:-1]] = nonlinearity
    buffers = state.get("_buffers", {})
    skip = state.get("_non_persistent_buffers_set", set())
    if not isinstance(buffers, dict) or not isinstance(skip, (set, frozenset)):
      raise safe_io.fail(label, f"{where} has unreadable _buffers")
    for kind, entries in (("parameter", state["_parameters"]),
                          ("buffer", buffers)):
      for name, value in entries.items():
        if not isinstance(name, str):
          raise safe_io.fail(label, f"{where} has a {kind} named {show(name)}")
        if value is None or (kind == "buffer" and name in skip):
          continue
        if not isinstance(value, StoredTensor):
          raise safe_io.fail(label, f"{kind} {show(prefix + name)} of {where} "
                             f"is {_describe(value)}, not a tensor")
        if len(tensors) >= stored_tensors.MAX_STORAGES:
          raise safe_io.fail(label, "the module holds too many tensors")
        tensors[prefix + name] = value
    for name, child in state["_modules"].items():
      if not isinstance(name, str):
        raise safe_io.fail(label, f"{where} has a submodule named {show(name)}")
      if child is not None:
        walk(child, f"{prefix}{name}.", depth + 1)
    visiting.discard(id(record))

  walk(root, "", 0)
  source = f"whole module {show(root.qualified_name)}"
  return StateDict(tensors, nonlinearities=nonlinearities, notes=[
      f"read the pickled module {show(root.qualified_name)} as data: the "
      "classes it names were neither imported nor run; its tensors are named "
      "as state_dict() names them"], source=source)


def _describe(value) -> str:
  """What a value in a module's attributes is, for a message."""
  if isinstance(value, InertRecord):
    return f"a {show(value.qualified_name)} object"
  if unpickler.is_record_class(value):
    return f"the class or function {show(value.qualified_name)}"
  return f"a {type(value).__name__}"
