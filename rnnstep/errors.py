"""The one error type for a bad argument, carrying the argument's name.

Every declared check (`options.py`) and every other argument check of the
library raises `ArgumentError`: a `ValueError` whose message is one line in the
caller's words ("top_p must be in (0, 1] (1 = off), got 2") and whose
`argument` names the keyword it is about. Front ends map that name to their
own spelling (the CLI to its `--flag`) without reading the message, as absl's
`app.UsageError` lets a binary report its own usage.

This module imports nothing heavy, so the command-line tools can use it before
TensorFlow loads.
"""

import os


class ArgumentError(ValueError):
  """A bad value for one argument.

  Args:
    argument: the keyword argument's name ("top_p"; "prompts", "seed", ...).
    message: one line saying what is wrong and what to give instead.

  Attributes:
    argument: as given.
  """

  def __init__(self, argument: str, message: str):
    super().__init__(message)
    self.argument = argument

  def __reduce__(self):
    # Pickled with both arguments (a Beam worker, or the process holding a
    # shared model, sends its errors pickled), not just the message.
    return type(self), (self.argument, str(self))


def not_text(text: str) -> str:
  """What in `text` is not text, or "" if nothing is.

  A str can hold lone surrogates (JSON's "\\ud800" decodes to one), which
  have no UTF-8 encoding: every check of user text refuses them in its own
  argument's name before anything encodes them.

  Returns:
    e.g. "a lone surrogate U+D800 at position 2, which is not text (it has
    no UTF-8 encoding)", or "".
  """
  try:
    text.encode("utf-8")
    return ""
  except UnicodeEncodeError as e:
    return (f"a lone surrogate U+{ord(text[e.start]):04X} at position "
            f"{e.start}, which is not text (it has no UTF-8 encoding)")


def kind_of(value) -> str:
  """A value for an error message: its type, and a short repr."""
  return f"{type(value).__name__} {repr(value)[:60]}"


def check_path(value, argument: str, what: str = "file") -> str:
  """`value`, a path argument, as a str; refuses anything but a non-empty
  str or os.PathLike naming `argument` (an int would be taken for a file
  descriptor: `open(0)` reads standard input).

  Raises:
    ArgumentError: naming `argument`.
  """
  if isinstance(value, (str, os.PathLike)):
    path = os.fspath(value)
    if isinstance(path, str) and path:
      return path
  raise ArgumentError(
      argument, f"{argument} must be a {what}'s path (a non-empty str or "
      f"os.PathLike), got {kind_of(value)}")
