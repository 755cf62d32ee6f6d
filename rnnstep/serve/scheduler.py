"""Continuous batching: fixed slots, one scheduler thread, one call a chunk.

The scheduler keeps up to `max_batch` rows ("slots") on the device and runs
one device call (`calls.ChunkCalls`) of `chunk_steps` steps at a time over the
rows that are active. Between chunks, on its own thread (the only one that
touches the device), it

  - retires rows that finished (a stop string, a regex end, `max_tokens`) or
    whose client went away (`Completion.cancel`);
  - admits waiting rows into the free slots, first come, first served
    (a row whose settings would take the joined tables over their capacity
    waits, and nothing overtakes it: `tables.py`); their prompts are primed
    inside the same call that decodes the other rows, a piece
    (`prime_chars`) a call, so that a long prompt holds the other rows up
    by no more than one chunk's worth;
  - shortens the call (`burst_steps`) when the rows just admitted are most
    of a batch that is not full, so that the rest of a burst of arrivals
    joins at its end and the burst runs in full batches, and to one step
    when rows start decoding after a long wait for their prompts and none
    decodes beside them (`steps.py`);
  - hands each row's new ids and characters to its `Completion`'s sink
    (`completion.py`), with their log-probabilities where it asks.

Limits are in the model's ids: `max_prompt_tokens` and `max_tokens_limit`
size every buffer, and `submit` refuses a prompt of more ids (the server
refuses it first).

One row's failure retires that row only (its `Update` says "error", with a
`message`); a failed call is run again over each half of its rows
(`_attempt`), down to the row it fails for, since a row's text depends on
its own seed, index and position only. The scheduler thread never dies: an
unexpected failure of a round fails that round's rows, and the next round
starts afresh. A row's text equals `rnnstep.generate`'s for its prompt, seed
and options (README "Reproducibility"), whatever its slot or batch.
Nothing runs while no row is active: the thread waits on a condition.
"""

import collections
import dataclasses
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from rnnstep.model import network
from rnnstep.serve import calls as calls_lib
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import starts as starts_lib
from rnnstep.serve import steps as steps_lib
from rnnstep.serve.completion import Completion
from rnnstep.serve.completion import Row
from rnnstep.serve.completion import Update


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
  # (`Scheduler`'s `compile_in_background`)
  interim_chunks: int = 0


class Scheduler:
  """The slots, the waiting queue and the scheduler thread.

  Args:
    model: the `rnnstep.Model`.
    path: the concrete execution path ("xla", "graph", "elementwise").
    max_batch: slots (rows decoded together at most).
    chunk_steps: steps per device call.
    max_queue: rows waiting at most beyond the free slots (more: QueueFull).
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
    prefix_cache, states, default_state: where rows start (`starts.RowStarts`:
      the prefix cache, lanes may share one; named initial states a
      completion picks, `Completion.state`; the default's name).

  Attributes:
    calls: its `calls.ChunkCalls` (the device calls; their `tables`).
    generator: the path's `Generator`.
    prime_chars: the longest prompt piece one call primes; a longer prompt
      is primed across calls.
    burst_steps: the steps of a call most of whose rows were just admitted
      into a batch that is not full (an eighth of `chunk_steps`, at least 8):
      the rest of a burst joins at its end (module docstring).
    deliver: as the argument (settable before `start`).
    max_prompt_tokens, prefix_cache, states, default_state: as the arguments.
    starts: the `starts.RowStarts` that says where admitted rows start.
  """

  def __init__(self, model, *, path: str, max_batch: int, chunk_steps: int,
               max_queue: int, max_tokens_limit: int,
               max_prompt_tokens: int = 1024, strategy=None,
               deliver: Optional[Callable[
                   [List[Tuple[Completion, Update]]], None]] = None,
               compile_in_background: bool = False, prefix_cache=None,
               states: Optional[Dict[str, tuple]] = None,
               default_state: Optional[str] = None):
    model_key = id(model)  # Lanes of one model share cached states.
    if strategy is not None:  # Its weights on every replica, as generate's.
      model = network.replicated(model, strategy)
    self.model = model
    self.max_batch = int(max_batch)
    self.chunk_steps = int(chunk_steps)
    self.max_queue = int(max_queue)
    self.max_tokens_limit = int(max_tokens_limit)
    self.max_prompt_tokens = int(max_prompt_tokens)
    self.stats = Stats()
    self.calls = calls_lib.ChunkCalls(
        model, path=path, max_batch=self.max_batch,
        chunk_steps=self.chunk_steps, max_tokens_limit=self.max_tokens_limit,
        max_prompt_tokens=self.max_prompt_tokens, stats=self.stats,
        strategy=strategy, compile_in_background=compile_in_background)
    self.generator = self.calls.generator
    self.prime_chars = self.calls.prime_chars
    self._condition = threading.Condition()
    self.starts = starts_lib.RowStarts(
        self.calls, model, prefix_cache, dict(states or {}), default_state,
        model_key=model_key, condition=self._condition)
    self.states, self.default_state = self.starts.states, default_state
    self.prefix_cache = prefix_cache
    self.burst_steps = min(self.chunk_steps, max(8, self.chunk_steps // 8))
    self._waiting = collections.deque()
    self._active: List[Row] = []
    self._carry = None  # numpy Carry of `_active`'s rows, in order.
    # Admitted rows waiting for a row priming their prefix, in any lane, to
    # store its states (`RowStarts.start`): slots held, out of the calls.
    self._parked: List[Row] = []
    self._admitting = True
    self._stopping = False
    self._stopped = False
    self._round_rows: List[Row] = []  # A round's rows, until handed out.
    self._thread = None
    self.deliver = deliver or completion_lib.call_sinks
    # The round's updates, handed to `deliver` together (`_flush`): one
    # hand-off a chunk, not one a row.
    self._outbox: List[Tuple[Completion, Update]] = []

  # -- any thread ------------------------------------------------------------

  def check(self, completion: Completion) -> None:
    """Refuses a completion the scheduler cannot run (a defensive check: the
    server refuses such requests before, naming the field).

    Raises:
      ValueError: a prompt of no ids, of more than `max_prompt_tokens` or
        of ids outside the vocabulary; a `state` not in `states`;
        `max_tokens` outside 1..`max_tokens_limit` (0 too where it wants the
        prompt's log-probabilities); `logprobs` over the model's
        alternatives.
    """
    if completion.state is not None and completion.state not in self.states:
      raise ValueError(f"state: no state named {completion.state!r}")
    for row in completion.rows:
      ids = row.prompt_ids
      if ids.ndim != 1 or not 1 <= len(ids) <= self.max_prompt_tokens:
        raise ValueError(
            f"prompt: {len(ids)} ids; this scheduler takes 1 to "
            f"{self.max_prompt_tokens}")
      if ids.min() < 0 or ids.max() >= self.model.vocab_size:
        raise ValueError(f"prompt: ids outside [0, {self.model.vocab_size})")
    # 0 only to score the prompt (OpenAI's echo with max_tokens 0).
    least = 0 if completion.prompt_logprobs else 1
    if not least <= completion.max_tokens <= self.max_tokens_limit:
      raise ValueError(f"max_tokens: {completion.max_tokens}; this scheduler "
                       f"takes {least} to {self.max_tokens_limit}")
    if (completion.logprobs or 0) > self.calls.top:
      raise ValueError(f"logprobs: {completion.logprobs}; this model has "
                       f"{self.calls.top} alternatives")

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
        raise completion_lib.ShuttingDown()
      # Free slots take rows at the next chunk boundary: they count as room.
      free = max(self.max_batch - len(self._active) - len(self._parked), 0)
      if len(self._waiting) + len(completion.rows) > self.max_queue + free:
        raise completion_lib.QueueFull()
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
    self.calls.forget_compiles()
    deadline = None if timeout is None else time.monotonic() + timeout
    drained = True
    while self._thread is not None and self._thread.is_alive():
      with self._condition:
        if not self._waiting and not self._active and not self._parked:
          break
      if deadline is not None and time.monotonic() > deadline:
        drained = False
        with self._condition:
          for row in (list(self._waiting) + list(self._active)
                      + list(self._parked)):
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
    """Traces (and compiles) what requests need (`ChunkCalls.warm_up`)."""
    self.calls.warm_up()

  @property
  def compiling(self) -> int:
    """XLA programs still to compile (`compile_in_background`: calls of
    their shapes run on the graph path meanwhile); 0 otherwise."""
    return self.calls.compiling

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
        failed = list(dict.fromkeys(self._round_rows + self._active
                                    + self._parked))
        failed_rounds += 1
        if not failed and failed_rounds > 1:
          # Failing again before any row ran: the first waiting row may be
          # the cause, and each round retires one at least.
          with self._condition:
            failed = [self._waiting.popleft()] if self._waiting else []
        for row in failed:
          self._send(row, completion_lib.ended(
              row, "error",
              f"the scheduler failed: {completion_lib.describe(e)}"))
        self._active, self._carry, self._round_rows, self._parked = (
            [], None, [], [])
        self.stats.running = 0
        self.starts.forget()
        try:
          self._flush()
        except Exception:  # pylint: disable=broad-except
          logging.exception("dropping a failed round's updates")

  def _round(self) -> None:
    """Retires, admits, prepares, runs one call and hands out its output."""
    self._flush()  # The last round's updates (outside the lock).
    with self._condition:
      while (not self._stopping and not self._active
             and not self.starts.ready(self._parked)
             and not self._live_waiting()):
        self._condition.wait()
      if self._stopping:
        for row in list(self._waiting) + self._active + self._parked:
          self._send(row, completion_lib.ended(row, "cancelled"))
        self._waiting.clear()
        self._active, self._carry, self._parked = [], None, []
        self._flush()
        self._stopped = True
        return
      going_on = []
      for row in self._active:
        if row.completion.cancelled:
          self._send(row, completion_lib.ended(row, "cancelled"))
        else:
          going_on.append(row)
      fresh_rows = self._admit(going_on)
      # Running from their admission, not the call's end (seconds later):
      # `lanes.Lanes.submit` sends a request to the lane of fewest rows.
      self.stats.running = (len(going_on) + len(fresh_rows)
                            + len(self._parked))
    self._round_rows = going_on + fresh_rows
    self._flush()  # The rows cancelled or failed now, before the call.
    position = {row: i for i, row in enumerate(self._active)}
    started = time.monotonic()
    fresh_rows, self._parked, cancelled = self.starts.start(
        self._with_prompt_scores(fresh_rows), going_on, self._parked)
    for row in cancelled:
      self._send(row, completion_lib.ended(row, "cancelled"))
    # Each row's host work on its own: a row it fails for is retired, the
    # others go on.
    rows, prepared = [], []
    for row in going_on + fresh_rows:
      try:
        prepared.append(self.calls.prepare(row))
        rows.append(row)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(row, "preparing its call", e)
    carried = [position[row] for row in rows if row in position]
    carry = None
    if carried:  # Carried rows come first, in `_active`'s order.
      carry = tf.nest.map_structure(lambda x: x[carried], self._carry)
    steps = steps_lib.call_steps(
        rows, prepared, len(fresh_rows), chunk_steps=self.chunk_steps,
        burst_steps=self.burst_steps, max_batch=self.max_batch)
    ran, result, self._carry = (self._attempt(rows, prepared, carry, steps)
                                if rows else ([], None, None))
    primes_only = {row: p.primes_only for row, p in zip(rows, prepared)}
    pieces = {row: p.piece for row, p in zip(rows, prepared)}
    for row in ran:
      row.start_state = None  # Carried from here on.
      if primes_only[row]:  # The piece's ids but the unconsumed ones.
        row.primed += len(pieces[row]) - self.calls.unconsumed
      else:
        row.decoding = True
    self.starts.store(ran, [primes_only[row] for row in ran], self._carry)
    self._active = self._hand_out(ran, result,
                                  [primes_only[row] for row in ran])
    self._round_rows = []
    self.stats.busy_seconds += time.monotonic() - started
    self.stats.chunks += bool(ran)
    self.stats.running = len(self._active) + len(self._parked)
    if not self._active:
      self._carry = None
    elif len(self._active) < len(ran):
      survivors = [i for i, row in enumerate(ran) if row in self._active]
      self._carry = tf.nest.map_structure(lambda x: x[survivors],
                                          self._carry)

  def _fail(self, row: Row, what: str, error: Exception) -> None:
    """Retires one row whose own work failed: its completion gets an
    "error" update saying what failed; the other rows carry on."""
    message = f"{what}: {completion_lib.describe(error)}"
    logging.warning("row %d of a completion failed %s", row.index, message)
    self._send(row, completion_lib.ended(row, "error", message))

  def _attempt(self, rows: List[Row], prepared: List[calls_lib.Prepared],
               carry, steps: int):
    """Runs the call (`ChunkCalls.run`) over the rows; where it fails, over
    each half of them in turn, down to the row(s) it fails for, which are
    retired (`_fail`).

    The carry is on the host and a row's text depends only on its own
    seed, index and position, so a row's output is the same in any subset.

    Args:
      rows: the rows, carried ones first.
      prepared: their `calls.Prepared` host work.
      carry: the numpy `Carry` of the carried rows (None: none).
      steps: the steps to run.

    Returns:
      `(rows that ran, their result, their numpy Carry)` (`ChunkCalls.run`'s,
      the rows in order), or `([], None, None)`.
    """
    try:
      result, new_carry = self.calls.run(rows, prepared, carry=carry,
                                         steps=steps)
      return rows, result, new_carry
    except Exception as e:  # pylint: disable=broad-except
      if len(rows) == 1:
        logging.exception("a call of one row failed")
        self._fail(rows[0], "its device call", e)
        return [], None, None
      logging.warning("a call of %d rows failed (%s): running its halves",
                      len(rows), completion_lib.describe(e))
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
    """Hands the round's updates to `deliver`; a failing hand-off (a closed
    event loop) cancels their completions, not the scheduler."""
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
      self._send(row, completion_lib.ended(row, "cancelled"))
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
    running = len(going_on) + len(self._parked)
    if not self._admitting and not running and not self._waiting:
      return []
    stops = {row.completion.shared.stop for row in going_on}
    patterns = {row.completion.shared.regex for row in going_on} - {None}
    admitted = []
    while self._live_waiting() and running + len(admitted) < self.max_batch:
      first = self._waiting[0].completion
      shared = first.shared
      try:  # Its own tables (made once per distinct setting, and kept).
        self.calls.tables.make_own(first)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(self._waiting.popleft(), "making its tables", e)
        continue
      more_stops, more_patterns = stops | {shared.stop}, patterns | (
          {shared.regex} - {None})
      if (stops or patterns) and (more_stops != stops
                                  or more_patterns != patterns):
        if not self.calls.tables.fits(more_stops, more_patterns):
          break  # It waits for rows to drain; nothing overtakes it.
      stops, patterns = more_stops, more_patterns
      admitted.append(self._waiting.popleft())
    self.stats.waiting = len(self._waiting)
    return admitted

  def _hand_out(self, rows: List[Row], result,
                primes_only: Sequence[bool]) -> List[Row]:
    """Sends each row its new ids and characters; returns the rows still
    running. A row whose hand-out fails (its text's decoding) is retired.

    Args:
      rows: the call's rows.
      result: its `(ids, lengths, scores, done, logprobs)`
        (`ChunkCalls.run`'s).
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
        update = row.take_output(r, result, self.model.tokens)
        self.stats.characters += update.tokens
      except Exception as e:  # pylint: disable=broad-except
        self._fail(row, "handing out its output", e)
        continue
      self._send(row, update)
      if update.finish_reason is None:
        running.append(row)
    return running

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
          values = completion.prompt_scores[key] = self.calls.prompt_scores(
              row.prompt_ids)
      except Exception as e:  # pylint: disable=broad-except
        self._fail(row, "scoring its prompt", e)
        continue
      k = completion.logprobs or 0
      row.prompt_scores = (values[0], values[1][:, :k], values[2][:, :k])
      if completion.max_tokens == 0:  # Only the prompt scored: it ends here.
        self._send(row, completion_lib.ended(row, "length")._replace(
            **dict(zip(("prompt_logprobs", "prompt_top_ids",
                        "prompt_top_logprobs"), row.prompt_scores))))
        continue
      kept.append(row)
    return kept

