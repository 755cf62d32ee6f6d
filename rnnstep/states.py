"""A model's recurrent states: after every position, after a prompt, and as
state files (RWKV-7's state tuning `.pth`/`.safetensors`, web-rwkv's `.st`).

    state = rnnstep.prompt_state(model, "A long shared context")
    rnnstep.save_state("context.safetensors", model, state)
    rnnstep.generate(model, " Go on", 100,
                     initial_state=rnnstep.load_state("context.safetensors",
                                                      model))

Arguments are checked as `api.py` checks them (`api.check_initial_state`).
"""

import os
from typing import Union

import numpy as np

from rnnstep import errors
from rnnstep.api import _check_ids
from rnnstep.api import check_initial_state
from rnnstep.decoding import options as options_lib
from rnnstep.engine import host
from rnnstep.engine import window as window_lib
from rnnstep.model import cells
from rnnstep.model.check import check_model
from rnnstep.model import functions as functions_lib
from rnnstep.model import network as model_lib


def hidden_states(model: model_lib.Model, texts_or_ids, initial_state=None):
  """Every recurrent layer's state after every position, in one compiled call.

      states = rnnstep.hidden_states(model, ["ROMEO:", "To be"])
      states[0]["h"][1, 4]      # layer 0's h after "To be" (row 1, position 4)
      last = [{k: v[:, -1] for k, v in layer.items()} for layer in states]
      # The logits of " a" after each prompt, carried on from its state:
      rnnstep.logits(model, [model.encode(" a")] * 2, initial_state=last)

  Rows of different lengths are right-padded to the longest: at a padding
  position a row's state is held, bit for bit, from its last real position,
  so `[:, -1]` is every row's final state and each row equals that text
  alone. (Keras' masked layers hold the state the same way.)

  Args:
    model: the Model.
    texts_or_ids: a str, a list of str (any lengths), integer ids `[B, T]` or
      `[T]`, or a list of 1-D integer id sequences (any lengths).
    initial_state: None (the zero state), or one dict per layer of float32
      `[B, U]` arrays, as for `logits`.

  Returns:
    One dict per recurrent layer, in order: `{"h": [B, T, U]}`, plus `"c"` (the
    cell state) for an LSTM; float32 numpy. Position t holds the state after
    the model has read item t of the row (h is the layer's output there).

  Raises:
    ValueError: an empty or unknown-character text, bad ids, a bad
      `initial_state`, or states too large for memory (refused before
      anything is allocated); each a one-line message naming the argument.
  """
  check_model(model)
  ids, mask, state = _stepped_rows(model, texts_or_ids, initial_state,
                                   "hidden_states", every_position=True)
  sequences, _ = functions_lib.sequence_function(model)(ids, mask, state)
  return [dict(zip(cells.state_names(config), (s.numpy() for s in layer)))
          for config, layer in zip(model.config.layers, sequences)]


def _stepped_rows(model, texts_or_ids, initial_state, caller: str,
                  every_position: bool):
  """`hidden_states`' and `prompt_state`'s checks: the rows right-padded to
  int32 `[B, T]` ids, their mask (False on padding) and the initial state;
  with `every_position`, that every position's states fit in memory."""
  which = "after each position" if every_position else "after a prompt"
  if model.config.recomputes:
    raise errors.ArgumentError("texts_or_ids", f"{caller}: "
                               f"{window_lib.CANNOT_STEP}, so it has no "
                               f"state {which}")
  rows = _sequence_rows(model, texts_or_ids)
  lengths = np.array([len(row) for row in rows])
  if every_position:
    check_states_fit(model, len(rows), int(lengths.max()))
  ids = np.zeros([len(rows), lengths.max()], np.int32)
  mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
  ids[mask] = np.concatenate(rows)
  return ids, mask, check_initial_state(model, initial_state, len(rows))


def prompt_state(model: model_lib.Model, texts_or_ids, initial_state=None):
  """The state after each prompt: what `generate` carries on from.

      state = rnnstep.prompt_state(model, long_system_prompt)
      rnnstep.save_state("system.safetensors", model, state)
      # Later, in another process: the same text as from prompt + question.
      state = rnnstep.load_state("system.safetensors", model)
      rnnstep.generate(model, question, 100, initial_state=state)

  `hidden_states(model, texts_or_ids)` at each row's last position, without
  holding the state at every position (a long prompt's RWKV-7 states would
  not fit in memory): one compiled call.

  Args:
    model: the Model.
    texts_or_ids: as for `hidden_states`.
    initial_state: None (the zero state), or the state to start from, as for
      `logits`.

  Returns:
    One dict per recurrent layer of float32 `[B, U]` arrays (the form
    `initial_state` takes), named as `hidden_states` names them.

  Raises:
    ValueError: as `hidden_states`, naming the argument.
  """
  check_model(model)
  ids, mask, state = _stepped_rows(model, texts_or_ids, initial_state,
                                   "prompt_state", every_position=False)
  final = functions_lib.final_state_function(model)(ids, mask, state)
  return [dict(zip(cells.state_names(config), (s.numpy() for s in layer)))
          for config, layer in zip(model.config.layers, final)]


def load_state(path: Union[str, os.PathLike], model: model_lib.Model, *,
               batch_size: int = 1):
  """Reads a state file into an `initial_state` for `generate`, `stream`,
  `logits`, `hidden_states` and `prompt_state`.

      state = rnnstep.load_state("rwkv7-role-play.pth", model)
      rnnstep.generate(model, "User: hi\n\nAssistant:", 200,
                       initial_state=state)

  An RWKV-7 model reads the files RWKV's state tuning writes and RWKV-Runner
  and ai00 load: a `.pth` (`torch.save`, read as data: no code in it runs)
  or `.safetensors` holding one `blocks.{i}.att.time_state` `[heads,
  head_size, head_size]` per block, or ai00 / web-rwkv's `.st` (the same,
  float16 and transposed); each block's token shifts start at zero unless
  the file holds them too (`save_state` writes them). Other models read
  what `save_state` writes (`layers.{i}.h`, `layers.{i}.c`). The layout:
  `rnnstep.convert.state_file`.

  Args:
    path: the state file.
    model: the Model it is for (every tensor is checked against it).
    batch_size: the rows of the state returned, each the file's state: give
      the number of prompts (and samples) the call generates. (An already
      loaded one-row state for n rows: `[{k: np.repeat(v, n, axis=0) for k,
      v in layer.items()} for layer in state]`.)

  Returns:
    One dict per recurrent layer of float32 `[batch_size, U]` arrays, the
    form `initial_state` takes.

  Raises:
    FileNotFoundError: no such file.
    ValueError: one line naming the file and the tensor at fault: not a
      state file, a pickle that asks for more than data, another block or
      layer count, shape or a dtype that is not float, values that are not
      finite; a model with no state (one that recomputes windows); a bad
      `batch_size` (an `errors.ArgumentError`).
  """
  check_model(model)
  # pylint: disable-next=g-import-not-at-top
  from rnnstep.convert import state_file  # Only loaded when needed.
  if not options_lib.is_int(batch_size) or batch_size < 1:
    raise errors.ArgumentError(
        "batch_size", f"batch_size must be a positive integer, got "
        f"{batch_size!r}")
  rows = state_file.read(errors.check_path(path, "path", "state file"),
                         model.config)
  need = batch_size * sum(row.nbytes for layer in rows for row in layer)
  have = host.available_memory_bytes()
  if have is not None and need > have:
    raise errors.ArgumentError(
        "batch_size", f"batch_size: {batch_size} rows of this state need "
        f"about {need / 2**30:.1f} GiB but only {have / 2**30:.1f} GiB is "
        "available; pass fewer rows")
  return [dict(zip(cells.state_names(config),
                   (np.repeat(row[None], batch_size, axis=0) for row in layer)))
          for config, layer in zip(model.config.layers, rows)]


def save_state(path: Union[str, os.PathLike], model: model_lib.Model, state,
               *, token_shift: bool = True) -> None:
  """Writes one row of a state (`prompt_state`'s) as a state file, atomically.

  `load_state` reads it back to the same continuation.

  Args:
    path: the file to write; its name says the format: `.safetensors`
      (float32), `.pth` (a `torch.save` archive that `torch.load`,
      RWKV-Runner and rnnstep read) or `.st` (ai00 / web-rwkv's: float16,
      so the state is rounded to float16).
    model: the Model the state is of.
    state: one row: one dict per recurrent layer of float32 `[1, U]` arrays,
      as `prompt_state(model, text)` returns (row i of a batch:
      `[{k: v[i:i + 1] for k, v in layer.items()} for layer in state]`).
    token_shift: RWKV-7: also write each block's token-shift states, so the
      file continues exactly as `state` does. False writes the WKV states
      alone, the file RWKV-Runner loads (it refuses any other tensor); it
      starts the token shifts from zero, as state-tuned files do.

  Raises:
    errors.ArgumentError: a state of the wrong form or of more than one row,
      a name without one of the suffixes, a model with no state.
    OSError: the file cannot be written.
  """
  check_model(model)
  # pylint: disable-next=g-import-not-at-top
  from rnnstep.convert import state_file  # Only loaded when needed.
  path = errors.check_path(path, "path", "state file")
  if not path.lower().endswith(state_file.SUFFIXES):
    raise errors.ArgumentError(
        "path", f"{path}: a state file's name ends in one of "
        f"{', '.join(state_file.SUFFIXES)} (its format)")
  if model.config.recomputes:
    raise errors.ArgumentError("model", f"save_state: "
                               f"{window_lib.CANNOT_STEP}, so it has no state")
  if state is None:
    raise errors.ArgumentError("state", "state is None; give the state to "
                               "save, as prompt_state(model, text) returns it")
  rows = check_initial_state(model, state, 1, "state")
  if not isinstance(token_shift, (bool, np.bool_)):
    raise errors.ArgumentError(
        "token_shift", f"token_shift must be True or False, got "
        f"{token_shift!r}")
  state_file.write(path, model.config, [[t[0] for t in layer] for layer in rows],
                   token_shift=bool(token_shift))


# How many copies of every state and logit a `sequence_function` call holds at
# its peak: the loop's TensorArrays, their batch-major copies, the numpy result.
_SEQUENCE_COPIES = 3


def check_states_fit(model, batch_size: int, length: int,
                     name: str = "texts_or_ids") -> None:
  """Refuses a `hidden_states` call whose results cannot fit in memory.

  Raises:
    ValueError: naming the argument `name`, with the estimate and what is
      available.
  """
  # Every state tensor, and the logits, per position.
  floats = model.vocab_size + sum(sum(cells.state_sizes(layer))
                                  for layer in model.config.layers)
  need = batch_size * length * floats * 4 * _SEQUENCE_COPIES
  have = host.available_memory_bytes()
  if have is not None and need > have:
    raise errors.ArgumentError(
        name, f"{name}: {batch_size} rows x {length} positions need about "
        f"{need / 2**30:.1f} GiB for every layer's states but only "
        f"{have / 2**30:.1f} GiB is available; pass fewer or shorter texts, or "
        "carry the state on from one piece to the next with initial_state")


def _sequence_rows(model, texts_or_ids):
  """`hidden_states`' input as a list of int32 id rows (each non-empty)."""
  if isinstance(texts_or_ids, str):
    texts_or_ids = [texts_or_ids]
  is_list = isinstance(texts_or_ids, (list, tuple)) and len(texts_or_ids) > 0
  if is_list and any(isinstance(item, str) for item in texts_or_ids):
    rows = []
    for i, text in enumerate(texts_or_ids):
      if not isinstance(text, str):
        raise errors.ArgumentError(
            "texts_or_ids", f"texts_or_ids[{i}] is a {type(text).__name__}; "
            "give a list of str, or of id sequences, not a mix")
      if not text:
        raise errors.ArgumentError(
            "texts_or_ids", f"texts_or_ids[{i}] is empty; give at least one "
            "character")
      try:
        rows.append(model.encode(text))
      except ValueError as e:
        raise errors.ArgumentError("texts_or_ids",
                                   f"texts_or_ids[{i}]: {e}") from None
    return rows
  if is_list and all(np.ndim(item) == 1 for item in texts_or_ids):
    return [_check_ids(model, row, f"texts_or_ids[{i}]")[0]
            for i, row in enumerate(texts_or_ids)]
  return list(_check_ids(model, texts_or_ids, "texts_or_ids"))
