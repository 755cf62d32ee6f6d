"""Vocabulary rules: where a model's characters (or words) come from, and how they fit.

Weights files (Keras, PyTorch) hold no vocabulary, so it comes from the
training text (`read_corpus_vocab`: the tutorial's `sorted(set(text))`) or a
vocabulary file (`read_vocab_file`: a UTF-8 JSON list of characters in id
order, the format of the LiteRT export's vocab.json). `resolve_vocab` fits the
characters to the embedding's rows: one row more means "[UNK]" at id 0 (the
current TF tutorial's `StringLookup(mask_token=None)`).

Word models (pytorch/examples word_language_model) get their words from the
recipe's corpus folder (`read_corpus_folder`: `data.Corpus`'s dictionary) or
from a vocabulary file listing the words in id order (`read_token_vocab_file`);
Keras word models from the legacy `Tokenizer`'s `to_json()` file
(`keras_tokenizer`), or from the model's own TextVectorization layer
(`text_vectorization_tokens`: its config's vocabulary or the archive's
`vocabulary.txt` asset, `text_vectorization_asset`).
"""

import codecs
import json
import os
from typing import List, Sequence

from rnnstep.convert import safe_io
from rnnstep.model import model_file
from rnnstep.model import vocabulary as vocabulary_lib

UNK_TOKEN = model_file.UNK_TOKEN
MAX_VOCAB_FILE_BYTES = 64 << 20
_CORPUS_CHUNK = 8 << 20


class VocabularyRequired(ValueError):
  """A weights file holds no vocabulary and none was given."""


class VocabularyNotAllowed(ValueError):
  """A vocabulary was given for an rnnstep model file, which holds its own."""


def vocab_from_corpus(text: str) -> List[str]:
  """The tutorial's vocabulary: `sorted(set(text))`."""
  if not isinstance(text, str):
    raise ValueError(f"corpus text must be a str, got {type(text).__name__}")
  return sorted(set(text))


def resolve_vocab(chars: Sequence[str], vocab_size: int, source: str) -> List[str]:
  """Fits a character list to the model's vocabulary size.

  `chars` of exactly `vocab_size` entries are used as they are. One entry
  fewer, without "[UNK]", gets "[UNK]" at id 0 (the current TF tutorial's
  `StringLookup(mask_token=None)` layout).

  Raises:
    ValueError: the sizes do not match; the message gives both.
  """
  chars = list(chars)
  if len(chars) == vocab_size:
    return chars
  if len(chars) + 1 == vocab_size and (not chars or chars[0] != UNK_TOKEN):
    return [UNK_TOKEN] + chars
  has_unk = bool(chars) and chars[0] == UNK_TOKEN
  count = len(chars) - (1 if has_unk else 0)
  raise ValueError(
      f"vocabulary size mismatch: {source} gives {count} characters"
      f"{' plus [UNK]' if has_unk else ''} but the model's embedding has "
      f"{vocab_size} rows (it needs {vocab_size} characters, or "
      f"{vocab_size - 1} plus [UNK] at id 0)")


def read_corpus_vocab(path) -> List[str]:
  """`sorted(set(text))` of a UTF-8 text file, read in chunks as bytes.

  Newlines are kept exactly as stored ('\\r\\n' gives '\\r' and '\\n'), as the
  tutorial's `open(path, 'rb').read().decode('utf-8')` does.

  Raises:
    FileNotFoundError / OSError: the file cannot be read.
    ValueError: it is not UTF-8 (the message gives the byte offset) or empty.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path}: the corpus is a directory, not a text file")
  decoder = codecs.getincrementaldecoder("utf-8")()
  chars = set()
  offset = 0
  with open(path, "rb") as f:
    while True:
      chunk = f.read(_CORPUS_CHUNK)
      try:
        chars.update(decoder.decode(chunk, final=not chunk))
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}: the corpus is not UTF-8 text (bad byte at "
                         f"offset {offset + max(e.start, 0)})") from None
      if not chunk:
        break
      offset += len(chunk)
  if not chars:
    raise ValueError(f"{path}: the corpus is empty")
  return sorted(chars)


def read_vocab_file(path) -> List[str]:
  """Reads a vocabulary file: a UTF-8 JSON list of single characters in id
  order, optionally with "[UNK]" first, e.g. `["[UNK]", "\\n", " ", "!"]`.

  Raises:
    FileNotFoundError / OSError: the file cannot be read.
    ValueError: not such a list; the message says what is wrong.
  """
  return model_file.validate_vocab(load_vocab_json(path), os.fspath(path))


def load_vocab_json(path):
  """A vocabulary file's decoded JSON (at most MAX_VOCAB_FILE_BYTES)."""
  path = os.fspath(path)
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path}: the vocab file is a directory")
  raw = safe_io.read_file(path, MAX_VOCAB_FILE_BYTES, path,
                          "too large for a vocab file")
  try:
    data = json.loads(raw.decode("utf-8-sig"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
    raise ValueError(f"{path}: not a vocab file ({' '.join(str(e).split())}); "
                     "expected UTF-8 JSON: a list of the characters or words "
                     'in id order like ["\\n", " ", "!"], or a tokenizer '
                     "file (" + TOKENIZER_FILES + ")") from None
  return data


# The vocabulary files besides a list, as messages name them.
TOKENIZER_FILES = ('a Keras Tokenizer\'s to_json(), a Hugging Face '
                   'tokenizer.json, {"kind": "bytes"}')


def unit(tokens: vocabulary_lib.Tokens) -> str:
  """What a token vocabulary's entries are called in messages."""
  return "words" if tokens.kind == "words" else "tokens"


def unknown_object(data: dict, source: str) -> ValueError:
  """The error for a JSON object that is no vocabulary file rnnstep reads
  (a `{token: index}` map, such as GPT-2's `vocab.json`), naming what is."""
  long = [t for t in data if not isinstance(t, str) or len(t) != 1]
  found = (f" with multi-character tokens such as {long[0]!r}" if long
           else "")
  return ValueError(f"{source}: vocab is a JSON object {{token: index}}"
                    f"{found}, not a list; give the tokens in id order as a "
                    f"JSON list (characters or words), or the tokenizer file "
                    f"itself ({TOKENIZER_FILES})")


WORD_LM_FILES = ("train.txt", "valid.txt", "test.txt")
WORD_LM_EOS = "<eos>"


def word_tokens(words: Sequence[str], source: str) -> vocabulary_lib.Tokens:
  """A words vocabulary split as word_language_model splits: on whitespace,
  with `<eos>` for a line end where the list holds it.

  Raises:
    ValueError: a repeated or non-string entry, naming `source`.
  """
  words = model_file.validate_vocab(list(words), source, tokens=True)
  rules = {"newline": WORD_LM_EOS} if WORD_LM_EOS in words else {}
  return vocabulary_lib.Tokens("words", words, rules, source)


def is_word_list(data) -> bool:
  """Whether a vocabulary list holds words (an entry other than one
  character or "[UNK]" at id 0), not characters."""
  return isinstance(data, list) and any(
      isinstance(t, str) and len(t) != 1 and not (i == 0 and t == UNK_TOKEN)
      for i, t in enumerate(data))


def read_token_vocab_file(path) -> vocabulary_lib.Tokens:
  """A vocabulary file of words (a JSON list in id order, such as
  word_language_model's `corpus.dictionary.idx2word`) as a words vocabulary;
  see `word_tokens`.

  Raises:
    FileNotFoundError / OSError: the file cannot be read.
    ValueError: not such a list.
  """
  data = load_vocab_json(path)
  if not isinstance(data, list):
    model_file.validate_vocab(data, os.fspath(path))  # Its message says why.
  return word_tokens(data, os.fspath(path))


def read_corpus_folder(path) -> vocabulary_lib.Tokens:
  """word_language_model's vocabulary, rebuilt from its corpus folder.

  As the recipe's `data.Corpus` does: `train.txt`, then `valid.txt`, then
  `test.txt`, each line split on whitespace with `<eos>` after it, words
  numbered in the order they first appear.

  Raises:
    FileNotFoundError: the folder lacks one of the three files.
    ValueError: a file is not UTF-8 text, or the vocabulary is too large.
  """
  path = os.fspath(path)
  ids = {}
  for name in WORD_LM_FILES:
    file_path = os.path.join(path, name)
    if not os.path.isfile(file_path):
      raise FileNotFoundError(
          f"{file_path}: missing; a word_language_model corpus folder holds "
          f"{', '.join(WORD_LM_FILES)}")
    try:
      with open(file_path, "r", encoding="utf8") as f:
        for line in f:
          for word in line.split() + [WORD_LM_EOS]:
            if word not in ids:
              ids[word] = len(ids)
              if len(ids) > model_file.MAX_VOCAB:
                raise ValueError(f"{file_path}: more than "
                                 f"{model_file.MAX_VOCAB} words")
    except UnicodeDecodeError as e:
      raise ValueError(f"{file_path}: not UTF-8 text (bad byte at offset "
                       f"{e.start})") from None
  return vocabulary_lib.Tokens("words", list(ids), {"newline": WORD_LM_EOS},
                               path)


def is_keras_tokenizer(data) -> bool:
  """Whether decoded JSON is a Keras `Tokenizer.to_json()`."""
  return (isinstance(data, dict) and data.get("class_name") == "Tokenizer"
          and isinstance(data.get("config"), dict))


def keras_tokenizer(data, source: str) -> vocabulary_lib.Tokens:
  """A words vocabulary from a Keras `Tokenizer.to_json()` (decoded JSON).

  The rules are the tokenizer's own (`lower`, `filters`, `split`,
  `oov_token`; a `char_level` one's characters, lowered where `lower`
  says); id 0 is Keras's padding, recorded as "[UNK]" so that it is
  never generated; ids 1.. are its `index_word`, up to `num_words` where it
  set one (Keras maps the words past it to the OOV token, or drops them;
  rnnstep refuses them where there is no OOV token).

  Raises:
    ValueError: a config that is not one; naming `source`.
  """
  config = data["config"]

  def field(name, kind, default):
    value = config.get(name, default)
    if not isinstance(value, kind):
      raise ValueError(f"{source}: the Keras Tokenizer's {name} is not a "
                       f"{getattr(kind, '__name__', 'valid value')}")
    return value

  try:
    index_word = json.loads(field("index_word", str, "{}"))
    words = {int(i): w for i, w in index_word.items()}
  except (ValueError, AttributeError, TypeError):
    raise ValueError(f"{source}: the Keras Tokenizer's index_word is not a "
                     "JSON object of {index: word}") from None
  count = max(words, default=0)
  num_words = config.get("num_words")
  if isinstance(num_words, int) and not isinstance(num_words, bool):
    count = min(count, num_words - 1)
  if sorted(words)[:count] != list(range(1, count + 1)):
    raise ValueError(f"{source}: the Keras Tokenizer's index_word does not "
                     f"number its words 1..{count}")
  vocab = [UNK_TOKEN] + [words[i] for i in range(1, count + 1)]
  oov = field("oov_token", (str, type(None)), None)
  rules = {"lower": field("lower", bool, True)}
  if field("char_level", bool, False):
    # Keras's char_level reads each character as a word: lowered where
    # `lower` says, neither `filters` nor `split` applied.
    rules = {"char_level": True, **rules}
  else:
    rules.update(filters=field("filters", str, ""),
                 split=field("split", str, " "))
  # Without an OOV token a prompt word the index lacks is refused, where
  # texts_to_sequences drops it: a prompt is never silently changed.
  rules["oov"] = oov if oov in vocab else None
  vocab = model_file.validate_vocab(vocab, source, tokens=True)
  return vocabulary_lib.Tokens("words", vocab, rules, source)


def pads_windows(tokens) -> bool:
  """Whether a window model over this vocabulary was trained, and is
  sampled, on windows that Keras's `pad_sequences` filled at the front with
  id 0: a legacy `Tokenizer`'s words (`keras_tokenizer`: id 0 is its
  padding, never a word; its rules are the only ones with `filters`), or a
  character-level one's (textgenrnn's `Tokenizer(char_level=True)`)."""
  return (tokens is not None and tokens.kind == "words"
          and tokens.vocab[0] == UNK_TOKEN
          and ("filters" in tokens.rules or tokens.rules.get("char_level")))


# A Keras TextVectorization layer's fixed special tokens: the mask "" at id
# 0 and the OOV token at id 1 (its StringLookup: mask_token="",
# num_oov_indices=1, oov_token="[UNK]").
TEXT_VECTORIZATION_SPECIAL = ("", "[UNK]")


def text_vectorization_asset(data: bytes, source: str) -> List[str]:
  """The tokens of a TextVectorization layer's `vocabulary.txt` asset, read
  as Keras's `IndexLookup.load_assets` reads it: text lines (universal
  newlines, then `str.splitlines`), trailing empty lines dropped.

  Raises:
    ValueError: not UTF-8 text, naming `source`.
  """
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{source}: the TextVectorization vocabulary is not "
                     f"UTF-8 text (bad byte at offset {e.start})") from None
  lines = text.replace("\r\n", "\n").replace("\r", "\n").splitlines()
  while lines and lines[-1] == "":
    lines.pop()
  return lines


def text_vectorization_tokens(settings: dict, vocabulary: Sequence[str],
                              source: str) -> vocabulary_lib.Tokens:
  """A words vocabulary from a TextVectorization layer's settings
  (`keras_config.text_vectorization`) and its vocabulary, laid out as the
  layer's lookup lays it out (`IndexLookup.set_vocabulary`): "" (the mask) at
  id 0, "[UNK]" (the OOV token) at id 1, then the terms; a vocabulary that
  starts with those two has them dropped first.

  Raises:
    ValueError: a repeated term, or a size other than the config's; naming
      `source`.
  """
  terms = list(vocabulary)
  special = list(TEXT_VECTORIZATION_SPECIAL)
  if terms[:2] == special:
    terms = terms[2:]
  vocab = special + terms
  size = settings.get("vocabulary_size")
  if size is not None and size != len(vocab):
    raise ValueError(f"{source}: the TextVectorization layer's vocabulary "
                     f"holds {len(vocab)} tokens, but its config says "
                     f"vocabulary_size={size}")
  vocab = model_file.validate_vocab(vocab, source, tokens=True)
  rules = {"text_vectorization": {"standardize": settings["standardize"],
                                  "split": settings["split"]},
           "oov": special[1]}
  return vocabulary_lib.Tokens("words", vocab, rules, source)


def is_hf_tokenizer(data) -> bool:
  """Whether decoded JSON is a Hugging Face `tokenizers` file
  (`tokenizer.json`: a `model` object with a `type`)."""
  return (isinstance(data, dict) and isinstance(data.get("model"), dict)
          and "type" in data["model"] and "kind" not in data)


def subword_tokens(data, source: str) -> vocabulary_lib.Tokens:
  """A subword vocabulary from a `tokenizers` JSON (decoded): the tokens in
  id order, the JSON stored as the rule the library applies.

  Raises:
    ValueError: the library cannot load it, or it leaves an id unnamed.
  """
  text = json.dumps(data, ensure_ascii=False)
  tokenizer = vocabulary_lib.load_tokenizer(text, source)
  size = tokenizer.get_vocab_size(with_added_tokens=True)
  vocab = [tokenizer.id_to_token(i) for i in range(size)]
  if any(t is None for t in vocab):
    raise ValueError(f"{source}: the tokenizer names no token for id "
                     f"{vocab.index(None)} (its ids must run 0..{size - 1})")
  return vocabulary_lib.Tokens("subword", vocab, {"tokenizer": text}, source)


def tokens_file(data, source: str) -> vocabulary_lib.Tokens:
  """A vocabulary file in the model file's own `tokens` form:
  `{"kind": "bytes"}`, `{"kind": "words", "vocab": [...], rules...}` or
  `{"kind": "subword", "tokenizer": "<tokenizers JSON text>"}`.

  Raises:
    ValueError: an unknown kind or rule, naming `source`.
  """
  rules = dict(data)
  kind = rules.pop("kind")
  vocab = rules.pop("vocab", None)
  if kind == "bytes":
    vocab = vocabulary_lib.bytes_vocab()
  elif kind == "subword":
    if not isinstance(rules.get("tokenizer"), str):
      raise ValueError(f"{source}: a subword vocabulary needs tokenizer, the "
                       "tokenizers JSON as text")
    try:
      parsed = json.loads(rules["tokenizer"])
    except json.JSONDecodeError as e:
      raise ValueError(f"{source}: tokenizer is not JSON ({e})") from None
    return subword_tokens(parsed, source)
  elif not isinstance(vocab, list):
    raise ValueError(f"{source}: a {kind!r} vocabulary file needs vocab, the "
                     "tokens in id order")
  vocab = model_file.validate_vocab(list(vocab), source, tokens=True)
  return vocabulary_lib.Tokens(kind, vocab, rules, source)
