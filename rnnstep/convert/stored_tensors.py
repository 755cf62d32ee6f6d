"""Tensors as a weight file describes them: storages and strided views, read
on demand.

The PyTorch readers (`torch_zip`, `torch_legacy`, `safetensors_file`) describe
each tensor before reading any data: a `Storage` (a key, an element type, a
size in elements and a function that reads its bytes) and a `StoredTensor` (a
view of one: offset, shape, strides, in elements). `check_view` checks a view
against its storage when the view is made, so a forged size or stride is
refused before anything is read; `StoredTensor.read` checks it again against
the bytes actually there.

Every refusal is a `safe_io.Refusal` (a ValueError) naming the file.
"""

import pickle
from typing import Callable, Dict, Tuple

import numpy as np

from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show

MAX_NDIM = 8
MAX_STORAGES = 100_000  # Storages in one file, tensors in one module tree.

# Each element type once: its numpy type code (read little-endian; bfloat16 as
# raw uint16) and its size in bytes.
_ELEMENTS = {
    "float32": ("f4", 4), "float64": ("f8", 8), "float16": ("f2", 2),
    "bfloat16": ("u2", 2), "int64": ("i8", 8), "int32": ("i4", 4),
    "int16": ("i2", 2), "int8": ("i1", 1), "uint8": ("u1", 1),
    "bool": ("u1", 1),
}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


def elements_named(names: Dict[str, str]) -> Dict[str, Tuple[str, str, int]]:
  """The element types under the names a file format gives them.

  Args:
    names: {the format's name: dtype}, e.g. {'FloatStorage': 'float32'}.

  Returns:
    {the format's name: (dtype, numpy type code, itemsize)}.
  """
  return {name: (dtype, *_ELEMENTS[dtype]) for name, dtype in names.items()}


class Storage:
  """One storage: `numel` elements of one dtype, read on demand.

  Attributes:
    key: its name in the file.
    dtype: 'float32', 'bfloat16', ... (see `elements_named`).
    numel: its size in elements.
    reader: a function returning the storage's bytes, or None while the file's
      data for it is not located yet (a legacy file's data follow the pickle
      that declares the storage; `torch_legacy` sets it then).
  """
  __slots__ = ("key", "dtype", "code", "itemsize", "numel", "reader",
               "_array", "_order")

  def __init__(self, key, dtype, code, itemsize, numel, reader, order="<"):
    self.key = key
    self.dtype = dtype
    self.code = code
    self.itemsize = itemsize
    self.numel = numel
    self.reader = reader
    self._array = None
    self._order = order

  def __setstate__(self, state):  # A pickle's BUILD must not alter us.
    raise pickle.UnpicklingError("a pickle tried to modify a storage")

  def array(self, label) -> np.ndarray:
    """The storage's elements, 1-D (read once).

    Args:
      label: the file, for messages.

    Raises:
      ValueError: the storage has no data in the file, or not `numel`
        elements' worth.
    """
    if self._array is None:
      if self.reader is None:
        raise safe_io.fail(label, f"storage {show(self.key)} has no data in "
                           "the file")
      data = self.reader()
      if len(data) != self.numel * self.itemsize:
        raise safe_io.fail(label, f"storage {show(self.key)} holds {len(data)} "
                           f"bytes, expected {self.numel * self.itemsize}")
      self._array = np.frombuffer(data, self._order + self.code)
    return self._array


class StorageView:
  """An old-format (legacy file) storage view: `numel` elements of `root`
  from `offset`, resolved to its root when tensors are made (`check_view`)."""
  __slots__ = ("root", "offset", "numel")

  def __init__(self, root, offset, numel):
    self.root, self.offset, self.numel = root, offset, numel

  def __setstate__(self, state):
    raise pickle.UnpicklingError("a pickle tried to modify a storage view")


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
    float64 are converted exactly / rounded to float32).

    Args:
      label: the file, for messages.
      name: the tensor's name, for messages.

    Raises:
      ValueError: the tensor is not float, or reaches past its storage's data.
    """
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


def check_view(storage, offset, shape, strides, label) -> StoredTensor:
  """Builds a StoredTensor after checking the view stays inside the storage.

  Args:
    storage: a `Storage` or `StorageView` (anything else is refused: the
      values come from a pickle).
    offset, shape, strides: the view, in elements.
    label: the file, for messages.

  Raises:
    ValueError: no storage, an invalid offset, size or stride, a view past the
      storage's end, or a shape declaring more than 4 GiB.
  """
  limit = None
  if isinstance(storage, StorageView):  # Legacy format: a slice of a root.
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


def file_reader(path, offset: int, nbytes: int, label) -> Callable[[], bytes]:
  """A `Storage.reader` for `nbytes` bytes of a plain file from `offset`.

  The file is opened at each read, not held open: the readers that use this
  (`torch_legacy`, `safetensors_file`) hand back a close function that does
  nothing.

  Raises (when called):
    ValueError: the file holds fewer bytes (truncated since it was checked).
  """
  def read():
    with open(path, "rb") as f:
      f.seek(offset)
      data = f.read(nbytes)
    if len(data) != nbytes:
      raise safe_io.fail(label, "the file is truncated (storage data missing)")
    return data
  return read
