"""Where the scheduler's admitted rows start: a named initial state, or the
prefix cache's state after the longest cached prefix of the prompt
(`prefix_cache.py`), and which rows wait for another row priming the same
prefix. `RowStarts` is the scheduler's (`scheduler.py`) use of the cache,
on its thread.
"""

from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from rnnstep.engine import paths
from rnnstep.model import network
from rnnstep.serve import completion as completion_lib
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

  Attributes:
    splits_exact: priming a prompt in pieces split anywhere gives its state
      bit for bit (`start`).

  Raises:
    ValueError: a `default_state` not in `states`; a state not of the
      model's shapes.
  """

  def __init__(self, calls, model, prefix_cache, states: Dict[str, tuple],
               default_state: Optional[str], *, model_key):
    self.calls = calls
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
    # for bit (`start`): a cell stepped token by token, whose only products
    # over all of a piece's columns are the layers above the first's
    # inputs, which TensorFlow's matmuls round the same whatever their rows
    # and XLA's do not.
    self.splits_exact = not network.unrolls_blockwise(model.config) and (
        calls.generator.path != paths.XLA or len(model.config.layers) == 1)
    if prefix_cache is not None:
      for name in [None] + list(states):
        prefix_cache.register(self.namespace(name), shapes)

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
    bit, other splits states 3e-5 apart at the 0.1B shape; a stack under
    XLA, whose dots round by their row count) a row resumes only at the
    end of one of its own pieces
    (`ChunkCalls.boundaries`), so that it primes the very pieces it primes
    without the cache.

    A row whose next piece another row is priming now, on the same prefix
    (requests that arrive together with one system prompt), waits for that
    row to store its state (parked, holding its slot) rather than prime it
    too; the rows parked before are looked at again first.

    Args:
      rows: the rows admitted this round.
      going_on: the carried rows of this round.
      parked: the rows parked before.

    Returns:
      `(the rows that start this round (parked ones that go on, then `rows`
      but those now parked), the rows parked now, the parked rows whose
      completion was cancelled)`.
    """
    waiting, cancelled = [], []
    # Rows priming in this round's call: their piece ends will be stored.
    leaders = [row for row in going_on if not row.decoding]
    starting = []
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
        if self.follows(row, hit.length, ends, namespace, leaders):
          waiting.append(row)
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
    return starting, waiting, cancelled

  def follows(self, row: Row, start: int, ends: List[int], namespace,
               leaders: List[Row]) -> bool:
    """Whether a row starting at `start` waits: one of `leaders` (rows
    priming now, of the same namespace) will store the state at the row's
    next piece end, the same prefix."""
    following = [end for end in ends if end > start]
    if not following:
      return False
    end = following[0]
    prefix = row.prompt_ids[:end]
    for leader in leaders:
      if (leader.primed < end and len(leader.prompt_ids) > end
          and self.namespace(self.state_name(leader)) == namespace
          and np.array_equal(leader.prompt_ids[:end], prefix)
          and end in self.calls.boundaries(leader)):
        return True
    return False

  def store(self, rows: List[Row], primes_only: Sequence[bool], carry
            ) -> None:
    """Stores in the prefix cache the state each row that only primed has
    after its first `primed` ids (`carry`: the call's numpy `Carry`, the
    rows in order)."""
    if self.prefix_cache is None or carry is None:
      return
    for r, row in enumerate(rows):
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
