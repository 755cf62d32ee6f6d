"""`torch.save` zip archives (`.pt`, `.pth`, `.bin`; torch >= 1.6), read as
data.

The archive holds one folder `<root>/`: `<root>/data.pkl`, the pickled object
(read by `torch_pickle.unpickle`); one member `<root>/data/<key>` per storage,
its raw bytes; and `<root>/byteorder` ('little' or 'big'; absent in older
archives, which are little-endian). Other records (`<root>/version`, ...) are
not needed to read the tensors. Members are read through `safe_io`'s guarded
zip access, by name, each size checked against what its storage record
declares before anything is read.
"""

import os
from typing import Callable, Dict, Tuple

from rnnstep.convert import safe_io
from rnnstep.convert import stored_tensors
from rnnstep.convert import torch_pickle
from rnnstep.convert.safe_io import show


def _is_data_pickle(name: str) -> bool:
  """Whether a member is `<root>/data.pkl`, one folder deep."""
  return name.endswith("/data.pkl") and name.count("/") == 1


def is_torch_zip(names) -> bool:
  """Whether a zip archive's member names are those of a `torch.save` file
  (a `<root>/data.pkl` one folder deep)."""
  return any(_is_data_pickle(n) for n in names)


def read_zip(path) -> Tuple[object, str, Callable[[], None]]:
  """Reads a `torch.save` zip archive's object (tensors not read yet).

  Args:
    path: the archive.

  Returns:
    (the object, a format description, a function that closes the archive).
    The object's tensors are `stored_tensors.StoredTensor`s whose storages
    read their members when asked, until the archive is closed.

  Raises:
    ValueError: a corrupt or forged archive, or a pickle that asks for more
      than data (see `unpickler`), in one line naming the file.
  """
  label = os.fspath(path)
  archive = safe_io.open_zip(path)
  try:
    names = safe_io.member_names(archive)
    pickles = [n for n in names if _is_data_pickle(n)]
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
    data = safe_io.read_member(archive, pickles[0],
                               torch_pickle.MAX_PICKLE_BYTES, label)
    storages: Dict[str, stored_tensors.Storage] = {}

    def storage(key, type_name, numel, view):
      if view is not None:
        raise safe_io.fail(label, "a storage view record in a zip archive")
      dtype, code, itemsize = torch_pickle.storage_info(type_name, label)
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
      if len(storages) >= stored_tensors.MAX_STORAGES:
        raise safe_io.fail(label, "too many storages")
      reader = lambda: safe_io.read_member(archive, member, nbytes, label)
      storages[key] = stored_tensors.Storage(key, dtype, code, itemsize, numel,
                                             reader, order)
      return storages[key]

    obj = torch_pickle.unpickle(data, label, storage)
  except BaseException:
    archive.close()
    raise
  return obj, "torch.save zip archive", archive.close
