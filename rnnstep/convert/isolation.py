"""Runs a file reader in a child process, so a crash in a C library is contained.

Fuzzing found that the HDF5 C library can crash (SIGSEGV) or hang while decoding
the string attributes of some corrupted `.h5` files, which no Python-level check
can prevent. Reading in a forked child turns both into a one-line `ValueError`
in the caller; the child's result (or exception) comes back over a pipe.

Only readers that need no TensorFlow run here (a fork of a process whose
TensorFlow runtime has started threads must not use it).
"""

import multiprocessing
import os
import signal

# Generous for real files (a 100 MB .h5 reads in seconds); a hang ends here.
TIMEOUT_SECONDS = 300


def available() -> bool:
  return hasattr(os, "fork") and "fork" in multiprocessing.get_all_start_methods()


def run(path: str, fn, *args, timeout: float = TIMEOUT_SECONDS, **kwargs):
  """Returns `fn(*args, **kwargs)` computed in a forked child process.

  Args:
    path: the file being read, for messages.
    fn: the reader; its result and exceptions must be picklable.
    timeout: seconds before the child is killed.

  Raises:
    Whatever `fn` raised, or ValueError if the child crashed or timed out.
  """
  context = multiprocessing.get_context("fork")
  receiver, sender = context.Pipe(duplex=False)

  def child():
    try:
      result = ("ok", fn(*args, **kwargs))
    except BaseException as e:  # pylint: disable=broad-except
      result = ("error", e)
    try:
      sender.send(result)
    except Exception as e:  # pylint: disable=broad-except  (unpicklable)
      sender.send(("error", ValueError(f"{path}: {type(e).__name__}: {e}")))

  process = context.Process(target=child, daemon=True)
  process.start()
  sender.close()
  try:
    if not receiver.poll(timeout):
      process.kill()
      raise ValueError(f"{path}: reading the file did not finish in {timeout:.0f} "
                       "s; it is corrupt or hostile (refused)")
    try:
      kind, value = receiver.recv()
    except (EOFError, OSError):  # OSError: it died part way through a message.
      process.join()
      raise ValueError(f"{path}: the file crashed its reader "
                       f"({_how(process.exitcode)}); it is corrupt or hostile "
                       "(refused)") from None
  finally:
    receiver.close()
    process.join(5)
  if kind == "error":
    raise value
  return value


def _how(exitcode) -> str:
  if exitcode is not None and exitcode < 0:
    try:
      return f"signal {signal.Signals(-exitcode).name}"
    except ValueError:
      return f"signal {-exitcode}"
  return f"exit status {exitcode}"
