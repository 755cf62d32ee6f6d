"""rnnstep-generate: text from a recurrent char model, in one on-device loop.

USAGE: rnnstep-generate [flags]

  rnnstep-generate                        # 1000 characters after "ROMEO:" (bundled model)
  rnnstep-generate --prompt=JULIET: --prompt=HAMLET: --num_samples=3 --seed=7
  rnnstep-generate --weights=model.npz --temperature=0.8 --stop=. --format=jsonl
  rnnstep-generate --stream --chunk_size=32

All prompts x samples are generated together as one batch; row R (counted from 0)
is sample S of prompt P, R = P * num_samples + S, and uses the seed pair (seed, R).
Without --seed a fresh seed is drawn; it is reported in the output (jsonl, or the
text headers when there are several samples), so passing it back with the same
flags reproduces the run.

Output, --format=text: each sample is its prompt, its continuation and a newline.
A single sample prints just that; with several, each sample is preceded by a line
  ----- row R: prompt P, sample S, seed N -----
--format=jsonl: one JSON object per sample, in row order:
  {"index": R, "prompt_index": P, "sample": S, "seed": N, "prompt": "...",
   "text": "<the continuation>", "stopped": <true if it ended on a --stop string>}

Errors are reported as one line on stderr naming the flag. Exit status: 0 success,
1 failure (model file, output file, generation), 2 bad command line, 130 Ctrl-C.
TensorFlow's own log lines are hidden; set RNNSTEP_DEBUG=1 to see them and
tracebacks.
"""

import contextlib
import json
import math
import os
import secrets
import signal
import sys
import tempfile
import threading
import time

# Read by TensorFlow when it is first imported; an explicit setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

import rnnstep  # pylint: disable=g-import-not-at-top

PROGRAM = "rnnstep-generate"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
HELP_FLAGS = ("--help", "--helpshort", "--helpfull", "--helpxml", "-?", "-help",
              "-helpshort", "-helpfull", "-helpxml")
DEFAULT_PROMPT = "ROMEO:"
# rnnstep.model.DTYPES, spelled out so that flag definition (and --help, and
# flag errors) need not import TensorFlow; tests check the two agree.
DTYPES = ("float32", "bfloat16", "float16")
MAX_INT32 = 2**31 - 1

_WEIGHTS = flags.DEFINE_string(
    "weights", None,
    "Model file (.npz; make one from Keras weights with rnnstep-convert). "
    "Default: the Shakespeare model bundled with rnnstep.")
_PROMPT = flags.DEFINE_multi_string(
    "prompt", [DEFAULT_PROMPT],
    f"Text to continue. Repeat the flag for several prompts (one batch). "
    f"Default: {DEFAULT_PROMPT!r}, as in the TensorFlow text-generation tutorial")
_NUM_STEPS = flags.DEFINE_integer(
    "num_steps", 1000,
    "Characters to generate per sample, >= 0 (fewer when a --stop string ends "
    "the sample).")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 1.0,
    "Sampling temperature, >= 0: logits are divided by it; 0 is greedy (argmax).")
_TOP_K = flags.DEFINE_integer(
    "top_k", 0, "Sample among the k most likely characters only; 0 = off.")
_TOP_P = flags.DEFINE_float(
    "top_p", 1.0,
    "Nucleus sampling: sample among the most likely characters holding this "
    "much probability; in (0, 1], 1 = off.")
_SEED = flags.DEFINE_integer(
    "seed", None,
    "Random seed (64-bit): the same seed and flags give the same text; row R "
    "uses (seed, R). Default: a fresh seed in [0, 2**31), reported in the "
    "output.")
_NUM_SAMPLES = flags.DEFINE_integer(
    "num_samples", 1,
    "Samples per prompt, >= 1; all prompts x samples rows are generated as one "
    "batch.")
_STOP = flags.DEFINE_multi_string(
    "stop", None,
    "Stop string (repeatable): a sample ends as soon as its continuation "
    "contains one (ending with it); generation ends when every sample has")
_JIT_COMPILE = flags.DEFINE_boolean(
    "jit_compile", None,
    "Compile with XLA (--jit_compile) or not (--nojit_compile). "
    "Default: the library's choice (the faster path).")
_DTYPE = flags.DEFINE_enum(
    "dtype", "float32", DTYPES,
    "Precision of the recurrent and output matmuls (reduced precision is "
    "faster on some hardware, at some cost in fidelity).")
_OUTPUT = flags.DEFINE_string(
    "output", None,
    "Write the output to this file instead of stdout ('-' is stdout). The file "
    "appears only when the run succeeds, whole: never a partial file.")
_FORMAT = flags.DEFINE_enum(
    "format", "text", ["text", "jsonl"],
    "text: prompt + continuation per sample, with a header line per sample "
    "when there are several; jsonl: one JSON object per sample (fields in "
    "--help).")
_STREAM = flags.DEFINE_boolean(
    "stream", False,
    "Generate --chunk_size steps per device call (state kept on device) and "
    "print text as it comes, flushing. The output is byte for byte what the "
    "same run prints without --stream: samples print in order, so the first "
    "sample streams live and each later one streams once every sample before "
    "it has ended (stop string or --num_steps); in jsonl each object is "
    "printed as soon as its sample and all before it have ended.")
_CHUNK_SIZE = flags.DEFINE_integer(
    "chunk_size", 64, "Steps per device call with --stream, >= 1.")


def _validate(name, predicate, message):
  """A check run after all flags are parsed: every bad value is reported."""
  flags.register_validator(name, predicate, message)


_validate("num_steps", lambda n: 0 <= n <= MAX_INT32,
          f"must be an integer in [0, {MAX_INT32}]")
_validate("temperature", lambda t: math.isfinite(t) and t >= 0,
          "must be a finite number >= 0 (0 = greedy)")
_validate("top_k", lambda k: 0 <= k <= MAX_INT32,
          f"must be an integer in [0, {MAX_INT32}] (0 = off)")
_validate("top_p", lambda p: 0 < p <= 1, "must be in (0, 1] (1 = off)")
_validate("seed", lambda s: s is None or -2**63 <= s < 2**63,
          "must be a 64-bit integer")
_validate("num_samples", lambda n: 1 <= n <= MAX_INT32,
          f"must be an integer in [1, {MAX_INT32}]")
_validate("chunk_size", lambda n: 1 <= n <= MAX_INT32,
          f"must be an integer in [1, {MAX_INT32}]")
_validate("prompt", all, "a prompt is empty; give at least one character")
_validate("stop", lambda stops: not stops or all(stops),
          "a stop string is empty; give at least one character")

_OWN_FLAGS = ("weights", "prompt", "num_steps", "temperature", "top_k", "top_p",
              "seed", "num_samples", "stop", "jit_compile", "dtype", "output",
              "format", "stream", "chunk_size")


class Failure(Exception):
  """An error to report as one line on stderr, with an exit status."""

  def __init__(self, message: str, status: int = EXIT_FAILURE):
    super().__init__(message)
    self.status = status


# The real stderr while fd 2 points at /dev/null (see `_quiet_stderr`).
_stderr = None


def run():
  """The console-script entry point."""
  global _stderr
  _adopt_flags_for_help()
  signal.signal(signal.SIGTERM, _terminate)
  with _quiet_stderr() as stream:
    _stderr = stream
    try:
      app.run(main, flags_parser=_parse_flags)
    finally:
      _stderr = None


def _terminate(signum, frame):
  """SIGTERM unwinds like Ctrl-C (no temp output file left), then exits."""
  del frame
  raise SystemExit(128 + signum)


def main(argv):
  try:
    if len(argv) > 1:
      raise Failure(f"unexpected argument {argv[1]!r}; give prompts with "
                    "--prompt", EXIT_USAGE)
    seed = secrets.randbelow(2**31) if _SEED.value is None else _SEED.value
    rows = [(p, s, prompt) for p, prompt in enumerate(_PROMPT.value)
            for s in range(_NUM_SAMPLES.value)]
    with _open_output(_OUTPUT.value) as out:
      model = _load_model()
      printer = Printer(out, rows, seed, _STOP.value or [], _FORMAT.value,
                        flush=_STREAM.value)
      _generate(model, rows, seed, printer)
  except Failure as e:
    return _report(str(e), e.status)
  except BrokenPipeError:
    # The reader went away (e.g. `| head`): stop quietly, as `cat` would.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_FAILURE
  except KeyboardInterrupt:
    return _report("interrupted", EXIT_INTERRUPTED)
  except Exception as e:  # pylint: disable=broad-except
    if _debug():
      raise
    return _report(f"{type(e).__name__}: {e}", EXIT_FAILURE)
  return 0


def _debug() -> bool:
  return bool(os.environ.get("RNNSTEP_DEBUG"))


@contextlib.contextmanager
def _quiet_stderr():
  """Points fd 2 at /dev/null and yields a stream to the real stderr.

  TensorFlow's C++ logging writes to fd 2 and ignores TF_CPP_MIN_LOG_LEVEL for
  part of it (tensorflow/tensorflow#100442; and a cuInit error from an absl init
  callback TF registers); our own lines (errors, progress) go to the stream
  yielded here. RNNSTEP_DEBUG=1 leaves stderr alone.
  """
  if _debug():
    yield sys.stderr
    return
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # No stderr at all: nothing to keep quiet.
    yield sys.stderr
    return
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  os.close(devnull)
  real = os.fdopen(os.dup(saved), "w", encoding="utf-8",
                   errors="backslashreplace")
  try:
    yield real
  finally:
    with contextlib.suppress(OSError, ValueError):
      sys.stderr.flush()
    real.close()
    os.dup2(saved, 2)
    os.close(saved)


def _load_model():
  try:
    return rnnstep.load(_WEIGHTS.value, dtype=_DTYPE.value)
  except (OSError, ValueError) as e:
    which = "" if _WEIGHTS.value else " not given"
    raise Failure(f"--weights{which}: {_reason(e)}") from None


def _generate(model, rows, seed, printer):
  """Calls the library (one batch) and prints through `printer`."""
  prompts = [prompt for _, _, prompt in rows]
  stops = _STOP.value or []
  options = dict(temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                 top_p=_TOP_P.value, seed=seed, stop=stops or None,
                 jit_compile=_JIT_COMPILE.value)
  try:
    if _STREAM.value:
      for pieces in rnnstep.stream(model, prompts, _NUM_STEPS.value,
                                   chunk_size=_CHUNK_SIZE.value, **options):
        printer.add(pieces)
    else:
      with Progress(f"generating {len(rows)} x {_NUM_STEPS.value} characters"):
        texts = rnnstep.generate(model, prompts, _NUM_STEPS.value, **options)
      printer.add(texts)
    printer.finish()
  except ValueError as e:
    raise _blame(model, prompts, stops, e, len(rows)) from None


def _blame(model, prompts, stops, error, num_rows) -> Failure:
  """Names the flag behind a ValueError from the library."""
  for flag, texts in (("--prompt", prompts), ("--stop", stops)):
    for text in texts:
      try:
        model.encode(text)
      except ValueError as e:
        return Failure(f"{flag}={text!r}: {e}", EXIT_USAGE)
  return Failure(f"--num_steps={_NUM_STEPS.value} for {num_rows} rows "
                 f"(prompts x --num_samples): {error}")


class Printer:
  """Prints samples in row order, each as soon as the rows before it are out.

  Fed all text at once (`add(texts)`) or chunk by chunk (`add(pieces)` per
  stream chunk), it prints the same bytes; only the timing differs. Nothing is
  printed before the library's first result, so a rejected argument never
  leaves a partial output behind.

  Args:
    out: a text stream.
    rows: (prompt index, sample index, prompt) per row.
    seed: the run's int seed (row R uses (seed, R)).
    stops: the stop strings: a row whose text ends with one has ended.
    fmt: 'text' or 'jsonl'.
    flush: flush after every chunk (streaming).
  """

  def __init__(self, out, rows, seed, stops, fmt, flush=False):
    self._out = out
    self._rows = rows
    self._seed = seed
    self._stops = tuple(stops)
    self._tail_length = max(map(len, stops), default=0)
    self._fmt = fmt
    self._flush = flush
    self._pending = [[] for _ in rows]  # Text not printed yet, per row.
    self._tails = [""] * len(rows)  # The last characters, to spot stops.
    self._current = 0  # The first row not completely printed.
    self._started = False  # Whether the current row's head is printed.

  def add(self, pieces):
    """Takes the next text of every row (a list, one str per row)."""
    for row, piece in enumerate(pieces):
      if piece:
        self._pending[row].append(piece)
        if self._tail_length:
          self._tails[row] = (self._tails[row] + piece)[-self._tail_length:]
    self._advance(final=False)

  def finish(self):
    """Prints everything left: every row has ended."""
    self._advance(final=True)

  def _ended(self, row) -> bool:
    return bool(self._stops) and self._tails[row].endswith(self._stops)

  def _advance(self, final: bool):
    out = self._out
    while self._current < len(self._rows):
      row = self._current
      prompt_index, sample, prompt = self._rows[row]
      if self._fmt == "text":
        if not self._started:
          if len(self._rows) > 1:
            out.write(f"----- row {row}: prompt {prompt_index}, sample {sample}, "
                      f"seed {self._seed} -----\n")
          out.write(prompt)
          self._started = True
        out.write("".join(self._pending[row]))
        self._pending[row].clear()
      if not (final or self._ended(row)):
        break
      if self._fmt == "text":
        out.write("\n")
      else:
        out.write(json.dumps({
            "index": row, "prompt_index": prompt_index, "sample": sample,
            "seed": self._seed, "prompt": prompt,
            "text": "".join(self._pending[row]), "stopped": self._ended(row),
        }, ensure_ascii=False) + "\n")
        self._pending[row].clear()
      self._current += 1
      self._started = False
    if self._flush:
      out.flush()


class Progress:
  """A spinner and elapsed time on stderr while a device call runs (TTY only)."""

  def __init__(self, label: str, stream=None, interval: float = 0.2):
    self._label = label
    self._stream = stream or _stderr or sys.stderr
    self._interval = interval
    self._done = threading.Event()
    self._thread = None

  def __enter__(self):
    try:
      tty = self._stream.isatty()
    except (AttributeError, ValueError):
      tty = False
    if tty:
      self._thread = threading.Thread(target=self._spin, daemon=True)
      self._thread.start()
    return self

  def _spin(self):
    start = time.monotonic()
    frames = "|/-\\"
    tick = 0
    while True:
      self._stream.write(f"\r{frames[tick % len(frames)]} {PROGRAM}: "
                         f"{self._label}, {time.monotonic() - start:.1f} s")
      self._stream.flush()
      tick += 1
      if self._done.wait(self._interval):
        return

  def __exit__(self, *exc_info):
    if self._thread is not None:
      self._done.set()
      self._thread.join()
      self._stream.write("\r\033[K")  # Erase the line.
      self._stream.flush()
    return False


@contextlib.contextmanager
def _open_output(path):
  """Yields stdout, or a temp file renamed to `path` only on success."""
  if not path or path == "-":
    yield sys.stdout
    return
  if os.path.isdir(path):
    raise Failure(f"--output={path}: is a directory")
  directory = os.path.dirname(os.path.abspath(path))
  try:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp", dir=directory)
  except OSError as e:
    raise Failure(f"--output={path}: cannot create a file in {directory} "
                  f"({e.strerror or e})") from None
  try:
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
      yield f
    try:
      os.chmod(tmp, _new_file_mode(path))
      os.replace(tmp, path)
    except OSError as e:
      raise Failure(f"--output={path}: {_reason(e)}") from None
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def _new_file_mode(path) -> int:
  """The mode `open(path, 'w')` would give: the old file's, or 0666 & ~umask."""
  try:
    return os.stat(path).st_mode & 0o777
  except OSError:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _reason(error: Exception) -> str:
  if isinstance(error, OSError) and error.strerror:
    name = f": {error.filename}" if error.filename else ""
    return f"{error.strerror}{name}"
  return str(error)


def _one_line(message: str) -> str:
  return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def _report(message: str, status: int) -> int:
  stream = _stderr or sys.stderr
  stream.write(f"{PROGRAM}: error: {_one_line(message)}\n")
  stream.flush()
  return status


def _parse_flags(argv):
  """absl's parser, with every flag error as one line (absl prints two).

  absl's help flags print help and exit 1; asked for, help is a success here.
  """
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(_report(f"{e} (see --help)", EXIT_USAGE))
  except SystemExit as e:
    if e.code == 1 and any(arg.split("=")[0] in HELP_FLAGS for arg in argv[1:]):
      sys.exit(0)
    raise


def _adopt_flags_for_help():
  """Makes `--help` show this module's doc and flags when run as a script.

  absl's short help lists the key flags of the main module, named by
  sys.argv[0]; for a console script that is the wrapper, not this module.
  """
  main_module = sys.modules.get("__main__")
  if main_module is not None and not main_module.__doc__:
    main_module.__doc__ = __doc__
  for name in _OWN_FLAGS:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


if __name__ == "__main__":
  run()
