"""A parsed pattern's minimal DFA, built within bounds whatever the pattern.

`interegular` parses a `regex=` pattern (`constraints.py`); this module
builds its automaton. interegular's own construction makes an automaton
deterministic at every node of the pattern and then minimizes it by
reversing it twice, each step unbounded: `[ab]*a[ab]{20}` (2^21 states)
runs for minutes, and `[ab]{20}a[ab]*` (22 states, but 2^21 reversed) as
long, before any size check sees a state. Here:

  - the pattern's positions (the Glushkov automaton: one state per
    character position, repeats expanded; no empty moves) are laid out
    once, each position's followers a bit set;
  - the subset construction makes one deterministic state at a time,
    counting them, and stops as soon as the count passes its budget (or
    the work, a state's positions and the alphabet's keys, passes its own);
  - Hopcroft's partition refinement minimizes it (n log n, where reversing
    twice can take 2^n).

Every step polls `limits` (a deadline and a cancellation event, per thread)
every `_POLL_EVERY` units of work.

The result is the automaton interegular builds (the minimal DFA of the
pattern's language over its alphabet, without the dead state), read the way
interegular reads the pattern (its character classes, `.`, scoped flags).
Its states are numbered breadth-first from the start, over the keys in
order, so the numbering is the same in every process (interegular's followed
the iteration order of a set of strings, which changes with the hash seed).
"""

import contextlib
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

# Units of work between two polls of the limits: a few milliseconds.
_POLL_EVERY = 1 << 12


class Cancelled(Exception):
  """A check stopped through `limits(cancelled=...)`: nobody waits for it."""


class TooLarge(Exception):
  """The automaton passes a bound while being built; the message, one line,
  says which (the caller words the refusal)."""


class TimeUp(Exception):
  """The build passed the deadline of `limits`; `seconds` is the time it had."""

  def __init__(self, seconds: float):
    super().__init__(f"took over {seconds:.3g} s to build")
    self.seconds = seconds


class _Limits(NamedTuple):
  deadline: Optional[float]  # time.monotonic() past which a build stops.
  seconds: Optional[float]  # The time it had from `limits` (for the message).
  cancelled: Tuple[threading.Event, ...]


_local = threading.local()


@contextlib.contextmanager
def limits(deadline: Optional[float] = None,
           cancelled: Optional[threading.Event] = None):
  """Bounds, on this thread, the time of the automata built inside it.

  A server checks requests on several threads; each wraps its check, so
  that a slow pattern is refused past its time and a shutdown can abandon
  the check at once. The build polls the limits every few milliseconds
  (`_POLL_EVERY` units of work); other threads' builds are not affected.
  Nested uses combine: the earlier deadline, and either event.

      with constraints.limits(deadline=time.monotonic() + 2,
                              cancelled=stopping_event):
        api.check_request(model, prompts, num_steps, regex=pattern)

  Args:
    deadline: a `time.monotonic()` instant; a build still running then is
      refused with `errors.ArgumentError` naming `regex` ("... took over 2
      s to build ..."). None: no deadline.
    cancelled: a `threading.Event`; once it is set, the build raises
      `Cancelled` (not an argument error: the request is not at fault).

  Yields:
    None.
  """
  outer = getattr(_local, "limits", None)
  now = time.monotonic()
  seconds = None if deadline is None else max(deadline - now, 0.0)
  events = (cancelled,) if cancelled is not None else ()
  if outer is not None:
    if outer.deadline is not None and (deadline is None
                                       or outer.deadline < deadline):
      deadline, seconds = outer.deadline, outer.seconds
    events = outer.cancelled + events
  _local.limits = _Limits(deadline, seconds, events)
  try:
    yield
  finally:
    _local.limits = outer


def poll() -> None:
  """Raises `Cancelled` or `TimeUp` if this thread's `limits` say stop."""
  active = getattr(_local, "limits", None)
  if active is None:
    return
  if any(event.is_set() for event in active.cancelled):
    raise Cancelled("the check was cancelled")
  if active.deadline is not None and time.monotonic() > active.deadline:
    raise TimeUp(active.seconds)


class Meter:
  """Counts a build's states and work against its budgets, polling the
  limits as the work grows.

  Args:
    max_states: deterministic states the build may make.
    max_work: units of work it may do (a unit: a position or key visited).
  """

  def __init__(self, max_states: int, max_work: int):
    self.max_states, self.max_work = max_states, max_work
    self.states = self.work = 0
    self._next_poll = 0

  def state(self) -> None:
    self.states += 1
    if self.states > self.max_states:
      raise TooLarge(f"needs more than {self.max_states} DFA states while "
                     "being built")

  def charge(self, units: int) -> None:
    self.work += units
    if self.work > self.max_work:
      raise TooLarge(f"takes more than {self.max_work} steps to build")
    if self.work >= self._next_poll:
      self._next_poll = self.work + _POLL_EVERY
      poll()


class Automaton(NamedTuple):
  """A minimal DFA over an alphabet of keys; state 0 is the start.

  Attributes:
    table: int32 `[S, K]`, state x key -> state (-1: dead).
    finals: bool `[S]`, accepting.
    keys: each character the pattern names -> its key (characters that
      every class treats alike share one).
    other: the key of every other character.
  """
  table: np.ndarray
  finals: np.ndarray
  keys: Dict[str, int]
  other: int

  def key(self, char: str) -> int:
    return self.keys.get(char, self.other)


def _bits(mask: int) -> List[int]:
  """The positions of the set bits of `mask` (one pass in numpy: the
  masks of a long pattern are thousands of bits, mostly clear)."""
  if mask.bit_length() <= 256:  # Python is quicker at these.
    digits = bin(mask)[:1:-1]
    return [i for i, digit in enumerate(digits) if digit == "1"]
  raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"),
                      np.uint8)
  return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()


class _Positions:
  """The Glushkov automaton of an interegular pattern: each character
  position's class (a leaf) and followers (a bit set of positions)."""

  def __init__(self, meter: Meter, max_positions: int):
    # Imported here: only a given pattern needs interegular.
    from interegular import patterns  # pylint: disable=g-import-not-at-top
    self._patterns = patterns
    self._meter, self._max_positions = meter, max_positions
    self.follow: List[int] = []
    self.leaves: Dict[Tuple[frozenset, bool], int] = {}  # class -> mask.

  def _position(self, chars: frozenset, negated: bool):
    """A new position matching `chars` (all but them, if `negated`)."""
    p = len(self.follow)
    if p >= self._max_positions:
      raise TooLarge(f"has more than {self._max_positions} character "
                     "positions with its repeats expanded")
    self._meter.charge(1)
    self.follow.append(0)
    leaf = (chars, negated)
    self.leaves[leaf] = self.leaves.get(leaf, 0) | (1 << p)
    return False, 1 << p, 1 << p

  def _link(self, last: int, first: int) -> None:
    """Every position of `last` may be followed by every one of `first`."""
    if first:
      ends = _bits(last)
      self._meter.charge(len(ends))
      for p in ends:
        self.follow[p] |= first

  def _sequence(self, items):
    """(nullable, first, last) of items matched one after another."""
    nullable, first, last = True, 0, 0  # Of the items after the current.
    for item_nullable, item_first, item_last in reversed(items):
      self._link(item_last, first)
      if nullable:
        last |= item_last
      first = item_first | (first if item_nullable else 0)
      nullable = nullable and item_nullable
    return nullable, first, last

  def walk(self, node, flags):
    """(nullable, first, last) of an interegular node, as its `to_fsm`
    reads it under `flags` (interegular's `REFlags`).

    Raises:
      TooLarge: past the positions or the work.
      ValueError: a node interegular would not build (its message).
    """
    # interegular's node classes are private: read as its to_fsm reads them.
    # pylint: disable=protected-access
    ip = self._patterns
    if isinstance(node, ip.Pattern):
      flags = ip._combine_flags(flags, node.added_flags, node.removed_flags)
      nullable, first, last = False, 0, 0
      for option in node.options:
        n, f, l = self.walk(option, flags)
        nullable, first, last = nullable or n, first | f, last | l
      return nullable, first, last
    if isinstance(node, ip._Concatenation):
      return self._sequence([self.walk(part, flags) for part in node.parts])
    if isinstance(node, ip._Repeated):
      items = [self.walk(node.base, flags) for _ in range(node.min)]
      if node.max is None:
        _, first, last = self.walk(node.base, flags)
        self._link(last, first)
        items.append((True, first, last))
      else:
        # x{0,k} as (x(x(x)?)?)?: each copy followed by the next only.
        tail = (True, 0, 0)
        for _ in range(node.max - node.min):
          _, first, last = self._sequence([self.walk(node.base, flags), tail])
          tail = (True, first, last)
        items.append(tail)
      return self._sequence(items)
    if isinstance(node, ip._CharGroup):
      chars = node.chars
      if flags & ip.REFlags.CASE_INSENSITIVE:  # As _CharGroup.to_fsm.
        chars = frozenset({*(c.lower() for c in chars),
                           *(c.upper() for c in chars)})
      if flags & ~ip.REFlags.CASE_INSENSITIVE & ~ip.REFlags.SINGLE_LINE:
        raise ValueError(f"{flags} is not implemented")
      return self._position(chars, node.negated)
    if node is ip._DOT:
      single_line = bool(flags & ip.REFlags.SINGLE_LINE)
      return self._position(frozenset() if single_line else frozenset("\n"),
                            True)
    if node is ip._EMPTY:
      return True, 0, 0
    raise ValueError(f"{type(node).__name__} is not implemented")


def _alphabet(leaves, meter: Meter):
  """The keys of the pattern's characters and each key's positions.

  Characters every class treats alike share a key; every character no class
  names shares `other`. Keys are numbered in the order of their first
  character (sorted), then `other`.

  Returns:
    (keys: char -> key, other, masks: per key, the positions it matches).
  """
  signature: Dict[str, list] = {}
  for number, (chars, _) in enumerate(leaves):
    meter.charge(len(chars))
    for char in chars:
      signature.setdefault(char, []).append(number)
  by_signature, keys = {}, {}
  for char in sorted(signature):
    keys[char] = by_signature.setdefault(tuple(signature[char]),
                                         len(by_signature))
  other = len(by_signature)
  # A class matches a key iff the key's characters are in it, xor negated.
  masks = [0] * (other + 1)
  negated_all = 0
  excluded = [0] * (other + 1)  # Positions of negated classes naming it.
  for (chars, negated), positions in leaves.items():
    named = {keys[char] for char in chars}
    meter.charge(len(named) + 1)
    if negated:
      negated_all |= positions
      for key in named:
        excluded[key] |= positions
    else:
      for key in named:
        masks[key] |= positions
  meter.charge(other + 1)
  masks = [mask | (negated_all & ~excluded[key])
           for key, mask in enumerate(masks)]
  return keys, other, masks


def _determinize(positions: _Positions, first: int, final: int, masks,
                 meter: Meter):
  """The subset construction, a state at a time (state 0: the start).

  Returns:
    (transitions: per state, its (key, state) pairs; finals: bool per state).
  """
  start = len(positions.follow)
  follow = positions.follow + [first]  # The start: a position before all.
  index = {1 << start: 0}
  subsets = [1 << start]
  transitions = []
  live_keys = [(key, mask) for key, mask in enumerate(masks) if mask]
  for subset in subsets:  # Grows as states are found.
    members = _bits(subset)
    meter.charge(len(members) + len(live_keys))
    reach = 0
    for p in members:
      reach |= follow[p]
    row = []
    if reach:
      for key, mask in live_keys:
        target = reach & mask
        if target:
          state = index.get(target)
          if state is None:
            meter.state()
            state = index[target] = len(subsets)
            subsets.append(target)
          row.append((key, state))
    transitions.append(row)
  finals = [bool(subset & final) for subset in subsets]
  return transitions, finals


def _minimize(transitions, finals, num_keys: int, meter: Meter):
  """Hopcroft's minimization of a DFA's live states, numbered anew.

  States that reach no accepting state are dropped first (moves into them
  become dead), as interegular's reduction drops them.

  Returns:
    (int32 `[S, K]` table, -1: dead; bool `[S]` finals), state 0 the start.
  """
  count = len(transitions)
  predecessors = [[] for _ in range(count)]
  for source, row in enumerate(transitions):
    meter.charge(len(row) + 1)
    for _, target in row:
      predecessors[target].append(source)
  live = [False] * count
  frontier = [s for s in range(count) if finals[s]]
  for s in frontier:
    live[s] = True
  while frontier:
    meter.charge(len(frontier))
    following = []
    for s in frontier:
      for source in predecessors[s]:
        if not live[source]:
          live[source] = True
          following.append(source)
    frontier = following
  if not live[0]:  # Matches nothing: one state, no moves, as interegular.
    return np.full([1, num_keys], -1, np.int32), np.array([False])
  # Inverse moves between live states, by key.
  inverse = [dict() for _ in range(num_keys)]
  for source, row in enumerate(transitions):
    if live[source]:
      for key, target in row:
        if live[target]:
          inverse[key].setdefault(target, []).append(source)
  incoming = [set() for _ in range(count)]  # Keys that lead into a state.
  for key, targets in enumerate(inverse):
    for target in targets:
      incoming[target].add(key)
  # The dead state (every other one) is a block of its own, never a
  # splitter: the worklist needs all blocks of the first partition but one.
  block_of = [-1] * count
  blocks = []
  for accepting in (True, False):
    members = {s for s in range(count) if live[s] and finals[s] == accepting}
    if members:
      for s in members:
        block_of[s] = len(blocks)
      blocks.append(members)
  pending = [(b, key) for b in range(len(blocks)) for key in range(num_keys)]
  waiting = set(pending)
  while pending:
    splitter = pending.pop()
    waiting.discard(splitter)
    block, key = splitter
    sources = inverse[key]
    hit = {}
    for target in blocks[block]:
      for source in sources.get(target, ()):
        hit.setdefault(block_of[source], set()).add(source)
    meter.charge(len(blocks[block]) + sum(len(h) for h in hit.values()))
    for touched, members in hit.items():
      whole = blocks[touched]
      if len(members) == len(whole):
        continue
      # The states hit move to a new block, in time of their number (the
      # splitter's work paid for finding them); of the two halves the
      # smaller one splits others, unless the block was pending anyway.
      whole -= members
      new = len(blocks)
      blocks.append(members)
      for s in members:
        block_of[s] = new
      smaller = new if len(members) <= len(whole) else touched
      keys = set()
      for s in blocks[smaller]:
        keys |= incoming[s]
      for s in members:
        keys |= {k for k in incoming[s] if (touched, k) in waiting}
      meter.charge(len(members) + len(blocks[smaller]) + len(keys))
      for k in keys:
        half = new if (touched, k) in waiting else smaller
        if (half, k) not in waiting:
          waiting.add((half, k))
          pending.append((half, k))
  # Number the blocks breadth-first from the start's, over keys in order.
  moves = {}
  for source, row in enumerate(transitions):
    if live[source] and block_of[source] not in moves:
      moves[block_of[source]] = [(key, block_of[t]) for key, t in row
                                 if live[t]]
  number = {block_of[0]: 0}
  order = [block_of[0]]
  for block in order:
    for _, target in moves[block]:
      if target not in number:
        number[target] = len(order)
        order.append(target)
  table = np.full([len(order), num_keys], -1, np.int32)
  accepting = np.zeros([len(order)], bool)
  for block in order:
    for key, target in moves[block]:
      table[number[block], key] = number[target]
    accepting[number[block]] = finals[next(iter(blocks[block]))]
  return table, accepting


def build(pattern, max_positions: int, max_states: int,
          max_work: int) -> Automaton:
  """The minimal DFA of an interegular pattern, within bounds.

  Args:
    pattern: `interegular.parse_pattern`'s result.
    max_positions: character positions, repeats expanded.
    max_states: deterministic states the subset construction may make.
    max_work: units of work (positions and keys visited) the build may do.

  Returns:
    The `Automaton`.

  Raises:
    TooLarge: past a bound, as soon as it is passed.
    TimeUp, Cancelled: as `limits` say.
    ValueError: a node interegular does not build (look-around).
  """
  from interegular import patterns  # pylint: disable=g-import-not-at-top
  meter = Meter(max_states, max_work)
  positions = _Positions(meter, max_positions)
  nullable, first, last = positions.walk(pattern, patterns.REFlags(0))
  final = last | ((1 << len(positions.follow)) if nullable else 0)
  keys, other, masks = _alphabet(positions.leaves, meter)
  transitions, finals = _determinize(positions, first, final, masks, meter)
  table, accepting = _minimize(transitions, finals, other + 1, meter)
  return Automaton(table, accepting, keys, other)
