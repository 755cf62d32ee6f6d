"""Guards for reading untrusted zip archives and HDF5 files as data only.

Zip (`.keras` archives): members are opened by fixed names only, their declared
sizes are checked before anything is read, duplicate or encrypted members are
refused, and nothing is ever extracted to disk.

HDF5 (through h5py): every step of a path is checked to be a hard link (soft and
external links are refused before they are followed), datasets stored in
external files or as virtual datasets are refused, and a dataset is read only
if its dtype is a plain float and its declared size is believable: at most
`MAX_DECLARED_BYTES`, and at most `MAX_EXPANSION` times the bytes the file
really stores for it (a "shape bomb" declares a huge shape over a tiny file).
Attributes are size-checked before they are read.

Every refusal is a `ValueError` whose message names the file, the object and
the problem, on one line.
"""

import functools
import io
import os
import struct
import zipfile
import zlib
from typing import Iterator, List, Optional, Tuple

import h5py
import numpy as np

MAX_DECLARED_BYTES = 4 << 30   # No char model's tensor comes near 4 GiB.
MAX_EXPANSION = 1000           # Declared bytes per stored byte (shape bombs).
MAX_ZIP_MEMBER_BYTES = 4 << 30
MAX_JSON_BYTES = 16 << 20
MAX_ATTR_BYTES = 64 << 20
MAX_ATTR_ELEMENTS = 1 << 20
MAX_OBJECTS = 100_000          # HDF5 objects visited in one walk.
MAX_DEPTH = 32

FLOAT_ITEMSIZES = (2, 4, 8)


def show(value, limit: int = 80) -> str:
  """A name from a file, quoted and escaped so it fits on one line."""
  text = str(value)
  if len(text) > limit:
    text = text[:limit] + "..."
  return repr(text)


class Refusal(ValueError):
  """A file refused; the message names the file and the problem, on one line."""


def fail(label, problem: str) -> Refusal:
  return Refusal(f"{label}: {problem}" if label else problem)


# What h5py raises, depending on the damage, when it meets a corrupt file.
H5_ERRORS = (KeyError, OSError, RuntimeError, TypeError, ValueError, IndexError,
             OverflowError, AttributeError)


def _guarded(method):
  """Turns any h5py error inside an H5File method into a one-line Refusal."""

  @functools.wraps(method)
  def wrapper(self, *args, **kwargs):
    try:
      return method(self, *args, **kwargs)
    except Refusal:
      raise
    except H5_ERRORS as e:
      raise fail(self.label, f"corrupt HDF5 data ({_h5_reason(e)}); the file "
                 "may be truncated or damaged") from None

  return wrapper


# ---------------------------------------------------------------- zip archives

# What zipfile raises, depending on the damage, for a corrupt archive.
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError,
              EOFError, OSError, ValueError, OverflowError, IndexError,
              struct.error, zlib.error)


def open_zip(path) -> zipfile.ZipFile:
  """Opens a zip archive for reading, turning zip errors into ValueError."""
  try:
    return zipfile.ZipFile(path)
  except ZIP_ERRORS as e:
    raise fail(path, f"not a readable zip archive ({_one_line(e)}); the file "
               "may be truncated or not a .keras file") from None


def member_names(archive: zipfile.ZipFile) -> List[str]:
  return [info.filename for info in archive.infolist()]


def read_file(path, limit: int, label=None, advice: str = "") -> bytes:
  """A whole file of at most `limit` bytes, by a read that stops there.

  The read is the check: no `getsize` before it that a growing file, a FIFO
  or a device (whose size says 0) would get past.

  Args:
    path: the file.
    limit: the most bytes it may hold.
    label: how the message names it (default: `path`).
    advice: appended to the refusal (why the limit is enough).

  Raises:
    OSError: it cannot be opened or read.
    ValueError: it holds more than `limit` bytes, in one line.
  """
  with open(path, "rb") as f:
    data = f.read(limit + 1)
  if len(data) > limit:
    raise fail(label or os.fspath(path), f"more than {limit} bytes"
               + (f"; {advice}" if advice else " (refused)"))
  return data


def read_member(archive: zipfile.ZipFile, name: str, limit: int, label) -> bytes:
  """Reads one member by its fixed name, after checking what it declares.

  Raises:
    ValueError: the member is missing, duplicated, encrypted, declares more
      than `limit` bytes or an implausible compression ratio, or is corrupt.
  """
  infos = [info for info in archive.infolist() if info.filename == name]
  if not infos:
    raise fail(label, f"the archive has no {name!r} member")
  if len(infos) > 1:
    raise fail(label, f"the archive holds {len(infos)} members named {name!r}; "
               "refusing an ambiguous archive")
  info = infos[0]
  if info.flag_bits & 0x1:
    raise fail(label, f"member {name!r} is encrypted")
  if info.file_size > limit:
    raise fail(label, f"member {name!r} declares {info.file_size} bytes, more "
               f"than the {limit} allowed")
  if info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
    raise fail(label, f"member {name!r} declares {info.file_size} bytes from "
               f"{info.compress_size} compressed bytes (a zip bomb?)")
  try:
    with archive.open(info) as stream:
      data = stream.read(info.file_size + 1)
  except ZIP_ERRORS as e:
    raise fail(label, f"member {name!r} cannot be read ({_one_line(e)}); the "
               "archive may be truncated or corrupt") from None
  if len(data) != info.file_size:
    raise fail(label, f"member {name!r} holds {len(data)} bytes but declares "
               f"{info.file_size}")
  return data


# ------------------------------------------------------------------------ HDF5


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def looks_like_hdf5(path) -> bool:
  """Whether the file has an HDF5 superblock signature (at 0, 512, 1024, ...)."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    offset = 0
    while offset + 8 <= size:
      f.seek(offset)
      if f.read(8) == HDF5_SIGNATURE:
        return True
      offset = 512 if offset == 0 else offset * 2
  return False


def sniff(path: str) -> Optional[str]:
  """'zip' or 'hdf5' by the file's first bytes (its signature), else None."""
  with open(path, "rb") as f:
    head = f.read(8)
  if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
    return "zip"
  if looks_like_hdf5(path):
    return "hdf5"
  return None


class H5File:
  """An HDF5 file opened read-only, with guarded navigation and reads.

  Args:
    source: a path, or the bytes of an HDF5 file (e.g. a zip member).
    label: how messages name the file.
  """

  def __init__(self, source, label):
    self.label = label
    try:
      if isinstance(source, (bytes, bytearray)):
        self.size = len(source)
        self.file = h5py.File(io.BytesIO(source), "r")
      else:
        self.size = os.path.getsize(source)
        self.file = h5py.File(source, "r")
    except H5_ERRORS as e:
      raise fail(label, f"not a readable HDF5 file ({_h5_reason(e)})") from None
    self._visited = 0

  def close(self):
    self.file.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  @property
  def root(self) -> h5py.Group:
    return self.file

  # Navigation.

  @_guarded
  def child(self, group: h5py.Group, name: str, where: str = ""):
    """The object `name` (one path component) in `group`, if a hard link.

    Returns:
      the h5py Group or Dataset, or None if there is no such link.

    Raises:
      ValueError: the link is soft or external, or the object is neither a
        group nor a dataset.
    """
    path = f"{where}/{name}" if where else name
    if not name or "/" in name or name in (".", ".."):
      raise fail(self.label, f"invalid HDF5 object name {show(path)}")
    try:
      link = group.get(name, getlink=True)
    except (KeyError, OSError, RuntimeError, TypeError) as e:
      raise fail(self.label, f"cannot read the link {show(path)} "
                 f"({_one_line(e)})") from None
    if link is None:
      return None
    if isinstance(link, h5py.SoftLink):
      raise fail(self.label, f"{show(path)} is an HDF5 soft link (to "
                 f"{show(link.path)}); refusing links in a weights file")
    if isinstance(link, h5py.ExternalLink):
      raise fail(self.label, f"{show(path)} is an HDF5 external link (to "
                 f"{show(link.filename)}); refusing links to other files")
    if not isinstance(link, h5py.HardLink):
      raise fail(self.label, f"{show(path)} is an HDF5 link of an unsupported "
                 "kind")
    self._count()
    try:
      obj = group[name]
    except (KeyError, OSError, RuntimeError) as e:
      raise fail(self.label, f"cannot open {show(path)} "
                 f"({_h5_reason(e)})") from None
    if not isinstance(obj, (h5py.Group, h5py.Dataset)):
      raise fail(self.label, f"{show(path)} is neither a group nor a dataset")
    return obj

  @_guarded
  def get(self, path: str, base: Optional[h5py.Group] = None, where: str = ""):
    """Follows a '/'-separated path from `base` (default: the root), or None."""
    obj = self.file if base is None else base
    for part in [p for p in path.split("/") if p]:
      if not isinstance(obj, h5py.Group):
        return None
      obj = self.child(obj, part, where)
      if obj is None:
        return None
      where = f"{where}/{part}" if where else part
    return obj

  @_guarded
  def names(self, group: h5py.Group, where: str = "") -> List[str]:
    """The link names in a group (sorted, as HDF5 lists them)."""
    try:
      names = list(group.keys())
    except (OSError, RuntimeError) as e:
      raise fail(self.label, f"cannot list {show(where or '/')} "
                 f"({_h5_reason(e)})") from None
    if not all(isinstance(name, str) for name in names):
      raise fail(self.label, f"{show(where or '/')} holds an object whose name "
                 "is not UTF-8 text")
    if len(names) > MAX_OBJECTS:
      raise fail(self.label, f"{show(where or '/')} holds {len(names)} objects, "
                 "too many for a weights file")
    return names

  def walk(self, group: h5py.Group, where: str = "",
           depth: int = 0) -> Iterator[Tuple[str, object]]:
    """Yields (path, object) for everything under `group`, depth first."""
    if depth > MAX_DEPTH:
      raise fail(self.label, f"{show(where)} is nested more than {MAX_DEPTH} "
                 "levels deep")
    for name in self.names(group, where):
      obj = self.child(group, name, where)
      path = f"{where}/{name}" if where else name
      yield path, obj
      if isinstance(obj, h5py.Group):
        yield from self.walk(obj, path, depth + 1)

  def _count(self):
    self._visited += 1
    if self._visited > MAX_OBJECTS:
      raise fail(self.label, f"holds more than {MAX_OBJECTS} HDF5 objects; "
                 "not a weights file")

  # Datasets.

  @_guarded
  def check_dataset(self, ds: h5py.Dataset, path: str) -> Tuple[Tuple[int, ...],
                                                                np.dtype]:
    """Checks a dataset before reading it; returns (shape, dtype).

    Raises:
      ValueError: an external or virtual dataset, a non-float dtype, or a
        declared size beyond the limits (a shape bomb).
    """
    if not isinstance(ds, h5py.Dataset):
      raise fail(self.label, f"{show(path)} is a group, expected a dataset")
    try:
      external = ds.external
      virtual = ds.is_virtual
      shape = ds.shape
      dtype = ds.dtype
      stored = ds.id.get_storage_size()
    except (OSError, RuntimeError, ValueError, TypeError) as e:
      raise fail(self.label, f"cannot inspect dataset {show(path)} "
                 f"({_h5_reason(e)})") from None
    if external:
      raise fail(self.label, f"dataset {show(path)} stores its data in external "
                 "file(s); refusing")
    if virtual:
      raise fail(self.label, f"dataset {show(path)} is a virtual dataset "
                 "(data mapped from other files); refusing")
    if shape is None:
      raise fail(self.label, f"dataset {show(path)} has no shape (null dataspace)")
    if dtype.kind != "f" or dtype.itemsize not in FLOAT_ITEMSIZES:
      raise fail(self.label, f"dataset {show(path)} has dtype {dtype}, expected "
                 "float16/32/64 weights")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared > MAX_DECLARED_BYTES:
      raise fail(self.label, f"dataset {show(path)} declares shape {shape} = "
                 f"{declared} bytes, more than {MAX_DECLARED_BYTES} (4 GiB); "
                 "refusing a shape bomb")
    backed = max(min(stored, self.size), 1)
    if declared > MAX_EXPANSION * backed:
      raise fail(self.label, f"dataset {show(path)} declares shape {shape} = "
                 f"{declared} bytes but the file stores {stored} bytes for it "
                 f"(more than {MAX_EXPANSION}x); refusing a shape bomb")
    return tuple(int(d) for d in shape), dtype

  @_guarded
  def read_dataset(self, ds: h5py.Dataset, path: str) -> np.ndarray:
    """Reads a checked dataset into memory."""
    shape, dtype = self.check_dataset(ds, path)
    try:
      array = ds[()]
    except (OSError, RuntimeError, ValueError, TypeError) as e:
      raise fail(self.label, f"dataset {show(path)} cannot be read "
                 f"({_h5_reason(e)}); the file may be truncated or corrupt"
                 ) from None
    array = np.asarray(array)
    if array.shape != shape or array.dtype != dtype:
      raise fail(self.label, f"dataset {show(path)} read as {array.dtype}"
                 f"{array.shape}, declared {dtype}{shape}")
    return array

  # Attributes.

  @_guarded
  def has_attr(self, obj, name: str) -> bool:
    try:
      return name in obj.attrs
    except (OSError, RuntimeError) as e:
      raise fail(self.label, f"cannot read attributes of {show(obj.name)} "
                 f"({_h5_reason(e)})") from None

  @_guarded
  def _attr(self, obj, name: str):
    try:
      attr_id = obj.attrs.get_id(name)
      shape = attr_id.shape
    except (KeyError, OSError, RuntimeError, TypeError) as e:
      raise fail(self.label, f"cannot read attribute {show(name)} of "
                 f"{show(obj.name)} ({_h5_reason(e)})") from None
    elements = int(np.prod(shape, dtype=object)) if shape else 1
    stored = 0
    if elements:
      try:
        stored = attr_id.get_storage_size()
      except (OSError, RuntimeError) as e:
        raise fail(self.label, f"cannot read attribute {show(name)} of "
                   f"{show(obj.name)} ({_h5_reason(e)})") from None
    if elements > MAX_ATTR_ELEMENTS or stored > MAX_ATTR_BYTES:
      raise fail(self.label, f"attribute {show(name)} of {show(obj.name)} is too "
                 f"large ({elements} elements, {stored} bytes)")
    try:
      return obj.attrs[name]
    except (OSError, RuntimeError, TypeError, ValueError) as e:
      raise fail(self.label, f"cannot read attribute {show(name)} of "
                 f"{show(obj.name)} ({_h5_reason(e)})") from None

  @_guarded
  def attr_text(self, obj, name: str, limit: int = MAX_JSON_BYTES) -> Optional[str]:
    """A string attribute (str or bytes), or None if absent."""
    if not self.has_attr(obj, name):
      return None
    value = self._attr(obj, name)
    if isinstance(value, np.ndarray) and value.shape == ():
      value = value[()]
    if isinstance(value, bytes):
      try:
        value = value.decode("utf-8")
      except UnicodeDecodeError:
        raise fail(self.label, f"attribute {show(name)} is not UTF-8 text") from None
    if not isinstance(value, str):
      raise fail(self.label, f"attribute {show(name)} of {show(obj.name)} is not "
                 "text")
    if len(value) > limit:
      raise fail(self.label, f"attribute {show(name)} is larger than {limit} "
                 "characters")
    return value

  @_guarded
  def attr_strings(self, obj, name: str) -> Optional[List[str]]:
    """A string-list attribute as Keras writes it, or None if absent.

    Accepts str or bytes elements, and lists split over `name0, name1, ...`
    (Keras splits attributes larger than 64 KB).
    """
    if self.has_attr(obj, name):
      return self._strings(obj, name)
    if not self.has_attr(obj, f"{name}0"):
      return None
    out = []
    chunk = 0
    while self.has_attr(obj, f"{name}{chunk}"):
      out.extend(self._strings(obj, f"{name}{chunk}"))
      chunk += 1
      if len(out) > MAX_ATTR_ELEMENTS or chunk > MAX_ATTR_ELEMENTS:
        raise fail(self.label, f"attribute {show(name)} is too large")
    return out

  @_guarded
  def _strings(self, obj, name: str) -> List[str]:
    value = np.asarray(self._attr(obj, name))
    if value.size == 0:
      return []  # Keras writes an empty float array for "no names".
    if value.ndim > 1:
      raise fail(self.label, f"attribute {show(name)} of {show(obj.name)} is not "
                 "a list of names")
    out = []
    for item in value.reshape(-1).tolist():
      if isinstance(item, bytes):
        try:
          item = item.decode("utf-8")
        except UnicodeDecodeError:
          raise fail(self.label, f"attribute {show(name)} holds a name that is "
                     "not UTF-8") from None
      if not isinstance(item, str):
        raise fail(self.label, f"attribute {show(name)} of {show(obj.name)} is "
                   "not a list of names")
      out.append(item)
    return out


def _one_line(error: BaseException) -> str:
  text = " ".join(str(error).split())
  return text[:300] or type(error).__name__


def _h5_reason(error: BaseException) -> str:
  """h5py's message on one line, e.g. 'Unable to synchronously open file
  (truncated file: eof = 1, sblock->base_addr = 0, stored_eof = 2)'."""
  return _one_line(error)
