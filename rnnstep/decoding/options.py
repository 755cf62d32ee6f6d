"""The decoding options, each declared once; everything else derives from here.

An `Option` holds every fact about one setting of `rnnstep.generate`: its name,
dtype, default and "off" value, whether it takes one value per prompt
(`per_row`) or one per request, the values it accepts (`valid`, a `Range`),
which rows it acts on (`active`) and how it changes the logits (`apply`, in
the pipeline's one order). From `OPTIONS` derive:

  - `Params`, the per-row values of a request (`request.Request.sampling`),
    their dtypes and defaults (`sampling.PARAM_DTYPES`, `DEFAULTS`);
  - the checks of `generate` / `stream` (`check`) and the CLI's flags and
    their validation (`cli/generate.py` iterates `OPTIONS`);
  - the SavedModel `generate_decoding` signature's inputs and their graph
    checks (`saved_model.py`);
  - the conditional-free loop's guard: a request takes it only when no row
    needs an option that loop does not run (`plain=False`), see
    `pipeline.Invariants`.

Per step the general loop applies, in HF `generate`'s order: the `[UNK]` ban,
the look-back options (stage `HISTORY`: repetition penalty, frequency and
presence penalties in vLLM's `apply_penalties` order, n-gram ban), the
temperature, then the filters (stage `FILTER`: top-k, top-p, min-p,
typical-p), then one draw (`sampling.py`). A new option is one declaration
here, its `apply` function, and its tests.

`apply` names its function as "module:function" (resolved on first use):
this module must stay TensorFlow-free, since the command-line tools build their
flags from it before TensorFlow loads.

Per-request options (`per_row=False`) that are not logit transforms
(`repetition_window`, the beam settings, `window`) are declared for their
checks, flags and serving inputs; the code that owns them (`processors.py`,
`beams.py`, `window.py`) reads them from the request.
"""

import dataclasses
import importlib
import math
import numbers
from typing import Any, Callable, NamedTuple, Optional

from rnnstep.errors import ArgumentError

INT32_LIMIT = 2**31

# Stages, in the order the general step applies them.
HISTORY = "history"          # reads the row's ids so far; before temperature
TEMPERATURE = "temperature"  # divides the logits (0: greedy)
FILTER = "filter"            # sets ids outside a kept set to -inf
BEAM = "beam"                # read by beam search only
LOOK_BACK = "look_back"      # configures the HISTORY stage's buffer
WINDOW = "window"            # how the model reads the text (window.py)


def is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))


@dataclasses.dataclass(frozen=True)
class Range:
  """The values an option accepts: an interval, of integers or finite reals.

  Attributes:
    low: the lower bound (None: unbounded).
    high: the upper bound (None: unbounded).
    low_open: whether `low` itself is excluded.
    high_open: whether `high` itself is excluded.
    integer: integers only (else finite reals; never bool).
    words: what a value must be, for messages ("in (0, 1] (1 = off)").
  """
  low: Optional[float]
  high: Optional[float]
  low_open: bool = False
  high_open: bool = False
  integer: bool = False
  words: str = ""

  def holds(self, value) -> bool:
    """Whether one Python value is accepted."""
    if not (is_int(value) if self.integer else is_real(value)):
      return False
    if self.low is not None and (value <= self.low if self.low_open
                                 else value < self.low):
      return False
    if self.high is not None and (value >= self.high if self.high_open
                                  else value > self.high):
      return False
    return True

  def graph_checks(self, tensor, name: str):
    """TensorFlow assertions of the same bounds, for a served graph."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    message = f"{name} must be {self.words}"
    checks = []
    if not self.integer:
      checks.append(tf.debugging.assert_all_finite(tensor, message))
    if self.low is not None:
      low = tf.cast(self.low, tensor.dtype)
      checks.append((tf.debugging.assert_greater if self.low_open
                     else tf.debugging.assert_greater_equal)(
                         tensor, low, message=message))
    if self.high is not None and self.high < INT32_LIMIT:
      high = tf.cast(self.high, tensor.dtype)
      checks.append((tf.debugging.assert_less if self.high_open
                     else tf.debugging.assert_less_equal)(
                         tensor, high, message=message))
    return checks


@dataclasses.dataclass(frozen=True)
class Option:
  """One decoding option.

  Attributes:
    name: the keyword of `generate`, the CLI flag, the serving input.
    dtype: its tensor dtype name ('float32', 'int32').
    default: the value `generate` takes when none is given (None: the model
      decides, and None is accepted).
    off: the value at which it changes nothing (its `active` is False).
    per_row: one value, or one per prompt (else one per request).
    valid: the values it accepts.
    stage: where it acts (`HISTORY`, `TEMPERATURE`, `FILTER`, `BEAM`,
      `LOOK_BACK`, `WINDOW`).
    doc: what it does, one sentence (docstrings, `--help`).
    active: for per-row options of the HISTORY and FILTER stages,
      `active(values [B], vocab_size) -> bool [B]`: the rows it acts on; for
      per-request ones `active(value) -> bool []`.
    apply: "module:function" of its logits transform, or "".
      FILTER: `fn(scaled [B, V], values [B]) -> [B, V]`, after temperature;
      HISTORY: `fn(logits [B, V], values, history, settings) -> [B, V]`.
    plain: whether the conditional-free loop honours it (only temperature).
    served: an input of the SavedModel `generate_decoding` signature.
    streams: accepted by `stream` (beam options are not).
  """
  name: str
  dtype: str
  default: Any
  off: Any
  per_row: bool
  valid: Range
  stage: str
  doc: str
  active: Optional[Callable] = None
  apply: str = ""
  plain: bool = False
  served: bool = True
  streams: bool = True

  def transform(self) -> Callable:
    """The `apply` function (imported on first use)."""
    module, function = self.apply.split(":")
    return getattr(importlib.import_module(module), function)

  def check(self, value, batch_size: Optional[int] = None):
    """Checks a value for this option; returns it (a per-row list as a tuple).

    Args:
      value: one value, or (per-row options) a list with one per prompt.
      batch_size: the number of prompts (for per-row lists).

    Raises:
      ArgumentError: naming this option.
    """
    if value is None and self.default is None:  # "Decided by the model."
      return None
    if self.per_row and isinstance(value, (list, tuple)) or (
        self.per_row and type(value).__name__ == "ndarray"):
      values = list(value)
      if len(values) != batch_size:
        raise ArgumentError(
            self.name, f"{self.name} lists {len(values)} values for "
            f"{batch_size} prompts; give one value, or one per prompt")
      for i, one in enumerate(values):
        if not self.valid.holds(one):
          raise ArgumentError(
              self.name, f"{self.name}[{i}] must be {self.valid.words}, got "
              f"{one!r}")
      return tuple(values)
    if not self.valid.holds(value):
      raise ArgumentError(self.name, f"{self.name} must be {self.valid.words}, "
                          f"got {value!r}")
    return value


def _real(low, high, *, low_open=False, high_open=False, words):
  return Range(low, high, low_open, high_open, False, words)


def _int(low, high=INT32_LIMIT, *, words):
  return Range(low, high, False, True, True, words)


# The declarations, in the order the general step applies them.
OPTIONS = (
    Option("repetition_penalty", "float32", 1.0, 1.0, True,
           _real(0, None, low_open=True, words="a finite number > 0 (1 = off)"),
           HISTORY,
           "θ > 0: for each distinct id among the last `repetition_window` ids "
           "of prompt + continuation, a positive logit is divided by θ, a "
           "negative one multiplied (the CTRL/HF rule; 1 = off).",
           active=lambda values, vocab_size: values != 1.0,
           apply="rnnstep.decoding.processors:penalize"),
    # OpenAI's two additive penalties, as vLLM applies them: after the
    # repetition penalty, frequency first, over the continuation's ids only
    # (vLLM's `output_bin_counts`; the prompt is not counted).
    Option("frequency_penalty", "float32", 0.0, 0.0, True,
           _real(-2, 2, words="in [-2, 2] (0 = off)"), HISTORY,
           "OpenAI's: each id's logit is lowered by frequency_penalty times "
           "the times the continuation (not the prompt) holds it so far "
           "(negative values favour repeats; 0 = off).",
           active=lambda values, vocab_size: values != 0.0,
           apply="rnnstep.decoding.processors:penalize_frequency"),
    Option("presence_penalty", "float32", 0.0, 0.0, True,
           _real(-2, 2, words="in [-2, 2] (0 = off)"), HISTORY,
           "OpenAI's: the logit of each id the continuation (not the prompt) "
           "holds so far is lowered by presence_penalty (negative values "
           "favour repeats; 0 = off).",
           active=lambda values, vocab_size: values != 0.0,
           apply="rnnstep.decoding.processors:penalize_presence"),
    Option("no_repeat_ngram_size", "int32", 0, 0, False,
           _int(0, words="a non-negative integer (0 = off)"), HISTORY,
           "n > 0 bans any id that would complete an n-gram already in prompt "
           "+ continuation (0 = off).",
           active=lambda value: value > 0,
           apply="rnnstep.decoding.processors:ban_ngrams"),
    Option("repetition_window", "int32", 0, 0, False,
           _int(0, words="a non-negative integer (0 = off)"), LOOK_BACK,
           "How many ids the repetition penalty looks back over (0 = all)."),
    Option("temperature", "float32", 1.0, 1.0, True,
           _real(0, None, words="a finite number >= 0 (0 = greedy)"),
           TEMPERATURE,
           "0 is greedy argmax; otherwise logits are divided by it.",
           plain=True),
    Option("top_k", "int32", 0, 0, True,
           _int(0, words="a non-negative integer (0 = off)"), FILTER,
           "Keep the k most likely ids (ties at the k-th kept; 0 = off).",
           active=lambda values, vocab_size: (values > 0) & (values
                                                             < vocab_size),
           apply="rnnstep.decoding.sampling:top_k_filter"),
    Option("top_p", "float32", 1.0, 1.0, True,
           _real(0, 1, low_open=True, words="in (0, 1] (1 = off)"), FILTER,
           "Nucleus sampling: keep the smallest set of most likely ids whose "
           "probability reaches p (1 = off).",
           active=lambda values, vocab_size: values < 1.0,
           apply="rnnstep.decoding.sampling:top_p_filter"),
    Option("min_p", "float32", 0.0, 0.0, True,
           _real(0, 1, words="in [0, 1] (0 = off)"), FILTER,
           "Keep ids whose probability (after temperature) is at least min_p "
           "times the largest (0 = off).",
           active=lambda values, vocab_size: values > 0.0,
           apply="rnnstep.decoding.sampling:min_p_filter"),
    Option("typical_p", "float32", 1.0, 1.0, True,
           _real(0, 1, low_open=True, words="in (0, 1] (1 = off)"), FILTER,
           "Typical decoding (Meister et al. 2022): keep the smallest set of "
           "ids, by |-log p - H| (H the entropy), whose probability reaches "
           "typical_p (1 = off).",
           active=lambda values, vocab_size: values < 1.0,
           apply="rnnstep.decoding.sampling:typical_filter"),
    Option("num_beams", "int32", 1, 1, False,
           _int(1, words="an integer from 1 (no beam search) to the model's usable "
                "vocabulary"), BEAM,
           "k > 1 runs beam search of width k (deterministic: the sampling "
           "options and the seed do not apply).", streams=False),
    Option("length_penalty", "float32", 1.0, 1.0, False,
           _real(None, None, words="a finite number"), BEAM,
           "With beams and stop strings, finished hypotheses rank by "
           "score / length**length_penalty.", streams=False),
    Option("num_return_sequences", "int32", 1, 1, False,
           _int(1, words="an integer from 1 to num_beams"), BEAM,
           "With beams, return the r <= k best per prompt.", served=False,
           streams=False),
    Option("window", "int32", None, 0, False,
           _int(0, words="a non-negative integer (0 = step statefully)"),
           WINDOW,
           "k > 0 predicts each next character from the last k characters "
           "from a zero state (a sliding window); 0 steps the model "
           "statefully over the whole text; default: the window the model "
           "file records (models built for fixed windows), else 0.",
           served=False),
)

BY_NAME = {option.name: option for option in OPTIONS}
PER_ROW = tuple(option for option in OPTIONS if option.per_row)
SHARED = tuple(option for option in OPTIONS if not option.per_row)
FILTERS = tuple(option for option in OPTIONS if option.stage == FILTER)
HISTORY_OPTIONS = tuple(o for o in OPTIONS if o.stage == HISTORY)

# The per-row values of a request: one `[B]` tensor (or host array) each.
Params = NamedTuple("Params", [(option.name, Any) for option in PER_ROW])
Params.__doc__ = ("Per-row decoding values, one field per per-row `Option` "
                  "(`options.PER_ROW`), each `[B]` on device.")
DEFAULTS = Params(*(option.default for option in PER_ROW))


def check(name: str, value, batch_size: Optional[int] = None):
  """`BY_NAME[name].check(value, batch_size)`."""
  return BY_NAME[name].check(value, batch_size)
