"""TF checkpoints (`ckpt_N.index` + `ckpt_N.data-*`), read with
`tf.train.load_checkpoint` only (it reads tensors; nothing is executed).

Accepted inputs: a checkpoint prefix (`.../ckpt_5`, or its `.index` /
`.data-*` file), or a directory, which means its latest checkpoint as
`tf.train.latest_checkpoint` reads it from the `checkpoint` file.

Variable names (docs/dev/file-formats.md, TensorFlow checkpoints):

  - tf.keras `ModelCheckpoint(save_weights_only=True)`, current tutorial
    (subclassed): `embedding/embeddings`, `gru/cell/kernel`, `dense/kernel`, ...
    (the user's attribute names; no order);
  - 2019-20 tutorial (Sequential): `layer_with_weights-N/...` (N is the order);
  - Keras 3 `tf.train.Checkpoint(model=m)`: `model/embedding/_embeddings`,
    `model/dense/_kernel` (subclassed), `model/_operations/N/...` (Functional),
    `model/_functional/_operations/N/...` (Sequential).

Each name is `<path>/.ATTRIBUTES/VARIABLE_VALUE`. A checkpoint names a variable
by the first path TF found to it, and for a compiled Keras 3 model that can be
`model/optimizer/_trainable_variables/N`. So the names are taken from the
checkpoint's own object graph (`_CHECKPOINTABLE_OBJECT_GRAPH`, parsed as a
protobuf): the shortest path to each variable that does not go through the
optimizer. Optimizer variables and slots, scalars (metrics, counters) and
non-float variables (RNG state) are ignored.
"""

import collections
import glob
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from rnnstep.convert import contents
from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show

GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
SKIPPED_EDGES = ("optimizer", "_optimizer")
MAX_GRAPH_NODES = 1_000_000
_DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")
_ORDER_PATTERNS = (
    (re.compile(r"^layer_with_weights-(\d+)$"), "layer_with_weights"),
    (re.compile(r"^layer-(\d+)$"), "layer"),
)
_ORDER_LISTS = ("_operations", "_layers", "layers", "_self_tracked_trackables")
# What the checkpoint reader raises on damaged files: besides TF's errors,
# fuzzing found IndexError ("Read less bytes than requested") and
# MemoryError ("std::bad_alloc": a size the reader allocates) from a
# corrupted .index.
READER_ERRORS = (tf.errors.OpError, ValueError, OSError, IndexError,
                 RuntimeError, MemoryError)


def is_checkpoint_file(path: str) -> bool:
  """Whether `path` is a checkpoint's `.index` or `.data-*` file."""
  return path.endswith(".index") or bool(_DATA_SUFFIX.search(path))


def folder_checkpoint(path: str) -> Optional[str]:
  """The prefix a folder's `checkpoint` file names, the folder's own first.

  TF1's Saver records the prefix where it saved (an absolute path when the
  save folder was given as one). The same file name in this folder wins: a
  copy of the folder reads its own weights, never the original's. The
  recorded path is followed only where this folder lacks the file.

  Returns:
    The prefix, or None where the folder has no `checkpoint` file.

  Raises:
    ValueError: an unreadable `checkpoint` file, or one naming a checkpoint
      that is neither where it says nor in this folder.
  """
  try:
    state = tf.train.get_checkpoint_state(path)
  except READER_ERRORS as e:
    raise safe_io.fail(path, f"cannot read its 'checkpoint' file "
                       f"({message(e)})") from None
  named = state.model_checkpoint_path if state is not None else ""
  if not named:
    return None
  for candidate in (os.path.join(path, os.path.basename(named)), named):
    if os.path.isfile(candidate + ".index"):
      return candidate
  raise safe_io.fail(path, f"its 'checkpoint' file names {show(named)}, "
                     "which is neither there nor in this directory")


def resolve(path: str) -> Tuple[str, str]:
  """Returns (prefix, description) for a checkpoint directory or prefix.

  Raises:
    FileNotFoundError / ValueError: no checkpoint there.
  """
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
      raise safe_io.fail(path, "a SavedModel directory; rnnstep does not load "
                         "SavedModels (they can run arbitrary TF ops). Convert "
                         "the training checkpoint or a .keras file instead")
    prefix = folder_checkpoint(path)
    if prefix is None:
      found = sorted(glob.glob(os.path.join(glob.escape(path), "*.index")))
      hint = ""
      if found:
        names = ", ".join(os.path.basename(f)[:-6] for f in found[:3])
        hint = f"; it holds checkpoint(s) {names}: pass one as a prefix"
      raise safe_io.fail(path, "directory with no TF checkpoint (no "
                         f"'checkpoint' file naming an existing one){hint}")
    if os.path.dirname(os.path.abspath(prefix)) != os.path.abspath(path):
      return prefix, (f"the checkpoint {prefix}, which {path}'s 'checkpoint' "
                      "file names (the folder holds no such file)")
    return prefix, f"latest checkpoint in {path}"
  if path.endswith(".index"):
    return path[:-len(".index")], "checkpoint prefix"
  match = _DATA_SUFFIX.search(path)
  if match:
    return path[:match.start()], "checkpoint prefix"
  if os.path.isfile(path + ".index"):
    return path, "checkpoint prefix"
  raise FileNotFoundError(f"{path}: no such checkpoint")


def read(path: str) -> contents.Contents:
  """Lists the layer variables of a TF checkpoint (tensors read later)."""
  prefix, how = resolve(path)
  label = prefix
  if not os.path.isfile(prefix + ".index"):
    raise FileNotFoundError(f"{prefix}.index: no such checkpoint index file")
  reader, shapes, dtypes, data_bytes = open_reader(prefix, label)
  paths, uses_graph = _variable_paths(reader, shapes, label)
  notes = []
  ignored = 0
  cells = set()
  by_group: Dict[str, List[contents.Tensor]] = collections.OrderedDict()
  for key, parts in sorted(paths.items(), key=lambda kv: kv[1]):
    shape = tuple(int(d) for d in shapes[key])
    dtype = dtypes[key]
    if not shape or not dtype.is_floating or "seed_generator" in parts or (
        "states" in parts):
      ignored += 1
      continue
    check_declared_size(key, shape, dtype, data_bytes, label)
    role = contents.role_from_name(parts[-1])
    owner = list(parts[:-1])
    if owner and owner[-1] == "cell":
      owner.pop()
      cells.add("/".join(owner))
    name = "/".join(owner)
    by_group.setdefault(name, []).append(contents.Tensor(
        path=key, shape=shape, role=role, reader=_reader(reader, key, label)))
  if ignored:
    notes.append(f"ignored {ignored} non-weight variable(s) (counters, RNG or "
                 "metric state)")
  groups = []
  for name, tensors in by_group.items():
    if not name:
      raise safe_io.fail(label, f"variables at the top of the checkpoint "
                         f"({', '.join(show(t.path) for t in tensors[:3])}) "
                         "belong to no layer")
    groups.append(contents.Group(name=name, tensors=tensors,
                                  hint=contents.hint_from_name(name),
                                  order=_order(name), cell=name in cells))
  scheme = _naming_scheme(groups)
  fmt = f"TF checkpoint ({how}: {os.path.basename(prefix)}; {scheme})"
  if not uses_graph:
    notes.append("the checkpoint has no object graph; variables were matched "
                 "by their names")
  return contents.Contents(label=label, format=fmt, groups=groups, notes=notes)


def open_reader(prefix: str, label):
  """Opens a checkpoint: (reader, {key: shape}, {key: dtype}, data bytes).

  Raises:
    ValueError: not a readable checkpoint, in one line.
  """
  try:
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
  except READER_ERRORS as e:
    raise safe_io.fail(label, f"not a readable TF checkpoint ({message(e)}); "
                       "the files may be truncated or corrupt") from None
  data_bytes = sum(os.path.getsize(f) for f in glob.glob(
      glob.escape(prefix) + ".data-*-of-*"))
  return reader, shapes, dtypes, data_bytes


def check_declared_size(key, shape, dtype, data_bytes: int, label) -> None:
  """Refuses a variable whose declared size the data files cannot hold.

  Raises:
    ValueError: truncated or forged, in one line.
  """
  declared = int(np.prod(shape, dtype=object)) * dtype.size
  if declared > safe_io.MAX_DECLARED_BYTES or declared > data_bytes:
    raise safe_io.fail(label, f"variable {show(key)} declares shape {shape} = "
                       f"{declared} bytes but the data files hold "
                       f"{data_bytes}; truncated or forged")


def _variable_paths(reader, shapes, label) -> Tuple[Dict[str, Tuple[str, ...]],
                                                   bool]:
  """Maps each model variable's checkpoint key to its path of names.

  Uses the object graph when there is one (see the module docstring), else the
  keys themselves.
  """
  if GRAPH_KEY in shapes:
    try:
      raw = reader.get_tensor(GRAPH_KEY)
      graph = trackable_object_graph_pb2.TrackableObjectGraph()
      graph.ParseFromString(raw if isinstance(raw, bytes) else bytes(raw))
    except Exception as e:  # pylint: disable=broad-except
      raise safe_io.fail(label, f"cannot read the checkpoint's object graph "
                         f"({message(e)}); the checkpoint may be truncated or "
                         "corrupt") from None
    nodes = graph.nodes
    if not nodes or len(nodes) > MAX_GRAPH_NODES:
      raise safe_io.fail(label, "the checkpoint's object graph is empty or too "
                         "large")
    found = {0: ()}
    queue = collections.deque([0])
    while queue:
      node_id = queue.popleft()
      for child in nodes[node_id].children:
        if child.local_name in SKIPPED_EDGES:
          continue
        if not 0 <= child.node_id < len(nodes):
          raise safe_io.fail(label, "the checkpoint's object graph is corrupt")
        if child.node_id not in found:
          found[child.node_id] = found[node_id] + (child.local_name,)
          queue.append(child.node_id)
    out = {}
    for node_id, node in enumerate(nodes):
      if node_id not in found:
        continue  # Reachable only through the optimizer.
      for attribute in node.attributes:
        if attribute.name == "VARIABLE_VALUE" and (
            attribute.checkpoint_key in shapes):
          out[attribute.checkpoint_key] = found[node_id]
    return out, True
  out = {}
  for key in shapes:
    if not key.endswith(VALUE_SUFFIX) or ".OPTIMIZER_SLOT" in key:
      continue
    parts = tuple(key[:-len(VALUE_SUFFIX)].split("/"))
    if any(p in SKIPPED_EDGES for p in parts) or parts[0] == "save_counter":
      continue
    out[key] = parts
  return out, False


def _order(name: str) -> Optional[Tuple[str, int]]:
  """The (scheme, index) a variable path records, e.g. layer_with_weights-2."""
  parts = name.split("/")
  for i, part in enumerate(parts):
    for pattern, scheme in _ORDER_PATTERNS:
      match = pattern.match(part)
      if match:
        return scheme, int(match.group(1))
    if part in _ORDER_LISTS and i + 1 < len(parts) and parts[i + 1].isdigit():
      return "/".join(parts[:i + 1]), int(parts[i + 1])
  return None


def _naming_scheme(groups) -> str:
  if any(g.order and g.order[0] == "layer_with_weights" for g in groups):
    return "Keras 2 Sequential/Functional names"
  if any(g.order and g.order[0].endswith("_operations") for g in groups):
    return "Keras 3 Sequential/Functional names"
  return "subclassed-model names"


def _reader(reader, key, label):
  def read_tensor():
    try:
      return reader.get_tensor(key)
    except READER_ERRORS as e:
      raise safe_io.fail(label, f"cannot read variable {show(key)} "
                         f"({message(e)}); the checkpoint may be truncated or "
                         "corrupt") from None
  return read_tensor


def message(error: BaseException) -> str:
  """A reader error's text on one line."""
  text = getattr(error, "message", None) or str(error)
  return " ".join(text.split())[:300]
