"""The server's prefix-state cache (rnnstep/serve/prefix_cache.py) and named
initial states: a row that starts from a cached state gives the text it
gives without the cache, and the cache never holds more than its bound.

The reference of every text is the same scheduler without a cache (whose
text is `rnnstep.generate`'s: tests/test_serve_scheduler.py), run over the
same prompts; the models are the tiny GRU of `cli.write_model` and the
RWKV-7 fixture (tests/data/rwkv7), on the graph path, and XLA (slow tier:
it compiles).
"""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import rnnstep
from rnnstep.decoding import options as options_lib
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import lanes as lanes_lib
from rnnstep.serve import prefix_cache as prefix_cache_lib
from rnnstep.serve import scheduler as scheduler_lib
from tests.support import cli
from tests.support import http
from tests.support import serve_process
from tests.support.tiers import quick_params
from tests.test_rwkv7 import PRESET
from tests.test_serve_scheduler import Collector

# A shared opening (a "system prompt") and the requests' own texts.
SYSTEM = "ROMEO: But soft, what light through yonder window breaks? "
USERS = ["It is the east", "And Juliet", "Arise, fair sun", "O",
         "It is the east, and"]
# Greedy, seeded, and options that look at the prompt's ids (the penalty's
# counts, its window, the n-gram ban): the history is the whole prompt's
# whatever the priming started from.
CASES = [
    (dict(temperature=0.0), completion_lib.Shared()),
    (dict(temperature=0.9, top_k=20), completion_lib.Shared()),
    (dict(temperature=0.7, repetition_penalty=1.5),
     completion_lib.Shared(repetition_window=12, no_repeat_ngram_size=2)),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("prefix_cache") / "tiny.npz")
  cli.write_model(path)
  return rnnstep.load(path)


@pytest.fixture(scope="module")
def memory_model(model, tmp_path_factory):
  """A GRU of larger weights, whose text still shows its initial state
  after a dozen characters (the tiny one's has forgotten it)."""
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  config = model_file.ModelConfig(16, (model_file.LayerConfig("gru", 32),))
  rng = np.random.default_rng(4)
  path = tmp_path_factory.mktemp("prefix_cache") / "memory.npz"
  model_file.write(path, config, list(model.tokens.vocab), {
      k: (rng.normal(size=s) * 1.5).astype(np.float32)
      for k, s in config.expected_shapes(model.vocab_size).items()},
                   model.tokens)
  return rnnstep.load(str(path))


@pytest.fixture(scope="module")
def rwkv7_model():
  return rnnstep.load(PRESET)


def make_scheduler(model, **kwargs):
  settings = dict(path="graph", max_batch=8, chunk_steps=5, max_queue=64,
                  max_tokens_limit=64, max_prompt_tokens=128)
  settings.update(kwargs)
  return scheduler_lib.Scheduler(model, **settings)


def completion(model, prompts, options, shared, sink, seed=3, max_tokens=12,
               **kwargs):
  params = options_lib.Params(**{o.name: options.get(o.name, o.default)
                                 for o in options_lib.PER_ROW})
  return completion_lib.Completion(
      [model.encode(p) for p in prompts], [params] * len(prompts), seed=seed,
      max_tokens=max_tokens, shared=shared, want_scores=False, sink=sink,
      **kwargs)


def texts(scheduler, model, batches, options, shared, **kwargs):
  """Runs each batch of prompts (one completion a prompt, all submitted at
  once), batch after batch; returns every text in order."""
  scheduler.start()
  out = []
  try:
    for prompts in batches:
      sinks = [Collector(1) for _ in prompts]
      for prompt, sink in zip(prompts, sinks):
        scheduler.submit(completion(model, [prompt], options, shared, sink,
                                    **kwargs))
      for sink in sinks:
        assert sink.done.wait(300)
        assert sink.reason(0) in ("length", "stop"), sink.updates[0][-1]
      out += [sink.text(0) for sink in sinks]
  finally:
    assert scheduler.close(timeout=30)
  return out


def cached_and_not(model, batches, options, shared, *, cache_bytes=1 << 22,
                   **settings):
  """(texts without a cache, texts with one, the cache)."""
  plain = texts(make_scheduler(model, **settings), model, batches, options,
                shared)
  cache = prefix_cache_lib.PrefixCache(cache_bytes)
  cached = texts(make_scheduler(model, prefix_cache=cache, **settings),
                 model, batches, options, shared)
  return plain, cached, cache


# One prompt first (the cache warms), then the others together, then all
# again (each finds its own prompt's pieces, and where it parts from the
# others).
BATCHES = [[SYSTEM + USERS[0]], [SYSTEM + u for u in USERS],
           [SYSTEM + u for u in USERS]]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_cached_prefixes_give_the_same_text_gru_graph(model, case):
  options, shared = CASES[case]
  plain, cached, cache = cached_and_not(model, BATCHES, options, shared)
  assert cached == plain
  assert cache.hits >= 2 * len(USERS) and cache.tokens_saved > 0


@pytest.mark.exhaustive  # The path sweep: the graph path by default.
def test_cached_prefixes_give_the_same_text_gru_elementwise(model):
  # The elementwise path primes the whole prompt (nothing unconsumed).
  plain, cached, cache = cached_and_not(model, BATCHES, *CASES[1],
                                        path="elementwise")
  assert cached == plain and cache.hits


def _rwkv7_batches(model):
  """Prompts of the RWKV-7 fixture's vocabulary sharing a long opening."""
  letters = "abcdefghijklmnopqrstuvwxyz"  # One token each.
  rng = np.random.default_rng(1)
  system = "".join(rng.choice(list(letters), 70))
  users = ["".join(rng.choice(list(letters), n)) for n in (3, 9, 17, 1)]
  assert all(len(model.encode(system + u)) == len(system + u) for u in users)
  return [[system + users[0]], [system + u for u in users],
          [system + u for u in users]]


@pytest.mark.parametrize("case", quick_params([0, 1], 1))
def test_cached_prefixes_give_the_same_text_rwkv7_graph(rwkv7_model, case):
  plain, cached, cache = cached_and_not(
      rwkv7_model, _rwkv7_batches(rwkv7_model), *CASES[case], chunk_steps=16,
      cache_bytes=1 << 24)
  assert cached == plain and cache.hits


# The path sweep (the graph path by default); where RWKV-7 resumes under
# XLA is test_rwkv7_resumes_only_where_its_own_pieces_end, by default.
@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("case", [0, 1])
def test_cached_prefixes_give_the_same_text_rwkv7_xla(rwkv7_model, case):
  # XLA primes RWKV-7 in chunks (`loop.primes_in_chunks`): a row resumed
  # from a cached state starts its chunks elsewhere.
  plain, cached, cache = cached_and_not(
      rwkv7_model, _rwkv7_batches(rwkv7_model), *CASES[case], chunk_steps=16,
      cache_bytes=1 << 24, path="xla", max_batch=4)
  assert cached == plain and cache.hits
  # Pieces wider than a call's chunk of many rows (`request.chunk_columns`).
  plain, cached, cache = cached_and_not(
      rwkv7_model, _rwkv7_batches(rwkv7_model), *CASES[case], chunk_steps=64,
      cache_bytes=1 << 24, path="xla", max_batch=8)
  assert cached == plain and cache.hits


# Two XLA programs (20 s): RWKV-7's lanes take the graph path by default
# (paths.KIND_LANE_PATHS). The default run keeps tests/test_rwkv7.py's
# chunked priming's states (test_chunked_priming_holds_each_row_at_its_own_
# length, as a graph) and the server's widths (test_the_servers_xla_calls_
# take_the_librarys_chunked_prompt_widths).
@pytest.mark.exhaustive
def test_rwkv7_xla_many_rows_prime_in_narrower_chunks_to_the_same_state(
    rwkv7_model):
  """Under XLA a call over many rows primes RWKV-7 in chunks of
  `request.chunk_columns(batch)` columns (16 for 8 rows), stopping at the
  chunk holding the longest piece's end, where one row takes chunks of the
  whole width: each row's state is the one it has primed alone, to float32
  rounding (first pieces of 2 to 64 ids, most ending short of the
  width)."""
  scheduler = make_scheduler(rwkv7_model, path="xla", max_batch=8,
                             chunk_steps=64)
  letters = "abcdefghijklmnopqrstuvwxyz"  # One token each.
  rng = np.random.default_rng(2)
  rows = completion(rwkv7_model, [
      "".join(rng.choice(list(letters), 90)) for _ in range(8)], {},
                    completion_lib.Shared(), lambda u: None).rows
  for row, end in zip(rows, (63, 1, 16, 39, 62, 20, 4, 50)):
    row.cache_points = (end,)  # A first piece ending there: primes only.
  calls = scheduler.calls
  prepared = [calls.prepare(row) for row in rows]
  assert all(p.primes_only for p in prepared)
  _, together = calls.run(rows, prepared, carry=None, steps=1)
  for r, (row, p) in enumerate(zip(rows, prepared)):
    _, alone = calls.run([row], [p], carry=None, steps=1)
    for got, want in zip(tf.nest.flatten(together.state),
                         tf.nest.flatten(alone.state)):
      np.testing.assert_allclose(got[r], want[0], rtol=1e-5, atol=1e-5,
                                 err_msg=f"row {r}")


def _primed(calls, model, ids, splits):
  """The state after `ids[:splits[-1]]`, primed by `calls` a piece a call,
  each piece ending at the next split (a cache point), each call starting
  from the state the last one left (given, as the cache gives it)."""
  row = completion(model, ["x"], {}, completion_lib.Shared(),
                   lambda u: None).rows[0]
  row.prompt_ids = np.asarray(ids, np.int32)
  state = None
  for start, end in zip(splits, splits[1:]):
    row.primed, row.start_state, row.cache_points = start, state, (end,)
    prepared = calls.prepare(row)
    assert prepared.primes_only and len(prepared.piece) == (
        end + calls.unconsumed - start)
    _, carry = calls.run([row], [prepared], carry=None, steps=1)
    state = tf.nest.map_structure(lambda x: x[0], carry.state)
  return tf.nest.flatten(state)


@pytest.mark.parametrize("path",
                         quick_params(["graph", "elementwise"], "graph"))
def test_a_prompt_split_anywhere_primes_to_the_same_state_bit_for_bit(
    model, tmp_path, path):
  """Where `splits_exact` holds (one stepped layer: its inputs rows of a
  table), the state after a prompt primed from a cached prefix is the
  state after it primed from zeros, bit for bit, however the pieces fall.
  A stack (an LSTM over a GRU) does not claim it on any path: its upper
  layer multiplies all of a piece's columns at once, which oneDNN's AVX2
  kernel rounds by their count (this test failed for the stack with
  ONEDNN_MAX_CPU_ISA=AVX2), so it resumes only where its own pieces end."""
  scheduler = make_scheduler(model, chunk_steps=16, path=path)
  assert scheduler.starts.splits_exact
  ids = model.encode("but soft what light through yonder window breaks it is")
  whole = _primed(scheduler.calls, model, ids, [0, 15, 30])
  for splits in ([0, 7, 22, 30], [0, 1, 16, 30], [0, 13, 14, 29, 30]):
    for got, want in zip(_primed(scheduler.calls, model, ids, splits), whole):
      np.testing.assert_array_equal(got, want, err_msg=str(splits))
  stack = str(tmp_path / "stack.npz")
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  config = model_file.ModelConfig(16, (model_file.LayerConfig("gru", 24),
                                       model_file.LayerConfig("lstm", 20)))
  rng = np.random.default_rng(3)
  model_file.write(stack, config, list(model.tokens.vocab), {
      k: (rng.normal(size=s) * 0.5).astype(np.float32)
      for k, s in config.expected_shapes(model.vocab_size).items()},
                   model.tokens)
  stacked = rnnstep.load(stack)
  assert not make_scheduler(stacked, chunk_steps=16,
                            path=path).starts.splits_exact
  row = completion(stacked, ["a" * 50], {}, completion_lib.Shared(),
                   lambda u: None, cache_points=[20]).rows[0]
  cache = prefix_cache_lib.PrefixCache(1 << 24)
  scheduler = make_scheduler(stacked, chunk_steps=16, path=path,
                             prefix_cache=cache)
  ends = scheduler.calls.boundaries(row)  # [15, 20, 35]; elementwise +1.
  state = tf.nest.map_structure(lambda x: x[0], scheduler.calls._template.state)  # pylint: disable=protected-access
  for n in (ends[0], 30, 34):  # 30 and 34 are no boundary of this row's.
    cache.insert(scheduler.starts.namespace(None), row.prompt_ids[:n], state)
  scheduler.starts.start([row], [], [])
  assert row.primed == ends[0] and ends[1] == 20


def test_rwkv7_resumes_only_where_its_own_pieces_end(rwkv7_model):
  """RWKV-7's priming multiplies all of a piece's columns at once, and a
  column rounds by its place in the piece: a row resumes only at the end
  of one of the pieces it primes without the cache."""
  scheduler = make_scheduler(rwkv7_model, chunk_steps=16)
  assert not scheduler.starts.splits_exact
  row = completion(rwkv7_model, ["a" * 50], {}, completion_lib.Shared(),
                   lambda u: None, cache_points=[20]).rows[0]
  # Pieces of 16 (15 primed, 1 left to the next), ended at the point 20.
  assert scheduler.calls.boundaries(row) == [15, 20, 35]
  cache = prefix_cache_lib.PrefixCache(1 << 24)
  scheduler = make_scheduler(rwkv7_model, chunk_steps=16, prefix_cache=cache)
  namespace = scheduler.starts.namespace(None)
  state = tf.nest.map_structure(lambda x: x[0], scheduler.calls._template.state)  # pylint: disable=protected-access
  for n in (15, 30, 34):  # 30 and 34 are no boundary of this row's.
    cache.insert(namespace, row.prompt_ids[:n], state)
  scheduler.starts.start([row], [], [])
  assert row.primed == 15 and row.cache_points == (20,)


@pytest.mark.parametrize("which", ["gru", "rwkv7"])
def test_rows_arriving_together_prime_their_shared_prefix_once(
    model, rwkv7_model, which):
  """A cold burst of prompts sharing a long opening: one row primes it,
  the others wait for its states (and then start from them), the texts
  unchanged."""
  m = model if which == "gru" else rwkv7_model
  system = ("but soft what light through yonder window breaks it is the "
            "east and juliet is the sun")
  users = ["arise fair sun", "and kill", "the envious moon", "who is"]
  batches = [[system + u for u in users]]
  assert all(len(m.encode(p)) > 60 for p in batches[0])
  plain, cached, cache = cached_and_not(m, batches, *CASES[1],
                                        cache_bytes=1 << 26, chunk_steps=16)
  assert cached == plain
  # Every row but the first started from the first's states.
  assert cache.hits == len(users) - 1 and cache.misses == 1
  assert cache.tokens_saved >= (len(users) - 1) * 45


def test_a_burst_splits_evenly_over_the_lanes(model):
  """Requests arriving one after another while the lanes' calls run (a
  long prompt's calls take seconds): a lane counts the rows it admitted as
  running from their admission, not from its call's end, so each request
  goes to the lane with fewer rows (`Lanes.submit`) and a burst splits
  evenly: no lane primes the shared prefix for more rows than the other,
  nor runs them in a larger batch."""
  cache = prefix_cache_lib.PrefixCache(1 << 22)
  schedulers = [make_scheduler(model, prefix_cache=cache, chunk_steps=16)
                for _ in range(2)]
  lanes = lanes_lib.Lanes(schedulers, max_queue=64)
  ran = [set(), set()]  # The completions each lane's calls ran.
  uncounted = []  # Calls of more rows than their lane counted running.
  for lane, scheduler in enumerate(schedulers):

    def slow_run(rows, prepared, *, carry, steps, lane=lane,
                 scheduler=scheduler, run=scheduler.calls.run):
      if scheduler.stats.running < len(rows):
        uncounted.append((lane, len(rows), scheduler.stats.running))
      time.sleep(0.2)  # As a long prompt's piece takes.
      ran[lane].update(id(row.completion) for row in rows)
      return run(rows, prepared, carry=carry, steps=steps)

    scheduler.calls.run = slow_run
  system = SYSTEM + SYSTEM[:40]  # Several pieces of 16.
  lanes.start()
  try:
    sinks = []
    for i in range(8):
      sinks.append(Collector(1))
      lanes.submit(completion(model, [system + USERS[i % len(USERS)]],
                              *CASES[1], sinks[-1], seed=i))
      time.sleep(0.05)  # Read one after another, as the HTTP side does.
    for sink in sinks:
      assert sink.done.wait(300)
  finally:
    assert lanes.close(timeout=30)
  assert not uncounted
  assert [len(r) for r in ran] == [4, 4]
  assert cache.hits >= 6


def test_cache_points_end_priming_pieces_and_change_no_text(model):
  """A completion's cache points (a chat's message boundaries) are where
  the states are stored: the next prompt sharing that prefix starts there."""
  cut = len(model.encode(SYSTEM))
  options, shared = CASES[1]
  plain = texts(make_scheduler(model), model, [[SYSTEM + u] for u in USERS],
                options, shared)
  cache = prefix_cache_lib.PrefixCache(1 << 20)
  scheduler = make_scheduler(model, prefix_cache=cache)
  cached = texts(scheduler, model, [[SYSTEM + u] for u in USERS], options,
                 shared, cache_points=[cut])
  assert cached == plain
  namespace = scheduler.starts.namespace(None)
  assert cache.holds(namespace, model.encode(SYSTEM))
  # Every prompt after the first started at the system prompt's end, or
  # further on (where it parts from an earlier one: the last one's).
  assert cache.hits == len(USERS) - 1
  assert cache.tokens_saved >= cut * (len(USERS) - 1)


# -- the map ------------------------------------------------------------------


def _state(units, value=0.0):
  return ((np.full([units], value, np.float32),),)


def test_the_cache_never_holds_more_than_its_bound():
  """Filled with distinct prefixes, least recently used first out, its bytes
  never above the bound; a state larger than the bound is not held."""
  bound = 10 * 32 * 4 + 100  # Ten states of 32 floats, and some.
  cache = prefix_cache_lib.PrefixCache(bound)
  cache.register("m", [[(32,)]])
  rng = np.random.default_rng(0)
  for i in range(200):
    ids = rng.integers(0, 50, rng.integers(1, 30)).astype(np.int32)
    assert cache.insert("m", ids, _state(32, i))
    assert cache.bytes_held <= bound
    assert cache.bytes_held == 32 * 4 * len(cache)
  assert len(cache) == 10 and cache.evictions >= 190
  big = prefix_cache_lib.PrefixCache(100)
  big.register("m", [[(32,)]])
  assert not big.insert("m", [1, 2], _state(32)) and big.bytes_held == 0


def test_the_longest_cached_prefix_is_found_and_recency_kept():
  cache = prefix_cache_lib.PrefixCache(3 * 16)
  cache.register("m", [[(4,)]])
  prompt = np.arange(1, 20, dtype=np.int32)
  for n in (3, 7, 12):
    cache.insert("m", prompt[:n], _state(4, n))
  hit = cache.lookup("m", prompt, len(prompt) - 1)
  assert hit.length == 12 and hit.state[0][0][0] == 12
  assert cache.lookup("m", prompt, 11).length == 7  # At most `longest`.
  other = prompt.copy()
  other[5] = 0
  assert cache.lookup("m", other, 18).length == 3
  assert cache.hits == 3 and cache.tokens_saved == 22
  assert cache.lookup("m", np.array([5, 5], np.int32), 1).length == 0
  assert cache.misses == 1
  # 12 was used least recently (7 and 3 since): the next insert drops it.
  cache.insert("m", prompt[:15], _state(4, 15))
  assert not cache.holds("m", prompt[:12]) and cache.holds("m", prompt[:7])


def test_where_a_prompt_parts_from_a_recent_one_is_reported():
  cache = prefix_cache_lib.PrefixCache(1 << 10)
  cache.register("m", [[(4,)]])
  first = np.arange(1, 30, dtype=np.int32)
  assert cache.lookup("m", first, 28).diverges == 0
  second = first.copy()
  second[20:] += 100
  assert cache.lookup("m", second, 28).diverges == 20
  assert cache.lookup("m", second, 28).diverges == 20  # Not itself.


def test_namespaces_and_shapes_keep_states_apart():
  """Two models (or two named states) never share an entry, and a state of
  another shape is never inserted."""
  cache = prefix_cache_lib.PrefixCache(1 << 10)
  cache.register(("model a", None), [[(4,)]])
  cache.register(("model b", None), [[(4,)]])
  cache.register(("model a", "tuned"), [[(4,)]])
  ids = np.array([1, 2, 3], np.int32)
  cache.insert(("model a", None), ids, _state(4, 1.0))
  for other in (("model b", None), ("model a", "tuned")):
    assert cache.lookup(other, np.array([1, 2, 3, 4], np.int32), 3).length == 0
  with pytest.raises(ValueError, match="shapes"):
    cache.insert(("model b", None), ids, _state(5))
  with pytest.raises(ValueError, match="shapes"):
    cache.insert(("model b", None), ids,
                 ((np.zeros([4], np.float64),),))
  with pytest.raises(ValueError, match="not declared"):
    cache.insert(("model c", None), ids, _state(4))
  with pytest.raises(ValueError, match="shapes"):
    cache.register(("model a", None), [[(8,)]])
  assert len(cache) == 1


# -- named initial states -----------------------------------------------------


def _random_state(model, seed):
  """One row's state (per layer a tuple of [U] arrays) and the same as
  `generate`'s `initial_state` (one dict per layer of [1, U] arrays)."""
  from rnnstep.model import cells  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  layers = model.config.layers
  state = tuple(tuple(rng.normal(size=[size]).astype(np.float32)
                      for size in cells.state_sizes(layer))
                for layer in layers)
  initial = [{name: x[None] for name, x in zip(cells.state_names(layer), s)}
             for layer, s in zip(layers, state)]
  return state, initial


def test_named_states_start_rows_as_generate_s_initial_state(memory_model):
  """A completion naming a state (or none: the default) gives `generate`'s
  text from that initial state; the prefix cache keeps each state's
  prefixes apart (a state's rows never start from another's)."""
  warm, warm_initial = _random_state(memory_model, 1)
  tuned, tuned_initial = _random_state(memory_model, 2)
  cache = prefix_cache_lib.PrefixCache(1 << 20)
  scheduler = make_scheduler(memory_model, prefix_cache=cache,
                             states={"warm": warm, "tuned": tuned},
                             default_state="warm")
  options, shared = CASES[1]
  prompt = "ROMEO: But so"  # Short: the GRU's text still shows its start.
  scheduler.start()
  got = {}
  try:
    for name in ("tuned", None, "tuned", None):  # Then each from the cache.
      sink = Collector(1)
      scheduler.submit(completion(memory_model, [prompt], options, shared,
                                  sink, state=name))
      assert sink.done.wait(300)
      got.setdefault(name, []).append(sink.text(0))
    with pytest.raises(ValueError, match="state: no state named 'cold'"):
      scheduler.submit(completion(memory_model, [prompt], options, shared,
                                  Collector(1), state="cold"))
  finally:
    assert scheduler.close(timeout=30)
  assert cache.hits == 2
  for name, initial in (("tuned", tuned_initial), (None, warm_initial)):
    want = rnnstep.generate(memory_model, prompt, 12, seed=3,
                            jit_compile=False, initial_state=initial,
                            **options)
    assert got[name] == [want, want]
  assert got["tuned"] != got[None]
  with pytest.raises(ValueError, match="default_state"):
    make_scheduler(memory_model, states={"warm": warm}, default_state="cold")
  with pytest.raises(ValueError, match="shapes"):
    make_scheduler(memory_model,
                   states={"bad": ((np.zeros([3], np.float32),),)})


# -- over HTTP ----------------------------------------------------------------


BOUND_MB = 0.01  # 10,485 bytes: 81 of the tiny GRU's 128-byte states.


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
  """One `rnnstep-serve` of the tiny GRU with a small prefix cache, pieces
  of 4 ids (many states a prompt)."""
  if not serve_process.stack_installed():
    pytest.skip("the serving stack is not installed (pip install "
                "'rnnstep[serve]')")
  folder = tmp_path_factory.mktemp("prefix_cache_server")
  path = str(folder / "tiny.npz")
  cli.write_model(path)
  states = folder / "states"
  states.mkdir()
  for name, seed in (("warm.safetensors", 1), ("tuned.pth", 2)):
    rnnstep.save_state(states / name, model, _random_state(model, seed)[1])
  (states / "notes.txt").write_text("not a state")
  from tests.test_serve_chat import GRU_TEMPLATE  # pylint: disable=g-import-not-at-top
  (folder / "chat.jinja").write_text(GRU_TEMPLATE)
  with serve_process.RemoteServer([
      f"--chat_template={folder / 'chat.jinja'}",
      f"--model={path}", "--max_batch=4", "--chunk_steps=4",
      "--max_tokens_limit=32", "--max_prompt_tokens=128",
      "--jit_compile=false", "--lanes=2", f"--states={states}",
      f"--prefix_cache_mb={BOUND_MB}"]) as running:
    running.states = states
    yield running


def _metrics(server):
  text = http.get(server.url("/metrics"), timeout=30).text
  values = {}
  for line in text.splitlines():
    if line.startswith("rnnstep_prefix_cache_"):
      name, value = line.split()
      values[name[len("rnnstep_prefix_cache_"):]] = float(value)
  return values


@pytest.mark.slow  # A server process.
def test_server_texts_are_generate_s_and_metrics_count_the_cache(model,
                                                                 server):
  bodies = [dict(prompt=SYSTEM + u, max_tokens=10, seed=7, temperature=0.8)
            for u in USERS]
  before = _metrics(server)

  def send(body):
    reply = http.post(server.url("/v1/completions"), json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return [c["text"] for c in reply.json()["choices"]]

  texts_first = [send(bodies[0])]
  threads_out = [None] * (len(bodies) - 1)

  def send_at(i):
    threads_out[i] = send(bodies[i + 1])

  threads = [threading.Thread(target=send_at, args=(i,))
             for i in range(len(bodies) - 1)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  got = texts_first + threads_out
  want = [serve_process.expected(model, b, 7)[0] for b in bodies]
  assert got == want
  after = _metrics(server)
  assert after["hits"] - before["hits"] >= len(bodies) - 1
  assert after["tokens_saved"] - before["tokens_saved"] >= 4 * (
      len(bodies) - 1)
  assert after["misses"] >= 1
  assert 0 < after["bytes"] <= BOUND_MB * (1 << 20)


@pytest.mark.slow  # A server process.
def test_server_cache_bytes_never_pass_the_bound(server):
  """Distinct prompts of 90 ids (12 states each), one after another: after
  each, the bytes held are within --prefix_cache_mb, and states were
  dropped to stay there."""
  rng = np.random.default_rng(5)
  letters = list("abcdefghijklmnopqrstuvwxyz")
  for _ in range(10):
    prompt = "".join(rng.choice(letters, 90))
    reply = http.post(server.url("/v1/completions"), json=dict(
        prompt=prompt, max_tokens=2), timeout=120)
    assert reply.status_code == 200, reply.text
    assert _metrics(server)["bytes"] <= BOUND_MB * (1 << 20)
  assert _metrics(server)["evictions"] > 0


@pytest.mark.slow  # A server process.
def test_server_refuses_an_unknown_state_with_404_naming_it(server):
  reply = http.post(server.url("/v1/completions"), json=dict(
      prompt="ROMEO:", max_tokens=2, state="nonesuch"), timeout=60)
  assert reply.status_code == 404, reply.text
  assert reply.json()["error"]["param"] == "state"
  assert "nonesuch" in reply.json()["error"]["message"]


@pytest.mark.slow  # A server process.
def test_server_named_states_give_generate_s_text_from_them(model, server):
  """`state` picks a --states file (its name less the suffix): the text is
  `generate`'s from `load_state` of it, twice (the second from the cache);
  no `state` starts from zeros (no --state)."""
  prompt = "ROMEO: But so"
  for name, file in (("warm", "warm.safetensors"), ("tuned", "tuned.pth"),
                     (None, None)):
    body = dict(prompt=prompt, max_tokens=12, seed=3, temperature=0.9)
    if name:
      body["state"] = name
    initial = (rnnstep.load_state(server.states / file, model) if file
               else None)
    want = rnnstep.generate(model, prompt, 12, seed=3, temperature=0.9,
                            jit_compile=False, initial_state=initial)
    for _ in range(2):
      reply = http.post(server.url("/v1/completions"), json=body,
                        timeout=120)
      assert reply.status_code == 200, reply.text
      assert reply.json()["choices"][0]["text"] == want
  # A chat picks a state alike (its prompt rendered by the template).
  messages = [{"role": "user", "content": "Hi"}]
  prompt = "USER: Hi\nASSISTANT:"
  want = rnnstep.generate(
      model, prompt, 12, seed=3, temperature=0.9, jit_compile=False,
      stop="\n", initial_state=rnnstep.load_state(
          server.states / "warm.safetensors", model))
  reply = http.post(server.url("/v1/chat/completions"), json=dict(
      messages=messages, max_tokens=12, seed=3, temperature=0.9,
      state="warm"), timeout=120)
  assert reply.status_code == 200, reply.text
  assert reply.json()["choices"][0]["message"]["content"] == want
  reply = http.post(server.url("/v1/chat/completions"), json=dict(
      messages=messages, max_tokens=2, state="nonesuch"), timeout=60)
  assert reply.status_code == 404 and reply.json()["error"]["param"] == "state"


@pytest.mark.slow  # Command-line runs.
@pytest.mark.parametrize("flags, says", [
    (["--state=/nonexistent/s.pth"], "--state: /nonexistent/s.pth"),
    (["--states=/nonexistent"], "--states: /nonexistent is not a folder"),
])
def test_bad_state_flags_fail_in_one_line(model, tmp_path, flags, says):
  path = str(tmp_path / "tiny.npz")
  cli.write_model(path)
  result = cli.run_binary(cli.command("rnnstep-serve", "rnnstep.serve.main"),
                          [f"--model={path}", "--port=0", *flags])
  assert result.returncode == 2, result
  assert len(result.stderr_lines) == 1, result
  assert says in result.stderr_lines[0], result


@pytest.mark.slow  # Command-line runs.
@pytest.mark.parametrize("content", [None, b"not a zip archive"])
def test_a_bad_model_file_fails_in_one_line_before_tensorflow(tmp_path,
                                                              content):
  """The server reads --model before TensorFlow starts (its thread pools
  follow the model): a missing or forged file is still one line naming
  the flag."""
  path = tmp_path / "m.npz"
  if content is not None:
    path.write_bytes(content)
  result = cli.run_binary(cli.command("rnnstep-serve", "rnnstep.serve.main"),
                          [f"--model={path}", "--port=0"])
  assert result.returncode != 0, result
  assert len(result.stderr_lines) == 1, result
  assert result.stderr_lines[0].startswith("rnnstep-serve: error: --model: "), \
      result


def test_chat_message_boundaries_are_cache_points(model):
  """A chat prompt's states are kept at its messages' boundaries: after the
  system message and after all but the last, as offsets in ids."""
  from rnnstep.model import chat_template  # pylint: disable=g-import-not-at-top
  template = chat_template.RwkvTemplate()
  messages = [chat_template.Message("system", "Be brief."),
              chat_template.Message("user", "Hi"),
              chat_template.Message("assistant", "Hello."),
              chat_template.Message("user", "Why?")]
  prompt = template.render(messages)
  points = prefix_cache_lib.message_boundaries(template.render, messages,
                                               prompt)
  assert [prompt[:p] for p in points] == [
      "System: Be brief.\n\n",
      "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\n"]
  ids = model.encode(prompt)
  assert prefix_cache_lib.token_offsets(model.encode, prompt, ids,
                                        points) == points  # A char model.
  assert prefix_cache_lib.message_boundaries(
      template.render, messages[:1], template.render(messages[:1])) == ()


@pytest.mark.slow  # A server process.
def test_server_chat_requests_start_after_the_shared_system_message(
    model, server):
  """Chat requests sharing a system message: the second and later start
  from the state at its end (the template's boundary a cache point), and
  the text is `generate`'s on the rendered prompt."""
  system = "You are a terse assistant who answers in one word only."
  before = _metrics(server)
  for user in ("Hi", "And now?", "Again"):
    reply = http.post(server.url("/v1/chat/completions"), json=dict(
        messages=[dict(role="system", content=system),
                  dict(role="user", content=user)],
        max_tokens=6, seed=2, temperature=0.8), timeout=120)
    assert reply.status_code == 200, reply.text
    prompt = f"SYSTEM: {system}\nUSER: {user}\nASSISTANT:"
    want = rnnstep.generate(model, prompt, 6, seed=2, temperature=0.8,
                            jit_compile=False)
    assert reply.json()["choices"][0]["message"]["content"] == want
  after = _metrics(server)
  assert after["hits"] - before["hits"] >= 2
  assert after["tokens_saved"] - before["tokens_saved"] >= 2 * len(
      f"SYSTEM: {system}\n")


# -- one priming for the whole server ------------------------------------------


def test_lanes_prime_a_shared_prefix_once_in_the_whole_server(model):
  """A cold burst over two lanes sharing a cache: one row in the whole
  server primes the prefix the requests share (a miss), every other row,
  whichever lane runs it, waits for its states and starts from them (a hit
  each); a lane whose rows all wait runs no rounds meanwhile (it sleeps
  until the other lane publishes), and the texts are the uncached ones."""
  system = SYSTEM * 2  # 116 ids: many pieces of 5.
  prompts = [system + USERS[i % len(USERS)] for i in range(6)]
  options, shared = CASES[1]
  plain = texts(make_scheduler(model, max_prompt_tokens=256), model,
                [prompts], options, shared)
  cache = prefix_cache_lib.PrefixCache(1 << 22)
  schedulers = [make_scheduler(model, prefix_cache=cache,
                               max_prompt_tokens=256) for _ in range(2)]
  lanes = lanes_lib.Lanes(schedulers, max_queue=64)
  rounds = [0, 0]
  for lane, scheduler in enumerate(schedulers):

    def counted_start(rows, going_on, parked, lane=lane,
                      start=scheduler.starts.start):
      rounds[lane] += 1
      return start(rows, going_on, parked)

    def slow_run(rows, prepared, *, carry, steps, run=scheduler.calls.run):
      time.sleep(0.05)  # The requests arrive while the prefix is primed.
      return run(rows, prepared, carry=carry, steps=steps)

    scheduler.starts.start = counted_start
    scheduler.calls.run = slow_run
  lanes.start()
  try:
    sinks = []
    for prompt in prompts:
      sinks.append(Collector(1))
      lanes.submit(completion(model, [prompt], options, shared, sinks[-1]))
    for sink in sinks:
      assert sink.done.wait(300)
  finally:
    assert lanes.close(timeout=30)
  assert [sink.text(0) for sink in sinks] == plain
  assert [s.stats.chunks > 0 for s in schedulers] == [True, True]
  assert (cache.misses, cache.hits) == (1, len(prompts) - 1)
  # Each row saved the shared prefix but its last piece at most.
  assert cache.tokens_saved >= (len(prompts) - 1) * (len(system) - 5)
  # 116 ids in pieces of 5: ~24 calls of the leader's lane, and the other
  # lane one round a publication at most (a spinning lane: thousands).
  assert max(rounds) < 200, rounds


@pytest.mark.parametrize("leader_ends", ["cancelled", "error"])
def test_a_row_waiting_on_another_lane_s_row_goes_on_when_that_one_ends(
    model, leader_ends):
  """A row waiting in one lane for the row priming its prefix in the other
  (`flights.py`) primes the prefix itself when that row ends before storing
  the state it waits for (its client cancels it, or its device call fails):
  it never waits on a row that is gone, and its text is the uncached one."""
  system = SYSTEM * 2  # 116 ids: many pieces of 5.
  prompts = [system + USERS[0], system + USERS[1]]
  options, shared = CASES[1]
  plain = texts(make_scheduler(model, max_prompt_tokens=256), model,
                [prompts[1:]], options, shared)
  cache = prefix_cache_lib.PrefixCache(1 << 22)
  schedulers = [make_scheduler(model, prefix_cache=cache,
                               max_prompt_tokens=256) for _ in range(2)]
  lanes = lanes_lib.Lanes(schedulers, max_queue=64)
  leading, released, parked = (threading.Event(), threading.Event(),
                               threading.Event())

  def held_run(rows, prepared, *, carry, steps, run=schedulers[0].calls.run):
    leading.set()  # The leader is published: the other lane may wait on it.
    assert released.wait(60)
    if leader_ends == "error":
      raise RuntimeError("the device call failed")
    return run(rows, prepared, carry=carry, steps=steps)

  def noting_start(rows, going_on, parked_rows,
                   start=schedulers[1].starts.start):
    started = start(rows, going_on, parked_rows)
    if started[1]:
      parked.set()
    return started

  schedulers[0].calls.run = held_run
  schedulers[1].starts.start = noting_start
  lanes.start()
  try:
    leader, follower = Collector(1), Collector(1)
    leading_completion = completion(model, prompts[:1], options, shared,
                                    leader)
    schedulers[0].submit(leading_completion)
    assert leading.wait(60)
    schedulers[1].submit(completion(model, prompts[1:], options, shared,
                                    follower))
    assert parked.wait(60)  # It waits for the leader's states.
    if leader_ends == "cancelled":
      leading_completion.cancel()
    released.set()
    assert leader.done.wait(60)
    assert follower.done.wait(60)
  finally:
    assert lanes.close(timeout=30)
  assert leader.reason(0) == leader_ends
  assert follower.text(0) == plain[0]


@pytest.fixture(scope="module")
def long_prompt_server(tmp_path_factory):
  """An `rnnstep-serve` of the tiny GRU with two lanes, pieces of 8 ids and
  room for prompts of 2,000 ids: a long shared prefix takes its lane some
  hundred calls, while the burst's requests arrive."""
  if not serve_process.stack_installed():
    pytest.skip("the serving stack is not installed (pip install "
                "'rnnstep[serve]')")
  path = str(tmp_path_factory.mktemp("long_prompts") / "tiny.npz")
  cli.write_model(path)
  with serve_process.RemoteServer([
      f"--model={path}", "--max_batch=8", "--chunk_steps=4",
      "--max_tokens_limit=32", "--max_prompt_tokens=2048",
      "--jit_compile=false", "--lanes=2"]) as running:
    yield running


@pytest.mark.slow  # A server process.
def test_server_primes_a_burst_s_shared_prefix_once_over_its_lanes(
    model, long_prompt_server):
  """Six requests at once over two lanes, sharing a prefix of 1,600 ids:
  /metrics counts one miss (the one row that primed it, in one lane) and a
  hit for each other row, whichever lane ran it, each saving the whole
  prefix but its last piece; every text is `generate`'s."""
  server = long_prompt_server
  system = (SYSTEM * 28)[:1600]
  bodies = [dict(prompt=system + u, max_tokens=8, seed=i, temperature=0.8)
            for i, u in enumerate(USERS + USERS[:1])]
  before = _metrics(server)
  got = [None] * len(bodies)

  def send(i):
    reply = http.post(server.url("/v1/completions"), json=bodies[i],
                      timeout=300)
    assert reply.status_code == 200, reply.text
    got[i] = [c["text"] for c in reply.json()["choices"]]

  threads = [threading.Thread(target=send, args=(i,))
             for i in range(len(bodies))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert got == [serve_process.expected(model, b, i)[0]
                 for i, b in enumerate(bodies)]
  after = _metrics(server)
  assert after["misses"] - before["misses"] == 1
  assert after["hits"] - before["hits"] == len(bodies) - 1
  assert after["tokens_saved"] - before["tokens_saved"] >= (
      len(bodies) - 1) * (len(system) - 8)


@pytest.mark.slow  # Compiles a program per row count.
def test_a_graph_lane_compiles_every_row_count_behind_its_warm_up(
    rwkv7_model, model):
  """RWKV-7's cells compile small XLA programs per batch size off one XLA
  program (a block's step, the state update): a graph-path lane's warm-up
  queues a one-step call of every row count on the compiling thread,
  counted by `compiling` until done, so that no request's call compiles
  them. A GRU's graph path compiles nothing per batch."""
  from rnnstep.serve import calls as calls_lib  # pylint: disable=g-import-not-at-top
  # Rows 2 and 3: two row counts past the first prove "every" as well as
  # four, at half the compiles.
  settings = dict(path="graph", max_batch=3, chunk_steps=4,
                  max_tokens_limit=8, max_prompt_tokens=32)
  calls = calls_lib.ChunkCalls(rwkv7_model, stats=scheduler_lib.Stats(),
                               **settings)
  calls.warm_up()
  deadline = time.monotonic() + 300
  while calls.compiling and time.monotonic() < deadline:
    time.sleep(0.1)
  assert calls.compiling == 0
  warmer = calls._batch_warmer  # pylint: disable=protected-access
  assert all(warmer.ready(("rows", rows)) for rows in range(2, 4))
  gru = calls_lib.ChunkCalls(model, stats=scheduler_lib.Stats(), **settings)
  gru.warm_up()
  assert gru.compiling == 0
  assert gru._batch_warmer is None  # pylint: disable=protected-access
