"""The HTTP front end: OpenAI's completions API on Starlette, over the `Engine`.

Routes: `POST /v1/completions` (JSON, or server-sent events with
`stream: true`, ending with `data: [DONE]`), `GET /v1/models`, `GET /health`
(503 until the model's programs are warm, and while draining), `GET /metrics`
(Prometheus).

The device belongs to the engine's thread; a handler only checks the request
(the library's checks, `protocol.parse` and `api.check_request`, on a
checking thread: compiling a new `regex` over a large vocabulary takes
seconds, and the event loop must keep every stream flowing meanwhile),
submits a `engine.Completion` and awaits its `_Output`. The scheduler thread
hands each chunk's updates, every row's, to the event loop in one
`call_soon_threadsafe` (`Server._deliver`), where `_Output.add` takes them: a whole response only
collects its text until its last choice ends (no wake-up before), a stream's
handler is woken once a chunk and sends that chunk's events as one write, each
event's bytes formatted directly (`protocol.running_chunk`). A client that
goes away cancels its completion, whose rows the engine retires at the next
chunk boundary.

Errors use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`:
400 for a bad request (naming the field), 413 for a body over the limit
(refused from its Content-Length, or as it arrives, before any parsing), 429
with Retry-After when the queue is full, 503 while loading or draining.
"""

import asyncio
from concurrent import futures
import json
import time
import uuid
from typing import Optional

import numpy as np
import prometheus_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rnnstep import api
from rnnstep import errors
from rnnstep.decoding import options as options_lib
from rnnstep.engine import host
from rnnstep.serve import engine as engine_lib
from rnnstep.serve import protocol



class Metrics:
  """The server's Prometheus metrics, in a registry of its own."""

  def __init__(self, engine: engine_lib.Engine):
    self.registry = prometheus_client.CollectorRegistry()
    running = prometheus_client.Gauge(
        "rnnstep_requests_running", "Rows (choices) in the running batch.",
        registry=self.registry)
    running.set_function(lambda: engine.stats.running)
    waiting = prometheus_client.Gauge(
        "rnnstep_requests_waiting", "Rows (choices) waiting for a slot.",
        registry=self.registry)
    waiting.set_function(lambda: engine.stats.waiting)
    for name, field, doc in [
        ("rnnstep_chunks", "chunks", "Device calls (chunks) run."),
        ("rnnstep_mixed_settings_chunks", "mixed_chunks",
         "Chunks whose rows held more than one request's shared settings "
         "(stop strings, look-back, regex)."),
        ("rnnstep_scheduler_busy_seconds", "busy_seconds",
         "Scheduler time spent on chunks, admission to hand-out."),
        ("rnnstep_device_call_seconds", "device_seconds",
         "Of which inside the compiled call.")]:
      gauge = prometheus_client.Gauge(name, doc, registry=self.registry)
      gauge.set_function(lambda field=field: getattr(engine.stats, field))
    self.requests = prometheus_client.Counter(
        "rnnstep_requests", "Completion requests answered, by HTTP status.",
        ["status"], registry=self.registry)
    self.characters = prometheus_client.Counter(
        "rnnstep_generated_characters", "Characters generated.",
        registry=self.registry)
    self.first_character = prometheus_client.Histogram(
        "rnnstep_time_to_first_character_seconds",
        "From a request's arrival to its first generated characters.",
        registry=self.registry)
    self.inter_chunk = prometheus_client.Histogram(
        "rnnstep_inter_chunk_seconds",
        "Between successive updates of one request.", registry=self.registry)
    self.latency = prometheus_client.Histogram(
        "rnnstep_e2e_request_latency_seconds",
        "From a request's arrival to its last character.",
        registry=self.registry)


async def _cancel_on_disconnect(request: Request,
                                completion: engine_lib.Completion) -> None:
  """Cancels `completion` when its client disconnects (a task per request).

  The body has been read, so the next ASGI message is the disconnect: this
  waits for it instead of polling.
  """
  while (await request.receive())["type"] != "http.disconnect":
    pass
  completion.cancel()


def error_response(status: int, message: str, *, param: Optional[str] = None,
                   kind: str = "invalid_request_error",
                   code: Optional[str] = None, headers=None) -> JSONResponse:
  """An OpenAI error body with its HTTP status."""
  return JSONResponse(
      protocol.error_body(message, kind=kind, param=param, code=code),
      status_code=status, headers=headers)


class _Output:
  """One request's output, on the event loop (`engine.call_sinks` adds to it).

  A whole response collects its choices' text, reasons and scores, and
  resolves `done` when the last choice ends; a stream keeps its updates
  until its handler takes them, waking it (`waiter`) once per hand-off.

  Args:
    server: the `Server` (for its metrics).
    count: the request's choices.
    stream: whether it streams.
    arrived: when the request arrived (time.monotonic()).
  """

  def __init__(self, server: "Server", count: int, stream: bool,
               arrived: float):
    self.server = server
    self.count = count
    self.stream = stream
    self.arrived = arrived
    self.timing = [None, None]  # First update with text, last.
    self.generated = 0
    self.finished = 0
    self.updates = []  # A stream's updates not yet sent.
    self.waiter: Optional[asyncio.Future] = None
    self.texts = [""] * count
    self.reasons = ["length"] * count
    self.scores = [0.0] * count
    self.done = asyncio.get_running_loop().create_future()

  def add(self, update: engine_lib.Update) -> None:
    """Takes one update (the completion's sink, called on the loop)."""
    self.server.observe(update, self.timing, self.arrived)
    self.generated += update.tokens
    if self.stream:
      self.updates.append(update)
      if self.waiter is not None and not self.waiter.done():
        self.waiter.set_result(None)
      return
    self.texts[update.index] += update.text
    self.scores[update.index] = update.score
    if update.finish_reason is not None:
      self.reasons[update.index] = update.finish_reason
      self.finished += 1
      if self.finished == self.count and not self.done.done():
        self.done.set_result(None)

  async def take(self):
    """A stream's updates since the last call (waits for one at least).

    Returns:
      The list of `engine.Update`s, in the order the engine sent them.
    """
    while not self.updates:
      self.waiter = asyncio.get_running_loop().create_future()
      try:
        await self.waiter
      finally:
        self.waiter = None
    updates, self.updates = self.updates, []
    return updates


class Server:
  """The Starlette app and the state its handlers share.

  Args:
    model: the `rnnstep.Model` the engine runs.
    engine: the `engine_lib.Engine` (started by the caller).
    model_id: the name `/v1/models` lists and responses carry.
    max_body_bytes: the largest request body read.
  """

  def __init__(self, model, engine: engine_lib.Engine, *, model_id: str,
               max_body_bytes: int = 1 << 20):
    self.model = model
    self.engine = engine
    self.model_id = model_id
    self.max_body_bytes = max_body_bytes
    self.ready = False
    self.draining = False
    self.created = int(time.time())
    self.metrics = Metrics(engine)
    self._loop = None  # The event loop, when the first request comes.
    # Two, so that a request's checks seldom wait behind another's regex
    # compile, and at most two compiles' tables are being built at once.
    self._checking = futures.ThreadPoolExecutor(
        max_workers=2, thread_name_prefix="rnnstep-check")
    engine.deliver = self._deliver
    self.app = Starlette(routes=[
        Route("/v1/completions", self.completions, methods=["POST"]),
        Route("/v1/models", self.models, methods=["GET"]),
        Route("/health", self.health, methods=["GET"]),
        Route("/metrics", self.metrics_page, methods=["GET"]),
    ])

  # -- small routes ----------------------------------------------------------

  async def health(self, request: Request) -> Response:
    del request
    if self.draining:
      return error_response(503, "the server is shutting down",
                            kind="service_unavailable")
    if not self.ready:
      return error_response(503, "loading the model and compiling its "
                            "programs", kind="service_unavailable")
    return JSONResponse({"status": "ok"})

  async def models(self, request: Request) -> Response:
    del request
    return JSONResponse({"object": "list", "data": [{
        "id": self.model_id, "object": "model", "created": self.created,
        "owned_by": "rnnstep"}]})

  async def metrics_page(self, request: Request) -> Response:
    del request
    return Response(prometheus_client.generate_latest(self.metrics.registry),
                    media_type=prometheus_client.CONTENT_TYPE_LATEST)

  # -- completions -----------------------------------------------------------

  def _answer(self, response: Response) -> Response:
    self.metrics.requests.labels(str(response.status_code)).inc()
    return response

  async def _read_body(self, request: Request):
    """The body, or an error response when it is over the limit."""
    declared = request.headers.get("content-length")
    too_big = error_response(
        413, f"the request body is over {self.max_body_bytes} bytes",
        code="request_too_large")
    if declared is not None and declared.isdigit() and (
        int(declared) > self.max_body_bytes):
      return None, too_big
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > self.max_body_bytes:
        return None, too_big
      chunks.append(chunk)
    return b"".join(chunks), None

  async def completions(self, request: Request) -> Response:
    """`POST /v1/completions`."""
    if self.draining or not self.ready:
      return self._answer(error_response(
          503, "the server is shutting down" if self.draining else
          "the model is still loading", kind="service_unavailable"))
    arrived = time.monotonic()
    raw, refused = await self._read_body(request)
    if refused is not None:
      return self._answer(refused)
    try:
      body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
      return self._answer(error_response(
          400, f"the body is not valid JSON: {e}", param="body"))
    try:
      checked = await asyncio.get_running_loop().run_in_executor(
          self._checking, self._check, body)
      parsed, completion, output = self._completion(checked, arrived)
    except errors.ArgumentError as e:
      return self._answer(error_response(
          400, str(e), param=protocol.param_of(e.argument)))
    if completion is not None:
      try:
        self.engine.submit(completion)
      except engine_lib.QueueFull:
        return self._answer(error_response(
            429, "the server's queue is full; retry shortly",
            kind="rate_limit_error", code="queue_full",
            headers={"Retry-After": "1"}))
      except engine_lib.ShuttingDown:
        return self._answer(error_response(
            503, "the server is shutting down", kind="service_unavailable"))
    request_id = f"cmpl-{uuid.uuid4().hex}"
    if parsed.stream:
      self.metrics.requests.labels("200").inc()
      # Server-sent events as bytes on Starlette's streaming response (as
      # vLLM's OpenAI server sends them), with sse-starlette's headers.
      return StreamingResponse(
          self._events(request_id, parsed, completion, output),
          media_type="text/event-stream",
          headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    return self._answer(await self._whole(request, request_id, parsed,
                                          completion, output))

  def _check(self, body):
    """Checks a request (on a checking thread); what `_completion` takes.

    Args:
      body: the parsed JSON body.

    Returns:
      (parsed request, rows' prompts, checked options, prompt ids, lengths).

    Raises:
      errors.ArgumentError: naming the field at fault.
    """
    engine = self.engine
    parsed = protocol.parse(
        body, max_tokens_limit=engine.max_tokens_limit,
        max_batch=engine.max_batch, max_prompt_chars=engine.max_prompt_chars)
    if parsed.seed is None:  # A fresh seed, reported so it can be replayed.
      parsed.seed = int(np.random.SeedSequence().generate_state(
          1, np.uint64)[0] >> 1)
    rows = [p for p in parsed.prompts for _ in range(parsed.n)]
    try:
      _, options = api.check_request(
          self.model, rows, parsed.max_tokens, seed=parsed.seed,
          stop=parsed.stop, regex=parsed.regex,
          return_scores=parsed.logprobs, **parsed.decoding)
    except TypeError as e:  # Not reached: `parse` admits declared names only.
      raise protocol.BadRequest("body", str(e)) from None
    # The library's encoding check, in its words ("prompt 0: character ...").
    prompt_ids, prompt_lengths = host.prompt_batch(self.model, rows)
    # Usage counts ids, as OpenAI's counts tokens: each prompt once, not n.
    parsed.prompt_tokens = int(sum(prompt_lengths[::parsed.n]))
    parsed.stop = protocol.stop_strings(parsed.stop)
    host.stop_automaton(self.model, parsed.stop)  # Its checks: empty, unknown.
    parsed.created = int(time.time())  # One for all its chunks, as OpenAI's.
    return parsed, rows, options, prompt_ids, prompt_lengths

  def _completion(self, checked, arrived: float):
    """Makes a checked request's `Completion` (None for max_tokens 0) and
    `_Output` (on the event loop, whose futures the output holds).

    Args:
      checked: `_check`'s result.
      arrived: when the request came (`time.monotonic()`).

    Returns:
      (parsed request, `Completion` or None, `_Output` or None).
    """
    parsed, rows, options, prompt_ids, prompt_lengths = checked
    if parsed.max_tokens == 0:
      return parsed, None, None
    self._loop = asyncio.get_running_loop()
    output = _Output(self, len(rows), parsed.stream, arrived)
    params = options_lib.Params(*[
        np.broadcast_to(np.asarray(value), [len(rows)])
        for value in options.sampling])
    completion = engine_lib.Completion(
        [ids[:length] for ids, length in zip(prompt_ids, prompt_lengths)],
        [options_lib.Params(*[field[k].item() for field in params])
         for k in range(len(rows))],
        seed=parsed.seed, max_tokens=parsed.max_tokens,
        shared=engine_lib.Shared(
            stop=parsed.stop, repetition_window=int(options.repetition_window),
            no_repeat_ngram_size=int(options.no_repeat_ngram_size),
            regex=parsed.regex),
        want_scores=parsed.logprobs, sink=output.add)
    return parsed, completion, output

  def _deliver(self, updates) -> None:
    """The engine's `deliver` (scheduler thread): a round's updates to the
    event loop in one hand-off (one wake-up of the loop a chunk, not one a
    row).

    Args:
      updates: [(Completion, Update)] of the round.

    Raises:
      RuntimeError: the loop is closed (the engine cancels their rows).
    """
    self._loop.call_soon_threadsafe(engine_lib.call_sinks, updates)

  def _choice(self, parsed, index: int, text: str, reason, score):
    return {"index": index, "text": text,
            "logprobs": ({"text_log_likelihood": score} if parsed.logprobs
                         and reason is not None else None),
            "finish_reason": reason}

  def _final_text(self, parsed, text: str, reason) -> str:
    if reason == "stop" and not parsed.include_stop_str_in_output:
      return protocol.trim_stop(text, parsed.stop)
    return text

  def _usage(self, parsed, generated: int):
    prompt = parsed.prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated}

  def _envelope(self, request_id: str, parsed, choices, usage=None):
    out = {"id": request_id, "object": "text_completion",
           "created": parsed.created, "model": self.model_id,
           "seed": parsed.seed, "choices": choices}
    if usage is not None:
      out["usage"] = usage
    return out

  def observe(self, update, state, arrived: float):
    """Updates the metrics for one update; `state` is [first seen, last]."""
    now = time.monotonic()
    if update.text:
      self.metrics.characters.inc(len(update.text))
      if state[0] is None:
        state[0] = now
        self.metrics.first_character.observe(now - arrived)
      elif state[1] is not None:
        self.metrics.inter_chunk.observe(now - state[1])
      state[1] = now

  async def _whole(self, request: Request, request_id: str, parsed,
                   completion, output: _Output) -> Response:
    """The non-streamed answer, once every choice has finished."""
    count = len(parsed.prompts) * parsed.n
    if completion is None:
      texts, reasons = [""] * count, ["length"] * count
      scores, generated = [0.0] * count, 0
    else:
      watcher = asyncio.create_task(_cancel_on_disconnect(request, completion))
      try:
        await output.done
        went_away = watcher.done()
      except asyncio.CancelledError:  # uvicorn's drain timed out.
        completion.cancel()
        raise
      finally:
        watcher.cancel()
      if went_away:  # The client went away; its rows are retired.
        return error_response(499, "the client went away")
      self.metrics.latency.observe(time.monotonic() - output.arrived)
      texts, reasons = output.texts, output.reasons
      scores, generated = output.scores, output.generated
      if "error" in reasons:
        return error_response(500, "generation failed", kind="server_error")
      if "cancelled" in reasons:
        return error_response(503, "the server shut down before this "
                              "request finished", kind="service_unavailable")
    choices = [self._choice(parsed, k, self._final_text(parsed, texts[k],
                                                        reasons[k]),
                            reasons[k], scores[k]) for k in range(count)]
    return JSONResponse(self._envelope(request_id, parsed, choices,
                                       self._usage(parsed, generated)))

  async def _events(self, request_id: str, parsed, completion,
                    output: _Output):
    """The server-sent events of a streamed answer, as bytes: one write per
    chunk (every choice's event of it)."""
    count = len(parsed.prompts) * parsed.n
    hold = 0 if parsed.include_stop_str_in_output else protocol.held_back(
        parsed.stop)
    pending = [""] * count  # Per choice: text held back from the stream.
    head = protocol.chunk_head(self._envelope(request_id, parsed, []))
    try:
      if completion is None:  # max_tokens 0: one empty finished chunk each.
        generated = 0
        yield b"".join(protocol.json_event(self._envelope(
            request_id, parsed, [self._choice(parsed, k, "", "length", 0.0)]
        )) for k in range(count))
      else:
        finished, failed = 0, False
        while finished < count and not failed:
          frames = []
          for update in await output.take():
            if update.finish_reason in ("cancelled", "error"):
              frames.append(protocol.json_event(protocol.error_body(
                  "the server shut down before this request finished"
                  if update.finish_reason == "cancelled" else
                  "generation failed", kind="server_error")))
              failed = True
              break
            text = pending[update.index] + update.text
            if update.finish_reason is None:
              cut = max(len(text) - hold, 0)
              text, pending[update.index] = text[:cut], text[cut:]
              if text:
                frames.append(protocol.running_chunk(head, update.index,
                                                     text))
              continue
            finished += 1
            text = self._final_text(parsed, text, update.finish_reason)
            frames.append(protocol.json_event(self._envelope(
                request_id, parsed, [self._choice(
                    parsed, update.index, text, update.finish_reason,
                    update.score)])))
          if frames:
            yield b"".join(frames)
        generated = output.generated
        self.metrics.latency.observe(time.monotonic() - output.arrived)
      tail = []
      if parsed.include_usage:
        tail.append(protocol.json_event(self._envelope(
            request_id, parsed, [], self._usage(parsed, generated))))
      tail.append(protocol.event("[DONE]"))
      yield b"".join(tail)
    finally:  # Also when the client went away (the generator is cancelled).
      if completion is not None:
        completion.cancel()
