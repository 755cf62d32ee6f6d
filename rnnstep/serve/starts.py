"""Where the scheduler's admitted rows start: a named initial state, or the
prefix cache's state after the longest cached prefix of the prompt
(`prefix_cache.py`), and which rows wait for another row priming the same
prefix, in their lane or another (`flights.py`). `RowStarts` is the
scheduler's (`scheduler.py`) use of the cache, on its thread.
"""

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from rnnstep.model import network
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import flights as flights_lib
from rnnstep.serve.completion import Row


class RowStarts:
  """Starts rows from named states and the prefix cache, and stores the
  states the calls leave at the ends of priming pieces.

  Args:
    calls: the scheduler's `calls.ChunkCalls` (its pieces' ends).
    model: the (replicated) model.
    prefix_cache: None, or the `prefix_cache.PrefixCache` (its namespaces
      of this model are declared here).
    states: named initial states, each one row's arrays per layer.
    default_state: the name of the state a completion naming none starts
      from; None: zeros.
    model_key: the model's part of the cache's namespaces.
    condition: the scheduler's condition, which its thread waits on: another
      lane's publication (`share`) notifies it.

  Attributes:
    splits_exact: priming a prompt in pieces split anywhere gives its state
      bit for bit (`start`).
    flights: None, or the `flights.Flights` of the lanes sharing the prefix
      cache (`share`).

  Raises:
    ValueError: a `default_state` not in `states`; a state not of the
      model's shapes.
  """

  def __init__(self, calls, model, prefix_cache, states: Dict[str, tuple],
               default_state: Optional[str], *, model_key,
               condition: Optional[threading.Condition] = None):
    self.calls = calls
    self.flights = None
    self._condition = condition or threading.Condition()
    # Another lane published since `start` last looked (`share`).
    self._woken = False
    self.prefix_cache = prefix_cache
    self.states = states
    if default_state is not None and default_state not in states:
      raise ValueError(f"default_state: no state named {default_state!r}")
    self.default_state = default_state
    self._model_key = model_key
    shapes = [[(units,) for units in sizes]
              for sizes in calls.generator.state_sizes()]
    for name, state in states.items():
      got = [[np.shape(x) for x in layer] for layer in state]
      if got != shapes:
        raise ValueError(f"states: {name!r} has shapes {got}; this model's "
                         f"state has {shapes}")
    # Whether a prompt primed in pieces split anywhere leaves its state bit
    # for bit (`start`): one stepped layer, whose inputs are rows of a
    # table and whose only product is a step's `h @ R`. A stack's upper
    # layers multiply all of a piece's columns at once, and a matmul rounds
    # a row by the rows beside it on some CPUs (oneDNN's AVX2 sgemm, under
    # TensorFlow's matmuls too; XLA's dots on every CPU).
    self.splits_exact = (len(model.config.layers) == 1
                         and not network.unrolls_blockwise(model.config))
    if prefix_cache is not None:
      for name in [None] + list(states):
        prefix_cache.register(self.namespace(name), shapes)

  def share(self, flights: flights_lib.Flights) -> None:
    """Joins the lanes of `flights`: rows wait for a row priming their
    prefix in any of them, and this lane publishes the rows it primes."""
    self.flights = flights
    flights.join(self, self._wake)

  def _wake(self) -> None:
    with self._condition:
      self._woken = True
      self._condition.notify()

  def ready(self, parked: List[Row]) -> bool:
    """Whether the parked rows are worth another look now: after this
    lane's call, where one waits for a row of that call; else once another
    lane has published since `start` (until then the scheduler's thread
    sleeps, rather than poll)."""
    return bool(parked) and (self.flights is None or self._woken)

  def forget(self) -> None:
    """Publishes that this lane primes nothing now (its round failed)."""
    if self.flights is not None:
      self.flights.publish(self, ())

  def namespace(self, state_name: Optional[str]):
    """The prefix cache's namespace of rows starting from `state_name`'s
    state (None: zeros): this model's, that state's."""
    return (self._model_key, state_name)

  def state_name(self, row: Row) -> Optional[str]:
    """The name of the initial state a row starts from (None: zeros)."""
    name = row.completion.state
    return self.default_state if name is None else name

  def start(self, rows: List[Row], going_on: List[Row], parked: List[Row]
            ) -> Tuple[List[Row], List[Row], List[Row]]:
    """Where each just admitted row's priming starts: its named state, or
    the prefix cache's state after the longest cached prefix of its prompt
    (all but its last id at most: an id must be left to feed the first
    step), the rest to prime.

    Where priming a prompt in pieces split anywhere gives the state bit for
    bit (`splits_exact`), any cached prefix serves, and a piece also ends
    where the prompt parts from a recent one (`Row.cache_points`), so that
    the prompts to come that share it find its state. Elsewhere (RWKV-7,
    whose unroll multiplies all of a piece's columns at once, so that a
    column rounds by its place in the piece: on the graph path, pieces
    split at multiples of 16 columns gave the whole prompt's state bit for
    bit, other splits states 3e-5 apart at the 0.1B shape; a stack, whose
    upper layers' products may round by their row count) a row resumes
    only at the end of one of its own pieces (`ChunkCalls.boundaries`), so
    that it primes the very pieces it primes without the cache.

    A row whose next piece another row is priming now, on the same prefix
    (requests that arrive together with one system prompt), in this lane's
    call or another lane's (`flights`), waits for that row to store its
    state (parked, holding its slot) rather than prime it too; the rows
    parked before are looked at again first. The rows this lane primes in
    this round's call are then published to the other lanes.

    Args:
      rows: the rows admitted this round.
      going_on: the carried rows of this round.
      parked: the rows parked before.

    Returns:
      `(the rows that start this round (parked ones that go on, then `rows`
      but those now parked), the rows parked now, the parked rows whose
      completion was cancelled)`.
    """
    if self.flights is None:
      return self._start(rows, going_on, parked)
    with self.flights.deciding():  # No other lane leads what this one does.
      return self._start(rows, going_on, parked)

  def _start(self, rows: List[Row], going_on: List[Row], parked: List[Row]
             ) -> Tuple[List[Row], List[Row], List[Row]]:
    waiting, cancelled = [], []
    # Rows priming in this round's call: their piece ends will be stored.
    leaders = [row for row in going_on if not row.decoding]
    self._woken = False  # Before reading the others': none is missed.
    # The other lanes' priming rows, as they published them.
    elsewhere = [] if self.flights is None else self.flights.others(self)
    starting, mine = [], False  # mine: a row waits for one of this lane's.
    for row in parked + rows:
      if row.completion.cancelled:
        cancelled.append(row)
        continue
      if row.primed or row.decoding:
        starting.append(row)
        continue
      name = self.state_name(row)
      row.start_state = self.states.get(name) if name is not None else None
      if self.prefix_cache is None:
        starting.append(row)
        continue
      namespace = self.namespace(name)
      try:
        ends = self.calls.boundaries(row)
        hit = self.prefix_cache.lookup(
            namespace, row.prompt_ids, len(row.prompt_ids) - 1,
            lengths=None if self.splits_exact else ends, count=False)
        if self.splits_exact and hit.diverges > hit.length:
          row.cache_points = tuple(sorted(set(row.cache_points)
                                          | {hit.diverges}))
          ends = self.calls.boundaries(row)
        leader = self.follows(row, hit.length, ends, namespace, [
            (leader, leader.primed) for leader in leaders] + elsewhere)
        if leader is not None:
          waiting.append(row)
          mine = mine or any(leader is own for own in leaders)
          continue
        self.prefix_cache.count(hit)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("prefix cache lookup failed: %s",
                        completion_lib.describe(e))
        starting.append(row)
        continue
      if hit.length:
        row.primed, row.start_state = hit.length, hit.state
      starting.append(row)
      leaders.append(row)
    if self.flights is not None:
      if mine:  # Its call stores the state: look again after it.
        self._wake()
      self.flights.publish(self, leaders)
    return starting, waiting, cancelled

  def follows(self, row: Row, start: int, ends: List[int], namespace,
              leaders: List[Tuple[Row, int]]) -> Optional[Row]:
    """The row of `leaders` (rows priming now, of any namespace, each with
    the ids it has primed) that a row starting at `start` waits for: the
    first that will store the state at the row's next piece end, the same
    prefix in the same namespace; None: it waits for none."""
    following = [end for end in ends if end > start]
    if not following:
      return None
    end = following[0]
    prefix = row.prompt_ids[:end]
    for leader, primed in leaders:
      if (primed < end and len(leader.prompt_ids) > end
          and self.namespace(self.state_name(leader)) == namespace
          and np.array_equal(leader.prompt_ids[:end], prefix)
          and end in self.calls.boundaries(leader)):
        return leader
    return None

  def store(self, rows: List[Row], primes_only: Sequence[bool], carry
            ) -> None:
    """Stores in the prefix cache the state each row that only primed has
    after its first `primed` ids (`carry`: the call's numpy `Carry`, the
    rows in order), then publishes the rows that prime on (`flights`): the
    rows of other lanes waiting for these states find them."""
    for r, row in enumerate(rows):
      if self.prefix_cache is None or carry is None:
        break
      if not primes_only[r]:
        continue
      namespace = self.namespace(self.state_name(row))
      prefix = row.prompt_ids[:row.primed]
      try:
        if not self.prefix_cache.holds(namespace, prefix):
          self.prefix_cache.insert(namespace, prefix, tf.nest.map_structure(
              lambda x, r=r: x[r], carry.state))
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("prefix cache insert failed: %s",
                        completion_lib.describe(e))
    if self.flights is not None:
      self.flights.publish(self, [row for row, primes in zip(rows, primes_only)
                                  if primes])
