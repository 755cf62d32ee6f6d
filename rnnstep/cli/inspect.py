"""rnnstep-inspect: a page showing what a model's neurons do over a text.

USAGE: rnnstep-inspect (--text=FILE | --prompt=TEXT) --output=PAGE.html [flags]

  rnnstep-inspect --text=play.txt --output=page.html        # bundled model
  rnnstep-inspect --prompt="ROMEO:" --output=page.html --neuron=0:715
  rnnstep-inspect --model=char_rnn.keras --corpus=input.txt \\
      --text=input.txt --max_chars=5000 --output=page.html

Writes ONE self-contained HTML page (inline CSS and script, no fonts or
anything else from the network; open it in any browser, offline), in the style
of Karpathy's "The Unreasonable Effectiveness of Recurrent Neural Networks":

- the text, each character's background coloured by one neuron's value after
  it (blue -1, white 0, red +1; an LSTM's cell state c as tanh(c));
- under each character, the model's 5 likeliest next characters shaded by
  probability (white 0, green 1), the one that does come next outlined;
- a menu of neurons to switch between: the --neuron ones first, then
  --num_neurons found automatically: for each property of the text (newline,
  space, capital, punctuation, vowel, position in the line and in the word,
  inside quotes or brackets, line in capitals) the neuron most correlated with
  it (|r| >= 0.3), then the neurons whose value varies most over the text;
- hovering a character shows its position, the neuron's value and the
  guesses' probabilities.

Texts longer than --max_chars are cut to their first --max_chars characters
(the page says so): a page of some thousands of characters stays quick.

The same numbers come from the library: rnnstep.inspect.analyze(model, text).

--neuron is LAYER:UNIT (layers and units counted from 0; h, the layer's
output) or LAYER:UNIT:c (an LSTM layer's cell state).

Errors are reported as one line on stderr naming the flag. Exit status: 0
success, 1 failure (model file, text file, output file), 2 bad command line,
130 Ctrl-C, 143 SIGTERM. TensorFlow's own log lines are hidden; set
RNNSTEP_DEBUG=1 to see them and tracebacks.
"""

import contextlib
import os
import sys

from absl import flags

from rnnstep.cli import common  # pylint: disable=g-bad-import-order

PROGRAM = "rnnstep-inspect"
DEFAULT_MAX_CHARS = 2000
DEFAULT_NUM_NEURONS = 12  # rnnstep.inspect.DEFAULT_NUM_NEURONS (no TF here).
MAX_INT32 = 2**31 - 1

# Private flags: see common.py.
FLAGS = flags.FlagValues()
_MODEL, _DTYPE = common.define_model_flags(FLAGS)
_CORPUS, _VOCAB = common.define_vocab_flags(FLAGS)
_TEXT = flags.DEFINE_string(
    "text", None, "The text to read through the model: a UTF-8 file.",
    flag_values=FLAGS)
_PROMPT = flags.DEFINE_string(
    "prompt", None, "Instead of --text: the text itself.", flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string(
    "output", None,
    "The HTML page to write ('-' is stdout). It appears only when the run "
    "succeeds, whole.", flag_values=FLAGS)
_NEURON = flags.DEFINE_multi_string(
    "neuron", None,
    "A neuron to show first, LAYER:UNIT or LAYER:UNIT:c (an LSTM's cell "
    "state); repeatable.", flag_values=FLAGS)
_NUM_NEURONS = flags.DEFINE_integer(
    "num_neurons", DEFAULT_NUM_NEURONS,
    "How many neurons found automatically to offer after the --neuron ones, "
    ">= 0 (0: only --neuron).", flag_values=FLAGS)
_MAX_CHARS = flags.DEFINE_integer(
    "max_chars", DEFAULT_MAX_CHARS,
    "Show at most this many characters, the text's first, >= 1.",
    flag_values=FLAGS)
flags.mark_flags_as_mutual_exclusive(["text", "prompt"], flag_values=FLAGS)
flags.mark_flag_as_required("output", flag_values=FLAGS)
common.forbid_empty(FLAGS, "text", "prompt", "output")
flags.register_validator("num_neurons", lambda n: 0 <= n <= MAX_INT32,
                         f"must be an integer in [0, {MAX_INT32}]",
                         flag_values=FLAGS)
flags.register_validator("max_chars", lambda n: 1 <= n <= MAX_INT32,
                         f"must be an integer in [1, {MAX_INT32}]",
                         flag_values=FLAGS)


def main(argv):
  common.reject_arguments(argv)
  if _TEXT.value is None and _PROMPT.value is None:
    raise common.Failure("no text to read: give --text=FILE or --prompt=TEXT",
                         common.EXIT_USAGE)
  if not _NEURON.value and _NUM_NEURONS.value == 0:
    raise common.Failure("--num_neurons=0 without --neuron leaves no neuron "
                         "to show; give --neuron=LAYER:UNIT or --num_neurons "
                         ">= 1", common.EXIT_USAGE)
  source, text = _read_text()
  notice = None
  if len(text) > _MAX_CHARS.value:
    notice = (f"Showing the first {_MAX_CHARS.value} of {len(text)} "
              f"characters of {source} (--max_chars).")
    text = text[:_MAX_CHARS.value]
  to_stdout = _OUTPUT.value == "-"
  # Opened first, so that a bad --output fails before the model is read.
  with (contextlib.nullcontext(sys.stdout) if to_stdout
        else common.atomic_output(_OUTPUT.value)) as out:
    model = common.load_model(_MODEL.value, _DTYPE.value, _CORPUS.value,
                              _VOCAB.value, flag=_MODEL.name)
    analysis = _analyze(model, source, text)
    title = (os.path.basename(_MODEL.value) if _MODEL.value
             else "the bundled Shakespeare model")
    # pylint: disable-next=g-import-not-at-top
    from rnnstep.inspect import page as inspect_page
    out.write(inspect_page.render(analysis, title, notice))
  if not to_stdout:
    unit = "characters" if isinstance(analysis.text, str) else "tokens"
    print(f"{_OUTPUT.value}: {len(analysis.text)} {unit}, "
          f"{len(analysis.offered)} neurons")
  return 0


def _analyze(model, source, text):
  """`rnnstep.inspect.analyze` with the flags, its errors naming them."""
  # pylint: disable-next=g-import-not-at-top
  from rnnstep.inspect import analysis as inspect_lib  # Imports TensorFlow.
  neurons = []
  for spec in _NEURON.value or ():
    try:
      neurons.append(inspect_lib.parse_neuron(spec, model.config.layers))
    except ValueError as e:
      raise common.Failure(f"--neuron={spec}: {e}", common.EXIT_USAGE) from None
  try:
    model.encode(text)
  except ValueError as e:
    raise common.Failure(f"{source}: {e}") from None
  return inspect_lib.analyze(model, text, neurons, _NUM_NEURONS.value)


def _read_text():
  """`(how messages name the text, the text)` from --text or --prompt."""
  if _PROMPT.value is not None:
    return "--prompt", _PROMPT.value
  path = _TEXT.value
  try:
    with open(path, encoding="utf-8") as f:  # \r\n read as \n.
      text = f.read()
  except UnicodeDecodeError as e:
    raise common.Failure(f"--text={path}: not UTF-8 text (byte {e.start}: "
                         f"{e.reason})") from None
  except OSError as e:
    raise common.Failure(f"--text={path}: {common.reason(e)}") from None
  if not text:
    raise common.Failure(f"--text={path}: the file is empty; give a text of "
                         "at least one character")
  return f"--text={path}", text


# The console-script entry point: run(argv=None).
run = common.entry_point(PROGRAM, __doc__, FLAGS, main)

if __name__ == "__main__":
  run()
