"""The server's caches of stop tables: made once, bounded in bytes.

A client may send any number of distinct stop lists, each up to the
library's table limit; the caches of a checking pool and of a scheduler's
chunks hold a bounded number of bytes whatever they send, and a stop list
the server has seen is not made again (a token model's automaton is a pass
over the whole vocabulary, once per distinct list, not per request).
"""

import numpy as np

from rnnstep.decoding import options as options_lib
from rnnstep.engine import host
from rnnstep.serve import checks as checks_lib
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import protocol
from rnnstep.serve import scheduler as scheduler_lib
from rnnstep.serve import tables as tables_lib
# A byte model: a stop string's table is a pass over its 256 tokens.
from tests.test_serve_scheduler import byte_model  # pylint: disable=unused-import


def test_the_cache_keeps_its_count_and_its_bytes():
  cache = tables_lib.Lru(3, max_bytes=100)
  for key in range(5):
    cache.get_or_make(key, lambda: np.zeros([10], np.int32))  # 40 bytes
  assert (len(cache), cache.bytes) == (2, 80)  # The bytes bound first.
  made = []
  cache.get_or_make(3, lambda: made.append(1))  # Kept: not made again.
  assert not made
  # One entry over the bound alone is kept, alone.
  cache.get_or_make("large", lambda: np.zeros([100], np.int32))
  assert (len(cache), cache.bytes) == (1, 400)
  cache = tables_lib.Lru(2, max_bytes=1 << 20)
  for key in range(5):
    cache.get_or_make(key, lambda: (np.zeros([1], np.int32), {"a": 1}))
  assert (len(cache), cache.bytes) == (2, 8)  # The count bound first.


def test_distinct_stop_lists_stay_within_the_scheduler_s_bytes(
    byte_model, monkeypatch):
  """Rows of many distinct stop lists, each table 1-3 KiB: each cache of
  the scheduler's chunk tables holds at most its bound."""
  monkeypatch.setattr(tables_lib, "CACHED_TABLE_BYTES", 16 << 10)
  scheduler = scheduler_lib.Scheduler(
      byte_model, path="graph", max_batch=4, chunk_steps=4, max_queue=64,
      max_tokens_limit=8, max_prompt_tokens=16)
  tables = scheduler.calls.tables
  params = options_lib.DEFAULTS
  for i in range(40):
    completion = completion_lib.Completion(
        [byte_model.encode("ab")], [params], seed=i, max_tokens=2,
        shared=completion_lib.Shared(stop=(f"stop {i}",)),
        want_scores=False, sink=lambda update: None)
    tables.make_own(completion)
    tables.joined(completion.rows)
    for cache in (tables._stops, tables._joined):  # pylint: disable=protected-access
      assert cache.bytes <= 16 << 10
  assert len(tables._stops) < 40  # pylint: disable=protected-access


def test_a_stop_list_is_made_once_by_the_checks(byte_model, monkeypatch):
  """Requests with the same stop list share one automaton (the check makes
  it once; the scheduler lays out the one it is given)."""
  scheduler = scheduler_lib.Scheduler(
      byte_model, path="graph", max_batch=4, chunk_steps=4, max_queue=64,
      max_tokens_limit=8, max_prompt_tokens=16)
  checks = checks_lib.RequestChecks(byte_model, scheduler, max_queue=8,
                                    check_seconds=30)
  made = []
  real = host.stop_automaton

  def counted(model, stop):
    made.append(stop)
    return real(model, stop)

  monkeypatch.setattr(host, "stop_automaton", counted)
  request_model = protocol.completion_request(8)
  automata = []
  for seed, stop in ((1, ["\n\n"]), (2, ["\n\n"]), (3, ["x"]), (4, ["\n\n"])):
    parsed = protocol.checked_request(protocol.validate(request_model, dict(
        prompt="ab", max_tokens=2, seed=seed, stop=stop)), max_batch=4)
    automata.append(checks.check(parsed)[0].stop_automaton)
  assert made == [("\n\n",), ("x",)]
  assert automata[0] is automata[1] is automata[3]
  np.testing.assert_array_equal(automata[0].table,
                                real(byte_model, ("\n\n",)).table)
