"""A completion request's check, on threads of its own, within bounds.

A request's values were checked once, by the library's one check, when it
was read (`protocol.checked_request`). Its check against the model (the
library's, `api.check_record`, which compiles a `regex`; then the stop
automaton) runs on a checking thread within a deadline and a bounded
queue: requests being checked count toward `--max_queue` with the rows
waiting (429 past it), requests with a pattern are checked on threads of
their own (so a pattern that takes long to refuse delays no plain request),
and shutdown abandons any check (`constraints.limits`). What the check
builds (the stop automaton, the compiled pattern) travels with the
completion (`completion_of`): the scheduler never builds it again,
unbounded.
"""

import asyncio
import dataclasses
import threading
import time

import numpy as np

from rnnstep import api
from rnnstep import errors
from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.engine import host
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import prefix_cache
from rnnstep.serve import http
from rnnstep.serve import protocol
from rnnstep.serve import tables


class RequestChecks:
  """Checks completion requests on daemon threads, a bounded number at once.

  Args:
    model: the served `rnnstep.Model`.
    scheduler: the `scheduler.Scheduler` (or `lanes.Lanes`) that runs them
      (its limits, and its rows running and waiting).
    max_queue: rows waiting and being checked at most, beyond the free
      slots.
    check_seconds: the time a request's check may take (400 past it).
  """

  def __init__(self, model, scheduler, *, max_queue: int,
               check_seconds: float):
    self.model = model
    self.scheduler = scheduler
    self.max_queue = int(max_queue)
    self.check_seconds = float(check_seconds)
    # Requests without a pattern are checked on threads of their own, so
    # that none waits behind a pattern's compile; two of each.
    self._checking = http.CheckPool(2, "rnnstep-check")
    self._checking_patterns = http.CheckPool(2, "rnnstep-check-regex")
    self._checking_rows = 0  # Rows of the requests being checked.
    # Each distinct stop list's automaton, made once: a token model's is
    # a pass over the whole vocabulary (52 ms for the world vocabulary's,
    # the chat route's end of turn in every request), which a burst's
    # requests would otherwise each pay on a core the device calls need.
    self._stop_automata = tables.Lru(256)
    self._abandon = threading.Event()  # Set at shutdown: checks stop.

  def abandon(self) -> None:
    """Stops the checks running and to come (`constraints.Cancelled`)."""
    self._abandon.set()

  async def checked(self, parsed: protocol.CheckedRequest):
    """Runs `check` on a checking thread, within the queue's bound.

    Raises:
      Refused: 429 when the rows waiting and being checked would pass
        `max_queue` beyond the free slots; 400 from the check.
    """
    rows = len(parsed.prompts) * parsed.n
    stats = self.scheduler.stats
    free = max(self.scheduler.max_batch - stats.running, 0)
    if self._checking_rows + stats.waiting + rows > self.max_queue + free:
      raise http.Refused(http.queue_full())
    pool = self._checking_patterns if parsed.regex else self._checking
    self._checking_rows += rows
    try:
      return await asyncio.get_running_loop().run_in_executor(
          pool, self.check, parsed)
    except errors.ArgumentError as e:
      if (parsed.prompt_field != "prompt"
          and protocol.param_of(e.argument) == "prompt"):
        # A chat request's prompt is its rendered messages.
        e = protocol.BadRequest(parsed.prompt_field,
                                f"the conversation's prompt: {e}")
      raise http.bad_request(e) from None
    except constraints.Cancelled:
      raise http.Refused(http.shutting_down()) from None
    finally:
      self._checking_rows -= rows

  async def run(self, fn, *args):
    """`fn(*args)` on a checking thread (a chat template's rendering, which
    may take up to its bounds: not on the event loop)."""
    return await asyncio.get_running_loop().run_in_executor(
        self._checking, fn, *args)

  def check(self, parsed: protocol.CheckedRequest):
    """Checks a request (on a checking thread); what `completion_of` takes.

    Args:
      parsed: the validated request.

    Returns:
      (the request with what the check found, a new frozen one; rows'
      prompts; checked options).

    Raises:
      errors.ArgumentError: naming the field at fault.
      constraints.Cancelled: the server is shutting down.
    """
    with constraints.limits(deadline=time.monotonic() + self.check_seconds,
                            cancelled=self._abandon):
      return self._check_within_limits(parsed)

  def _check_within_limits(self, parsed: protocol.CheckedRequest):
    limit = self.scheduler.max_prompt_tokens
    rows = parsed.record.prompts  # Each prompt n times.
    if self.model.tokens.kind in ("characters", "bytes"):
      # A character is at least one id: refused before it is encoded.
      for i, text in enumerate(parsed.prompts):
        if isinstance(text, str) and len(text) > limit:
          raise protocol.BadRequest(
              parsed.prompt_field, f"prompt {i} has {len(text)} characters, "
              f"at least as many tokens; this server takes at most {limit} "
              "(--max_prompt_tokens)")
    record = parsed.record
    if record.seed is None:  # A fresh seed, reported so it can be replayed.
      record = dataclasses.replace(record, seed=int(
          np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1))
    options = api.check_record(self.model, record)
    # The library's encoding check, in its words ("prompt 0: character ...").
    prompt_ids, prompt_lengths = host.prompt_batch(self.model,
                                                   parsed.prompts)
    for i, length in enumerate(prompt_lengths):
      if length > limit:
        raise protocol.BadRequest(
            parsed.prompt_field, f"prompt {i} is {length} tokens (the "
            f"model's ids); this server takes at most {limit} "
            "(--max_prompt_tokens)")
    # What the checks found, into a new frozen request: usage counts ids, as
    # OpenAI's counts tokens (each prompt once, not n); the stop strings and
    # the pattern are compiled here, within the check's limits, once (the
    # scheduler takes them as they are, `completion.Completion`).
    parsed = dataclasses.replace(
        parsed, record=record, prompt_tokens=int(sum(prompt_lengths)),
        # Token-id prompts as text, for an echo (the rows keep the ids).
        prompts=tuple(host.prompt_text(self.model, prompt)
                      for prompt in parsed.prompts),
        prompt_ids=[ids[:length] for ids, length in
                    zip(prompt_ids, prompt_lengths) for _ in range(parsed.n)],
        stop_automaton=self._stop_automata.get_or_make(
            record.stop, lambda: host.stop_automaton(self.model,
                                                     record.stop)),
        pattern=(None if parsed.regex is None  # Compiled by the check.
                 else constraints.compile_pattern(self.model, parsed.regex)),
        created=int(time.time()),  # One for all its chunks, as OpenAI's.
        cache_points=prefix_cache.token_offsets(
            self.model.encode, parsed.prompts[0], prompt_ids[0][
                :prompt_lengths[0]], parsed.cache_points)
        if parsed.cache_points else ())
    return parsed, list(rows), options

def completion_of(checked, sink) -> completion_lib.Completion:
  """A checked request's `Completion` (`RequestChecks.check`'s result).

  Args:
    checked: `(parsed request, rows' prompts, checked options)`.
    sink: where its updates go (`Completion`'s).
  """
  parsed, rows, options = checked
  params = options_lib.Params(*[
      np.broadcast_to(np.asarray(value), [len(rows)])
      for value in options.sampling])
  return completion_lib.Completion(
      parsed.prompt_ids,
      [options_lib.Params(*[field[k].item() for field in params])
       for k in range(len(rows))],
      seed=parsed.seed, max_tokens=parsed.max_tokens,
      shared=completion_lib.Shared(
          stop=parsed.stop, repetition_window=int(options.repetition_window),
          no_repeat_ngram_size=int(options.no_repeat_ngram_size),
          regex=parsed.regex),
      want_scores=parsed.logprobs is not None, logprobs=parsed.logprobs,
      prompt_logprobs=parsed.echo and parsed.logprobs is not None,
      sink=sink, stop_automaton=parsed.stop_automaton,
      pattern=parsed.pattern, state=parsed.state,
      cache_points=parsed.cache_points)
