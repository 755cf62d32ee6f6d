"""A completion's answer in OpenAI's shapes: the whole JSON body, or its
server-sent events.

A stream's events are bytes formatted directly (`protocol.running_chunk`),
every choice's event of a chunk in one write; a choice's text is held back
by the longest stop string's length less one, so that a stop string the
answer trims is never sent before it is known (`protocol.held_back`).
"""

import asyncio
import time
from typing import Optional

import numpy as np

from rnnstep.serve import http
from rnnstep.serve import protocol


class Answers:
  """Formats the completions of one served model.

  Args:
    model: the served `rnnstep.Model` (its tokens' texts).
    model_id: the name answers carry.
    metrics: the server's `http.Metrics` (a stream's latency).
  """

  def __init__(self, model, model_id: str, metrics: http.Metrics):
    self.model = model
    self.model_id = model_id
    self.metrics = metrics
    self._token_texts = None


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

  def _no_logprobs(self):
    """The `logprobs` object of no tokens (what a choice's parts join to)."""
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [],
            "text_offset": []}

  def _logprobs_chars(self, logprobs) -> int:
    """The characters of a `logprobs` object's tokens (the next token's
    `text_offset` moves by them)."""
    return sum(len(t) for t in logprobs["tokens"])

  def _running_chunk(self, head: str, index: int, text: str,
                     logprobs=None) -> bytes:
    """A running choice's event (`protocol.running_chunk`)."""
    return protocol.running_chunk(head, index, text, logprobs)

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


  def whole(self, request_id: str, parsed, texts, reasons, generated: int,
            output: Optional[http.Output]):
    """The non-streamed answer's body, once every choice has finished.

    Args:
      request_id: its id.
      parsed: the request.
      texts, reasons: per choice, its text and finish reason.
      generated: the ids generated (the usage).
      output: what collected the choices' per-token entries (None: nothing
        ran).
    """
    choices = []
    for k in range(len(texts)):
      prompt = parsed.prompts[k // parsed.n] if parsed.echo else ""
      text = prompt + self._final_text(parsed, texts[k], reasons[k])
      logprobs = None
      if parsed.logprobs is not None:
        logprobs = self._choice_logprobs(parsed, k, output, len(prompt))
      choices.append(self._choice(parsed, k, text, reasons[k], logprobs))
    return self._envelope(request_id, parsed, choices,
                          self._usage(parsed, generated))


  def _choice_logprobs(self, parsed, k: int, output: Optional[http.Output],
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
    whole = self._no_logprobs()
    for part in parts:
      for key in whole:
        whole[key] += part[key]
    return whole

  async def events(self, request_id: str, parsed, completion,
                    output: http.Output):
    """The server-sent events of a streamed answer, as bytes: one write per
    chunk (every choice's event of it)."""
    try:
      async for frames in self._frames(request_id, parsed, completion,
                                       output):
        yield frames
    except asyncio.CancelledError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      http.fault("/v1/completions (stream)", e, request_id)
      yield protocol.json_event(protocol.error_body(
          f"the server failed on this request ({request_id}); it has been "
          "logged", kind="server_error"))
    finally:  # Also when the client went away (the generator is cancelled).
      if completion is not None:
        completion.cancel()

  async def _frames(self, request_id: str, parsed, completion,
                    output: http.Output):
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
          frames.append(self._running_chunk(head, k, prompt))
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
              http.generation_failed(request_id, output.messages)
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
            logprobs = self._no_logprobs()
            if parsed.echo and update.prompt_logprobs is not None:
              logprobs = self._prompt_logprobs(parsed, index, update)
              frames.append(self._running_chunk(
                  head, index, parsed.prompts[index // parsed.n], logprobs))
              logprobs = None
            if update.token_logprobs is not None:
              logprobs = self._logprobs(
                  parsed, update.ids, update.token_logprobs, update.top_ids,
                  update.top_logprobs, offsets[index])
              offsets[index] += self._logprobs_chars(logprobs)
          text = pending[index] + update.text
          if update.finish_reason is None:
            cut = max(len(text) - hold, 0)
            text, pending[index] = text[:cut], text[cut:]
            if text or logprobs:
              frames.append(self._running_chunk(head, index, text,
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

