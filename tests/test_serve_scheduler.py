"""The serving scheduler in-process (rnnstep/serve/scheduler.py): limits in
ids, one row's failure retires that row only, and per-id log-probabilities.

References are the library's public functions: `rnnstep.generate` for every
row's text and score, and `rnnstep.logits` (teacher-forced over the prompt
and the generated ids), log-softmaxed in numpy, for every log-probability.
The model is the tiny GRU of `cli.write_model` (and a byte model of the same
shape for the limits in ids), on the graph path; the xla variants compile,
so they are in the slow tier (one: a row that begins on the graph path
while its XLA program compiles in the background and ends under XLA).
"""

import collections
import threading
import time

import numpy as np
import pytest

import rnnstep
from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.model import model_file
from rnnstep.model import vocabulary
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import scheduler as scheduler_lib
from tests.support import cli


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("serve_scheduler") / "tiny.npz")
  cli.write_model(path)
  return rnnstep.load(path)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
  """A byte model (one non-ASCII character is 2 to 4 ids)."""
  config = model_file.ModelConfig(8, (model_file.LayerConfig("gru", 16),))
  rng = np.random.default_rng(4)
  tokens = vocabulary.Tokens("bytes", vocabulary.bytes_vocab())
  path = tmp_path_factory.mktemp("serve_scheduler") / "bytes.npz"
  model_file.write(path, config, list(tokens.vocab), {
      k: (rng.normal(size=s) * 1.5).astype(np.float32)
      for k, s in config.expected_shapes(256).items()}, tokens)
  return rnnstep.load(str(path))


@pytest.fixture
def uncompiled_model(tmp_path):
  """A character model of an architecture (GRU 20 over 65 characters, D=12)
  no other test compiles: its XLA programs (shared per architecture) are
  not compiled yet, whichever tests ran before in this process."""
  path = str(tmp_path / "uncompiled.npz")
  cli.write_model(path, seed=8, embedding_dim=12, units=20)
  return rnnstep.load(path)


class Collector:
  """A completion's sink: its updates per choice, and when all ended."""

  def __init__(self, count: int):
    self.count = count
    self.updates = collections.defaultdict(list)
    self.done = threading.Event()
    self._lock = threading.Lock()

  def __call__(self, update: completion_lib.Update) -> None:
    with self._lock:
      self.updates[update.index].append(update)
      if sum(1 for u in self.updates.values()
             if u[-1].finish_reason) == self.count:
        self.done.set()

  def text(self, i: int) -> str:
    return "".join(u.text for u in self.updates[i])

  def ids(self, i: int) -> np.ndarray:
    return np.concatenate([u.ids for u in self.updates[i]])

  def reason(self, i: int) -> str:
    return self.updates[i][-1].finish_reason

  def joined(self, i: int, field: str) -> np.ndarray:
    return np.concatenate([getattr(u, field) for u in self.updates[i]])


def make_scheduler(model, **kwargs):
  settings = dict(path="graph", max_batch=8, chunk_steps=5, max_queue=64,
                  max_tokens_limit=64, max_prompt_tokens=64)
  settings.update(kwargs)
  return scheduler_lib.Scheduler(model, **settings)


def submit(scheduler, model, prompts, *, seed, max_tokens, options=None,
           shared=completion_lib.Shared(), **kwargs):
  """Submits one completion of `prompts`; returns its `Collector`."""
  options = options or {}
  params = options_lib.Params(**{o.name: options.get(o.name, o.default)
                                 for o in options_lib.PER_ROW})
  sink = Collector(len(prompts))
  scheduler.submit(completion_lib.Completion(
      [model.encode(p) for p in prompts], [params] * len(prompts), seed=seed,
      max_tokens=max_tokens, shared=shared, want_scores=False, sink=sink,
      **kwargs))
  return sink


def reference(model, prompts, max_tokens, seed, options=None,
              shared=completion_lib.Shared(), jit_compile=False, **kwargs):
  return rnnstep.generate(
      model, prompts, max_tokens, seed=seed, stop=list(shared.stop) or None,
      regex=shared.regex, jit_compile=jit_compile, **(options or {}),
      **kwargs)


# -- limits in ids ------------------------------------------------------------


def test_prompt_limit_counts_ids_and_a_longer_prompt_never_runs(byte_model):
  """`max_prompt_tokens` counts the model's ids: 9 characters of "é" are 18
  ids, over a limit of 16 (`submit` refuses it: ValueError naming the
  prompt); 8 of them (16 ids) fit the history and run beside an ASCII row,
  each equal to `generate`."""
  scheduler = make_scheduler(byte_model, max_prompt_tokens=16,
                             max_tokens_limit=20)
  assert scheduler.max_prompt_tokens == 16
  with pytest.raises(ValueError, match="prompt"):
    submit(scheduler, byte_model, ["\u00e9" * 9], seed=1, max_tokens=20)
  with pytest.raises(ValueError, match="max_tokens"):
    submit(scheduler, byte_model, ["a"], seed=1, max_tokens=21)
  assert scheduler.stats.waiting == 0  # Nothing of them queued.
  prompts = ["\u00e9" * 8, "plain ascii"]
  sink = submit(scheduler, byte_model, prompts, seed=3, max_tokens=20,
                options=dict(repetition_penalty=1.3))
  scheduler.start()
  try:
    assert sink.done.wait(60)
  finally:
    assert scheduler.close(timeout=10)
  assert [sink.text(i) for i in range(2)] == reference(
      byte_model, prompts, 20, 3, dict(repetition_penalty=1.3))


@pytest.mark.slow  # Two programs' first calls.
def test_a_burst_s_first_call_is_short_and_a_full_batch_s_is_not(model):
  """Rows that are most of a batch that is not full (a burst arriving; a
  lone request) run a short first call (`burst_steps`: 8 of 64 here), so
  that the rest of a burst joins at its end; a full batch runs whole
  chunks. The texts are `generate`'s either way."""
  scheduler = make_scheduler(model, max_batch=4, chunk_steps=64,
                             max_tokens_limit=80)
  assert scheduler.burst_steps == 8
  scheduler.start()
  try:
    lone = submit(scheduler, model, ["ab"], seed=1, max_tokens=80)
    assert lone.done.wait(60)
    full = submit(scheduler, model, ["a", "b", "c", "d"], seed=2, max_tokens=80)
    assert full.done.wait(60)
  finally:
    assert scheduler.close(timeout=10)
  assert [u.tokens for u in lone.updates[0]] == [8, 64, 8]
  assert [u.tokens for u in full.updates[0]] == [64, 16]
  assert lone.text(0) == reference(model, ["ab"], 80, 1)[0]
  assert [full.text(i) for i in range(4)] == reference(
      model, ["a", "b", "c", "d"], 80, 2)


def test_a_prompt_primed_over_calls_gets_its_first_id_at_once(model):
  """A row whose prompt took calls before its last piece (a long prompt;
  the same for a start from the prefix cache), with no row decoding beside
  it, starts decoding in a call of one step: its first id goes out as soon
  as its prompt is primed, and the next calls run whole chunks. The text is
  `generate`'s."""
  scheduler = make_scheduler(model, max_batch=4, chunk_steps=16,
                             max_tokens_limit=40)
  prompt = "ROMEO: But soft, what light through yonder"  # Pieces of 16.
  assert len(model.encode(prompt)) > 2 * scheduler.prime_chars
  scheduler.start()
  try:
    sink = submit(scheduler, model, [prompt], seed=4, max_tokens=40,
                  options=dict(temperature=0.8))
    assert sink.done.wait(60)
  finally:
    assert scheduler.close(timeout=10)
  assert [u.tokens for u in sink.updates[0]] == [1, 16, 16, 7]
  assert sink.text(0) == reference(model, [prompt], 40, 4,
                                   dict(temperature=0.8))[0]


def test_a_call_is_one_step_where_rows_resumed_are_most_of_it(model):
  """`steps.call_steps`: rows starting to decode after earlier calls'
  priming shorten the call to one step where they are most of its rows or
  no row decodes on from before; a lane decoding mostly rows from before
  keeps its chunk, and rows primed in this call only do not shorten it."""
  from rnnstep.serve import calls as calls_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import steps as steps_lib  # pylint: disable=g-import-not-at-top
  rows = completion_lib.Completion(
      [model.encode("ROMEO")] * 4, [options_lib.DEFAULTS] * 4, seed=0,
      max_tokens=30, shared=completion_lib.Shared(), want_scores=False,
      sink=lambda update: None).rows
  last_piece = calls_lib.Prepared(np.zeros([3], np.int32), None, False)
  decodes_on = calls_lib.Prepared(None, None, False)
  rows[0].primed = rows[1].primed = 40  # Primed before (or the cache's).
  steps = lambda rows, prepared: steps_lib.call_steps(
      rows, prepared, 0, chunk_steps=16, burst_steps=8, max_batch=8)
  assert steps(rows[:1], [last_piece]) == 1
  assert steps(rows[:3], [last_piece] * 2 + [decodes_on]) == 1
  assert steps(rows[:2] + rows[2:], [last_piece] * 2 + [decodes_on] * 2) == 16
  assert steps([rows[0], rows[2], rows[3]],
               [last_piece, decodes_on, decodes_on]) == 16
  assert steps(rows[2:3], [last_piece]) == 16


# -- one row's failure --------------------------------------------------------


class _Exploding:
  """A row's text decoder that fails (its hand-out's host work)."""

  def push(self, ids):
    raise RuntimeError("decoder exploded")


def test_a_failing_row_retires_alone_and_the_others_equal_generate(
    model, monkeypatch):
  """Three faults, each in one row, among carried and fresh rows of other
  completions: ids outside the vocabulary (the checks bypassed: the
  device's gather fails, the call is run again over halves of its rows),
  a host step that raises (its history), and a text decoder that raises.
  Each faulty row ends "error" with a message; every other row's text is
  `generate`'s; the scheduler goes on serving."""
  scheduler = make_scheduler(model, max_batch=8)
  monkeypatch.setattr(scheduler, "check", lambda completion: None)
  history = scheduler.calls.history

  def failing_history(row):
    if row.completion.seed == 66:
      raise RuntimeError("history exploded")
    return history(row)

  monkeypatch.setattr(scheduler.calls, "history", failing_history)
  good = [(["ROMEO:", "To be", "a"], 33, 1, dict(temperature=0.8)),
          (["Hi", "there you"], 23, 2, dict(top_k=5)),
          (["q"], 30, 5, {})]
  sinks = [submit(scheduler, model, good[0][0], seed=good[0][2],
                  max_tokens=good[0][1], options=good[0][3])]
  # Outside the vocabulary: an id past V in the second and third of three
  # rows: in a short prompt (its host work for the call fails) and in the
  # first piece of a long one (the device's gather fails as it primes).
  bad_ids = Collector(3)
  params = [options_lib.DEFAULTS] * 3
  bad = completion_lib.Completion(
      [model.encode("ab"), np.array([3, model.vocab_size + 7], np.int32),
       np.array([3, model.vocab_size + 9] + [4] * 12, np.int32)],
      params, seed=65, max_tokens=20, shared=completion_lib.Shared(),
      want_scores=False, sink=bad_ids)
  scheduler.start()
  try:
    scheduler.submit(bad)  # While the first completion's rows run (carried).
    sinks.append(submit(scheduler, model, good[1][0], seed=good[1][2],
                        max_tokens=good[1][1], options=good[1][3]))
    bad_history = submit(scheduler, model, ["x"], seed=66, max_tokens=10)
    bad_text = Collector(1)
    exploding = completion_lib.Completion(
        [model.encode("y")], [options_lib.DEFAULTS], seed=67, max_tokens=10,
        shared=completion_lib.Shared(), want_scores=False, sink=bad_text)
    exploding.rows[0].text = _Exploding()
    scheduler.submit(exploding)
    sinks.append(submit(scheduler, model, good[2][0], seed=good[2][2],
                        max_tokens=good[2][1], options=good[2][3]))
    for sink in sinks + [bad_ids, bad_history, bad_text]:
      assert sink.done.wait(60)
    # The scheduler still serves.
    after = submit(scheduler, model, ["ROMEO:"], seed=9, max_tokens=12)
    assert after.done.wait(60)
  finally:
    assert scheduler.close(timeout=10)
  for (prompts, max_tokens, seed, options), sink in zip(good, sinks):
    assert [sink.text(i) for i in range(len(prompts))] == reference(
        model, prompts, max_tokens, seed, options)
    assert all(sink.reason(i) == "length" for i in range(len(prompts)))
  assert after.text(0) == reference(model, ["ROMEO:"], 12, 9)[0]
  # The faulty rows, alone.
  assert bad_ids.text(0) == reference(model, ["ab"], 20, 65)[0]
  assert bad_ids.reason(1) == bad_ids.reason(2) == "error"
  assert "device call" in bad_ids.updates[1][-1].message
  assert "device call" in bad_ids.updates[2][-1].message
  assert bad_history.reason(0) == "error"
  assert "history exploded" in bad_history.updates[0][-1].message
  assert bad_text.reason(0) == "error"
  assert "decoder exploded" in bad_text.updates[0][-1].message
  assert scheduler.stats.running == 0 and scheduler.stats.waiting == 0


# -- log-probabilities -------------------------------------------------------


def _log_softmax(logits: np.ndarray) -> np.ndarray:
  x = logits.astype(np.float64)
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _check_top(top_ids, top_values, distribution, k):
  """The top-k ids and values of each row of `distribution` (numpy's,
  ties aside: equal values may come in either order)."""
  assert top_ids.shape == top_values.shape == (len(distribution), k)
  for ids, values, row in zip(top_ids, top_values, distribution):
    want = np.sort(row)[::-1][:k]
    np.testing.assert_allclose(values, want, atol=1e-5)
    np.testing.assert_allclose(row[ids], values, atol=1e-5)


def _logprobs_case(model, path, which=(0, 1, 2, 3)):
  """Rows of sampled, filtered, penalized, stopped and greedy decoding
  asking for `logprobs` (and one not): each id's log-probability is the raw
  model's, teacher-forced (`rnnstep.logits`), the top-k numpy's, their sum
  `generate`'s score; the prompt's (echo) likewise."""
  jit = paths.JIT_COMPILE[path]
  scheduler = make_scheduler(model, path=path, max_batch=4, chunk_steps=6)
  if path == paths.GRAPH:  # The others compile per shape: warm-up is long.
    scheduler.warm_up()
  traces = (
      scheduler.generator.programs.serve_fn.experimental_get_tracing_count())
  cases = [  # (prompts, max_tokens, seed, options, shared, logprobs, echo)
      (["ROMEO:", "To be"], 17, 1, dict(temperature=0.8, top_k=10),
       completion_lib.Shared(), 3, True),
      (["a"], 20, 2, dict(repetition_penalty=1.4), completion_lib.Shared(
          stop=("e ",), no_repeat_ngram_size=2), 5, False),
      (["KING RICHARD III:\nNow is"], 9, 3, dict(temperature=0.0),
       completion_lib.Shared(), 0, True),
      (["x"], 11, 4, {}, completion_lib.Shared(), None, False),
  ]
  cases = [cases[i] for i in which]
  sinks = [submit(scheduler, model, prompts, seed=seed, max_tokens=n,
                  options=options, shared=shared, logprobs=k,
                  prompt_logprobs=echo)
           for prompts, n, seed, options, shared, k, echo in cases]
  scheduler.start()
  try:
    for sink in sinks:
      assert sink.done.wait(120)
  finally:
    assert scheduler.close(timeout=10)
  for (prompts, n, seed, options, shared, k, echo), sink in zip(cases, sinks):
    texts, scores = reference(
        model, prompts, n, seed, options, shared, jit_compile=jit,
        no_repeat_ngram_size=shared.no_repeat_ngram_size, return_scores=True)
    for i, prompt in enumerate(prompts):
      assert sink.text(i) == texts[i]
      ids = sink.ids(i)
      first = sink.updates[i][0]
      if k is None:
        assert all(u.token_logprobs is None and u.top_ids is None
                   for u in sink.updates[i])
        assert first.prompt_logprobs is None
        continue
      for u in sink.updates[i]:  # Each update's entries are its ids'.
        assert len(u.token_logprobs) == len(u.ids) == u.tokens
      prompt_ids = model.encode(prompt)
      whole = np.concatenate([prompt_ids, ids])
      distribution = _log_softmax(rnnstep.logits(model, whole[None])[0])
      after = distribution[len(prompt_ids) - 1:-1]  # Before each new id.
      token_logprobs = sink.joined(i, "token_logprobs")
      np.testing.assert_allclose(
          token_logprobs, after[np.arange(len(ids)), ids], atol=1e-5)
      _check_top(sink.joined(i, "top_ids"), sink.joined(i, "top_logprobs"),
                 after, k)
      assert float(np.sum(token_logprobs, dtype=np.float64)) == pytest.approx(
          scores[i], rel=1e-5, abs=1e-4)
      if echo:
        before = distribution[:len(prompt_ids) - 1]
        np.testing.assert_allclose(
            first.prompt_logprobs,
            before[np.arange(len(prompt_ids) - 1), prompt_ids[1:]],
            atol=1e-5)
        _check_top(first.prompt_top_ids, first.prompt_top_logprobs, before,
                   k)
        assert all(u.prompt_logprobs is None for u in sink.updates[i][1:])
      else:
        assert first.prompt_logprobs is None
  if path == paths.GRAPH:  # New k, echo or not: nothing traced after warm_up.
    assert (scheduler.generator.programs.serve_fn
            .experimental_get_tracing_count()) == traces


def test_logprobs_are_the_raw_model_s_per_id_graph(model):
  _logprobs_case(model, "graph")


@pytest.mark.exhaustive  # The graph case runs by default.
def test_logprobs_are_the_raw_model_s_per_id_xla(model):
  _logprobs_case(model, "xla", which=(0, 2))  # Fewer batch sizes to compile.


@pytest.mark.exhaustive  # The graph case runs by default.
def test_logprobs_are_the_raw_model_s_per_id_elementwise(model):
  _logprobs_case(model, "elementwise", which=(0, 2))


def test_a_checked_pattern_is_not_compiled_again_by_the_scheduler(model):
  """The server's check compiles a pattern within its limits and hands it
  over with the stop automaton (`Completion(pattern=, stop_automaton=)`):
  the scheduler lays it out as it is, without compiling it again (outside
  any limit) once the compile cache has let it go; the text is the
  library's."""
  prompts = ["ROMEO:", "a"]
  shared = completion_lib.Shared(stop=("xq",), regex="[a-z ]{3,12}\\.")
  pattern = constraints.compile_pattern(model, shared.regex)
  automaton = host.stop_automaton(model, shared.stop)
  constraints._compile.cache_clear()  # pylint: disable=protected-access
  scheduler = make_scheduler(model)
  sink = submit(scheduler, model, prompts, seed=5, max_tokens=14,
                shared=shared, stop_automaton=automaton, pattern=pattern)
  scheduler.start()
  try:
    assert sink.done.wait(120)
  finally:
    assert scheduler.close(timeout=10)
  # pylint: disable-next=protected-access
  assert constraints._compile.cache_info().misses == 0
  texts = reference(model, prompts, 14, 5, shared=shared)
  assert [sink.text(i) for i in range(len(prompts))] == texts


def test_logprobs_beyond_five_are_refused(model):
  with pytest.raises(ValueError, match="logprobs"):
    completion_lib.Completion([model.encode("a")], [options_lib.DEFAULTS],
                              seed=0, max_tokens=1,
                              shared=completion_lib.Shared(),
                              want_scores=False, sink=None, logprobs=6)


def test_the_scheduler_survives_failing_rounds(model, monkeypatch):
  """A failure outside any row (here the admission) fails no running row
  the first time: the thread goes on, and the rows run as `generate`'s;
  failing again before any row ran, it retires the first waiting row, so
  that a persistent failure cannot hold the queue."""
  scheduler = make_scheduler(model)
  admit = scheduler._admit  # pylint: disable=protected-access
  failures = []

  def failing(going_on):
    if len(failures) < failures_wanted[0]:
      failures.append(1)
      raise RuntimeError("admission exploded")
    return admit(going_on)

  failures_wanted = [1]
  monkeypatch.setattr(scheduler, "_admit", failing)
  sink = submit(scheduler, model, ["ROMEO:", "a"], seed=3, max_tokens=14)
  scheduler.start()
  try:
    assert sink.done.wait(60)
    assert failures == [1]
    assert [sink.text(i) for i in range(2)] == reference(
        model, ["ROMEO:", "a"], 14, 3)
    failures.clear()
    failures_wanted[0] = 2
    sink = submit(scheduler, model, ["ROMEO:", "a"], seed=3, max_tokens=14)
    assert sink.done.wait(60)
  finally:
    assert scheduler.close(timeout=10)
  assert sink.reason(0) == "error"
  assert "admission exploded" in sink.updates[0][-1].message
  assert sink.text(1) == reference(model, ["ROMEO:", "a"], 14, 3)[1]


# -- XLA programs compiled in the background ----------------------------------


@pytest.mark.slow  # One XLA compile (seconds).
def test_a_row_begun_on_the_graph_path_goes_on_under_xla_once_compiled(
    uncompiled_model):
  """With `compile_in_background` the scheduler serves before its XLA program
  is compiled: the row's first chunks run on the graph path while the
  program compiles, the next ones (its carry from the host) under XLA, and
  its text is `generate`'s on either path. (A model of its own architecture:
  with the tiny one's, an earlier test's XLA calls had compiled it.)"""
  model = uncompiled_model
  scheduler = make_scheduler(model, path="xla", max_batch=1, chunk_steps=4,
                             compile_in_background=True)
  scheduler.warm_up()  # The graph path traced; one shape queued (1 row).
  compiling_at_first = []
  sink = Collector(1)

  def first_waits_for_the_compile(update):
    if not compiling_at_first:
      compiling_at_first.append(scheduler.compiling)
      while scheduler.compiling:  # Holds the thread: the next chunk is XLA's.
        time.sleep(0.05)
    sink(update)

  options = dict(temperature=0.8, top_k=20)
  params = options_lib.Params(**{o.name: options.get(o.name, o.default)
                                 for o in options_lib.PER_ROW})
  scheduler.submit(completion_lib.Completion(
      [model.encode("ROMEO:")], [params], seed=5, max_tokens=30,
      shared=completion_lib.Shared(stop=("zq",)), want_scores=False,
      sink=first_waits_for_the_compile))
  scheduler.start()
  try:
    assert sink.done.wait(300)
  finally:
    assert scheduler.close(timeout=10)
  assert compiling_at_first == [1]
  assert 1 <= scheduler.stats.interim_chunks < scheduler.stats.chunks
  # The graph path's text (XLA's agrees, README "Reproducibility"; its
  # `generate` would compile for seconds more).
  assert sink.text(0) == reference(model, ["ROMEO:"], 30, 5, options,
                                   completion_lib.Shared(stop=("zq",)))[0]
