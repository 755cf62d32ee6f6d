"""Stop strings as a device-side automaton.

Several stop strings become one Aho-Corasick automaton, flattened into a dense
transition table `[S, V]` (state x next id -> state) and an `accept [S]` flag.
On device a row's stop state advances with one gather per step; the row has
ended when its state accepts. With no stop strings the table has one state that
never accepts, so the compiled loop is the same either way.
"""

import collections
from typing import NamedTuple, Sequence, Tuple

import numpy as np

from rnnstep import errors


class Automaton(NamedTuple):
  """The stop automaton: `table` int32 `[S, V]`, `accept` bool `[S]`."""
  table: np.ndarray
  accept: np.ndarray


def stop_automaton(stops: Sequence[Sequence[int]], vocab_size: int) -> Automaton:
  """Builds the automaton that accepts as soon as any stop sequence has appeared.

  Args:
    stops: id sequences, each non-empty.
    vocab_size: V.

  Returns:
    The `Automaton`; state 0 is the start.
  """
  children = [dict()]
  accept = [False]
  for seq in stops:
    node = 0
    for token in seq:
      if token not in children[node]:
        children.append({})
        accept.append(False)
        children[node][token] = len(children) - 1
      node = children[node][token]
    accept[node] = True
  table = np.zeros([len(children), vocab_size], np.int32)
  fail = [0] * len(children)
  queue = collections.deque()
  for token, child in children[0].items():
    table[0, token] = child
    queue.append(child)
  while queue:
    node = queue.popleft()
    accept[node] = accept[node] or accept[fail[node]]
    # Missing edges fall back along the failure link; the fail node is closer to
    # the root, so its row is already complete.
    table[node] = table[fail[node]]
    for token, child in children[node].items():
      fail[child] = table[fail[node], token] if node else 0
      table[node, token] = child
      queue.append(child)
  return Automaton(table, np.array(accept, bool))


def join(automata: Sequence[Automaton]) -> Tuple[Automaton, np.ndarray]:
  """Several automata as one table, laid end to end (the serving engine's
  batch of rows from different requests; `constraints.combine` joins regex
  tables the same way).

  Each automaton's states are renumbered by its offset, so a row started at
  its automaton's offset moves, accepts and stays within its own states
  exactly as in its own table: the rows of one table share nothing.

  Args:
    automata: the `Automaton`s, at least one, over one vocabulary.

  Returns:
    `(automaton, offsets)`: the joined `Automaton`, and int32 `[len(automata)]`,
    where each one's state 0 (its start) now lies.
  """
  sizes = np.array([len(a.accept) for a in automata], np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
  table = np.concatenate([a.table + offset
                          for a, offset in zip(automata, offsets)])
  accept = np.concatenate([a.accept for a in automata])
  return Automaton(table.astype(np.int32), accept), offsets


# The stop strings' UTF-8 bytes together, at most: far more than any list of
# stop strings; it bounds the served graph's build of the automaton, which
# names each prefix by its text (`exporters/stop_ops.py`).
MAX_STOP_BYTES = 4096

# The largest stop table a request may carry (`[S, V]` int32): with a 33k-word
# vocabulary that is about 500 states, far more than any list of stop strings.
MAX_TABLE_BYTES = 64 << 20


def token_automaton(stops: Sequence[bytes], pieces: Sequence[bytes]
                    ) -> Automaton:
  """The stop automaton of a token model, from each token's bytes.

  The byte-level Aho-Corasick automaton of the stop strings (their UTF-8
  bytes: a match of bytes is a match of characters, UTF-8 being
  self-synchronizing) is advanced over each token's whole piece from every
  state, giving the `[S, V]` table. A token inside which a stop string ends
  ("matched inside") leads to an accepting state, so the row ends at that
  token, as it does for a character model; the host cuts its text exactly
  at the stop string's end (`vocabulary.StreamText`). The table is computed
  once per request on the host with numpy, one step per byte position.

  Args:
    stops: the stop strings' UTF-8 bytes, each non-empty.
    pieces: the bytes each token id adds to the text.

  Returns:
    The `Automaton` over token ids; state 0 is the start.

  Raises:
    ValueError: the table would exceed `MAX_TABLE_BYTES` (one line, with its
      size).
  """
  chars = stop_automaton([list(s) for s in stops], 256)
  states, size = chars.table.shape[0], len(pieces)
  need = states * size * 4
  if need > MAX_TABLE_BYTES:
    raise ValueError(
        f"the stop strings need a table of {states} states x {size} tokens "
        f"({need / 2**20:.0f} MiB), more than the limit of "
        f"{MAX_TABLE_BYTES >> 20} MiB; give fewer or shorter stop strings")
  lengths = np.array([len(p) for p in pieces], np.int64)
  width = int(lengths.max(initial=0))
  padded = np.zeros([size, width], np.int64)
  for v, piece in enumerate(pieces):
    padded[v, :len(piece)] = np.frombuffer(piece, np.uint8)
  accepting = np.flatnonzero(chars.accept)
  done = int(accepting[0]) if accepting.size else 0
  state = np.repeat(np.arange(states, dtype=np.int64)[:, None], size, axis=1)
  matched = np.zeros([states, size], bool)
  for position in range(width):
    moving = position < lengths  # [V]: tokens with a byte at this position.
    nxt = chars.table[state, padded[None, :, position]]
    state = np.where(moving[None, :], nxt, state)
    matched |= moving[None, :] & chars.accept[state]
  # A state that already accepts never advances again on device (the row
  # has ended); the table still stays within it.
  table = np.where(matched, done, state).astype(np.int32)
  return Automaton(table, chars.accept.copy())


def check_texts(stop: Sequence[str]) -> None:
  """The checks of stop strings that need no model.

  Raises:
    errors.ArgumentError: an empty stop string, one that is not text (a lone
      surrogate), or stop strings longer than `MAX_STOP_BYTES` together.
  """
  for index, text in enumerate(stop):
    if not text:
      raise errors.ArgumentError(
          "stop", "a stop string is empty; give at least one character")
    not_text = errors.not_text(text)
    if not_text:  # Before anything encodes it.
      raise errors.ArgumentError(
          "stop", f"stop string {index} contains {not_text}; remove it")
  size = sum(len(text.encode("utf-8")) for text in stop)
  if size > MAX_STOP_BYTES:
    raise errors.ArgumentError(
        "stop", f"the stop strings are {size} bytes of UTF-8 together, more "
        f"than the limit of {MAX_STOP_BYTES}; give fewer or shorter ones")


def compile_stops(model, stop: Sequence[str]) -> Automaton:
  """Compiles stop strings for this model's vocabulary.

  `model` is an `rnnstep.Model`, or anything with its `is_characters`,
  `vocab_size`, `tokens` and `encode` (`rnnstep.litert.inputs.Vocabulary`).

  A character model's stop strings are id sequences; a token model's are
  matched over its tokens' bytes, so one may span tokens
  (`token_automaton`).

  Raises:
    errors.ArgumentError: an empty stop string, one that is not text (a lone
      surrogate), one the model can never generate, stop strings longer
      than `MAX_STOP_BYTES` together, or whose table is over its limit.
  """
  check_texts(stop)
  if not model.is_characters:
    if not stop:
      return stop_automaton([], model.vocab_size)
    try:
      return token_automaton([s.encode("utf-8") for s in stop],
                             model.tokens.pieces)
    except ValueError as e:
      raise errors.ArgumentError("stop", str(e)) from None
  sequences = []
  for text in stop:
    try:
      sequences.append(model.encode(text))
    except ValueError as e:
      raise errors.ArgumentError(
          "stop", f"stop string {text!r} can never be generated: {e}") from None
  return stop_automaton(sequences, model.vocab_size)
