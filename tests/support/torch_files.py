"""`torch.save` files assembled by hand, without torch: the zip layout and
the pickle opcodes torch writes for tensors (protocol 2), for tests that
need a file torch would write (or one it never would)."""

import struct
import zipfile

import numpy as np


def pickle_str(text):
  data = text.encode()
  return b"X" + struct.pack("<I", len(data)) + data


def pickle_int(value):
  if -2**31 <= value < 2**31:
    return b"J" + struct.pack("<i", value)
  data = value.to_bytes(8, "little", signed=True)
  return b"\x8a" + bytes([len(data)]) + data  # LONG1


def pickle_ints(values):
  return b"(" + b"".join(pickle_int(v) for v in values) + b"t"


def tensor_record(numel, size, stride, offset=0, key="0", build=b""):
  """The pickle of one float32 tensor over storage `key` (its zip member
  `archive/data/<key>`); `build` is a state to BUILD the tensor with (torch
  never writes one)."""
  storage = (b"(" + pickle_str("storage") + b"ctorch\nFloatStorage\n"
             + pickle_str(key) + pickle_str("cpu") + pickle_int(numel)
             + b"tQ")
  return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage
          + pickle_int(offset) + pickle_ints(size) + pickle_ints(stride)
          + b"\x89ccollections\nOrderedDict\n)RtR" + build)


def tensor_pickle(numel, size, stride, offset=0, key="0", build=b""):
  """The pickle torch.save writes for {'w': tensor} (`tensor_record`)."""
  return (b"\x80\x02}(" + pickle_str("w")
          + tensor_record(numel, size, stride, offset, key, build) + b"u.")


def write_torch_zip(path, pickle_bytes, members=()):
  """A torch.save zip: `pickle_bytes` as its data.pkl, `members` as
  (storage key, bytes) pairs."""
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("archive/data.pkl", pickle_bytes)
    z.writestr("archive/byteorder", b"little")
    z.writestr("archive/version", b"3\n")
    for name, data in members:
      z.writestr(f"archive/data/{name}", data)


def write_state_dict(path, arrays):
  """What `torch.save(state_dict, path)` writes for {name: array}, each
  array a float32 tensor of its own storage."""
  records, members = [], []
  for key, (name, array) in enumerate(arrays.items()):
    array = np.ascontiguousarray(array, "<f4")
    stride = [int(np.prod(array.shape[i + 1:])) for i in range(array.ndim)]
    records.append(pickle_str(name) + tensor_record(
        array.size, array.shape, stride, key=str(key)))
    members.append((str(key), array.tobytes()))
  write_torch_zip(path, b"\x80\x02}(" + b"".join(records) + b"u.", members)
