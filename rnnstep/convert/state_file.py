"""State files: a model's recurrent state, read as data and written back.

An RWKV-7 model's file is what RWKV's "state tuning" and its front ends use
(RWKV-Runner, ai00): a dict with one `blocks.{i}.att.time_state` tensor
`[heads, head_size, head_size]` per block, each block's WKV state as the
official code holds it (`rwkv` package, `RWKV_x070`: `state[i*3+1]`, rows
value, columns key; rnnstep's `wkv{i}` is the same matrix, flattened row by
row). The token-shift states start at zero, as RWKV-Runner's
`load_rwkv_state` starts them, unless the file also holds
`blocks.{i}.att.x_prev` and `blocks.{i}.ffn.x_prev` (`[C]` each: the
previous token's normalized input to the time mix and the channel mix, the
official `state[i*3]` and `state[i*3+2]`), which `rnnstep.save_state`
writes so that a saved state continues exactly as the one it was taken from.

Any other model's file (GRU, LSTM, SimpleRNN stacks) holds rnnstep's own
names: `layers.{i}.h` (and `layers.{i}.c` for an LSTM), `[units]` each.

Three containers, by the file's name and bytes:
  - `.pth` (or `.pt`, `.bin`): a `torch.save` file, read by `torch_zip` or
    `torch_legacy` (the restricted unpickler: no code in the file runs);
  - `.safetensors`: the tensors as they are;
  - `.st`: ai00 / web-rwkv's, a safetensors file whose tensors are float16
    and whose `time_state` matrices are transposed (web-rwkv's
    `assets/scripts/convert_safetensors.py` writes `.half()` and swaps the
    last two axes of every tensor named `time_state`); read back here with
    the transpose undone.

Every tensor is checked against the model (which tensors, shape, a float
dtype, finite values) with one line naming the file and the tensor.
"""

import collections
import json
import os
import struct
import zipfile
from typing import Callable, Dict, List, Tuple

import numpy as np

from rnnstep.convert import pytorch
from rnnstep.convert import safe_io
from rnnstep.convert import safetensors_file
from rnnstep.convert import stored_tensors
from rnnstep.convert import torch_legacy
from rnnstep.convert import torch_state_dict
from rnnstep.convert import torch_zip
from rnnstep.convert.safe_io import show
from rnnstep.model import kinds
from rnnstep import staging

# ai00 / web-rwkv's state files: safetensors, float16, time_state transposed.
WEB_RWKV_SUFFIX = ".st"
SAFETENSORS_SUFFIX = ".safetensors"
TORCH_SUFFIXES = (".pth", ".pt", ".bin")
SUFFIXES = TORCH_SUFFIXES + (SAFETENSORS_SUFFIX, WEB_RWKV_SUFFIX)


class Slot:
  """Where one tensor of a state file goes in rnnstep's state.

  Attributes:
    name: the tensor's name in the file.
    layer: the recurrent layer (`model.config.layers` index).
    index: which of the layer's state tensors (`cells.state_names` order).
    shape: the tensor's shape in the file.
    required: whether a file must hold it (an RWKV-7 token shift may be
      missing: it then starts at zero).
    what: what the tensor is, for messages.
  """
  __slots__ = ("name", "layer", "index", "shape", "required", "what")

  def __init__(self, name, layer, index, shape, required, what):
    self.name, self.layer, self.index = name, layer, index
    self.shape, self.required, self.what = tuple(shape), required, what

  @property
  def is_wkv(self) -> bool:
    return self.name.endswith(".att.time_state")


def slots(config) -> List[Slot]:
  """The tensors a state file of a model of `config` holds, in file order.

  Raises:
    ValueError: a model with no state to load (windows recomputed at each
      token), or an RWKV-7 stack with other layers.
  """
  layers = config.layers
  if config.recomputes:
    raise ValueError("the model recomputes a window at each token (a "
                     "bidirectional layer or pre-padded windows), so it "
                     "carries no state")
  out = []
  for i, layer in enumerate(layers):
    kind = kinds.get(layer.kind)
    names = kind.state_names(layer.size)
    sizes = kind.state_sizes(layer.units, layer.size)
    if layer.kind != "rwkv7":
      out += [Slot(f"layers.{i}.{name}", i, j, (size,), True,
                   f"layer {i}'s {kind.display} state {name!r}")
              for j, (name, size) in enumerate(zip(names, sizes))]
      continue
    if len(layers) != 1:
      raise ValueError("an RWKV-7 stack with other recurrent layers has no "
                       "state file format")
    head = layer.size["head_size"]
    heads = layer.units // head
    for block in range(layer.size["blocks"]):
      # rnnstep's block state: att_x, wkv, ffn_x (kinds.RWKV7_BLOCK_STATE),
      # after h.
      first = 1 + 3 * block
      out.append(Slot(f"blocks.{block}.att.time_state", i, first + 1,
                      (heads, head, head), True,
                      f"block {block}'s WKV state [heads, head size, head "
                      "size]"))
      out.append(Slot(f"blocks.{block}.att.x_prev", i, first,
                      (layer.units,), False,
                      f"block {block}'s time-mix token shift"))
      out.append(Slot(f"blocks.{block}.ffn.x_prev", i, first + 2,
                      (layer.units,), False,
                      f"block {block}'s channel-mix token shift"))
  return out


def _describe_model(config) -> str:
  layer = config.layers[0]
  if layer.kind == "rwkv7":
    head = layer.size["head_size"]
    return (f"an RWKV-7 model of {layer.size['blocks']} blocks, "
            f"{layer.units // head} heads of {head}")
  return (f"a model of {len(config.layers)} recurrent layers ("
          + ", ".join(f"{kinds.get(l.kind).display} {l.units}"
                      for l in config.layers) + ")")


def _open_tensors(path, label) -> Tuple[Dict[str, stored_tensors.StoredTensor],
                                        Callable[[], None]]:
  """The named tensors of a `torch.save` or safetensors file (not read)."""
  if safe_io.sniff(path) == "zip":
    obj, _, close = torch_zip.read_zip(path)
  else:
    with open(path, "rb") as f:
      head = f.read(16)
    kind = pytorch.reader_kind(path, head, os.path.getsize(path))
    if kind == "safetensors":
      tensors, _, close = safetensors_file.read_safetensors(path)
      return tensors, close
    if kind != "legacy":
      raise safe_io.fail(label, "not a state file: neither a torch.save file "
                         "(.pth) nor a safetensors file (.safetensors, .st)")
    obj, _, close = torch_legacy.read_legacy(path)
  try:
    tensors = torch_state_dict.find_state_dict(obj, label).tensors
  except BaseException:
    close()
    raise
  return tensors, close


def read(path, config) -> Tuple[Tuple[np.ndarray, ...], ...]:
  """Reads a state file for a model of `config`.

  Args:
    path: a `.pth`, `.safetensors` or `.st` file (see the module's doc).
    config: the model's `model_file.ModelConfig`.

  Returns:
    Per recurrent layer, its state tensors (`cells.state_names` order) as
    float32 `[width]` arrays; what the file does not hold (RWKV-7's token
    shifts and its output h) is zero.

  Raises:
    FileNotFoundError: no such file.
    ValueError: one line naming the file (and the tensor at fault): not a
      state file, a pickle that asks for more than data, a tensor missing,
      extra (another block count or layer count), of another shape or a
      dtype that is not float, or holding values that are not finite.
  """
  label = os.fspath(path)
  try:
    expected = slots(config)
  except ValueError as e:
    raise safe_io.fail(label, f"no state file for this model: {e}") from None
  transposed = label.lower().endswith(WEB_RWKV_SUFFIX)
  tensors, close = _open_tensors(label, label)
  try:
    model = _describe_model(config)
    by_name = {slot.name: slot for slot in expected}
    extra = [name for name in tensors if name not in by_name]
    if extra:
      raise safe_io.fail(label, f"tensor {show(extra[0], 60)} is not part of "
                         f"a state of {model} (expected "
                         f"{_expected_names(expected)})")
    state = [[np.zeros(size, np.float32) for size in kinds.get(
        layer.kind).state_sizes(layer.units, layer.size)]
             for layer in config.layers]
    for slot in expected:
      tensor = tensors.get(slot.name)
      if tensor is None:
        if slot.required:
          raise safe_io.fail(label, f"no tensor {show(slot.name)} ({slot.what})"
                             f" for {model}; a state file holds "
                             f"{_expected_names(expected)}")
        continue
      state[slot.layer][slot.index] = _read_one(tensor, slot, transposed,
                                                label, model)
  finally:
    close()
  return tuple(tuple(layer) for layer in state)


def _expected_names(expected: List[Slot]) -> str:
  required = [slot.name for slot in expected if slot.required]
  shown = (", ".join(required) if len(required) <= 3
           else f"{required[0]}, {required[1]}, ... {required[-1]}")
  return f"{len(required)} tensors {shown}"


def _read_one(tensor, slot: Slot, transposed: bool, label, model
              ) -> np.ndarray:
  """One tensor's values, checked against its slot, as float32 `[width]`."""
  where = f"tensor {show(slot.name)}"
  if tensor.dtype not in stored_tensors.FLOAT_DTYPES:
    raise safe_io.fail(label, f"{where} has dtype {tensor.dtype}; a state is "
                       "float (float32, float16, bfloat16)")
  shape = tuple(tensor.shape)
  if transposed and slot.is_wkv:
    shape = shape[:-2] + shape[-2:][::-1]
  if shape != slot.shape:
    raise safe_io.fail(label, f"{where} has shape {tuple(tensor.shape)}; "
                       f"{model} needs {slot.shape} ({slot.what})")
  values = tensor.read(label, slot.name)
  if transposed and slot.is_wkv:
    values = np.swapaxes(values, -1, -2)
  if not np.isfinite(values).all():
    raise safe_io.fail(label, f"{where} holds values that are not finite "
                       "(nan or inf)")
  return np.ascontiguousarray(values, np.float32).reshape(-1)


# ------------------------------------------------------------------ writing


def write(path, config, state, *, token_shift: bool = True) -> None:
  """Writes one row of a model's state as a state file, atomically.

  Args:
    path: ends in `.pth` (a `torch.save` zip archive, which `torch.load`
      reads), `.safetensors` (float32) or `.st` (ai00 / web-rwkv's: float16,
      `time_state` transposed).
    config: the model's `model_file.ModelConfig`.
    state: per recurrent layer, its state tensors (`cells.state_names`
      order) as float32 `[width]` arrays.
    token_shift: for RWKV-7, also write each block's token shifts
      (`blocks.{i}.att.x_prev`, `blocks.{i}.ffn.x_prev`), so that the state
      continues exactly; False writes the WKV states alone, the tensors
      RWKV-Runner (which counts them) and ai00 load, which start the token
      shifts from zero.

  Raises:
    ValueError: a name with another suffix, a model with no state file.
    OSError: the file cannot be written.
  """
  label = os.fspath(path)
  suffix = os.path.splitext(label)[1].lower()
  if suffix not in SUFFIXES:
    raise ValueError(f"{label}: a state file's name ends in "
                     f"{', '.join(SUFFIXES)}")
  try:
    expected = slots(config)
  except ValueError as e:
    raise ValueError(f"{label}: no state file for this model: {e}") from None
  arrays = collections.OrderedDict()
  for slot in expected:
    if not slot.required and not token_shift:
      continue
    value = np.asarray(state[slot.layer][slot.index], np.float32).reshape(
        slot.shape)
    if suffix == WEB_RWKV_SUFFIX:
      if slot.is_wkv:
        value = np.swapaxes(value, -1, -2)
      value = value.astype(np.float16)
    arrays[slot.name] = np.ascontiguousarray(value)
  with staging.staged_path(label) as tmp:
    if suffix in TORCH_SUFFIXES:
      _write_torch_zip(tmp, arrays, os.path.splitext(
          os.path.basename(label))[0])
    else:
      _write_safetensors(tmp, arrays)


def _write_safetensors(path, arrays) -> None:
  """A safetensors file of float32 / float16 arrays, in order."""
  header, offset = {}, 0
  for name, array in arrays.items():
    nbytes = array.nbytes
    header[name] = {"dtype": "F16" if array.dtype == np.float16 else "F32",
                    "shape": list(array.shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  header["__metadata__"] = {"format": "pt"}
  text = json.dumps(header, separators=(",", ":")).encode("utf-8")
  text += b" " * (-len(text) % 8)  # The data starts 8-byte aligned.
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for array in arrays.values():
      f.write(array.astype(array.dtype.newbyteorder("<")).tobytes())


def _pickle_str(text: str) -> bytes:
  data = text.encode("utf-8")
  return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _pickle_int(value: int) -> bytes:
  return b"J" + struct.pack("<i", value)  # BININT


def _pickle_tuple(items) -> bytes:
  return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


def _write_torch_zip(path, arrays, root: str) -> None:
  """What `torch.save({name: float32 tensor}, path)` writes: a zip archive of
  `<root>/data.pkl` (pickle protocol 2: a dict of `_rebuild_tensor_v2`
  calls over persistent storage ids), one `<root>/data/<key>` per tensor
  and `<root>/byteorder`. Only the names torch's `weights_only` loader
  allows."""
  root = "".join(c if c.isalnum() or c in "_-" else "_" for c in root) or (
      "archive")
  records = []
  for key, (name, array) in enumerate(arrays.items()):
    strides = [int(np.prod(array.shape[i + 1:])) for i in range(array.ndim)]
    storage = b"".join([
        b"(", _pickle_str("storage"), b"ctorch\nFloatStorage\n",
        _pickle_str(str(key)), _pickle_str("cpu"), _pickle_int(array.size),
        b"tQ"])  # BINPERSID of the tuple.
    records.append(b"".join([
        _pickle_str(name), b"ctorch._utils\n_rebuild_tensor_v2\n(", storage,
        _pickle_int(0), _pickle_tuple(_pickle_int(n) for n in array.shape),
        _pickle_tuple(_pickle_int(s) for s in strides),
        b"\x89ccollections\nOrderedDict\n)RtR"]))
  data = b"\x80\x02}(" + b"".join(records) + b"u."
  with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
    archive.writestr(f"{root}/data.pkl", data)
    archive.writestr(f"{root}/byteorder", b"little")
    for key, array in enumerate(arrays.values()):
      archive.writestr(f"{root}/data/{key}",
                       array.astype("<f4").tobytes())
    archive.writestr(f"{root}/version", b"3\n")
