"""Lanes: the server's slots split over several schedulers, one CPU core each.

On a GPU one scheduler keeps the device busy: a chunk's matmuls fill it. On a
CPU the compiled call of one scheduler runs its matmuls on TensorFlow's
intra-op threads, which hand work to each other at every op of every step,
so two schedulers that each run half the slots on one thread of their own
use both cores with no hand-off (measured: `docs/guide/serving.md`).

`Lanes` holds `n` `scheduler.Scheduler`s over the same model and programs
(the compiled functions are shared: a lane compiles nothing another has) and
looks like one scheduler to the server: a request goes whole to the lane
with the fewest rows running and waiting. Each row's text is its own seed's
and position's whatever lane runs it (README "Reproducibility"), so lanes
change no text. Lanes sharing a prefix cache share what they prime
(`flights.py`): a prefix the requests of several lanes start with is primed
by one row in the whole server, the others' rows waiting for its states.
"""

import dataclasses
import threading
from typing import List, Optional

from rnnstep.serve import completion as completion_lib
from rnnstep.serve import flights as flights_lib
from rnnstep.serve import scheduler as scheduler_lib


# The CPU kinds (`cpu.kind()`) on which a server runs one lane, on
# TensorFlow's own thread pools, unless told otherwise: there one call over
# every slot on every core served more at saturation than a lane a core.
# On a 2-vCPU Zen 3 (AVX2 only) one lane (XLA for 64 rows, the library's
# path) served more characters a second than two lanes on theirs (graph) in
# every run (benchmarks/results/serve-epyc-zen3-2026-12.md); on the Zen 4
# and Zen 5 measured two lanes were ahead (serve-epyc-zen4-2026-12.md). The
# kinds not measured keep a lane a core.
ONE_LANE_KINDS = frozenset({"avx2"})
# The cell kinds a CPU server runs in one lane on TensorFlow's pools, on the
# library's path, whatever the CPU: an RWKV-7 step reads every large matrix
# once for all its rows, so lanes read them once each, and XLA's calls of
# two lanes run one after the other. At the 0.1B shape with 16-bit weights
# on a 2-vCPU Intel Xeon with AMX, one lane under XLA on both cores decoded
# 482 tokens/s at 64 rows against two one-thread graph lanes' 270, and one
# request at 50 against 26 (benchmarks/results/serve-rwkv7-lanes-xeon-amx-2026-12.md).
ONE_LANE_CELL_KINDS = frozenset({"rwkv7"})


def runs_one_lane(kind: str, cell_kinds=()) -> bool:
  """Whether a CPU server runs one lane on TensorFlow's own pools by
  default: on a CPU kind of `ONE_LANE_KINDS`, or for a model with a layer
  of `ONE_LANE_CELL_KINDS` (`cell_kinds`: its layers' kinds)."""
  return kind in ONE_LANE_KINDS or bool(ONE_LANE_CELL_KINDS & set(cell_kinds))


def default_lanes(kind: str, usable_cores: int, max_batch: int,
                  cell_kinds=()) -> int:
  """The lanes a CPU server runs when not told: one where `runs_one_lane`,
  else a lane a usable core (at most one a slot)."""
  if runs_one_lane(kind, cell_kinds):
    return 1
  return max(1, min(usable_cores, max_batch))


def split_slots(max_batch: int, lanes: int) -> List[int]:
  """`max_batch` slots over `lanes` lanes, as evenly as they go (each >= 1).

  Raises:
    ValueError: fewer slots than lanes.
  """
  if lanes < 1 or max_batch < lanes:
    raise ValueError(f"{max_batch} slots cannot make {lanes} lanes")
  return [max_batch // lanes + (i < max_batch % lanes) for i in range(lanes)]


def lane_queue(max_queue: int, max_batch: int, lane_slots: int) -> int:
  """A lane's own `max_queue`: room for any request the whole server takes
  (`Lanes.submit` holds the server to `max_queue` across the lanes)."""
  return max_queue + max_batch - lane_slots


class Lanes:
  """Several schedulers behind `Scheduler`'s interface (module docstring).

  Args:
    schedulers: the lanes, each an unstarted `scheduler.Scheduler` of the
      same model and path; their `max_batch` add up to the server's slots,
      and each one's `max_queue` is `lane_queue`'s.
    max_queue: rows waiting at most beyond the free slots, over all lanes.

  Attributes:
    schedulers: the lanes.
    max_batch: the slots of every lane together (a request may ask for up
      to this many rows: a lane with fewer slots runs them as they free).
    max_tokens_limit, max_prompt_tokens: the lanes' (equal) limits.
    prefix_cache, states: the first lane's (`Scheduler`'s; the server gives
      every lane the same).
  """

  def __init__(self, schedulers: List[scheduler_lib.Scheduler], max_queue: int):
    if not schedulers:
      raise ValueError("Lanes needs at least one scheduler")
    self.schedulers = list(schedulers)
    self.max_queue = int(max_queue)
    self._submitting = threading.Lock()
    first = self.schedulers[0]
    self.max_batch = sum(e.max_batch for e in self.schedulers)
    self.max_tokens_limit = first.max_tokens_limit
    self.max_prompt_tokens = first.max_prompt_tokens
    self.generator = first.generator
    # The lanes share one prefix cache (`rnnstep-serve` makes one) and the
    # named states.
    self.prefix_cache = first.prefix_cache
    self.states = first.states
    if self.prefix_cache is not None and all(
        e.prefix_cache is self.prefix_cache for e in self.schedulers):
      flights = flights_lib.Flights()
      for scheduler in self.schedulers:
        scheduler.starts.share(flights)

  @property
  def deliver(self):
    return self.schedulers[0].deliver

  @deliver.setter
  def deliver(self, deliver) -> None:
    for scheduler in self.schedulers:
      scheduler.deliver = deliver

  @property
  def stats(self) -> scheduler_lib.Stats:
    """The lanes' counters, summed (read on any thread, as each lane's)."""
    return scheduler_lib.Stats(**{
        field.name: sum(getattr(e.stats, field.name) for e in self.schedulers)
        for field in dataclasses.fields(scheduler_lib.Stats)})

  def check(self, completion: completion_lib.Completion) -> None:
    """`Scheduler.check` (the lanes' limits are equal)."""
    self.schedulers[0].check(completion)

  def submit(self, completion: completion_lib.Completion) -> None:
    """Queues the completion on the lane with the fewest rows.

    Raises:
      ValueError: a completion `Scheduler.check` refuses.
      completion.QueueFull: the lanes' waiting rows would exceed `max_queue`
        beyond their free slots.
      completion.ShuttingDown: `close` has begun.
    """
    self.check(completion)  # Before the queue's count.
    with self._submitting:
      running = [e.stats.running for e in self.schedulers]
      waiting = [e.stats.waiting for e in self.schedulers]
      free = sum(max(e.max_batch - r, 0)
                 for e, r in zip(self.schedulers, running))
      if sum(waiting) + len(completion.rows) > self.max_queue + free:
        raise completion_lib.QueueFull()
      load = [r + w for r, w in zip(running, waiting)]
      # A lane's own check (`lane_queue`) leaves it room for this request.
      self.schedulers[load.index(min(load))].submit(completion)

  def warm_up(self) -> None:
    """Compiles every program a lane can need, once: the lanes share the
    programs, and the first lane has the most slots (`split_slots`), so its
    warm-up covers every batch bucket of the others."""
    max(self.schedulers, key=lambda e: e.max_batch).warm_up()

  @property
  def compiling(self) -> int:
    """`Scheduler.compiling` (the lanes share their programs, and so what is
    left to compile)."""
    return self.schedulers[0].compiling

  def start(self) -> None:
    for scheduler in self.schedulers:
      scheduler.start()

  def close(self, timeout: Optional[float] = None) -> bool:
    """Closes every lane at once (each `Scheduler.close(timeout)`); whether all
    drained."""
    drained = [True] * len(self.schedulers)

    def close(i):
      drained[i] = self.schedulers[i].close(timeout)

    threads = [threading.Thread(target=close, args=(i,))
               for i in range(len(self.schedulers))]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    return all(drained)
