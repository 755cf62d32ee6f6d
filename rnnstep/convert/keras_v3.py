"""Keras 3 files: `.keras` archives and `.weights.h5` (also as written by tf_keras).

A `.keras` file is a zip archive (docs/dev/file-formats.md, Keras 3). Only
the fixed members `config.json`, `metadata.json` and `model.weights.h5` are
read (and, for a TextVectorization layer adapted before saving, its
`assets/<path>/vocabulary.txt`), each after checking its declared size;
nothing is extracted. The config
is JSON read as data through an allow-list (`keras_config.parse_model_config`),
never deserialized. An unzipped archive (a directory holding `config.json` and
`model.weights.h5`) is read the same way.

`model.weights.h5` and `.weights.h5` files keep each object's variables in a
group `<path>/vars`, datasets `0, 1, ...` in creation order:

  - Sequential / Functional: `layers/<snake_case(ClassName)>[_N]`, with `_N`
    numbering repeats of one class in `model.layers` order (so the config's
    layer list gives each layer's path);
  - subclassed: the Python attribute names (`embedding`, `gru`, `dense`);
  - recurrent layers keep theirs in `<path>/cell/vars`;
  - `optimizer/` and `metrics/` are skipped (a nested model's too:
    `layers/sequential/optimizer/`);
  - a model used as a layer keeps its layers under its own path
    (`layers/sequential/layers/embedding`).

Legacy `.h5` files written by Keras 3's `model.save('x.h5')` have the Keras 2
layout and are read by `keras_v2_h5` (which labels them as Keras 3).
"""

import os
import re
from typing import List, Optional

import h5py

from rnnstep.convert import contents
from rnnstep.convert import keras_config
from rnnstep.convert import safe_io
from rnnstep.convert import vocabulary as vocabulary_lib
from rnnstep.convert.safe_io import show

CONFIG_MEMBER = "config.json"
METADATA_MEMBER = "metadata.json"
WEIGHTS_MEMBER = "model.weights.h5"
# A TextVectorization layer's vocabulary: assets/<its path>/vocabulary.txt.
ASSETS_DIR = "assets"
VOCABULARY_ASSET = "vocabulary.txt"
MAX_ASSET_BYTES = 64 << 20
SKIPPED_TOP_LEVEL = ("optimizer", "metrics")
_LAYER_PATH = re.compile(r"^layers/([a-z0-9_]*?[a-z])(?:_(\d+))?$")


def read_archive(path) -> contents.Contents:
  """Lists what a `.keras` zip archive holds (tensors are read later)."""
  label = os.fspath(path)
  with safe_io.open_zip(path) as archive:
    names = safe_io.member_names(archive)
    if WEIGHTS_MEMBER not in names or CONFIG_MEMBER not in names:
      shown = ", ".join(show(n, 40) for n in names[:8]) or "nothing"
      raise safe_io.fail(label, f"a zip archive without {CONFIG_MEMBER!r} and "
                         f"{WEIGHTS_MEMBER!r} (it holds {shown}); not a .keras "
                         "model file")
    config = safe_io.read_member(archive, CONFIG_MEMBER, safe_io.MAX_JSON_BYTES,
                                 label)
    metadata = None
    if METADATA_MEMBER in names:
      metadata = safe_io.read_member(archive, METADATA_MEMBER, 1 << 20, label)
    weights = safe_io.read_member(archive, WEIGHTS_MEMBER,
                                  safe_io.MAX_ZIP_MEMBER_BYTES, label)

    def asset(member):
      if member not in names:
        return None
      return safe_io.read_member(archive, member, MAX_ASSET_BYTES, label)

    return _read(label, config, metadata, weights, ".keras archive", asset)


def is_unzipped_archive(path) -> bool:
  return (os.path.isdir(path)
          and os.path.isfile(os.path.join(path, CONFIG_MEMBER))
          and os.path.isfile(os.path.join(path, WEIGHTS_MEMBER)))


def read_directory(path) -> contents.Contents:
  """Lists what an unzipped `.keras` directory holds."""
  label = os.fspath(path)
  config = _read_small_file(os.path.join(path, CONFIG_MEMBER),
                            safe_io.MAX_JSON_BYTES, label)
  metadata_path = os.path.join(path, METADATA_MEMBER)
  metadata = (_read_small_file(metadata_path, 1 << 20, label)
              if os.path.isfile(metadata_path) else None)
  def asset(member):
    member_path = os.path.join(path, *member.split("/"))
    if not os.path.isfile(member_path):
      return None
    return _read_small_file(member_path, MAX_ASSET_BYTES, label)

  return _read(label, config, metadata, os.path.join(path, WEIGHTS_MEMBER),
               "unzipped .keras directory", asset)


def _read_small_file(path, limit, label) -> bytes:
  return safe_io.read_file(path, limit, f"{label}: {os.path.basename(path)}")


def _read(label, config_bytes, metadata_bytes, weights, kind, asset):
  version = _keras_version(metadata_bytes, label)
  data = keras_config.parse_json(config_bytes, label, CONFIG_MEMBER)
  chain = keras_config.parse_model_config(data, label, CONFIG_MEMBER)
  tokens = None
  if chain.text_vectorization is not None:
    tokens = _text_vectorization_tokens(chain.text_vectorization, asset, label)
  h5 = safe_io.H5File(weights, f"{label}: {WEIGHTS_MEMBER}")
  try:
    groups = list_groups(h5)
  except BaseException:
    h5.close()
    raise
  if chain.specs is None:
    for group in groups:  # A subclassed model's layer list is creation order.
      group.order = None
  who = "tf_keras" if version and version.startswith("2.") else "Keras"
  fmt = (f"{who} {version or ''} {kind} ({chain.model_class})").replace(
      "  ", " ")
  return contents.Contents(label=label, format=fmt, groups=groups, chain=chain,
                            key="path", closers=[h5.close], tokens=tokens)


def _text_vectorization_tokens(settings, asset, label):
  """The TextVectorization layer's vocabulary: its config's list, else the
  `vocabulary.txt` asset its `save_assets` wrote
  (`assets/<its path>/vocabulary.txt`)."""
  vocabulary = settings["vocabulary"]
  if vocabulary is None:
    member = f"{ASSETS_DIR}/{settings['path']}/{VOCABULARY_ASSET}"
    data = asset(member)
    if data is None:
      raise safe_io.fail(label, f"the TextVectorization layer "
                         f"{show(settings['name'])} has no vocabulary in its "
                         f"config and the archive has no {show(member)} "
                         "(was it adapted before saving?)")
    vocabulary = vocabulary_lib.text_vectorization_asset(
        data, f"{label}: {member}")
  return vocabulary_lib.text_vectorization_tokens(settings, vocabulary, label)


def _keras_version(metadata_bytes, label) -> Optional[str]:
  if metadata_bytes is None:
    return None
  data = keras_config.parse_json(metadata_bytes, label, METADATA_MEMBER)
  version = data.get("keras_version") if isinstance(data, dict) else None
  if isinstance(version, str) and re.fullmatch(r"[0-9A-Za-z.+-]{1,32}", version):
    return version
  return None


def read_weights_file(h5: safe_io.H5File) -> contents.Contents:
  """Lists what a `.weights.h5` file holds (an open, guarded HDF5 file)."""
  groups = list_groups(h5)
  layered = bool(groups) and all(g.name.startswith("layers/") for g in groups)
  if layered:
    style = "Sequential/Functional paths"
  else:
    style = "subclassed-model paths"
    for group in groups:  # `layers/...` here numbers creation order only.
      group.order = None
  return contents.Contents(
      label=h5.label, format=f"Keras 3 .weights.h5 ({style}, no config)",
      groups=groups, key="path", closers=[h5.close])


def list_groups(h5: safe_io.H5File) -> List[contents.Group]:
  """One Group per object that stores variables (`<path>/vars/0, 1, ...`)."""
  groups = []
  for path, obj in h5.walk(h5.root):
    parts = path.split("/")
    if parts[-1] != "vars" or any(
        part in SKIPPED_TOP_LEVEL and (i == 0 or parts[i - 1] != "layers")
        for i, part in enumerate(parts)):  # A nested model's optimizer too.
      continue
    if not isinstance(obj, h5py.Group):
      raise safe_io.fail(h5.label, f"{show(path)} is not a group")
    owner = "/".join(parts[:-1])
    if "seed_generator" in parts:
      continue  # Dropout RNG state (int), not a weight.
    tensors = _vars(h5, obj, path)
    if not tensors:
      continue
    if not owner:
      raise safe_io.fail(h5.label, f"the model itself holds variables "
                         f"({len(tensors)} in 'vars'); rnnstep maps only "
                         "Embedding, recurrent and Dense layer weights")
    name = owner[:-len("/cell")] if owner.endswith("/cell") else owner
    hint = contents.hint_from_name(name)
    match = _LAYER_PATH.match(name)
    order = (match.group(1), int(match.group(2) or 0)) if match else None
    groups.append(contents.Group(name=name, tensors=tensors, hint=hint,
                                  order=order, cell=name != owner))
  return groups


def _vars(h5, group, where) -> List[contents.Tensor]:
  names = h5.names(group, where)
  if any(not n.isdigit() or n != str(int(n)) for n in names):
    raise safe_io.fail(h5.label, f"{show(where)} holds unexpected entries "
                       f"{', '.join(show(n, 20) for n in names[:5])}")
  indices = sorted(int(n) for n in names)
  if indices != list(range(len(indices))):
    raise safe_io.fail(h5.label, f"{show(where)} has gaps in its variable "
                       "numbering (a variable is missing)")
  tensors = []
  for index in indices:
    path = f"{where}/{index}"
    dataset = h5.child(group, str(index), where)
    shape, _ = h5.check_dataset(dataset, path)
    tensors.append(contents.Tensor(path=path, shape=shape, role=None,
                                    reader=_reader(h5, dataset, path)))
  return tensors


def _reader(h5, dataset, path):
  return lambda: h5.read_dataset(dataset, path)
