"""The HTTP server's routes: OpenAI's completions API on FastAPI.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (JSON, or
server-sent events with `stream: true`, ending with `data: [DONE]`; a chat
request is a completion of its messages rendered by the model's chat
template, `chat.py`), `GET /v1/models`,
`POST /tokenize` and `/detokenize` (vLLM's), `GET /health` (503 until the
model's programs are warm, and while draining), `GET /metrics` (Prometheus),
`GET /openapi.json` (the schema, from the pydantic request models).

A completion is read and bounded (`http.py`), validated (`protocol.py`),
checked on a checking thread (`checks.py`) and submitted to the scheduler
(`scheduler.py`), which owns the device; the handler awaits its
`http.Output`, to which the scheduler thread hands each chunk's updates in
one `call_soon_threadsafe` (`Server._deliver`), and answers in OpenAI's
shapes (`answers.py`). The event loop only parses, formats and sends.
"""

import asyncio
import dataclasses
import functools
import time
from typing import Optional, Sequence

import fastapi
import numpy as np
import prometheus_client
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rnnstep import errors
from rnnstep.engine import host
from rnnstep.serve import answers as answers_lib
from rnnstep.serve import chat as chat_lib
from rnnstep.serve import checks
from rnnstep.serve import completion as completion_lib
from rnnstep.serve import http
from rnnstep.serve import prefix_cache as prefix_cache_lib
from rnnstep.serve import protocol


class Server:
  """The FastAPI app and the state its handlers share.

  Args:
    model: the `rnnstep.Model` the scheduler runs.
    scheduler: the `scheduler.Scheduler` (or `lanes.Lanes`; started by the
      caller).
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
      slots (the scheduler's own queue is the same limit).
    chat_template: the model's `chat_template.ChatTemplate` (None: chat
      requests get 400 naming --chat_template).
  """

  def __init__(self, model, scheduler, *, model_id: str,
               max_body_bytes: int = 1 << 20, api_keys: Sequence[str] = (),
               allowed_origins: Sequence[str] = (),
               allowed_hosts: Sequence[str] = ("*",),
               body_seconds: float = 30.0, check_seconds: float = 10.0,
               max_queue: Optional[int] = None, chat_template=None):
    self.model = model
    self.scheduler = scheduler
    self.model_id = model_id
    self.max_body_bytes = int(max_body_bytes)
    self.body_seconds = float(body_seconds)
    self.ready = False
    self.draining = False
    self.created = int(time.time())
    self.metrics = http.Metrics(scheduler)
    self.answers = answers_lib.Answers(model, model_id, self.metrics)
    self.checks = checks.RequestChecks(
        model, scheduler, check_seconds=check_seconds,
        max_queue=scheduler.max_queue if max_queue is None else max_queue)
    self.request_model = protocol.completion_request(
        scheduler.max_tokens_limit)
    self.chat_template = chat_template
    self.chat_answers = chat_lib.ChatAnswers(model, model_id, self.metrics)
    self.chat_model = protocol.chat_request(scheduler.max_tokens_limit)
    self._loop = None  # The event loop, when the first request comes.
    scheduler.deliver = self._deliver
    app = fastapi.FastAPI(
        title="rnnstep-serve", docs_url=None, redoc_url=None,
        description="OpenAI's completions and chat completions APIs over an "
        "rnnstep model.")
    body = lambda model_class: {"requestBody": {
        "required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model_class.__name__}"}
        }}}}
    app.add_api_route("/v1/completions", self.completions, methods=["POST"],
                      openapi_extra=body(self.request_model))
    app.add_api_route("/v1/chat/completions", self.chat_completions,
                      methods=["POST"], openapi_extra=body(self.chat_model))
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
    app.add_middleware(http.Gate, keys=keys)
    if allowed_origins:
      app.add_middleware(
          CORSMiddleware, allow_origins=list(allowed_origins),
          allow_methods=["GET", "POST"],
          allow_headers=["Authorization", "Content-Type"])
    if list(allowed_hosts) != ["*"]:
      app.add_middleware(TrustedHostMiddleware,
                         allowed_hosts=list(allowed_hosts))
    self.app = http.Front(self.completions, app, keys, allowed_hosts,
                          bool(allowed_origins))

  def _openapi(self):
    """The schema, with the request models under components."""
    if self.fastapi.openapi_schema is None:
      schema = fastapi.openapi.utils.get_openapi(
          title=self.fastapi.title, version="1", routes=self.fastapi.routes,
          description=self.fastapi.description)
      components = schema.setdefault("components", {}).setdefault(
          "schemas", {})
      for model_class in (self.request_model, self.chat_model,
                          protocol.TokenizeRequest,
                          protocol.DetokenizeRequest):
        one = model_class.model_json_schema(
            ref_template="#/components/schemas/{model}")
        components.update(one.pop("$defs", {}))
        components[model_class.__name__] = one
      self.fastapi.openapi_schema = schema
    return self.fastapi.openapi_schema

  async def _http_error(self, request: Request, e: HTTPException) -> Response:
    del request
    return http.error_response(
        e.status_code, str(e.detail),
        code="not_found" if e.status_code == 404 else None,
        headers=getattr(e, "headers", None))

  async def _server_error(self, request: Request, e: Exception) -> Response:
    """A fault of the server's: 500, logged once with a request id."""
    return http.fault(request.url.path, e)

  def shutdown(self) -> None:
    """Stops admitting (503) and abandons the checks still running."""
    self.draining = True
    self.checks.abandon()

  # -- small routes ----------------------------------------------------------

  async def health(self) -> Response:
    if self.draining:
      return http.shutting_down()
    if not self.ready:
      return http.shutting_down("loading the model and compiling its "
                                "programs")
    # Ready: served from now on. Programs still compiling (on the XLA
    # path) run their calls on the graph path meanwhile.
    return JSONResponse({"status": "ok",
                         "programs_compiling": self.scheduler.compiling})

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
        raise http.bad_request(e) from None
      tokens = ids[0, :lengths[0]].tolist()
      return JSONResponse({
          "count": len(tokens),
          "max_model_len": self.scheduler.max_prompt_tokens,
          "tokens": tokens})
    except http.Refused as e:
      return e.response

  async def detokenize(self, request: Request) -> Response:
    """`POST /detokenize`: the text of ids, as vLLM answers."""
    try:
      body = await self._request_json(request, protocol.DetokenizeRequest)
      if len(body.tokens) > self.max_body_bytes // 2 or any(
          not 0 <= t < self.model.vocab_size for t in body.tokens):
        raise http.Refused(http.error_response(
            400, f"tokens must be ids from 0 to {self.model.vocab_size - 1}",
            param="tokens"))
      return JSONResponse({"prompt": self.model.decode(
          np.asarray(body.tokens, np.int32))})
    except http.Refused as e:
      return e.response

  # -- reading a request -----------------------------------------------------

  async def _request_json(self, request: Request, model_class):
    """The body, read within its bounds (`http.read_body`) and validated as
    `model_class`, whose `model` field (if given) must name the served
    model.

    Raises:
      http.Refused: 400, 404, 408 or 413.
    """
    raw = await http.read_body(request, self.max_body_bytes,
                               self.body_seconds)
    return http.validated(raw, model_class, self.model_id)

  # -- completions -----------------------------------------------------------

  def _answer(self, response: Response) -> Response:
    self.metrics.requests.labels(str(response.status_code)).inc()
    return response

  async def completions(self, request: Request) -> Response:
    """`POST /v1/completions`."""
    request_id = http.new_request_id()
    try:
      return await self._completions(request, request_id)
    except http.Refused as e:
      return self._answer(e.response)
    except Exception as e:  # pylint: disable=broad-except
      return self._answer(http.fault("/v1/completions", e, request_id))

  async def chat_completions(self, request: Request) -> Response:
    """`POST /v1/chat/completions`."""
    request_id = chat_lib.new_request_id()
    try:
      return await self._completions(request, request_id, chat=True)
    except http.Refused as e:
      return self._answer(e.response)
    except Exception as e:  # pylint: disable=broad-except
      return self._answer(http.fault("/v1/chat/completions", e, request_id))

  async def _chat_request(self, request: Request) -> protocol.CheckedRequest:
    """A chat request read, its messages rendered (on a checking thread)
    and its values checked.

    Raises:
      http.Refused: as `_request_json`; 400 naming the field, or naming
        --chat_template for a model without one.
    """
    body = await self._request_json(request, self.chat_model)
    if self.chat_template is None:
      raise http.Refused(http.error_response(400, chat_lib.NO_TEMPLATE,
                                             code="no_chat_template"))
    try:
      messages = protocol.chat_messages(body)
      prompt = await self.checks.run(chat_lib.render, self.chat_template,
                                     messages)
      checked = protocol.checked_chat_request(
          body, prompt, self.chat_template.end_of_turn,
          self.scheduler.max_batch)
      # The messages' boundaries, where the prefix cache keeps states.
      points = await self.checks.run(
          prefix_cache_lib.message_boundaries,
          functools.partial(chat_lib.render, self.chat_template), messages,
          prompt)
      return dataclasses.replace(checked, cache_points=points)
    except errors.ArgumentError as e:
      raise http.bad_request(e) from None

  async def _completions(self, request: Request, request_id: str,
                         chat: bool = False) -> Response:
    if self.draining or not self.ready:
      raise http.Refused(http.shutting_down(
          "the server is shutting down" if self.draining else
          "the model is still loading"))
    arrived = time.monotonic()
    answers = self.chat_answers if chat else self.answers
    if chat:
      parsed = await self._chat_request(request)
    else:
      body = await self._request_json(request, self.request_model)
      try:
        parsed = protocol.checked_request(body, self.scheduler.max_batch)
      except errors.ArgumentError as e:
        raise http.bad_request(e) from None
    if parsed.state is not None and parsed.state not in self.scheduler.states:
      raise http.Refused(http.error_response(
          404, f"the state {parsed.state[:100]!r} does not exist (rnnstep-serve"
          " --states names them)", param="state", code="not_found"))
    checked = await self.checks.checked(parsed)
    parsed = checked[0]  # With what the checks found (frozen: a new one).
    completion, output = self._output(checked, arrived)
    if completion is not None:
      try:
        self.scheduler.submit(completion)
      except completion_lib.QueueFull:
        raise http.Refused(http.queue_full()) from None
      except completion_lib.ShuttingDown:
        raise http.Refused(http.shutting_down()) from None
    headers = {"X-Request-Id": request_id}
    if parsed.stream:
      self.metrics.requests.labels("200").inc()
      # Server-sent events as bytes on Starlette's streaming response (as
      # vLLM's OpenAI server sends them), with sse-starlette's headers.
      headers.update({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
      return http.EventStream(
          answers.events(request_id, parsed, completion, output),
          completion, headers)
    response = await self._whole(request, request_id, parsed, completion,
                                 output, answers)
    response.headers.update(headers)
    return self._answer(response)

  def _output(self, checked, arrived: float):
    """A checked request's `Completion` and `http.Output` (made on the event
    loop, whose futures the output holds); (None, None) when nothing runs
    (`max_tokens` 0 without the prompt's log-probabilities).

    Args:
      checked: `checks.RequestChecks.check`'s result.
      arrived: when the request came (`time.monotonic()`).
    """
    parsed, rows, _ = checked
    if parsed.max_tokens == 0 and not (parsed.echo
                                       and parsed.logprobs is not None):
      return None, None
    self._loop = asyncio.get_running_loop()
    output = http.Output(self.metrics, len(rows), parsed.stream, arrived)
    return checks.completion_of(checked, output.add), output

  def _deliver(self, updates) -> None:
    """The scheduler's `deliver` (its thread): a round's updates to the
    event loop in one hand-off (one wake-up of the loop a chunk, not one a
    row).

    Args:
      updates: [(Completion, Update)] of the round.

    Raises:
      RuntimeError: the loop is closed (the scheduler cancels their rows).
    """
    self._loop.call_soon_threadsafe(completion_lib.call_sinks, updates)

  # -- answers ---------------------------------------------------------------

  async def _whole(self, request: Request, request_id: str, parsed,
                   completion, output: http.Output,
                   answers: answers_lib.Answers) -> Response:
    """The non-streamed answer (in `answers`' shapes), once every choice
    has finished."""
    count = len(parsed.prompts) * parsed.n
    if completion is None:
      output = None
      texts, reasons, generated = [""] * count, ["length"] * count, 0
    else:
      watcher = asyncio.create_task(http.cancel_on_disconnect(
          request.receive, completion))
      try:
        await output.done
        went_away = watcher.done()
      except asyncio.CancelledError:  # uvicorn's drain timed out.
        completion.cancel()
        raise
      finally:
        watcher.cancel()
      if went_away:  # The client went away; its rows are retired.
        return http.error_response(499, "the client went away")
      self.metrics.latency.observe(time.monotonic() - output.arrived)
      texts, reasons, generated = output.texts, output.reasons, output.generated
      if "error" in reasons:
        return http.generation_failed(request_id, output.messages)
      if "cancelled" in reasons:
        return http.shutting_down("the server shut down before this "
                                  "request finished")
    return JSONResponse(answers.whole(request_id, parsed, texts, reasons,
                                      generated, output))
