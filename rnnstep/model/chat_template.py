"""A model's chat template: a conversation's messages to the prompt text, and
the end of a reply.

A template is a fact about the model, found in this order (`find`):

  - a file given by hand (`rnnstep-serve --chat_template=FILE`): a Jinja
    template, or a Hugging Face `tokenizer_config.json` whose
    `chat_template` it uses with the `bos_token`/`eos_token` beside it;
  - the model's own (`Model.chat_template`): the `chat_template` of a
    `tokenizer_config.json` the converter found beside the vocabulary
    file or in the folder it converted (`rnnstep.convert`), kept in the
    model file;
  - RWKV's convention for a model with RWKV's world vocabulary (`RwkvTemplate`),
    as BlinkDL's ChatRWKV (`API_DEMO_CHAT.py`) and RWKV-Runner
    (`backend-python/routes/completion.py`, `chat_template`) render it:
    `System: ...\\n\\nUser: ...\\n\\nAssistant: ...\\n\\nUser: ...`
    `\\n\\nAssistant:`
    (no space after the last colon: the model writes it), each message
    stripped with its runs of line ends made one (ChatRWKV's
    `re.sub(r"\\n+", "\\n", msg)`: a blank line would end its turn), and
    a reply ends at its first blank line, `"\\n\\n"` (ChatRWKV cuts it
    there).

Otherwise there is none: `find` returns None and the server refuses chat
requests naming the flag, never guessing a format.

A Jinja template is rendered as Hugging Face's `apply_chat_template` renders
it (`trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension,
`raise_exception`, a `tojson` that keeps non-ASCII, and `messages`,
`add_generation_prompt=True`, `bos_token`, `eos_token`), in Jinja's
`ImmutableSandboxedEnvironment`: a template reads no attribute that is not
safe (`''.__class__` is refused), changes no list or dict it is given, and
is bounded by the steps it runs (`MAX_STEPS` lines of its compiled code),
the text it writes (`Limits.rendered_chars`) and the size of the strings
its `*`, `**` and `~` make, so that a template from a model's files can
neither run code nor hang or fill the server's memory. Its end of a reply
is its `eos_token`, or the stop strings the caller gives.

Nothing here imports TensorFlow; `jinja2` is imported for a Jinja template
only.
"""

import dataclasses
import json
import re
import sys
from typing import Any, Mapping, Optional, Sequence, Tuple

from rnnstep.model import model_file

ROLES = ("system", "user", "assistant")
# RWKV's role names (RWKV-Runner's `chat_template`).
RWKV_ROLE_NAMES = {"system": "System", "user": "User",
                   "assistant": "Assistant"}
# Where RWKV's reply ends: its first blank line.
RWKV_END_OF_TURN = "\n\n"

# Hugging Face's file of a tokenizer's settings, chat template included.
TOKENIZER_CONFIG = "tokenizer_config.json"
# The largest template file read.
MAX_TEMPLATE_BYTES = 1 << 20
# Lines of a template's compiled code one rendering may run.
MAX_STEPS = 1_000_000


class TemplateError(ValueError):
  """A template that cannot be read, or that failed or ran past its bounds
  while rendering (one line, naming what)."""


@dataclasses.dataclass(frozen=True)
class Message:
  """One message of a conversation: its role (one of `ROLES`) and text."""
  role: str
  content: str


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one rendering may write.

  Attributes:
    rendered_chars: the prompt's characters at most (a template that writes
      more stops there, with a `TemplateError`).
  """
  rendered_chars: int = 1 << 20


class ChatTemplate:
  """A conversation's format: `render` makes the prompt, `end_of_turn` are
  the stop strings that end a reply.

  Attributes:
    source: where it came from, for messages ("RWKV's convention", a path).
    end_of_turn: the stop strings ending a reply (none: only the request's
      stop strings and its length end it).
  """

  source: str = ""
  end_of_turn: Tuple[str, ...] = ()

  def render(self, messages: Sequence[Message],
             limits: Limits = Limits()) -> str:
    """The prompt of `messages`, ready for the assistant's reply.

    Raises:
      TemplateError: the template failed or ran past `limits`.
    """
    raise NotImplementedError


class RwkvTemplate(ChatTemplate):
  """RWKV's convention (see the module's docstring)."""

  source = "RWKV's convention (the world vocabulary)"
  end_of_turn = (RWKV_END_OF_TURN,)

  def render(self, messages: Sequence[Message],
             limits: Limits = Limits()) -> str:
    turns = []
    for message in messages:
      text = re.sub(r"\n+", "\n", message.content.replace("\r\n", "\n")
                    .replace("\r", "\n").strip())
      turns.append(f"{RWKV_ROLE_NAMES[message.role]}: {text}\n\n")
    prompt = "".join(turns) + f"{RWKV_ROLE_NAMES['assistant']}:"
    if len(prompt) > limits.rendered_chars:
      raise TemplateError(f"the conversation renders to {len(prompt)} "
                          f"characters, over {limits.rendered_chars}")
    return prompt


class JinjaTemplate(ChatTemplate):
  """A Jinja chat template, rendered in Jinja's sandbox within bounds.

  Args:
    text: the template.
    source: where it came from (messages name it).
    end_of_turn: the stop strings ending a reply (default: `eos_token`).
    bos_token, eos_token: the tokens the template may write (Hugging Face
      passes them).

  Raises:
    TemplateError: the template does not compile.
  """

  def __init__(self, text: str, *, source: str,
               end_of_turn: Optional[Sequence[str]] = None,
               bos_token: str = "", eos_token: str = ""):
    self.source = source
    self.bos_token = bos_token or ""
    self.eos_token = eos_token or ""
    if end_of_turn is None:
      end_of_turn = [self.eos_token] if self.eos_token else []
    self.end_of_turn = tuple(s for s in end_of_turn if s)
    self._template = _compile(text, source)

  def render(self, messages: Sequence[Message],
             limits: Limits = Limits()) -> str:
    context = dict(
        messages=[{"role": m.role, "content": m.content} for m in messages],
        add_generation_prompt=True, bos_token=self.bos_token,
        eos_token=self.eos_token)
    return _render_bounded(self._template, context, limits.rendered_chars,
                           self.source)


def _compile(text: str, source: str):
  """`text` compiled in the bounded sandbox (`_environment`)."""
  import jinja2  # pylint: disable=g-import-not-at-top
  try:
    template = _environment().from_string(text)
  except jinja2.TemplateError as e:
    raise TemplateError(f"{source}: the chat template does not compile: "
                        f"{e}".splitlines()[0][:500]) from None
  # Jinja's `~` joins strings with the compiled module's `str_join` and
  # `markup_join`: bounded here, as `*` and `**` are by the environment.
  namespace = template.root_render_func.__globals__
  for name in ("str_join", "markup_join"):
    if name in namespace:
      namespace[name] = _bounded_join(namespace[name])
  return template


# The longest string or number of digits a template's `*`, `**` and `~`
# may make (a doubling loop would otherwise fill the memory in few steps).
MAX_VALUE_CHARS = 1 << 22


# The most bits an integer a template's `*` or `**` makes may have.
MAX_INT_BITS = 1 << 16


def _check_binop(operator: str, left, right) -> None:
  """Refuses a `*` or `**` whose result would be over the bounds."""
  ints = all(isinstance(x, int) for x in (left, right))
  if operator == "**" and ints and abs(left) > 1 and right > 0 and (
      left.bit_length() * right > MAX_INT_BITS):
    raise TemplateError(f"the chat template made a number over "
                        f"{MAX_INT_BITS} bits")
  if operator == "*":
    if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
      raise TemplateError(f"the chat template made a number over "
                          f"{MAX_INT_BITS} bits")
    for one, other in ((left, right), (right, left)):
      if isinstance(one, (str, list, tuple)) and isinstance(
          other, int) and len(one) * other > MAX_VALUE_CHARS:
        raise TemplateError(f"the chat template made a value over "
                            f"{MAX_VALUE_CHARS} long")


def _bounded_join(join):
  def bounded(seq):
    out = join(seq)
    if len(out) > MAX_VALUE_CHARS:
      raise TemplateError(f"the chat template made a string over "
                          f"{MAX_VALUE_CHARS} characters")
    return out
  return bounded


_ENVIRONMENT = None


def _environment():
  """Jinja's immutable sandbox as Hugging Face configures it, with `*` and
  `**` bounded (made once)."""
  global _ENVIRONMENT
  if _ENVIRONMENT is not None:
    return _ENVIRONMENT
  # pylint: disable=g-import-not-at-top
  import jinja2.ext
  from jinja2 import sandbox
  # pylint: enable=g-import-not-at-top

  class Bounded(sandbox.ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
      _check_binop(operator, left, right)
      return super().call_binop(context, operator, left, right)

    def unsafe_undefined(self, obj, attribute):
      # Refused where it is read, not rendered as an empty string.
      raise sandbox.SecurityError(
          f"access to attribute {attribute!r} of {type(obj).__name__!r} "
          "object is unsafe")

  def raise_exception(message):
    raise TemplateError(f"the chat template refused the conversation: "
                        f"{message}"[:500])

  def tojson(value, indent=None):
    return json.dumps(value, ensure_ascii=False, indent=indent)

  environment = Bounded(trim_blocks=True, lstrip_blocks=True,
                        extensions=[jinja2.ext.loopcontrols])
  environment.globals["raise_exception"] = raise_exception
  environment.filters["tojson"] = tojson
  _ENVIRONMENT = environment
  return environment


def _render_bounded(template, context: Mapping[str, Any], max_chars: int,
                    source: str) -> str:
  """`template` rendered with `context`, within `MAX_STEPS` lines of its
  code and `max_chars` characters of output.

  Jinja compiles a template to Python whose loops call nothing a sandbox
  sees, so the steps are counted by a trace function on this thread, over
  the template's own frames only, the one that was there put back after.

  Raises:
    TemplateError: naming `source`: a failure, or past a bound.
  """
  import jinja2  # pylint: disable=g-import-not-at-top
  filename = template.root_render_func.__code__.co_filename
  steps = [0]

  def count(frame, event, arg):
    del frame, event, arg
    steps[0] += 1
    if steps[0] > MAX_STEPS:
      raise TemplateError(f"the chat template ran over {MAX_STEPS} steps")
    return count

  def on_call(frame, event, arg):
    del event, arg
    return count if frame.f_code.co_filename == filename else None

  previous = sys.gettrace()
  pieces, size = [], 0
  sys.settrace(on_call)
  try:
    for piece in template.generate(**context):
      size += len(piece)
      if size > max_chars:
        raise TemplateError(f"the conversation renders to over {max_chars} "
                            "characters")
      pieces.append(piece)
  except TemplateError as e:
    raise TemplateError(f"{source}: {e}") from None
  except (jinja2.TemplateError, ArithmeticError, TypeError, ValueError,
          LookupError, AttributeError, RecursionError, MemoryError) as e:
    raise TemplateError(f"{source}: the chat template failed: "
                        f"{type(e).__name__}: {e}".splitlines()[0][:500]
                        ) from None
  finally:
    sys.settrace(previous)
  return "".join(pieces)


def _read_text(path: str) -> str:
  """A template file's text, bounded.

  Raises:
    TemplateError: naming the file: unreadable, too large, not UTF-8.
  """
  try:
    with open(path, "rb") as f:
      data = f.read(MAX_TEMPLATE_BYTES + 1)
  except OSError as e:
    raise TemplateError(f"{path}: cannot read it: {e.strerror or e}"
                        ) from None
  if len(data) > MAX_TEMPLATE_BYTES:
    raise TemplateError(f"{path}: over {MAX_TEMPLATE_BYTES} bytes; a chat "
                        "template is smaller")
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise TemplateError(f"{path}: not UTF-8 text ({e})") from None


def read_file(path: str,
              end_of_turn: Optional[Sequence[str]] = None) -> JinjaTemplate:
  """A template file: Jinja, or a Hugging Face `tokenizer_config.json`.

  Args:
    path: the file (a `.json` is read as a tokenizer config).
    end_of_turn: the stop strings ending a reply (default: the config's
      `eos_token`; a Jinja file's: none).

  Raises:
    TemplateError: naming the file: unreadable, too large, not a template.
  """
  text = _read_text(path)
  if not path.endswith(".json"):
    return JinjaTemplate(text, source=path, end_of_turn=end_of_turn)
  data = tokenizer_config(text, path)
  if data is None:
    raise TemplateError(f"{path}: holds no chat_template (a string, or a "
                        "list with one named default)")
  return from_data(data, path, end_of_turn)


def _token_text(value) -> str:
  """A tokenizer config's special token: a string, or `{"content": ...}`."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else ""


def tokenizer_config(text: str, path: str
                     ) -> Optional[model_file.ChatTemplateData]:
  """A Hugging Face `tokenizer_config.json`'s chat template, or None where it
  has none, checked to compile.

  Args:
    text: the file's text.
    path: the file (messages name it).

  Raises:
    TemplateError: naming the file: not JSON, or a template that does not
      compile.
  """
  try:
    config = json.loads(text)
  except ValueError as e:
    raise TemplateError(f"{path}: not valid JSON ({e})") from None
  template = config.get("chat_template") if isinstance(config, dict) else None
  if isinstance(template, list):  # Named templates: the default one.
    template = next((t.get("template") for t in template
                     if isinstance(t, dict) and t.get("name") == "default"),
                    None)
  if not isinstance(template, str):
    return None
  data = model_file.ChatTemplateData(
      template, _token_text(config.get("bos_token")),
      _token_text(config.get("eos_token")))
  from_data(data, path)  # Compiles it: refused here, not at its first use.
  return data


def read_tokenizer_config(path: str) -> Optional[model_file.ChatTemplateData]:
  """`tokenizer_config` of a file (None: it holds no chat template).

  Raises:
    TemplateError: naming the file: unreadable, too large, not JSON, or a
      template that does not compile.
  """
  return tokenizer_config(_read_text(path), path)


def from_data(data: model_file.ChatTemplateData, source: str,
              end_of_turn: Optional[Sequence[str]] = None) -> JinjaTemplate:
  """The template of a `model_file.ChatTemplateData`.

  Raises:
    TemplateError: it does not compile.
  """
  return JinjaTemplate(data.template, source=source, end_of_turn=end_of_turn,
                       bos_token=data.bos_token, eos_token=data.eos_token)


def find(model_template: Optional[model_file.ChatTemplateData],
         tokens_kind: str, template_file: Optional[str] = None,
         end_of_turn: Optional[Sequence[str]] = None
         ) -> Optional[ChatTemplate]:
  """The model's chat template (see the module's docstring for the order).

  Args:
    model_template: the template found with the model (its model file's,
      `Model.chat_template`), or None.
    tokens_kind: its vocabulary's kind (`vocabulary.Tokens.kind`).
    template_file: a template given by hand, or None.
    end_of_turn: stop strings ending a reply, given by hand (None: the
      template's own).

  Returns:
    The template, or None: the model has none and none was given.

  Raises:
    TemplateError: a template that cannot be used.
  """
  if template_file:
    return read_file(template_file, end_of_turn)
  if model_template is not None:
    return from_data(model_template, "the model's chat template",
                     end_of_turn)
  if tokens_kind == "world":
    template = RwkvTemplate()
    if end_of_turn is not None:
      template.end_of_turn = tuple(s for s in end_of_turn if s)
    return template
  return None
