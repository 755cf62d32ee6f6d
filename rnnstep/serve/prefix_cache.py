"""The server's prefix-state cache: a token-id prefix to the state after it.

An RNN's state after a prompt's first c ids is all a generation needs of
those ids: a request whose prompt starts with a cached prefix starts its row
from that state and primes only the rest (`scheduler.py`). The map is
bounded in bytes and drops the least recently used entries first
(`PrefixCache`); one cache may serve several lanes (a lock guards it).

Entries are keyed by a namespace (the scheduler's: its model and the named
initial state a row starts from, so that two models or two states never
share an entry) and the exact ids (token boundaries, not text). A state
whose arrays do not have the namespace's shapes is never inserted.

The states are numpy arrays on the host: the scheduler's carry lives there
between calls already (`calls.py`), so storing a row's state is a copy of
what the call returned, and starting a row from one is a copy into the next
call's arguments, with no device transfer of its own.

Which prefixes get stored is the scheduler's choice (the end of each piece a
prompt is primed in, and the cache points a request asks for); the cache
also remembers the last prompts it was asked about (`RECENT_PROMPTS`), so
that a lookup can say where a prompt parts from a recent one
(`Hit.diverges`): the scheduler ends a piece there, and the next prompt
sharing that prefix finds its state.
"""

import collections
import threading
from typing import Hashable, NamedTuple, Optional, Sequence, Tuple

import numpy as np

# Prompts per namespace whose divergence from a new prompt a lookup reports.
RECENT_PROMPTS = 64


class Hit(NamedTuple):
  """A lookup's answer.

  Attributes:
    length: ids of the prompt the state has consumed (0: none cached).
    state: the state after them (one row's arrays, per layer a tuple), or
      None.
    diverges: the longest prefix (<= the lookup's `longest`) the prompt
      shares with a prompt looked up recently, 0 where none is longer than
      `length`: storing the state there serves the prompts to come that
      share it.
  """
  length: int
  state: Optional[tuple]
  diverges: int = 0


class PrefixCache:
  """A bounded map from (namespace, token-id prefix) to the state after it.

  Args:
    max_bytes: the most bytes of states held (> 0); an insert drops the
      least recently used entries until the new one fits; a state larger
      than the bound is not held.

  Attributes (counters for `/metrics`, read on any thread):
    hits: lookups that found a cached prefix.
    misses: lookups that found none.
    tokens_saved: prompt ids the hits did not prime again.
    bytes_held: bytes of the states held (never above `max_bytes`).
    inserts, evictions: entries stored and dropped.
  """

  def __init__(self, max_bytes: int):
    if int(max_bytes) <= 0:
      raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    self.max_bytes = int(max_bytes)
    self._lock = threading.Lock()
    # (namespace, ids bytes) -> (state, bytes), least recently used first.
    self._entries = collections.OrderedDict()
    # namespace -> {prefix length: entries of that length}.
    self._lengths = collections.defaultdict(collections.Counter)
    # namespace -> the shapes of its states (the first insert's check sets
    # nothing: the scheduler names them, `register`).
    self._shapes = {}
    self._recent = collections.defaultdict(
        lambda: collections.deque(maxlen=RECENT_PROMPTS))
    self.hits = self.misses = self.tokens_saved = 0
    self.bytes_held = self.inserts = self.evictions = 0

  def __len__(self) -> int:
    return len(self._entries)

  def register(self, namespace: Hashable, shapes: Sequence[Sequence[tuple]]
               ) -> None:
    """Declares the state shapes of a namespace: per layer, the shape of
    each of one row's state arrays. Inserting into an undeclared namespace,
    or a state of other shapes, raises.

    Raises:
      ValueError: the namespace was declared with other shapes.
    """
    shapes = tuple(tuple(tuple(int(d) for d in shape) for shape in layer)
                   for layer in shapes)
    with self._lock:
      if self._shapes.setdefault(namespace, shapes) != shapes:
        raise ValueError(f"prefix cache: namespace {namespace!r} holds "
                         f"states of shapes {self._shapes[namespace]}, not "
                         f"{shapes}")

  def lookup(self, namespace: Hashable, ids: np.ndarray, longest: int,
             lengths: Optional[Sequence[int]] = None,
             count: bool = True) -> Hit:
    """The state after the longest cached prefix of `ids` of at most
    `longest` ids (and at least 1), marked most recently used; counts a hit
    or a miss (unless `count` is False: `count` it once it is used), and
    remembers `ids` for `Hit.diverges`.

    Args:
      namespace: the scheduler's namespace (model and initial state).
      ids: int32 `[L]`, the prompt's ids.
      longest: the longest prefix usable (the scheduler's: L - 1, so that
        an id is left to feed the first step).
      lengths: None, or the only prefix lengths usable (the ends of the
        prompt's own priming pieces, where resuming elsewhere would round
        otherwise: `starts.RowStarts.start`).
    """
    ids = np.asarray(ids, np.int32)
    longest = min(int(longest), len(ids))
    usable = None if lengths is None else set(lengths)
    with self._lock:
      recent = self._recent[namespace]
      length, state = 0, None
      for size in sorted(self._lengths[namespace], reverse=True):
        if size > longest or (usable is not None and size not in usable):
          continue
        key = (namespace, ids[:size].tobytes())
        entry = self._entries.get(key)
        if entry is not None:
          self._entries.move_to_end(key)
          length, state = size, entry[0]
          break
      diverges = 0
      same = False
      for other in recent:
        if len(other) == len(ids) and np.array_equal(other, ids):
          same = True  # The same prompt again: no point to part at.
          continue
        shared = _shared_length(ids, other, longest)
        if shared > max(length, diverges):
          diverges = shared
      if not same:
        recent.append(ids)
    hit = Hit(length, state, diverges)
    if count:
      self.count(hit)
    return hit

  def count(self, hit: Hit) -> None:
    """Counts a lookup's answer (`lookup(count=False)`'s) as used: a hit and
    its tokens saved, or a miss."""
    with self._lock:
      if hit.length:
        self.hits += 1
        self.tokens_saved += hit.length
      else:
        self.misses += 1

  def holds(self, namespace: Hashable, ids: np.ndarray) -> bool:
    """Whether the state after exactly `ids` is held (marks it used)."""
    key = (namespace, np.asarray(ids, np.int32).tobytes())
    with self._lock:
      if key in self._entries:
        self._entries.move_to_end(key)
        return True
      return False

  def insert(self, namespace: Hashable, ids: np.ndarray, state) -> bool:
    """Holds a copy of `state`, the state after exactly `ids` (>= 1 id),
    dropping the least recently used entries until it fits.

    Returns:
      Whether it is held now (False: larger than the whole bound).

    Raises:
      ValueError: the namespace is not declared (`register`), or the
        state's arrays are not of its shapes or not float32.
    """
    ids = np.asarray(ids, np.int32)
    if ids.ndim != 1 or not len(ids):
      raise ValueError("prefix cache: a prefix is one or more ids")
    state = tuple(tuple(np.array(x, copy=True) for x in layer)
                  for layer in state)
    shapes = tuple(tuple(x.shape for x in layer) for layer in state)
    with self._lock:
      expected = self._shapes.get(namespace)
      if expected is None:
        raise ValueError(f"prefix cache: namespace {namespace!r} is not "
                         "declared")
      if shapes != expected or any(x.dtype != np.float32
                                   for layer in state for x in layer):
        raise ValueError(f"prefix cache: a state of shapes {shapes} where "
                         f"{namespace!r} holds {expected} (float32)")
      size = sum(x.nbytes for layer in state for x in layer)
      key = (namespace, ids.tobytes())
      if key in self._entries:
        self._entries.move_to_end(key)
        return True
      if size > self.max_bytes:
        return False
      while self.bytes_held + size > self.max_bytes:
        self._drop_oldest()
      self._entries[key] = (state, size)
      self._lengths[namespace][len(ids)] += 1
      self.bytes_held += size
      self.inserts += 1
      return True

  def _drop_oldest(self) -> None:
    (namespace, key_bytes), (_, size) = self._entries.popitem(last=False)
    lengths = self._lengths[namespace]
    length = len(key_bytes) // 4
    lengths[length] -= 1
    if not lengths[length]:
      del lengths[length]
    self.bytes_held -= size
    self.evictions += 1


def message_boundaries(render, messages, prompt: str) -> Tuple[int, ...]:
  """Where a chat prompt's text stands after its leading messages: after
  the first (a system prompt every conversation of a deployment shares)
  and after all but the last (the conversation so far, which its next turn
  repeats), as character offsets into `prompt` (the whole conversation's
  rendering), for `cache_points`.

  Args:
    render: the chat template's `render(messages)` (which adds the
      assistant's cue: the offset is how far its text agrees with `prompt`;
      where it raises, that boundary is left out).
    messages: the conversation's messages.
    prompt: `render(messages)`.
  """
  points = set()
  for count in {1, len(messages) - 1}:
    if 0 < count < len(messages):
      try:
        lead = render(messages[:count])
      except Exception:  # pylint: disable=broad-except
        continue  # A template that refuses a part of the conversation.
      points.add(_shared_length(np.frombuffer(lead.encode("utf-32-le"),
                                              np.uint32),
                                np.frombuffer(prompt.encode("utf-32-le"),
                                              np.uint32), len(lead)))
  return tuple(sorted(p for p in points if 0 < p < len(prompt)))


def token_offsets(encode, prompt: str, ids: np.ndarray,
                  offsets: Sequence[int]) -> Tuple[int, ...]:
  """Character offsets of `prompt` as offsets into its ids `ids`
  (`encode(prompt)`): each where the ids of the text before it are a prefix
  of `ids` (a token boundary); others are left out."""
  points = []
  for offset in offsets:
    lead = np.asarray(encode(prompt[:offset]), np.int32)
    if 0 < len(lead) < len(ids) and np.array_equal(ids[:len(lead)], lead):
      points.append(len(lead))
  return tuple(points)


def _shared_length(a: np.ndarray, b: np.ndarray, longest: int) -> int:
  """The length of the common prefix of `a` and `b`, at most `longest`."""
  n = min(len(a), len(b), longest)
  if n <= 0:
    return 0
  differ = np.flatnonzero(a[:n] != b[:n])
  return int(differ[0]) if len(differ) else n


def megabytes_to_bytes(megabytes: float) -> int:
  """`--prefix_cache_mb` in bytes (MiB)."""
  return int(float(megabytes) * (1 << 20))
