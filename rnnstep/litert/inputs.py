"""The LiteRT export's inputs, declared once and built on the host with numpy.

The `generate` signature of `rnnstep.litert.export` takes every decoding
option the SavedModel serves, beam search's included, so that one flatbuffer
per model serves every request (rnnstep-generate's compiled-artifact cache
keeps one entry per model, not one per set of flags). Its inputs (`INPUTS`:
the options in their declaration order) are

  prompt_ids int32 [B, T]         right-padded ids
  prompt_lengths int32 [B]        each >= 1
  num_steps int32 []
  seed int32 []                   row i draws with the key (seed, i)
  repetition_penalty float32 [B]  the per-row options, each [B] or [1] (one
  frequency_penalty float32 [B]   value for every row)
  presence_penalty float32 [B]
  temperature float32 [B]
  top_k int32 [B]
  top_p, min_p, typical_p float32 [B]
  no_repeat_ngram_size int32 []   the shared options
  repetition_window int32 []
  num_beams int32 []
  length_penalty float32 []
  stop_table int32 [S, V]         the stop automaton (`stopping.Automaton`)
  stop_accept bool [S]
  regex_table int32 [R, V]        the regex DFA (`constraints.Dfa`)
  regex_ends bool [R]
  regex_start int32 [B] or [1]    each row's start state

and it returns `ids` int32 [N, num_steps] (zeros past a row's end) and
`lengths` int32 [N] (a row ends with its stop string, or where its pattern
can go no further). Sampling (num_beams 1) returns a row per prompt, N = B;
beam search (num_beams k > 1) k rows per prompt, N = B x k, prompt p's
hypotheses in rows p*k to p*k + k - 1, best first (`rnnstep.generate(...,
num_beams=k, num_return_sequences=k)`'s). Every option's "off" value
(`off_inputs`) is its declared `off` (`options.py`); no stop string is one
state that never accepts, no pattern every row at `constraints.FREE`.

A graph cannot compile a regular expression or stop strings, so the tables
are inputs, built here as `rnnstep.generate` builds them
(`stopping.compile_stops`, `constraints.combine`): from the vocabulary
alone, with numpy (and `interegular` for a pattern), without TensorFlow, so
that rnnstep-generate's warm path and a Python client of the export build
the same tables the library does. `Vocabulary` is what they read of a model,
made from its `vocabulary.Tokens` (a warm run has no `Model`).
"""

from typing import Dict, NamedTuple, Optional, Sequence, Tuple

from rnnstep import errors
from rnnstep.decoding import options

# The declarations import nothing more: rnnstep-generate reads them (the
# cache's key) before it knows whether it runs the artifact, and --help
# should not wait for numpy. The builders import numpy, the tables' modules
# and the vocabulary on first use.

SIGNATURE = "generate"

# The options the signature takes: every one the SavedModel serves, in
# their declaration order (`options.OPTIONS`).
OPTIONS = tuple(o for o in options.OPTIONS if o.served)


class Input(NamedTuple):
  """One input of the signature: its name, numpy dtype and shape (None: any
  size; "rows": [B], or [1] for every row alike)."""
  name: str
  dtype: str
  shape: Tuple


ROWS = "rows"
INPUTS = (
    Input("prompt_ids", "int32", (None, None)),
    Input("prompt_lengths", "int32", (None,)),
    Input("num_steps", "int32", ()),
    Input("seed", "int32", ()),
) + tuple(Input(o.name, o.dtype, (ROWS,) if o.per_row else ())
          for o in OPTIONS) + (
    Input("stop_table", "int32", (None, None)),
    Input("stop_accept", "bool", (None,)),
    Input("regex_table", "int32", (None, None)),
    Input("regex_ends", "bool", (None,)),
    Input("regex_start", "int32", (ROWS,)),
)
OUTPUTS = (Input("ids", "int32", (None, None)),
           Input("lengths", "int32", (None,)))


def usable_vocabulary(vocabulary) -> int:
  """The ids a row can generate (all but `[UNK]`): the most beams."""
  return vocabulary.vocab_size - int(vocabulary.has_unk)


class Vocabulary:
  """What the host tables read of a model (`rnnstep.Model`'s attributes of
  the same names), from its `vocabulary.Tokens` alone.

  Args:
    tokens: the model's `vocabulary.Tokens` (`vocabulary.characters(vocab)`
      for a character model).
  """

  def __init__(self, tokens):
    # pylint: disable-next=g-import-not-at-top
    from rnnstep.model import vocabulary as vocabulary_lib
    self.tokens = tokens
    self.vocab = tuple(tokens.vocab)
    self.vocab_size = len(self.vocab)
    self.is_characters = tokens.kind == "characters"
    self.has_unk = self.vocab[0] == vocabulary_lib.UNK_TOKEN

  def encode(self, text: str):
    return self.tokens.encode(text)


def off_inputs(vocab_size: int) -> Dict[str, "np.ndarray"]:
  """Every input but the prompts, num_steps and seed, at "off"."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from rnnstep.decoding import constraints
  from rnnstep.decoding import stopping
  # pylint: enable=g-import-not-at-top
  out = {}
  for option in OPTIONS:
    value = np.asarray(option.off, option.dtype)
    out[option.name] = value.reshape([1]) if option.per_row else value
  stops = stopping.stop_automaton([], vocab_size)
  free = constraints.unconstrained(1, vocab_size)
  out.update(stop_table=stops.table, stop_accept=stops.accept,
             regex_table=free.table, regex_ends=free.ends,
             regex_start=np.full([1], constraints.FREE, np.int32))
  return out


def build(vocabulary, prompt_ids: Sequence[Sequence[int]], num_steps: int,
          seed: int, *, stop: Sequence[str] = (),
          regex=None, **values) -> Dict[str, "np.ndarray"]:
  """The signature's inputs for a request, as `rnnstep.generate` takes it.

  Args:
    vocabulary: a `Vocabulary` (or an `rnnstep.Model`).
    prompt_ids: each prompt's ids (non-empty).
    num_steps: steps to generate, >= 0.
    seed: an int32 seed; row i draws with the key (seed, i).
    stop: stop strings.
    regex: None, one pattern, or one (or None) per prompt.
    **values: decoding options by name (one value, or a list with one per
      prompt for a per-row option); the rest are off.

  Returns:
    {input name: numpy array}, every input of `INPUTS`.

  Raises:
    errors.ArgumentError: a value out of its range, an option the
      signature lacks, a bad stop string or pattern (naming it).
  """
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from rnnstep.decoding import constraints
  from rnnstep.decoding import stopping
  # pylint: enable=g-import-not-at-top
  batch = len(prompt_ids)
  inputs = off_inputs(vocabulary.vocab_size)
  by_name = {o.name: o for o in OPTIONS}
  for name, value in values.items():
    if name not in by_name:
      raise errors.ArgumentError(
          name, f"{name}: the LiteRT export has no such input")
    option = by_name[name]
    value = option.check(value, batch)
    array = np.asarray(value, option.dtype)
    inputs[name] = array.reshape([-1]) if option.per_row else array
  usable = usable_vocabulary(vocabulary)
  if int(inputs["num_beams"]) > usable:  # As `rnnstep.generate` refuses it.
    raise errors.ArgumentError(
        "num_beams", f"num_beams must be an integer from 1 (no beam search) "
        f"to {usable} (the model's usable vocabulary), got "
        f"{int(inputs['num_beams'])}")
  if not -2**31 <= seed < 2**31:
    raise errors.ArgumentError("seed", f"the LiteRT export's seed is int32, "
                               f"got {seed}")
  lengths = np.array([len(p) for p in prompt_ids], np.int32)
  ids = np.zeros([batch, int(lengths.max(initial=1))], np.int32)
  for row, one in enumerate(prompt_ids):
    ids[row, :len(one)] = one
  inputs.update(prompt_ids=ids, prompt_lengths=lengths,
                num_steps=np.int32(num_steps), seed=np.int32(seed))
  if stop:
    automaton = stopping.compile_stops(vocabulary, stop)
    inputs.update(stop_table=automaton.table, stop_accept=automaton.accept)
  patterns = constraints.check(regex, batch)
  if patterns:
    dfa = constraints.combine(vocabulary, patterns)
    inputs.update(regex_table=dfa.table, regex_ends=dfa.ends,
                  regex_start=dfa.start)
  return inputs


def texts(vocabulary, ids, lengths,
          stop: Sequence[str] = (), prompts: Optional[Sequence[str]] = None):
  """The rows' texts from the signature's outputs, as `rnnstep.generate`
  decodes them (a token model's cut at its stop string's end; a `recipe`
  vocabulary's from each row's prompt on)."""
  tokens = vocabulary.tokens
  prompts = prompts or [""] * len(ids)
  return [tokens.text(row[:length], stop, prompt)
          for row, length, prompt in zip(ids, lengths.tolist(), prompts)]
