"""A token vocabulary's rules as TensorFlow ops: the SavedModel's text.

`GraphTokens(tokens)` holds what a served graph needs to map prompt strings
to ids and generated ids back to text exactly as `vocabulary.Tokens` does on
the host (`Tokens.encode`, `Tokens.text`), with TensorFlow ops only, so that
a SavedModel serves strings without rnnstep:

  - **text out, every kind**: each id's piece (the bytes it adds to a text,
    `Tokens.pieces`) gathered, joined and decoded as UTF-8 with U+FFFD for
    what is not UTF-8 (`tf.strings.unicode_transcode`; Python's
    `decode("utf-8", "replace")` substitutes the same maximal subparts).
  - **strings in, `bytes`**: a prompt's UTF-8 bytes (`tf.strings.bytes_split`).
  - **strings in, `words`**: the recipe's own rules, in the host's order.
    word_language_model's newline token: lines split apart first, the token
    between them. Keras `Tokenizer`'s `lower` (`tf.strings.lower` with UTF-8,
    ICU's full case mapping, as Python's `str.lower`; the characters where
    this TensorFlow's Unicode tables and this Python's differ, found when the
    graph is built, fail the call rather than map differently), its
    `filters` (each replaced by the split separator) and its `split` (a
    separator; or Python's whitespace, `str.isspace`, which is wider than
    TensorFlow's). A Keras `TextVectorization`'s `standardize` and `split`
    are the layer's own ops (`tf.strings.lower`, its punctuation regex,
    `tf.strings.split`, `tf.strings.unicode_split`). Then a table from words
    to ids, the OOV token for the rest (or a failed call whose message names
    the first unknown words, the assertion's data).
  - **textgenrnn's word level** (the `recipe` rule): its prefix split
    (`_textgenrnn_words`) and its text, the words joined and re-spaced by
    its regexes after the prompt as it writes it (`continuation`), in RE2.
  - **strings in, `subword`**: none. A Hugging Face `tokenizers` model runs
    in Rust, not in a graph; a served subword model takes ids (`strings` is
    False) and ships its tokenizer JSON as an asset.

Nothing here runs on the host at serving time; the checks are graph ops that
fail the call with `InvalidArgumentError`.
"""

import functools
import re
from typing import List, Tuple

import tensorflow as tf

from rnnstep.model import vocabulary as vocabulary_lib

# Messages of the graph's checks (tests match them).
NOT_UTF8 = "a prompt is not UTF-8 text"
# Followed, in the error, by the first unknown words: `[zebra unicorn]` (the
# host's refusal is `vocabulary.unknown_words`). No quote marks: TensorFlow's
# Assert escapes them in its message (model\'s, \'zebra\').
UNKNOWN_WORD = ("prompt words are not in the vocabulary of the model (which "
                "has no out-of-vocabulary token); remove or replace them:")
NO_TOKENS = "a prompt gives no tokens"
LOWER_DIFFERS = ("a prompt holds a character whose lowercase differs between "
                 "this TensorFlow's and the exporting Python's Unicode "
                 "tables (or NUL); remove or replace it")


def _char_class(chars) -> str:
  """An RE2 character class matching exactly `chars` (each as \\x{...})."""
  return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in sorted(set(chars))) + "]"


def _rewrite(text: str) -> str:
  """`text` as an RE2 rewrite string (backslashes escaped)."""
  return text.replace("\\", "\\\\")


@functools.lru_cache(maxsize=None)
def python_whitespace() -> str:
  """The characters Python's `str.split()` splits on (`str.isspace`)."""
  return "".join(c for c in map(chr, range(0x110000)) if c.isspace())


@functools.lru_cache(maxsize=None)
def lower_mismatches() -> str:
  """The characters whose `tf.strings.lower(encoding="utf-8")` is not
  Python's `str.lower()` (Unicode versions apart; NUL ends ICU's string)."""
  chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
  lowered = tf.strings.lower(tf.constant(chars), encoding="utf-8").numpy()
  return "".join(c for c, low in zip(chars, lowered)
                 if c.lower().encode("utf-8") != low)


def _table(keys, values, default: int):
  return tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(
          tf.constant(keys, tf.string), tf.constant(values, tf.int32)),
      default_value=default)


def _python_class(chars: str) -> str:
  """The RE2 class of exactly the characters Python's `[chars]` matches
  (its ranges and escapes read by Python itself)."""
  pattern = re.compile("[{}]".format(chars))
  candidates = set(chars) | set(map(chr, range(128)))
  return _char_class(c for c in candidates if pattern.fullmatch(c))


def _respace(text: tf.Tensor) -> tf.Tensor:
  """textgenrnn's re-spacing (`vocabulary.respace_textgenrnn`) in RE2."""
  both = _python_class(vocabulary_lib.TEXTGENRNN_BOTH)
  left = _python_class(vocabulary_lib.TEXTGENRNN_LEFT)
  right = _python_class(vocabulary_lib.TEXTGENRNN_RIGHT)
  text = tf.strings.regex_replace(text, f" ({both}) ", r"\1")
  text = tf.strings.regex_replace(text, f" ({left})", r"\1")
  text = tf.strings.regex_replace(text, f"({right}) ", r"\1")
  return tf.strings.regex_replace(text, '" (.+?) "', r'"\1"')


class GraphTokens(tf.Module):
  """A token vocabulary's encoding and decoding as graph ops (see module).

  Args:
    tokens: the model's `vocabulary.Tokens` (not `characters`).

  Attributes:
    strings: whether `encode` exists (every kind but `subword`).
  """

  def __init__(self, tokens: vocabulary_lib.Tokens):
    super().__init__(name="rnnstep_tokens")
    self._kind = tokens.kind
    self._rules = dict(tokens.rules)
    self.vocab_size = len(tokens.vocab)
    self.pieces = tf.Variable(tokens.pieces, dtype=tf.string, trainable=False,
                              name="pieces")
    self.strings = tokens.kind in ("words", "bytes")
    if tokens.kind == "bytes":
      self._ids = _table([bytes([b]) for b in range(256)], list(range(256)), -1)
    elif tokens.kind == "words":
      self._vocab = tokens.vocab
      self._ids = _table([t.encode("utf-8") for t in tokens.vocab],
                         list(range(len(tokens.vocab))), -1)
      oov = self._rules.get("oov")
      newline = self._rules.get("newline")
      self._oov = None if oov is None else tokens.vocab.index(oov)
      self._newline = None if newline is None else tokens.vocab.index(newline)
      self._recipe = self._rules.get("recipe")
      self._lower_refused = (_char_class(lower_mismatches())
                             if self._rules.get("lower") or self._recipe
                             else None)
      if self._recipe == "textgenrnn":  # Its words, to join them as it does.
        self._words_of_ids = tf.Variable(
            [t.encode("utf-8") for t in tokens.vocab], dtype=tf.string,
            trainable=False, name="words")
        self._start = tokens.vocab.index(self._rules["start"])

  # ------------------------------------------------------------- ids to text

  def decode(self, ids: tf.Tensor, lengths: tf.Tensor,
             cut=None) -> tf.Tensor:
    """string `[B]`: each row's first `lengths` ids as text (`Tokens.text`).

    Args:
      ids: int32 `[B, N]`.
      lengths: int32 `[B]`.
      cut: None, or a function of the rows' bytes (string `[B]`) that cuts
        them at their stop strings (`stop_ops.StopTables.cut`), applied
        before they are decoded as UTF-8.
    """
    if self._kind == "words" and self._recipe == "textgenrnn":
      return self.continuation(tf.fill(tf.shape(lengths), ""), ids, lengths)
    pieces = tf.RaggedTensor.from_tensor(tf.gather(self.pieces, ids),
                                         lengths=lengths)
    data = tf.strings.reduce_join(pieces, axis=1)
    if cut is not None:
      data = cut(data)
    return tf.strings.unicode_transcode(
        data, "UTF-8", "UTF-8",
        errors="replace", replacement_char=0xFFFD,
        replace_control_characters=False)

  def continuation(self, prompts: tf.Tensor, ids: tf.Tensor,
                   lengths: tf.Tensor) -> tf.Tensor:
    """string `[B]`: textgenrnn's word-level text after each prompt, as
    `vocabulary.TextgenrnnText` makes it: the prompt's words and the
    generated ones (`<s>` skipped) joined with " " and re-spaced by its
    regexes (RE2 here, the same classes as Python's, leftmost-first), after
    the longest start (in characters) it shares with the prompt's words
    re-spaced alone.

    Args:
      prompts: string `[B]`, as the rows' prompts.
      ids: int32 `[B, N]`.
      lengths: int32 `[B]`.
    """
    prompt_words = self._textgenrnn_words(prompts)
    words = tf.RaggedTensor.from_tensor(tf.gather(self._words_of_ids, ids),
                                        lengths=lengths)
    words = tf.ragged.boolean_mask(words, tf.RaggedTensor.from_tensor(
        ids, lengths=lengths) != self._start)
    written = _respace(tf.strings.reduce_join(prompt_words, axis=1,
                                              separator=" "))
    whole = _respace(tf.strings.reduce_join(
        tf.concat([prompt_words, words], axis=1), axis=1, separator=" "))
    written_chars = tf.strings.unicode_split(written, "UTF-8")
    whole_chars = tf.strings.unicode_split(whole, "UTF-8")
    dense_written = written_chars.to_tensor("")
    dense_whole = whole_chars.to_tensor("")
    width = tf.minimum(tf.shape(dense_written)[1], tf.shape(dense_whole)[1])
    same = tf.cast(tf.equal(dense_written[:, :width], dense_whole[:, :width]),
                   tf.int32)
    shared = tf.minimum(
        tf.reduce_sum(tf.math.cumprod(same, axis=1), axis=1),
        tf.cast(tf.minimum(written_chars.row_lengths(),
                           whole_chars.row_lengths()), tf.int32))
    positions = tf.ragged.range(tf.cast(whole_chars.row_lengths(), tf.int32))
    return tf.strings.reduce_join(tf.ragged.boolean_mask(
        whole_chars, positions >= shared[:, None]), axis=1)

  def _textgenrnn_words(self, prompts) -> tf.RaggedTensor:
    """textgenrnn's words of each prompt (`vocabulary.textgenrnn_words`;
    lowered first: its punctuation has no case), none for an empty one."""
    lowered = tf.strings.lower(prompts, encoding="utf-8")
    spaced = tf.strings.regex_replace(
        lowered, "(" + _python_class(
            vocabulary_lib.TEXTGENRNN_PREFIX_PUNCT) + ")", r" \1 ")
    spaced = tf.strings.regex_replace(spaced, " {2,}", " ")
    words = tf.strings.split(spaced, sep=" ")  # Empty words kept, as str.split.
    keep = tf.gather(tf.strings.length(prompts) > 0, words.value_rowids())
    return tf.ragged.boolean_mask(words, words.with_flat_values(keep))

  # ------------------------------------------------------------- text to ids

  def encode(self, prompts: tf.Tensor) -> Tuple[tf.RaggedTensor, List]:
    """Prompt strings `[B]` to ids, by the vocabulary's rules.

    Returns:
      `(ids, checks)`: int32 ragged `[B, None]` and the assertions that fail
      the call for a prompt the host would refuse (an unknown word without
      an OOV token, a prompt of no tokens, text that is not UTF-8).
    """
    if self._kind == "bytes":
      ids = tf.ragged.map_flat_values(self._ids.lookup,
                                      tf.strings.bytes_split(prompts))
      return ids, [tf.debugging.assert_positive(ids.row_lengths(),
                                                message=NO_TOKENS)]
    if self._kind != "words":
      raise ValueError(f"a {self._kind} vocabulary has no string encoding in a "
                       "graph; serve its ids")
    checks = [tf.debugging.assert_equal(
        tf.strings.unicode_transcode(prompts, "UTF-8", "UTF-8",
                                     errors="replace", replacement_char=0xFFFD,
                                     replace_control_characters=False),
        prompts, message=NOT_UTF8)]
    words = self._words(prompts, checks)
    ids = tf.ragged.map_flat_values(self._ids.lookup, words)
    if self._oov is None:  # The words themselves in the error, as the host's.
      unknown = tf.unique(tf.boolean_mask(words.flat_values,
                                          ids.flat_values < 0)).y
      checks.append(tf.debugging.Assert(
          tf.size(unknown) == 0,
          [UNKNOWN_WORD, unknown[:vocabulary_lib.SHOWN_UNKNOWN]],
          summarize=vocabulary_lib.SHOWN_UNKNOWN))
    else:
      ids = tf.ragged.map_flat_values(
          lambda x: tf.where(x < 0, self._oov, x), ids)
    start = self._rules.get("start")
    if start is not None:  # Every prompt starts with it (`Tokens.encode`).
      first = tf.fill([tf.shape(prompts)[0], 1],
                      tf.constant(self._vocab.index(start), ids.dtype))
      ids = tf.concat([tf.RaggedTensor.from_tensor(first), ids], 1)
    checks.append(tf.debugging.assert_positive(ids.row_lengths(),
                                               message=NO_TOKENS))
    return ids, checks

  def _words(self, prompts, checks) -> tf.RaggedTensor:
    """string ragged `[B, None]`: each prompt's words, as `Tokens.words`;
    the newline token's lines as its word."""
    rules = self._rules
    vectorize = rules.get("text_vectorization")
    if vectorize is not None:  # The layer's own ops (its `_preprocess`).
      standardize, split = vectorize["standardize"], vectorize["split"]
      if standardize in ("lower", "lower_and_strip_punctuation"):
        prompts = tf.strings.lower(prompts)
      if standardize in ("strip_punctuation", "lower_and_strip_punctuation"):
        prompts = tf.strings.regex_replace(
            prompts, vocabulary_lib.TEXT_VECTORIZATION_PUNCTUATION, "")
      if split == "whitespace":
        return tf.strings.split(prompts)
      if split == "character":
        return tf.strings.unicode_split(prompts, "UTF-8")
      return tf.RaggedTensor.from_tensor(prompts[:, None])
    if self._recipe == "textgenrnn":
      checks.append(tf.debugging.assert_equal(
          tf.strings.regex_full_match(prompts,
                                      f"(?s).*{self._lower_refused}.*"),
          False, message=LOWER_DIFFERS))
      return self._textgenrnn_words(prompts)
    if self._lower_refused is not None:
      checks.append(tf.debugging.assert_equal(
          tf.strings.regex_full_match(prompts,
                                      f"(?s).*{self._lower_refused}.*"),
          False, message=LOWER_DIFFERS))
      prompts = tf.strings.lower(prompts, encoding="utf-8")
    if rules.get("char_level"):  # Keras: lowered, then each character.
      return tf.strings.unicode_split(prompts, "UTF-8")
    if self._newline is not None:  # Lines apart before anything else.
      lines = tf.strings.split(prompts, "\n")
    else:
      lines = tf.RaggedTensor.from_tensor(prompts[:, None])
    split = rules.get("split")
    text = lines.flat_values
    filters = rules.get("filters", "")
    if self._newline is not None:
      filters = filters.replace("\n", "")
    if filters:
      text = tf.strings.regex_replace(text, _char_class(filters),
                                      _rewrite(split or " "))
    if split is None:
      text = tf.strings.regex_replace(text, _char_class(python_whitespace()),
                                      " ")
    words = tf.strings.split(text, split or " ")
    words = tf.ragged.boolean_mask(words, tf.strings.length(words) > 0)
    if self._newline is None:
      return lines.with_flat_values(words).merge_dims(1, 2)
    # Each line's words and then the newline token, the last line's dropped.
    newline = tf.fill([tf.shape(text)[0], 1],
                      tf.constant(rules["newline"]))
    per_line = tf.concat([words, tf.RaggedTensor.from_tensor(newline)], 1)
    joined = lines.with_flat_values(per_line).merge_dims(1, 2)
    return joined[:, :-1]


__all__ = ["GraphTokens", "python_whitespace",
           "lower_mismatches"]
