"""The stop and regex tables of a scheduler's chunks, bounded in bytes.

Rows of any settings run in one chunk: each distinct stop list's automaton
(`stopping.join`) and each distinct pattern's DFA (`constraints.combine`) is
laid out once in the chunk's joined table, and each row's carried state
points into its own part; when rows come and go and the table is laid out
again, a carried row's state moves by the difference of its offsets
(`place`; `Row.stop_offset`, `Row.dfa_offset`).

Each joined table has a capacity of states (`ChunkTables.stop_capacity`,
`dfa_capacity`). On the paths that compile per shape (XLA, elementwise) it
is a fixed size (`TABLE_BYTES`, at least 16 states) to which every call's
table is padded, so that the warm-up compiles it and new stop lists or
patterns compile nothing; on the graph path it is the library's limit
(`stopping.MAX_TABLE_BYTES`, `constraints.MAX_TABLE_BYTES`). A waiting row
whose settings would take a joined table over its capacity waits until
running rows have drained (`ChunkTables.fits`), as an LLM server's request
waits for cache blocks; a row beside rows of its own settings always fits,
its table padded to a power of two when it is over the capacity alone.
Each distinct setting's own table, and each layout, is made once and kept
in a least-recently-used cache (`Lru`) bounded in entries and in bytes:
clients may send any number of distinct stop lists, each up to the
library's table limit (64 MiB for a 65,536-token vocabulary).
"""

import collections
import threading
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from rnnstep.decoding import constraints
from rnnstep.decoding import stopping
from rnnstep.engine import host
from rnnstep.engine import request as request_lib
from rnnstep.serve import completion as completion_lib

# The bytes of each joined table (stop strings, regex) a call passes on the
# paths that compile per shape: its fixed state count is this over the
# vocabulary's row (at least 16). A call copies them whole, so they are kept
# small: 2 x 128 KiB for a 65-character vocabulary.
TABLE_BYTES = 256 << 10

# The bytes each cache of tables (`Lru`) holds at most: the world
# vocabulary's end of turn ("\n\n", 3 states) is 0.75 MiB, so 85 distinct
# stop lists of that size fit; a client's largest table (the library's
# limit, `stopping.MAX_TABLE_BYTES`) fits alone. A server keeps two such
# caches a lane (stop lists, layouts) and one for its checks.
CACHED_TABLE_BYTES = stopping.MAX_TABLE_BYTES


def power_of_two_at_least(n: int, minimum: int) -> int:
  return max(minimum, 1 << (max(int(n), 1) - 1).bit_length())


def table_bytes(value) -> int:
  """The bytes of the numpy arrays in a cached value (an automaton, a
  joined layout: any nest of tuples, dicts and arrays)."""
  if isinstance(value, np.ndarray):
    return value.nbytes
  if isinstance(value, dict):
    return sum(table_bytes(v) for v in value.values())
  if isinstance(value, (tuple, list)):
    return sum(table_bytes(v) for v in value)
  return 0


class Lru:
  """The most recently used entries, at most `size` of them and `max_bytes`
  (default `CACHED_TABLE_BYTES`) of arrays together (`table_bytes`; the newest entry is kept even alone
  over the bound), safe to share between threads (a value is made outside
  the lock: two threads may make the same one, and one is kept).
  """

  def __init__(self, size: int, max_bytes: Optional[int] = None):
    self.size = int(size)
    self.max_bytes = int(CACHED_TABLE_BYTES if max_bytes is None
                         else max_bytes)
    self.bytes = 0
    self._entries = collections.OrderedDict()  # key -> (value, bytes)
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._entries)

  def get_or_make(self, key, make):
    with self._lock:
      if key in self._entries:
        self._entries.move_to_end(key)
        return self._entries[key][0]
    value = make()
    size = table_bytes(value)
    with self._lock:
      if key in self._entries:  # Made meanwhile by another thread.
        self._entries.move_to_end(key)
        return self._entries[key][0]
      self._entries[key] = (value, size)
      self.bytes += size
      while len(self._entries) > 1 and (len(self._entries) > self.size
                                        or self.bytes > self.max_bytes):
        _, (_, dropped) = self._entries.popitem(last=False)
        self.bytes -= dropped
    return value


class Tables(NamedTuple):
  """A chunk's joined tables (`ChunkTables.joined`).

  Attributes:
    stops: the joined `stopping.Automaton` (padded to its capacity on the
      paths that compile per shape).
    stop_offsets: int32 `[B]`, each row's automaton's start in it.
    dfa: the joined `constraints.Dfa` (padded likewise; its `start`, each
      row's pattern's start, is also its offset), or None: on the graph
      path, no row has a pattern.
  """
  stops: stopping.Automaton
  stop_offsets: np.ndarray
  dfa: Optional[constraints.Dfa]


class ChunkTables:
  """One scheduler's stop and regex tables: each setting's own, made once,
  and the joined layouts of its chunks.

  Args:
    model: the `rnnstep.Model`.
    bucketed: whether the path compiles per shape (the tables are then
      padded to a fixed capacity).

  Attributes:
    stop_capacity: states of the joined stop table (module docstring).
    dfa_capacity: states of the joined regex DFA, its 2 shared ones
      included.
  """

  def __init__(self, model, bucketed: bool):
    self.model = model
    self.bucketed = bool(bucketed)
    row_bytes = 4 * model.vocab_size
    if self.bucketed:  # One fixed shape each, which the warm-up compiles.
      fixed = max(16, 1 << (max(TABLE_BYTES // row_bytes, 1).bit_length()
                            - 1))
      self.stop_capacity = self.dfa_capacity = fixed
    else:  # No shapes to keep: the library's limits.
      self.stop_capacity = stopping.MAX_TABLE_BYTES // row_bytes
      self.dfa_capacity = constraints.MAX_TABLE_BYTES // row_bytes
    # Per distinct stop list its automaton, per distinct pattern its state
    # count, per layout (the distinct settings of a chunk, in order) its
    # joined tables.
    self._stops = Lru(256)
    self._pattern_states = Lru(256)
    self._joined = Lru(64)

  def stops(self, stop, built: Optional[stopping.Automaton] = None
            ) -> stopping.Automaton:
    """The stop automaton of a stop list, made once (its own states;
    `built`: made already, see `Completion`)."""
    return self._stops.get_or_make(
        stop, lambda: built or host.stop_automaton(self.model, stop))

  def pattern_size(self, pattern: str,
                   compiled: Optional[constraints.Pattern] = None) -> int:
    """A pattern's own DFA states (its shared ones aside), counted once
    (`compiled`: the pattern compiled already, see `Completion`)."""
    return self._pattern_states.get_or_make(
        pattern, lambda: len((compiled or constraints.compile_pattern(
            self.model, pattern)).ends))

  def make_own(self, completion: completion_lib.Completion) -> None:
    """Makes a completion's own stop automaton and pattern size (once per
    distinct setting; raises what their making raises)."""
    self.stops(completion.shared.stop, completion.stop_automaton)
    if completion.shared.regex is not None:
      self.pattern_size(completion.shared.regex, completion.pattern)

  def fits(self, stops, patterns) -> bool:
    """Whether the joined tables of these distinct stop lists and patterns
    stay within `stop_capacity` and `dfa_capacity`."""
    stop_states = sum(len(self.stops(stop).accept) for stop in stops)
    dfa_states = 2 + sum(self.pattern_size(pattern) for pattern in patterns)
    return (stop_states <= self.stop_capacity
            and dfa_states <= self.dfa_capacity)

  def joined(self, rows: List[completion_lib.Row]) -> Tables:
    """The joined stop table and regex DFA of a chunk's rows.

    Each distinct stop list (pattern) is laid out once, in the order the
    rows first name it; a layout is made once and kept. On the paths that
    compile per shape both tables are padded to their capacity (one shape,
    which the warm-up compiled; the DFA even when no row has a pattern),
    or, for rows of one table over it, to a power of two.
    """
    stops = tuple(dict.fromkeys(row.completion.shared.stop for row in rows))
    patterns = tuple(dict.fromkeys(
        row.completion.shared.regex for row in rows
        if row.completion.shared.regex is not None))

    built = {row.completion.shared.stop: row.completion.stop_automaton
             for row in rows}
    compiled = {row.completion.shared.regex: row.completion.pattern
                for row in rows if row.completion.pattern is not None}

    def make():
      automaton, offsets = stopping.join([self.stops(s, built[s])
                                          for s in stops])
      dfa = (constraints.combine(self.model, patterns, compiled)
             if patterns or self.bucketed else None)
      if self.bucketed:
        automaton = stopping.Automaton(*request_lib.pad_states(
            automaton.table, automaton.accept, 0, power_of_two_at_least(
                len(automaton.accept), self.stop_capacity)))
        table, ends = request_lib.pad_states(
            dfa.table, dfa.ends, constraints.DEAD,
            power_of_two_at_least(len(dfa.ends), self.dfa_capacity))
        dfa = dfa._replace(table=table, ends=ends)
      starts = dict(zip(patterns, dfa.start)) if dfa is not None else {}
      return automaton, dict(zip(stops, offsets)), dfa, starts

    automaton, stop_at, dfa, dfa_at = self._joined.get_or_make(
        (stops, patterns), make)
    if dfa is not None:
      dfa = dfa._replace(start=np.array(
          [dfa_at.get(row.completion.shared.regex, constraints.FREE)
           for row in rows], np.int32))
    return Tables(automaton, np.array(
        [stop_at[row.completion.shared.stop] for row in rows], np.int32), dfa)


def place(rows: List[completion_lib.Row], fresh: np.ndarray, tables: Tables,
          carry) -> List[Tuple[int, int]]:
  """Points each row's stop and DFA states into a chunk's tables.

  A fresh row starts at its automaton's offset (its DFA's start is the
  request's `constraint.start`); a carried row's state moves by the
  difference between its offsets in the last chunk's tables and in these.
  The DFA's shared states (`FREE`, `DEAD`) stay where they are. Padding
  rows (XLA's batch bucket) copy row 0's. `carry` (numpy, the call's rows)
  is changed in place; the rows' own offsets are not (the caller sets them
  once the call has run).

  Returns:
    Per row, its `(stop_offset, dfa_offset)` in these tables.
  """
  dfa_start = (tables.dfa.start if tables.dfa is not None else
               np.full([len(rows)], constraints.FREE, np.int32))
  offsets = []
  for r, row in enumerate(rows):
    stop_offset, dfa_offset = int(tables.stop_offsets[r]), int(dfa_start[r])
    if fresh[r]:
      carry.stop_state[r] = stop_offset
    else:
      carry.stop_state[r] += stop_offset - row.stop_offset
      if carry.dfa_state[r] >= 2:  # Its own states, not FREE or DEAD.
        carry.dfa_state[r] += dfa_offset - row.dfa_offset
    offsets.append((stop_offset, dfa_offset))
  carry.stop_state[len(rows):] = carry.stop_state[0]
  carry.dfa_state[len(rows):] = carry.dfa_state[0]
  return offsets
