"""Legacy `torch.save` files (`_use_new_zipfile_serialization=False`, the
default before torch 1.6), read as data.

Such a file is pickles in a row (the magic number, the protocol version, the
system info, the object, the list of storage keys), then each storage in the
key list's order as an int64 element count and raw bytes, in the byte order
the system info names. Each pickle's end is found by reading its opcodes
(`pickletools.genops`, which runs nothing) before it is unpickled
(`torch_pickle.unpickle`); only the object pickle may hold storage records.

The older tar format of torch 0.1.x is recognised (`is_tar`) only to be
refused with a message that says so.
"""

import io
import os
import pickletools
import struct
from typing import Callable, Dict, Tuple

from rnnstep.convert import safe_io
from rnnstep.convert import stored_tensors
from rnnstep.convert import torch_pickle
from rnnstep.convert.safe_io import show

# The legacy format starts with a pickled magic number (PROTO 2, LONG1 10).
LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
LEGACY_PROTOCOL = 1001
LEGACY_HEADER = b"\x80\x02\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")


def is_legacy(head: bytes) -> bool:
  """Whether a file's first bytes are a legacy `torch.save` file's."""
  return head.startswith(LEGACY_HEADER)


def is_tar(path) -> bool:
  """Whether a file is a tar archive (torch 0.1's `torch.save` format)."""
  with open(path, "rb") as f:
    f.seek(257)
    return f.read(5) == b"ustar"


def read_legacy(path) -> Tuple[object, str, Callable[[], None]]:
  """Reads a legacy (non-zip) `torch.save` file's object (tensors not read).

  Args:
    path: the file.

  Returns:
    (the object, a format description, a function that closes the file: it
    does nothing, as each storage opens the file when it is read).

  Raises:
    ValueError: a corrupt, truncated or forged file, or a pickle that asks
      for more than data (see `unpickler`), in one line naming the file.
  """
  label = os.fspath(path)
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(min(size, torch_pickle.MAX_PICKLE_BYTES))
  stream = io.BytesIO(head)
  no_storage = lambda *args: _raise(safe_io.fail(
      label, "a storage record outside the object pickle"))

  def load():
    start = stream.tell()
    ops_end = _pickle_end(head, start, label)
    stream.seek(ops_end)
    return torch_pickle.unpickle(head[start:ops_end], label, no_storage)

  magic, protocol, info = load(), load(), load()
  if magic != LEGACY_MAGIC or protocol != LEGACY_PROTOCOL:
    raise safe_io.fail(label, "not a torch.save file (bad magic number or "
                       "protocol version)")
  little = info.get("little_endian") if isinstance(info, dict) else None
  if not isinstance(little, bool):
    raise safe_io.fail(label, "the file's system info is missing or corrupt")
  order = "<" if little else ">"
  storages: Dict[str, stored_tensors.Storage] = {}

  def storage(key, type_name, numel, view):
    dtype, code, itemsize = torch_pickle.storage_info(type_name, label)
    root = storages.get(key)
    if root is None:
      if len(storages) >= stored_tensors.MAX_STORAGES:
        raise safe_io.fail(label, "too many storages")
      # Its data follow the pickle: the reader is set once they are found.
      root = storages[key] = stored_tensors.Storage(key, dtype, code, itemsize,
                                                    numel, None, order)
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
    return stored_tensors.StorageView(root, view[1], view[2])

  start = stream.tell()
  end = _pickle_end(head, start, label)
  obj = torch_pickle.unpickle(head[start:end], label, storage)
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
    root.reader = stored_tensors.file_reader(path, offset + 8, nbytes, label)
    offset += 8 + nbytes
  return obj, "legacy torch.save file", lambda: None


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


def _raise(error):
  raise error
