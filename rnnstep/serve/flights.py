"""The rows priming prompts now in every lane of a server, so that a prefix
the lanes' requests share is primed once in the whole server, not once a
lane.

Each lane (`scheduler.Scheduler`) decides on its own thread where its
admitted rows start (`starts.RowStarts.start`): a row whose next piece
another row is priming now, on the same prefix, waits for that row to store
its state in the prefix cache the lanes share (`prefix_cache.py`). Within a
lane the rows priming now are the lane's own; across lanes they are what
each lane last published here (`Flights.publish`): the rows it primes in
its current call. A burst of requests with one system prompt then has one
row priming it, in one lane, while the other lanes' rows wait; the lanes
split the rows that follow evenly (`lanes.Lanes.submit` counts a lane's
waiting rows among its running ones), so each lane's call after the prefix
runs half the burst.

A lane whose rows all wait on another lane's row has no call to run: it
sleeps until another lane publishes (a piece stored, a row started or
retired, a failed round), never polling.
"""

import threading
from typing import (Callable, ContextManager, Dict, Hashable, List, Sequence,
                    Tuple)

from rnnstep.serve.completion import Row


class Flights:
  """What each lane sharing a prefix cache primes now, and their wake-ups."""

  def __init__(self):
    # Held by a lane while it decides where its rows start and publishes
    # its leaders (`deciding`), so that two lanes never both lead a prefix.
    self._lock = threading.RLock()
    # lane -> its rows priming now, each with the ids it had primed when
    # published: the prefix cache held its state there by then, while the
    # row's own `primed` moves on (on its lane's thread) before the state
    # after its next piece is stored.
    self._rows: Dict[Hashable, Tuple[Tuple[Row, int], ...]] = {}
    self._wakes: Dict[Hashable, Callable[[], None]] = {}

  def join(self, lane: Hashable, wake: Callable[[], None]) -> None:
    """Adds a lane: `wake` is called whenever another lane publishes, on
    that lane's thread, which may hold `deciding` (a wake must not wait for
    it: a scheduler takes its own condition only)."""
    with self._lock:
      self._rows[lane] = ()
      self._wakes[lane] = wake

  def deciding(self) -> ContextManager:
    """Held while a lane reads the others' rows (`others`), decides which of
    its rows lead and publishes them: the lanes decide one at a time."""
    return self._lock

  def publish(self, lane: Hashable, rows: Sequence[Row]) -> None:
    """Says which rows `lane` primes now (none: `()`) and wakes the other
    lanes' scheduler threads."""
    with self._lock:
      self._rows[lane] = tuple((row, row.primed) for row in rows)
      wakes = [wake for other, wake in self._wakes.items()
               if other is not lane]
    for wake in wakes:
      wake()

  def others(self, lane: Hashable) -> List[Tuple[Row, int]]:
    """The rows the other lanes prime now, as they last published them:
    `(row, the ids it had primed then)`."""
    with self._lock:
      return [row for other, rows in self._rows.items() if other is not lane
              for row in rows]
