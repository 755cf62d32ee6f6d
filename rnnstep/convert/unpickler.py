"""A restricted unpickler: reads a pickle as data, and calls nothing the file
names.

`RestrictedUnpickler.find_class` resolves only the globals of an allow-list it
is given: {(module, name): a function that makes what stands for that global}.
`PLAIN_GLOBALS` is the part every reader needs (`collections.OrderedDict`,
`set` / `frozenset`, and the copyreg helpers that make an object without
`__init__`); `torch_pickle.GLOBALS` adds torch's storage classes and tensor
rebuild functions. The allow-list is a parameter so that another pickle
format can name its own.

Every other class or function a pickle names becomes an `InertRecord` class:
never imported, never called. A pickled object (`torch.save(model)`:
`GLOBAL model CharRNN`, `NEWOBJ`, `BUILD` with the module's `__dict__`) is
thereby read as a tree of records: the one construction honoured is the one
such a pickle uses, an object made without `__init__` (the NEWOBJ / OBJ
opcodes, `copyreg._reconstructor(cls, object, None)`, `copyreg.__newobj__`),
then given its attribute dict by BUILD, which the record only stores. Calling
a record's class any other way (a REDUCE of `os.system`, `builtins.eval`,
`torch.device`, ... wherever it sits: an attribute, a submodule, in place of a
parameter) is refused before anything runs.

`unpickle` turns every failure into one line: a refused call, or a corrupt
pickle, is a `safe_io.Refusal` (a ValueError) naming the file.
"""

import collections
import io
import pickle
import pickletools
import struct
from typing import Callable, Dict, Mapping, Tuple

from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show

MAX_CLASSES = 10_000  # Distinct classes and functions one pickle may name.

# What a pickle may be (besides plain data): errors while unpickling.
_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError,
                  KeyError, IndexError, AttributeError, OverflowError,
                  MemoryError, RecursionError, UnicodeDecodeError,
                  struct.error, ImportError)


class _Forbidden(Exception):
  """A pickle asked for something outside the allow-list."""

  def __init__(self, what: str):
    super().__init__(what)
    self.what = what


class _InertType(type):
  """The metaclass of the records: calling a record's class is refused.

  A REDUCE, INST or OBJ with arguments calls the class; the constructions a
  module pickle uses (NEWOBJ; OBJ / INST without arguments; the copyreg
  helpers in `PLAIN_GLOBALS`) call `__new__` only, which makes an empty
  record.
  """

  def __call__(cls, *args, **kwargs):
    raise _Forbidden(cls.qualified_name)


class InertRecord(metaclass=_InertType):
  """An object of a class the pickle names (an nn.Module, the user's own
  class, anything else), made without importing or running that class.

  Attributes:
    qualified_name: the class the pickle names, e.g. 'model.CharRNN' (a class
      attribute of the record's class).
    state: what BUILD gave it (a module's attribute dict), or None.
  """
  __slots__ = ("state",)
  qualified_name = "?"

  def __new__(cls, *args):
    del args  # NEWOBJ arguments (a module pickle has none); not kept.
    record = object.__new__(cls)
    record.state = None
    return record

  def __setstate__(self, state):  # BUILD stores the state, nothing else.
    if self.state is not None:
      raise pickle.UnpicklingError("a pickle set an object's state twice")
    if state is None:
      raise pickle.UnpicklingError("a pickle gave an object no state")
    self.state = state

  def __repr__(self):
    return f"<inert {self.qualified_name}>"


def _inert_class(qualified_name: str) -> type:
  """A new record class standing for the class or function the pickle names."""
  return _InertType("InertRecord", (InertRecord,), {
      "__slots__": (), "qualified_name": qualified_name})


def is_record_class(value) -> bool:
  """Whether `value` is a record class (what a pickle's GLOBAL outside the
  allow-list gives), not a record or anything else."""
  return isinstance(value, type) and issubclass(value, InertRecord)


def _new_record(cls):
  """An empty record of a record class (a module made without __init__)."""
  if not is_record_class(cls):
    raise _Forbidden("copyreg reconstruction of something that is not a class")
  return cls.__new__(cls)


# What an allow-list maps each (module, name) to: a function of the unpickler
# (its `label` and `record_class`) returning what the pickle gets for it.
AllowList = Mapping[Tuple[str, str], Callable[["RestrictedUnpickler"], object]]


def _reconstructor(unpickler: "RestrictedUnpickler"):
  """Stands for `copyreg._reconstructor`: an object made without __init__."""
  object_class = unpickler.record_class("builtins.object")

  def reconstructor(cls, base, state):
    # copyreg's own would run base.__init__(obj, state) for a state.
    if base is not object_class or state is not None:
      raise _Forbidden("copyreg._reconstructor with a base class other "
                       "than object")
    return _new_record(cls)
  return reconstructor


PLAIN_GLOBALS: AllowList = {
    ("collections", "OrderedDict"): lambda unpickler: collections.OrderedDict,
    # Protocol 2 pickles a set (nn.Module's _non_persistent_buffers_set) as a
    # call of set on a list: building a set from data runs nothing of the file.
    ("builtins", "set"): lambda unpickler: set,
    ("builtins", "frozenset"): lambda unpickler: frozenset,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("copyreg", "__newobj__"): lambda unpickler: (
        lambda cls, *args: _new_record(cls)),
}


class RestrictedUnpickler(pickle.Unpickler):
  """Rebuilds plain data and the allow-list's objects, and any other object
  as an inert record; calls nothing that the file names.

  Args:
    file: the pickle stream.
    label: the file, for messages.
    allowed: the allow-list (see `AllowList`; e.g. `PLAIN_GLOBALS`).
    persistent_load: what a persistent id (PERSID / BINPERSID) stands for:
      `persistent_load(pid)` -> object; it refuses what it does not expect.

  Attributes:
    label: the file, for messages (what the allow-list's functions name).
  """

  def __init__(self, file, label, allowed: AllowList,
               persistent_load: Callable[[object], object]):
    super().__init__(file)
    self.label = label
    self._allowed = allowed
    self._persistent_load = persistent_load
    self._classes: Dict[str, type] = {}

  def record_class(self, qualified_name: str) -> type:
    """The record class for a qualified name (one per name and pickle).

    Raises:
      ValueError: the pickle names more than `MAX_CLASSES` classes.
    """
    known = self._classes.get(qualified_name)
    if known is None:
      if len(self._classes) >= MAX_CLASSES:
        raise safe_io.fail(self.label, "the pickle names too many classes")
      known = self._classes[qualified_name] = _inert_class(qualified_name)
    return known

  def find_class(self, module, name):
    # Protocols 0-2 name Python 2's modules (a subclass sees them unmapped).
    module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module,
                                                                    module)
    make = self._allowed.get((module, name))
    if make is not None:
      return make(self)
    return self.record_class(f"{module}.{name}")

  def persistent_load(self, pid):
    return self._persistent_load(pid)


# The opcodes that store into the memo at an index the pickle names.
_MEMO_PUTS = frozenset(("PUT", "BINPUT", "LONG_BINPUT"))


def check_memo_indices(data: bytes, label) -> None:
  """Refuses a pickle whose memo index is past its own opcode count.

  Python's unpickler sizes its memo table for the largest index a PUT names,
  so a 10-byte pickle naming index 2**31 makes it allocate ~16 GiB before any
  object exists. A pickler numbers memo entries 0, 1, 2, ... (one opcode
  each), so a real pickle never names an index as large as its count of
  opcodes; the scan reads opcodes only, and runs nothing.

  Args:
    data: one pickle.
    label: the file, for messages.

  Raises:
    ValueError: a memo index out of that range, in one line.
  """
  try:
    for count, (opcode, argument, _) in enumerate(
        pickletools.genops(io.BytesIO(data))):
      if opcode.name in _MEMO_PUTS and int(argument) > count:
        raise safe_io.fail(label, f"the pickle names memo entry {argument} "
                           f"after {count} opcodes; the file is corrupt "
                           "(refused before unpickling)")
  except safe_io.Refusal:
    raise
  except _PICKLE_ERRORS:
    return  # Corrupt past this point: the unpickler says so in its words.


def unpickle(data: bytes, label, allowed: AllowList,
             persistent_load: Callable[[object], object]):
  """Unpickles `data` through the restricted unpickler; one-line errors.

  Args:
    data: one pickle.
    label: the file, for messages.
    allowed, persistent_load: see `RestrictedUnpickler`.

  Returns:
    The object: plain data, the allow-list's objects, inert records.

  Raises:
    ValueError: the pickle asks to call something (refused before it runs),
      or is corrupt; or what the allow-list's functions or `persistent_load`
      refuse.
  """
  check_memo_indices(data, label)
  try:
    return RestrictedUnpickler(io.BytesIO(data), label, allowed,
                               persistent_load).load()
  except _Forbidden as e:
    raise safe_io.fail(label, f"the pickle asks to call {show(e.what)}, which "
                       "is not a tensor, a dict or a module's attributes; "
                       "rnnstep never runs code from a file (refused)"
                       ) from None
  except safe_io.Refusal:
    raise
  except _PICKLE_ERRORS as e:
    text = " ".join(str(e).split())[:200] or type(e).__name__
    raise safe_io.fail(label, f"the pickle is corrupt or not a state dict "
                       f"({type(e).__name__}: {text})") from None
