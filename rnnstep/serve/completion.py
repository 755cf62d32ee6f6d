"""A request's records on the scheduler's side: its rows and their output.

A `Completion` is one request's rows (`Row`: one choice each) with the
settings they share (`Shared`) and the sink their `Update`s go to; the
scheduler (`scheduler.py`) runs the rows and hands each chunk's updates out
through `call_sinks` (or the server's hand-off to its event loop). A queue
that cannot take a request raises `QueueFull`, a closing one `ShuttingDown`.
"""

import dataclasses
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.decoding import pipeline
from rnnstep.decoding import stopping

# The most alternatives a `logprobs` request may ask per id (OpenAI's limit).
TOP_LOGPROBS = pipeline.TOP_LOGPROBS


class Shared(NamedTuple):
  """The settings a request shares by all its rows (a library `Request`'s
  shared settings), carried per row by the scheduler (`tables.py`).

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
      end), "length" (`max_tokens`), "cancelled" (the scheduler closed first,
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


NO_IDS = np.zeros([0], np.int32)


def ended(row: "Row", reason: str, message: Optional[str] = None) -> Update:
  """The last update of a row that ends with nothing more to hand out."""
  return Update(row.index, "", reason, 0.0, 0, NO_IDS, message=message)


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
      carried `stop_state` points into (`tables.ChunkTables.joined`).
    dfa_offset: where its regex DFA starts in the joined DFA its carried
      `dfa_state` points into (`constraints.FREE`: no pattern).
    prompt_scores: its prompt's `(logprobs, top_ids, top_logprobs)` until
      its first update carries them (`Completion.prompt_logprobs`).
    start_state: the state its priming starts from, one row's arrays per
      layer (its completion's named state, or the prefix cache's state
      after its first `primed` ids), until its first call; None: zeros.
    cache_points: prompt offsets (ascending) where a priming piece ends,
      so that the state there is stored in the prefix cache
      (`Completion.cache_points`, and where the prompt parts from a
      recent one).
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
  start_state: Optional[tuple] = None
  cache_points: Tuple[int, ...] = ()

  def take_output(self, r: int, result, tokens) -> Update:
    """Its update from a call's result (it was the call's row `r`): the ids
    it has room for, their text and log-probabilities, and why it ended.

    Args:
      r: its row in the call.
      result: the call's `(ids, lengths, scores, done, logprobs)`.
      tokens: the model's `vocabulary.Tokens` (its text's decoder).
    """
    ids, lengths, scores, done, logprobs = result
    completion = self.completion
    room = completion.max_tokens - self.produced
    new = ids[r, :min(int(lengths[r]), room)]
    if done[r] and int(lengths[r]) <= room:
      reason = "stop"
    elif self.produced + len(new) >= completion.max_tokens:
      reason = "length"
    else:
      reason = None
    if self.text is None:
      self.text = tokens.stream(completion.shared.stop)
    text = self.text.push(new) + (self.text.finish() if reason else "")
    extra = {}
    k = completion.logprobs
    if k is not None:  # Copies: the call's buffers are not held.
      extra.update(
          token_logprobs=logprobs.chosen[r, :len(new)].copy(),
          top_ids=logprobs.top_ids[r, :len(new), :k].copy(),
          top_logprobs=logprobs.top_logprobs[r, :len(new), :k].copy())
    if self.prompt_scores is not None:
      extra.update(zip(("prompt_logprobs", "prompt_top_ids",
                        "prompt_top_logprobs"), self.prompt_scores))
      self.prompt_scores = None
    self.produced += len(new)
    return Update(self.index, text, reason,
                  float(scores[r]) if completion.want_scores else 0.0,
                  len(new), new.copy(), **extra)


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
    sink: called with each `Update`, through the scheduler's `deliver` (by
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
    cache_points: prompt offsets (in ids) where the state is worth keeping
      in the server's prefix cache, for every row (a chat's message
      boundaries: the prompts to come share the prefix up to them); the
      scheduler ends a priming piece at each, which changes no text.
    state: the name of the initial state its rows start from (the
      scheduler's `states`), or None: the scheduler's default.

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
               pattern: Optional[constraints.Pattern] = None,
               cache_points: Sequence[int] = (),
               state: Optional[str] = None):
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
    self.cache_points = tuple(sorted({int(p) for p in cache_points}))
    self.state = state
    # Per distinct prompt (its bytes), its prompt log-probabilities: the
    # rows of a prompt's n choices share one computation.
    self.prompt_scores = {}
    self.cancelled = False
    self.submitted_at = time.monotonic()
    self.rows = [Row(self, k, np.asarray(ids, np.int32), p,
                     cache_points=self.cache_points)
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
  """The scheduler admits nothing more (answer 503)."""


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


def describe(error: Exception) -> str:
  """An exception in one line, for an `Update.message`: its type and the
  first line of its message that says what failed (a TensorFlow error's
  message opens with its graph's call stack)."""
  lines = [line for line in str(error).splitlines()
           if line.strip() and not line.startswith((" ", "\t"))
           and not line.startswith(("Graph execution error",
                                    "Detected at node"))]
  return type(error).__name__ + (f": {lines[0][:300]}" if lines else "")

