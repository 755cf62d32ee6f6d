"""Regular-expression constraints (`regex=`) as one device-side automaton.

Each pattern is compiled by `interegular` (pure Python; imported only when a
pattern is given) into a DFA over the model's vocabulary characters. Every
row of a request shares one combined table: its rows' DFAs are laid end to
end, each row starting at its own offset (`Dfa.start`), so a step gathers one
`[B, V]` slice whatever the patterns (the same one gather a step as the stop
automaton, `stopping.py`), and the table is padded to a bucket of states
under XLA (`request.build`), so a new pattern does not retrace.

Two states come first:

  - `FREE` (0): the start of rows without a pattern; every id leads back to
    it. A request whose rows all start there is unconstrained, and takes the
    plain loop (`pipeline.invariants`).
  - `DEAD` (1): the sink. A transition that leaves the pattern's language
    (no accepting state reachable from it over the vocabulary) leads here;
    each step masks the ids that do.

`ends[s]` is True where state s accepts and no id leads on to a live state:
a row that reaches one is finished (its continuation fully matches).
"""

import functools
import re
from typing import NamedTuple, Optional, Sequence

import numpy as np

try:
  from re import _parser as _re_parser  # Python >= 3.11.
except ImportError:  # pragma: no cover
  import sre_parse as _re_parser  # pylint: disable=deprecated-module

from rnnstep import errors

FREE = 0
DEAD = 1
MAX_STATES = 4096  # Per pattern, after pruning: 4096 x V int32 on device.
# The whole table's bound, which a large (word) vocabulary reaches first.
MAX_TABLE_BYTES = 256 << 20


class Dfa(NamedTuple):
  """The combined constraint automaton.

  Attributes:
    table: int32 `[S, V]`, state x next id -> state (`DEAD`: not allowed).
    ends: bool `[S]`, accepting with no live continuation (the row is done).
    start: int32 `[B]`, each row's start state.
  """
  table: np.ndarray
  ends: np.ndarray
  start: np.ndarray


def _fixed_states(vocab_size: int):
  """The `FREE` and `DEAD` rows of every table."""
  table = np.empty([2, vocab_size], np.int32)  # Not from lists: V may be 50k.
  table[0], table[1] = FREE, DEAD
  return table, np.array([False, False])


def unconstrained(batch_size: int, vocab_size: int) -> Dfa:
  """The Dfa of a request without patterns: every row `FREE`."""
  table, ends = _fixed_states(vocab_size)
  return Dfa(table, ends, np.full([batch_size], FREE, np.int32))


class _Pattern(NamedTuple):
  """One compiled pattern: `table [S, V]` with local ids (-1: dead), `ends`."""
  table: np.ndarray
  ends: np.ndarray


@functools.lru_cache(maxsize=64)
def _compile(pattern: str, vocab: tuple, usable: tuple) -> _Pattern:
  """Compiles one pattern over a vocabulary (state 0 of the result: start).

  Args:
    pattern: the regular expression (Python syntax, `re.fullmatch` sense).
    vocab: each id's text, by id: the model's characters, or its tokens'
      pieces (None: a piece that is not text on its own).
    usable: bool per id: ids that can be generated (not `[UNK]`).

  Raises:
    errors.ArgumentError: naming the pattern.
  """
  def refuse(why):
    return errors.ArgumentError("regex", f"regex {pattern!r} {why}")

  try:
    parsed = _re_parser.parse(pattern)
  except re.error as e:
    raise refuse(f"does not compile: {' '.join(str(e).split())}") from None
  # interegular reads these its own way, not as `re` does: refused rather
  # than constrain to another language than the user's.
  if parsed.state.flags & ~re.UNICODE:
    raise refuse("sets inline flags such as (?i) or (?s), which are not "
                 "supported; spell the characters out, e.g. [Aa]")
  if {"ASSERT", "ASSERT_NOT"} & set(_opcodes(parsed)):
    raise refuse("uses look-around, which is not supported")
  import interegular  # pylint: disable=g-import-not-at-top
  try:
    fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
  except Exception as e:  # pylint: disable=broad-except
    # interegular's own errors (Unsupported, InvalidSyntax) and its limits.
    detail = " ".join(str(e).split()) or type(e).__name__
    raise refuse(f"is not supported ({detail}); use plain "
                 "regular-expression syntax (no group references or "
                 "look-around)") from None
  states = sorted(fsm.states)
  index = {state: i for i, state in enumerate(states)}
  full = _token_moves(fsm, states, index, vocab, usable)
  accepting = np.array([state in fsm.finals for state in states])
  # Keep the states reachable from the start that can still reach an
  # accepting state: a move into any other is a move into DEAD. Both walks
  # go over the states' graph (each state's distinct successors), not the
  # [S, V] table: a pattern of n bounded repeats takes n rounds, each of
  # which over the table cost S x V (a minute at 1,200 states x 33k tokens).
  successors = _successors(full)
  live = _reaching(_reverse(successors), np.flatnonzero(accepting))
  start = index[fsm.initial]
  if not live[start]:
    raise refuse("matches no string over the model's vocabulary")
  full = np.where((full >= 0) & live[np.maximum(full, 0)], full, -1)
  reached = _reaching([nexts[live[nexts]] for nexts in successors], [start])
  order = [start] + [s for s in np.flatnonzero(reached) if s != start]
  if len(order) > MAX_STATES:
    raise refuse(f"needs {len(order)} DFA states, more than the limit of "
                 f"{MAX_STATES}; simplify it (bounded repeats such as "
                 "{m,n} multiply states)")
  renumber = np.full([len(states)], -1, np.int32)
  renumber[order] = np.arange(len(order))
  table = np.where(full[order] >= 0, renumber[np.maximum(full[order], 0)], -1)
  ends = accepting[order] & ~np.any(table >= 0, axis=1)
  if ends[0]:
    raise refuse("matches only the empty string; give a pattern for at least "
                 "one character")
  return _Pattern(table.astype(np.int32), ends)


def _token_moves(fsm, states, index, vocab, usable) -> np.ndarray:
  """`[S, V]`: the state after each whole token from each state, -1: dead.

  Each token's characters are walked through the character DFA (the idea
  behind outlines' token index): a token is allowed from a state iff every
  character keeps the match alive. A character model's tokens are single
  characters, so this is its one-step table. All states and tokens advance
  together, one numpy step per character position.

  Args:
    fsm: interegular's reduced FSM.
    states: its states, sorted; `index` maps each to its row.
    vocab: each id's text (None: not text on its own, never allowed).
    usable: bool per id: ids that can be generated.
  """
  texts = [t if ok and t else None for t, ok in zip(vocab, usable)]
  # Each distinct character's transition symbol (unknown characters share
  # `anything_else`'s), as a dense column of `moves`.
  columns, symbol_of = {}, []
  for char in sorted({c for t in texts if t for c in t}):
    symbol = fsm.alphabet[char]
    columns[char] = len(symbol_of)
    symbol_of.append(symbol)
  moves = np.full([len(states), len(symbol_of) + 1], -1, np.int32)
  for state, out in fsm.map.items():
    for column, symbol in enumerate(symbol_of):
      if symbol is not None and symbol in out:
        moves[index[state], column] = index[out[symbol]]
  lengths = np.array([len(t) if t else 0 for t in texts], np.int64)
  # Tokens longest first, so that the tokens still walking at a position are
  # a leading slice (a view) and a position costs S x (tokens that long).
  order = np.argsort(-lengths, kind="stable")
  width = int(lengths.max(initial=0))
  chars = np.full([len(texts), width], len(symbol_of), np.int32)
  for rank, v in enumerate(order):
    if lengths[v]:
      chars[rank, :lengths[v]] = [columns[c] for c in texts[v]]
  walking = np.repeat(np.arange(len(states), dtype=np.int32)[:, None],
                      len(texts), axis=1)
  walking[:, lengths[order] == 0] = -1  # Unusable ids, empty pieces: never.
  for position in range(width):
    count = int(np.count_nonzero(lengths > position))
    part = walking[:, :count]
    nxt = moves[np.maximum(part, 0), chars[None, :count, position]]
    part[...] = np.where(part >= 0, nxt, -1)
  full = np.empty_like(walking)
  full[:, order] = walking
  return full


def _successors(full: np.ndarray) -> list:
  """Each state's distinct next states (sorted) in a `[S, V]` move table."""
  successors, mark = [], np.zeros([len(full) + 1], bool)
  for row in full:
    mark[row + 1] = True  # Index 0: -1 (dead), dropped.
    successors.append(np.flatnonzero(mark[1:]))
    mark[:] = False
  return successors


def _reverse(successors: list) -> list:
  """Each state's predecessors, from each state's successors."""
  sources = [[] for _ in successors]
  for state, nexts in enumerate(successors):
    for target in nexts.tolist():
      sources[target].append(state)
  return [np.array(s, np.int64) for s in sources]


def _reaching(edges: list, seeds) -> np.ndarray:
  """bool `[S]`: the states reached from `seeds` along `edges` (one array
  of neighbours per state), the seeds included."""
  reached = np.zeros([len(edges)], bool)
  frontier = list(seeds)
  reached[frontier] = True
  while frontier:
    following = np.concatenate([edges[s] for s in frontier]).astype(np.int64)
    following = np.unique(following[~reached[following]])
    reached[following] = True
    frontier = following.tolist()
  return reached


def _opcodes(subpattern):
  """The names of every opcode in a parsed `re` pattern, nested ones too."""
  for op, argument in subpattern:
    yield str(op)
    stack = [argument]
    while stack:
      item = stack.pop()
      if isinstance(item, _re_parser.SubPattern):
        yield from _opcodes(item)
      elif isinstance(item, (list, tuple)):
        stack.extend(item)


def combine(model, regex: Sequence[Optional[str]]) -> Dfa:
  """The combined `Dfa` of one pattern (or None: free) per row.

  Each distinct pattern is compiled once and laid out once; rows with the
  same pattern share its states.

  Raises:
    errors.ArgumentError: a pattern that does not compile, matches nothing
      (or only the empty string) over the vocabulary, or exceeds
      `MAX_STATES`; naming it.
  """
  vocab = tuple(model.vocab if model.is_characters else model.tokens.texts)
  usable = tuple(not (model.has_unk and i == 0) for i in range(len(vocab)))
  tables, ends = map(lambda x: [x], _fixed_states(len(vocab)))
  offsets, size = {}, 2
  start = np.full([len(regex)], FREE, np.int32)
  for row, pattern in enumerate(regex):
    if pattern is None:
      continue
    if pattern not in offsets:
      compiled = _compile(pattern, vocab, usable)
      offsets[pattern] = size
      tables.append(np.where(compiled.table >= 0, compiled.table + size,
                             DEAD).astype(np.int32))
      ends.append(compiled.ends)
      size += len(compiled.ends)
    start[row] = offsets[pattern]
  need = size * len(vocab) * 4
  if need > MAX_TABLE_BYTES:
    raise errors.ArgumentError(
        "regex", f"the patterns need a table of {size} states x {len(vocab)} "
        f"tokens ({need / 2**20:.0f} MiB), more than the limit of "
        f"{MAX_TABLE_BYTES >> 20} MiB; give simpler or fewer patterns")
  return Dfa(np.concatenate(tables), np.concatenate(ends), start)


def check(regex, batch_size: int):
  """The `regex` argument as one pattern (or None) per row.

  Args:
    regex: None, a str, or a list of str / None, one per prompt.
    batch_size: the number of prompts.

  Returns:
    A tuple of `batch_size` patterns (None: unconstrained), or () for none.

  Raises:
    errors.ArgumentError: a wrong type or count.
  """
  if regex is None:
    return ()
  if isinstance(regex, str):
    return (regex,) * batch_size
  if isinstance(regex, (list, tuple)) and all(
      p is None or isinstance(p, str) for p in regex):
    if len(regex) != batch_size:
      raise errors.ArgumentError(
          "regex", f"regex lists {len(regex)} patterns for {batch_size} "
          "prompts; give one pattern, or one (or None) per prompt")
    return tuple(regex) if any(p is not None for p in regex) else ()
  raise errors.ArgumentError(
      "regex", f"regex must be a str, or a list of str (None: no pattern) "
      f"with one per prompt, got {regex!r}")
