"""The HTTP front end: OpenAI's completions API on FastAPI, over the `Engine`.

Routes: `POST /v1/completions` (JSON, or server-sent events with
`stream: true`, ending with `data: [DONE]`), `GET /v1/models`,
`POST /tokenize` and `/detokenize` (vLLM's), `GET /health` (503 until the
model's programs are warm, and while draining), `GET /metrics` (Prometheus),
`GET /openapi.json` (the schema, from the pydantic request models).

Who gets in, outermost first (vLLM's and llama.cpp's choices): the Host
header is checked (`allowed_hosts`, Starlette's `TrustedHostMiddleware`,
against DNS rebinding); CORS answers browsers from `allowed_origins` only
(none by default); with API keys, every route but `/health`, `/metrics` and
`/openapi.json` needs `Authorization: Bearer KEY` (compared in constant
time; 401 otherwise); a POST whose Content-Type is not JSON gets 415 (a web
page can send `text/plain` without asking the browser first). A completion
that passes all of these is answered without the middleware and FastAPI's
routing (`_Front`, which makes the same checks in one pass over its
headers); any other request, refusals included, goes the app's way.

Every request is bounded before work is done on it: its body by size (413,
from its Content-Length or as it arrives) and by time (408), its JSON by
depth, its fields by the pydantic model (400), and its check (the
library's checks, `api.check_request`, which compile a `regex` and a stop
automaton) runs on a checking thread within a deadline and a bounded
queue: requests being checked count toward `--max_queue` with the rows
waiting (429 past it), requests with a pattern are checked on threads of
their own (so a pattern that takes long to refuse delays no plain request),
and shutdown abandons any check (`constraints.limits`). What the check
builds (the stop automaton, the compiled pattern) travels with the
completion: the scheduler never builds it again, unbounded. The event loop
only parses, formats and sends.

The device belongs to the engine's thread; a handler submits a checked
`engine.Completion` and awaits its `_Output`. The scheduler thread hands each
chunk's updates, every row's, to the event loop in one
`call_soon_threadsafe` (`Server._deliver`), where `_Output.add` takes them: a
whole response only collects its text until its last choice ends (no
wake-up before), a stream's handler is woken once a chunk and sends that
chunk's events as one write (`_EventStream`), each event's bytes formatted
directly (`protocol.running_chunk`). A client that goes away cancels its
completion, whose rows the engine retires at the next chunk boundary.

Errors use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`,
on every status: 400 for a bad request (naming the field), 401, 404 (an
unknown route or model), 408, 413, 415, 429 with Retry-After, 503 while
loading or draining, and 500 for a fault of the server's, logged once with
its request id (the `X-Request-Id` header of every completion answer).
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
import fastapi
import numpy as np
import prometheus_client
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rnnstep import api
from rnnstep import errors
from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.engine import host
from rnnstep.serve import engine as engine_lib
from rnnstep.serve import protocol

# Routes anyone who reaches the port may use (vLLM's and llama.cpp's).
OPEN_PATHS = ("/health", "/metrics", "/openapi.json")


class Metrics:
  """The server's Prometheus metrics, in a registry of its own."""

  def __init__(self, engine: engine_lib.Engine):
    self.registry = prometheus_client.CollectorRegistry()
    # What runs, for whoever measures it (tools/bench/serve.py reads it):
    # the compiled path (`auto` resolved) and the lanes.
    lanes = getattr(engine, "engines", [engine])
    prometheus_client.Info(
        "rnnstep_engine", "The compiled path the engine runs, and its lanes.",
        registry=self.registry).info({
            "path": lanes[0].generator.path, "lanes": str(len(lanes))})
    running = prometheus_client.Gauge(
        "rnnstep_requests_running", "Rows (choices) in the running batch.",
        registry=self.registry)
    running.set_function(lambda: engine.stats.running)
    waiting = prometheus_client.Gauge(
        "rnnstep_requests_waiting", "Rows (choices) waiting for a slot.",
        registry=self.registry)
    waiting.set_function(lambda: engine.stats.waiting)
    compiling = prometheus_client.Gauge(
        "rnnstep_programs_compiling", "XLA programs still to compile "
        "(their calls run on the graph path meanwhile).",
        registry=self.registry)
    compiling.set_function(lambda: engine.compiling)
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


def _bad_request(e: errors.ArgumentError) -> Refused:
  return Refused(error_response(400, str(e).splitlines()[0][:2000],
                                param=protocol.param_of(e.argument)))


class CheckPool(futures.Executor):
  """Daemon threads that run request checks, a bounded number at once.

  `concurrent.futures.ThreadPoolExecutor`'s threads are joined when the
  interpreter exits, so a check still running would hold up a shutdown;
  these are daemons (and `Server.shutdown` also abandons what runs, through
  `constraints.limits`).

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


class _Gate:
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


class _Front:
  """ASGI: `POST /v1/completions` straight to its handler, the rest to the
  FastAPI app.

  A completion goes through the same checks as on the app's route, in one
  pass over its headers: its Host is allowed (as
  `TrustedHostMiddleware` judges a plain name), it carries no Origin where
  CORS is on (`CORSMiddleware` adds nothing to a request without one), it
  holds a key where keys are asked (`_Gate`), and its body is declared JSON.
  A request that passes them all is answered by `Server.completions`
  directly, without the middleware stack, FastAPI's routing and its
  dependency solving (about a millisecond of the event loop's time a
  request, on a 2-core server with 64 streams: a sixth of its HTTP side);
  any other (a refusal, a repeated header, an unusual Host) takes the
  app's way, so that every answer, refusals included, comes from one place.

  Args:
    server: the `Server`.
    app: the FastAPI app with its middleware.
    keys: the API keys (bytes); none: every client gets in.
    allowed_hosts: as `Server`'s.
    cors: whether CORS is on.
  """

  HEADERS = (b"host", b"origin", b"authorization", b"content-type")

  def __init__(self, server: "Server", app, keys: Sequence[bytes],
               allowed_hosts: Sequence[str], cors: bool):
    self.server = server
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
      response = await self.server.completions(Request(scope, receive))
      return await response(scope, receive, send)
    return await self.app(scope, receive, send)


async def _cancel_on_disconnect(receive,
                                completion: engine_lib.Completion) -> None:
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


class _EventStream(Response):
  """Server-sent events: each of `frames`' bytes in one write.

  Starlette's `StreamingResponse` runs, under uvicorn (ASGI 2.3), the
  stream and a disconnect listener as two anyio tasks in a task group per
  response; here the stream runs in the handler's own task and one plain
  task waits for the disconnect, which cancels the completion: its rows are
  retired at the engine's next chunk boundary, whose "cancelled" update
  ends the stream.

  Args:
    frames: an async iterator of bytes (it is closed at the end).
    completion: what the stream shows (None: nothing runs).
    headers: the response's headers.
  """

  media_type = "text/event-stream"

  def __init__(self, frames, completion: Optional[engine_lib.Completion],
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
          _cancel_on_disconnect(receive, self.completion))
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


class _Output:
  """One request's output, on the event loop (`engine.call_sinks` adds to it).

  A whole response collects its choices' text, reasons, scores and
  per-token entries, and resolves `done` when the last choice ends; a
  stream keeps its updates until its handler takes them, waking it
  (`waiter`) once per hand-off.

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
    self.entries = [[] for _ in range(count)]  # Per-token, when asked.
    self.prompt_entries = [None] * count
    self.messages = []  # Why rows failed, for the log.
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
  """The FastAPI app and the state its handlers share.

  Args:
    model: the `rnnstep.Model` the engine runs.
    engine: the `engine_lib.Engine` (started by the caller).
    model_id: the name `/v1/models` lists, responses carry and requests may
      name (another gets 404).
    max_body_bytes: the largest request body read.
    api_keys: the keys a client must present (none: anyone gets in).
    allowed_origins: the origins CORS lets browsers read answers from
      (none: no CORS headers, so no other site's page can read an answer).
    allowed_hosts: the Host headers answered ("*": any).
    body_seconds: the time a client has to send its body.
    check_seconds: the time a request's check may take (400 past it).
    max_queue: rows waiting and being checked at most, beyond the free
      slots (the engine's own queue is the same limit).
  """

  def __init__(self, model, engine: engine_lib.Engine, *, model_id: str,
               max_body_bytes: int = 1 << 20, api_keys: Sequence[str] = (),
               allowed_origins: Sequence[str] = (),
               allowed_hosts: Sequence[str] = ("*",),
               body_seconds: float = 30.0, check_seconds: float = 10.0,
               max_queue: Optional[int] = None):
    self.model = model
    self.engine = engine
    self.model_id = model_id
    self.max_body_bytes = int(max_body_bytes)
    self.body_seconds = float(body_seconds)
    self.check_seconds = float(check_seconds)
    self.max_queue = engine.max_queue if max_queue is None else int(max_queue)
    self.ready = False
    self.draining = False
    self.created = int(time.time())
    self.metrics = Metrics(engine)
    self.request_model = protocol.completion_request(engine.max_tokens_limit)
    self._loop = None  # The event loop, when the first request comes.
    # Requests without a pattern are checked on threads of their own, so
    # that none waits behind a pattern's compile; two of each.
    self._checking = CheckPool(2, "rnnstep-check")
    self._checking_patterns = CheckPool(2, "rnnstep-check-regex")
    self._checking_rows = 0  # Rows of the requests being checked.
    self._abandon = threading.Event()  # Set at shutdown: checks stop.
    self._token_texts = None
    engine.deliver = self._deliver
    app = fastapi.FastAPI(
        title="rnnstep-serve", docs_url=None, redoc_url=None,
        description="OpenAI's completions API over an rnnstep model.")
    body = lambda model_class: {"requestBody": {
        "required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model_class.__name__}"}
        }}}}
    app.add_api_route("/v1/completions", self.completions, methods=["POST"],
                      openapi_extra=body(self.request_model))
    app.add_api_route("/v1/models", self.models, methods=["GET"])
    app.add_api_route("/tokenize", self.tokenize, methods=["POST"],
                      openapi_extra=body(protocol.TokenizeRequest))
    app.add_api_route("/detokenize", self.detokenize, methods=["POST"],
                      openapi_extra=body(protocol.DetokenizeRequest))
    app.add_api_route("/health", self.health, methods=["GET"])
    app.add_api_route("/metrics", self.metrics_page, methods=["GET"])
    app.add_exception_handler(HTTPException, self._http_error)
    app.add_exception_handler(Exception, self._server_error)
    app.openapi = self._openapi
    self.fastapi = app
    # Outermost last: hosts, then CORS (a preflight needs no key), then
    # the key and the content type.
    keys = [key.encode() for key in api_keys]
    app.add_middleware(_Gate, keys=keys)
    if allowed_origins:
      app.add_middleware(
          CORSMiddleware, allow_origins=list(allowed_origins),
          allow_methods=["GET", "POST"],
          allow_headers=["Authorization", "Content-Type"])
    if list(allowed_hosts) != ["*"]:
      app.add_middleware(TrustedHostMiddleware,
                         allowed_hosts=list(allowed_hosts))
    self.app = _Front(self, app, keys, allowed_hosts,
                      bool(allowed_origins))

  def _openapi(self):
    """The schema, with the request models under components."""
    if self.fastapi.openapi_schema is None:
      schema = fastapi.openapi.utils.get_openapi(
          title=self.fastapi.title, version="1", routes=self.fastapi.routes,
          description=self.fastapi.description)
      components = schema.setdefault("components", {}).setdefault(
          "schemas", {})
      for model_class in (self.request_model, protocol.TokenizeRequest,
                          protocol.DetokenizeRequest):
        one = model_class.model_json_schema(
            ref_template="#/components/schemas/{model}")
        components.update(one.pop("$defs", {}))
        components[model_class.__name__] = one
      self.fastapi.openapi_schema = schema
    return self.fastapi.openapi_schema

  async def _http_error(self, request: Request, e: HTTPException) -> Response:
    del request
    return error_response(e.status_code, str(e.detail),
                          code="not_found" if e.status_code == 404 else None,
                          headers=getattr(e, "headers", None))

  async def _server_error(self, request: Request, e: Exception) -> Response:
    """A fault of the server's: 500, logged once with a request id."""
    return self._fault(request.url.path, e)

  def _fault(self, where: str, e: BaseException,
             request_id: Optional[str] = None) -> Response:
    request_id = request_id or _request_id()
    logging.error("request %s (%s) failed: %s", request_id, where, e,
                  exc_info=e)
    return error_response(500, f"the server failed on this request "
                          f"({request_id}); it has been logged",
                          kind="server_error",
                          headers={"X-Request-Id": request_id})

  def shutdown(self) -> None:
    """Stops admitting (503) and abandons the checks still running."""
    self.draining = True
    self._abandon.set()

  # -- small routes ----------------------------------------------------------

  async def health(self) -> Response:
    if self.draining:
      return error_response(503, "the server is shutting down",
                            kind="service_unavailable")
    if not self.ready:
      return error_response(503, "loading the model and compiling its "
                            "programs", kind="service_unavailable")
    # Ready: served from now on. Programs still compiling (on the XLA
    # path) run their calls on the graph path meanwhile.
    return JSONResponse({"status": "ok",
                         "programs_compiling": self.engine.compiling})

  async def models(self) -> Response:
    return JSONResponse({"object": "list", "data": [{
        "id": self.model_id, "object": "model", "created": self.created,
        "owned_by": "rnnstep"}]})

  async def metrics_page(self) -> Response:
    return Response(prometheus_client.generate_latest(self.metrics.registry),
                    media_type=prometheus_client.CONTENT_TYPE_LATEST)

  async def tokenize(self, request: Request) -> Response:
    """`POST /tokenize`: a prompt's ids, as vLLM answers."""
    try:
      body = await self._request_json(request, protocol.TokenizeRequest)
      try:
        ids, lengths = host.prompt_batch(self.model, [body.prompt])
      except errors.ArgumentError as e:
        raise _bad_request(e) from None
      tokens = ids[0, :lengths[0]].tolist()
      return JSONResponse({
          "count": len(tokens), "max_model_len": self.engine.max_prompt_tokens,
          "tokens": tokens})
    except Refused as e:
      return e.response

  async def detokenize(self, request: Request) -> Response:
    """`POST /detokenize`: the text of ids, as vLLM answers."""
    try:
      body = await self._request_json(request, protocol.DetokenizeRequest)
      if len(body.tokens) > self.max_body_bytes // 2 or any(
          not 0 <= t < self.model.vocab_size for t in body.tokens):
        raise Refused(error_response(
            400, f"tokens must be ids from 0 to {self.model.vocab_size - 1}",
            param="tokens"))
      return JSONResponse({"prompt": self.model.decode(
          np.asarray(body.tokens, np.int32))})
    except Refused as e:
      return e.response

  # -- reading a request -----------------------------------------------------

  async def _read_body(self, request: Request) -> bytes:
    """The body, bounded in size and in the time the client takes.

    Raises:
      Refused: 413 over `max_body_bytes` (from its Content-Length, or as it
        arrives), 408 past `body_seconds`.
    """
    def too_big():  # Made only when it is the answer.
      return Refused(error_response(
          413, f"the request body is over {self.max_body_bytes} bytes "
          "(--max_body_bytes)", param="body", code="request_too_large"))

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and (
        int(declared) > self.max_body_bytes):
      raise too_big()

    async def read():
      chunks, size = [], 0
      async for chunk in request.stream():
        size += len(chunk)
        if size > self.max_body_bytes:
          raise too_big()
        chunks.append(chunk)
      return b"".join(chunks)

    try:
      return await asyncio.wait_for(read(), self.body_seconds)
    except asyncio.TimeoutError:
      raise Refused(error_response(
          408, f"the body did not arrive within {self.body_seconds:g} s",
          param="body", code="request_timeout")) from None

  async def _request_json(self, request: Request, model_class):
    """The body, read, decoded and validated as `model_class`, whose
    `model` field (if given) must name the served model.

    Raises:
      Refused: 400, 404, 408 or 413.
    """
    raw = await self._read_body(request)
    try:
      body = protocol.validate(model_class, protocol.decode_body(raw))
    except errors.ArgumentError as e:
      raise _bad_request(e) from None
    if body.model is not None and body.model != self.model_id:
      raise Refused(error_response(
          404, f"the model {body.model[:100]!r} does not exist; this server "
          f"serves {self.model_id!r}", param="model",
          code="model_not_found"))
    return body

  # -- completions -----------------------------------------------------------

  def _answer(self, response: Response) -> Response:
    self.metrics.requests.labels(str(response.status_code)).inc()
    return response

  async def completions(self, request: Request) -> Response:
    """`POST /v1/completions`."""
    request_id = _request_id()
    try:
      return await self._completions(request, request_id)
    except Refused as e:
      return self._answer(e.response)
    except Exception as e:  # pylint: disable=broad-except
      return self._answer(self._fault("/v1/completions", e, request_id))

  async def _completions(self, request: Request, request_id: str
                         ) -> Response:
    if self.draining or not self.ready:
      raise Refused(error_response(
          503, "the server is shutting down" if self.draining else
          "the model is still loading", kind="service_unavailable"))
    arrived = time.monotonic()
    body = await self._request_json(request, self.request_model)
    try:
      parsed = protocol.parsed(body, self.engine.max_batch)
    except errors.ArgumentError as e:
      raise _bad_request(e) from None
    checked = await self._checked(parsed)
    completion, output = self._completion(checked, arrived)
    if completion is not None:
      try:
        self.engine.submit(completion)
      except engine_lib.QueueFull:
        raise Refused(self._queue_full()) from None
      except engine_lib.ShuttingDown:
        raise Refused(error_response(
            503, "the server is shutting down",
            kind="service_unavailable")) from None
    headers = {"X-Request-Id": request_id}
    if parsed.stream:
      self.metrics.requests.labels("200").inc()
      # Server-sent events as bytes on Starlette's streaming response (as
      # vLLM's OpenAI server sends them), with sse-starlette's headers.
      headers.update({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
      return _EventStream(
          self._events(request_id, parsed, completion, output), completion,
          headers)
    response = await self._whole(request, request_id, parsed, completion,
                                 output)
    response.headers.update(headers)
    return self._answer(response)

  def _queue_full(self) -> Response:
    return error_response(429, "the server's queue is full; retry shortly",
                          kind="rate_limit_error", code="queue_full",
                          headers={"Retry-After": "1"})

  async def _checked(self, parsed: protocol.Parsed):
    """Runs `_check` on a checking thread, within the queue's bound.

    Raises:
      Refused: 429 when the rows waiting and being checked would pass
        `max_queue` beyond the free slots; 400 from the check.
    """
    rows = len(parsed.prompts) * parsed.n
    stats = self.engine.stats
    free = max(self.engine.max_batch - stats.running, 0)
    if self._checking_rows + stats.waiting + rows > self.max_queue + free:
      raise Refused(self._queue_full())
    pool = self._checking_patterns if parsed.regex else self._checking
    self._checking_rows += rows
    try:
      return await asyncio.get_running_loop().run_in_executor(
          pool, self._check, parsed)
    except errors.ArgumentError as e:
      raise _bad_request(e) from None
    except constraints.Cancelled:
      raise Refused(error_response(
          503, "the server is shutting down",
          kind="service_unavailable")) from None
    finally:
      self._checking_rows -= rows

  def _check(self, parsed: protocol.Parsed):
    """Checks a request (on a checking thread); what `_completion` takes.

    Args:
      parsed: the validated request.

    Returns:
      (parsed request, rows' prompts, checked options).

    Raises:
      errors.ArgumentError: naming the field at fault.
      constraints.Cancelled: the server is shutting down.
    """
    with constraints.limits(deadline=time.monotonic() + self.check_seconds,
                            cancelled=self._abandon):
      return self._check_within_limits(parsed)

  def _check_within_limits(self, parsed: protocol.Parsed):
    limit = self.engine.max_prompt_tokens
    rows = [p for p in parsed.prompts for _ in range(parsed.n)]
    if self.model.tokens.kind in ("characters", "bytes"):
      # A character is at least one id: refused before it is encoded.
      for i, text in enumerate(parsed.prompts):
        if len(text) > limit:
          raise protocol.BadRequest(
              "prompt", f"prompt {i} has {len(text)} characters, at least "
              f"as many tokens; this server takes at most {limit} "
              "(--max_prompt_tokens)")
    if parsed.seed is None:  # A fresh seed, reported so it can be replayed.
      parsed.seed = int(np.random.SeedSequence().generate_state(
          1, np.uint64)[0] >> 1)
    try:
      _, options = api.check_request(
          self.model, rows, parsed.max_tokens, seed=parsed.seed,
          stop=parsed.stop, regex=parsed.regex,
          return_scores=parsed.logprobs is not None, **parsed.decoding)
    except TypeError as e:  # Not reached: the model admits declared names.
      raise protocol.BadRequest("body", str(e)) from None
    # The library's encoding check, in its words ("prompt 0: character ...").
    prompt_ids, prompt_lengths = host.prompt_batch(self.model,
                                                   parsed.prompts)
    for i, length in enumerate(prompt_lengths):
      if length > limit:
        raise protocol.BadRequest(
            "prompt", f"prompt {i} is {length} tokens (the model's ids); "
            f"this server takes at most {limit} (--max_prompt_tokens)")
    # Usage counts ids, as OpenAI's counts tokens: each prompt once, not n.
    parsed.prompt_tokens = int(sum(prompt_lengths))
    parsed.prompt_ids = [ids[:length] for ids, length in
                         zip(prompt_ids, prompt_lengths)
                         for _ in range(parsed.n)]
    parsed.stop = protocol.stop_strings(parsed.stop)
    # Built here, within the check's limits, once: the scheduler takes
    # them as they are (`engine.Completion`).
    parsed.stop_automaton = host.stop_automaton(self.model, parsed.stop)
    if parsed.regex is not None:  # Compiled by the check: a cache hit.
      parsed.pattern = constraints.compile_pattern(self.model, parsed.regex)
    parsed.created = int(time.time())  # One for all its chunks, as OpenAI's.
    return parsed, rows, options

  def _completion(self, checked, arrived: float):
    """Makes a checked request's `Completion` and `_Output` (on the event
    loop, whose futures the output holds); (None, None) when nothing runs
    (`max_tokens` 0 without the prompt's log-probabilities).

    Args:
      checked: `_check`'s result.
      arrived: when the request came (`time.monotonic()`).

    Returns:
      (`Completion` or None, `_Output` or None).
    """
    parsed, rows, options = checked
    prompt_logprobs = parsed.echo and parsed.logprobs is not None
    if parsed.max_tokens == 0 and not prompt_logprobs:
      return None, None
    self._loop = asyncio.get_running_loop()
    output = _Output(self, len(rows), parsed.stream, arrived)
    params = options_lib.Params(*[
        np.broadcast_to(np.asarray(value), [len(rows)])
        for value in options.sampling])
    completion = engine_lib.Completion(
        parsed.prompt_ids,
        [options_lib.Params(*[field[k].item() for field in params])
         for k in range(len(rows))],
        seed=parsed.seed, max_tokens=parsed.max_tokens,
        shared=engine_lib.Shared(
            stop=parsed.stop, repetition_window=int(options.repetition_window),
            no_repeat_ngram_size=int(options.no_repeat_ngram_size),
            regex=parsed.regex),
        want_scores=parsed.logprobs is not None, logprobs=parsed.logprobs,
        prompt_logprobs=prompt_logprobs, sink=output.add,
        stop_automaton=parsed.stop_automaton, pattern=parsed.pattern)
    return completion, output

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

  # -- answers ---------------------------------------------------------------

  def token_text(self, token: int) -> str:
    """A token's text in `logprobs` (OpenAI's `bytes:\\xNN` for bytes that
    are not whole UTF-8 on their own)."""
    if self._token_texts is None:
      if self.model.tokens.kind == "characters":
        self._token_texts = list(self.model.vocab)
      else:
        self._token_texts = [
            text if text is not None else "bytes:" + "".join(
                f"\\x{b:02x}" for b in piece)
            for text, piece in zip(self.model.tokens.texts,
                                   self.model.tokens.pieces)]
    return self._token_texts[token]

  def _logprobs(self, parsed, ids, logprobs, top_ids, top_logprobs,
                offset: int):
    """OpenAI's completions `logprobs` object for some tokens.

    Args:
      parsed: the request.
      ids: the tokens' ids.
      logprobs: each one's log-probability (None: the prompt's first).
      top_ids, top_logprobs: `[n, k]`, the k most likely at each (a row of
        None: the prompt's first).
      offset: the first token's offset in the choice's text.

    Returns:
      `{tokens, token_logprobs, top_logprobs, text_offset}`: each token's
      top dict holds the k most likely and the token itself (vLLM's).
    """
    tokens = [self.token_text(int(i)) for i in ids]
    offsets = []
    for text in tokens:
      offsets.append(offset)
      offset += len(text)
    tops = []
    for i, (token, lp) in enumerate(zip(ids, logprobs)):
      if lp is None:
        tops.append(None)
        continue
      top = {self.token_text(int(t)): float(v) for t, v in zip(
          top_ids[i][:parsed.logprobs], top_logprobs[i][:parsed.logprobs])}
      top.setdefault(self.token_text(int(token)), float(lp))
      tops.append(top)
    return {"tokens": tokens,
            "token_logprobs": [None if lp is None else float(lp)
                               for lp in logprobs],
            "top_logprobs": tops, "text_offset": offsets}

  def _prompt_logprobs(self, parsed, index: int, update):
    """The echoed prompt's `logprobs` entries of choice `index` (its first
    token's null), from the update that carries them."""
    ids = parsed.prompt_ids[index]
    k = len(ids) - 1
    return self._logprobs(
        parsed, ids, [None] + list(update.prompt_logprobs[:k]),
        [None] + list(update.prompt_top_ids[:k]),
        [None] + list(update.prompt_top_logprobs[:k]), 0)

  def _choice(self, parsed, index: int, text: str, reason, logprobs=None):
    return {"index": index, "text": text, "logprobs": logprobs,
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

  def _failed(self, request_id: str, output: _Output) -> Response:
    logging.error("request %s: a row failed: %s", request_id,
                  "; ".join(m for m in output.messages if m)[:2000])
    return error_response(500, f"generation failed ({request_id}); it has "
                          "been logged", kind="server_error")

  async def _whole(self, request: Request, request_id: str, parsed,
                   completion, output: _Output) -> Response:
    """The non-streamed answer, once every choice has finished."""
    count = len(parsed.prompts) * parsed.n
    if completion is None:
      output = None
      texts, reasons, generated = [""] * count, ["length"] * count, 0
    else:
      watcher = asyncio.create_task(_cancel_on_disconnect(request.receive,
                                                          completion))
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
      texts, reasons, generated = output.texts, output.reasons, output.generated
      if "error" in reasons:
        return self._failed(request_id, output)
      if "cancelled" in reasons:
        return error_response(503, "the server shut down before this "
                              "request finished", kind="service_unavailable")
    choices = []
    for k in range(count):
      prompt = parsed.prompts[k // parsed.n] if parsed.echo else ""
      text = prompt + self._final_text(parsed, texts[k], reasons[k])
      logprobs = None
      if parsed.logprobs is not None:
        logprobs = self._choice_logprobs(parsed, k, output, len(prompt))
      choices.append(self._choice(parsed, k, text, reasons[k], logprobs))
    return JSONResponse(self._envelope(request_id, parsed, choices,
                                       self._usage(parsed, generated)))

  def _choice_logprobs(self, parsed, k: int, output: Optional[_Output],
                       offset: int):
    """A whole choice's `logprobs`: the echoed prompt's, then its tokens'."""
    parts = []
    if parsed.echo and output is not None and output.prompt_entries[k]:
      parts.append(self._prompt_logprobs(parsed, k, output.prompt_entries[k]))
    updates = output.entries[k] if output is not None else []
    if updates:
      parts.append(self._logprobs(
          parsed, np.concatenate([u.ids for u in updates]),
          np.concatenate([u.token_logprobs for u in updates]),
          np.concatenate([u.top_ids for u in updates]),
          np.concatenate([u.top_logprobs for u in updates]), offset))
    whole = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
             "text_offset": []}
    for part in parts:
      for key in whole:
        whole[key] += part[key]
    return whole

  async def _events(self, request_id: str, parsed, completion,
                    output: _Output):
    """The server-sent events of a streamed answer, as bytes: one write per
    chunk (every choice's event of it)."""
    try:
      async for frames in self._frames(request_id, parsed, completion,
                                       output):
        yield frames
    except asyncio.CancelledError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      self._fault("/v1/completions (stream)", e, request_id)
      yield protocol.json_event(protocol.error_body(
          f"the server failed on this request ({request_id}); it has been "
          "logged", kind="server_error"))
    finally:  # Also when the client went away (the generator is cancelled).
      if completion is not None:
        completion.cancel()

  async def _frames(self, request_id: str, parsed, completion,
                    output: _Output):
    count = len(parsed.prompts) * parsed.n
    hold = 0 if parsed.include_stop_str_in_output else protocol.held_back(
        parsed.stop)
    pending = [""] * count  # Per choice: text held back from the stream.
    offsets = [0] * count  # Per choice: where its next token's text starts.
    head = protocol.chunk_head(self._envelope(request_id, parsed, []))
    wants = parsed.logprobs is not None
    if parsed.echo:  # The prompt first, as OpenAI streams an echo.
      frames = []
      for k in range(count):
        prompt = parsed.prompts[k // parsed.n]
        offsets[k] = len(prompt)
        if output is None or not wants:
          frames.append(protocol.running_chunk(head, k, prompt))
      if frames:
        yield b"".join(frames)
    if completion is None:  # max_tokens 0: one empty finished chunk each.
      generated = 0
      yield b"".join(protocol.json_event(self._envelope(
          request_id, parsed, [self._choice(parsed, k, "", "length")]))
                     for k in range(count))
    else:
      finished, failed = 0, False
      while finished < count and not failed:
        frames = []
        for update in await output.take():
          if update.finish_reason in ("cancelled", "error"):
            if update.finish_reason == "error":
              output.messages.append(update.message)
              self._failed(request_id, output)
            frames.append(protocol.json_event(protocol.error_body(
                "the server shut down before this request finished"
                if update.finish_reason == "cancelled" else
                f"generation failed ({request_id}); it has been logged",
                kind="server_error")))
            failed = True
            break
          index = update.index
          logprobs = None
          if wants:
            logprobs = {"tokens": [], "token_logprobs": [],
                        "top_logprobs": [], "text_offset": []}
            if parsed.echo and update.prompt_logprobs is not None:
              logprobs = self._prompt_logprobs(parsed, index, update)
              frames.append(protocol.running_chunk(
                  head, index, parsed.prompts[index // parsed.n], logprobs))
              logprobs = None
            if update.token_logprobs is not None:
              logprobs = self._logprobs(
                  parsed, update.ids, update.token_logprobs, update.top_ids,
                  update.top_logprobs, offsets[index])
              offsets[index] += sum(len(t) for t in logprobs["tokens"])
          text = pending[index] + update.text
          if update.finish_reason is None:
            cut = max(len(text) - hold, 0)
            text, pending[index] = text[:cut], text[cut:]
            if text or logprobs:
              frames.append(protocol.running_chunk(head, index, text,
                                                   logprobs))
            continue
          finished += 1
          text = self._final_text(parsed, text, update.finish_reason)
          frames.append(protocol.json_event(self._envelope(
              request_id, parsed, [self._choice(
                  parsed, index, text, update.finish_reason, logprobs)])))
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


def _request_id() -> str:
  return f"cmpl-{uuid.uuid4().hex}"

