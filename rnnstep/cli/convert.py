"""rnnstep-convert: turn saved Keras char-RNN weights into an rnnstep model file.

Reads the weights as data -- never imports Keras, never runs code from the file.

  rnnstep-convert --input=training_checkpoints --output=model.npz --corpus=shakespeare.txt
  rnnstep-convert --input=model.keras --output=model.npz --vocab=vocab.json
  rnnstep-convert --input=w.h5 --inspect

--input takes a Keras 3 .keras archive, a .weights.h5, a Keras 2 / tf.keras .h5
(save_weights or full save), a TF checkpoint prefix (ckpt_5), or a directory of
TF checkpoints (its latest). The model must be Embedding -> GRU/LSTM/SimpleRNN
layer(s) -> Dense.

The vocabulary comes from --corpus (the training text: sorted(set(text))) or
--vocab (a UTF-8 JSON list of characters, e.g. ["\\n", " ", "!"], optionally
with "[UNK]" first). If the embedding has one row more than the characters, id 0
is "[UNK]" (the current TF tutorial's StringLookup).

--inspect prints what was found (format, layers, shapes, vocab size) and writes
nothing; with --corpus or --vocab it also checks the vocabulary fits.

Every failure exits non-zero with one line on stderr; a failed run leaves no
file at --output. Set RNNSTEP_DEBUG=1 to see TensorFlow's own logging and
tracebacks.
"""

import contextlib
import os
import sys

# Read by TensorFlow when it is first imported; an explicit setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags  # pylint: disable=g-import-not-at-top

PROG = "rnnstep-convert"
HELP_ARGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")

# A private FlagValues: these flags never clash with other rnnstep front ends
# imported into the same process (tests), and --help shows only them.
FLAGS = flags.FlagValues()
flags.DEFINE_string("input", None, "The saved weights: .keras, .weights.h5, "
                    ".h5, a TF checkpoint prefix, or a checkpoint directory.",
                    flag_values=FLAGS)
flags.DEFINE_string("output", None, "The rnnstep model file to write (.npz). "
                    "Written atomically.", flag_values=FLAGS)
flags.DEFINE_string("corpus", None, "The training text (UTF-8); the vocabulary "
                    "is sorted(set(text)).", flag_values=FLAGS)
flags.DEFINE_string("vocab", None, "A vocabulary file: a UTF-8 JSON list of "
                    "characters in id order, optionally with \"[UNK]\" first.",
                    flag_values=FLAGS)
flags.DEFINE_bool("inspect", False, "Print what the input holds and write "
                  "nothing.", flag_values=FLAGS)

flags.mark_flag_as_required("input", flag_values=FLAGS)
flags.mark_flags_as_mutual_exclusive(["corpus", "vocab"], flag_values=FLAGS)


def _check_mode(values):
  if values["inspect"]:
    if values["output"] is not None:
      raise flags.ValidationError("--inspect writes nothing; drop --output")
    return True
  if values["output"] == "":
    raise flags.ValidationError("--output must not be empty")
  if values["output"] is None:
    raise flags.ValidationError("--output is required (or use --inspect)")
  if values["corpus"] is None and values["vocab"] is None:
    raise flags.ValidationError("give --corpus=TEXT_FILE or --vocab=VOCAB_FILE "
                                "for the vocabulary")
  return True


flags.register_multi_flags_validator(["inspect", "output", "corpus", "vocab"],
                                     _check_mode, flag_values=FLAGS)
for _name in ("input", "output", "corpus", "vocab"):
  flags.register_validator(_name, lambda value: value is None or bool(value),
                           message=f"--{_name} must not be empty",
                           flag_values=FLAGS)


def _one_line(text: str) -> str:
  return " ".join(str(text).split())


# The real stderr while fd 2 points at /dev/null (see `_quiet_stderr`).
_stderr = None


def _say_error(message: str):
  stream = _stderr or sys.stderr
  stream.write(f"{PROG}: error: {_one_line(message)}\n")
  stream.flush()


def _parse_flags(argv):
  """Parses our flags; prints help to stdout (exit 0) or one error line (exit 2)."""
  FLAGS.unparse_flags()
  args = argv[1:]
  if "--" in args:
    args = args[:args.index("--")]
  if any(arg in HELP_ARGS for arg in args):
    sys.stdout.write(f"{__doc__}\nflags:\n{FLAGS.get_help()}\n")
    sys.exit(0)
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    _say_error(str(e))
    sys.exit(2)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return rest


@contextlib.contextmanager
def _quiet_stderr():
  """Points fd 2 at /dev/null and yields a stream to the real stderr.

  TensorFlow's C++ logging writes to fd 2 (e.g. a cuInit error when TF, from
  an absl init callback it registers, counts GPUs), ignoring
  TF_CPP_MIN_LOG_LEVEL for some of it; our one error line goes to the stream
  yielded here instead.
  """
  if os.environ.get("RNNSTEP_DEBUG"):
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
    try:
      sys.stderr.flush()
    except (OSError, ValueError):
      pass
    real.close()
    os.dup2(saved, 2)
    os.close(saved)


def main(argv):
  if len(argv) > 1:
    _say_error(f"unexpected arguments {argv[1:]!r}; every input is a flag "
               "(see --help)")
    return 2
  try:
    return _convert()
  except KeyboardInterrupt:
    _say_error("interrupted")
    return 130
  except (ValueError, OSError, MemoryError) as e:
    if os.environ.get("RNNSTEP_DEBUG"):
      raise
    _say_error(str(e) or type(e).__name__)
    return 1
  except Exception as e:  # pylint: disable=broad-except
    if os.environ.get("RNNSTEP_DEBUG"):
      raise
    _say_error(f"unexpected {type(e).__name__}: {e} (please report this with "
               "RNNSTEP_DEBUG=1 output)")
    return 1


def _convert() -> int:
  """Does the work; errors propagate to main(), which reports them."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.ERROR)
  from rnnstep import convert as convert_lib  # pylint: disable=g-import-not-at-top
  if FLAGS.inspect:
    summary = convert_lib.inspect(FLAGS.input)
    print(summary)
    chars = None
    if FLAGS.corpus is not None:
      chars, source = convert_lib.read_corpus_vocab(FLAGS.corpus), "the corpus"
    elif FLAGS.vocab is not None:
      chars, source = convert_lib.read_vocab_file(FLAGS.vocab), "the vocab file"
    if chars is not None:
      vocab = convert_lib.resolve_vocab(chars, summary.vocab_size, source)
      unk = " ([UNK] at id 0)" if vocab[0] != chars[0] else ""
      print(f"vocabulary: {source} fits: {len(vocab)} entries{unk}")
    print("(--inspect: nothing written)")
    return 0
  summary = convert_lib.convert(FLAGS.input, FLAGS.output, corpus=FLAGS.corpus,
                                vocab=FLAGS.vocab)
  print(summary)
  return 0


def run(argv=None):
  """The console-script entry point."""
  global _stderr
  with _quiet_stderr() as stream:
    _stderr = stream
    try:
      app.run(main, argv=argv, flags_parser=_parse_flags)
    finally:
      _stderr = None


if __name__ == "__main__":
  run()
