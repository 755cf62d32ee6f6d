"""What torch puts in a `torch.save` pickle, and what the restricted unpickler
gives for it.

Both `torch.save` formats (`torch_zip`, `torch_legacy`) pickle the saved
object with its tensors as calls of torch's rebuild functions on storage
records. `GLOBALS`, the allow-list `unpickle` gives the restricted unpickler,
adds to `unpickler.PLAIN_GLOBALS` the storage classes (`torch.FloatStorage`,
...) and torch's tensor rebuild functions (`torch._utils._rebuild_tensor_v2`,
`_rebuild_tensor`, `_rebuild_parameter`, `_rebuild_parameter_with_state`),
each replaced by our own code that records what the tensor is (storage key,
dtype, offset, size, stride) and checks it against the storage
(`stored_tensors.check_view`). Persistent ids are accepted only as storage
records (and, in the legacy format, the records that name a pickled module's
class); what a storage record becomes is the format reader's to say, as the
two formats keep storages in different places.
"""

import pickle
import re
from typing import Callable, Tuple

from rnnstep.convert import safe_io
from rnnstep.convert import stored_tensors
from rnnstep.convert import unpickler
from rnnstep.convert.safe_io import show

MAX_PICKLE_BYTES = 64 << 20

# The element types by torch's storage class names.
_STORAGES = stored_tensors.elements_named({
    "FloatStorage": "float32", "DoubleStorage": "float64",
    "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
    "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
})
# A zip archive's storage key names its member data/<key>: no path in it.
_KEY = re.compile(r"[0-9A-Za-z_.-]{1,64}")


def storage_info(name, label) -> Tuple[str, str, int]:
  """The element type of a torch storage class.

  Args:
    name: the class name, e.g. 'FloatStorage'.
    label: the file, for messages.

  Returns:
    (dtype, numpy type code, itemsize).

  Raises:
    ValueError: a storage class rnnstep does not know.
  """
  if name not in _STORAGES:
    raise safe_io.fail(label, f"unknown storage type {show(name)}")
  return _STORAGES[name]


class _StorageType:
  """Stands for `torch.FloatStorage` etc. in a pickle: only its dtype."""
  __slots__ = ("name",)

  def __init__(self, name):
    self.name = name

  def __setstate__(self, state):
    raise pickle.UnpicklingError("a pickle tried to modify a storage type")


def _rebuild_tensor_v2(restricted: unpickler.RestrictedUnpickler):
  """Stands for `torch._utils._rebuild_tensor_v2` (torch >= 1.0)."""
  label = restricted.label

  def rebuild_v2(storage, offset, size, stride, requires_grad=False,
                 backward_hooks=None, metadata=None):
    del requires_grad, backward_hooks, metadata  # Irrelevant to values.
    return stored_tensors.check_view(storage, offset, size, stride, label)
  return rebuild_v2


def _rebuild_tensor(restricted: unpickler.RestrictedUnpickler):
  """Stands for `torch._utils._rebuild_tensor` (older legacy files)."""
  label = restricted.label

  def rebuild(storage, offset, size, stride):
    return stored_tensors.check_view(storage, offset, size, stride, label)
  return rebuild


def _rebuild_parameter(restricted: unpickler.RestrictedUnpickler):
  """Stands for `torch._utils._rebuild_parameter(_with_state)`: an
  nn.Parameter is read as the tensor it holds."""
  label = restricted.label

  def rebuild_parameter(data, requires_grad=False, backward_hooks=None,
                        state=None):
    del requires_grad, backward_hooks, state  # A Parameter's extras.
    if not isinstance(data, stored_tensors.StoredTensor):
      raise safe_io.fail(label, "a parameter in the pickle holds no tensor")
    return data
  return rebuild_parameter


def _storage_type(name):
  return lambda restricted: _StorageType(name)


GLOBALS: unpickler.AllowList = {
    **unpickler.PLAIN_GLOBALS,
    **{("torch", name): _storage_type(name) for name in _STORAGES},
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}


def _persistent_records(label, storage: Callable) -> Callable[[object], object]:
  """The `persistent_load` of a torch pickle: storage and module records."""

  def persistent_load(pid):
    if not isinstance(pid, tuple) or not pid:
      raise safe_io.fail(label, "the pickle holds an unknown persistent "
                         "record")
    kind = pid[0]
    if isinstance(kind, bytes):
      kind = kind.decode("ascii", "replace")
    if kind == "module":
      # The legacy format names each nn.Module class as ('module', class,
      # source file, source): keep the class (a record class), not the source.
      if len(pid) != 4 or not unpickler.is_record_class(pid[1]):
        raise safe_io.fail(label, "the pickle holds an invalid module "
                           "record")
      return pid[1]
    if kind != "storage" or len(pid) not in (5, 6):
      raise safe_io.fail(label, f"the pickle holds an unknown persistent "
                         f"record {show(kind)}")
    storage_type, key, _, numel = pid[1:5]
    view = pid[5] if len(pid) == 6 else None
    if not isinstance(storage_type, _StorageType):
      raise safe_io.fail(label, "a storage record names no storage type")
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key in (".", ".."):
      raise safe_io.fail(label, f"a storage record has the invalid key "
                         f"{show(key)}")
    if type(numel) is not int or numel < 0:  # pylint: disable=unidiomatic-typecheck
      raise safe_io.fail(label, f"storage {show(key)} has the invalid "
                         f"size {show(numel)}")
    return storage(key, storage_type.name, numel, view)
  return persistent_load


def unpickle(data: bytes, label, storage: Callable):
  """Unpickles one pickle of a `torch.save` file (see `unpickler.unpickle`).

  Args:
    data: the pickle.
    label: the file, for messages.
    storage: `storage(key, storage_type, numel, view)` -> a
      `stored_tensors.Storage` (or `StorageView`), called for each storage
      record: the storage class's name (see `storage_info`), its size in
      elements, and a legacy view record (key, offset, size) or None.

  Returns:
    The saved object: dicts of `stored_tensors.StoredTensor`, inert records.

  Raises:
    ValueError: in one line, naming the file.
  """
  return unpickler.unpickle(data, label, GLOBALS,
                            _persistent_records(label, storage))
