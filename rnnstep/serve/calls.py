"""One scheduler's device calls: their arguments, programs and warm-up.

A call runs the library's compiled `Programs.serve_fn` over the rows of a
chunk: carried rows decode on from their numpy `Carry` (on the host between
chunks, where retiring and admitting rows is a gather), fresh rows prime
their prompt (or its next piece, at most `prime_chars` ids) in the same
call. Every setting travels per row (`options.PER_ROW` and the seed as
`[B]` values, the look-back settings as `processors.Settings`' `[B]`
values, the stop and regex tables joined, `tables.py`), so rows of any
settings run in one call, and the call's batch is the row count padded as
`request.build` pads it: no value of a request compiles anything new after
`ChunkCalls.warm_up`. Under XLA with `compile_in_background`, a call whose
shapes' program is not compiled yet runs the graph path's `serve_fn` on the
same arguments while a thread compiles it (`compiling.py`); rows go on from
one path to the other between chunks, with the same text.
"""

import time
from typing import List, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from rnnstep.decoding import options as options_lib
from rnnstep.decoding import processors
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import request as request_lib
from rnnstep.engine import compiling
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import tables as tables_lib


class Prepared(NamedTuple):
  """A row's host work for a call (`ChunkCalls.prepare`).

  Attributes:
    piece: int32, the prompt ids it primes in this call
      (`ChunkCalls.piece`), or None: it decodes on from its carried state.
    history: its one-row `processors.History` after its whole prompt,
      where its last piece starts here (`ChunkCalls.history`), else None.
    primes_only: its piece is not its prompt's last: it only primes.
    start_state: the state its piece starts from where it is not carried
      (`Row.start_state`: a named state, or the prefix cache's), else None
      (zeros, or its carried state).
  """
  piece: Optional[np.ndarray]
  history: Optional[processors.History]
  primes_only: bool
  start_state: Optional[tuple] = None


class ChunkCalls:
  """Builds and runs one scheduler's device calls.

  Args:
    model: the `rnnstep.Model` (replicated already under a strategy).
    path: the concrete execution path ("xla", "graph", "elementwise").
    max_batch: rows a call runs at most.
    chunk_steps: steps per call at most.
    max_tokens_limit: the largest `max_tokens` a row may ask.
    max_prompt_tokens: the longest prompt, in ids.
    stats: the scheduler's `Stats` (the calls count theirs in it).
    strategy: None, or the `tf.distribute.Strategy` the rows split over.
    compile_in_background: as `Scheduler`'s.

  Attributes:
    generator: the path's `Generator`.
    prime_chars: the longest prompt piece one call primes.
    tables: the `tables.ChunkTables` of the calls.
    top: alternatives per id the calls record (`pipeline.step_logprobs`).
  """

  def __init__(self, model, *, path: str, max_batch: int, chunk_steps: int,
               max_tokens_limit: int, max_prompt_tokens: int, stats,
               strategy=None, compile_in_background: bool = False):
    self.model = model
    self.strategy = strategy
    self.stats = stats
    self.generator = generator_lib.cached(model, path)
    # Under XLA, with `compile_in_background`: the graph path's programs,
    # which run a call until its shape's XLA program is compiled, and the
    # compiler of those (`compiling.py`).
    self._interim = self._compiler = None
    if (compile_in_background and self.generator.path == paths.XLA
        and strategy is None):
      self._interim = generator_lib.cached(model, paths.GRAPH)
      self._compiler = compiling.for_programs(self.generator.programs)
    # On the graph path, a model whose cells compile small XLA programs per
    # batch size (RWKV-7) would compile them in the call of each row count
    # the lane first runs (0.5-1.1 s each, a Zen 4): the warm-up queues a
    # one-step call of every row count on the compiling thread instead.
    self._batch_warmer = None
    if (self.generator.path == paths.GRAPH and strategy is None
        and self.generator.compiles_per_batch):
      self._batch_warmer = compiling.for_programs(self.generator.programs)
    self.max_batch = int(max_batch)
    self.chunk_steps = int(chunk_steps)
    self.max_prompt_tokens = int(max_prompt_tokens)
    # A piece as long as a chunk: priming a piece costs about what the
    # chunk's decode steps cost, so a long prompt at most doubles one call.
    # At least 8 (XLA's narrowest prompt width; and a piece must be longer
    # than the character priming leaves unconsumed).
    self.prime_chars = max(self.chunk_steps, 8)
    self.unconsumed = self.generator.programs.unconsumed
    # The paths that compile XLA programs at a call's shapes (the whole
    # call under XLA; the elementwise path's decode step, at the batch and
    # the stop and regex tables' sizes) run at bucketed shapes, which the
    # warm-up compiles: no request compiles anything new after it.
    self._bucketed = self.generator.path != paths.GRAPH
    self.tables = tables_lib.ChunkTables(model, self._bucketed)
    # History width: a prompt and every step a row may take (it may run up
    # to a chunk past its max_tokens before it is retired).
    self._history_length = int(request_lib.bucket(
        self.max_prompt_tokens + int(max_tokens_limit) + self.chunk_steps,
        16))
    self._template = self._zero_carry()
    self.top = min(completion_lib.TOP_LOGPROBS, self.model.vocab_size)
    self._prompt_logprobs = generator_lib.prompt_logprobs_function(model)

  @property
  def compiling(self) -> int:
    """XLA programs still to compile (`compile_in_background`: calls of
    their shapes run on the graph path meanwhile; on the graph path, the row
    counts whose small programs the warm-up queued); 0 otherwise."""
    return sum(compiler.pending for compiler in (self._compiler,
                                                 self._batch_warmer)
               if compiler is not None)

  def forget_compiles(self) -> None:
    """Drops the programs these calls queued to compile, not yet begun."""
    for compiler in (self._compiler, self._batch_warmer):
      if compiler is not None:
        compiler.forget(self)

  def warm_up(self) -> None:
    """Traces (and where the path compiles, compiles) every program a
    request can need.

    On a bucketed path, one call per batch bucket up to `max_batch` and per
    distinct prompt width (`prompt_width`'s), each with and without
    scores: the elementwise path compiles the decode step of the plain and
    the general tail (`loop.run_decode`'s two branches) when a call first
    takes each. A call over carried rows, or over a long prompt's pieces,
    has the same shapes. The prompts' log-probabilities
    (`Completion.prompt_logprobs`) are a TF graph of any shape: traced
    once.

    With `compile_in_background` (under XLA), one call traces the graph
    path's program, and the XLA programs of the same shapes are queued on
    the compiling thread (`compiling.Compiler`), smallest batch first
    (shapes that calls ask for go ahead of them). On the graph path, for a
    model whose cells compile per batch size (`Generator.compiles_per_batch`),
    a one-step call of every other row count up to `max_batch` is queued on
    that thread, so that no request's call compiles them.
    """
    batches, widths = [1], [1]  # The graph path: one trace fits all.
    if self._bucketed:
      batches = sorted({request_lib.batch_bucket(n)
                        for n in range(1, self.max_batch + 1)})
      widths = sorted({self.prompt_width(1), self.prompt_width(
          min(self.prime_chars, self.max_prompt_tokens))})
    params = options_lib.DEFAULTS

    def dummy_call(batch, width, want_scores):
      """(rows, prepared) of a one-step call of these shapes."""
      dummy = completion_lib.Completion(
          [np.zeros([width], np.int32)] * batch, [params] * batch, seed=0,
          max_tokens=1, shared=completion_lib.Shared(),
          want_scores=want_scores, sink=lambda update: None)
      return dummy.rows, [self.prepare(row) for row in dummy.rows]

    shapes = [(batch, width) for batch in batches for width in widths]
    if self._compiler is None:
      for batch, width in shapes:
        for want_scores in (False, True):
          self.run(*dummy_call(batch, width, want_scores), carry=None,
                   steps=1)
      self._prompt_logprobs(np.zeros([1, 2], np.int32))
      if self._batch_warmer is not None:  # Every other row count, behind.
        for batch in range(2, self.max_batch + 1):
          args, _ = self._arguments(*dummy_call(batch, 1, False), carry=None,
                                    steps=1)
          self._batch_warmer.want(("rows", batch), self.generator, args,
                                  owner=self)
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

  # -- a row's host work -----------------------------------------------------

  def prepare(self, row: completion_lib.Row) -> Prepared:
    """A row's host work for the next call (its own: a failure here is its
    own, the scheduler retires it alone)."""
    self.tables.make_own(row.completion)
    if row.decoding:
      return Prepared(None, None, False)
    piece = self.piece(row)
    primes_only = row.primed + len(piece) < len(row.prompt_ids)
    return Prepared(piece, None if primes_only else self.history(row),
                    primes_only, row.start_state)

  def piece(self, row: completion_lib.Row,
            primed: Optional[int] = None) -> np.ndarray:
    """The ids a fresh row primes in this call: its prompt from where its
    state stands (`primed`, default `row.primed`), at most `prime_chars` of
    them, ending early where a cache point (`Row.cache_points`) falls
    inside: the call then leaves the state after exactly the point's ids (a
    piece's last `unconsumed` ids are left to the next)."""
    start = row.primed if primed is None else primed
    end = min(start + self.prime_chars, len(row.prompt_ids))
    for point in row.cache_points:
      if start < point and point + self.unconsumed < end:
        end = point + self.unconsumed
        break
    return row.prompt_ids[start:end]

  def boundaries(self, row: completion_lib.Row) -> List[int]:
    """The prompt lengths a row's state stands at between its priming
    pieces, primed from its start (`piece`'s, from `row.cache_points`):
    where the prefix cache may resume it with the arithmetic it has
    without the cache."""
    ends, primed = [], 0
    while True:
      end = primed + len(self.piece(row, primed))
      if end >= len(row.prompt_ids):
        return ends
      primed = end - self.unconsumed
      ends.append(primed)

  def history(self, row: completion_lib.Row) -> processors.History:
    """A one-row `History` after the row's whole prompt, on the host.

    `processors.start`'s values for the prompt (which `serve_fn` cannot
    make from a prompt primed in pieces): its ids, its length, the
    counts of its last `repetition_window` ids (all of them for 0), and no
    generated ids yet.
    """
    prompt = row.prompt_ids
    ids = np.zeros([1, self._history_length], np.int32)
    ids[0, :len(prompt)] = prompt
    window = row.completion.shared.repetition_window
    first = max(len(prompt) - window, 0) if window > 0 else 0
    counts = np.bincount(prompt[first:], minlength=self.model.vocab_size)
    return processors.History(ids, np.array([len(prompt)], np.int32),
                              counts.astype(np.int32)[None, :],
                              np.zeros_like(counts, np.int32)[None, :])

  def prompt_scores(self, prompt: np.ndarray):
    """`(logprobs [L-1], top_ids [L-1, K], top_logprobs [L-1, K])` of a
    prompt of L ids (`generator.prompt_logprobs_function`: one call)."""
    if len(prompt) < 2:
      return (np.zeros([0], np.float32), np.zeros([0, self.top], np.int32),
              np.zeros([0, self.top], np.float32))
    return tuple(np.asarray(x)[0] for x in self._prompt_logprobs(
        np.asarray(prompt, np.int32)[None, :]))

  def prompt_width(self, longest: int) -> int:
    """The prompt ids' width: under XLA one of two, so widths compile twice
    (powers of two: a model priming in chunks, RWKV-7, takes them as
    `request.chunked_width` would, as the library's requests do)."""
    if not self._bucketed:
      return longest
    narrow = request_lib.MIN_WIDTH  # What `request.build` pads to anyway.
    return narrow if longest <= narrow else tables_lib.power_of_two_at_least(
        min(self.prime_chars, self.max_prompt_tokens), narrow)

  # -- one device call -------------------------------------------------------

  def run(self, rows: List[completion_lib.Row], prepared: List[Prepared], *,
          carry, steps: int):
    """Runs `serve_fn` once over `rows`.

    The rows' own values (`Row.stop_offset`, `Row.dfa_offset`) change only
    once the call has returned: a failed call can be run again over a
    subset of its rows (`Scheduler._attempt`).

    Args:
      rows: the rows, carried ones first.
      prepared: their `Prepared` host work: a fresh row's prompt (or its
        prompt's next piece, `piece`) starts here.
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

  def _arguments(self, rows: List[completion_lib.Row],
                 prepared: List[Prepared], *, carry, steps: int):
    """`serve_fn`'s arguments (but the weights) for a call over `rows`.

    Args: as `run`'s.

    Returns:
      `((request, carry, fresh, primes_only), offsets)`: the arguments,
      padded to the call's batch (XLA's bucket), and per row its
      `(stop_offset, dfa_offset)` in the call's tables (`tables.place`).
    """
    batch = len(rows)
    fresh = np.array([p.piece is not None for p in prepared])
    primes_only = np.array([p.primes_only for p in prepared])
    tables = self.tables.joined(rows)
    pieces = {r: p.piece for r, p in enumerate(prepared)
              if p.piece is not None}
    longest = max([len(piece) for piece in pieces.values()] + [1])
    ids = np.zeros([batch, self.prompt_width(longest)], np.int32)
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
        chunked_prompts=self.generator.chunked_prompts,
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
      if p.start_state is not None and r >= carried:
        for whole, one in zip(tf.nest.flatten(carry.state),
                              tf.nest.flatten(p.start_state)):
          whole[r] = one
    offsets = tables_lib.place(rows, fresh, tables, carry)
    if len({row.completion.shared for row in rows}) > 1:
      self.stats.mixed_chunks += 1
    return (request, carry, fresh[index], primes_only[index]), offsets

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
    """A one-row numpy `Carry` of these calls' shapes (a fresh row's filler)."""
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
            np.zeros([1], np.int32), np.zeros([1, vocab_size], np.int32),
            np.zeros([1, vocab_size], np.int32)),
        scores=np.zeros([1], np.float32),
        dfa_state=np.zeros([1], np.int32))
