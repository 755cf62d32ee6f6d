"""One generation request record, checked once, in the library's words.

Every front end turns what it was given into a `Record` through `check`: the
library (`api.generate`, `api.stream`), the jsonl job (`cli/jobs.py`), the
Beam handlers (`pipelines/handlers.py`) and the server (`serve/protocol.py`).
So a bad value gets the same one-line `errors.ArgumentError`, naming the
argument, whichever way it came in (the front ends only say where: a line
of IN, a record, a request field), and a decoding option declared in
`decoding/options.py` reaches all of them. What depends on a model (its
vocabulary, beams against it, the window it records, compiling a pattern)
the library checks after (`api`).

Nothing here imports TensorFlow (the command lines read it before it loads).
"""

import dataclasses
import os
import types
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.decoding import stopping
from rnnstep import errors

# The model shipped inside the package, relative to the package's folder.
BUNDLED_MODEL = os.path.join("data", "shakespeare.npz")

# `num_steps` (a request's `max_tokens`) stays below it: an int32 on device.
STEPS_LIMIT = 2**31


@dataclasses.dataclass(frozen=True)
class Record:
  """A checked generation request: what every front end runs.

  Attributes:
    prompts: the prompts (a str argument is a tuple of one), each a str or
      a tuple of token ids (`check_prompts`).
    num_steps: tokens to generate per prompt.
    seed: None, an int, or a tuple of one int per prompt.
    stop: the stop strings (none: `()`).
    regex: one pattern (or None) per prompt, or `()` for none.
    return_scores: whether the log-likelihoods are returned.
    options: every declared decoding option (`options.OPTIONS`) by name,
      checked: the given value (a per-row option's list as a tuple), else
      the declared default.
  """
  prompts: Tuple[Union[str, Tuple[int, ...]], ...]
  num_steps: int
  seed: Union[None, int, Tuple[int, ...]]
  stop: Tuple[str, ...]
  regex: Tuple[Optional[str], ...]
  return_scores: bool
  options: Mapping[str, Any]


def check(prompts, num_steps, *, seed=None, stop=None, regex=None,
          return_scores=False, options: Optional[Mapping[str, Any]] = None,
          one_row: bool = False, steps_name: str = "num_steps") -> Record:
  """Checks a generation request's values; the `Record` of them.

  Args:
    prompts: a str, or a non-empty list of str; token ids where text goes:
      a list of ints (one prompt) or a list of them (`check_prompts`).
    num_steps: a non-negative integer below 2**31.
    seed: None, a 64-bit integer, or one per prompt.
    stop: None, a stop string, or a list of them.
    regex: None, a pattern, or one (or None) per prompt.
    return_scores: True or False.
    options: the decoding options given, by declared name (a name not
      declared is the caller's to refuse first).
    one_row: a record of one prompt (a jsonl line, a Beam record): every
      value must be one value, not a list.
    steps_name: what the caller calls `num_steps` ("max_tokens").

  Raises:
    errors.ArgumentError: naming the argument.
  """
  if isinstance(prompts, str):
    prompt_tuple = (prompts,)
  elif isinstance(prompts, (list, tuple, np.ndarray)) and not one_row:
    prompt_tuple = check_prompts(prompts)
  else:
    raise errors.ArgumentError(
        "prompts", f"prompts must be a str or a list of str, got "
        f"{type(prompts).__name__}")
  check_steps(num_steps, steps_name)
  values = check_options(options or {}, len(prompt_tuple), one_row)
  if one_row:
    for name, value in (("seed", seed), ("regex", regex)):
      one_value(name, value)
  check_seed(seed, len(prompt_tuple))
  stops = check_stop(stop)
  if not isinstance(return_scores, (bool, np.bool_)):
    raise errors.ArgumentError(
        "return_scores", f"return_scores must be True or False, got "
        f"{return_scores!r}")
  return Record(
      prompts=prompt_tuple, num_steps=num_steps,
      seed=tuple(seed) if isinstance(seed, (list, tuple, np.ndarray))
      else seed,
      stop=stops, regex=constraints.check(regex, len(prompt_tuple)),
      return_scores=bool(return_scores), options=types.MappingProxyType(values))


def is_id_sequence(value) -> bool:
  """Whether a value is one prompt of token ids: a non-empty list, tuple or
  1-D array of integers (not bools)."""
  if isinstance(value, np.ndarray):
    return value.ndim == 1 and value.dtype.kind in "iu" and value.size > 0
  return (isinstance(value, (list, tuple)) and len(value) > 0
          and (all(type(v) is int for v in value)  # pylint: disable=unidiomatic-typecheck
               or all(options_lib.is_int(v) for v in value)))


def check_prompts(prompts) -> Tuple[Union[str, Tuple[int, ...]], ...]:
  """A list argument of prompts: each a str, or a prompt of token ids.

  A list of integers is one prompt of ids (OpenAI's completions `prompt`);
  a list of str and of id lists (a 2-D array: its rows) is a batch. An id
  prompt becomes a tuple of int; that each id is inside the model's
  vocabulary is checked where the prompts are encoded
  (`engine.host.prompt_batch`).

  Raises:
    errors.ArgumentError: naming `prompts` and the item at fault: an empty
      list, an item that is neither a str nor a list of ids, an id that is
      not a non-negative integer below 2**31.
  """
  if is_id_sequence(prompts):  # One prompt: prompt 0, as in a batch.
    return (_ids_of(prompts, "prompts[0]"),)
  if isinstance(prompts, np.ndarray) and prompts.ndim != 2:
    raise errors.ArgumentError(
        "prompts", f"prompts as an array must be 1-D (one prompt of token "
        f"ids) or 2-D (one per row), got shape {prompts.shape}")
  out = []
  for i, prompt in enumerate(prompts):
    where = f"prompts[{i}]"
    if isinstance(prompt, str):
      out.append(prompt)
    elif isinstance(prompt, (list, tuple, np.ndarray)):
      if not len(prompt):
        raise errors.ArgumentError(
            "prompts", f"{where} is an empty list of token ids; give at "
            "least one")
      out.append(_ids_of(prompt, where))
    else:
      raise errors.ArgumentError(
          "prompts", f"{where} must be a str or a list of token ids, got "
          f"{type(prompt).__name__} {repr(prompt)[:40]}")
  if not out:
    raise errors.ArgumentError(
        "prompts", "prompts is an empty list; give at least one prompt")
  return tuple(out)


def _ids_of(prompt, where: str) -> Tuple[int, ...]:
  """One prompt's token ids as a tuple of int, each checked alone."""
  if isinstance(prompt, np.ndarray) and (prompt.ndim != 1
                                         or prompt.dtype.kind not in "iu"):
    raise errors.ArgumentError(
        "prompts", f"{where} must be a 1-D array of integer token ids, got "
        f"{prompt.dtype} {list(prompt.shape)}")
  if (isinstance(prompt, (list, tuple))
      and all(type(v) is int for v in prompt)  # pylint: disable=unidiomatic-typecheck
      and 0 <= min(prompt) and max(prompt) < STEPS_LIMIT):
    return tuple(prompt)  # The common case (a JSON list), at C speed.
  for j, value in enumerate(prompt):
    if not options_lib.is_int(value) or not 0 <= value < STEPS_LIMIT:
      raise errors.ArgumentError(
          "prompts", f"{where}[{j}] = {repr(value)[:40]} is not a token id "
          "(an integer from 0)")
  return tuple(int(value) for value in prompt)


def check_steps(num_steps, name: str = "num_steps") -> int:
  """`num_steps` (or what the caller calls it): a non-negative int < 2**31."""
  if not options_lib.is_int(num_steps) or num_steps < 0:
    raise errors.ArgumentError(
        name, f"{name} must be a non-negative integer, got {num_steps!r}")
  if num_steps >= STEPS_LIMIT:
    raise errors.ArgumentError(
        name, f"{name} must be below 2**31, got {num_steps}")
  return num_steps


def check_options(given: Mapping[str, Any], batch_size: int,
                  one_row: bool = False) -> dict:
  """Every declared option's checked value: the given one, else its default.

  A float option's value is a float (a per-row one, a tuple of them) from
  here on, however it was given (`temperature=1`, JSON's `1`), so that
  every front end hands the engine the same types.

  Raises:
    errors.ArgumentError: naming the option.
  """
  if one_row:
    for name, value in given.items():
      one_value(name, value)
  values = {}
  for option in options_lib.OPTIONS:
    value = option.check(given.get(option.name, option.default), batch_size)
    if option.dtype == "float32" and value is not None:
      value = (tuple(float(v) for v in value) if isinstance(value, tuple)
               else float(value))
    values[option.name] = value
  return values


def one_value(name: str, value) -> None:
  """Refuses a list where a record takes one value (a record is one row)."""
  if isinstance(value, (list, tuple)):
    raise errors.ArgumentError(name, f"{name} must be one value, got "
                               f"{value!r}")


def check_seed(seed, batch_size: int) -> None:
  """None, a 64-bit integer, or a list of one per prompt."""
  def check_one(value):
    if not options_lib.is_int(value) or not -2**63 <= value < 2**63:
      raise errors.ArgumentError(
          "seed", f"seed must be None, a 64-bit integer or a list of them "
          f"(one per prompt), got {value!r}")
  if seed is None:
    return
  if isinstance(seed, (list, tuple, np.ndarray)):
    if len(seed) != batch_size:
      raise errors.ArgumentError(
          "seed", f"seed lists {len(seed)} seeds for {batch_size} prompts; "
          "give one int, or one per prompt")
    for value in seed:
      check_one(value)
  else:
    check_one(seed)


def check_stop(stop) -> Tuple[str, ...]:
  """The stop argument as a tuple of stop strings, each checked as text.

  Raises:
    errors.ArgumentError: not a str or a list of str; an empty one, one that
      is not text, or more than `stopping.MAX_STOP_BYTES` together.
  """
  if stop is None:
    stops = ()
  elif isinstance(stop, str):
    stops = (stop,)
  elif isinstance(stop, (list, tuple)) and all(isinstance(s, str)
                                               for s in stop):
    stops = tuple(stop)
  else:
    raise errors.ArgumentError(
        "stop", f"stop must be a str or a list of str, got {stop!r}")
  stopping.check_texts(stops)
  return stops


def stopped(text: str, stops: Sequence[str]) -> bool:
  """Whether a finished text ended on one of its stop strings."""
  return bool(stops) and text.endswith(tuple(stops))
