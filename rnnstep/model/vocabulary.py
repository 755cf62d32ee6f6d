"""A model's tokens: what each id stands for, and how text maps to ids and back.

A vocabulary is a list of token strings (the model file's `vocab`) plus the
recorded rules of its kind:

  - `characters`: one character per id (every model before format 2). Text
    is the ids' characters joined; nothing else here changes it.
  - `words`: a word per id, with the recipe's own split and normalisation
    (`lower`, the characters `filters` removes, the `split` separator or
    whitespace) and, optionally, the `newline` token a line end becomes
    (pytorch/examples word_language_model's `<eos>`). A word reads back as
    " " + word, the newline token as "\\n". A Keras `TextVectorization`
    layer's vocabulary records its own rules instead (`text_vectorization`:
    its `standardize` and `split`, computed as its TensorFlow ops compute
    them); split into characters, a token reads back as itself.
    textgenrnn's word-level vocabulary records its `recipe` instead: its
    prefix split, and its text joined and re-spaced from the prompt's words
    on (`TextgenrnnText`), not a concatenation of pieces.
  - `bytes`: ids 0-255 are UTF-8 bytes.
  - `subword`: a Hugging Face `tokenizers` JSON, stored in the model file and
    applied with the `tokenizers` library (imported only for such a model).
  - `world`: RWKV's world vocabulary (`rwkv_vocab_v20230424.txt`, KerasHub's
    `RWKVTokenizer`): each token a byte string, each vocab entry its bytes
    as Latin-1 characters (so every entry is distinct and holds only
    characters below U+0100); text is encoded by greedy longest match of its
    UTF-8 bytes, as KerasHub's byte trie matches. Ids with no token (id 0,
    the end-of-text token, and ids past the file's last, e.g. 65530-65535)
    have the entry `WORLD_NO_TOKEN` + their id, a character no token holds,
    and add no text.

Every kind but `characters` is decoded through bytes: each id has a `piece`
(the bytes it adds to the text), a generation's text is its pieces joined and
decoded as UTF-8 incrementally (`StreamText`), so neither a stream chunk nor a
stop string's cut ever splits a character, and the stop and regex tables
(`rnnstep.decoding`) are built from the same pieces the text is made of.

Nothing here imports TensorFlow: the converters and the model file use it.
"""

import codecs
import json
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from rnnstep import errors

KINDS = ("characters", "words", "bytes", "subword", "world")
# A world vocabulary's entry for an id with no token: this character (no
# token's Latin-1 entry holds one above U+00FF) and the id.
WORLD_NO_TOKEN = "\u2400"
UNK_TOKEN = "[UNK]"
MAX_TOKENIZER_BYTES = 64 << 20
# Words rules a file may record, and their types.
_WORD_RULES = {"lower": bool, "filters": str, "split": (str, type(None)),
               "newline": (str, type(None)), "oov": (str, type(None)),
               "text_vectorization": dict, "unknown": str,
               "char_level": bool, "start": str, "recipe": str}
# `char_level`: each character is a word (Keras `Tokenizer(char_level=True)`:
# lowered where `lower` says, no filters, no split; its tokens join without
# spaces). `start`: a token every prompt starts with, which adds no text
# (textgenrnn's meta token `<s>`, which starts every text it generates).
# A words vocabulary without an OOV token refuses a prompt word it lacks, in
# one line naming it (issue #34: a prompt is never silently changed, although
# Keras's `Tokenizer.texts_to_sequences` drops such words). Files converted
# before carry an `unknown` rule ("drop" for a Keras `Tokenizer` without
# `oov_token`): still checked against these values, so that those files load,
# and then ignored.
UNKNOWN_WORDS = ("error", "drop")
# The refusal's words, and how many unknown words it names (the SavedModel's
# graph check names as many, `token_ops.UNKNOWN_WORD`).
NOT_IN_VOCABULARY = ("not in the model's vocabulary (which has no "
                     "out-of-vocabulary token)")
SHOWN_UNKNOWN = 5
# `recipe`: a recipe whose own code splits prompts and joins words, where no
# rule above says it. "textgenrnn": textgenrnn's word-level
# `textgenrnn_generate` (minimaxir/textgenrnn, textgenrnn/utils.py), its
# regexes verbatim below: a prefix's punctuation spaced out, runs of spaces
# made one, split on " " (empty words kept: they are id 0, as its
# `vocab.get(x, 0)` makes them), each word lowered; the words joined with
# " " and re-spaced around punctuation (`respace_textgenrnn`).
RECIPES = ("textgenrnn",)


def recipe_refuses(name: str, recipe: str) -> str:
  """The refusal of `stop`/`regex` (`name`) with a `recipe` vocabulary: they
  act on the tokens' raw text (" " + word each), which the recipe re-spaces
  afterwards."""
  return (f"{name}= with a {recipe} word-level model: its text is re-spaced "
          "after the words are chosen, so neither acts on the text it "
          "returns; stop by num_steps")
TEXTGENRNN_PREFIX_PUNCT = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\\n\\t\'‘’“”’–—'
TEXTGENRNN_LEFT = "!%),.:;?@\\]_}\\n\\t'"
TEXTGENRNN_RIGHT = "$(\\[_\\n\\t'"
TEXTGENRNN_BOTH = '\\n\\t'
# Characters a later word can still re-space back from the end of the joined
# text (each regex reads at most 3 characters; `StreamText` holds them).
_TEXTGENRNN_MARGIN = 4
# A Keras `TextVectorization` layer's settings the `text_vectorization` rule
# records, and their values (keras/src/layers/preprocessing/
# text_vectorization.py; None: the layer's own None).
TEXT_VECTORIZATION = {
    "standardize": ("lower_and_strip_punctuation", "lower",
                    "strip_punctuation", None),
    "split": ("whitespace", "character", None)}
# Its punctuation (`strip_punctuation`), Keras's regex verbatim: ASCII only,
# so Python's `re` and TensorFlow's RE2 match the same characters.
TEXT_VECTORIZATION_PUNCTUATION = r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']'
# `tf.strings.lower(x)` (no encoding: ASCII letters only) and the whitespace
# `tf.strings.split(x)` splits on (ASCII; Python's str.split splits on more).
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                             "abcdefghijklmnopqrstuvwxyz")
_TF_WHITESPACE = re.compile("[ \t\n\v\f\r]+")


def _fail(path, problem: str, advice: str = "") -> ValueError:
  where = f"{path}: " if path else ""
  return ValueError(f"{where}{problem}{'; ' + advice if advice else ''}")


def unknown_words(words: Sequence[str]) -> str:
  """The one-line refusal of prompt words a vocabulary without an OOV token
  lacks.

  Args:
    words: the unknown words in prompt order (repeats allowed).

  Returns:
    The message, naming the first `SHOWN_UNKNOWN` distinct words and how
    many more there are.
  """
  distinct = list(dict.fromkeys(words))
  shown = ", ".join(map(repr, distinct[:SHOWN_UNKNOWN]))
  if len(distinct) > SHOWN_UNKNOWN:
    shown += f" and {len(distinct) - SHOWN_UNKNOWN} more"
  if len(distinct) == 1:
    return f"word {shown} is {NOT_IN_VOCABULARY}; remove or replace it"
  return f"words {shown} are {NOT_IN_VOCABULARY}; remove or replace them"


class Tokens:
  """A vocabulary of tokens and the rules of its kind.

  Attributes:
    kind: one of `KINDS`.
    vocab: the token strings in id order (for `bytes`, `chr(b)` for byte b).
    rules: the kind's recorded rules (see `to_json`).
  """

  def __init__(self, kind: str, vocab: Sequence[str],
               rules: Optional[dict] = None, path=None):
    """Checks and builds a vocabulary.

    Args:
      kind: one of `KINDS`.
      vocab: the token strings in id order.
      rules: for `words`, any of `lower` (bool), `filters` (str), `split`
        (str or None: whitespace), `newline` (str or None), `oov` (str or
        None); for `subword`, `tokenizer` (the tokenizer's JSON text).
      path: the file it came from, for messages.

    Raises:
      ValueError: an unknown kind, an unknown or mistyped rule, a rule that
        names a token the vocabulary lacks, or a tokenizer that does not fit;
        naming the file and the problem.
    """
    if kind not in KINDS:
      raise _fail(path, f"tokens kind {kind!r} is unknown", f"known kinds: "
                  f"{', '.join(KINDS)}")
    self.kind = kind
    self.vocab = tuple(vocab)
    self.rules = dict(rules or {})
    self._ids = {t: i for i, t in enumerate(self.vocab)}
    self._tokenizer = None
    if kind == "words":
      unknown = sorted(set(self.rules) - set(_WORD_RULES))
      if unknown:
        raise _fail(path, f"tokens rules {unknown} are unknown for words",
                    f"known rules: {sorted(_WORD_RULES)}")
      for name, types in _WORD_RULES.items():
        if name in self.rules and not isinstance(self.rules[name], types):
          raise _fail(path, f"tokens rule {name} has the wrong type "
                      f"({type(self.rules[name]).__name__})")
      for name in ("newline", "oov", "start"):
        token = self.rules.get(name)
        if token is not None and token not in self._ids:
          raise _fail(path, f"tokens rule {name} names {token!r}, which is "
                      "not in the vocabulary")
      if self.rules.get("unknown", "error") not in UNKNOWN_WORDS:
        raise _fail(path, f"tokens rule unknown must be one of "
                    f"{UNKNOWN_WORDS}, got {self.rules['unknown']!r}"[:200])
      self.rules.pop("unknown", None)  # Read and ignored: see UNKNOWN_WORDS.
      if self.rules.get("recipe", "textgenrnn") not in RECIPES:
        raise _fail(path, f"tokens rule recipe must be one of {RECIPES}, got "
                    f"{self.rules['recipe']!r}"[:200])
      if self.rules.get("split") == "":
        raise _fail(path, "tokens rule split is empty", "give a separator, "
                    "or null to split on whitespace")
      if "text_vectorization" in self.rules:
        _check_text_vectorization(self.rules, path)
    elif kind == "bytes":
      if self.rules:
        raise _fail(path, "a bytes vocabulary has no rules")
      if self.vocab != bytes_vocab():
        raise _fail(path, "a bytes vocabulary must be the 256 bytes in order "
                    "(chr(0) .. chr(255))")
    elif kind == "subword":
      if set(self.rules) != {"tokenizer"} or not isinstance(
          self.rules["tokenizer"], str):
        raise _fail(path, "a subword vocabulary needs exactly the rule "
                    "tokenizer (a Hugging Face tokenizers JSON text)")
      self._tokenizer = load_tokenizer(self.rules["tokenizer"], path)
      size = self._tokenizer.get_vocab_size(with_added_tokens=True)
      if size != len(self.vocab):
        raise _fail(path, f"the tokenizer has {size} tokens but the "
                    f"vocabulary {len(self.vocab)}")
    elif kind == "world":
      if self.rules:
        raise _fail(path, "a world vocabulary has no rules")
      self._world = _world_table(self.vocab, path)
    elif self.rules:
      raise _fail(path, "a characters vocabulary has no rules")
    self._pieces = None
    self._texts = None

  # --------------------------------------------------------------- the file

  def to_json(self) -> str:
    """The model file's `tokens` member: `{"kind": ..., rules...}`."""
    return json.dumps(dict(kind=self.kind, **self.rules), ensure_ascii=False)

  def file_json(self) -> str:
    """The vocabulary as one JSON file: the kind, its rules and (but for
    `bytes`) the tokens in id order, the `{"kind": ...}` form that
    `rnnstep.load(..., vocab=)` reads (the exports' `tokens.json`)."""
    data = dict(kind=self.kind, **self.rules)
    if self.kind != "bytes":
      data["vocab"] = list(self.vocab)
    return json.dumps(data, ensure_ascii=False)

  # The files an export writes beside its model so that clients can map text
  # to ids and back: always `TOKENS_FILE` (`file_json`), and a subword
  # model's tokenizer as `TOKENIZER_FILE` (the `tokenizers` JSON).
  TOKENS_FILE = "tokens.json"
  TOKENIZER_FILE = "tokenizer.json"

  def write_files(self, directory: str) -> Dict[str, str]:
    """Writes the export files (UTF-8) into `directory`.

    Returns:
      {file name: path written}.
    """
    files = {self.TOKENS_FILE: self.file_json()}
    if self.kind == "subword":
      files[self.TOKENIZER_FILE] = self.rules["tokenizer"]
    written = {}
    for name, text in files.items():
      written[name] = os.path.join(directory, name)
      with open(written[name], "w", encoding="utf-8") as f:
        f.write(text)
    return written

  @classmethod
  def from_json(cls, data, vocab: Sequence[str], path=None) -> "Tokens":
    """Builds a vocabulary from a `tokens` member (decoded JSON) and `vocab`.

    Raises:
      ValueError: naming the file and the problem.
    """
    if not isinstance(data, dict) or "kind" not in data:
      raise _fail(path, "tokens must be a JSON object with a kind")
    rules = dict(data)
    kind = rules.pop("kind")
    return cls(kind, vocab, rules, path)

  # ------------------------------------------------------------- text to ids

  def encode(self, text: str) -> np.ndarray:
    """Maps text to int32 ids by the kind's rules.

    Raises:
      ValueError: words that are not in the vocabulary (where there is no
        OOV token: `unknown_words`, naming the first few), a character a
        characters vocabulary lacks, or a lone surrogate (not text: no
        tokenizer takes it); naming it.
    """
    not_text = errors.not_text(text)
    if not_text:
      raise ValueError(f"the text contains {not_text}; remove it")
    if self.kind == "characters":
      ids = []
      for position, char in enumerate(text):
        if char not in self._ids:
          raise ValueError(
              f"character {char!r} (U+{ord(char):04X}) at position {position} "
              "is not in the model's vocabulary; remove or replace it")
        ids.append(self._ids[char])
      return np.array(ids, np.int32)
    if self.kind == "bytes":
      return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
    if self.kind == "subword":
      return np.array(self._tokenizer.encode(
          text, add_special_tokens=False).ids, np.int32)
    if self.kind == "world":
      return _world_encode(self._world, text.encode("utf-8"))
    words = self.words(text)
    if "start" in self.rules:
      words.insert(0, self.rules["start"])
    ids = [self._ids.get(w) for w in words]
    if None in ids:
      oov = self.rules.get("oov")
      if oov is None:
        raise ValueError(unknown_words(
            [w for w, i in zip(words, ids) if i is None]))
      ids = [self._ids[oov] if i is None else i for i in ids]
    return np.array(ids, np.int32)

  def words(self, text: str) -> List[str]:
    """A words vocabulary's split of `text`, as its recipe splits it.

    Lines are split apart first where the vocabulary has a newline token
    (word_language_model's `data.Corpus`: each line's words, then `<eos>`;
    the last line gets none unless the text ends with a line end).
    """
    newline = self.rules.get("newline")
    lines = text.split("\n") if newline is not None else [text]
    out = []
    for i, line in enumerate(lines):
      out.extend(self._line_words(line))
      if i < len(lines) - 1:
        out.append(newline)
    return out

  def _line_words(self, line: str) -> List[str]:
    if self.rules.get("recipe") == "textgenrnn":
      return textgenrnn_words(line)
    vectorize = self.rules.get("text_vectorization")
    if vectorize is not None:
      return _text_vectorization_words(line, **vectorize)
    if self.rules.get("char_level"):  # Keras: no filters and no split.
      return list(line.lower() if self.rules.get("lower") else line)
    # Keras `text_to_word_sequence`: lower, filters become the split
    # character, split, drop empty words.
    if self.rules.get("lower"):
      line = line.lower()
    split = self.rules.get("split")
    filters = self.rules.get("filters", "")
    if filters:
      line = line.translate({ord(c): split or " " for c in filters})
    words = line.split(split) if split is not None else line.split()
    return [w for w in words if w]

  # ------------------------------------------------------------- ids to text

  @property
  def pieces(self) -> List[bytes]:
    """The bytes each id adds to a text (every kind but `characters`)."""
    if self._pieces is None:
      self._pieces = self._make_pieces()
    return self._pieces

  def _make_pieces(self) -> List[bytes]:
    if self.kind == "characters":
      return [t.encode("utf-8") for t in self.vocab]
    if self.kind == "bytes":
      return [bytes([b]) for b in range(256)]
    if self.kind == "world":
      return [b"" if t.startswith(WORLD_NO_TOKEN) else t.encode("latin-1")
              for t in self.vocab]
    if self.kind == "words":
      newline, start = self.rules.get("newline"), self.rules.get("start")
      joined = (self.rules.get("text_vectorization", {}).get("split")
                != "character" and not self.rules.get("char_level"))
      # Characters join without spaces; the start token adds no text.
      return [b"\n" if t == newline else b"" if t == start else
              (" " + t if joined and t else t).encode("utf-8")
              for t in self.vocab]
    return _subword_pieces(self._tokenizer, self.rules["tokenizer"],
                           len(self.vocab))

  @property
  def texts(self) -> Tuple[Optional[str], ...]:
    """Each id's piece as text; None where it is not whole UTF-8 on its own
    (a byte of a multi-byte character), which no regex can allow."""
    if self._texts is None:  # Made once: every regex request reads it.
      out = []
      for piece in self.pieces:
        try:
          out.append(piece.decode("utf-8"))
        except UnicodeDecodeError:
          out.append(None)
      self._texts = tuple(out)
    return self._texts

  def decode(self, ids) -> str:
    """Maps ids to text: the characters, or the pieces decoded as UTF-8
    (an incomplete character at the end reads as U+FFFD)."""
    ids = np.asarray(ids).ravel().tolist()
    if self.kind == "characters":
      return "".join(self.vocab[i] for i in ids)
    pieces = self.pieces
    return b"".join(pieces[i] for i in ids).decode("utf-8", "replace")

  def stream(self, stops: Sequence[str] = (), prompt: str = ""
             ) -> "StreamText":
    """An incremental decoder for one row (see `StreamText`); `prompt` is
    the row's prompt, which a `recipe` vocabulary's text starts from."""
    if self.rules.get("recipe") == "textgenrnn":
      return TextgenrnnText(self, prompt)
    return StreamText(self, stops)

  def text(self, ids, stops: Sequence[str] = (), prompt: str = "") -> str:
    """A continuation's text, cut at the end of its first stop string
    (`prompt`: the row's prompt, for a `recipe` vocabulary)."""
    stream = self.stream(stops, prompt)
    return stream.push(ids) + stream.finish()


class StreamText:
  """One row's text from its ids as they come, chunk by chunk.

  A token model's row ends (on device) at the token in which a stop string
  ends; the text is cut exactly at that string's end here, the rest of that
  token dropped. UTF-8 is decoded incrementally, so a chunk never ends inside
  a character: incomplete bytes wait for the next chunk (or `finish`).

  Args:
    tokens: the `Tokens`.
    stops: the stop strings.
  """

  def __init__(self, tokens: Tokens, stops: Sequence[str] = ()):
    self._tokens = tokens
    self._stops = [s.encode("utf-8") for s in stops]
    self._longest = max((len(s) for s in self._stops), default=0)
    self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
    self._tail = b""  # The last bytes seen, where a stop may still begin.
    self.stopped = False

  def push(self, ids) -> str:
    """The text the new ids add (empty once stopped)."""
    if self.stopped:
      return ""
    if self._tokens.kind == "characters":  # A character row ends at its stop.
      return self._tokens.decode(ids)
    pieces = self._tokens.pieces
    data = b"".join(pieces[i] for i in np.asarray(ids).ravel().tolist())
    if self._stops:
      window = self._tail + data
      ends = [window.find(s) + len(s) for s in self._stops if s in window]
      if ends:  # The earliest end: where the device's automaton accepted.
        data = data[:min(ends) - len(self._tail)]
        self.stopped = True
      self._tail = window[-(self._longest - 1):] if self._longest > 1 else b""
    return self._decoder.decode(data, final=self.stopped)

  def finish(self) -> str:
    """What an incomplete character left at the end reads as."""
    if self.stopped or self._tokens.kind == "characters":
      return ""
    return self._decoder.decode(b"", final=True)


class TextgenrnnText:
  """One row's text as textgenrnn's word-level `textgenrnn_generate` returns
  it, chunk by chunk (the `recipe` rule "textgenrnn").

  textgenrnn joins the prefix's words and the generated ones with " " and
  then re-spaces the whole string (`respace_textgenrnn`), so a word can
  change the spacing just before it, and a closing quote the spacing after
  its opening one. Its returned string F starts with the prompt as it writes
  it, P (`respace_textgenrnn` of the prefix's words alone); the continuation
  is F after the longest start it shares with P (all of P unless the words
  re-space P's end, e.g. close a quote P opens). Each chunk holds what no
  later word can change any more: F but for its last `_TEXTGENRNN_MARGIN`
  characters and a quote still open on its last line; `finish` gives the
  rest. Joined, the chunks are the continuation, and P's shared start plus
  the continuation is F.

  Args:
    tokens: the `Tokens`.
    prompt: the row's prompt (its words as typed, unknown ones included:
      textgenrnn joins the words, not their ids).
  """

  def __init__(self, tokens: Tokens, prompt: str):
    self._tokens = tokens
    self._words = textgenrnn_words(prompt) if prompt else []
    self._written = respace_textgenrnn(" ".join(self._words))
    self._start = None  # len(shared start of P and F), once it is known.
    self._sent = 0  # Characters of F sent after the start.
    self.stopped = False

  def push(self, ids) -> str:
    """The text the new ids settle (see the class)."""
    start = self._tokens.rules.get("start")
    self._words.extend(w for w in (self._tokens.vocab[i] for i in np.asarray(
        ids).ravel().tolist()) if w != start)  # `<s>` adds no word.
    return self._send(textgenrnn_settled(self._words))

  def finish(self) -> str:
    """The rest of the text, at the end of the generation."""
    return self._send(respace_textgenrnn(" ".join(self._words)), final=True)

  def _send(self, settled: str, final: bool = False) -> str:
    if self._start is None:
      shared = len(os.path.commonprefix([settled, self._written]))
      if not final and shared == len(settled) < len(self._written):
        return ""  # F may still go on as P does.
      self._start = shared
    out = settled[self._start + self._sent:]
    self._sent += len(out)
    return out


def textgenrnn_words(prefix: str) -> List[str]:
  """textgenrnn's words of a word-level prefix, as `textgenrnn_generate`
  splits it: punctuation spaced out, runs of spaces made one, split on " "
  (its empty words kept), each lowered; no words for an empty prefix."""
  if not prefix:
    return []
  prefix = re.sub("([{}])".format(TEXTGENRNN_PREFIX_PUNCT), r" \1 ", prefix)
  prefix = re.sub(" {2,}", r" ", prefix)
  return [x.lower() for x in prefix.split(" ")]


def respace_textgenrnn(text_joined: str) -> str:
  """textgenrnn's re-spacing of its joined words (`textgenrnn_generate`'s
  regexes, in its order): the spaces around a newline or tab, before
  closing punctuation, after opening punctuation, inside a quoted span."""
  text_joined = re.sub(" ([{}]) ".format(TEXTGENRNN_BOTH), r"\1",
                       text_joined)
  text_joined = re.sub(" ([{}])".format(TEXTGENRNN_LEFT), r"\1", text_joined)
  text_joined = re.sub("([{}]) ".format(TEXTGENRNN_RIGHT), r"\1", text_joined)
  return re.sub('" (.+?) "', r'"\1"', text_joined)


def textgenrnn_settled(words: Sequence[str]) -> str:
  """The start of `respace_textgenrnn(" ".join(words))` that no word joined
  after them can change.

  The first three regexes read at most three characters and only remove
  spaces, so each keeps all but its last two (or one) characters of output
  as they are whatever follows: all but the last `_TEXTGENRNN_MARGIN`
  characters are settled. The quote regex cannot cross a line end: what
  precedes the first `"` on the settled text's last line is settled too.
  """
  text = " ".join(words)
  for pattern, repl in ((" ([{}]) ".format(TEXTGENRNN_BOTH), r"\1"),
                        (" ([{}])".format(TEXTGENRNN_LEFT), r"\1"),
                        ("([{}]) ".format(TEXTGENRNN_RIGHT), r"\1")):
    text = re.sub(pattern, repl, text)
  text = text[:max(len(text) - _TEXTGENRNN_MARGIN, 0)]
  quote = text.find('"', text.rfind("\n") + 1)
  if quote >= 0:
    text = text[:quote]
  return re.sub('" (.+?) "', r'"\1"', text)


def _check_text_vectorization(rules: dict, path) -> None:
  """A `text_vectorization` rule: TextVectorization's settings, alone."""
  settings = rules["text_vectorization"]
  if set(settings) != set(TEXT_VECTORIZATION) or any(
      settings[k] not in values for k, values in TEXT_VECTORIZATION.items()):
    raise _fail(path, f"tokens rule text_vectorization is "
                f"{json.dumps(settings)[:200]}", "it takes standardize "
                f"{list(TEXT_VECTORIZATION['standardize'])} and split "
                f"{list(TEXT_VECTORIZATION['split'])}")
  others = sorted(set(rules) & {"lower", "filters", "split", "newline"})
  if others:
    raise _fail(path, f"tokens rules {others} do not go with "
                "text_vectorization (which has its own)")


def _text_vectorization_words(text: str, standardize, split) -> List[str]:
  """A Keras `TextVectorization` layer's tokens of `text`, as its ops make
  them (`_preprocess`): `tf.strings.lower` (ASCII), the punctuation regex
  removed, `tf.strings.split` (ASCII whitespace, empty words dropped),
  `tf.strings.unicode_split` or, with split None, the whole text."""
  if standardize in ("lower", "lower_and_strip_punctuation"):
    text = text.translate(_ASCII_LOWER)
  if standardize in ("strip_punctuation", "lower_and_strip_punctuation"):
    text = re.sub(TEXT_VECTORIZATION_PUNCTUATION, "", text)
  if split == "whitespace":
    return [w for w in _TF_WHITESPACE.split(text) if w]
  if split == "character":
    return list(text)
  return [text]


def world_entry(token: Optional[bytes], token_id: int) -> str:
  """A world vocabulary's entry: a token's bytes as Latin-1 characters, or
  for an id without a token (None), `WORLD_NO_TOKEN` and the id."""
  if token is None:
    return f"{WORLD_NO_TOKEN}{token_id}"
  return token.decode("latin-1")


def _world_table(vocab: Sequence[str], path):
  """The lookup `_world_encode` matches with: {token bytes: id} and, per
  first byte, the token lengths starting with it, longest first."""
  ids, lengths = {}, {}
  for i, entry in enumerate(vocab):
    if entry.startswith(WORLD_NO_TOKEN):
      if entry != f"{WORLD_NO_TOKEN}{i}":
        raise _fail(path, f"world vocab entry {i} is {entry[:40]!r}, which "
                    "is neither a token nor this id's placeholder")
      continue
    if not entry or max(map(ord, entry)) > 0xFF:
      raise _fail(path, f"world vocab entry {i} is {entry[:40]!r}, not a "
                  "token's bytes as Latin-1 characters")
    token = entry.encode("latin-1")
    ids[token] = i
    lengths.setdefault(token[0], set()).add(len(token))
  return ids, {b: sorted(n, reverse=True) for b, n in lengths.items()}


def _world_encode(table, data: bytes) -> np.ndarray:
  """Greedy longest match of `data` over the world tokens (KerasHub's
  `RWKVTokenizerBase.encodeBytes`: at each position the longest token that
  starts there, then on after it).

  Raises:
    ValueError: a byte no token starts with (never so in RWKV's file, which
      holds all 256), naming its position.
  """
  ids, lengths = table
  out, i = [], 0
  while i < len(data):
    for n in lengths.get(data[i], ()):
      if i + n > len(data):
        continue
      token_id = ids.get(data[i:i + n])
      if token_id is not None:
        out.append(token_id)
        i += n
        break
    else:
      raise ValueError(f"byte 0x{data[i]:02x} at byte {i} of the text starts "
                       "no token of the vocabulary; remove or replace it")
  return np.array(out, np.int32)


def bytes_vocab():
  """The token strings of a bytes vocabulary: chr(b) for byte b."""
  return tuple(chr(b) for b in range(256))


def characters(vocab: Sequence[str]) -> Tokens:
  """A characters vocabulary (the format 1 model file's)."""
  return Tokens("characters", vocab)


def load_tokenizer(text: str, path=None):
  """A `tokenizers.Tokenizer` from its JSON text (data: nothing is run)."""
  if len(text.encode("utf-8")) > MAX_TOKENIZER_BYTES:
    raise _fail(path, "the tokenizer JSON is too large")
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise _fail(path, "a subword model needs the tokenizers package",
                "pip install tokenizers") from None
  try:
    return tokenizers.Tokenizer.from_str(text)
  except Exception as e:  # pylint: disable=broad-except
    # The library's own parse errors (a pyo3 exception type).
    raise _fail(path, f"the tokenizer JSON does not load "
                f"({' '.join(str(e).split())[:200]})") from None


def _byte_level_chars() -> Dict[str, int]:
  """GPT-2's byte-level alphabet: the character that stands for each byte.

  This is the fixed 256-entry table byte-level BPE writes its tokens in
  (printable bytes stand for themselves, the others for 256 + n); the
  tokenizers library decodes with it but does not expose it per token.
  """
  printable = (list(range(ord("!"), ord("~") + 1))
               + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1)))
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


def _subword_pieces(tokenizer, text: str, size: int) -> List[bytes]:
  """Each subword id's bytes as it continues a text.

  A byte-level tokenizer's tokens are its bytes, in GPT-2's alphabet. Any
  other's piece is what the id adds when decoded after itself
  (`decode([i, i])` less `decode([i])`), which keeps the space a decoder
  puts between words (Metaspace's "▁", or none) and drops WordPiece's "##".
  """
  spec = json.loads(text)
  decoder = spec.get("decoder") or {}
  kinds = {decoder.get("type")} | {d.get("type") for d in
                                   decoder.get("decoders", []) or []}
  special = {t.get("id") for t in spec.get("added_tokens", []) or []
             if t.get("special")}
  out = []
  if "ByteLevel" in kinds:
    table = _byte_level_chars()
    for i in range(size):
      token = tokenizer.id_to_token(i) or ""
      if i in special or any(c not in table for c in token):
        out.append(b"")  # Special tokens read as nothing, as decode does.
      else:
        out.append(bytes(table[c] for c in token))
    return out
  for i in range(size):
    one = tokenizer.decode([i])
    two = tokenizer.decode([i, i])
    # A piece decoded alone may read as nothing (Metaspace's lone "▁"
    # strips to "") yet add text after another token (" "): `two` says so.
    out.append((two[len(one):] if two.startswith(one) else one
                ).encode("utf-8"))
  return out


__all__ = ["Tokens", "StreamText", "TextgenrnnText", "KINDS", "bytes_vocab",
           "characters", "textgenrnn_words", "respace_textgenrnn"]
