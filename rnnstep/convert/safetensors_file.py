"""`.safetensors` files, read as data.

The format: an 8-byte little-endian header length, a JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": ...}`,
then the raw data, little-endian, each tensor contiguous at its offsets
(counted from the data's start). No pickle is involved: the header is checked
entry by entry (dtype, shape, offsets inside the data, offsets spanning
exactly the shape's bytes) and each tensor is read later, by name.
"""

import collections
import json
import os
import struct
from typing import Callable, Dict, Tuple

import numpy as np

from rnnstep.convert import safe_io
from rnnstep.convert import stored_tensors
from rnnstep.convert.safe_io import show

MAX_SAFETENSORS_HEADER = 100_000_000  # The safetensors library's own limit.

# The element types by safetensors' dtype names.
_SAFETENSORS_DTYPES = stored_tensors.elements_named({
    "F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U8": "uint8", "BOOL": "bool",
})


def is_safetensors(head: bytes, size: int) -> bool:
  """Whether a file's first bytes (and its size) are a `.safetensors` file's:
  a header length that fits the file, then a JSON object."""
  if len(head) < 9 or size < 10:
    return False
  (length,) = struct.unpack("<Q", head[:8])
  return 2 <= length <= size - 8 and head[8:9] == b"{"


def read_safetensors(path) -> Tuple[Dict[str, stored_tensors.StoredTensor],
                                    str, Callable[[], None]]:
  """Reads a `.safetensors` header into {name: StoredTensor} (data later).

  Args:
    path: the file.

  Returns:
    ({name: tensor} in the header's order, a format description, a function
    that closes the file: it does nothing, as each tensor opens the file when
    it is read).

  Raises:
    ValueError: a header that is not JSON, does not fit the file, or
      describes a tensor outside the data or of an unknown dtype, in one line
      naming the file.
  """
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
    if (not isinstance(shape, list) or len(shape) > stored_tensors.MAX_NDIM
        or not all(type(d) is int and d >= 0 for d in shape)):  # pylint: disable=unidiomatic-typecheck
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
    reader = stored_tensors.file_reader(path, data_start + offsets[0],
                                        numel * itemsize, label)
    storage = stored_tensors.Storage(name, dtype, code, itemsize, numel, reader)
    strides = [int(np.prod(shape[i + 1:], dtype=object)) for i in
               range(len(shape))]
    out[name] = stored_tensors.StoredTensor(storage, 0, shape, strides)
  return out, "safetensors file", lambda: None
