"""The server's HTTP side: who gets in, bounded bodies, errors, events, metrics.

Who gets in, outermost first (vLLM's and llama.cpp's choices): the Host
header is checked (`allowed_hosts`, Starlette's `TrustedHostMiddleware`,
against DNS rebinding); CORS answers browsers from `allowed_origins` only
(none by default); with API keys, every route but `OPEN_PATHS` needs
`Authorization: Bearer KEY` (compared in constant time; 401 otherwise,
`Gate`); a POST whose Content-Type is not JSON gets 415 (a web page can send
`text/plain` without asking the browser first). A completion that passes
all of these is answered without the middleware and FastAPI's routing
(`Front`, which makes the same checks in one pass over its headers); any
other request, refusals included, goes the app's way.

Every body is bounded by size (413, from its Content-Length or as it
arrives) and by time (408) before it is decoded (`read_body`,
`request_json`). The scheduler thread hands each chunk's updates to the
event loop in one hand-off, where `Output.add` takes them: a whole response
only collects its text until its last choice ends, a stream's handler is
woken once a chunk and sends that chunk's events as one write
(`EventStream`). A client that goes away cancels its completion
(`cancel_on_disconnect`).

Errors use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`,
on every status (`error_response`): 400 for a bad request (naming the
field), 401, 404 (an unknown route or model), 408, 413, 415, 429 with
Retry-After (`queue_full`), 503 while loading or draining, and 500 for a
fault of the server's, logged once with its request id (`fault`).
"""

import asyncio
from concurrent import futures
import hmac
import queue
import re
import threading
import time
from typing import Optional, Sequence
import uuid

from absl import logging
import prometheus_client
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rnnstep import errors
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import protocol


# Routes anyone who reaches the port may use (vLLM's and llama.cpp's).
OPEN_PATHS = ("/health", "/metrics", "/openapi.json")


class Metrics:
  """The server's Prometheus metrics, in a registry of its own."""

  def __init__(self, scheduler):
    self.registry = prometheus_client.CollectorRegistry()
    # What runs, for whoever measures it (tools/bench/serve.py reads it):
    # the compiled path (`auto` resolved) and the lanes.
    lanes = getattr(scheduler, "schedulers", [scheduler])
    prometheus_client.Info(
        "rnnstep_engine", "The compiled path the engine runs, and its lanes.",
        registry=self.registry).info({
            "path": lanes[0].generator.path, "lanes": str(len(lanes))})
    running = prometheus_client.Gauge(
        "rnnstep_requests_running", "Rows (choices) in the running batch.",
        registry=self.registry)
    running.set_function(lambda: scheduler.stats.running)
    waiting = prometheus_client.Gauge(
        "rnnstep_requests_waiting", "Rows (choices) waiting for a slot.",
        registry=self.registry)
    waiting.set_function(lambda: scheduler.stats.waiting)
    compiling = prometheus_client.Gauge(
        "rnnstep_programs_compiling", "XLA programs still to compile "
        "(their calls run on the graph path meanwhile).",
        registry=self.registry)
    compiling.set_function(lambda: scheduler.compiling)
    for name, field, doc in [
        ("rnnstep_chunks", "chunks", "Device calls (chunks) run."),
        ("rnnstep_mixed_settings_chunks", "mixed_chunks",
         "Chunks whose rows held more than one request's shared settings "
         "(stop strings, look-back, regex)."),
        ("rnnstep_scheduler_busy_seconds", "busy_seconds",
         "Scheduler time spent on chunks, admission to hand-out."),
        ("rnnstep_device_call_seconds", "device_seconds",
         "Of which inside the compiled call."),
        ("rnnstep_interim_chunks", "interim_chunks",
         "Chunks run on the graph path while their XLA program compiled "
         "(--background_compile).")]:
      gauge = prometheus_client.Gauge(name, doc, registry=self.registry)
      gauge.set_function(lambda field=field: getattr(scheduler.stats, field))
    # The prefix cache's counters (`prefix_cache.PrefixCache`; 0 without).
    cache = getattr(scheduler, "prefix_cache", None)
    for name, field, doc in [
        ("rnnstep_prefix_cache_hits", "hits",
         "Prompts that started from a cached prefix's state."),
        ("rnnstep_prefix_cache_misses", "misses",
         "Prompts that found no cached prefix."),
        ("rnnstep_prefix_cache_tokens_saved", "tokens_saved",
         "Prompt ids not primed again: the cached prefixes' lengths."),
        ("rnnstep_prefix_cache_bytes", "bytes_held",
         "Bytes of the states the prefix cache holds (at most "
         "--prefix_cache_mb)."),
        ("rnnstep_prefix_cache_evictions", "evictions",
         "States the prefix cache dropped, least recently used first.")]:
      gauge = prometheus_client.Gauge(name, doc, registry=self.registry)
      gauge.set_function(lambda field=field: getattr(cache, field, 0))
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

  def observe(self, update: completion_lib.Update, state, arrived: float):
    """Counts one update's characters and times; `state` is the request's
    [first update with text, last] (`Output.timing`)."""
    now = time.monotonic()
    if update.text:
      self.characters.inc(len(update.text))
      if state[0] is None:
        state[0] = now
        self.first_character.observe(now - arrived)
      elif state[1] is not None:
        self.inter_chunk.observe(now - state[1])
      state[1] = now


def error_response(status: int, message: str, *, param: Optional[str] = None,
                   kind: str = "invalid_request_error",
                   code: Optional[str] = None, headers=None) -> JSONResponse:
  """An OpenAI error body with its HTTP status."""
  return JSONResponse(
      protocol.error_body(message, kind=kind, param=param, code=code),
      status_code=status, headers=headers)


class Refused(Exception):
  """A request answered with an error before it runs.

  Args:
    response: the error response.
  """

  def __init__(self, response: Response):
    super().__init__(response.status_code)
    self.response = response


def bad_request(e: errors.ArgumentError) -> Refused:
  """400 in one line, naming the field at fault."""
  return Refused(error_response(400, str(e).splitlines()[0][:2000],
                                param=protocol.param_of(e.argument)))


class CheckPool(futures.Executor):
  """Daemon threads that run request checks, a bounded number at once.

  `concurrent.futures.ThreadPoolExecutor`'s threads are joined when the
  interpreter exits, so a check still running would hold up a shutdown;
  these are daemons (and a shutdown also abandons what runs, through
  `constraints.limits`: `checks.RequestChecks.abandon`).

  Args:
    workers: threads.
    name: their name's prefix.
  """

  def __init__(self, workers: int, name: str):
    self._work = queue.SimpleQueue()
    for i in range(workers):
      threading.Thread(target=self._serve, name=f"{name}-{i}",
                       daemon=True).start()

  def submit(self, fn, /, *args, **kwargs):
    future = futures.Future()
    self._work.put((future, fn, args, kwargs))
    return future

  def _serve(self):
    while True:
      future, fn, args, kwargs = self._work.get()
      if not future.set_running_or_notify_cancel():
        continue
      try:
        future.set_result(fn(*args, **kwargs))
      except BaseException as e:  # pylint: disable=broad-except
        future.set_exception(e)


class Gate:
  """ASGI middleware: the API key (401) and the JSON-only body (415).

  Args:
    app: the inner ASGI app.
    keys: the API keys (bytes); none: every client gets in.
  """

  def __init__(self, app, keys: Sequence[bytes]):
    self.app = app
    self.keys = tuple(keys)

  def authorized(self, header: bytes) -> bool:
    """Whether an Authorization header holds a key, in constant time (every
    key is compared, whatever matched)."""
    return _authorized(self.keys, header)

  async def __call__(self, scope, receive, send):
    if (scope["type"] != "http" or scope["path"] in OPEN_PATHS
        or scope["method"] == "OPTIONS"):
      return await self.app(scope, receive, send)
    headers = dict(scope["headers"])
    refusal = None
    if self.keys and not self.authorized(headers.get(b"authorization", b"")):
      refusal = error_response(
          401, "a valid API key is needed: send Authorization: Bearer KEY",
          code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    elif scope["method"] == "POST":
      kind = _media_type(headers.get(b"content-type", b""))
      if kind != b"application/json":
        refusal = error_response(
            415, "the body must be JSON: send Content-Type: "
            f"application/json (got {kind.decode('latin-1')[:60]!r})",
            param="body", code="unsupported_media_type")
    if refusal is not None:
      return await refusal(scope, receive, send)
    return await self.app(scope, receive, send)


def _authorized(keys: Sequence[bytes], header: bytes) -> bool:
  """Whether an Authorization header holds one of `keys`, in constant time
  (every key is compared, whatever matched)."""
  scheme, _, token = header.strip().partition(b" ")
  matched = False
  for key in keys:
    matched |= hmac.compare_digest(token.strip(), key)
  return matched and scheme.lower() == b"bearer"


def _media_type(header: bytes) -> bytes:
  """A Content-Type header's media type, lowercased, without parameters."""
  return header.split(b";")[0].strip().lower()


# A Host header the front may judge itself: a name or IPv4 address, and a
# port (anything else goes through Starlette's `TrustedHostMiddleware`).
_PLAIN_HOST = re.compile(rb"([a-z0-9.-]+)(:[0-9]{1,5})?")


class Front:
  """ASGI: `POST /v1/completions` straight to its handler, the rest to the
  FastAPI app.

  A completion goes through the same checks as on the app's route, in one
  pass over its headers: its Host is allowed (as
  `TrustedHostMiddleware` judges a plain name), it carries no Origin where
  CORS is on (`CORSMiddleware` adds nothing to a request without one), it
  holds a key where keys are asked (`Gate`), and its body is declared JSON.
  A request that passes them all goes to `completions` directly, without
  the middleware stack, FastAPI's routing and its dependency solving (the
  same checks in fewer layers on the event loop); any other (a refusal, a
  repeated header, an unusual Host) takes the app's way, so that every
  answer, refusals included, comes from one place.

  Args:
    completions: the handler of `POST /v1/completions` (a starlette
      `Request` in, a `Response` out).
    app: the FastAPI app with its middleware.
    keys: the API keys (bytes); none: every client gets in.
    allowed_hosts: as `Server`'s.
    cors: whether CORS is on.
  """

  HEADERS = (b"host", b"origin", b"authorization", b"content-type")

  def __init__(self, completions, app, keys: Sequence[bytes],
               allowed_hosts: Sequence[str], cors: bool):
    self.completions = completions
    self.app = app
    self.keys = tuple(keys)
    self.any_host = "*" in allowed_hosts
    self.hosts = {h.lower().encode() for h in allowed_hosts
                  if not h.startswith("*")}
    self.suffixes = tuple(h[1:].lower().encode() for h in allowed_hosts
                          if h.startswith("*") and h != "*")
    self.cors = bool(cors)

  def _direct(self, scope) -> bool:
    """Whether a completion request passes every check of the app's way."""
    seen = {}
    for name, value in scope["headers"]:
      if name in self.HEADERS:
        if name in seen:
          return False  # The middleware read repeats differently.
        seen[name] = value
    if not self.any_host:
      match = _PLAIN_HOST.fullmatch(seen.get(b"host", b"").lower())
      if match is None:
        return False
      host = match.group(1)
      if host not in self.hosts and not host.endswith(self.suffixes):
        return False
    if self.cors and b"origin" in seen:
      return False
    if self.keys and not _authorized(self.keys,
                                     seen.get(b"authorization", b"")):
      return False
    return _media_type(seen.get(b"content-type", b"")) == b"application/json"

  async def __call__(self, scope, receive, send):
    if (scope["type"] == "http" and scope["method"] == "POST"
        and scope["path"] == "/v1/completions" and self._direct(scope)):
      response = await self.completions(Request(scope, receive))
      return await response(scope, receive, send)
    return await self.app(scope, receive, send)


async def cancel_on_disconnect(receive,
                               completion: completion_lib.Completion) -> None:
  """Cancels `completion` when its client disconnects (a task per request).

  The body has been read, so the next ASGI message is the disconnect: this
  waits for it instead of polling.

  Args:
    receive: the request's ASGI receive.
    completion: what it runs.
  """
  while (await receive())["type"] != "http.disconnect":
    pass
  completion.cancel()


class EventStream(Response):
  """Server-sent events: each of `frames`' bytes in one write.

  Starlette's `StreamingResponse` runs, under uvicorn (ASGI 2.3), the
  stream and a disconnect listener as two anyio tasks in a task group per
  response; here the stream runs in the handler's own task and one plain
  task waits for the disconnect, which cancels the completion: its rows are
  retired at the scheduler's next chunk boundary, whose "cancelled" update
  ends the stream.

  Args:
    frames: an async iterator of bytes (it is closed at the end).
    completion: what the stream shows (None: nothing runs).
    headers: the response's headers.
  """

  media_type = "text/event-stream"

  def __init__(self, frames, completion: Optional[completion_lib.Completion],
               headers):
    self.frames = frames
    self.completion = completion
    self.status_code = 200
    self.background = None
    self.init_headers(headers)

  async def __call__(self, scope, receive, send):
    watcher = None
    if self.completion is not None:
      watcher = asyncio.ensure_future(
          cancel_on_disconnect(receive, self.completion))
    try:
      await send({"type": "http.response.start", "status": 200,
                  "headers": self.raw_headers})
      async for frames in self.frames:
        await send({"type": "http.response.body", "body": frames,
                    "more_body": True})
      await send({"type": "http.response.body", "body": b"",
                  "more_body": False})
    finally:
      if watcher is not None:
        watcher.cancel()
      await self.frames.aclose()


class Output:
  """One request's output, on the event loop (`completion.call_sinks` adds
  to it).

  A whole response collects its choices' text, reasons, scores and
  per-token entries, and resolves `done` when the last choice ends; a
  stream keeps its updates until its handler takes them, waking it
  (`waiter`) once per hand-off.

  Args:
    metrics: the server's `Metrics`.
    count: the request's choices.
    stream: whether it streams.
    arrived: when the request arrived (time.monotonic()).
  """

  def __init__(self, metrics: Metrics, count: int, stream: bool,
               arrived: float):
    self.metrics = metrics
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
    self.entries = [[] for _ in range(count)]  # Per-token, when asked.
    self.prompt_entries = [None] * count
    self.messages = []  # Why rows failed, for the log.
    self.done = asyncio.get_running_loop().create_future()

  def add(self, update: completion_lib.Update) -> None:
    """Takes one update (the completion's sink, called on the loop)."""
    self.metrics.observe(update, self.timing, self.arrived)
    self.generated += update.tokens
    if self.stream:
      self.updates.append(update)
      if self.waiter is not None and not self.waiter.done():
        self.waiter.set_result(None)
      return
    self.texts[update.index] += update.text
    self.scores[update.index] = update.score
    if update.token_logprobs is not None:
      self.entries[update.index].append(update)
    if update.prompt_logprobs is not None:
      self.prompt_entries[update.index] = update
    if update.finish_reason is not None:
      self.reasons[update.index] = update.finish_reason
      if update.finish_reason == "error":
        self.messages.append(update.message)
      self.finished += 1
      if self.finished == self.count and not self.done.done():
        self.done.set_result(None)

  async def take(self):
    """A stream's updates since the last call (waits for one at least).

    Returns:
      The list of `completion.Update`s, in the order they were sent.
    """
    while not self.updates:
      self.waiter = asyncio.get_running_loop().create_future()
      try:
        await self.waiter
      finally:
        self.waiter = None
    updates, self.updates = self.updates, []
    return updates


def new_request_id() -> str:
  """A completion's id (its `X-Request-Id`, and the id its log lines carry)."""
  return f"cmpl-{uuid.uuid4().hex}"


def fault(where: str, e: BaseException,
          request_id: Optional[str] = None) -> Response:
  """A fault of the server's: 500, logged once with a request id."""
  request_id = request_id or new_request_id()
  logging.error("request %s (%s) failed: %s", request_id, where, e,
                exc_info=e)
  return error_response(500, f"the server failed on this request "
                        f"({request_id}); it has been logged",
                        kind="server_error",
                        headers={"X-Request-Id": request_id})


def generation_failed(request_id: str, messages: Sequence[str]) -> Response:
  """500 for a request a row of which failed, logged with what failed."""
  logging.error("request %s: a row failed: %s", request_id,
                "; ".join(m for m in messages if m)[:2000])
  return error_response(500, f"generation failed ({request_id}); it has "
                        "been logged", kind="server_error")


def queue_full() -> Response:
  return error_response(429, "the server's queue is full; retry shortly",
                        kind="rate_limit_error", code="queue_full",
                        headers={"Retry-After": "1"})


def shutting_down(message: str = "the server is shutting down") -> Response:
  return error_response(503, message, kind="service_unavailable")


async def read_body(request: Request, max_bytes: int,
                    seconds: float) -> bytes:
  """The body, bounded in size and in the time the client takes.

  Raises:
    Refused: 413 over `max_bytes` (from its Content-Length, or as it
      arrives), 408 past `seconds`.
  """
  def too_big():  # Made only when it is the answer.
    return Refused(error_response(
        413, f"the request body is over {max_bytes} bytes "
        "(--max_body_bytes)", param="body", code="request_too_large"))

  declared = request.headers.get("content-length")
  if declared is not None and declared.isdigit() and (
      int(declared) > max_bytes):
    raise too_big()

  async def read():
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > max_bytes:
        raise too_big()
      chunks.append(chunk)
    return b"".join(chunks)

  try:
    return await asyncio.wait_for(read(), seconds)
  except asyncio.TimeoutError:
    raise Refused(error_response(
        408, f"the body did not arrive within {seconds:g} s",
        param="body", code="request_timeout")) from None


def validated(raw: bytes, model_class, model_id: str):
  """A body decoded and validated as `model_class`, whose `model` field (if
  given) must name the served model `model_id`.

  Raises:
    Refused: 400 or 404.
  """
  try:
    body = protocol.validate(model_class, protocol.decode_body(raw))
  except errors.ArgumentError as e:
    raise bad_request(e) from None
  if body.model is not None and body.model != model_id:
    raise Refused(error_response(
        404, f"the model {body.model[:100]!r} does not exist; this server "
        f"serves {model_id!r}", param="model", code="model_not_found"))
  return body
