"""Writing outputs whole or not at all: a temp file (or directory) beside the
destination that replaces it only once it is complete.

Every writer of the library uses `staged_path` (the model file, the tuning
cache, the compiled-artifact cache, the SavedModel, LiteRT and web exports);
`cli/common.py` wraps it with one-line errors that name the flag.
"""

import contextlib
import os
import shutil
import tempfile


def require_new_directory(path, advice: str = "choose a new one") -> str:
  """Checks that `path` does not exist or is an empty directory (an export's
  destination); returns it as a str.

  Raises:
    ValueError: `path` exists and is not an empty directory, in one line
      ending with `advice`.
  """
  path = os.fspath(path)
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise ValueError(f"{path}: already exists and is not an empty directory; "
                     f"{advice}")
  return path


@contextlib.contextmanager
def staged_path(path, *, directory: bool = False, prefix=None, mode=None):
  """Yields a new temp file (or empty directory) that becomes `path` on success.

  The temp `.NAME.XXXXXXXX.tmp` (or `PREFIX...tmp`) is created in `path`'s
  directory, so the rename is atomic. On success it gets `mode`, else the
  mode `open(path, 'w')` (or `os.mkdir(path)`) would give, and replaces
  `path`. On any failure, Ctrl-C or SIGTERM it is removed.

  Args:
    path: the destination.
    directory: stage a directory instead of a file.
    prefix: the temp name's prefix (default: `.NAME.`).
    mode: the permission bits to give it (default: see above).

  Raises:
    OSError: the temp cannot be created, or the rename fails.
  """
  target = os.path.abspath(path)
  options = dict(prefix=prefix or f".{os.path.basename(target)}.",
                 suffix=".tmp", dir=os.path.dirname(target))
  if directory:
    tmp = tempfile.mkdtemp(**options)
  else:
    fd, tmp = tempfile.mkstemp(**options)
    os.close(fd)
  try:
    yield tmp
    os.chmod(tmp, new_mode(target, directory) if mode is None else mode)
    os.replace(tmp, target)
  except BaseException:
    with contextlib.suppress(OSError):
      if directory:
        shutil.rmtree(tmp)
      else:
        os.unlink(tmp)
    raise


def new_mode(path, directory: bool) -> int:
  """The mode a new `path` would get: the old one's, or the default & ~umask."""
  try:
    return os.stat(path).st_mode & 0o777
  except OSError:
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask
