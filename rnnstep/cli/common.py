"""What every rnnstep command-line tool does the same way (absl front ends).

A tool is a module with a docstring (its help), a private `flags.FlagValues`
and `main(argv)`; its console-script entry point is

  run = common.entry_point(PROGRAM, __doc__, FLAGS, main)  # run(argv=None)

and this module gives it:
- Quiet stderr: fd 2 points at /dev/null while the tool runs, since TensorFlow's
  C++ logging ignores TF_CPP_MIN_LOG_LEVEL for part of what it writes
  (tensorflow/tensorflow#100442; a cuInit error from an absl init callback TF
  registers). The tool's own lines go to `stderr()`, a dup of the real stderr.
- One-line errors, `PROGRAM: error: ...`, and one exit status per outcome: 0
  success, 1 failure, 2 bad command line, 130 Ctrl-C, 143 SIGTERM (which
  unwinds like Ctrl-C, so no temp output is left). A closed stdout pipe
  (`| head`) ends quietly.
- Flags: a private FlagValues, so tools imported into one process (tests) never
  clash. Parse errors are one line (exit 2); --help, --helpshort, -h, -? print
  the doc and the tool's flags, --helpfull adds --flagfile and --undefok,
  --helpxml prints XML; help goes to stdout and exits 0. --flagfile works.
- Outputs that appear whole or not at all: `atomic_output` (a text file) and
  `staged_path` (a file or a directory), written beside the target and renamed
  onto it on success.
- RNNSTEP_DEBUG=1: stderr left alone (TensorFlow's logging shows) and
  unexpected exceptions raised, with their traceback.

Nothing here imports TensorFlow, so help and flag errors are instant; the tools
import it inside `main` (through the lazy `rnnstep` package).
"""

import contextlib
import functools
import os
import signal
import sys

# Read by TensorFlow when it is first imported; an explicit setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import flags  # pylint: disable=g-import-not-at-top

from rnnstep import staging  # pylint: disable=g-import-not-at-top
from rnnstep.model import reduced_weights  # pylint: disable=g-import-not-at-top

# Flags defined by the helpers below belong to the tool that calls them (its
# --help group), not to this module.
flags.disclaim_key_flags()

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + signal.SIGTERM
# rnnstep.model.DTYPES, spelled out so that flag definition (and --help, and
# flag errors) need not import TensorFlow; the tests check the two agree.
DTYPES = ("float32", "bfloat16", "float16")
_HELP = {"--help": "short", "-help": "short", "-h": "short", "-?": "short",
         "--helpshort": "short", "-helpshort": "short", "--helpfull": "full",
         "-helpfull": "full", "--helpxml": "xml", "-helpxml": "xml"}

# The running tool's name and the real stderr while fd 2 points at /dev/null.
_program = "rnnstep"
_stderr = None


class Failure(Exception):
  """An error to report as one line on stderr, with an exit status."""

  def __init__(self, message: str, status: int = EXIT_FAILURE):
    super().__init__(message)
    self.status = status


class Terminated(BaseException):
  """SIGTERM, raised where the program is so that it unwinds like Ctrl-C."""


def run(program: str, doc: str, flag_values: flags.FlagValues, main,
        argv=None, absl_app: bool = True):
  """Runs `main(argv)` as the tool `program`; exits with its status.

  `absl_app=False` parses the flags and calls `main` without `absl.app.run`
  (whose only other work here is setting up absl's logging, which a tool
  that logs nothing of its own can skip, and whose imports cost a warm
  rnnstep-generate ~10% of its time): the same flags, help, errors and exit
  statuses.
  """
  global _program, _stderr
  _program = program
  try:
    previous = signal.signal(signal.SIGTERM, _terminate)
    installed = True
  except ValueError:  # Not the main thread: leave SIGTERM alone.
    installed = False
  try:
    with quiet_stderr() as stream, _tensorflow_without_keras():
      _stderr = stream
      try:
        if absl_app:
          from absl import app  # pylint: disable=g-import-not-at-top
          app.run(functools.partial(_call_main, main), argv=argv,
                  flags_parser=functools.partial(parse_flags, doc,
                                                 flag_values))
        else:
          rest = parse_flags(doc, flag_values, sys.argv if argv is None
                             else argv)
          sys.exit(_call_main(main, rest))
      except (KeyboardInterrupt, Terminated) as e:  # Before main ran.
        sys.exit(_exit_status(e))
      finally:
        _stderr = None
  finally:
    if installed:
      signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)


# The module `import tensorflow` imports eagerly when Keras is installed.
_KERAS_EAGER_IMPORT = "keras.src.optimizers"


@contextlib.contextmanager
def _tensorflow_without_keras():
  """While a tool runs, `import tensorflow` does not import Keras.

  TensorFlow's `__init__` imports `keras.src.optimizers` whenever Keras is
  installed (to register Keras optimizers for SavedModels it may load), inside
  a `try: ... except ImportError`. No tool loads a Keras object (the runtime
  is Keras-free), and that import (Keras, and the IPython, prompt_toolkit and
  jedi that Keras imports) costs about 0.5 s of CPU and 40 MB in every
  process that loads TensorFlow, which is most of a short run's start-up
  beyond TensorFlow itself. A None in `sys.modules` makes that one import fail
  at once, before it imports `keras`; TensorFlow skips it. Only where Keras is
  not loaded yet, and only while the tool runs: a process that imports Keras
  afterwards (a test calling a tool in-process) gets it whole.
  """
  if "keras" in sys.modules or _KERAS_EAGER_IMPORT in sys.modules:
    yield
    return
  sys.modules[_KERAS_EAGER_IMPORT] = None
  try:
    yield
  finally:
    if sys.modules.get(_KERAS_EAGER_IMPORT, 0) is None:
      del sys.modules[_KERAS_EAGER_IMPORT]


def entry_point(program: str, doc: str, flag_values: flags.FlagValues, main):
  """A tool's console-script entry point, `run(argv=None)` (see `run`)."""
  return functools.partial(run, program, doc, flag_values, main)


def _terminate(signum, frame):
  del signum, frame
  raise Terminated()


def _call_main(main, argv) -> int:
  if not debug() and "absl.logging" in sys.modules:  # Loaded by absl.app.
    from absl import logging  # pylint: disable=g-import-not-at-top
    logging.set_verbosity(logging.ERROR)
  try:
    status = main(argv)
    sys.stdout.flush()  # A closed pipe shows here, not at exit.
    return status or 0
  except Exception as e:  # pylint: disable=broad-except
    if debug() and not isinstance(e, (Failure, BrokenPipeError)):
      raise
    return _exit_status(e)
  except (KeyboardInterrupt, Terminated) as e:
    return _exit_status(e)


def _exit_status(error: BaseException) -> int:
  """Reports `error` as one line (if it needs one) and returns the status."""
  if isinstance(error, BrokenPipeError):
    # The reader went away (e.g. `| head`): stop quietly, as `cat` would.
    with contextlib.suppress(OSError):
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_FAILURE
  if isinstance(error, KeyboardInterrupt):
    return report("interrupted", EXIT_INTERRUPTED)
  if isinstance(error, Terminated):
    return report("terminated", EXIT_TERMINATED)
  if isinstance(error, Failure):
    return report(str(error), error.status)
  return report(describe(error), EXIT_FAILURE)


def describe(error: Exception) -> str:
  """The message for an exception the tool did not turn into a Failure."""
  if isinstance(error, (OSError, ValueError, MemoryError)):  # Documented ones.
    return reason(error) or type(error).__name__
  if type(error).__module__.startswith("tensorflow."):  # E.g. out of memory.
    return f"{type(error).__name__}: {error}"
  return (f"unexpected {type(error).__name__}: {error} (please report this "
          "with the RNNSTEP_DEBUG=1 output)")


def reason(error: Exception) -> str:
  """An OSError as 'strerror: filename'; anything else as its message."""
  if isinstance(error, OSError) and error.strerror:
    name = f": {error.filename}" if error.filename else ""
    return f"{error.strerror}{name}"
  return str(error)


def _is_about(error: Exception, path) -> bool:
  """Whether an error is about the file `path` (its OSError filename, or a
  message that starts with the path)."""
  path = os.fspath(path)
  if isinstance(error, OSError) and error.filename is not None:
    return os.fspath(error.filename) == path
  return str(error).startswith(f"{path}: ")


def _without_path(error: Exception, path) -> str:
  """`reason(error)` without the path a flag's message already names."""
  if isinstance(error, OSError) and error.strerror and (
      os.fspath(error.filename or "") == os.fspath(path)):
    return error.strerror
  text = reason(error)
  prefix = f"{os.fspath(path)}: "
  return text[len(prefix):] if text.startswith(prefix) else text


def one_line(message: str) -> str:
  return "; ".join(line.strip() for line in str(message).splitlines()
                   if line.strip())


def report(message: str, status: int) -> int:
  """Writes `PROGRAM: error: message` (one line) to stderr; returns status."""
  stream = stderr()
  stream.write(f"{_program}: error: {one_line(message)}\n")
  stream.flush()
  return status


def stderr():
  """The real stderr (fd 2 may point at /dev/null while a tool runs)."""
  return _stderr or sys.stderr


def debug() -> bool:
  return bool(os.environ.get("RNNSTEP_DEBUG"))


def reject_arguments(argv, hint: str = "every input is a flag (see --help)"):
  """Every input is a flag: a positional argument is a usage error."""
  if len(argv) > 1:
    raise Failure(f"unexpected arguments {argv[1:]!r}; {hint}", EXIT_USAGE)


def parse_flags(doc: str, flag_values: flags.FlagValues, argv):
  """Parses `argv` into `flag_values`; help and errors exit (see module doc)."""
  flag_values.unparse_flags()  # A second run in one process starts afresh.
  args = argv[1:]
  if "--" in args:
    args = args[:args.index("--")]
  for arg in args:
    kind = _HELP.get(arg.split("=")[0])
    if kind == "xml":
      flag_values.write_help_in_xml_format(sys.stdout)
      sys.exit(0)
    if kind:
      text = flag_values.get_help(include_special_flags=kind == "full")
      sys.stdout.write(f"{doc.rstrip()}\n\nflags:\n{text}\n")
      sys.exit(0)
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    sys.exit(report(f"{e} (see --help)", EXIT_USAGE))
  if not flags.FLAGS.is_parsed():  # absl.app reads a few of its own.
    flags.FLAGS.mark_as_parsed()
  return rest


@contextlib.contextmanager
def quiet_stderr():
  """Points fd 2 at /dev/null and yields a stream to the real stderr.

  RNNSTEP_DEBUG=1 leaves stderr alone.
  """
  if debug():
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


@contextlib.contextmanager
def atomic_output(path, flag: str = "--output"):
  """Yields a UTF-8 text file that appears at `path` only when the block
  succeeds, whole (see `staged_path`)."""
  if os.path.isdir(path):
    raise Failure(f"{flag}={path}: is a directory")
  with staged_path(path, flag) as tmp:
    with open(tmp, "w", encoding="utf-8", newline="") as f:
      yield f


@contextlib.contextmanager
def staged_path(path, flag: str = "--output", *, directory: bool = False):
  """`staging.staged_path`, with its errors as Failures naming `flag`.

  Yields a new temp file (or empty directory) that becomes `path` on success
  and is removed on any failure, Ctrl-C or SIGTERM.
  """
  stage = contextlib.ExitStack()
  try:
    tmp = stage.enter_context(staging.staged_path(path, directory=directory))
  except OSError as e:
    kind = "directory" if directory else "file"
    parent = os.path.dirname(os.path.abspath(path))
    raise Failure(f"{flag}={path}: cannot create a {kind} in {parent} "
                  f"({e.strerror or e})") from None
  written = False
  try:
    with stage:
      yield tmp
      written = True
  except OSError as e:  # E.g. a directory became non-empty meanwhile.
    if not written:
      raise
    raise Failure(f"{flag}={path}: {e.strerror or e}") from None


def forbid_empty(flag_values: flags.FlagValues, *names: str):
  """Registers a check that each named string flag, if given, is not ''."""
  for name in names:
    flags.register_validator(name, lambda value: value is None or bool(value),
                             message=f"--{name} must not be empty",
                             flag_values=flag_values)


MODEL_HELP = (
    "Model file (.npz; make one with rnnstep-convert), or any weights file "
    "rnnstep-convert reads (Keras, PyTorch), converted in memory: then give "
    "--corpus or --vocab. Default: the Shakespeare model bundled with "
    "rnnstep.")


class ModelFlag:
  """--model and its alias --weights: the value, and the name the user typed
  (so that an error names the flag as given)."""

  def __init__(self, model, alias):
    self._model = model
    self._alias = alias

  @property
  def value(self):
    return self._model.value

  @property
  def name(self) -> str:
    return "--weights" if self._alias.present else "--model"


def define_model_flags(flag_values: flags.FlagValues,
                       model_help: str = MODEL_HELP):
  """Defines --model (with --weights as its alias: the name vLLM and
  llama.cpp use, and the one rnnstep's tools first had) and --dtype; returns a
  `ModelFlag` and the --dtype holder."""
  model = flags.DEFINE_string("model", None, model_help,
                              flag_values=flag_values)
  alias = flags.DEFINE_alias("weights", "model", flag_values=flag_values)
  dtype = flags.DEFINE_enum(
      "dtype", "float32", DTYPES,
      "Precision of the recurrent and output matmuls (reduced precision is "
      "faster on some hardware, at some cost in fidelity).",
      flag_values=flag_values)
  return ModelFlag(model, alias), dtype


WEIGHTS_DTYPE_HELP = (
    "Store the large matrices (embedding, kernels, the head) in fewer bits: "
    "float16, bfloat16, or int8 (per output channel, float32 scales); those "
    "rounded values are then the model's weights on every path, and the "
    "arithmetic stays float32 (that is --dtype). Unset: the model file's "
    "(float32 unless it was written with one). docs/guide/performance.md "
    "has each one's loss and speed.")


def define_weights_dtype_flag(flag_values: flags.FlagValues,
                              help_text: str = WEIGHTS_DTYPE_HELP):
  """Defines --weights_dtype (`rnnstep.load`'s weights_dtype); returns its
  holder."""
  return flags.DEFINE_enum("weights_dtype", None,
                           reduced_weights.WEIGHTS_DTYPES, help_text,
                           flag_values=flag_values)


def define_vocab_flags(flag_values: flags.FlagValues):
  """Defines --corpus and --vocab (for --model files without a vocabulary);
  returns their holders."""
  corpus = flags.DEFINE_string(
      "corpus", None,
      "With --model of Keras or PyTorch weights (which hold no vocabulary): "
      "the training text (UTF-8); the vocabulary is sorted(set(text)). A "
      "folder: word_language_model's data (train.txt, valid.txt, test.txt), "
      "whose words it numbers as the recipe does.",
      flag_values=flag_values)
  vocab = flags.DEFINE_string(
      "vocab", None,
      "Instead of --corpus: a vocabulary file, a UTF-8 JSON list of the "
      "characters in id order (optionally \"[UNK]\" first), or of the "
      "words of a word model; or a tokenizer file: a Keras Tokenizer's "
      "to_json(), a Hugging Face tokenizer.json, {\"kind\": \"bytes\"}.",
      flag_values=flag_values)
  flags.mark_flags_as_mutual_exclusive(["corpus", "vocab"],
                                       flag_values=flag_values)
  forbid_empty(flag_values, "corpus", "vocab")
  return corpus, vocab


STATE_HELP = (
    "A state file to start every prompt from (rnnstep.load_state): an RWKV-7 "
    "model's state-tuned .pth or .safetensors (one blocks.N.att.time_state "
    "per block, as RWKV-Runner loads them), ai00's .st, or a file "
    "rnnstep.save_state wrote; checked against the model.")


def define_state_flag(flag_values: flags.FlagValues, extra_help: str = ""):
  """Defines --state (a state file every prompt starts from); returns its
  holder. `extra_help` says how the tool uses it."""
  state = flags.DEFINE_string("state", None, f"{STATE_HELP} {extra_help}".strip(),
                              flag_values=flag_values)
  forbid_empty(flag_values, "state")
  return state


def load_state(path, model, flag: str = "--state"):
  """`rnnstep.load_state` (one row), its errors as a Failure naming the
  flag and the file."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  try:
    return rnnstep.load_state(path, model)
  except (OSError, ValueError) as e:
    raise Failure(f"{flag}={path}: {_without_path(e, path)}") from None


def load_model(weights, dtype: str, corpus=None, vocab=None,
               flag: str = "--model", weights_dtype=None, model_data=None):
  """`rnnstep.load`, its errors as a Failure naming the flag at fault.

  `weights` may be a model file or any weights file rnnstep-convert reads;
  the latter need `corpus` or `vocab`. `flag` names the model's flag as the
  user typed it (`ModelFlag.name`). `model_data`: what `read_model` read
  from `weights` already (TensorFlow not started then), built here.
  """
  from rnnstep import api  # pylint: disable=g-import-not-at-top
  with _model_errors(weights, corpus, vocab, flag):
    if model_data is not None:
      return api.build(model_data, weights, dtype=dtype,
                       weights_dtype=weights_dtype)
    return api.load(weights, dtype=dtype, corpus=corpus, vocab=vocab,
                    weights_dtype=weights_dtype)


def read_model(weights, corpus=None, vocab=None, flag: str = "--model"):
  """`rnnstep.api.read` (the model into host memory, TensorFlow not
  started), its errors as `load_model`'s; `load_model(model_data=)` builds
  it."""
  from rnnstep import api  # pylint: disable=g-import-not-at-top
  with _model_errors(weights, corpus, vocab, flag):
    return api.read(weights, corpus=corpus, vocab=vocab)


@contextlib.contextmanager
def _model_errors(weights, corpus, vocab, flag: str):
  """Reading or building a model: its errors as a Failure naming the flag
  at fault (`load_model`'s)."""
  from rnnstep import convert  # pylint: disable=g-import-not-at-top
  try:
    yield
  except convert.VocabularyRequired:
    raise Failure(f"{flag}={weights}: Keras and PyTorch weights hold no "
                  "vocabulary; give --corpus=TEXT_FILE (the training text, or "
                  "word_language_model's corpus folder) or --vocab=VOCAB_FILE "
                  "(a JSON list of the characters or words in id order, or a "
                  "tokenizer file: a Keras Tokenizer's JSON, a Hugging Face "
                  "tokenizer.json, {\"kind\": \"bytes\"})") from None
  except convert.VocabularyNotAllowed:
    given = "--corpus" if corpus is not None else "--vocab"
    which = f"={weights}" if weights else " (the bundled model)"
    raise Failure(f"{given}: {flag}{which} is an rnnstep model file, which "
                  f"holds its own vocabulary; drop {given}") from None
  except (OSError, ValueError) as e:
    # rnnstep.load checks the model before it reads the vocabulary (a model
    # it cannot run is the real blocker); a vocabulary source's own errors
    # name its path first and are given under its flag, the path once.
    for source, value in (("--corpus", corpus), ("--vocab", vocab)):
      if value is not None and _is_about(e, value):
        raise Failure(f"{source}={value}: {_without_path(e, value)}") from None
    which = "" if weights else " not given"
    raise Failure(f"{flag}{which}: {reason(e)}") from None
