"""Converts saved Keras, PyTorch or RWKV-7 weights into an rnnstep model file,
without Keras or torch.

    from rnnstep import convert
    summary = convert.convert("training_checkpoints", "model.npz",
                              corpus="shakespeare.txt")
    print(summary)
    print(convert.describe("model.keras"))           # what is there; writes nothing
    config, tensors = convert.read_weights("w.h5")   # ModelConfig + arrays
    model_file = convert.read_any("rnn.pt", vocab="vocab.json")  # no file written

Inputs (see docs/guide/converting.md and docs/dev/file-formats.md):
  - Keras 3 `.keras` archives (Sequential, Functional, subclassed), unzipped
    `.keras` directories, `.weights.h5`, and legacy `.h5` from `model.save`;
  - tf.keras / tf_keras HDF5: `save_weights('w.h5')` and `save('m.h5')`;
  - TF checkpoints: a directory (its latest checkpoint) or a prefix, from
    `ModelCheckpoint(save_weights_only=True)` of Keras 2 models and from
    `tf.train.Checkpoint(model=...)` of Keras 3 models;
  - sherjilozair/char-rnn-tensorflow save directories (TF1 checkpoints with
    `config.pkl` and `chars_vocab.pkl`; `tf1_charrnn`), which hold their own
    vocabulary;
  - PyTorch state dicts and whole pickled modules: `torch.save` files (`.pt`,
    `.pth`, `.bin`; zip or legacy format) and `.safetensors` (`pytorch`,
    `torch_zip`, `torch_legacy`, `safetensors_file`);
  - RWKV-7: KerasHub presets and `.weights.h5`, official RWKV-LM `.pth`
    with the world vocabulary file (`rwkv7`: its own readers, before any of
    the above is tried).

A recurrent stack must be Embedding (or one-hot inputs: an identity
Embedding) -> GRU (reset_after True/False) / LSTM / SimpleRNN layer(s) ->
Dense (PyTorch: Embedding -> GRU / LSTM / RNN (tanh; relu where a whole
pickled module says so) -> Linear), over characters, words, bytes or subword
tokens; RWKV-7 comes as an RWKV-LM `.pth` (with `rwkv_vocab_v20230424.txt`)
or a KerasHub preset (docs/guide/rwkv.md). Anything else is refused with
a message saying what was found, before any vocabulary is read. A model built
for fixed windows (a fixed T in its Input, return_sequences=False on its last
recurrent layer) records `window` in its config. Files are read as data only:
no Keras or torch import, no config deserialization, no pickled code run (a
restricted unpickler rebuilds tensors and dicts, and a pickled module's
classes only as inert records; it calls nothing the file names), guarded zip
and HDF5 access (`safe_io`), `tf.train.load_checkpoint` for TF checkpoints.

Vocabulary (except for a char-rnn-tensorflow directory, whose own
`chars_vocab.pkl` is used): `corpus=` (a text file) gives the tutorial's `sorted(set(text))`;
`vocab=` is a list of characters or a vocabulary file (a UTF-8 JSON list of
strings, e.g. `["\\n", " ", "!", ...]`, optionally with "[UNK]" first). A
Keras model whose string Input feeds a TextVectorization layer holds its own
vocabulary (and needs neither). If the
embedding has exactly one row more than the characters, id 0 is "[UNK]" (the
current TF tutorial's `StringLookup(mask_token=None)`). Any other mismatch is an
error that gives both sizes.
"""

import dataclasses
import os
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from rnnstep.convert.contents import Contents
from rnnstep.convert.contents import LayerSummary
from rnnstep.convert.contents import Summary
from rnnstep.convert import isolation
from rnnstep.convert import keras_v2_h5
from rnnstep.convert import keras_v3
from rnnstep.convert import mapping
from rnnstep.convert import pytorch
from rnnstep.convert import rwkv7
from rnnstep.convert import safe_io
from rnnstep.convert import tf1_charrnn
from rnnstep.convert import textgenrnn
from rnnstep.convert import tf_checkpoint
from rnnstep.convert import torch_legacy
from rnnstep.convert import torch_zip
from rnnstep.convert import vocabulary as convert_vocabulary
from rnnstep.convert.vocabulary import read_corpus_vocab
from rnnstep.convert.vocabulary import read_vocab_file
from rnnstep.convert.vocabulary import resolve_vocab
from rnnstep.convert.vocabulary import VocabularyNotAllowed
from rnnstep.convert.vocabulary import VocabularyRequired
from rnnstep.convert.vocabulary import vocab_from_corpus
from rnnstep.model import chat_template as chat_template_lib
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import reduced_weights

__all__ = ["LayerSummary", "Summary", "VocabularyNotAllowed",
           "VocabularyRequired", "convert", "describe", "holds_vocabulary",
           "is_model_file", "read_any", "read_corpus_vocab", "read_vocabulary", "read_vocab_file", "read_weights",
           "resolve_vocab", "vocab_from_corpus"]

PathLike = Union[str, os.PathLike]


# ------------------------------------------------------------------ public API


def describe(input_path: PathLike) -> Summary:
  """Reports what a weights file holds and how it maps; reads no tensor data.

  Args:
    input_path: the weights file, directory or checkpoint prefix.

  Returns:
    The `Summary` (no `vocab`, no `output_path`).

  Raises:
    FileNotFoundError: no such file, directory or checkpoint prefix.
    ValueError: the file cannot be read or the model cannot be mapped; the
      message says what was found.
  """
  return _contained(input_path, _describe, input_path)


def _describe(input_path: PathLike) -> Summary:
  if rwkv7.file_kind(input_path):
    return rwkv7.summary(input_path, rwkv7.read_model(
        input_path, None, None, describe=True))
  contents = _open(input_path)
  try:
    mapped = mapping.map_model(contents)
    return _summary(input_path, mapped)
  finally:
    contents.close()


def read_weights(input_path: PathLike) -> Tuple[model_file.ModelConfig,
                                                Dict[str, np.ndarray]]:
  """Reads a weights file into (ModelConfig, float32 tensors), writing nothing.

  The tensors are keyed as in the model file (`embedding`, `layer{i}_kernel`,
  ..., `dense_bias`); a missing bias is returned as zeros.
  """
  return _contained(input_path, _read_weights, input_path)


def _read_weights(input_path: PathLike):
  if rwkv7.file_kind(input_path):
    read = rwkv7.read_model(input_path, None, None, describe=True)
    return read.config, read.tensors
  contents = _open(input_path)
  try:
    mapped = mapping.map_model(contents)
    return mapped.config, mapped.read_tensors()
  finally:
    contents.close()


def convert(input_path: PathLike, output_path: PathLike, *,
            corpus: Optional[PathLike] = None,
            vocab: Union[None, PathLike, Sequence[str]] = None,
            weights_dtype: str = "float32") -> Summary:
  """Converts a Keras weights file into an rnnstep model file.

  Args:
    input_path: a `.keras`, `.weights.h5`, `.h5`, a PyTorch `.pt` / `.pth` /
      `.bin` / `.safetensors` state dict, a TF checkpoint prefix or a
      checkpoint directory.
    output_path: the `.npz` model file to write (atomically: on any failure
      nothing is left at this path).
    corpus: a UTF-8 text file; the vocabulary is `sorted(set(text))`.
    vocab: instead of `corpus`: a list of characters, or the path of a
      vocabulary file (a JSON list of strings). A str is always a path.
      Neither for a file that holds its own vocabulary (a char-rnn-tensorflow
      save directory's `chars_vocab.pkl`, a Keras model's TextVectorization
      layer).
    weights_dtype: what the file stores its large matrices in
      (`model_file.write`): float32, float16, bfloat16 or int8.

  Returns:
    The Summary of what was read and written.

  Raises:
    FileNotFoundError: the input does not exist.
    VocabularyRequired: neither, for a file that holds no vocabulary.
    ValueError: the input cannot be read or mapped, or the vocabulary does not
      fit the weights (the message gives both sizes).
    OSError: the output cannot be written.
  """
  input_path = os.fspath(input_path)
  if corpus is not None and vocab is not None:
    raise ValueError("give only one of corpus= (a text file) or vocab= (a "
                     "vocabulary file or list of characters)")
  if weights_dtype not in reduced_weights.WEIGHTS_DTYPES:
    raise ValueError(reduced_weights.choices_message(weights_dtype))
  output_path = os.fspath(output_path)
  if os.path.isdir(output_path):
    raise IsADirectoryError(f"{output_path}: the output is a directory; give a "
                            "file name like model.npz")
  directory = os.path.dirname(os.path.abspath(output_path))
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"{output_path}: the output directory {directory} "
                            "does not exist")
  if os.path.exists(output_path) and os.path.exists(input_path) and (
      os.path.samefile(output_path, input_path)):
    raise ValueError(f"{output_path}: the output would overwrite the input")
  if is_model_file(input_path):
    raise ValueError(f"{input_path}: already an rnnstep model file; nothing to "
                     "convert")
  # The vocabulary is read after the model is mapped (`_read_mapped`): a model
  # rnnstep cannot run is the real blocker, whatever the vocabulary.
  return _contained(input_path, _convert, input_path, output_path, corpus,
                    vocab, weights_dtype)


def is_model_file(path: PathLike) -> bool:
  """Whether `path` is an rnnstep `.npz` model file (a zip holding a
  `format_version.npy` member), as opposed to weights to convert."""
  path = os.fspath(path)
  if not os.path.isfile(path) or safe_io.sniff(path) != "zip":
    return False
  try:
    with safe_io.open_zip(path) as archive:
      return "format_version.npy" in safe_io.member_names(archive)
  except ValueError:
    return False


def holds_vocabulary(input_path: PathLike) -> bool:
  """Whether a weights file holds its own vocabulary (a char-rnn-tensorflow
  save directory's `chars_vocab.pkl`, a Keras model's TextVectorization
  layer), so that it needs no `corpus` or `vocab`; False for a file that
  cannot be read (its own errors come when it is read).

  Raises:
    FileNotFoundError: no such file (said first, rather than asking for a
      vocabulary).
  """
  try:
    return _contained(input_path, _holds_vocabulary, input_path)
  except FileNotFoundError:
    raise
  except (OSError, ValueError):
    return False


def _holds_vocabulary(input_path) -> bool:
  if rwkv7.file_kind(input_path):
    return rwkv7.file_kind(input_path) == "preset"
  contents = _open(input_path)
  try:
    return contents.tokens is not None or contents.vocab is not None
  finally:
    contents.close()


def read_any(input_path: PathLike, *, corpus: Optional[PathLike] = None,
             vocab: Union[None, PathLike, Sequence[str]] = None
             ) -> model_file.ModelFile:
  """Reads any file `convert` reads (or an rnnstep model file) into memory.

  Args:
    input_path: an rnnstep `.npz` model file, or Keras or PyTorch weights (as
      for `convert`), or a char-rnn-tensorflow save directory (which holds
      its own vocabulary: no `corpus` or `vocab`).
    corpus: for weights: a UTF-8 text file; the vocabulary is
      `sorted(set(text))`.
    vocab: for weights, instead of `corpus`: a list of characters or the path
      of a vocabulary file (a JSON list of strings).

  Returns:
    What `model_file.read` returns: the validated ModelFile, float32 tensors.

  Raises:
    FileNotFoundError: the input does not exist.
    VocabularyRequired: weights without `corpus` or `vocab` (a ValueError).
    VocabularyNotAllowed: `corpus` or `vocab` for an rnnstep model file.
    ValueError: the input cannot be read or mapped, or the vocabulary does not
      fit the weights.
  """
  input_path = os.fspath(input_path)
  if is_model_file(input_path):
    if corpus is not None or vocab is not None:
      raise VocabularyNotAllowed(
          f"{input_path}: an rnnstep model file holds its own vocabulary; "
          "give no corpus or vocab for it")
    return model_file.read(input_path)
  if corpus is not None and vocab is not None:
    raise ValueError("give only one of corpus= (a text file) or vocab= (a "
                     "vocabulary file or list of characters)")
  if corpus is None and vocab is None and not _looks_like_weights(input_path):
    return model_file.read(input_path)  # Its errors say what is wrong.
  # Weights without a vocabulary: unless the file holds its own (a
  # char-rnn-tensorflow save directory, a Keras TextVectorization layer),
  # VocabularyRequired, once the model is mapped.
  return _contained(input_path, _read_any, input_path, corpus, vocab)


def _read_mapped(input_path: str, corpus, vocab):
  """Opens a weights file, maps its model, then reads and resolves the
  vocabulary (so that the model's errors come first), reads the tensors;
  returns `(mapped, characters given, vocab, tensors)`."""
  contents = _open(input_path)
  try:
    mapped = mapping.map_model(contents)
    if contents.tokens is not None:  # The file's own vocabulary of tokens.
      return _own_vocabulary(input_path, mapped, contents.tokens, corpus,
                             vocab)
    if contents.vocab is not None:  # The file's own characters.
      if corpus is not None or vocab is not None:
        raise ValueError(f"{input_path}: holds its own vocabulary "
                         f"({tf1_charrnn.VOCAB_FILE}); give no corpus or vocab "
                         "for it")
      chars, source, tokens = (contents.vocab,
                               f"{contents.label}'s {tf1_charrnn.VOCAB_FILE}",
                               None)
    elif corpus is None and vocab is None and textgenrnn.vocab_beside(
        input_path) and mapped.contents.attention is not None:
      vocab = textgenrnn.vocab_beside(input_path)  # Saved with the weights.
      chars, source, tokens = read_vocabulary(None, vocab)
    elif corpus is None and vocab is None:
      raise VocabularyRequired(
          f"{input_path}: weights files (Keras, PyTorch) hold no vocabulary; "
          "give the training text (corpus, or word_language_model's corpus "
          "folder) or a vocabulary file (vocab: a JSON list of the "
          "characters or words in id order, or a tokenizer file: "
          f"{convert_vocabulary.TOKENIZER_FILES})")
    else:
      chars, source, tokens = read_vocabulary(corpus, vocab)
    if tokens is not None:  # Words: exactly one embedding row each.
      if len(chars) != mapped.vocab_size:
        raise ValueError(
            f"vocabulary size mismatch: {source} gives {len(chars)} "
            f"{convert_vocabulary.unit(tokens)} but the model's embedding has "
            f"{mapped.vocab_size} rows")
      if mapped.config.window and convert_vocabulary.pads_windows(tokens):
        mapped.padding = "pre"
        mapped.notes.append(
            f"windows of {mapped.config.window} words shorter than that are "
            "filled at the front with id 0, as Keras's pad_sequences "
            "(padding='pre') fills the recipe's; recorded as padding='pre'")
      return mapped, chars, chars, mapped.read_tensors(), tokens
    full_vocab = resolve_vocab(chars, mapped.vocab_size, source)
    full_vocab = model_file.validate_vocab(full_vocab, source)
    return mapped, chars, full_vocab, mapped.read_tensors(), None
  finally:
    contents.close()


def _own_vocabulary(input_path, mapped, tokens, corpus, vocab):
  """`_read_mapped`'s result for a file that holds its vocabulary."""
  if corpus is not None or vocab is not None:
    raise ValueError(
        f"{input_path}: the file holds its own vocabulary (a Keras "
        f"TextVectorization layer's {len(tokens.vocab)} tokens); give no "
        "corpus or vocab")
  words = list(tokens.vocab)
  if len(words) != mapped.vocab_size:
    raise ValueError(
        f"vocabulary size mismatch: the TextVectorization layer holds "
        f"{len(words)} tokens but the model's embedding has "
        f"{mapped.vocab_size} rows")
  return mapped, words, words, mapped.read_tensors(), tokens


def _read_any(input_path: str, corpus, vocab) -> model_file.ModelFile:
  chat_template = chat_template_beside(input_path, vocab)
  if rwkv7.file_kind(input_path):
    read = rwkv7.read_model(input_path, corpus, vocab)
    return dataclasses.replace(read, chat_template=chat_template)
  mapped, _, full_vocab, tensors, tokens = _read_mapped(input_path, corpus,
                                                       vocab)
  tensors = model_file.validate(mapped.config, full_vocab, tensors, input_path)
  return model_file.ModelFile(mapped.config, full_vocab, tensors, tokens,
                              chat_template)


def chat_template_beside(input_path: str, vocab
                         ) -> Optional[model_file.ChatTemplateData]:
  """The chat template of a Hugging Face `tokenizer_config.json` that comes
  with the model: beside a vocabulary file given by path (a
  `tokenizer.json`'s folder holds it) or in the folder converted; None
  where there is none (another folder's is never taken).

  Raises:
    ValueError: naming the file: not JSON, or a template that does not
      compile (`chat_template.TemplateError`).
  """
  folders = []
  if isinstance(vocab, (str, os.PathLike)):
    folders.append(os.path.dirname(os.path.abspath(vocab)))
  if os.path.isdir(input_path):
    folders.append(input_path)
  for folder in folders:
    path = os.path.join(folder, chat_template_lib.TOKENIZER_CONFIG)
    if os.path.isfile(path):
      return chat_template_lib.read_tokenizer_config(path)
  return None


def _looks_like_weights(path: str) -> bool:
  """Whether `path` looks like a weights file `_open` reads (by its first
  bytes, member names or checkpoint files; nothing is parsed)."""
  if rwkv7.is_preset(path):
    return True
  if os.path.isdir(path):
    return keras_v3.is_unzipped_archive(path) or os.path.isfile(
        os.path.join(path, "checkpoint"))
  if not os.path.isfile(path):
    return os.path.isfile(path + ".index")
  if tf_checkpoint.is_checkpoint_file(path):
    return True
  kind = safe_io.sniff(path)
  if kind == "zip":
    try:
      with safe_io.open_zip(path) as archive:
        names = safe_io.member_names(archive)
    except ValueError:
      return False
    return torch_zip.is_torch_zip(names) or keras_v3.CONFIG_MEMBER in names
  if kind == "hdf5":
    return True
  with open(path, "rb") as f:
    head = f.read(64)
  return pytorch.reader_kind(path, head, os.path.getsize(path)) is not None


def read_vocabulary(corpus, vocab):
  """The characters (or words) `corpus=` or `vocab=` give, how messages name
  them, and their `vocabulary.Tokens` for words (None for characters).

  A corpus folder is word_language_model's (`read_corpus_folder`); a
  vocabulary list with multi-character entries is one of words
  (`vocabulary.word_tokens`); a Keras `Tokenizer.to_json()` file gives its
  words and rules (`vocabulary.keras_tokenizer`), a Hugging Face
  `tokenizer.json` a subword vocabulary (`vocabulary.subword_tokens`), and
  a `{"kind": ...}` object the model file's own form
  (`vocabulary.tokens_file`, e.g. `{"kind": "bytes"}`).

  Args:
    corpus: a text file or a word_language_model corpus folder, or None.
    vocab: instead: a vocabulary file's path, or a list.

  Returns:
    `(entries, source, tokens)`: the characters or words in id order, how
    messages name where they came from, and the words' `vocabulary.Tokens`
    (None for characters).

  Raises:
    FileNotFoundError / OSError: a file cannot be read.
    ValueError: not a usable vocabulary; the message says why.
  """
  if corpus is not None:
    if os.path.isdir(corpus):
      tokens = convert_vocabulary.read_corpus_folder(corpus)
      return (list(tokens.vocab), f"the corpus folder {os.fspath(corpus)}",
              tokens)
    return read_corpus_vocab(corpus), f"the corpus {os.fspath(corpus)}", None
  if isinstance(vocab, (str, os.PathLike)):
    source = f"the vocab file {os.fspath(vocab)}"
    data = convert_vocabulary.load_vocab_json(vocab)
    tokens = None
    if convert_vocabulary.is_keras_tokenizer(data):
      tokens = convert_vocabulary.keras_tokenizer(data, os.fspath(vocab))
    elif textgenrnn.is_vocab(data):
      tokens = textgenrnn.tokens(data, os.fspath(vocab))
    elif convert_vocabulary.is_hf_tokenizer(data):
      tokens = convert_vocabulary.subword_tokens(data, os.fspath(vocab))
    elif isinstance(data, dict) and "kind" in data:
      tokens = convert_vocabulary.tokens_file(data, os.fspath(vocab))
    if tokens is not None:
      return list(tokens.vocab), source, tokens
    if convert_vocabulary.is_word_list(data):
      tokens = convert_vocabulary.word_tokens(data, os.fspath(vocab))
      return list(tokens.vocab), source, tokens
    if isinstance(data, dict):  # No form above: say which forms are read.
      raise convert_vocabulary.unknown_object(data, os.fspath(vocab))
    return model_file.validate_vocab(data, os.fspath(vocab)), source, None
  if isinstance(vocab, dict) and textgenrnn.is_vocab(vocab):
    # textgenrnn's vocabulary in memory (`textgen.vocab`, its Tokenizer's
    # `word_index`): as its file.
    tokens = textgenrnn.tokens(vocab, "the vocab dict")
    return list(tokens.vocab), "the vocab dict", tokens
  if convert_vocabulary.is_word_list(list(vocab)):
    tokens = convert_vocabulary.word_tokens(list(vocab), "vocab")
    return list(tokens.vocab), "the vocab list", tokens
  return (model_file.validate_vocab(list(vocab), "vocab"), "the vocab list",
          None)


def _convert(input_path: str, output_path: str, corpus, vocab,
             weights_dtype) -> Summary:
  chat_template = chat_template_beside(input_path, vocab)
  note = [] if chat_template is None else [
      "the chat template of the tokenizer_config.json beside it is kept"]
  if rwkv7.file_kind(input_path):
    read = rwkv7.read_model(input_path, corpus, vocab)
    model_file.write(output_path, read.config, read.vocab, read.tensors,
                     read.tokens, chat_template=chat_template,
                     weights_dtype=weights_dtype)
    summary = rwkv7.summary(input_path, read)
    summary.vocab, summary.tokens = read.vocab, read.tokens
    summary.output_path = output_path
    summary.weights_dtype = weights_dtype
    summary.notes += note
    return summary
  mapped, chars, full_vocab, tensors, tokens = _read_mapped(input_path, corpus,
                                                           vocab)
  model_file.write(output_path, mapped.config, full_vocab, tensors, tokens,
                   chat_template=chat_template, weights_dtype=weights_dtype)
  summary = _summary(input_path, mapped)
  summary.weights_dtype = weights_dtype
  summary.notes += note
  summary.vocab = full_vocab
  summary.tokens = tokens
  summary.output_path = output_path
  if tokens is None and summary.has_unk and chars[0] != model_file.UNK_TOKEN:
    summary.notes.append("the embedding has one row more than the characters: "
                         "id 0 is [UNK] (never generated)")
  return summary


# ------------------------------------------------------------------- internals


def _contained(input_path: PathLike, fn, *args):
  """Runs a reader of a zip/HDF5 input in a child process (see `isolation`).

  TF checkpoints are read in-process: `tf.train.load_checkpoint` needs the TF
  runtime, which must not be used in a forked child.
  """
  path = os.fspath(input_path)
  if (not isolation.available() or os.path.isdir(path)
      or not os.path.isfile(path) or tf_checkpoint.is_checkpoint_file(path)):
    return fn(*args)
  return isolation.run(path, fn, *args)


def _open(input_path: PathLike) -> Contents:
  """Finds the format of `input_path` and lists what it holds."""
  path = os.fspath(input_path)
  if not path:
    raise FileNotFoundError("no input path given")
  if tf1_charrnn.find_save_dir(path) is not None:
    return tf1_charrnn.read(path)
  if os.path.isdir(path):
    if keras_v3.is_unzipped_archive(path):
      return keras_v3.read_directory(path)
    return tf_checkpoint.read(path)
  if not os.path.exists(path):
    if os.path.isfile(path + ".index"):
      return tf_checkpoint.read(path)
    raise FileNotFoundError(f"{path}: no such file, directory or checkpoint "
                            "prefix")
  if tf_checkpoint.is_checkpoint_file(path):
    return tf_checkpoint.read(path)
  kind = safe_io.sniff(path)
  if kind == "zip":
    with safe_io.open_zip(path) as archive:
      names = safe_io.member_names(archive)
    if torch_zip.is_torch_zip(names) and keras_v3.CONFIG_MEMBER not in names:
      return pytorch.read(path, "zip")
    if "format_version.npy" in names:
      raise ValueError(f"{path}: an rnnstep model file, not weights to convert "
                       "(load it with rnnstep.load or --model)")
    return keras_v3.read_archive(path)
  if kind == "hdf5":
    h5 = safe_io.H5File(path, path)
    try:
      if keras_v2_h5.is_keras2_layout(h5):
        contents = keras_v2_h5.read(h5)
        contents.closers.append(h5.close)
        if textgenrnn.is_textgenrnn(contents):  # By its layers' names.
          contents.attention = textgenrnn.attention_kernel(contents, path)
          contents.chain = textgenrnn.chain(contents, path)
          contents.format = f"textgenrnn weights ({contents.format})"
        return contents
      return keras_v3.read_weights_file(h5)
    except BaseException:
      h5.close()
      raise
  size = os.path.getsize(path)
  if size == 0:
    raise ValueError(f"{path}: the file is empty")
  with open(path, "rb") as f:
    head = f.read(64)
  torch_kind = pytorch.reader_kind(path, head, size)
  if torch_kind is not None:
    return pytorch.read(path, torch_kind)
  if torch_legacy.is_tar(path):
    raise ValueError(f"{path}: a torch.save file in the old tar format (torch "
                     "0.1), which rnnstep does not read; re-save its state "
                     "dict with a current torch")
  if head[:1] == b"\x80":
    raise ValueError(f"{path}: a Python pickle that is not a torch.save file; "
                     "rnnstep does not unpickle arbitrary files (save the "
                     "model with torch.save(model, PATH) or "
                     "torch.save(model.state_dict(), PATH))")
  raise ValueError(f"{path}: not a Keras weights file nor a PyTorch one (neither "
                   "a .keras zip archive, an HDF5 file, a TF checkpoint, a "
                   "torch.save file nor .safetensors)")


def _summary(input_path, mapped: mapping.MappedModel) -> Summary:
  config = mapped.config
  layers = []
  vocab, dim = mapped.embedding.tensors["embeddings"].shape
  layers.append(LayerSummary("embedding", mapped.embedding.name,
                             mapped.embedding.shapes,
                             f"vocab {vocab} x dim {dim}"))
  for item in mapped.recurrent:
    detail = f"units={item.layer.units}"
    if item.layer.bidirectional:
      detail += ", bidirectional (forward and backward copies)"
    if kinds.KINDS[item.kind].has_reset_after:
      detail += f", reset_after={item.layer.reset_after}"
    if "bias" not in item.tensors:
      detail += ", use_bias=False (zero bias written)"
    layers.append(LayerSummary(item.kind, item.name, item.shapes, detail))
  for item in mapped.head:
    rows, cols = item.tensors["kernel"].shape
    layers.append(LayerSummary("dense", item.name, item.shapes,
                               f"{rows} -> {cols}, {item.activation}"))
  rows, cols = mapped.dense.tensors["kernel"].shape
  detail = f"{rows} -> {cols}"
  if "bias" not in mapped.dense.tensors:
    detail += ", use_bias=False (zero bias written)"
  layers.append(LayerSummary("dense", mapped.dense.name, mapped.dense.shapes,
                             detail))
  params = sum(int(np.prod(shape)) for shape in
               config.expected_shapes(mapped.vocab_size).values())
  return Summary(input_path=os.fspath(input_path),
                 format=mapped.contents.format, layers=layers, config=config,
                 vocab_size=mapped.vocab_size, embedding_dim=int(dim),
                 num_parameters=params, notes=list(mapped.notes))
