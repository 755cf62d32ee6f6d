"""OpenAI's chat completions: a conversation rendered to a prompt, and the
answer in chat's shapes.

A chat request is a completion of one prompt: its messages rendered by the
model's chat template (`rnnstep.model.chat_template`, on a checking
thread), its options checked by the completions' one check with the
template's end of turn among its stop strings
(`protocol.checked_chat_request`), run by the same scheduler. Only the
answer differs (`ChatAnswers`): `chat.completion` with each choice's
`message`, or `chat.completion.chunk` events whose `delta` opens with the
assistant's role, and log-probabilities as `logprobs.content[]`
(`{token, logprob, bytes, top_logprobs}`). The end of turn is a stop
string, so it is not part of the reply.
"""

import json
from typing import Sequence, Tuple
import uuid

from rnnstep.model import chat_template as chat_template_lib
from rnnstep.serve import answers as answers_lib
from rnnstep.serve import protocol

NO_TEMPLATE = ("this model has no chat template: start rnnstep-serve with "
               "--chat_template=FILE (a Jinja template, or a Hugging Face "
               "tokenizer_config.json), or use /v1/completions")


def new_request_id() -> str:
  """A chat completion's id (OpenAI's `chatcmpl-` form)."""
  return f"chatcmpl-{uuid.uuid4().hex}"


def render(template: chat_template_lib.ChatTemplate,
           messages: Sequence[Tuple[str, str]]) -> str:
  """The prompt of a request's (role, text) messages (on a checking thread).

  Raises:
    protocol.BadRequest: naming `messages`: the template failed or ran past
      its bounds.
  """
  try:
    return template.render(
        [chat_template_lib.Message(role, text) for role, text in messages],
        chat_template_lib.Limits(protocol.MAX_RENDERED_CHARS))
  except chat_template_lib.TemplateError as e:
    raise protocol.BadRequest("messages", f"messages: {e}") from None


class ChatAnswers(answers_lib.Answers):
  """Formats the chat completions of one served model (`Answers`' shapes
  turned into chat's)."""

  def __init__(self, model, model_id, metrics):
    super().__init__(model, model_id, metrics)
    self._token_bytes = None

  def token_bytes(self, token: int):
    """A token's UTF-8 bytes, as a list of ints (chat's `bytes`)."""
    if self._token_bytes is None:
      if self.model.tokens.kind == "characters":
        self._token_bytes = [list(c.encode("utf-8")) for c in self.model.vocab]
      else:
        self._token_bytes = [list(p) for p in self.model.tokens.pieces]
    return self._token_bytes[token]

  def _entry(self, token: int, logprob: float):
    return {"token": self.token_text(token), "logprob": float(logprob),
            "bytes": self.token_bytes(token)}

  def _logprobs(self, parsed, ids, logprobs, top_ids, top_logprobs,
                offset: int):
    """Chat's `logprobs` object for some tokens (`offset` is not used)."""
    del offset
    content = []
    for i, (token, lp) in enumerate(zip(ids, logprobs)):
      entry = self._entry(int(token), lp)
      entry["top_logprobs"] = [
          self._entry(int(t), v) for t, v in zip(
              top_ids[i][:parsed.logprobs], top_logprobs[i][:parsed.logprobs])]
      content.append(entry)
    return {"content": content}

  def _no_logprobs(self):
    return {"content": []}

  def _logprobs_chars(self, logprobs) -> int:
    return 0  # Chat's entries have no offsets.

  def _running_chunk(self, head: str, index: int, text: str,
                     logprobs=None) -> bytes:
    """A running choice's event: `protocol.running_chunk`'s, with chat's
    `delta`."""
    return (f'data: {head}{index}, "delta": {{"content": {json.dumps(text)}}}'
            f', "logprobs": {json.dumps(logprobs)}, "finish_reason": null}}]}}'
            '\r\n\r\n').encode()

  def _choice(self, parsed, index: int, text: str, reason, logprobs=None):
    if parsed.stream:
      return {"index": index, "delta": {"content": text} if text else {},
              "logprobs": logprobs, "finish_reason": reason}
    return {"index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs, "finish_reason": reason}

  def _envelope(self, request_id: str, parsed, choices, usage=None):
    out = {"id": request_id,
           "object": "chat.completion.chunk" if parsed.stream
           else "chat.completion",
           "created": parsed.created, "model": self.model_id,
           "seed": parsed.seed, "choices": choices}
    if usage is not None:
      out["usage"] = usage
    return out

  async def _frames(self, request_id: str, parsed, completion, output):
    """The completions' events, after a first one per choice that says the
    assistant's role (OpenAI's opening `delta`)."""
    head = protocol.chunk_head(self._envelope(request_id, parsed, []))
    yield b"".join(
        f'data: {head}{k}, "delta": {{"role": "assistant", "content": ""}}, '
        f'"logprobs": null, "finish_reason": null}}]}}\r\n\r\n'.encode()
        for k in range(len(parsed.prompts) * parsed.n))
    async for frames in super()._frames(request_id, parsed, completion,
                                        output):
      yield frames
