"""The OpenAI completions request: its fields, their checks, and stop-string trimming.

The decoding options a request may set are read from `options.OPTIONS` (those
a served graph takes and `stream` accepts, minus `window`, which belongs to the
model): the server keeps no second list of them. Every value is checked by
the library's own checks (`api.check_request`), whose `ArgumentError` names
the argument; `param_of` turns that name into the request's field name.

Nothing here imports TensorFlow.
"""

import dataclasses
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rnnstep.decoding import options as options_lib
from rnnstep import errors

# OpenAI's default (vLLM's too).
DEFAULT_MAX_TOKENS = 16

DECODING_OPTIONS = tuple(
    option for option in options_lib.OPTIONS
    if option.served and option.streams and option.stage != options_lib.WINDOW)

# The request's own fields (besides the decoding options), OpenAI's names.
FIELDS = ("model", "prompt", "max_tokens", "stop", "seed", "n", "stream",
          "stream_options", "user", "logprobs", "include_stop_str_in_output",
          "regex") + tuple(option.name for option in DECODING_OPTIONS)

# The library's argument names that a request spells otherwise.
_PARAM_OF = {"prompts": "prompt", "num_steps": "max_tokens",
             "return_scores": "logprobs"}


def param_of(argument: str) -> str:
  """The request field an `ArgumentError`'s argument is about."""
  return _PARAM_OF.get(argument, argument)


class BadRequest(errors.ArgumentError):
  """A bad request field (HTTP 400), naming it as `argument`."""


@dataclasses.dataclass
class Parsed:
  """A request's fields, their JSON types checked (values: the library's checks).

  Attributes:
    prompts: the prompts (a str request is a list of one).
    max_tokens: tokens (a character model's characters) per choice.
    n: choices per prompt.
    stream: answer with server-sent events.
    include_usage: end a stream with a usage chunk.
    logprobs: whether to return each choice's log-likelihood.
    include_stop_str_in_output: keep a matched stop string in `text`.
    seed: the seed, or None.
    stop: as given (None, a str or a list).
    regex: a pattern or None.
    decoding: the decoding options given, by name.
    created: the response's `created` time (set when it is answered).
    prompt_tokens: the prompts' ids, each prompt once (set once encoded).
  """
  prompts: List[str]
  max_tokens: int
  n: int
  stream: bool
  include_usage: bool
  logprobs: bool
  include_stop_str_in_output: bool
  seed: Optional[int]
  stop: Any
  regex: Optional[str]
  decoding: Dict[str, Any]
  created: int = 0
  prompt_tokens: int = 0


def _is_int(value) -> bool:
  return options_lib.is_int(value)


def parse(body: Any, *, max_tokens_limit: int, max_batch: int,
          max_prompt_chars: int) -> Parsed:
  """Checks a decoded JSON body's fields and their JSON types.

  Args:
    body: the decoded JSON.
    max_tokens_limit: the largest max_tokens served.
    max_batch: n x prompts may not exceed it (a request's rows run together).
    max_prompt_chars: the longest prompt served.

  Returns:
    The `Parsed` request.

  Raises:
    BadRequest: naming the field at fault.
  """
  if not isinstance(body, dict):
    raise BadRequest("body", "the request body must be a JSON object")
  for name in body:
    if name not in FIELDS:
      raise BadRequest(name, f"unknown field {name!r}; this server takes "
                       f"{', '.join(FIELDS)}")
  if not isinstance(body.get("model", ""), str):
    raise BadRequest("model", "model must be a string")
  if not isinstance(body.get("user", ""), (str, type(None))):
    raise BadRequest("user", "user must be a string")
  prompt = body.get("prompt")
  if isinstance(prompt, str):
    prompts = [prompt]
  elif (isinstance(prompt, list) and prompt
        and all(isinstance(p, str) for p in prompt)):
    prompts = list(prompt)
  else:
    raise BadRequest("prompt", "prompt must be a string or a non-empty list "
                     f"of strings (token ids are not taken), got {prompt!r:.80}")
  for i, text in enumerate(prompts):
    if len(text) > max_prompt_chars:
      raise BadRequest("prompt", f"prompt {i} has {len(text)} characters; "
                       f"this server takes at most {max_prompt_chars}")
  max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
  if max_tokens is None:
    max_tokens = DEFAULT_MAX_TOKENS
  if not _is_int(max_tokens) or max_tokens < 0:
    raise BadRequest("max_tokens", "max_tokens must be a non-negative integer "
                     f"(characters), got {max_tokens!r}")
  if max_tokens > max_tokens_limit:
    raise BadRequest("max_tokens", f"max_tokens={max_tokens} is over this "
                     f"server's limit of {max_tokens_limit} characters")
  n = body.get("n", 1)
  if n is None:
    n = 1
  if not _is_int(n) or n < 1:
    raise BadRequest("n", f"n must be a positive integer, got {n!r}")
  if n * len(prompts) > max_batch:
    raise BadRequest("n", f"n x prompts = {n} x {len(prompts)} = "
                     f"{n * len(prompts)} choices; this server runs at most "
                     f"{max_batch} (--max_batch) at once")
  flags = {}
  for name in ("stream", "include_stop_str_in_output"):
    value = body.get(name, False)
    if value is None:
      value = False
    if not isinstance(value, bool):
      raise BadRequest(name, f"{name} must be true or false, got {value!r}")
    flags[name] = value
  stream_options = body.get("stream_options") or {}
  if not isinstance(stream_options, dict) or any(
      key != "include_usage" or not isinstance(value, bool)
      for key, value in stream_options.items()):
    raise BadRequest("stream_options", "stream_options must be "
                     '{"include_usage": true|false}')
  logprobs = body.get("logprobs")
  if logprobs is not None and not (isinstance(logprobs, bool) or (
      _is_int(logprobs) and 0 <= logprobs <= 5)):
    raise BadRequest("logprobs", "logprobs must be null, true/false or an "
                     f"integer from 0 to 5, got {logprobs!r}")
  regex = body.get("regex")
  if regex is not None and not isinstance(regex, str):
    raise BadRequest("regex", f"regex must be a string, got {regex!r:.80}")
  decoding = {}
  for option in DECODING_OPTIONS:
    value = body.get(option.name)
    if value is None:
      continue
    if isinstance(value, (list, dict, str, bool)):  # A per-row list is not
      raise BadRequest(option.name, f"{option.name} must be a number, got "
                       f"{value!r:.80}")  # OpenAI's: one value per request.
    decoding[option.name] = value
  return Parsed(prompts=prompts, max_tokens=max_tokens, n=n,
                stream=flags["stream"],
                include_usage=bool(stream_options.get("include_usage")),
                logprobs=bool(logprobs) if logprobs is not None else False,
                include_stop_str_in_output=flags[
                    "include_stop_str_in_output"],
                seed=body.get("seed"), stop=body.get("stop"), regex=regex,
                decoding=decoding)


def stop_strings(stop) -> Tuple[str, ...]:
  """The stop argument as a tuple (after the library checked it)."""
  if stop is None:
    return ()
  return (stop,) if isinstance(stop, str) else tuple(stop)


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


def running_chunk(head: str, index: int, text: str) -> bytes:
  """One server-sent event: a running choice's new text.

  Formatted directly rather than building and encoding the whole object per
  event: only the text is encoded here.

  Args:
    head: the request's `chunk_head`.
    index: the choice's index.
    text: its new characters.

  Returns:
    `event` of `json.dumps` of the envelope with the one choice `{"index",
    "text", "logprobs": null, "finish_reason": null}`, byte for byte.
  """
  return (f'data: {head}{index}, "text": {json.dumps(text)}, "logprobs": '
          'null, "finish_reason": null}]}\r\n\r\n').encode()


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
