"""Continuous batching: a fixed set of slots, one scheduler thread, one call a chunk.

The server's requests arrive one at a time and want different lengths. The
engine keeps up to `max_batch` rows ("slots") on the device and runs the
library's compiled `Programs.serve_fn` for `chunk_steps` steps at a time over
the rows that are active. Between chunks, on its own thread (the only one that
touches the device), it

  - retires rows that finished (a stop string, a regex end, `max_tokens`) or
    whose client went away (`Completion.cancel`);
  - admits waiting rows into the free slots: their prompts are primed inside
    the same call that decodes the other rows (`serve_fn`'s `fresh` rows).
    A prompt longer than a piece (`prime_chars`: the chunk's steps, at least
    8) is primed a piece a call, its state carried between them like a
    decoding row's, so that no call primes more than a piece and a long
    prompt holds the other rows up by no more than one chunk's worth;
  - hands each row's new characters to its `Completion`'s sink.

A row's text equals `rnnstep.generate`'s for its prompt, seed and options
(README "Reproducibility": to float32 rounding of the logits, which the batch
size can change): its noise is keyed by its own (seed, index) and its own
position (`Carry.step` per row), never by its slot or the batch's step count.
Every setting travels per row, so rows of any settings run in one chunk:
the per-row options (`options.PER_ROW`) and the seed as `[B]` values, and
the settings a library `Request` shares by all its rows (`Shared`: stop
strings, look-back settings, regex) as follows (`_tables`):

  - the chunk's stop automata are joined into one table
    (`stopping.join`), each distinct list once, and each row's carried
    `stop_state` points into its own part: a row starts at its
    automaton's offset, and when rows come and go and the table is laid out
    again between chunks, a carried row's state moves by the difference of
    its offsets (`Row.stop_offset`);
  - the regex DFAs likewise (`constraints.combine`, each row starting at its
    pattern's offset; `Row.dfa_offset`);
  - `repetition_window` and `no_repeat_ngram_size` are `[B]` values of
    `processors.Settings` (`Programs.serve_fn`'s per-row look-back): each
    row's window counts its own ids, and the n-gram ban runs to the largest
    n, each row banning by its own (none for n = 0).

Each joined table has a capacity of states (`stop_capacity`,
`dfa_capacity`): on the paths that compile per shape (XLA, elementwise) a
fixed size, to which every call's table is padded, so that the warm-up
compiles it and new stop lists or patterns compile nothing
(`TABLE_BYTES` per table, at least 16 states: 512 for a 65-character
vocabulary); on the graph path the library's limits
(`stopping.MAX_TABLE_BYTES`, `constraints.MAX_TABLE_BYTES`). A waiting row
whose settings would take a joined table over its capacity waits until
running rows have drained (first come, first served: nothing overtakes it),
as an LLM server's request waits for cache blocks. A row always fits beside
rows of its own settings; one whose own table is over the capacity runs
with those alone (its table padded to a power of two: compiled once per
size); one over the library's limit was refused when it arrived (400).

The batch follows the load through the library's buckets: the carry lives on
the host between chunks (numpy; on a CPU that is the device's own memory),
where retiring and admitting rows is a gather, and the call's batch is the
active row count padded as `request.build` pads it (XLA), so no value of a
request compiles anything new after `warm_up`. Nothing runs while no row is
active: the thread waits on a condition.
"""

import collections
import dataclasses
import threading
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.decoding import processors
from rnnstep.decoding import stopping
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import request as request_lib
from rnnstep.model import network


class Shared(NamedTuple):
  """The settings a request shares by all its rows (a library `Request`'s
  shared settings), carried per row by the engine (module docstring).

  Attributes:
    stop: the stop strings.
    repetition_window: the repetition penalty's window.
    no_repeat_ngram_size: the n-gram ban's n.
    regex: the pattern, or None.
  """
  stop: Tuple[str, ...] = ()
  repetition_window: int = 0
  no_repeat_ngram_size: int = 0
  regex: Optional[str] = None


class Update(NamedTuple):
  """New output of one row, handed to its `Completion`'s sink.

  Attributes:
    index: the choice index (prompt index x n + i).
    text: the characters generated since the last update (the library's text:
      a row that met a stop string ends with it).
    finish_reason: None while running; "stop" (a stop string or the regex's
      end), "length" (`max_tokens`), "cancelled" (the engine closed first)
      or "error" (its chunk failed).
    score: the row's log-likelihood so far (0.0 unless it wants scores).
    tokens: the ids generated since the last update (a token model's text
      has more or fewer characters than ids: the usage counts ids).
  """
  index: int
  text: str
  finish_reason: Optional[str]
  score: float
  tokens: int = 0


@dataclasses.dataclass(eq=False)
class Row:
  """One choice of a completion: one slot's worth of work.

  Attributes:
    completion: the `Completion` it belongs to.
    index: its choice index; also its noise index under the seed.
    prompt_ids: int32 ids of its prompt (>= 1).
    params: its per-row decoding values, one scalar per `options.PER_ROW`.
    produced: characters (tokens) handed out so far.
    text: its incremental decoder (`vocabulary.StreamText`), made when its
      first ids come: a token model's chunk never splits a character and
      is cut at a stop string's end.
    primed: prompt ids its carried state has consumed (while its prompt is
      primed in pieces).
    decoding: its whole prompt is primed; it decodes.
    stop_offset: where its stop automaton starts in the joined table its
      carried `stop_state` points into (`Engine._tables`).
    dfa_offset: where its regex DFA starts in the joined DFA its carried
      `dfa_state` points into (`constraints.FREE`: no pattern).
  """
  completion: "Completion"
  index: int
  prompt_ids: np.ndarray
  params: options_lib.Params
  produced: int = 0
  text: Optional[object] = None
  primed: int = 0
  decoding: bool = False
  stop_offset: int = 0
  dfa_offset: int = constraints.FREE


class Completion:
  """A request's rows, and where their output goes.

  Args:
    rows_prompt_ids: per choice, the prompt's ids.
    params: per choice, its `options.Params` of scalars.
    seed: the request's seed (choice k uses (seed, k), as `generate`'s row k).
    max_tokens: characters to generate per choice (>= 1).
    shared: its `Shared` settings.
    want_scores: accumulate each choice's log-likelihood.
    sink: called with each `Update`, through the engine's `deliver` (by
      default on the scheduler thread: make it quick and thread-safe).
  """

  def __init__(self, rows_prompt_ids: Sequence[np.ndarray],
               params: Sequence[options_lib.Params], *, seed: int,
               max_tokens: int, shared: Shared, want_scores: bool,
               sink: Callable[[Update], None]):
    self.seed = int(seed)
    self.max_tokens = int(max_tokens)
    self.shared = shared
    self.want_scores = bool(want_scores)
    self.sink = sink
    self.cancelled = False
    self.submitted_at = time.monotonic()
    self.rows = [Row(self, k, np.asarray(ids, np.int32), p)
                 for k, (ids, p) in enumerate(zip(rows_prompt_ids, params))]

  def cancel(self) -> None:
    """Retires its rows at the next chunk boundary (any thread)."""
    self.cancelled = True


class QueueFull(Exception):
  """The waiting queue cannot take the request's rows (answer 429)."""


class ShuttingDown(Exception):
  """The engine admits nothing more (answer 503)."""


@dataclasses.dataclass
class Stats:
  """Counters the metrics read (updated on the scheduler thread)."""
  chunks: int = 0
  characters: int = 0
  mixed_chunks: int = 0  # chunks whose rows held more than one `Shared`
  running: int = 0
  waiting: int = 0
  busy_seconds: float = 0.0   # scheduler time from admission to hand-out
  device_seconds: float = 0.0  # of which inside the compiled call


def call_sinks(updates: List[Tuple["Completion", Update]]) -> None:
  """Calls each update's completion's sink, where it is called from (the
  default `deliver`: on the scheduler thread; the server posts it to its
  event loop); a failing sink cancels its own completion only."""
  for completion, update in updates:
    try:
      completion.sink(update)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("dropping an update: %s", e)
      completion.cancel()


# The bytes of each joined table (stop strings, regex) a call passes on the
# paths that compile per shape: its fixed state count is this over the
# vocabulary's row (at least 16). A call copies them whole, so they are kept
# small: 2 x 128 KiB for a 65-character vocabulary.
TABLE_BYTES = 256 << 10


def _power_of_two_at_least(n: int, minimum: int) -> int:
  return max(minimum, 1 << (max(int(n), 1) - 1).bit_length())


class _Lru(collections.OrderedDict):
  """A dict of the `size` most recently used entries (the engine's tables:
  a server's clients may send any number of distinct stop lists)."""

  def __init__(self, size: int):
    super().__init__()
    self.size = size

  def get_or_make(self, key, make):
    if key in self:
      self.move_to_end(key)
      return self[key]
    value = self[key] = make()
    if len(self) > self.size:
      self.popitem(last=False)
    return value


class _Tables(NamedTuple):
  """A chunk's joined tables (`Engine._tables`).

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


class Engine:
  """The slots, the waiting queue and the scheduler thread.

  Args:
    model: the `rnnstep.Model`.
    path: the concrete execution path ("xla", "graph", "elementwise").
    max_batch: slots (rows decoded together at most).
    chunk_steps: steps per device call.
    max_queue: rows waiting at most beyond the free slots; more is
      `QueueFull`.
    max_tokens_limit: the largest `max_tokens` a request may ask.
    max_prompt_chars: the longest prompt (the history buffer holds a prompt
      and its whole continuation).
    strategy: None, or a `tf.distribute.Strategy` over which each chunk's
      rows are split evenly (`rnnstep.generate`'s `strategy=`): the slots
      spread over its devices, every row's text unchanged.
    deliver: called on the scheduler thread with a round's updates, a list
      of `(Completion, Update)` in order, once per chunk (and once for the
      rows a round cancels or fails); it calls each completion's `sink`
      with its update, wherever it chooses to (the server: on its event
      loop, all of a chunk's updates in one hand-off). Default: each sink,
      there and then. If it raises, the round's completions are cancelled.

  Attributes:
    prime_chars: the longest prompt piece one call primes; a longer prompt
      is primed across calls.
    stop_capacity: states of the joined stop table (module docstring).
    dfa_capacity: states of the joined regex DFA, its 2 shared ones
      included.
    deliver: as the argument (settable before `start`).
  """

  def __init__(self, model, *, path: str, max_batch: int, chunk_steps: int,
               max_queue: int, max_tokens_limit: int,
               max_prompt_chars: int = 1024, strategy=None,
               deliver: Optional[Callable[
                   [List[Tuple["Completion", Update]]], None]] = None):
    if strategy is not None:  # Its weights on every replica, as generate's.
      model = network.replicated(model, strategy)
    self.model = model
    self.strategy = strategy
    self.generator = generator_lib.cached(model, path)
    self.max_batch = int(max_batch)
    self.chunk_steps = int(chunk_steps)
    self.max_queue = int(max_queue)
    self.max_tokens_limit = int(max_tokens_limit)
    self.max_prompt_chars = int(max_prompt_chars)
    self.stats = Stats()
    # A piece as long as a chunk: priming a piece costs about what the
    # chunk's decode steps cost, so a long prompt at most doubles one call.
    # At least 8 (XLA's narrowest prompt width; and a piece must be longer
    # than the character priming leaves unconsumed).
    self.prime_chars = max(self.chunk_steps, 8)
    self._unconsumed = self.generator.programs.unconsumed
    # The paths that compile XLA programs at a call's shapes (the whole
    # call under XLA; the elementwise path's decode step, at the batch and
    # the stop and regex tables' sizes) run at bucketed shapes, which the
    # warm-up compiles: no request compiles anything new after it.
    self._bucketed = self.generator.path != paths.GRAPH
    row_bytes = 4 * self.model.vocab_size
    if self._bucketed:  # One fixed shape each, which the warm-up compiles.
      fixed = max(16, 1 << (max(TABLE_BYTES // row_bytes, 1).bit_length()
                            - 1))
      self.stop_capacity = self.dfa_capacity = fixed
    else:  # No shapes to keep: the library's limits.
      self.stop_capacity = stopping.MAX_TABLE_BYTES // row_bytes
      self.dfa_capacity = constraints.MAX_TABLE_BYTES // row_bytes
    # History width: a prompt and every step a row may take (it may run up
    # to a chunk past its max_tokens before it is retired).
    self._history_length = int(request_lib.bucket(
        self.max_prompt_chars + self.max_tokens_limit + self.chunk_steps, 16))
    self._waiting = collections.deque()
    self._active: List[Row] = []
    self._carry = None  # numpy Carry of `_active`'s rows, in order.
    self._condition = threading.Condition()
    self._admitting = True
    self._stopping = False
    self._thread = None
    # Per distinct stop list its automaton, per distinct pattern its state
    # count, per layout (the distinct settings of a chunk, in order) its
    # joined tables.
    self._stops_cache = _Lru(256)
    self._pattern_states = _Lru(256)
    self._joined = _Lru(64)
    self._template = self._zero_carry()
    self.deliver = deliver or call_sinks
    # The round's updates, handed to `deliver` together (`_flush`): one
    # hand-off a chunk, not one a row.
    self._outbox: List[Tuple[Completion, Update]] = []

  # -- any thread ------------------------------------------------------------

  def submit(self, completion: Completion) -> None:
    """Queues a completion's rows.

    Raises:
      QueueFull: the waiting queue has no room for all its rows.
      ShuttingDown: `close` has begun.
    """
    with self._condition:
      if not self._admitting:
        raise ShuttingDown()
      # Free slots take rows at the next chunk boundary: they count as room.
      free = max(self.max_batch - len(self._active), 0)
      if len(self._waiting) + len(completion.rows) > self.max_queue + free:
        raise QueueFull()
      self._waiting.extend(completion.rows)
      self.stats.waiting = len(self._waiting)
      self._condition.notify()

  def start(self) -> None:
    """Starts the scheduler thread."""
    self._thread = threading.Thread(target=self._run, name="rnnstep-scheduler",
                                    daemon=True)
    self._thread.start()

  def close(self, timeout: Optional[float] = None) -> bool:
    """Stops admitting; waits up to `timeout` s for the rows already taken.

    Rows still running after it are cancelled. Returns whether all drained.
    """
    with self._condition:
      self._admitting = False
      self._condition.notify()
    deadline = None if timeout is None else time.monotonic() + timeout
    drained = True
    while self._thread is not None and self._thread.is_alive():
      with self._condition:
        if not self._waiting and not self._active:
          break
      if deadline is not None and time.monotonic() > deadline:
        drained = False
        with self._condition:
          for row in list(self._waiting) + list(self._active):
            row.completion.cancel()
        break
      time.sleep(0.01)
    with self._condition:
      self._stopping = True
      self._condition.notify()
    if self._thread is not None:
      self._thread.join(timeout=30)
    return drained

  def warm_up(self) -> None:
    """Traces (and where the path compiles, compiles) every program a
    request can need.

    On a bucketed path (`_bucketed`), one call per batch bucket up to
    `max_batch` and per distinct prompt width (`_prompt_width`'s), each
    with and without scores: the elementwise path compiles the decode
    step of the plain and the general tail (`loop.run_decode`'s two
    branches) when a call first takes each. A call over carried rows, or
    over a long prompt's pieces, has the same shapes.
    """
    batches, widths = [1], [1]  # The graph path: one trace fits all.
    if self._bucketed:
      batches = sorted({request_lib.batch_bucket(n)
                        for n in range(1, self.max_batch + 1)})
      widths = sorted({self._prompt_width(1), self._prompt_width(
          min(self.prime_chars, self.max_prompt_chars))})
    params = options_lib.DEFAULTS
    for batch in batches:
      for width in widths:
        for want_scores in (False, True):
          dummy = Completion([np.zeros([width], np.int32)] * batch,
                             [params] * batch, seed=0, max_tokens=1,
                             shared=Shared(), want_scores=want_scores,
                             sink=lambda update: None)
          self._call(dummy.rows, fresh=np.ones([batch], bool),
                     primes_only=np.zeros([batch], bool), carry=None,
                     steps=1)

  # -- the scheduler thread --------------------------------------------------

  def _run(self) -> None:
    while True:
      self._flush()  # The last round's updates (outside the lock).
      with self._condition:
        while (not self._stopping and not self._active
               and not self._live_waiting()):
          self._condition.wait()
        if self._stopping:
          for row in list(self._waiting) + self._active:
            self._send(row, Update(row.index, "", "cancelled", 0.0))
          self._waiting.clear()
          self._active, self._carry = [], None
          self._flush()
          return
        kept = [i for i, row in enumerate(self._active)
                if not row.completion.cancelled]
        for i, row in enumerate(self._active):
          if row.completion.cancelled:
            self._send(row, Update(row.index, "", "cancelled", 0.0))
        fresh_rows = self._admit([self._active[i] for i in kept])
      self._flush()  # The rows cancelled now, before the call.
      rows = [self._active[i] for i in kept] + fresh_rows
      if not rows:
        self._active, self._carry = [], None
        self.stats.running = 0
        continue
      carry = None
      if self._carry is not None and kept:
        carry = tf.nest.map_structure(lambda x: x[kept], self._carry)
      # Admitted rows, and carried rows whose prompt is still being primed,
      # start their prompt's next piece; a piece that is not the last only
      # primes.
      fresh = np.array([not row.decoding for row in rows])
      primes_only = np.array([
          not row.decoding
          and len(row.prompt_ids) - row.primed > self.prime_chars
          for row in rows])
      steps = self.chunk_steps
      decoding = [row for row, only in zip(rows, primes_only) if not only]
      if decoding:
        # No row needs more than its own characters: when they all end
        # within the chunk, the call stops there (a row's text depends on
        # its own seed and position only, so cutting the call changes none).
        steps = min(steps, max(row.completion.max_tokens - row.produced
                               for row in decoding))
      scored = [row for row in decoding if row.completion.want_scores]
      if scored:
        # A row's score counts only its own characters: such a chunk ends at
        # the first of their limits.
        steps = min([steps] + [row.completion.max_tokens - row.produced
                               for row in scored])
      started = time.monotonic()
      try:
        result, self._carry = self._call(rows, fresh=fresh,
                                         primes_only=primes_only, carry=carry,
                                         steps=steps)
      except Exception as e:  # pylint: disable=broad-except
        # Not expected (requests are checked before they queue); the rows
        # fail, the server goes on serving.
        logging.exception("a chunk failed: %s", e)
        for row in rows:
          self._send(row, Update(row.index, "", "error", 0.0))
        self._active, self._carry = [], None
        continue
      for row, only in zip(rows, primes_only):
        if only:  # The piece's characters but the unconsumed ones.
          row.primed += self.prime_chars - self._unconsumed
        else:
          row.decoding = True
      self._active = self._hand_out(rows, result, primes_only)
      self.stats.busy_seconds += time.monotonic() - started
      self.stats.chunks += 1
      self.stats.running = len(self._active)
      if self._carry is not None and len(self._active) < len(rows):
        survivors = [i for i, row in enumerate(rows) if row in self._active]
        self._carry = tf.nest.map_structure(lambda x: x[survivors],
                                            self._carry)

  def _send(self, row: Row, update: Update) -> None:
    """Queues an update for this round's `deliver`."""
    self._outbox.append((row.completion, update))

  def _flush(self) -> None:
    """Hands the round's updates to `deliver`; a failing hand-off (a
    closed event loop) cancels their completions rather than stopping the
    scheduler."""
    if not self._outbox:
      return
    updates, self._outbox = self._outbox, []
    try:
      self.deliver(updates)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("dropping %d updates: %s", len(updates), e)
      for completion, _ in updates:
        completion.cancel()

  def _live_waiting(self) -> bool:
    while self._waiting and self._waiting[0].completion.cancelled:
      row = self._waiting.popleft()
      self._send(row, Update(row.index, "", "cancelled", 0.0))
    self.stats.waiting = len(self._waiting)
    return bool(self._waiting)

  def _admit(self, going_on: List[Row]) -> List[Row]:
    """Pops the waiting rows that fit now, whatever their settings.

    A row fits while there is a free slot and the joined tables with its
    settings stay within their capacities (`_fits`); the first that does
    not waits (nothing overtakes it) until rows drain. A row beside rows of
    its own settings only (or none) always fits.

    Args:
      going_on: the running rows that go on into the next chunk.
    """
    running = len(going_on)
    if not self._admitting and not running and not self._waiting:
      return []
    stops = {row.completion.shared.stop for row in going_on}
    patterns = {row.completion.shared.regex for row in going_on} - {None}
    admitted = []
    while self._live_waiting() and running + len(admitted) < self.max_batch:
      shared = self._waiting[0].completion.shared
      more_stops, more_patterns = stops | {shared.stop}, patterns | (
          {shared.regex} - {None})
      if (stops or patterns) and (more_stops != stops
                                  or more_patterns != patterns):
        if not self._fits(more_stops, more_patterns):
          break  # It waits for rows to drain; nothing overtakes it.
      stops, patterns = more_stops, more_patterns
      admitted.append(self._waiting.popleft())
    self.stats.waiting = len(self._waiting)
    return admitted

  def _fits(self, stops, patterns) -> bool:
    """Whether the joined tables of these distinct stop lists and patterns
    stay within `stop_capacity` and `dfa_capacity`."""
    stop_states = sum(len(self._stops(stop).accept) for stop in stops)
    dfa_states = 2 + sum(self._pattern_states.get_or_make(
        pattern, lambda pattern=pattern: len(constraints.combine(
            self.model, [pattern]).ends) - 2) for pattern in patterns)
    return (stop_states <= self.stop_capacity
            and dfa_states <= self.dfa_capacity)

  def _hand_out(self, rows: List[Row], result,
                primes_only: np.ndarray) -> List[Row]:
    """Sends each row its new characters; returns the rows still running.

    Args:
      rows: the call's rows.
      result: its `(ids, lengths, scores, done)`.
      primes_only: bool per row: it only primed (nothing to send yet).

    Returns:
      The rows that go on, in order.
    """
    ids, lengths, scores, done = result
    running = []
    for r, row in enumerate(rows):
      if primes_only[r]:
        running.append(row)
        continue
      completion = row.completion
      room = completion.max_tokens - row.produced
      new = ids[r, :min(int(lengths[r]), room)]
      row.produced += len(new)
      self.stats.characters += len(new)
      if done[r] and int(lengths[r]) <= room:
        reason = "stop"
      elif row.produced >= completion.max_tokens:
        reason = "length"
      else:
        reason = None
      if row.text is None:
        row.text = self.model.tokens.stream(completion.shared.stop)
      text = row.text.push(new) + (row.text.finish() if reason else "")
      self._send(row, Update(row.index, text, reason, float(scores[r]),
                             len(new)))
      if reason is None:
        running.append(row)
    return running

  # -- one device call -------------------------------------------------------

  def _prompt_width(self, longest: int) -> int:
    """The prompt ids' width: under XLA one of two, so widths compile twice."""
    if not self._bucketed:
      return longest
    narrow = request_lib.MIN_WIDTH  # What `request.build` pads to anyway.
    return narrow if longest <= narrow else _power_of_two_at_least(
        min(self.prime_chars, self.max_prompt_chars), narrow)

  def _piece(self, row: Row) -> np.ndarray:
    """The ids a fresh row primes in this call: its prompt from where its
    state stands, at most `prime_chars` of them."""
    return row.prompt_ids[row.primed:row.primed + self.prime_chars]

  def _history(self, row: Row) -> processors.History:
    """A one-row `History` after the row's whole prompt, on the host.

    `processors.start`'s values for the prompt (which `serve_fn` cannot
    make from a prompt primed in pieces): its ids, its length, and the
    counts of its last `repetition_window` ids (all of them for 0).
    """
    prompt = row.prompt_ids
    ids = np.zeros([1, self._history_length], np.int32)
    ids[0, :len(prompt)] = prompt
    window = row.completion.shared.repetition_window
    first = max(len(prompt) - window, 0) if window > 0 else 0
    counts = np.bincount(prompt[first:], minlength=self.model.vocab_size)
    return processors.History(ids, np.array([len(prompt)], np.int32),
                              counts.astype(np.int32)[None, :])

  def _stops(self, stop) -> stopping.Automaton:
    """The stop automaton of a stop list, made once (its own states)."""
    return self._stops_cache.get_or_make(
        stop, lambda: host.stop_automaton(self.model, stop))

  def _tables(self, rows: List[Row]) -> _Tables:
    """The joined stop table and regex DFA of a chunk's rows.

    Each distinct stop list (pattern) is laid out once, in the order the
    rows first name it; a layout is made once and kept (`_joined`). On the
    paths that compile per shape both tables are padded to their capacity
    (one shape, which the warm-up compiled; the DFA even when no row has a
    pattern), or, for rows of one table over it, to a power of two.
    """
    stops = tuple(dict.fromkeys(row.completion.shared.stop for row in rows))
    patterns = tuple(dict.fromkeys(
        row.completion.shared.regex for row in rows
        if row.completion.shared.regex is not None))

    def make():
      automaton, offsets = stopping.join([self._stops(s) for s in stops])
      dfa = (constraints.combine(self.model, patterns)
             if patterns or self._bucketed else None)
      if self._bucketed:
        automaton = stopping.Automaton(*request_lib.pad_states(
            automaton.table, automaton.accept, 0, _power_of_two_at_least(
                len(automaton.accept), self.stop_capacity)))
        table, ends = request_lib.pad_states(
            dfa.table, dfa.ends, constraints.DEAD,
            _power_of_two_at_least(len(dfa.ends), self.dfa_capacity))
        dfa = dfa._replace(table=table, ends=ends)
      starts = dict(zip(patterns, dfa.start)) if dfa is not None else {}
      return automaton, dict(zip(stops, offsets)), dfa, starts

    automaton, stop_at, dfa, dfa_at = self._joined.get_or_make(
        (stops, patterns), make)
    if dfa is not None:
      dfa = dfa._replace(start=np.array(
          [dfa_at.get(row.completion.shared.regex, constraints.FREE)
           for row in rows], np.int32))
    return _Tables(automaton, np.array(
        [stop_at[row.completion.shared.stop] for row in rows], np.int32), dfa)

  def _call(self, rows: List[Row], *, fresh: np.ndarray,
            primes_only: np.ndarray, carry, steps: int):
    """Runs `serve_fn` once over `rows`.

    Args:
      rows: the rows, carried ones first.
      fresh: bool per row: its prompt (or its prompt's next piece, `_piece`)
        starts here.
      primes_only: bool per row: a fresh row whose piece is not its last.
      carry: the numpy `Carry` of the carried rows (None: none).
      steps: steps to run (<= chunk_steps).

    Returns:
      `((ids, lengths, scores, done) of the rows, their numpy Carry)`.
    """
    batch = len(rows)
    tables = self._tables(rows)
    pieces = {r: self._piece(row) for r, row in enumerate(rows) if fresh[r]}
    longest = max([len(piece) for piece in pieces.values()] + [1])
    ids = np.zeros([batch, self._prompt_width(longest)], np.int32)
    lengths = np.ones([batch], np.int32)
    for r, piece in pieces.items():
      ids[r, :len(piece)] = piece
      lengths[r] = len(piece)
    sampling = options_lib.Params(*[
        np.array([row.params[i] for row in rows])
        for i in range(len(options_lib.PER_ROW))])
    # Per row (`serve_fn`'s look-back is `[B]`).
    options = request_lib.Options(
        sampling=sampling,
        repetition_window=np.array(
            [row.completion.shared.repetition_window for row in rows],
            np.int32),
        no_repeat_ngram_size=np.array(
            [row.completion.shared.no_repeat_ngram_size for row in rows],
            np.int32),
        return_scores=any(row.completion.want_scores for row in rows))
    request = request_lib.build(
        request_lib.Prompts(ids, lengths), np.int32(steps), options,
        seeds=request_lib.Seeds(
            np.array([row.completion.seed for row in rows], np.int64),
            np.array([row.index for row in rows], np.int32)),
        stops=tables.stops, bucket_shapes=self._bucketed,
        state_sizes=self.generator.state_sizes(), constraint=tables.dfa,
        capacity_steps=self.chunk_steps)
    # One history width for every call: carried rows keep their buffers.
    request = request._replace(lookback=request.lookback._replace(
        history_length=np.int32(self._history_length)))
    padded = int(request.prompts.lengths.shape[0])  # build's batch bucket
    index = np.concatenate([np.arange(batch), np.zeros([padded - batch],
                                                        np.int64)])
    carried = 0 if carry is None else len(carry.last_ids)
    fillers = tf.nest.map_structure(
        lambda x: np.repeat(x, batch - carried, axis=0), self._template)
    if carry is not None:  # Carried rows first, then the fresh rows' fillers.
      fillers = tf.nest.map_structure(
          lambda x, y: np.concatenate([x, y]), carry, fillers)
    carry = tf.nest.map_structure(lambda x: x[index], fillers)  # Copies.
    carry = carry._replace(step=np.asarray(carry.step, np.int32))
    for r in pieces:  # A row about to decode starts from its whole prompt's.
      if not primes_only[r]:
        history = self._history(rows[r])
        for whole, one in zip(carry.history, history):
          whole[r] = one[0]
    self._place(rows, fresh, tables, carry)
    if len({row.completion.shared for row in rows}) > 1:
      self.stats.mixed_chunks += 1
    called = time.monotonic()
    args = (request, carry, fresh[index], primes_only[index])
    if self.strategy is None:
      result = self.generator.call("serve_fn", *args)
    else:
      result = self._call_distributed(args)
    self.stats.device_seconds += time.monotonic() - called
    result = tf.nest.map_structure(lambda x: np.asarray(x)[:batch], result)
    return ((result.ids, result.lengths, result.scores, result.carry.done),
            result.carry)

  def _place(self, rows: List[Row], fresh: np.ndarray, tables: _Tables,
             carry) -> None:
    """Points each row's stop and DFA states into this chunk's tables.

    A fresh row starts at its automaton's offset (its DFA's start is the
    request's `constraint.start`); a carried row's state moves by the
    difference between its offsets in the last chunk's tables and in
    these. The DFA's shared states (`FREE`, `DEAD`) stay where they are.
    Padding rows (XLA's batch bucket) copy row 0's. `carry` (numpy, the
    call's rows) is changed in place; each row's offsets are updated.
    """
    dfa_start = (tables.dfa.start if tables.dfa is not None else
                 np.full([len(rows)], constraints.FREE, np.int32))
    for r, row in enumerate(rows):
      stop_offset, dfa_offset = int(tables.stop_offsets[r]), int(dfa_start[r])
      if fresh[r]:
        carry.stop_state[r] = stop_offset
      else:
        carry.stop_state[r] += stop_offset - row.stop_offset
        if carry.dfa_state[r] >= 2:  # Its own states, not FREE or DEAD.
          carry.dfa_state[r] += dfa_offset - row.dfa_offset
      row.stop_offset, row.dfa_offset = stop_offset, dfa_offset
    carry.stop_state[len(rows):] = carry.stop_state[0]
    carry.dfa_state[len(rows):] = carry.dfa_state[0]

  def _call_distributed(self, args):
    """`serve_fn` over `args` with the rows split over the strategy's
    replicas (`host.run_distributed`); returns the `Result` of numpy arrays.
    """
    structure = []

    def run(*replica_args):  # Per replica; every output has rows first.
      result = self.generator.serve_fn(*replica_args)
      structure[:] = [result]
      # The strategy's gather takes no bool (`done`): gathered as int32.
      return tuple(tf.cast(x, tf.int32) if x.dtype == tf.bool else x
                   for x in tf.nest.flatten(result))

    flat = host.run_distributed(run, self.strategy, *args)
    return tf.nest.pack_sequence_as(structure[0], [
        x.astype(bool) if like.dtype == tf.bool else x
        for x, like in zip(flat, tf.nest.flatten(structure[0]))])

  def _zero_carry(self):
    """A one-row numpy `Carry` of this engine's shapes (a fresh row's filler)."""
    vocab_size = self.model.vocab_size
    return request_lib.Carry(
        state=tuple(tuple(np.zeros([1, units], np.float32) for units in sizes)
                    for sizes in self.generator.state_sizes()),
        last_ids=np.zeros([1], np.int32),
        stop_state=np.zeros([1], np.int32),
        done=np.zeros([1], bool),
        step=np.zeros([1], np.int32),
        history=processors.History(
            np.zeros([1, self._history_length], np.int32),
            np.zeros([1], np.int32), np.zeros([1, vocab_size], np.int32)),
        scores=np.zeros([1], np.float32),
        dfa_state=np.zeros([1], np.int32))
