"""Keras-2-layout HDF5 files: tf.keras / tf_keras `save_weights('w.h5')` and
`save('m.h5')`, and the legacy `.h5` that Keras 3's `model.save('x.h5')` writes.

Layout (docs/dev/file-formats.md, Keras 2 HDF5): the group that
holds the weights is the root (weights-only files) or `model_weights` (full
models). Its attribute `layer_names` lists the layer groups in model order; each
layer group's attribute `weight_names` lists its datasets in creation order,
e.g. `gru/gru_cell/kernel:0` (Keras 3 legacy files drop the `:0`). Both are read
in attribute order, as str or bytes, and may be split into `layer_names0, 1,
...`. A full model also has a `model_config` JSON attribute, which is read as
data (`keras_config.parse_model_config`), never deserialized.

The layer order: a config fixes it. In a weights-only file from a Sequential or
Functional model, the weight names start with the layer's own name and
`layer_names` is the model's layer order; a subclassed model's weight names
start with the model's name instead, and then only the shapes decide.
"""

from typing import List

import h5py

from rnnstep.convert import contents
from rnnstep.convert import keras_config
from rnnstep.convert import safe_io
from rnnstep.convert import vocabulary
from rnnstep.convert.safe_io import show


def is_keras2_layout(h5: safe_io.H5File) -> bool:
  """Whether an open HDF5 file has the `layer_names` layout."""
  root = h5.root
  if h5.has_attr(root, "layer_names") or h5.has_attr(root, "layer_names0"):
    return True
  return "model_weights" in h5.names(root)


def read(h5: safe_io.H5File) -> contents.Contents:
  """Lists the layer groups of a Keras-2-layout HDF5 file (nothing read yet).

  Raises:
    ValueError: a malformed or hostile file (see `safe_io`), or a config that
      describes an unmappable model.
  """
  label = h5.label
  root = h5.root
  weights = root
  if "model_weights" in h5.names(root):
    weights = h5.child(root, "model_weights")
    if not isinstance(weights, h5py.Group):
      raise safe_io.fail(label, "'model_weights' is not a group")
  version = h5.attr_text(root, "keras_version", 256)
  config_text = h5.attr_text(root, "model_config")
  keras3 = bool(version) and version.startswith("3.")
  kind = "Keras 3 legacy HDF5" if keras3 else "Keras 2 (tf.keras) HDF5"
  chain = None
  if config_text is not None:
    data = keras_config.parse_json(config_text, label, "the model_config attribute")
    chain = keras_config.parse_model_config(data, label, "the model_config attribute")
    what = f"full model, {chain.model_class}"
  else:
    what = "weights only"
  fmt = f"{kind} ({what}{', Keras ' + version if version else ''})"
  groups = _layer_groups(h5, weights, "model_weights" if weights is not root
                         else "")
  if chain is not None and chain.specs is None:
    for group in groups:
      group.order = None
  if chain is not None and chain.specs and any(
      "/layers/" in spec.path for spec in chain.specs):
    raise safe_io.fail(label, "a model nested in another model as a layer: an "
                       "HDF5 file keeps the nested model's weights in one "
                       "group, which rnnstep does not split; save the model as "
                       ".keras")
  tokens = None
  if chain is not None and chain.text_vectorization is not None:
    vectorize = chain.text_vectorization
    if vectorize["vocabulary"] is None:  # An HDF5 file keeps no assets.
      raise safe_io.fail(label, f"the TextVectorization layer "
                         f"{show(vectorize['name'])} keeps its "
                         "vocabulary in a .keras archive's assets, which an "
                         "HDF5 file does not hold; save the model as .keras")
    tokens = vocabulary.text_vectorization_tokens(
        vectorize, vectorize["vocabulary"], label)
  return contents.Contents(label=label, format=fmt, groups=groups, chain=chain,
                            key="name", tokens=tokens)


def _layer_groups(h5: safe_io.H5File, weights, where: str) -> List[contents.Group]:
  label = h5.label
  layer_names = h5.attr_strings(weights, "layer_names")
  if layer_names is None:
    raise safe_io.fail(label, "HDF5 file without a 'layer_names' attribute: not "
                       "a Keras weights file")
  if len(set(layer_names)) != len(layer_names):
    raise safe_io.fail(label, "'layer_names' repeats a layer name")
  groups = []
  for index, layer_name in enumerate(layer_names):
    layer = h5.get(layer_name, weights, where)
    layer_path = f"{where}/{layer_name}" if where else layer_name
    if layer is None:
      raise safe_io.fail(label, f"layer group {show(layer_path)} listed in "
                         "layer_names is missing")
    if not isinstance(layer, h5py.Group):
      raise safe_io.fail(label, f"{show(layer_path)} is not a group")
    weight_names = h5.attr_strings(layer, "weight_names") or []
    tensors = []
    for weight_name in weight_names:
      path = f"{layer_path}/{weight_name}"
      dataset = h5.get(weight_name, layer, layer_path)
      if dataset is None:
        raise safe_io.fail(label, f"dataset {show(path)} listed in weight_names "
                           "is missing (a variable is missing from the file)")
      shape, _ = h5.check_dataset(dataset, path)
      tensors.append(contents.Tensor(
          path=path, shape=shape, role=contents.role_from_name(weight_name),
          reader=_reader(h5, dataset, path)))
    hint = None
    for weight_name in weight_names:
      hint = contents.hint_from_name(weight_name)
      if hint == "bidirectional":
        break
    hint = hint or contents.hint_from_name(layer_name)
    ordered = bool(weight_names) and all(
        name.startswith(f"{layer_name}/") for name in weight_names)
    groups.append(contents.Group(
        name=layer_name, tensors=tensors, hint=hint,
        order=("layer_names", index) if ordered else None))
  return groups


def _reader(h5, dataset, path):
  return lambda: h5.read_dataset(dataset, path)
