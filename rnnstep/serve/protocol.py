"""The OpenAI requests (pydantic models), their errors, and stop-string trimming.

A completion request is a pydantic model (vLLM's way), built from the option
declarations: its decoding fields are read from `options.OPTIONS` (those a
served graph takes and `stream` accepts, minus `window`, which belongs to the
model), so the server keeps no second list of them and `/openapi.json`
describes them (their bounds, from each option's `Range`, as the schema's
`minimum`/`maximum`). The model checks the JSON's types and shapes and the
server's own limits (`max_tokens`, `n` x prompts, `logprobs`); the values
are checked once, by the library's one check (`records.check`, whose
`ArgumentError` names the argument: `param_of` turns that name into the
request's field), into one frozen `CheckedRequest` (as vLLM's request model
converts itself once, `to_sampling_params()`), so a stop is normalized once
and a bad value reads as the library says it. What depends on the model
(its vocabulary, the pattern) the server checks next (`api.check_record`).

The body is decoded by Python's `json` (which keeps a lone surrogate, so that
the field holding one is the one named) after its size was bounded; a body
nested past the interpreter's recursion limit is refused as invalid JSON.
Every refusal is one line naming the field (`BadRequest`).

Nothing here imports TensorFlow.
"""

import dataclasses
import functools
import json
from typing import Annotated, Any, Dict, List, Optional, Sequence, Tuple, Union

import pydantic

from rnnstep.decoding import options as options_lib
from rnnstep import errors
from rnnstep import records

# OpenAI's default (vLLM's too).
DEFAULT_MAX_TOKENS = 16
# OpenAI's limit on `logprobs` for completions.
MAX_LOGPROBS = 5

DECODING_OPTIONS = tuple(
    option for option in options_lib.OPTIONS
    if option.served and option.streams and option.stage != options_lib.WINDOW)

# The library's argument names that a request spells otherwise.
_PARAM_OF = {"prompts": "prompt", "num_steps": "max_tokens",
             "return_scores": "logprobs"}


def param_of(argument: str) -> str:
  """The request field an `ArgumentError`'s argument is about."""
  return _PARAM_OF.get(argument, argument)


class BadRequest(errors.ArgumentError):
  """A bad request field (HTTP 400), naming it as `argument`."""


_STRICT = pydantic.ConfigDict(strict=True, extra="forbid")


def _unicode(text: str) -> str:
  """`text` if it is valid Unicode: JSON may hold a lone surrogate
  (`"\\ud800"`), which no vocabulary or pattern can use."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise ValueError(f"a lone surrogate at character {e.start} is not valid "
                     "Unicode") from None
  return text


# A JSON string that must be valid Unicode.
Text = Annotated[str, pydantic.AfterValidator(_unicode)]


# One prompt as token ids (the model's vocabulary is checked with the model).
TokenIds = Annotated[List[Annotated[int, pydantic.Field(ge=0)]],
                     pydantic.Field(min_length=1)]


class StreamOptions(pydantic.BaseModel):
  """OpenAI's `stream_options`."""
  model_config = _STRICT
  include_usage: Optional[bool] = False


def _option_type(option: options_lib.Option):
  """The pydantic type of a decoding option's one value.

  Its `Range` is the schema's documentation (`minimum`, ...), not a pydantic
  bound: `records.check` checks the value, in the library's words.
  """
  valid = option.valid
  bounds = {}
  if valid.low is not None:
    bounds["exclusiveMinimum" if valid.low_open else "minimum"] = valid.low
  if valid.high is not None:
    bounds["exclusiveMaximum" if valid.high_open else "maximum"] = valid.high
  schema = pydantic.Field(json_schema_extra=bounds or None)
  if valid.integer:
    return Annotated[int, schema]
  return Annotated[float, pydantic.WrapValidator(_number_as_given), schema]


def _number_as_given(value, handler):
  """A JSON number as the client wrote it: an integer stays one (`top_p: 2`
  is refused as the library refuses `top_p=2`, "got 2", not "got 2.0")."""
  checked = handler(value)
  return value if type(value) is int else checked  # pylint: disable=unidiomatic-typecheck


# `max_tokens`' lower bound, for the schema (`records.check` checks it).
_STEPS_SCHEMA = {"minimum": 0}


class CompletionFields(pydantic.BaseModel):
  """OpenAI's completions request, as this server takes it (the decoding
  options are added by `completion_request`)."""
  model_config = _STRICT
  model: Optional[Text] = pydantic.Field(
      None, description="The served model's name (--served_model_name); "
      "another gets 404.")
  prompt: Union[Text, Annotated[List[Text], pydantic.Field(min_length=1)],
                TokenIds, Annotated[List[TokenIds], pydantic.Field(
                    min_length=1)]] = pydantic.Field(
                        description="A prompt, a list of them, token ids (a "
                        "list of ints: one prompt) or a list of token-id "
                        "lists (one prompt each), as OpenAI's completions "
                        "take.")
  max_tokens: Optional[Annotated[int, pydantic.Field(
      json_schema_extra=_STEPS_SCHEMA)]] = pydantic.Field(
          DEFAULT_MAX_TOKENS, description="Tokens (the model's ids) to "
          "generate per choice.")
  # Stop strings and the pattern are text the library checks (`records`).
  stop: Optional[Union[str, List[str]]] = None
  seed: Optional[int] = None
  n: Optional[Annotated[int, pydantic.Field(ge=1)]] = 1
  stream: Optional[bool] = False
  stream_options: Optional[StreamOptions] = None
  user: Optional[Text] = None
  logprobs: Optional[Union[bool, Annotated[int, pydantic.Field(
      ge=0, le=MAX_LOGPROBS)]]] = pydantic.Field(
          None, description="k: each token's log-probability and the k most "
          "likely alternatives (OpenAI's shape); true is 0.")
  echo: Optional[bool] = pydantic.Field(
      False, description="Put the prompt in front of the text (and, with "
      "logprobs, its tokens' log-probabilities, the first null).")
  include_stop_str_in_output: Optional[bool] = False
  regex: Optional[str] = pydantic.Field(
      None, description="A regular expression the text must match.")
  state: Optional[Text] = pydantic.Field(
      None, description="The name of the initial state to start from "
      "(rnnstep-serve --states; default: --state's, else zeros); an unknown "
      "name gets 404.")


def completion_request(max_tokens_limit: int):
  """The request model of a server with these limits (in its schema too).

  Args:
    max_tokens_limit: the largest `max_tokens` served.

  Returns:
    A pydantic model class: `CompletionFields` with `max_tokens` bounded and
    one optional field per decoding option.
  """
  fields = {option.name: (Optional[_option_type(option)], pydantic.Field(
      None, description=option.doc)) for option in DECODING_OPTIONS}
  fields["max_tokens"] = (
      Optional[Annotated[int, pydantic.Field(
          le=max_tokens_limit, json_schema_extra=_STEPS_SCHEMA)]],
      pydantic.Field(DEFAULT_MAX_TOKENS, description="Tokens (the model's "
                     "ids) to generate per choice."))

  return pydantic.create_model("CompletionRequest",
                               __base__=CompletionFields, **fields)


class TokenizeRequest(pydantic.BaseModel):
  """vLLM's `/tokenize` request (completions form)."""
  model_config = _STRICT
  model: Optional[Text] = None
  prompt: Text


class DetokenizeRequest(pydantic.BaseModel):
  """vLLM's `/detokenize` request."""
  model_config = _STRICT
  model: Optional[Text] = None
  tokens: List[int]


@dataclasses.dataclass(frozen=True)
class CheckedRequest:
  """A completion request, checked once, as the server runs it.

  Made by `checked_request` from the validated pydantic model; the server's
  checks against the model add what they find (the prompts' ids, the
  compiled stop strings and pattern, the drawn seed) into a new one
  (`dataclasses.replace`), never into this one.

  Attributes:
    record: the rows' `records.Record` (each prompt n times, `max_tokens`
      as its `num_steps`; its seed None until the server draws one).
    prompts: the prompts (a str request is a tuple of one), each once: a
      str, or a tuple of token ids until the server's checks decode it
      (`RequestChecks`: the text an echo puts in front).
    n: choices per prompt.
    stream: answer with server-sent events.
    include_usage: end a stream with a usage chunk.
    logprobs: None, or k: per-token log-probabilities with k alternatives.
    echo: the prompt goes in front of each choice's text.
    include_stop_str_in_output: keep a matched stop string in `text`.
    model: the model it names, or None.
    created: the response's `created` time (set when it is answered).
    prompt_tokens: the prompts' ids, each prompt once (set once encoded).
    prompt_ids: per choice, its prompt's ids (set once encoded).
    stop_automaton: the stop strings' automaton (set once checked).
    pattern: `regex` compiled (set once checked; None without one).
    state: the named initial state it starts from, or None (the server's
      default).
    prompt_field: the request field its prompts came from, which a refusal
      of a prompt names (`messages` for a chat request).
    cache_points: character offsets into its (one) prompt where the prefix
      cache should keep the state (a chat's message boundaries); the
      checks make them offsets in ids (`Completion.cache_points`).
  """
  record: records.Record
  prompts: Tuple[Union[str, Tuple[int, ...]], ...]
  n: int
  stream: bool
  include_usage: bool
  logprobs: Optional[int]
  echo: bool
  include_stop_str_in_output: bool
  model: Optional[str]
  created: int = 0
  prompt_tokens: int = 0
  prompt_ids: Optional[list] = None
  stop_automaton: Any = None
  pattern: Any = None
  state: Optional[str] = None
  prompt_field: str = "prompt"
  cache_points: Tuple[int, ...] = ()

  @property
  def max_tokens(self) -> int:
    """Tokens (a character model's characters) per choice."""
    return self.record.num_steps

  @property
  def seed(self) -> Optional[int]:
    """The seed (None until the server draws one, if none was given)."""
    return self.record.seed

  @property
  def stop(self) -> Tuple[str, ...]:
    """The stop strings."""
    return self.record.stop

  @property
  def regex(self) -> Optional[str]:
    """The pattern, or None (a request gives one for all its rows)."""
    return self.record.regex[0] if self.record.regex else None


def decode_body(raw: bytes) -> Any:
  """The request body's JSON.

  Raises:
    BadRequest: naming `body`: not UTF-8, not JSON, or nested too deep.
  """
  try:
    return json.loads(raw)
  except RecursionError:
    raise BadRequest("body", "the body is not valid JSON: nested too "
                     "deeply") from None
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, huge ints.
    raise BadRequest("body", f"the body is not valid JSON: {e}"[:300]) from None


def validate(model_class, body: Any):
  """`model_class.model_validate(body)`, its first error as a `BadRequest`.

  Raises:
    BadRequest: naming the field at fault (`body` for the whole), in one
      line.
  """
  try:
    return model_class.model_validate(body)
  except pydantic.ValidationError as e:
    raise _bad_request(model_class, e) from None


def _bad_request(model_class, error: pydantic.ValidationError) -> BadRequest:
  found = error.errors(include_url=False)
  # Of a union's errors, the one past its type check (`logprobs: 9`: over
  # the bound, rather than "not a boolean").
  first = next((e for e in found if e["loc"][:1] == found[0]["loc"][:1]
                and not e["type"].endswith("_type")), found[0])
  loc = first["loc"]
  if not loc:
    return BadRequest("body", "the request body must be a JSON object")
  name = str(loc[0])
  if first["type"] == "extra_forbidden" and len(loc) == 1:
    return BadRequest(name, f"unknown field {name!r}; this server takes "
                      f"{', '.join(model_class.model_fields)}"[:600])
  message = first["msg"].removeprefix("Value error, ")
  if name == "prompt" and first["type"] != "value_error":
    return BadRequest(name, "prompt must be a string, a non-empty list of "
                      "strings, a non-empty list of token ids (integers from "
                      "0) or a list of such lists, got "
                      f"{first['input']!r:.80}")
  # The union's branch names (loc[1:]) say nothing a client can act on.
  return BadRequest(name, f"{name}: {message}, got "
                    f"{json.dumps(first['input'])[:80]}".replace("\n", " "))


def checked_request(request, max_batch: int) -> CheckedRequest:
  """The `CheckedRequest` of a validated `completion_request` instance: its
  values through `records.check`, once.

  Args:
    request: the validated request.
    max_batch: `n` x prompts may not exceed it (a request's rows run
      together).

  Raises:
    BadRequest: naming `n`, for more choices than `max_batch`.
    errors.ArgumentError: a bad value, in the library's words, naming the
      argument (`param_of` names its field).
  """
  prompts = ((request.prompt,) if isinstance(request.prompt, str)
             else records.check_prompts(request.prompt))
  n = request.n or 1
  if n * len(prompts) > max_batch:
    raise BadRequest("n", f"n x prompts = {n} x {len(prompts)} = "
                     f"{n * len(prompts)} choices; this server runs at most "
                     f"{max_batch} (--max_batch) at once")
  logprobs = request.logprobs
  if isinstance(logprobs, bool):  # true: the tokens' own, no alternatives.
    logprobs = 0 if logprobs else None
  record = records.check(
      [prompt for prompt in prompts for _ in range(n)],
      DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens,
      seed=request.seed, stop=request.stop, regex=request.regex,
      return_scores=logprobs is not None,
      options={option.name: getattr(request, option.name)
               for option in DECODING_OPTIONS
               if getattr(request, option.name) is not None},
      steps_name="max_tokens")
  return CheckedRequest(
      record=record, prompts=prompts, n=n, stream=bool(request.stream),
      include_usage=bool(request.stream_options
                         and request.stream_options.include_usage),
      logprobs=logprobs, echo=bool(request.echo),
      include_stop_str_in_output=bool(request.include_stop_str_in_output),
      model=request.model, state=request.state)


def trim_stop(text: str, stops: Sequence[str]) -> str:
  """`text` without the stop string it ends with (the longest that fits)."""
  for stop in sorted(stops, key=len, reverse=True):
    if stop and text.endswith(stop):
      return text[:-len(stop)]
  return text


def held_back(stops: Sequence[str]) -> int:
  """Characters a stream holds back while running, so that no part of a stop
  string it will remove is sent first."""
  return max([len(s) for s in stops] + [1]) - 1


def chunk_head(envelope: Dict[str, Any]) -> str:
  """A streamed chunk's JSON up to its choice's index, made once a request.

  Args:
    envelope: the response's fields with `choices` last and empty.

  Returns:
    `json.dumps(envelope)` open at the choices' list, up to `{"index": `;
    `running_chunk` finishes it.

  Raises:
    ValueError: `choices` is not last, or not empty.
  """
  text = json.dumps(envelope)
  if not text.endswith('"choices": []}'):
    raise ValueError("the envelope must end with an empty choices list")
  return text[:-2] + '{"index": '


def running_chunk(head: str, index: int, text: str,
                  logprobs: Optional[Dict[str, Any]] = None) -> bytes:
  """One server-sent event: a running choice's new text.

  Formatted directly rather than building and encoding the whole object per
  event: only the text (and the log-probabilities) are encoded here.

  Args:
    head: the request's `chunk_head`.
    index: the choice's index.
    text: its new characters.
    logprobs: its new tokens' `logprobs` object, or None.

  Returns:
    `event` of `json.dumps` of the envelope with the one choice `{"index",
    "text", "logprobs", "finish_reason": null}`, byte for byte.
  """
  return (f'data: {head}{index}, "text": {json.dumps(text)}, "logprobs": '
          f'{json.dumps(logprobs)}, "finish_reason": null}}]}}\r\n\r\n'
          ).encode()


def error_body(message: str, *, kind: str = "invalid_request_error",
               param: Optional[str] = None,
               code: Optional[str] = None) -> Dict[str, Any]:
  """OpenAI's error object: `{"error": {"message", "type", "param",
  "code"}}` (an error response's body, or a stream's last event)."""
  return {"error": {"message": message, "type": kind, "param": param,
                    "code": code}}


def json_event(obj: Any) -> bytes:
  """`event` of `json.dumps(obj)`."""
  return event(json.dumps(obj))


def event(payload: str) -> bytes:
  """One server-sent event, framed as sse-starlette frames one (CRLF).

  Args:
    payload: its data, one line (a JSON text, or `[DONE]`).

  Returns:
    `data: <payload>` and a blank line, as bytes.
  """
  return f"data: {payload}\r\n\r\n".encode()


# -- chat completions ---------------------------------------------------------

# Bounds of a chat request (its body is bounded too, --max_body_bytes).
MAX_MESSAGES = 1024
MAX_CONTENT_CHARS = 1 << 20
# The most characters a conversation may render to (the prompt's tokens are
# then bounded by --max_prompt_tokens).
MAX_RENDERED_CHARS = 1 << 21
CHAT_ROLES = ("system", "user", "assistant")


class ContentPart(pydantic.BaseModel):
  """A part of a message's content: only text parts are taken."""
  model_config = pydantic.ConfigDict(strict=True, extra="allow")
  type: Annotated[str, pydantic.Field(json_schema_extra={"enum": ["text"]})]
  text: Optional[Annotated[Text, pydantic.Field(
      max_length=MAX_CONTENT_CHARS)]] = None


class ChatMessage(pydantic.BaseModel):
  """One message (OpenAI's `name` is taken and not used)."""
  model_config = _STRICT
  role: Annotated[str, pydantic.Field(
      json_schema_extra={"enum": list(CHAT_ROLES)})]
  content: Union[Annotated[Text, pydantic.Field(max_length=MAX_CONTENT_CHARS)],
                 Annotated[List[ContentPart], pydantic.Field(
                     max_length=MAX_MESSAGES)]]
  name: Optional[Text] = None


class ChatFields(pydantic.BaseModel):
  """OpenAI's chat completions request, as this server takes it: its own
  fields here, the rest as completions has them (`chat_request`)."""
  model_config = _STRICT
  messages: Annotated[List[ChatMessage], pydantic.Field(
      min_length=1, max_length=MAX_MESSAGES)] = pydantic.Field(
          description="The conversation, rendered by the model's chat "
          "template (--chat_template).")
  logprobs: Optional[bool] = pydantic.Field(
      None, description="Each token's log-probability (chat's shape).")
  top_logprobs: Optional[Annotated[int, pydantic.Field(
      ge=0, le=MAX_LOGPROBS)]] = pydantic.Field(
          None, description="With logprobs: the k most likely alternatives "
          "of each token.")


# The fields a chat request has as a completion request has them.
CHAT_AS_COMPLETION = ("model", "max_tokens", "stop", "seed", "n", "stream",
                      "stream_options", "user", "regex", "state")


def chat_request(max_tokens_limit: int):
  """The chat request model of a server with these limits (in its schema
  too): `ChatFields`, `CHAT_AS_COMPLETION` and the decoding options as
  `completion_request`'s, and `max_completion_tokens` bounded as
  `max_tokens`."""
  completion = completion_request(max_tokens_limit)
  names = set(CHAT_AS_COMPLETION) | {o.name for o in DECODING_OPTIONS}
  fields = {name: (field.annotation, field)
            for name, field in completion.model_fields.items()
            if name in names}
  steps = completion.model_fields["max_tokens"]
  fields["max_completion_tokens"] = (steps.annotation, pydantic.Field(
      None, description="Tokens (the model's ids) to generate per choice; "
      "max_tokens' newer name.", json_schema_extra=_STEPS_SCHEMA))
  return pydantic.create_model("ChatCompletionRequest", __base__=ChatFields,
                               **fields)


def chat_messages(request) -> List[Tuple[str, str]]:
  """A validated chat request's messages as (role, text) pairs.

  A list of content parts is its text parts joined by line ends (vLLM's
  way).

  Raises:
    BadRequest: naming `messages[i].role` (not system, user or assistant)
      or `messages[i].content[j].type` (a part that is not text).
  """
  out = []
  for i, message in enumerate(request.messages):
    if message.role not in CHAT_ROLES:
      raise BadRequest(
          f"messages[{i}].role", f"messages[{i}].role must be one of "
          f"{', '.join(CHAT_ROLES)}, got {message.role[:40]!r}")
    content = message.content
    if not isinstance(content, str):
      texts = []
      for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
          raise BadRequest(
              f"messages[{i}].content[{j}].type",
              f"messages[{i}].content[{j}] must be a text part "
              f"({{\"type\": \"text\", \"text\": ...}}), got type "
              f"{part.type[:40]!r}")
        texts.append(part.text)
      content = "\n".join(texts)
    out.append((message.role, content))
  return out


@functools.lru_cache(maxsize=1)
def _completion_fields():
  """A completion request model, for its fields (not its bounds)."""
  return completion_request(1)


def checked_chat_request(request, prompt: str, end_of_turn: Sequence[str],
                         max_batch: int) -> CheckedRequest:
  """The `CheckedRequest` of a validated `chat_request` instance whose
  messages rendered to `prompt`: its values through the completions' one
  check (`checked_request`), the template's end of turn added to its stop
  strings, so that the reply is cut before it.

  Raises:
    BadRequest: naming the field: both `max_tokens` and
      `max_completion_tokens` given with different values,
      `top_logprobs` without `logprobs`; or as `checked_request`.
    errors.ArgumentError: as `checked_request`.
  """
  max_tokens = request.max_completion_tokens
  if max_tokens is None:
    max_tokens = request.max_tokens
  elif "max_tokens" in request.model_fields_set and (
      request.max_tokens not in (None, max_tokens)):
    raise BadRequest("max_completion_tokens", "max_tokens and "
                     "max_completion_tokens differ; give one")
  if request.top_logprobs is not None and not request.logprobs:
    raise BadRequest("top_logprobs", "top_logprobs needs logprobs: true")
  stops = [request.stop] if isinstance(request.stop, str) else list(
      request.stop or [])
  stops += [s for s in end_of_turn if s not in stops]
  fields = {name: getattr(request, name) for name in (
      *CHAT_AS_COMPLETION, *(o.name for o in DECODING_OPTIONS))}
  fields.update(max_tokens=max_tokens, stop=stops or None)
  # A completion request of the values the chat model has validated (its
  # defaults for any field a chat request does not have).
  as_completion = _completion_fields().model_construct(
      prompt=prompt,
      logprobs=(request.top_logprobs or 0) if request.logprobs else None,
      echo=False, include_stop_str_in_output=False, **fields)
  checked = checked_request(as_completion, max_batch)
  return dataclasses.replace(checked, prompt_field="messages")
