"""textgenrnn's files (minimaxir/textgenrnn), read as data.

textgenrnn (`textgenrnn/model.py`) builds, for `cfg` from its config:

    Input(max_length) -> Embedding(num_classes, dim_embeddings) 'embedding'
      -> LSTM(rnn_size, return_sequences) 'rnn_1' ... 'rnn_<rnn_layers>'
         (each wrapped in Bidirectional where `rnn_bidirectional`)
      -> concatenate([embedded, rnn_1, ..., rnn_n]) 'rnn_concat'
      -> AttentionWeightedAverage 'attention' -> Dense(num_classes, softmax)
         'output'

and saves it with `model.save_weights` (`<name>_weights.hdf5`, a Keras 2
HDF5 file without a model config; the bundled `textgenrnn_weights.hdf5` is
one), beside `<name>_vocab.json` (its Tokenizer's `word_index`: `{char:
index}`, indices from 1, the meta token `<s>` among them; index 0 is the
padding) and `<name>_config.json` (the `cfg`). Such a file is recognised by
its layer names (`is_textgenrnn`); the recurrent layers' kinds and widths
come from their stored shapes, the window from the config's `max_length`
(textgenrnn's default, 40, where no config is beside the weights), and the
attention's W from the `attention` group. The model file records it as
`"attention": true` (`rnnstep.model.head.attention_weighted_average` is
the layer's math), with windows padded at the front with id 0 as textgenrnn's
`textgenrnn_encode_sequence` pads them (`pad_sequences`, padding 'pre').

The vocabulary (`tokens`): a words vocabulary of textgenrnn's characters,
`[UNK]` at id 0 (its padding, never generated: its sampler skips it too),
`char_level` (each character a token, joined without spaces), `start:
"<s>"` (every text starts with the meta token, which adds no text) and
`oov: "[UNK]"` (an unknown character is id 0, as `vocab.get(x, 0)` makes
it).

A word-level model (`word_level=True` in the config; without one, a
vocabulary with a word longer than one character besides `<s>`) has the
same layers; its vocabulary is words under the `recipe: "textgenrnn"` rule
(`vocabulary.textgenrnn_words`: its prefix split; `TextgenrnnText`: its
joined, re-spaced text) instead of `char_level`.
"""

import json
import os
import re
from typing import List, Optional

from rnnstep.convert import safe_io
from rnnstep.convert.contents import ConfigChain
from rnnstep.convert.contents import Contents
from rnnstep.convert.contents import LayerSpec
from rnnstep.convert.safe_io import show
from rnnstep.model import model_file
from rnnstep.model import vocabulary as vocabulary_lib

META_TOKEN = "<s>"
DEFAULT_WINDOW = 40  # textgenrnn.config["max_length"].
ATTENTION = "attention"
# The layers that hold no weights, and a context model's extra ones (its
# `context_output` is a second head that generation does not use).
_WEIGHTLESS = ("input", "dropout", "rnn_concat", "context_input",
               "context_reshape", "concat")
_CONTEXT_OUTPUT = "context_output"
_RNN = re.compile(r"rnn_(\d+)$")
MAX_CONFIG_BYTES = 1 << 16


def is_textgenrnn(contents: Contents) -> bool:
  """Whether a weights-only file has textgenrnn's layers, by their names."""
  if contents.chain is not None:
    return False
  names = {group.name for group in contents.groups}
  return {"embedding", "rnn_1", ATTENTION, "output"} <= names


def chain(contents: Contents, path: str) -> ConfigChain:
  """The chain textgenrnn's code builds, for its weights file at `path`.

  Returns:
    A ConfigChain (window, attention) over the groups `embedding`, `rnn_k`
    in order and `output`; the `attention` group and a context model's
    `context_output` are taken out of `contents.groups`.

  Raises:
    ValueError: a layer textgenrnn does not make, a gap in `rnn_k`, or an
      unreadable config; one line.
  """
  label = contents.label
  groups = {group.name: group for group in contents.groups}
  notes = []
  layers = []
  for name, group in groups.items():
    match = _RNN.match(name)
    if match:
      layers.append((int(match.group(1)), group))
    elif name not in ("embedding", ATTENTION, "output", _CONTEXT_OUTPUT,
                      *_WEIGHTLESS) and group.tensors:
      raise safe_io.fail(label, f"a textgenrnn weights file (its layers "
                         f"embedding, rnn_k, attention, output) with a layer "
                         f"{show(name)} textgenrnn does not make")
  layers.sort()
  if [k for k, _ in layers] != list(range(1, len(layers) + 1)):
    raise safe_io.fail(label, "a textgenrnn weights file whose rnn_k layers "
                       f"are not rnn_1..rnn_{len(layers)}")
  if _CONTEXT_OUTPUT in groups:
    notes.append("textgenrnn context model: its context_output is not used "
                 "to generate (textgenrnn generates from 'output')")
  window = _window(path, label, notes)
  specs = [LayerSpec("embedding", "embedding", "embedding", units=_width(
      groups["embedding"], 1, label), input_dim=_width(groups["embedding"],
                                                       0, label))]
  for _, group in layers:
    recurrent = [t for t in group.tensors
                 if t.role == "recurrent_kernel"]
    if not recurrent:
      raise safe_io.fail(label, f"textgenrnn layer {show(group.name)} has no "
                         "recurrent_kernel")
    bidirectional = any("backward_" in t.path for t in group.tensors)
    units = int(recurrent[0].shape[0])
    specs.append(LayerSpec("lstm", group.name, group.name, units=units,
                           bidirectional=bidirectional))
  output = groups["output"]
  specs.append(LayerSpec("dense", "output", "output",
                         units=_width(output, 1, label)))
  contents.groups = [g for g in contents.groups
                     if g.name not in (ATTENTION, _CONTEXT_OUTPUT)]
  notes.append(f"textgenrnn: attention over the embedding and {len(layers)} "
               f"LSTM layer(s), windows of {window} padded at the front")
  return ConfigChain("textgenrnn", specs, notes, window=window)


def attention_kernel(contents: Contents, label):
  """The `attention` group's one tensor, W `[channels, 1]`."""
  group = next((g for g in contents.groups if g.name == ATTENTION), None)
  if group is None or len(group.tensors) != 1 or (
      len(group.tensors[0].shape) != 2 or group.tensors[0].shape[1] != 1):
    found = group.describe() if group is not None else "nothing"
    raise safe_io.fail(label, f"textgenrnn's attention layer must hold one W "
                       f"[channels, 1], found {found}")
  return group.tensors[0]


def _width(group, axis, label) -> int:
  shapes = [t.shape for t in group.tensors if len(t.shape) == 2]
  if not shapes:
    raise safe_io.fail(label, f"textgenrnn layer {group.describe()} holds no "
                       "matrix")
  return int(shapes[0][axis])


def _window(path: str, label, notes) -> int:
  """`max_length` from the `*_config.json` beside the weights, else 40."""
  directory = os.path.dirname(os.path.abspath(path))
  stem = os.path.basename(path)
  stem = stem[:-len("_weights.hdf5")] if stem.endswith("_weights.hdf5") else ""
  config = os.path.join(directory, f"{stem}_config.json")
  if not stem or not os.path.isfile(config):
    notes.append(f"no {stem or '<name>'}_config.json beside the weights: "
                 f"windows of {DEFAULT_WINDOW} (textgenrnn's default "
                 "max_length)")
    return DEFAULT_WINDOW
  data = _read_config(config)
  window = data.get("max_length") if data is not None else None
  if not isinstance(window, int) or isinstance(window, bool) or not (
      0 < window <= model_file.MAX_WINDOW):
    raise safe_io.fail(config, "not a textgenrnn config with a max_length")
  notes.append(f"max_length {window} from {config}"
               + (", word-level" if data.get("word_level") else ""))
  return window


def _read_config(config: str) -> Optional[dict]:
  """The JSON object in a textgenrnn `*_config.json`, read as data and at
  most `MAX_CONFIG_BYTES`; None where the file is larger, not JSON, or not an
  object."""
  with open(config, "rb") as f:
    text = f.read(MAX_CONFIG_BYTES + 1)
  if len(text) > MAX_CONFIG_BYTES:
    return None
  try:
    data = json.loads(text.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
    return None
  return data if isinstance(data, dict) else None


def is_vocab(data) -> bool:
  """Whether decoded JSON is textgenrnn's `{char: index}` vocabulary."""
  return (isinstance(data, dict) and META_TOKEN in data
          and all(isinstance(v, int) for v in data.values()))


def tokens(data, source: str) -> vocabulary_lib.Tokens:
  """textgenrnn's vocabulary as tokens (see the module docstring).

  Word-level (`word_level=True`) where the `<name>_config.json` beside a
  `<name>_vocab.json` says so, else where a token besides `<s>` is longer
  than one character (a character vocabulary has none).

  Raises:
    ValueError: indices that are not 1..N, an empty word or one with a
      space (textgenrnn's Tokenizer makes neither); one line.
  """
  by_index = {index: token for token, index in data.items()}
  if sorted(by_index) != list(range(1, len(data) + 1)):
    raise ValueError(f"{source}: textgenrnn's vocabulary does not number its "
                     f"tokens 1..{len(data)}")
  words = [by_index[i] for i in range(1, len(data) + 1)]
  word_level = _word_level_beside(source)
  if word_level is None:
    word_level = any(len(w) != 1 and w != META_TOKEN for w in words)
  if word_level:
    odd = [w for w in words if not w or " " in w]
    if odd:
      raise ValueError(f"{source}: a word-level textgenrnn vocabulary with the "
                       f"word {odd[0]!r}, which its Tokenizer (split on "
                       "spaces) cannot make")
  vocab = model_file.validate_vocab([model_file.UNK_TOKEN] + words, source,
                                    tokens=True)
  rules = ({"recipe": "textgenrnn"} if word_level else {"char_level": True})
  return vocabulary_lib.Tokens(
      "words", vocab, dict(rules, start=META_TOKEN, oov=model_file.UNK_TOKEN),
      source)


def _word_level_beside(source: str) -> Optional[bool]:
  """`word_level` from the `<name>_config.json` beside `<name>_vocab.json`
  (None where there is none, or it does not say)."""
  base = os.path.basename(source)
  if not base.endswith("_vocab.json"):
    return None
  config = os.path.join(os.path.dirname(os.path.abspath(source)),
                        base[:-len("_vocab.json")] + "_config.json")
  if not os.path.isfile(config):
    return None
  data = _read_config(config)
  if data is None:
    raise ValueError(f"{config}: not a textgenrnn config (a JSON object)")
  level = data.get("word_level")
  return level if isinstance(level, bool) else None


def vocab_beside(path: str) -> Optional[str]:
  """The `<name>_vocab.json` textgenrnn saved beside `<name>_weights.hdf5`."""
  base = os.path.basename(path)
  if not base.endswith("_weights.hdf5"):
    return None
  found = os.path.join(os.path.dirname(os.path.abspath(path)),
                       base[:-len("_weights.hdf5")] + "_vocab.json")
  return found if os.path.isfile(found) else None


__all__: List[str] = ["is_textgenrnn", "chain", "attention_kernel",
                      "is_vocab", "tokens", "vocab_beside", "META_TOKEN"]
