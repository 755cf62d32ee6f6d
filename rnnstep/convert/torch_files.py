"""PyTorch weight files read as data, without torch and without running code.

Formats:
  - `torch.save` zip archives (`.pt`, `.pth`, `.bin`; torch >= 1.6): a member
    `<root>/data.pkl` (the pickled object) and one member `<root>/data/<key>`
    per storage (raw bytes; `<root>/byteorder` says their byte order);
  - legacy `torch.save(..., _use_new_zipfile_serialization=False)` files:
    pickles in a row (magic number, protocol version, system info, the object,
    the storage keys), then each storage as an int64 element count and raw
    bytes;
  - `.safetensors`: an 8-byte little-endian header length, a JSON header
    `{name: {"dtype", "shape", "data_offsets": [begin, end]}}`, raw data.
  The older tar format of torch < 1.6's predecessors (0.1.x) is refused.

The pickle is read by `_RestrictedUnpickler`. Its `find_class` knows
`collections.OrderedDict`, `set` / `frozenset`, the storage classes
(`torch.FloatStorage`, ...) and torch's tensor rebuild functions
(`torch._utils._rebuild_tensor_v2`, `_rebuild_tensor`, `_rebuild_parameter`,
`_rebuild_parameter_with_state`), each replaced by our own code that records
what the tensor is (storage key, dtype, offset, size, stride) and checks it
against the storage; `persistent_load` accepts only storage records (and, in
the legacy format, the records that name a pickled module's class).

Every other class or function a pickle names becomes an `InertRecord` class:
never imported, never called. A whole pickled module (`torch.save(model)`:
`GLOBAL model CharRNN`, `NEWOBJ`, `BUILD` with the module's `__dict__`) is
thereby read as a tree of records: the one construction honoured is the one
such a pickle uses, an object made without `__init__` (the NEWOBJ / OBJ
opcodes, `copyreg._reconstructor(cls, object, None)`, `copyreg.__newobj__`),
then given its attribute dict by BUILD, which the record only stores. Calling
a record's class any other way (a REDUCE of `os.system`, `builtins.eval`,
`torch.device`, ... wherever it sits: an attribute, a submodule, in place of a
parameter) is refused before anything runs (`_Forbidden`). `module_tensors`
then walks the records' `_parameters`, `_buffers` and `_modules` dicts and
names the tensors as `state_dict()` would. Storages are read later, by name,
after their sizes are checked.

Every refusal is a `safe_io.Refusal` (a ValueError) naming the file.
"""

import collections
import dataclasses
import io
import json
import os
import pickle
import pickletools
import re
import struct
from typing import Callable, Dict, Tuple

import numpy as np

from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show

MAX_PICKLE_BYTES = 64 << 20
MAX_SAFETENSORS_HEADER = 100_000_000  # The safetensors library's own limit.
MAX_NDIM = 8
MAX_STORAGES = 100_000

# The legacy format starts with a pickled magic number (PROTO 2, LONG1 10).
LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
LEGACY_PROTOCOL = 1001
LEGACY_HEADER = b"\x80\x02\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")

# Each element type once: its numpy type code (read little-endian; bfloat16 as
# raw uint16) and its size in bytes.
_ELEMENTS = {
    "float32": ("f4", 4), "float64": ("f8", 8), "float16": ("f2", 2),
    "bfloat16": ("u2", 2), "int64": ("i8", 8), "int32": ("i4", 4),
    "int16": ("i2", 2), "int8": ("i1", 1), "uint8": ("u1", 1),
    "bool": ("u1", 1),
}


def _named(names):
  """{file's name: (dtype, code, itemsize)} for {file's name: dtype}."""
  return {name: (dtype, *_ELEMENTS[dtype]) for name, dtype in names.items()}


# The same element types by torch's storage class names and safetensors' names.
_STORAGES = _named({
    "FloatStorage": "float32", "DoubleStorage": "float64",
    "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
    "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
})
_SAFETENSORS_DTYPES = _named({
    "F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U8": "uint8", "BOOL": "bool",
})
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
_KEY = re.compile(r"[0-9A-Za-z_.-]{1,64}")

# What a pickle may be (besides plain data): errors while unpickling.
_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError,
                  KeyError, IndexError, AttributeError, OverflowError,
                  MemoryError, RecursionError, UnicodeDecodeError,
                  struct.error, ImportError)


# ------------------------------------------------------------------- tensors


class Storage:
  """One storage: `numel` elements of one dtype, read on demand.

  Attributes:
    key: its name in the file.
    dtype: 'float32', 'bfloat16', ... (see `_STORAGES`).
    numel: its size in elements.
  """
  __slots__ = ("key", "dtype", "code", "itemsize", "numel", "_reader",
               "_array", "_order")

  def __init__(self, key, dtype, code, itemsize, numel, reader, order="<"):
    self.key = key
    self.dtype = dtype
    self.code = code
    self.itemsize = itemsize
    self.numel = numel
    self._reader = reader
    self._array = None
    self._order = order

  def __setstate__(self, state):  # A pickle's BUILD must not alter us.
    raise pickle.UnpicklingError("a pickle tried to modify a storage")

  def array(self, label) -> np.ndarray:
    """The storage's elements, 1-D (read once)."""
    if self._array is None:
      if self._reader is None:
        raise safe_io.fail(label, f"storage {show(self.key)} has no data in "
                           "the file")
      data = self._reader()
      if len(data) != self.numel * self.itemsize:
        raise safe_io.fail(label, f"storage {show(self.key)} holds {len(data)} "
                           f"bytes, expected {self.numel * self.itemsize}")
      self._array = np.frombuffer(data, self._order + self.code)
    return self._array


class StoredTensor:
  """A tensor as the file describes it: a strided view of a storage."""
  __slots__ = ("storage", "offset", "shape", "strides")

  def __init__(self, storage: Storage, offset: int, shape, strides):
    self.storage = storage
    self.offset = offset
    self.shape = tuple(shape)
    self.strides = tuple(strides)

  def __setstate__(self, state):
    raise pickle.UnpicklingError("a pickle tried to modify a tensor")

  @property
  def dtype(self) -> str:
    return self.storage.dtype

  def read(self, label, name) -> np.ndarray:
    """The tensor's values as a new float32 array (bfloat16, float16 and
    float64 are converted exactly / rounded to float32)."""
    if self.dtype not in FLOAT_DTYPES:
      raise safe_io.fail(label, f"tensor {show(name)} has dtype {self.dtype}, "
                         "expected float weights")
    flat = self.storage.array(label)
    if not self.shape or min(self.shape) > 0:
      # Checked when the tensor was built; checked again against the data.
      last = self.offset + sum((n - 1) * s for n, s in zip(self.shape,
                                                           self.strides))
      if last >= flat.size:
        raise safe_io.fail(label, f"tensor {show(name)} reaches past the end "
                           "of its storage")
    view = np.lib.stride_tricks.as_strided(
        flat[self.offset:], shape=self.shape,
        strides=[s * flat.itemsize for s in self.strides], writeable=False)
    if self.dtype == "bfloat16":  # The upper half of a float32.
      return (view.astype(np.uint32) << 16).view(np.float32)
    return view.astype(np.float32)


def _check_view(storage, offset, shape, strides, label) -> StoredTensor:
  """Builds a StoredTensor after checking the view stays inside the storage."""
  limit = None
  if isinstance(storage, _View):  # Legacy format: a slice of a root storage.
    if type(offset) is int and offset >= 0:  # pylint: disable=unidiomatic-typecheck
      limit = storage.offset + storage.numel
      offset += storage.offset
    storage = storage.root
  if not isinstance(storage, Storage):
    raise safe_io.fail(label, "a tensor in the pickle has no storage record")
  for what, values in (("size", shape), ("stride", strides)):
    if not isinstance(values, (tuple, list)) or len(values) > MAX_NDIM or not all(
        type(v) is int and v >= 0 for v in values):  # pylint: disable=unidiomatic-typecheck
      raise safe_io.fail(label, f"a tensor has an invalid {what} "
                         f"{show(values)}")
  if type(offset) is not int or offset < 0 or len(shape) != len(strides):  # pylint: disable=unidiomatic-typecheck
    raise safe_io.fail(label, "a tensor has an invalid offset or stride")
  if all(n > 0 for n in shape):
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
    if last >= (storage.numel if limit is None else limit):
      raise safe_io.fail(label, f"a tensor of shape {tuple(shape)} (offset "
                         f"{offset}, strides {tuple(strides)}) reaches past "
                         f"the end of storage {show(storage.key)} of "
                         f"{storage.numel} elements")
  declared = int(np.prod(shape, dtype=object)) * storage.itemsize
  if declared > safe_io.MAX_DECLARED_BYTES:
    raise safe_io.fail(label, f"a tensor declares shape {tuple(shape)}, more "
                       "than 4 GiB")
  return StoredTensor(storage, offset, shape, strides)


# ----------------------------------------------------------------- unpickler


class _Forbidden(Exception):
  """A pickle asked for something outside the allow-list."""

  def __init__(self, what: str):
    super().__init__(what)
    self.what = what


class _StorageType:
  """Stands for `torch.FloatStorage` etc. in a pickle: only its dtype."""
  __slots__ = ("name",)

  def __init__(self, name):
    self.name = name

  def __setstate__(self, state):
    raise pickle.UnpicklingError("a pickle tried to modify a storage type")


MAX_CLASSES = 10_000  # Distinct classes and functions one pickle may name.


class _InertType(type):
  """The metaclass of the records: calling a record's class is refused.

  A REDUCE, INST or OBJ with arguments calls the class; the constructions a
  module pickle uses (NEWOBJ; OBJ / INST without arguments; the copyreg
  helpers below) call `__new__` only, which makes an empty record.
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


class _RestrictedUnpickler(pickle.Unpickler):
  """Rebuilds dicts of tensors, and modules as inert records; calls nothing
  that the file names.

  Args:
    file: the pickle stream.
    label: the file, for messages.
    storage: `storage(key, storage_type, numel, view)` -> Storage, called for
      each storage record (see the format readers).
  """

  def __init__(self, file, label, storage: Callable):
    super().__init__(file)
    self._label = label
    self._storage = storage
    self._classes: Dict[str, type] = {}

  def _record_class(self, qualified_name: str) -> type:
    known = self._classes.get(qualified_name)
    if known is None:
      if len(self._classes) >= MAX_CLASSES:
        raise safe_io.fail(self._label, "the pickle names too many classes")
      known = self._classes[qualified_name] = _inert_class(qualified_name)
    return known

  def find_class(self, module, name):
    label = self._label
    # Protocols 0-2 name Python 2's modules (a subclass sees them unmapped).
    module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module,
                                                                    module)
    if module == "collections" and name == "OrderedDict":
      return collections.OrderedDict
    # Protocol 2 pickles a set (nn.Module's _non_persistent_buffers_set) as a
    # call of set on a list: building a set from data runs nothing of the file.
    if module == "builtins" and name in ("set", "frozenset"):
      return set if name == "set" else frozenset
    if module == "torch" and name in _STORAGES:
      return _StorageType(name)
    if module == "torch._utils" and name == "_rebuild_tensor_v2":
      def rebuild_v2(storage, offset, size, stride, requires_grad=False,
                     backward_hooks=None, metadata=None):
        del requires_grad, backward_hooks, metadata  # Irrelevant to values.
        return _check_view(storage, offset, size, stride, label)
      return rebuild_v2
    if module == "torch._utils" and name == "_rebuild_tensor":
      def rebuild(storage, offset, size, stride):
        return _check_view(storage, offset, size, stride, label)
      return rebuild
    if module == "torch._utils" and name in ("_rebuild_parameter",
                                             "_rebuild_parameter_with_state"):
      def rebuild_parameter(data, requires_grad=False, backward_hooks=None,
                            state=None):
        del requires_grad, backward_hooks, state  # A Parameter's extras.
        if not isinstance(data, StoredTensor):
          raise safe_io.fail(label, "a parameter in the pickle holds no tensor")
        return data
      return rebuild_parameter
    if module == "copyreg" and name == "_reconstructor":
      object_class = self._record_class("builtins.object")
      def reconstructor(cls, base, state):
        # copyreg's own would run base.__init__(obj, state) for a state.
        if base is not object_class or state is not None:
          raise _Forbidden("copyreg._reconstructor with a base class other "
                           "than object")
        return _new_record(cls)
      return reconstructor
    if module == "copyreg" and name == "__newobj__":
      return lambda cls, *args: _new_record(cls)
    return self._record_class(f"{module}.{name}")

  def persistent_load(self, pid):
    if not isinstance(pid, tuple) or not pid:
      raise safe_io.fail(self._label, "the pickle holds an unknown persistent "
                         "record")
    kind = pid[0]
    if isinstance(kind, bytes):
      kind = kind.decode("ascii", "replace")
    if kind == "module":
      # The legacy format names each nn.Module class as ('module', class,
      # source file, source): keep the class (a record class), not the source.
      if len(pid) != 4 or not _is_record_class(pid[1]):
        raise safe_io.fail(self._label, "the pickle holds an invalid module "
                           "record")
      return pid[1]
    if kind != "storage" or len(pid) not in (5, 6):
      raise safe_io.fail(self._label, f"the pickle holds an unknown persistent "
                         f"record {show(kind)}")
    storage_type, key, _, numel = pid[1:5]
    view = pid[5] if len(pid) == 6 else None
    if not isinstance(storage_type, _StorageType):
      raise safe_io.fail(self._label, "a storage record names no storage type")
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key in (".", ".."):
      raise safe_io.fail(self._label, f"a storage record has the invalid key "
                         f"{show(key)}")
    if type(numel) is not int or numel < 0:  # pylint: disable=unidiomatic-typecheck
      raise safe_io.fail(self._label, f"storage {show(key)} has the invalid "
                         f"size {show(numel)}")
    return self._storage(key, storage_type.name, numel, view)


def _is_record_class(value) -> bool:
  return isinstance(value, type) and issubclass(value, InertRecord)


def _new_record(cls):
  """An empty record of a record class (a module made without __init__)."""
  if not _is_record_class(cls):
    raise _Forbidden("copyreg reconstruction of something that is not a class")
  return cls.__new__(cls)


def _unpickle(data: bytes, label, storage: Callable):
  """Unpickles `data` through the restricted unpickler; one-line errors."""
  try:
    return _RestrictedUnpickler(io.BytesIO(data), label, storage).load()
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


def _storage_info(name, label):
  if name not in _STORAGES:
    raise safe_io.fail(label, f"unknown storage type {show(name)}")
  return _STORAGES[name]


# ----------------------------------------------------------------- zip format


def is_torch_zip(names) -> bool:
  return any(n.endswith("/data.pkl") and n.count("/") == 1 for n in names)


def read_zip(path) -> Tuple[object, str, Callable[[], None]]:
  """Reads a `torch.save` zip archive's object (tensors not read yet).

  Returns:
    (the object, a format description, a function that closes the archive).
  """
  label = os.fspath(path)
  archive = safe_io.open_zip(path)
  try:
    names = safe_io.member_names(archive)
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
      raise safe_io.fail(label, f"a torch.save archive must hold one data.pkl, "
                         f"found {len(pickles)}")
    root = pickles[0][:-len("data.pkl")]
    order = "<"
    if f"{root}byteorder" in names:
      byteorder = safe_io.read_member(archive, f"{root}byteorder", 16, label)
      if byteorder not in (b"little", b"big"):
        raise safe_io.fail(label, f"unknown byteorder {show(byteorder)}")
      order = "<" if byteorder == b"little" else ">"
    infos = {}
    for info in archive.infolist():
      infos.setdefault(info.filename, []).append(info)
    data = safe_io.read_member(archive, pickles[0], MAX_PICKLE_BYTES, label)
    storages: Dict[str, Storage] = {}

    def storage(key, type_name, numel, view):
      if view is not None:
        raise safe_io.fail(label, "a storage view record in a zip archive")
      dtype, code, itemsize = _storage_info(type_name, label)
      member = f"{root}data/{key}"
      known = storages.get(key)
      if known is not None:
        if (known.dtype, known.numel) != (dtype, numel):
          raise safe_io.fail(label, f"storage {show(key)} is declared twice "
                             "with different types or sizes")
        return known
      found = infos.get(member, [])
      if len(found) != 1:
        raise safe_io.fail(label, f"storage {show(key)}: the archive holds "
                           f"{len(found)} members named {show(member)}")
      nbytes = numel * itemsize
      if found[0].file_size != nbytes:
        raise safe_io.fail(label, f"storage {show(key)} declares {numel} "
                           f"{dtype} elements ({nbytes} bytes) but its member "
                           f"holds {found[0].file_size} bytes")
      if len(storages) >= MAX_STORAGES:
        raise safe_io.fail(label, "too many storages")
      reader = lambda: safe_io.read_member(archive, member, nbytes, label)
      storages[key] = Storage(key, dtype, code, itemsize, numel, reader, order)
      return storages[key]

    obj = _unpickle(data, label, storage)
  except BaseException:
    archive.close()
    raise
  return obj, "torch.save zip archive", archive.close


# -------------------------------------------------------------- legacy format


def is_legacy(head: bytes) -> bool:
  return head.startswith(LEGACY_HEADER)


def is_tar(path) -> bool:
  with open(path, "rb") as f:
    f.seek(257)
    return f.read(5) == b"ustar"


def read_legacy(path) -> Tuple[object, str, Callable[[], None]]:
  """Reads a legacy (non-zip) `torch.save` file's object (tensors not read)."""
  label = os.fspath(path)
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(min(size, MAX_PICKLE_BYTES))
  stream = io.BytesIO(head)
  no_storage = lambda *args: _raise(safe_io.fail(
      label, "a storage record outside the object pickle"))

  def load():
    start = stream.tell()
    ops_end = _pickle_end(head, start, label)
    stream.seek(ops_end)
    return _unpickle(head[start:ops_end], label, no_storage)

  magic, protocol, info = load(), load(), load()
  if magic != LEGACY_MAGIC or protocol != LEGACY_PROTOCOL:
    raise safe_io.fail(label, "not a torch.save file (bad magic number or "
                       "protocol version)")
  little = info.get("little_endian") if isinstance(info, dict) else None
  if not isinstance(little, bool):
    raise safe_io.fail(label, "the file's system info is missing or corrupt")
  order = "<" if little else ">"
  storages: Dict[str, Storage] = {}

  def storage(key, type_name, numel, view):
    dtype, code, itemsize = _storage_info(type_name, label)
    root = storages.get(key)
    if root is None:
      if len(storages) >= MAX_STORAGES:
        raise safe_io.fail(label, "too many storages")
      root = storages[key] = Storage(key, dtype, code, itemsize, numel, None,
                                     order)
    elif (root.dtype, root.numel) != (dtype, numel):
      raise safe_io.fail(label, f"storage {show(key)} is declared twice with "
                         "different types or sizes")
    if view is None:
      return root
    # An old storage view: (view key, offset, size) elements of the root.
    if (not isinstance(view, tuple) or len(view) != 3
        or not isinstance(view[0], str) or not all(
            type(v) is int and v >= 0 for v in view[1:])  # pylint: disable=unidiomatic-typecheck
        or view[1] + view[2] > numel):
      raise safe_io.fail(label, f"storage {show(key)} has an invalid view")
    return _View(root, view[1], view[2])

  start = stream.tell()
  end = _pickle_end(head, start, label)
  obj = _unpickle(head[start:end], label, storage)
  stream.seek(end)
  keys = load()
  if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
    raise safe_io.fail(label, "the storage key list is missing or corrupt")
  offset = stream.tell()
  for key in keys:
    root = storages.get(key)
    if root is None:
      raise safe_io.fail(label, f"data for unknown storage {show(key)}")
    if offset + 8 > size:
      raise safe_io.fail(label, "the file is truncated (storage data missing)")
    with open(path, "rb") as f:
      f.seek(offset)
      (count,) = struct.unpack(order + "q", f.read(8))
    nbytes = root.numel * root.itemsize
    if count != root.numel or offset + 8 + nbytes > size:
      raise safe_io.fail(label, f"storage {show(key)} declares {root.numel} "
                         f"elements but the file holds {count} (or less data); "
                         "truncated or forged")
    root._reader = _file_reader(path, offset + 8, nbytes, label)  # pylint: disable=protected-access
    offset += 8 + nbytes
  return obj, "legacy torch.save file", lambda: None


class _View:
  """An old-format storage view, resolved to its root when tensors are made."""
  __slots__ = ("root", "offset", "numel")

  def __init__(self, root, offset, numel):
    self.root, self.offset, self.numel = root, offset, numel

  def __setstate__(self, state):
    raise pickle.UnpicklingError("a pickle tried to modify a storage view")


def _pickle_end(data: bytes, start: int, label) -> int:
  """The offset just past the pickle starting at `start` (read, not run)."""
  try:
    for op, _, position in pickletools.genops(io.BytesIO(data[start:])):
      if op.name == "STOP":
        return start + position + 1
  except Exception as e:  # pylint: disable=broad-except  (corrupt)
    text = " ".join(str(e).split())[:200]
    raise safe_io.fail(label, f"a corrupt pickle in the file ({text})") from None
  raise safe_io.fail(label, "a pickle in the file has no end (truncated)")


def _file_reader(path, offset, nbytes, label):
  def read():
    with open(path, "rb") as f:
      f.seek(offset)
      data = f.read(nbytes)
    if len(data) != nbytes:
      raise safe_io.fail(label, "the file is truncated (storage data missing)")
    return data
  return read


def _raise(error):
  raise error


# --------------------------------------------------------------- safetensors


def is_safetensors(head: bytes, size: int) -> bool:
  if len(head) < 9 or size < 10:
    return False
  (length,) = struct.unpack("<Q", head[:8])
  return 2 <= length <= size - 8 and head[8:9] == b"{"


def read_safetensors(path) -> Tuple[Dict[str, StoredTensor], str,
                                    Callable[[], None]]:
  """Reads a `.safetensors` header into {name: StoredTensor} (data later)."""
  label = os.fspath(path)
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    if length > MAX_SAFETENSORS_HEADER or 8 + length > size:
      raise safe_io.fail(label, f"safetensors header of {length} bytes does not "
                         f"fit the file of {size} bytes")
    header = f.read(length)
  try:
    meta = json.loads(header.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
    text = " ".join(str(e).split())[:200]
    raise safe_io.fail(label, f"the safetensors header is not JSON ({text})"
                       ) from None
  if not isinstance(meta, dict):
    raise safe_io.fail(label, "the safetensors header is not a JSON object")
  data_start = 8 + length
  data_size = size - data_start
  out = collections.OrderedDict()
  for name, entry in meta.items():
    if name == "__metadata__":
      continue
    where = f"safetensors entry {show(name)}"
    if not isinstance(entry, dict):
      raise safe_io.fail(label, f"{where} is not a JSON object")
    dtype_name = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if dtype_name not in _SAFETENSORS_DTYPES:
      raise safe_io.fail(label, f"{where} has unsupported dtype "
                         f"{show(dtype_name)}")
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(
        type(d) is int and d >= 0 for d in shape)):  # pylint: disable=unidiomatic-typecheck
      raise safe_io.fail(label, f"{where} has an invalid shape {show(shape)}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
        type(o) is int for o in offsets)  # pylint: disable=unidiomatic-typecheck
        or not 0 <= offsets[0] <= offsets[1] <= data_size):
      raise safe_io.fail(label, f"{where} has data offsets {show(offsets)} "
                         f"outside the {data_size} data bytes")
    dtype, code, itemsize = _SAFETENSORS_DTYPES[dtype_name]
    numel = int(np.prod(shape, dtype=object))
    if offsets[1] - offsets[0] != numel * itemsize:
      raise safe_io.fail(label, f"{where}: shape {tuple(shape)} of {dtype_name} "
                         f"needs {numel * itemsize} bytes, its offsets span "
                         f"{offsets[1] - offsets[0]}")
    storage = Storage(name, dtype, code, itemsize, numel, _file_reader(
        path, data_start + offsets[0], numel * itemsize, label))
    strides = [int(np.prod(shape[i + 1:], dtype=object)) for i in
               range(len(shape))]
    out[name] = StoredTensor(storage, 0, shape, strides)
  return out, "safetensors file", lambda: None


# --------------------------------------------------------- state dict search

STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net")


@dataclasses.dataclass
class StateDict:
  """The tensors of a state dict, in file order, and where they were found.

  Attributes:
    tensors: {name: tensor}, named as `state_dict()` names them.
    notes: things worth knowing (where the state dict was found).
    source: 'state dict', or "whole module 'model.CharRNN'".
  """
  tensors: Dict[str, StoredTensor]
  notes: list
  source: str = "state dict"


MAX_MODULE_DEPTH = 64


def find_state_dict(obj, label) -> StateDict:
  """The state dict in what a file holds: the object itself, a pickled module
  (read as records), or a checkpoint dict's 'state_dict' / 'model_state_dict'
  / 'model' / ... entry holding either.

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

  Raises:
    ValueError: the record is not a module, or a parameter, buffer or
      submodule is something other than a tensor / module (or None).
  """
  if not _is_module(root):
    raise safe_io.fail(label, f"holds a pickled {show(root.qualified_name)} "
                       "that is not an nn.Module (no _parameters and _modules "
                       "in its attributes)")
  tensors = collections.OrderedDict()
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
        if len(tensors) >= MAX_STORAGES:
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
  return StateDict(tensors, [
      f"read the pickled module {show(root.qualified_name)} as data: the "
      "classes it names were neither imported nor run; its tensors are named "
      "as state_dict() names them"], source)


def _describe(value) -> str:
  if isinstance(value, InertRecord):
    return f"a {show(value.qualified_name)} object"
  if _is_record_class(value):
    return f"the class or function {show(value.qualified_name)}"
  return f"a {type(value).__name__}"
