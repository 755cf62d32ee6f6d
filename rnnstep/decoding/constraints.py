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

Compiling is bounded whatever the pattern (a server compiles what anyone
sends): the pattern's length, nesting and classes before it is parsed, its
positions before its automaton is built, and the automaton's states while it
is built (`regex_dfa`), each refused with `errors.ArgumentError` naming
`regex`. `limits` adds a deadline and a cancellation event, per thread.
"""

import functools
import re
from typing import Mapping, NamedTuple, Optional, Sequence

import numpy as np

try:
  from re import _parser as _re_parser  # Python >= 3.11.
except ImportError:  # pragma: no cover
  import sre_parse as _re_parser  # pylint: disable=deprecated-module

from rnnstep import errors
from rnnstep.decoding import regex_dfa

# The bounds of a build's time (per thread), and the exception a
# cancelled build raises: see `regex_dfa.limits`.
limits = regex_dfa.limits
Cancelled = regex_dfa.Cancelled

FREE = 0
DEAD = 1
MAX_STATES = 4096  # Per pattern, after pruning: 4096 x V int32 on device.
# The whole table's bound, which a large (word) vocabulary reaches first.
MAX_TABLE_BYTES = 256 << 20
# Compiling walks every token from every state of the pattern's minimal DFA,
# before the states no token boundary reaches are pruned (most of a word
# pattern's: they sit inside words); that [S, V] table is bounded too, and
# so are the pattern's character positions, repeats expanded, before its DFA
# is built.
MAX_COMPILE_BYTES = 4 * MAX_TABLE_BYTES
MAX_POSITIONS = 2 * MAX_STATES
# Bounds checked before any parser runs: a pattern's length (each position
# takes a character or a few), how deep its groups nest (the parsers recurse
# on them, interegular's about ten frames a group: 50 leaves a caller 500 of
# Python's 1000), and the characters its classes name (interegular lays each
# one out: 1.1 million for [\x00-\U0010ffff], a minute and GiBs).
MAX_PATTERN_CHARS = 2 * MAX_POSITIONS
MAX_NESTING = 50
MAX_CLASS_CHARS = 1 << 16
# The subset construction stops as soon as it has made this many states (a
# DFA of 2^n states, such as [ab]*a[ab]{n}'s, is refused while being built)
# or done this much work (a unit: a position or key visited): about a second
# each on one Zen 3 core. `_build_states` takes less for a large vocabulary.
MAX_BUILD_STATES = 4 * MAX_STATES
MAX_BUILD_WORK = 1 << 21
# States walked at once: bounds the walk's temporaries to a few MiB a state
# block whatever S (at V = 33k, 64 states: 8 MiB an array).
_WALK_BLOCK = 64
# The advice of every refusal for size.
_SIMPLIFY = "simplify it (bounded repeats such as {m,n} multiply states)"


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


class Pattern(NamedTuple):
  """One compiled pattern: `table [S, V]` with local ids (-1: dead), `ends`."""
  table: np.ndarray
  ends: np.ndarray


@functools.lru_cache(maxsize=64)
def _compile(pattern: str, vocab: tuple, usable: tuple) -> Pattern:
  """Compiles one pattern over a vocabulary (state 0 of the result: start).

  Every step is bounded before or while it runs, whatever the pattern: its
  length, nesting and character classes before any parser sees it, its
  positions before its automaton is built, and the automaton's states and
  work as they are made (`regex_dfa`), within this thread's `limits`.

  Args:
    pattern: the regular expression (Python syntax, `re.fullmatch` sense).
    vocab: each id's text, by id: the model's characters, or its tokens'
      pieces (None: a piece that is not text on its own).
    usable: bool per id: ids that can be generated (not `[UNK]`).

  Raises:
    errors.ArgumentError: naming the pattern.
    Cancelled: the check was cancelled (`limits`).
  """
  shown = (repr(pattern) if len(pattern) <= 200 else
           f"{pattern[:160]!r}... ({len(pattern)} characters)")

  def refuse(why):
    return errors.ArgumentError("regex", f"regex {shown} {why}")

  if len(pattern) > MAX_PATTERN_CHARS:
    raise refuse(f"is {len(pattern)} characters long, more than the limit "
                 f"of {MAX_PATTERN_CHARS}; " + _SIMPLIFY)
  not_text = errors.not_text(pattern)
  if not_text:
    raise refuse(f"contains {not_text}")
  depth = _nesting(pattern)
  if depth > MAX_NESTING:
    raise refuse(f"nests groups {depth} deep, more than the limit of "
                 f"{MAX_NESTING}; " + _SIMPLIFY)
  try:
    parsed = _re_parser.parse(pattern)
  except Exception as e:  # pylint: disable=broad-except
    # re.error; OverflowError (a repeat count over re's maximum); a warning
    # ("possible nested set") where warnings are errors.
    detail = " ".join(str(e).split()) or type(e).__name__
    raise refuse(f"does not compile: {detail}") from None
  # interegular reads these its own way, not as `re` does: refused rather
  # than constrain to another language than the user's.
  if parsed.state.flags & ~re.UNICODE:
    raise refuse("sets inline flags such as (?i) or (?s), which are not "
                 "supported; spell the characters out, e.g. [Aa]")
  names = {name for name, _ in _nodes(parsed)}
  if {"ASSERT", "ASSERT_NOT"} & names:
    raise refuse("uses look-around, which is not supported")
  if {"ATOMIC_GROUP", "POSSESSIVE_REPEAT"} & names:  # Python >= 3.11.
    # They change the language (no backtracking: "a*+a" matches nothing).
    raise refuse("uses an atomic group or a possessive repeat, which is not "
                 "supported; use a plain group or repeat")
  positions = _positions(parsed)
  if positions > MAX_POSITIONS:
    raise refuse(f"has {positions} character positions with its repeats "
                 f"expanded, more than the limit of {MAX_POSITIONS}; "
                 + _SIMPLIFY)
  class_chars = _class_chars(parsed)
  if class_chars > MAX_CLASS_CHARS:
    raise refuse(f"names {class_chars} characters in its classes, more than "
                 f"the limit of {MAX_CLASS_CHARS}; use a negated class such "
                 "as [^\\n] for \"almost anything\"")
  import interegular  # pylint: disable=g-import-not-at-top
  try:
    tree = interegular.parse_pattern(pattern)
    dfa = regex_dfa.build(tree, MAX_POSITIONS, _build_states(len(vocab)),
                          MAX_BUILD_WORK)
  except (regex_dfa.TooLarge, regex_dfa.TimeUp) as e:
    raise refuse(f"{e}; " + _SIMPLIFY) from None
  except regex_dfa.Cancelled:
    raise
  except Exception as e:  # pylint: disable=broad-except
    # interegular's own errors (Unsupported, InvalidSyntax), its recursion.
    detail = " ".join(str(e).split()) or type(e).__name__
    raise refuse(f"is not supported ({detail}); use plain "
                 "regular-expression syntax (no group references or "
                 "look-around)") from None
  count = len(dfa.finals)
  working = count * len(vocab) * 4
  if working > MAX_COMPILE_BYTES:
    raise refuse(
        f"has {count} DFA states before pruning, a table of "
        f"{working / 2**20:.0f} MiB over {len(vocab)} tokens to compile, "
        f"more than the limit of {MAX_COMPILE_BYTES >> 20} MiB; " + _SIMPLIFY)
  try:
    full, columns = _token_moves(dfa, vocab, usable)
  except regex_dfa.TimeUp as e:
    raise refuse(f"{e}; " + _SIMPLIFY) from None
  accepting = dfa.finals
  # Keep the states reachable from the start that can still reach an
  # accepting state: a move into any other is a move into DEAD. Both walks
  # go over the states' graph (each state's distinct successors), not the
  # [S, V] table: a pattern of n bounded repeats takes n rounds, each of
  # which over the table cost S x V (a minute at 1,200 states x 33k tokens).
  successors = _successors(full)
  live = _reaching(_reverse(successors), np.flatnonzero(accepting))
  start = 0
  if not live[start]:
    why = ""
    if not pattern.isascii() and any(
        t is None for t, ok in zip(vocab, usable) if ok):
      # A byte model's (or a byte-level BPE's) multi-byte characters come
      # in tokens that are not text on their own, which no pattern allows.
      why = ("; its non-ASCII characters are split over tokens (bytes) "
             "that are not text on their own, which a pattern cannot "
             "allow (a byte model matches ASCII patterns only)")
    raise refuse(f"matches no string over the model's vocabulary{why}")
  reached = _reaching([nexts[live[nexts]] for nexts in successors], [start])
  order = [start] + [s for s in np.flatnonzero(reached) if s != start]
  if len(order) > MAX_STATES:
    raise refuse(f"needs {len(order)} DFA states, more than the limit of "
                 f"{MAX_STATES}; " + _SIMPLIFY)
  # Old state + 1 -> new state; -1 (dead) and every state not kept -> -1.
  # A kept state's live successors are all reached, hence all kept.
  renumber = np.full([count + 1], -1, np.int32)
  renumber[np.array(order) + 1] = np.arange(len(order), dtype=np.int32)
  table = np.empty([len(order), len(vocab)], np.int32)
  table[:, columns] = renumber[full[order] + 1]
  ends = accepting[order] & ~np.any(table >= 0, axis=1)
  if ends[0]:
    raise refuse("matches only the empty string; give a pattern for at least "
                 "one character")
  return Pattern(table, ends)  # int32 already: no copy.


def _build_states(vocab_size: int) -> int:
  """The subset construction's state budget over a vocabulary: four times
  the states whose `[S, V]` walk `MAX_COMPILE_BYTES` allows (the automaton
  before minimization has more states than after), at most
  `MAX_BUILD_STATES` (its time)."""
  return min(MAX_BUILD_STATES,
             4 * max(MAX_COMPILE_BYTES // (4 * max(vocab_size, 1)), 1))


def _token_moves(dfa, vocab, usable):
  """The state after each whole token from each state, -1: dead.

  Each token's characters are walked through the character DFA (the idea
  behind outlines' token index): a token is allowed from a state iff every
  character keeps the match alive. A character model's tokens are single
  characters, so this is its one-step table. A block of states advances
  over all tokens together, one numpy step per character position; tokens
  are taken longest first, so that the ones still walking at a position are
  a leading slice and a position costs S x (tokens that long).

  Args:
    dfa: the pattern's `regex_dfa.Automaton`.
    vocab: each id's text (None: not text on its own, never allowed).
    usable: bool per id: ids that can be generated.

  Returns:
    (int32 `[S, V]` with its columns in walking order, `columns`: the id of
    each column).

  Raises:
    regex_dfa.TimeUp, Cancelled: as this thread's `limits` say.
  """
  texts = [t if ok and t else None for t, ok in zip(vocab, usable)]
  # Each distinct character's key in the DFA's alphabet (characters the
  # pattern does not name share one), as a dense column of `moves`.
  columns, keys = {}, []
  for char in sorted({c for t in texts if t for c in t}):
    columns[char] = len(keys)
    keys.append(dfa.key(char))
  count = len(dfa.finals)
  moves = np.full([count, len(keys) + 1], -1, np.int32)
  moves[:, :len(keys)] = dfa.table[:, np.array(keys, np.int64)]
  lengths = np.array([len(t) if t else 0 for t in texts], np.int64)
  order = np.argsort(-lengths, kind="stable")
  lengths = lengths[order]
  chars = np.full([len(texts), int(lengths.max(initial=0))], len(keys),
                  np.int32)
  for rank, v in enumerate(order):
    if lengths[rank]:
      chars[rank, :lengths[rank]] = [columns[c] for c in texts[v]]
  walking_counts = [int(np.count_nonzero(lengths > position))
                    for position in range(chars.shape[1])]
  full = np.empty([count, len(texts)], np.int32)
  full[:, lengths == 0] = -1  # Unusable ids and empty pieces: never allowed.
  for first in range(0, count, _WALK_BLOCK):
    regex_dfa.poll()  # A block takes milliseconds at 33k tokens.
    block = full[first:first + _WALK_BLOCK]
    block[:, :walking_counts[0] if walking_counts else 0] = np.arange(
        first, first + len(block), dtype=np.int32)[:, None]
    for position, count_walking in enumerate(walking_counts):
      part = block[:, :count_walking]
      nxt = moves[np.maximum(part, 0), chars[None, :count_walking, position]]
      part[...] = np.where(part >= 0, nxt, -1)
  return full, order


def _successors(full: np.ndarray) -> list:
  """Each state's distinct next states (sorted) in a `[S, V]` move table."""
  successors = []
  for first in range(0, len(full), _WALK_BLOCK):  # A few MiB at a time.
    moves = np.sort(full[first:first + _WALK_BLOCK], axis=1)
    keep = moves >= 0  # -1: dead, dropped.
    keep[:, 1:] &= moves[:, 1:] != moves[:, :-1]
    ends = np.cumsum(np.count_nonzero(keep, axis=1))
    successors += np.split(moves[keep].astype(np.int64), ends[:-1])
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


def _nodes(subpattern):
  """Every (opcode name, argument) of a parsed `re` pattern, nested ones
  too (its depth is bounded by `MAX_NESTING` before it is parsed)."""
  for op, argument in subpattern:
    yield str(op), argument
    stack = [argument]
    while stack:
      item = stack.pop()
      if isinstance(item, _re_parser.SubPattern):
        yield from _nodes(item)
      elif isinstance(item, (list, tuple)):
        stack.extend(item)


def _class_chars(subpattern) -> int:
  """The characters a parsed `re` pattern's classes name, each class once
  (interegular lays out every character of a class, and `[^...]` as the
  characters it excludes); a category (`\\w`) counts as 64."""
  total = 0
  for name, argument in _nodes(subpattern):
    if name == "IN":
      for op, value in argument:
        op = str(op)
        if op == "RANGE":
          total += value[1] - value[0] + 1
        elif op == "CATEGORY":
          total += 64
        elif op != "NEGATE":
          total += 1
  return total


def _nesting(pattern: str) -> int:
  """How deep a pattern's groups nest, read as `re` reads it (escapes,
  classes and comments skipped), before any recursive parser sees it."""
  depth = deepest = i = 0
  while i < len(pattern):
    char = pattern[i]
    if char == "\\":
      i += 1
    elif char == "[":
      i += 1 + (pattern[i + 1:i + 2] == "^")
      i += pattern[i:i + 1] == "]"  # A leading "]" is a literal one.
      while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    elif pattern.startswith("(?#", i):
      end = pattern.find(")", i)
      i = len(pattern) if end < 0 else end
    elif char == "(":
      depth += 1
      deepest = max(deepest, depth)
    elif char == ")":
      depth -= 1
    i += 1
  return deepest


def _positions(subpattern) -> int:
  """A parsed `re` pattern's character positions (literals and classes,
  every branch's) with each bounded repeat expanded (an unbounded one
  counted once past its minimum): a cheap measure of the DFA interegular
  would build, taken before it builds it."""
  total = 0
  for op, argument in subpattern:
    name = str(op)
    if name in ("MAX_REPEAT", "MIN_REPEAT"):
      low, high, item = argument
      times = low + 1 if high == _re_parser.MAXREPEAT else high
      total += max(times, 1) * _positions(item)
    elif name == "SUBPATTERN":
      total += _positions(argument[-1])
    elif name == "BRANCH":
      total += sum(_positions(branch) for branch in argument[1])
    elif name != "AT":
      total += 1
  return total


def _vocabulary(model):
  """`_compile`'s `vocab` and `usable` of a model."""
  vocab = tuple(model.vocab if model.is_characters else model.tokens.texts)
  usable = tuple(not (model.has_unk and i == 0) for i in range(len(vocab)))
  return vocab, usable


def compile_pattern(model, pattern: str) -> Pattern:
  """One pattern compiled over a model's vocabulary (kept for reuse).

  A caller that compiles on a thread of its own, within `limits` (a
  server's request check), hands the result to `combine` (`compiled=`), so
  the thread that lays out the table never compiles it again, unbounded,
  after the cache has let it go.

  Raises:
    as `combine`.
  """
  return _compile(pattern, *_vocabulary(model))


def combine(model, regex: Sequence[Optional[str]],
            compiled: Optional[Mapping[str, Pattern]] = None) -> Dfa:
  """The combined `Dfa` of one pattern (or None: free) per row.

  Each distinct pattern is compiled once and laid out once; rows with the
  same pattern share its states. `compiled` maps patterns already compiled
  (`compile_pattern`) to their result: those are not compiled again.

  Raises:
    errors.ArgumentError: a pattern that does not compile, matches nothing
      (or only the empty string) over the vocabulary, passes a bound
      (`MAX_STATES`, those of its build) or this thread's `limits` deadline;
      naming it.
    Cancelled: this thread's `limits` event was set.
  """
  vocab, usable = _vocabulary(model)
  compiled = compiled or {}
  tables, ends = map(lambda x: [x], _fixed_states(len(vocab)))
  offsets, size = {}, 2
  start = np.full([len(regex)], FREE, np.int32)
  for row, pattern in enumerate(regex):
    if pattern is None:
      continue
    if pattern not in offsets:
      one = compiled.get(pattern) or _compile(pattern, vocab, usable)
      offsets[pattern] = size
      tables.append(np.where(one.table >= 0, one.table + size,
                             DEAD).astype(np.int32))
      ends.append(one.ends)
      size += len(one.ends)
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
