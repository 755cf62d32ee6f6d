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
    When the rows just admitted are most of a batch that is not full (a
    burst arriving: the HTTP side reads its requests one after another),
    the call is short (`burst_steps`), so that the rest of the burst joins
    at its end instead of waiting a whole chunk while a few rows run: the
    burst then runs and ends together, in full batches (with 64 clients
    each sending its next request as its last ends, a 128-step chunk over
    the first 13 arrivals left the other 51 a chunk behind, and every
    round after ran a chunk of 13 rows and one of 51);
    A prompt longer than a piece (`prime_chars`: the chunk's steps, at least
    8) is primed a piece a call, its state carried between them like a
    decoding row's, so that no call primes more than a piece and a long
    prompt holds the other rows up by no more than one chunk's worth;
  - hands each row's new ids and characters to its `Completion`'s sink,
    with their log-probabilities where it asks (`Completion.logprobs`:
    recorded inside the same call, `pipeline.StepLogprobs`, under the
    condition that computes scores, so a call no row of which asks pays
    nothing; `Completion.prompt_logprobs`: one more call, a TF graph of any
    shape, per distinct prompt when its rows are admitted).

Limits are in the model's ids: `max_prompt_tokens` and `max_tokens_limit`
size every buffer (the history holds a prompt and its whole continuation),
and `submit` refuses a prompt of more ids (the server refuses it first).

One row's failure retires that row only (its `Update` says "error", with a
`message`); the other rows carry on, each with the text it would have had.
Each row's host work (its piece, history and tables; its text's decoding)
runs on its own, and a failed call is run again over each half of its rows
(`_attempt`), down to the row it fails for: the carry is on the host, and
a row's text depends on its own seed, index and position only, so a row
runs the same in any subset. The scheduler thread never dies: an
unexpected failure of a round fails that round's rows, and the next round
starts afresh.

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
active: the thread waits on a condition. Under XLA with
`compile_in_background` the server need not wait for those compiles: a
call whose shapes' program is not compiled yet runs the graph path's
`serve_fn` on the same arguments while a thread compiles it
(`compiling.py`); rows go on from one path to the other between chunks.
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
from rnnstep.decoding import pipeline
from rnnstep.decoding import processors
from rnnstep.decoding import stopping
from rnnstep.engine import compiling
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import request as request_lib
from rnnstep.model import network

# The most alternatives a `logprobs` request may ask per id (OpenAI's limit).
TOP_LOGPROBS = pipeline.TOP_LOGPROBS


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
      end), "length" (`max_tokens`), "cancelled" (the engine closed first,
      or the client went away) or "error" (the row failed: `message` says
      how; the other rows carry on).
    score: the row's log-likelihood so far (0.0 unless it wants scores).
    tokens: the ids generated since the last update (a token model's text
      has more or fewer characters than ids: the usage counts ids).
    ids: int32 `[tokens]`, those ids (always; empty on a cancelled or failed
      row's last update). A token model's `text` may hold back an id's
      characters until the next update (a character split across ids).
    token_logprobs: float32 `[tokens]`, each id's log-probability under the
      raw model distribution (log softmax of the model's logits before any
      decoding option: what `score` sums), or None: the completion did not
      ask (`Completion.logprobs` None).
    top_ids: int32 `[tokens, k]`, per id the k most likely ids of that same
      distribution (most likely first; ties: the lower id first), or None.
    top_logprobs: float32 `[tokens, k]`, their log-probabilities, or None.
    prompt_logprobs: float32 `[len(prompt) - 1]`, the log-probability of
      prompt id t + 1 after ids 0..t (id 0 has none), on the row's first
      update that carries output, where the completion asked
      (`Completion.prompt_logprobs`); else None.
    prompt_top_ids: int32 `[len(prompt) - 1, k]`, per prompt id t + 1 the k
      most likely ids after ids 0..t, or None.
    prompt_top_logprobs: float32 `[len(prompt) - 1, k]`, theirs, or None.
    message: with finish_reason "error", what failed (for the server's log).
  """
  index: int
  text: str
  finish_reason: Optional[str]
  score: float
  tokens: int = 0
  ids: Optional[np.ndarray] = None
  token_logprobs: Optional[np.ndarray] = None
  top_ids: Optional[np.ndarray] = None
  top_logprobs: Optional[np.ndarray] = None
  prompt_logprobs: Optional[np.ndarray] = None
  prompt_top_ids: Optional[np.ndarray] = None
  prompt_top_logprobs: Optional[np.ndarray] = None
  message: Optional[str] = None


_NO_IDS = np.zeros([0], np.int32)


def _ended(row: "Row", reason: str, message: Optional[str] = None) -> Update:
  """The last update of a row that ends with nothing more to hand out."""
  return Update(row.index, "", reason, 0.0, 0, _NO_IDS, message=message)


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
    prompt_scores: its prompt's `(logprobs, top_ids, top_logprobs)` until
      its first update carries them (`Completion.prompt_logprobs`).
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
  prompt_scores: Optional[tuple] = None


class Completion:
  """A request's rows, and where their output goes.

  Args:
    rows_prompt_ids: per choice, the prompt's ids.
    params: per choice, its `options.Params` of scalars.
    seed: the request's seed (choice k uses (seed, k), as `generate`'s row k).
    max_tokens: ids to generate per choice (>= 1; 0 with `prompt_logprobs`:
      the prompt is only scored).
    shared: its `Shared` settings.
    want_scores: accumulate each choice's log-likelihood.
    sink: called with each `Update`, through the engine's `deliver` (by
      default on the scheduler thread: make it quick and thread-safe).
    logprobs: None (no per-id values), or k in 0..`TOP_LOGPROBS`: each
      update carries its ids' log-probabilities and the k most likely ids'
      (`Update.token_logprobs`, `top_ids`, `top_logprobs`).
    prompt_logprobs: each row's first update carries its prompt's
      log-probabilities, with the k (`logprobs`, 0 where None) most likely
      ids' at each position (`Update.prompt_logprobs`, ...): one more call
      on the scheduler thread when its rows are admitted.
    stop_automaton: `shared.stop`'s `stopping.Automaton`, where the caller
      built it already (None: the scheduler builds it).
    pattern: `shared.regex` compiled (`constraints.compile_pattern`), where
      the caller compiled it already, on a thread of its own within
      `constraints.limits` (a server's check): the scheduler then never
      compiles it, unbounded, once the compile cache has let it go (None:
      the scheduler compiles it).

  Raises:
    ValueError: `logprobs` outside 0..`TOP_LOGPROBS`.
  """

  def __init__(self, rows_prompt_ids: Sequence[np.ndarray],
               params: Sequence[options_lib.Params], *, seed: int,
               max_tokens: int, shared: Shared, want_scores: bool,
               sink: Callable[[Update], None],
               logprobs: Optional[int] = None,
               prompt_logprobs: bool = False,
               stop_automaton: Optional[stopping.Automaton] = None,
               pattern: Optional[constraints.Pattern] = None):
    if logprobs is not None and not 0 <= int(logprobs) <= TOP_LOGPROBS:
      raise ValueError(f"logprobs must lie in 0..{TOP_LOGPROBS}, got "
                       f"{logprobs}")
    self.seed = int(seed)
    self.max_tokens = int(max_tokens)
    self.shared = shared
    self.want_scores = bool(want_scores)
    self.sink = sink
    self.logprobs = None if logprobs is None else int(logprobs)
    self.prompt_logprobs = bool(prompt_logprobs)
    self.stop_automaton = stop_automaton
    self.pattern = pattern
    # Per distinct prompt (its bytes), its prompt log-probabilities: the
    # rows of a prompt's n choices share one computation.
    self.prompt_scores = {}
    self.cancelled = False
    self.submitted_at = time.monotonic()
    self.rows = [Row(self, k, np.asarray(ids, np.int32), p)
                 for k, (ids, p) in enumerate(zip(rows_prompt_ids, params))]

  def cancel(self) -> None:
    """Retires its rows at the next chunk boundary (any thread)."""
    self.cancelled = True

  @property
  def scored(self) -> bool:
    """Whether its calls compute log-probabilities (scores or `logprobs`)."""
    return self.want_scores or self.logprobs is not None


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
  # chunks run on the graph path while their XLA program compiled
  # (`Engine`'s `compile_in_background`)
  interim_chunks: int = 0


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


class _Prepared(NamedTuple):
  """A row's host work for a call (`Engine._prepare`).

  Attributes:
    piece: int32, the prompt ids it primes in this call (`Engine._piece`),
      or None: it decodes on from its carried state.
    history: its one-row `processors.History` after its whole prompt,
      where its last piece starts here (`Engine._history`), else None.
    primes_only: its piece is not its prompt's last: it only primes.
  """
  piece: Optional[np.ndarray]
  history: Optional[processors.History]
  primes_only: bool


def _describe(error: Exception) -> str:
  """An exception in one line, for an `Update.message`: its type and the
  first line of its message that says what failed (a TensorFlow error's
  message opens with its graph's call stack)."""
  lines = [line for line in str(error).splitlines()
           if line.strip() and not line.startswith((" ", "\t"))
           and not line.startswith(("Graph execution error",
                                    "Detected at node"))]
  return type(error).__name__ + (f": {lines[0][:300]}" if lines else "")


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
    max_prompt_tokens: the longest prompt, in the model's ids (every buffer
      is sized from it: the history holds a prompt and its whole
      continuation); `submit` refuses a longer one.
    strategy: None, or a `tf.distribute.Strategy` over which each chunk's
      rows are split evenly (`rnnstep.generate`'s `strategy=`): the slots
      spread over its devices, every row's text unchanged.
    deliver: called on the scheduler thread with a round's updates, a list
      of `(Completion, Update)` in order, once per chunk (and once for the
      rows a round cancels or fails); it calls each completion's `sink`
      with its update, wherever it chooses to (the server: on its event
      loop, all of a chunk's updates in one hand-off). Default: each sink,
      there and then. If it raises, the round's completions are cancelled.
    compile_in_background: on the XLA path (without a strategy), `warm_up`
      traces the graph path's program and returns: a call runs on the
      graph path until its shape's XLA program is compiled, on a thread of
      its own (`compiling.py`; the same text), then on XLA. Otherwise
      `warm_up` compiles every program first.

  Attributes:
    prime_chars: the longest prompt piece one call primes; a longer prompt
      is primed across calls.
    burst_steps: the steps of a call most of whose rows were just admitted
      into a batch that is not full (an eighth of `chunk_steps`, at least 8):
      the rest of a burst joins at its end (module docstring).
    stop_capacity: states of the joined stop table (module docstring).
    dfa_capacity: states of the joined regex DFA, its 2 shared ones
      included.
    deliver: as the argument (settable before `start`).
    max_prompt_tokens: as the argument.
  """

  def __init__(self, model, *, path: str, max_batch: int, chunk_steps: int,
               max_queue: int, max_tokens_limit: int,
               max_prompt_tokens: int = 1024, strategy=None,
               deliver: Optional[Callable[
                   [List[Tuple["Completion", Update]]], None]] = None,
               compile_in_background: bool = False):
    if strategy is not None:  # Its weights on every replica, as generate's.
      model = network.replicated(model, strategy)
    self.model = model
    self.strategy = strategy
    self.generator = generator_lib.cached(model, path)
    # Under XLA, with `compile_in_background`: the graph path's programs,
    # which run a call until its shape's XLA program is compiled, and the
    # compiler of those (`compiling.py`).
    self._interim = self._compiler = None
    if (compile_in_background and self.generator.path == paths.XLA
        and strategy is None):
      self._interim = generator_lib.cached(model, paths.GRAPH)
      self._compiler = compiling.for_programs(self.generator.programs)
    self.max_batch = int(max_batch)
    self.chunk_steps = int(chunk_steps)
    self.max_queue = int(max_queue)
    self.max_tokens_limit = int(max_tokens_limit)
    self.max_prompt_tokens = int(max_prompt_tokens)
    self.stats = Stats()
    # A piece as long as a chunk: priming a piece costs about what the
    # chunk's decode steps cost, so a long prompt at most doubles one call.
    # At least 8 (XLA's narrowest prompt width; and a piece must be longer
    # than the character priming leaves unconsumed).
    self.prime_chars = max(self.chunk_steps, 8)
    self.burst_steps = min(self.chunk_steps, max(8, self.chunk_steps // 8))
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
        self.max_prompt_tokens + self.max_tokens_limit + self.chunk_steps, 16))
    self._waiting = collections.deque()
    self._active: List[Row] = []
    self._carry = None  # numpy Carry of `_active`'s rows, in order.
    self._condition = threading.Condition()
    self._admitting = True
    self._stopping = False
    self._stopped = False
    self._round_rows: List[Row] = []  # A round's rows, until handed out.
    self._thread = None
    # Per distinct stop list its automaton, per distinct pattern its state
    # count, per layout (the distinct settings of a chunk, in order) its
    # joined tables.
    self._stops_cache = _Lru(256)
    self._pattern_states = _Lru(256)
    self._joined = _Lru(64)
    self._template = self._zero_carry()
    # Alternatives per id the calls record (`pipeline.step_logprobs`).
    self._top = min(TOP_LOGPROBS, self.model.vocab_size)
    self._prompt_logprobs = generator_lib.prompt_logprobs_function(model)
    self.deliver = deliver or call_sinks
    # The round's updates, handed to `deliver` together (`_flush`): one
    # hand-off a chunk, not one a row.
    self._outbox: List[Tuple[Completion, Update]] = []

  # -- any thread ------------------------------------------------------------

  def check(self, completion: Completion) -> None:
    """Refuses a completion the engine cannot run (a defensive check: the
    server refuses such requests before, naming the field).

    Raises:
      ValueError: a prompt of no ids, of more than `max_prompt_tokens`,
        or of ids outside the vocabulary; `max_tokens` outside 1..
        `max_tokens_limit` (0 too where it wants the prompt's
        log-probabilities); `logprobs` over the model's alternatives.
    """
    for row in completion.rows:
      ids = row.prompt_ids
      if ids.ndim != 1 or not 1 <= len(ids) <= self.max_prompt_tokens:
        raise ValueError(
            f"prompt: {len(ids)} ids; this engine takes 1 to "
            f"{self.max_prompt_tokens}")
      if ids.min() < 0 or ids.max() >= self.model.vocab_size:
        raise ValueError(f"prompt: ids outside [0, {self.model.vocab_size})")
    # 0 only to score the prompt (OpenAI's echo with max_tokens 0).
    least = 0 if completion.prompt_logprobs else 1
    if not least <= completion.max_tokens <= self.max_tokens_limit:
      raise ValueError(f"max_tokens: {completion.max_tokens}; this engine "
                       f"takes {least} to {self.max_tokens_limit}")
    if (completion.logprobs or 0) > self._top:
      raise ValueError(f"logprobs: {completion.logprobs}; this model has "
                       f"{self._top} alternatives")

  def submit(self, completion: Completion) -> None:
    """Queues a completion's rows.

    Raises:
      ValueError: a completion `check` refuses (none of its rows queue).
      QueueFull: the waiting queue has no room for all its rows.
      ShuttingDown: `close` has begun.
    """
    self.check(completion)
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
    The programs it queued to compile and not yet begun are dropped.
    """
    with self._condition:
      self._admitting = False
      self._condition.notify()
    if self._compiler is not None:
      self._compiler.forget(self)
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
    over a long prompt's pieces, has the same shapes. The prompts'
    log-probabilities (`Completion.prompt_logprobs`) are a TF graph of any
    shape: traced once.

    With `compile_in_background` (under XLA), one call traces the graph
    path's program, and the XLA programs of the same shapes are queued on
    the compiling thread (`compiling.Compiler`), smallest batch first
    (shapes that calls ask for go ahead of them).
    """
    batches, widths = [1], [1]  # The graph path: one trace fits all.
    if self._bucketed:
      batches = sorted({request_lib.batch_bucket(n)
                        for n in range(1, self.max_batch + 1)})
      widths = sorted({self._prompt_width(1), self._prompt_width(
          min(self.prime_chars, self.max_prompt_tokens))})
    params = options_lib.DEFAULTS

    def dummy_call(batch, width, want_scores):
      """(rows, prepared) of a one-step call of these shapes."""
      dummy = Completion([np.zeros([width], np.int32)] * batch,
                         [params] * batch, seed=0, max_tokens=1,
                         shared=Shared(), want_scores=want_scores,
                         sink=lambda update: None)
      return dummy.rows, [self._prepare(row) for row in dummy.rows]

    shapes = [(batch, width) for batch in batches for width in widths]
    if self._compiler is None:
      for batch, width in shapes:
        for want_scores in (False, True):
          self._call(*dummy_call(batch, width, want_scores), carry=None,
                     steps=1)
      self._prompt_logprobs(np.zeros([1, 2], np.int32))
      return
    # XLA compiles one program for both (scores are a value, not a shape).
    queued = []  # (key, args) per shape, smallest batch first.
    for batch, width in shapes:
      args, _ = self._arguments(*dummy_call(batch, width, False), carry=None,
                                steps=1)
      queued.append((compiling.shape_key(args), args))
    # The graph path's one trace, before any compile takes a core.
    self._interim.call("serve_fn", *queued[0][1])
    self._prompt_logprobs(np.zeros([1, 2], np.int32))
    for key, args in queued:
      self._compiler.want(key, self.generator, args, owner=self)

  @property
  def compiling(self) -> int:
    """XLA programs still to compile (`compile_in_background`: calls of
    their shapes run on the graph path meanwhile); 0 otherwise."""
    return 0 if self._compiler is None else self._compiler.pending

  # -- the scheduler thread --------------------------------------------------

  def _run(self) -> None:
    """The scheduler: rounds until `close`. It never dies of a failure: one
    row's retires that row (`_fail`); anything else fails the round's rows
    and the next round starts afresh."""
    failed_rounds = 0
    while not self._stopped:
      try:
        self._round()
        failed_rounds = 0
      except Exception as e:  # pylint: disable=broad-except
        logging.exception("a scheduler round failed: %s", e)
        failed = list(dict.fromkeys(self._round_rows + self._active))
        failed_rounds += 1
        if not failed and failed_rounds > 1:
          # Failing again before any row ran: the first waiting row may be
          # the cause, and each round retires one at least.
          with self._condition:
            failed = [self._waiting.popleft()] if self._waiting else []
        for row in failed:
          self._send(row, _ended(row, "error",
                                 f"the scheduler failed: {_describe(e)}"))
        self._active, self._carry, self._round_rows = [], None, []
        self.stats.running = 0
        try:
          self._flush()
        except Exception:  # pylint: disable=broad-except
          logging.exception("dropping a failed round's updates")

  def _round(self) -> None:
    """Retires, admits, prepares, runs one call and hands out its output."""
    self._flush()  # The last round's updates (outside the lock).
    with self._condition:
      while (not self._stopping and not self._active
             and not self._live_waiting()):
        self._condition.wait()
      if self._stopping:
        for row in list(self._waiting) + self._active:
          self._send(row, _ended(row, "cancelled"))
        self._waiting.clear()
        self._active, self._carry = [], None
        self._flush()
        self._stopped = True
        return
      going_on = []
      for row in self._active:
        if row.completion.cancelled:
          self._send(row, _ended(row, "cancelled"))
        else:
          going_on.append(row)
      fresh_rows = self._admit(going_on)
    self._round_rows = going_on + fresh_rows
    self._flush()  # The rows cancelled or failed now, before the call.
    position = {row: i for i, row in enumerate(self._active)}
    started = time.monotonic()
    fresh_rows = self._with_prompt_scores(fresh_rows)
    # Each row's host work on its own: a row it fails for is retired, the
    # others go on.
    rows, prepared = [], []
    for row in going_on + fresh_rows:
      try:
        prepared.append(self._prepare(row))
        rows.append(row)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(row, "preparing its call", e)
    carried = [position[row] for row in rows if row in position]
    carry = None
    if carried:  # Carried rows come first, in `_active`'s order.
      carry = tf.nest.map_structure(lambda x: x[carried], self._carry)
    steps = self.chunk_steps
    decoding = [row for row, p in zip(rows, prepared) if not p.primes_only]
    if decoding:
      # No row needs more than its own ids: when they all end within the
      # chunk, the call stops there (a row's text depends on its own seed
      # and position only, so cutting the call changes none).
      steps = min(steps, max(row.completion.max_tokens - row.produced
                             for row in decoding))
    if (fresh_rows and len(rows) < self.max_batch
        and 2 * len(fresh_rows) > len(rows)):
      # Most of a batch that is not full has just arrived: more are likely
      # on their way (a burst, whose requests the HTTP side reads one after
      # another). A short call lets them join at its end rather than wait
      # a whole chunk beside a few rows, and the burst then runs, and ends,
      # in full chunks together (`burst_steps`).
      steps = min(steps, self.burst_steps)
    scored = [row for row in decoding if row.completion.want_scores]
    if scored:
      # A row's score counts only its own ids: such a chunk ends at the
      # first of their limits.
      steps = min([steps] + [row.completion.max_tokens - row.produced
                             for row in scored])
    ran, result, self._carry = (self._attempt(rows, prepared, carry, steps)
                                if rows else ([], None, None))
    primes_only = {row: p.primes_only for row, p in zip(rows, prepared)}
    for row in ran:
      if primes_only[row]:  # The piece's ids but the unconsumed ones.
        row.primed += self.prime_chars - self._unconsumed
      else:
        row.decoding = True
    self._active = self._hand_out(ran, result,
                                  [primes_only[row] for row in ran])
    self._round_rows = []
    self.stats.busy_seconds += time.monotonic() - started
    self.stats.chunks += bool(ran)
    self.stats.running = len(self._active)
    if not self._active:
      self._carry = None
    elif len(self._active) < len(ran):
      survivors = [i for i, row in enumerate(ran) if row in self._active]
      self._carry = tf.nest.map_structure(lambda x: x[survivors],
                                          self._carry)

  def _fail(self, row: Row, what: str, error: Exception) -> None:
    """Retires one row whose own work failed: its completion gets an
    "error" update saying what failed; the other rows carry on."""
    message = f"{what}: {_describe(error)}"
    logging.warning("row %d of a completion failed %s", row.index, message)
    self._send(row, _ended(row, "error", message))

  def _attempt(self, rows: List[Row], prepared: List["_Prepared"], carry,
               steps: int):
    """Runs `_call` over the rows; where it fails, over each half of them
    in turn, down to the row(s) it fails for, which are retired (`_fail`).

    The carry is on the host and a row's text depends only on its own
    seed, index and position, so a row's output is the same in any subset.

    Args:
      rows: the rows, carried ones first.
      prepared: their `_Prepared` host work.
      carry: the numpy `Carry` of the carried rows (None: none).
      steps: the steps to run.

    Returns:
      `(rows that ran, their result, their numpy Carry)` (`_call`'s, the
      rows in order), or `([], None, None)`.
    """
    try:
      result, new_carry = self._call(rows, prepared, carry=carry, steps=steps)
      return rows, result, new_carry
    except Exception as e:  # pylint: disable=broad-except
      if len(rows) == 1:
        logging.exception("a call of one row failed")
        self._fail(rows[0], "its device call", e)
        return [], None, None
      logging.warning("a call of %d rows failed (%s): running its halves",
                      len(rows), _describe(e))
    half, carried = len(rows) // 2, 0 if carry is None else len(
        carry.last_ids)
    parts = []
    for lo, hi in ((0, half), (half, len(rows))):
      part = None
      if min(hi, carried) > lo:
        part = tf.nest.map_structure(
            lambda x, lo=lo, hi=hi: x[lo:min(hi, carried)], carry)
      ran = self._attempt(rows[lo:hi], prepared[lo:hi], part, steps)
      if ran[0]:
        parts.append(ran)
    if len(parts) < 2:
      return parts[0] if parts else ([], None, None)
    (rows_a, result_a, carry_a), (rows_b, result_b, carry_b) = parts
    join = lambda a, b: np.concatenate([a, b])
    return (rows_a + rows_b, tf.nest.map_structure(join, result_a, result_b),
            tf.nest.map_structure(join, carry_a, carry_b))

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
      self._send(row, _ended(row, "cancelled"))
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
      first = self._waiting[0].completion
      shared = first.shared
      try:  # Its own tables (made once per distinct setting, and kept).
        self._stops(shared.stop, first.stop_automaton)
        if shared.regex is not None:
          self._pattern_size(shared.regex, first.pattern)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(self._waiting.popleft(), "making its tables", e)
        continue
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
    dfa_states = 2 + sum(self._pattern_size(pattern) for pattern in patterns)
    return (stop_states <= self.stop_capacity
            and dfa_states <= self.dfa_capacity)

  def _pattern_size(self, pattern: str,
                    compiled: Optional[constraints.Pattern] = None) -> int:
    """A pattern's own DFA states (its shared ones aside), counted once
    (`compiled`: the pattern compiled already, see `Completion`)."""
    return self._pattern_states.get_or_make(
        pattern, lambda: len((compiled or constraints.compile_pattern(
            self.model, pattern)).ends))

  def _hand_out(self, rows: List[Row], result,
                primes_only: Sequence[bool]) -> List[Row]:
    """Sends each row its new ids and characters; returns the rows still
    running. A row whose hand-out fails (its text's decoding) is retired.

    Args:
      rows: the call's rows.
      result: its `(ids, lengths, scores, done, logprobs)` (`_call`'s).
      primes_only: per row: it only primed (nothing to send yet).

    Returns:
      The rows that go on, in order.
    """
    running = []
    for r, row in enumerate(rows):
      if primes_only[r]:
        running.append(row)
        continue
      try:
        update = self._update(row, r, result)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(row, "handing out its output", e)
        continue
      self._send(row, update)
      if update.finish_reason is None:
        running.append(row)
    return running

  def _update(self, row: Row, r: int, result) -> Update:
    """Row `row` (the call's row `r`)'s update from the call's result."""
    ids, lengths, scores, done, logprobs = result
    completion = row.completion
    room = completion.max_tokens - row.produced
    new = ids[r, :min(int(lengths[r]), room)]
    if done[r] and int(lengths[r]) <= room:
      reason = "stop"
    elif row.produced + len(new) >= completion.max_tokens:
      reason = "length"
    else:
      reason = None
    if row.text is None:
      row.text = self.model.tokens.stream(completion.shared.stop)
    text = row.text.push(new) + (row.text.finish() if reason else "")
    extra = {}
    k = completion.logprobs
    if k is not None:  # Copies: the call's buffers are not held.
      extra.update(
          token_logprobs=logprobs.chosen[r, :len(new)].copy(),
          top_ids=logprobs.top_ids[r, :len(new), :k].copy(),
          top_logprobs=logprobs.top_logprobs[r, :len(new), :k].copy())
    if row.prompt_scores is not None:
      extra.update(zip(("prompt_logprobs", "prompt_top_ids",
                        "prompt_top_logprobs"), row.prompt_scores))
      row.prompt_scores = None
    row.produced += len(new)
    self.stats.characters += len(new)
    return Update(row.index, text, reason,
                  float(scores[r]) if completion.want_scores else 0.0,
                  len(new), new.copy(), **extra)

  # -- one device call -------------------------------------------------------

  def _prepare(self, row: Row) -> "_Prepared":
    """A row's host work for the next call (its own: a failure here is its
    own, `_round` retires it alone)."""
    completion = row.completion
    self._stops(completion.shared.stop, completion.stop_automaton)
    if completion.shared.regex is not None:
      self._pattern_size(completion.shared.regex, completion.pattern)
    if row.decoding:
      return _Prepared(None, None, False)
    primes_only = len(row.prompt_ids) - row.primed > self.prime_chars
    return _Prepared(self._piece(row), None if primes_only else
                     self._history(row), primes_only)

  def _with_prompt_scores(self, rows: List[Row]) -> List[Row]:
    """Gives the admitted rows that want them their prompts'
    log-probabilities (`Row.prompt_scores`), one call per distinct prompt
    not yet computed (its completion keeps them: a prompt's n choices
    share one); returns the rows whose prompt's call did not fail (the
    others are retired)."""
    kept = []
    for row in rows:
      completion = row.completion
      if not completion.prompt_logprobs:
        kept.append(row)
        continue
      key = row.prompt_ids.tobytes()
      try:
        values = completion.prompt_scores.get(key)
        if values is None:
          values = completion.prompt_scores[key] = self._prompt_scores(
              row.prompt_ids)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(row, "scoring its prompt", e)
        continue
      k = completion.logprobs or 0
      row.prompt_scores = (values[0], values[1][:, :k], values[2][:, :k])
      if completion.max_tokens == 0:  # Only the prompt scored: it ends here.
        self._send(row, _ended(row, "length")._replace(**dict(zip(
            ("prompt_logprobs", "prompt_top_ids", "prompt_top_logprobs"),
            row.prompt_scores))))
        continue
      kept.append(row)
    return kept

  def _prompt_scores(self, prompt: np.ndarray):
    """`(logprobs [L-1], top_ids [L-1, K], top_logprobs [L-1, K])` of a
    prompt of L ids (`generator.prompt_logprobs_function`: one call)."""
    if len(prompt) < 2:
      return (np.zeros([0], np.float32), np.zeros([0, self._top], np.int32),
              np.zeros([0, self._top], np.float32))
    return tuple(np.asarray(x)[0] for x in self._prompt_logprobs(
        np.asarray(prompt, np.int32)[None, :]))

  def _prompt_width(self, longest: int) -> int:
    """The prompt ids' width: under XLA one of two, so widths compile twice."""
    if not self._bucketed:
      return longest
    narrow = request_lib.MIN_WIDTH  # What `request.build` pads to anyway.
    return narrow if longest <= narrow else _power_of_two_at_least(
        min(self.prime_chars, self.max_prompt_tokens), narrow)

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

  def _stops(self, stop, built: Optional[stopping.Automaton] = None
             ) -> stopping.Automaton:
    """The stop automaton of a stop list, made once (its own states;
    `built`: made already, see `Completion`)."""
    return self._stops_cache.get_or_make(
        stop, lambda: built or host.stop_automaton(self.model, stop))

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

    built = {row.completion.shared.stop: row.completion.stop_automaton
             for row in rows}
    compiled = {row.completion.shared.regex: row.completion.pattern
                for row in rows if row.completion.pattern is not None}

    def make():
      automaton, offsets = stopping.join([self._stops(s, built[s])
                                          for s in stops])
      dfa = (constraints.combine(self.model, patterns, compiled)
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

  def _call(self, rows: List[Row], prepared: List["_Prepared"], *, carry,
            steps: int):
    """Runs `serve_fn` once over `rows`.

    The rows' own values (`Row.stop_offset`, `Row.dfa_offset`) change only
    once the call has returned: a failed call can be run again over a
    subset of its rows (`_attempt`).

    Args:
      rows: the rows, carried ones first.
      prepared: their `_Prepared` host work: a fresh row's prompt (or its
        prompt's next piece, `_piece`) starts here.
      carry: the numpy `Carry` of the carried rows (None: none).
      steps: steps to run (<= chunk_steps).

    Returns:
      `((ids, lengths, scores, done, logprobs) of the rows, their numpy
      Carry)`; `logprobs` the `pipeline.StepLogprobs`, rows first (written
      where a row is `Completion.scored`).
    """
    batch = len(rows)
    args, offsets = self._arguments(rows, prepared, carry=carry, steps=steps)
    called = time.monotonic()
    if self.strategy is None:
      result = self._program(args).call("serve_fn", *args)
    else:
      result = self._call_distributed(args)
    self.stats.device_seconds += time.monotonic() - called
    result = tf.nest.map_structure(lambda x: np.asarray(x)[:batch], result)
    # The call ran: each row's states now point into these tables.
    for row, (stop_offset, dfa_offset) in zip(rows, offsets):
      row.stop_offset, row.dfa_offset = stop_offset, dfa_offset
    return ((result.ids, result.lengths, result.scores, result.carry.done,
             result.logprobs), result.carry)

  def _program(self, args) -> generator_lib.Generator:
    """The generator whose `serve_fn` runs a call: `self.generator`, but
    with `compile_in_background` the graph path's while the XLA program
    of the call's shapes is not compiled (it is then queued first)."""
    if self._compiler is None:
      return self.generator
    key = compiling.shape_key(args)
    if self._compiler.ready(key):
      return self.generator
    if not self._compiler.failed(key):
      self._compiler.want(key, self.generator, args, first=True, owner=self)
    self.stats.interim_chunks += 1
    return self._interim

  def _arguments(self, rows: List[Row], prepared: List["_Prepared"], *,
                 carry, steps: int):
    """`serve_fn`'s arguments (but the weights) for a call over `rows`.

    Args: as `_call`'s.

    Returns:
      `((request, carry, fresh, primes_only), offsets)`: the arguments,
      padded to the call's batch (XLA's bucket), and per row its
      `(stop_offset, dfa_offset)` in the call's tables (`_place`).
    """
    batch = len(rows)
    fresh = np.array([p.piece is not None for p in prepared])
    primes_only = np.array([p.primes_only for p in prepared])
    tables = self._tables(rows)
    pieces = {r: p.piece for r, p in enumerate(prepared)
              if p.piece is not None}
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
        # Scores and per-id log-probabilities: one condition in the call.
        return_scores=any(row.completion.scored for row in rows))
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
    for r, p in enumerate(prepared):  # A row about to decode starts from
      if p.history is not None:       # its whole prompt's.
        for whole, one in zip(carry.history, p.history):
          whole[r] = one[0]
    offsets = self._place(rows, fresh, tables, carry)
    if len({row.completion.shared for row in rows}) > 1:
      self.stats.mixed_chunks += 1
    return (request, carry, fresh[index], primes_only[index]), offsets

  def _place(self, rows: List[Row], fresh: np.ndarray, tables: _Tables,
             carry) -> List[Tuple[int, int]]:
    """Points each row's stop and DFA states into this chunk's tables.

    A fresh row starts at its automaton's offset (its DFA's start is the
    request's `constraint.start`); a carried row's state moves by the
    difference between its offsets in the last chunk's tables and in
    these. The DFA's shared states (`FREE`, `DEAD`) stay where they are.
    Padding rows (XLA's batch bucket) copy row 0's. `carry` (numpy, the
    call's rows) is changed in place.

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
