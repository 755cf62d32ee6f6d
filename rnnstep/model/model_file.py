"""The rnnstep model file: a plain `.npz` archive of raw tensors.

This module is the only place that knows the file's keys. A file holds:

  format_version   int64 scalar: 1 for a character model (every file before
                   token vocabularies, still written for one), 2 for any other
  config           str scalar: JSON `{"embedding_dim": D, "layers": [LAYER, ...]}`
                   where LAYER is `{"kind": "gru", "units": U, "reset_after": bool}`,
                   `{"kind": "lstm", "units": U}`, `{"kind": "simple_rnn", "units": U}`
                   or `{"kind": "simple_rnn_relu", "units": U}` (`kinds.KINDS`),
                   or an RWKV-7 stack, the one layer, `{"kind": "rwkv7",
                   "units": C, "blocks": L, "head_size": N, "ffn": F,
                   "decay_lora": .., "a_lora": .., "v_lora": ..,
                   "gate_lora": ..}` (its tensors: `kinds.rwkv7_shapes`);
                   optionally `"window": T` (a positive int): the model was built
                   for fixed windows of T characters from a zero state (a fixed T
                   in its Input, return_sequences=False on its last recurrent
                   layer); absent for models stepped statefully.
                   A LAYER may add `"bidirectional": true` (Keras Bidirectional,
                   merge_mode "concat": a backward copy of the layer reads the
                   window from its end; its output is [forward | backward], 2U
                   wide). `"head": [{"units": N, "activation": A}, ...]`: Dense
                   layers between the recurrent stack and the output Dense
                   (A in `DENSE_ACTIVATIONS`). `"padding": "pre"` (with a
                   window): a window shorter than T is filled at the front with
                   id 0, which the Embedding embeds (Keras `pad_sequences`).
                   `"attention": true` (with a window): textgenrnn's
                   AttentionWeightedAverage reads `concat([embedded, every
                   layer's output sequence])` over the window, and its
                   weighted average (not the last layer's last output) feeds
                   the head or the output Dense.
                   A model with a bidirectional layer, pre-padding or
                   attention is recomputed over its whole window at each
                   token (`recomputes`)
  vocab            str scalar: JSON list of the characters in id order; id 0 may be
                   "[UNK]" (never sampled); in version 2, the token strings
  tokens           version 2 only: str scalar, JSON `{"kind": K, rules...}`,
                   the vocabulary's kind and rules (`vocabulary.Tokens`)
  chat_template    optional: str scalar, JSON `{"template": JINJA,
                   "bos_token": S, "eos_token": S}`, the chat template the
                   converter found with the model (a Hugging Face
                   `tokenizer_config.json`'s; `ChatTemplateData`)
  embedding        float32 [V, D]
  layer{i}_kernel            float32 [D_i, G*U_i]   (D_0 = D, D_i = U_{i-1})
  layer{i}_recurrent_kernel  float32 [U_i, G*U_i]
  layer{i}_bias              float32: GRU reset_after [2, 3U]; GRU [3U]; LSTM [4U];
                             SimpleRNN [U]
  layer{i}_backward_{name}   a bidirectional layer's backward copy, as the
                             forward tensors (D_i is the layer below's output
                             width: 2U for a bidirectional layer)
  attention_kernel float32 [D + the layers' output widths, 1]: with attention
  head{j}_kernel   float32 [N_{j-1}, N_j] (N_{-1} = the last layer's output
                   width; with attention, the attention_kernel's rows)
  head{j}_bias     float32 [N_j]
  dense_kernel     float32 [N_last or the last layer's output width, V]
  dense_bias       float32 [V]
  weights_dtype    optional str scalar: "float16", "bfloat16" or "int8" when the
                   large matrices (`ModelConfig.reduced_keys`) are stored in
                   fewer bits (`reduced_weights`): float16 as float16, bfloat16
                   as its uint16 bits, int8 as the int8 values with their
                   float32 scales in `<key>__scale` (per output column,
                   `[..., 1, out]`; the embedding's per row, `[V, 1]`). Absent:
                   float32, and the file is the bytes it was before weights
                   dtypes.

G is 3 for GRU (gate columns [z | r | h]), 4 for LSTM ([i | f | c | o]) and 1 for
SimpleRNN: the Keras layouts, unchanged. Files are read with `allow_pickle=False`
and every member's declared size is checked against its stored size before it is
read, so a hostile file can neither run code nor make us allocate what it does not
hold. Writes are atomic: a failed write leaves no file behind.
"""

import dataclasses
import io
import json
import os
import zipfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from rnnstep.model import kinds
from rnnstep.model import reduced_weights
from rnnstep.model import vocabulary as vocabulary_lib
from rnnstep import staging

FORMAT_VERSION = 1  # A character model's: its files stay byte for byte as they were.
TOKENS_FORMAT_VERSION = 2  # Any other vocabulary's: it adds the `tokens` member.
UNK_TOKEN = "[UNK]"
# The member naming a reduced weights dtype, and the suffix of an int8
# tensor's scales (the module docstring).
WEIGHTS_DTYPE = "weights_dtype"
SCALE_SUFFIX = "__scale"

# Gate blocks per recurrent kind (the kernel has GATES * units columns); the
# kinds and their facts are described in `kinds.KINDS`.
GATES = {name: kind.gates for name, kind in kinds.KINDS.items()}

# Upper bounds that no real char model reaches; they stop absurd configs early.
MAX_UNITS = 1 << 16
MAX_VOCAB = 1 << 20
MAX_LAYERS = 64
MAX_WINDOW = 1 << 16
MAX_MEMBER_BYTES = 8 << 30
MAX_TEXT_BYTES = 64 << 20
MAX_HEAD = 16

# The activations a head Dense layer may have: Keras's names, each computed
# as TensorFlow's op of that name (`head.ACTIVATIONS`), which is how
# Keras computes it. Keras 2 and 3 compute `hard_sigmoid` differently, so it
# is not here.
DENSE_ACTIVATIONS = ("linear", "relu", "relu6", "sigmoid", "tanh", "softplus",
                     "softsign", "elu", "selu", "exponential", "swish",
                     "silu", "gelu", "mish", "leaky_relu", "softmax")
# How a window shorter than its model's T is filled: only as `pad_sequences`
# fills it by default, at the front with id 0.
PADDINGS = ("pre",)


@dataclasses.dataclass(frozen=True)
class LayerConfig:
  """One recurrent layer: its kind ('gru', 'lstm', 'simple_rnn',
  'simple_rnn_relu'), width and variant."""
  kind: str
  units: int
  reset_after: bool = True  # GRU only.
  # Keras Bidirectional (merge_mode "concat"): a backward copy of the layer.
  bidirectional: bool = False
  # The kind's other sizes (`kinds.Kind.size_names`) as (name, value) pairs
  # in that order: RWKV-7's blocks, head size, feed-forward and LoRA widths.
  sizes: Tuple[Tuple[str, int], ...] = ()

  def to_json(self) -> dict:
    out = {"kind": self.kind, "units": self.units}
    if kinds.get(self.kind).has_reset_after:
      out["reset_after"] = self.reset_after
    if self.bidirectional:
      out["bidirectional"] = True
    out.update(self.sizes)
    return out

  @property
  def size(self) -> Dict[str, int]:
    """`sizes` as a dict."""
    return dict(self.sizes)

  @property
  def outputs(self) -> int:
    """The width of the layer's output: U, or 2U bidirectional."""
    return self.units * (2 if self.bidirectional else 1)

  def bias_shape(self) -> Tuple[int, ...]:
    return kinds.get(self.kind).bias_shape(self.units, self.reset_after)

  def tensor_shapes(self, inputs: int) -> Dict[str, Tuple[int, ...]]:
    """The layer's tensors and their shapes, as its kind declares them (and
    the backward copy's, `backward_<name>`, for a bidirectional layer)."""
    shapes = kinds.get(self.kind).tensor_shapes(inputs, self.units,
                                                self.reset_after, self.size)
    if self.bidirectional:
      shapes.update({f"{BACKWARD}{name}": shape
                     for name, shape in list(shapes.items())})
    return shapes


# The prefix of a bidirectional layer's backward tensors' names.
BACKWARD = "backward_"


@dataclasses.dataclass(frozen=True)
class HeadLayer:
  """A Dense layer between the recurrent stack and the output Dense."""
  units: int
  activation: str

  def to_json(self) -> dict:
    return {"units": self.units, "activation": self.activation}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The architecture: Embedding(V, D) -> recurrent layers -> Dense(V).

  Attributes:
    embedding_dim: D.
    layers: the recurrent layers, in order.
    window: T for a model built for fixed windows of T characters from a zero
      state (see the module docstring), else None.
  """
  embedding_dim: int
  layers: Tuple[LayerConfig, ...]
  window: Optional[int] = None
  head: Tuple[HeadLayer, ...] = ()
  padding: Optional[str] = None
  attention: bool = False

  def to_json(self) -> str:
    out = {"embedding_dim": self.embedding_dim,
           "layers": [layer.to_json() for layer in self.layers]}
    if self.window is not None:
      out["window"] = self.window
    if self.head:
      out["head"] = [layer.to_json() for layer in self.head]
    if self.padding is not None:
      out["padding"] = self.padding
    if self.attention:
      out["attention"] = True
    return json.dumps(out)

  @property
  def recomputes(self) -> bool:
    """Whether the model is run over its whole window at each token.

    A backward layer reads the window from its end, and a pre-padded window
    is a different input from fewer steps: neither can be stepped (or kept
    in `engine/window.py`'s slots), so each token reruns the window
    (`engine/recompute.py`).
    """
    return self.padding is not None or self.attention or any(
        layer.bidirectional for layer in self.layers)

  def expected_shapes(self, vocab_size: int) -> Dict[str, Tuple[int, ...]]:
    """Returns the shape every tensor key must have for this config."""
    shapes = {"embedding": (vocab_size, self.embedding_dim)}
    inputs = self.embedding_dim
    for i, layer in enumerate(self.layers):
      for name, shape in layer.tensor_shapes(inputs).items():
        shapes[f"layer{i}_{name}"] = shape
      inputs = layer.outputs
    if self.attention:  # Over the embedding and every layer's outputs.
      inputs = self.embedding_dim + sum(layer.outputs for layer in self.layers)
      shapes["attention_kernel"] = (inputs, 1)
    for j, layer in enumerate(self.head):
      shapes[f"head{j}_kernel"] = (inputs, layer.units)
      shapes[f"head{j}_bias"] = (layer.units,)
      inputs = layer.units
    shapes["dense_kernel"] = (inputs, vocab_size)
    shapes["dense_bias"] = (vocab_size,)
    return shapes

  def reduced_keys(self) -> Dict[str, int]:
    """The large matrices a weights dtype stores in fewer bits, each with
    the axis its int8 scale is shared along: the embedding's columns (a
    scale per row: it is gathered), a matrix's input rows (a scale per
    output column)."""
    keys = {"embedding": -1}
    for i, layer in enumerate(self.layers):
      for name in kinds.get(layer.kind).reduced_tensors:
        keys[f"layer{i}_{name}"] = -2
        if layer.bidirectional:
          keys[f"layer{i}_{BACKWARD}{name}"] = -2
    for j in range(len(self.head)):
      keys[f"head{j}_kernel"] = -2
    keys["dense_kernel"] = -2
    return keys


def reduce_tensors(config: ModelConfig, tensors: Mapping[str, np.ndarray],
                   weights_dtype: str) -> Dict[str, np.ndarray]:
  """The float32 weights of a model of `weights_dtype`: its reduced keys
  rounded (`reduced_weights.reduce`), the rest as given.

  Raises:
    ValueError: a bad weights dtype, or float16 and a value beyond its range.
  """
  if weights_dtype not in reduced_weights.WEIGHTS_DTYPES:
    raise ValueError(reduced_weights.choices_message(weights_dtype))
  out = dict(tensors)
  if weights_dtype != reduced_weights.FLOAT32:
    for key, axis in config.reduced_keys().items():
      out[key] = reduced_weights.reduce(tensors[key], weights_dtype, axis, key)
  return out


# The largest chat template a model file holds.
MAX_CHAT_TEMPLATE_CHARS = 1 << 20


@dataclasses.dataclass(frozen=True)
class ChatTemplateData:
  """A chat template found with the model: its Jinja text and the special
  tokens it may write (`rnnstep.model.chat_template` renders it)."""
  template: str
  bos_token: str = ""
  eos_token: str = ""

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), ensure_ascii=False)

  @classmethod
  def from_json(cls, data, path=None) -> "ChatTemplateData":
    """Checks a file's `chat_template` member (its parsed JSON).

    Raises:
      ValueError: naming the file: not an object of strings, or too long.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(data, dict) or "template" not in data or set(
        data) - fields or not all(isinstance(v, str) for v in data.values()):
      raise _fail(path, "chat_template must be an object of strings with a "
                  "template (and bos_token, eos_token)")
    if len(data["template"]) > MAX_CHAT_TEMPLATE_CHARS:
      raise _fail(path, f"chat_template is over {MAX_CHAT_TEMPLATE_CHARS} "
                  "characters")
    return cls(**data)


@dataclasses.dataclass
class ModelFile:
  """What a model file holds, validated: config, vocabulary and float32 tensors
  (a reduced weights dtype's decoded).

  `tokens` is the vocabulary's kind and rules (`vocabulary.Tokens`); None
  for a character model. `chat_template` is the chat template found with
  the model, or None.
  """
  config: ModelConfig
  vocab: List[str]
  tensors: Dict[str, np.ndarray]
  tokens: Optional[vocabulary_lib.Tokens] = None
  chat_template: Optional[ChatTemplateData] = None
  # The file's weights dtype; `tensors` are its weights decoded to float32.
  weights_dtype: str = reduced_weights.FLOAT32


def _fail(path, problem: str, advice: str = "") -> ValueError:
  where = f"{path}: " if path else ""
  return ValueError(f"{where}{problem}{'; ' + advice if advice else ''}")


def parse_config(data, path=None) -> ModelConfig:
  """Builds a ModelConfig from decoded JSON, accepting only known keys and values.

  Args:
    data: the decoded JSON object.
    path: the file it came from, for error messages.

  Returns:
    The ModelConfig.

  Raises:
    ValueError: naming the field that is missing or out of range.
  """
  if not isinstance(data, dict):
    raise _fail(path, "config is not a JSON object")
  dim = data.get("embedding_dim")
  if not _is_size(dim, MAX_UNITS):
    raise _fail(path, f"config embedding_dim must be a positive integer, got {dim!r}")
  layers_json = data.get("layers")
  if (not isinstance(layers_json, list) or not layers_json
      or len(layers_json) > MAX_LAYERS):
    raise _fail(path, f"config layers must be a list of 1 to {MAX_LAYERS} layers")
  layers = []
  for i, entry in enumerate(layers_json):
    if not isinstance(entry, dict):
      raise _fail(path, f"config layer {i} is not a JSON object")
    kind = entry.get("kind")
    if kind not in GATES:
      raise _fail(path, f"config layer {i} has unknown kind {kind!r}",
                  f"known kinds: {sorted(GATES)}")
    units = entry.get("units")
    if not _is_size(units, MAX_UNITS):
      raise _fail(path, f"config layer {i} units must be a positive integer, "
                  f"got {units!r}")
    reset_after = entry.get("reset_after", True)
    if not isinstance(reset_after, bool):
      raise _fail(path, f"config layer {i} reset_after must be true or false")
    bidirectional = entry.get("bidirectional", False)
    if not isinstance(bidirectional, bool):
      raise _fail(path, f"config layer {i} bidirectional must be true or "
                  "false")
    sizes = _layer_sizes(entry, kind, units, i, path)
    if sizes and (i or units != dim or len(layers_json) > 1):
      raise _fail(path, f"config layer {i}: a {kinds.get(kind).display} "
                  "layer is the whole stack, alone, as wide as the embedding")
    layers.append(LayerConfig(kind, units, reset_after, bidirectional, sizes))
  window = data.get("window")
  if window is not None and not _is_size(window, MAX_WINDOW):
    raise _fail(path, f"config window must be a positive integer up to "
                f"{MAX_WINDOW}, got {window!r}")
  head_json = data.get("head", [])
  if not isinstance(head_json, list) or len(head_json) > MAX_HEAD:
    raise _fail(path, f"config head must be a list of at most {MAX_HEAD} "
                "Dense layers")
  head = []
  for j, entry in enumerate(head_json):
    units = entry.get("units") if isinstance(entry, dict) else None
    activation = entry.get("activation") if isinstance(entry, dict) else None
    if not _is_size(units, MAX_VOCAB) or activation not in DENSE_ACTIVATIONS:
      raise _fail(path, f"config head layer {j} must be {{\"units\": N, "
                  f"\"activation\": A}} with A one of {DENSE_ACTIVATIONS}, "
                  f"got {entry!r}"[:300])
    head.append(HeadLayer(units, activation))
  padding = data.get("padding")
  if padding is not None and (padding not in PADDINGS or window is None):
    raise _fail(path, f"config padding must be one of {PADDINGS}, with a "
                f"window, got {padding!r}"[:200])
  if window is None and any(layer.bidirectional for layer in layers):
    raise _fail(path, "config has a bidirectional layer but no window: a "
                "bidirectional model reads a fixed window")
  attention = data.get("attention", False)
  if not isinstance(attention, bool) or (attention and window is None):
    raise _fail(path, f"config attention must be true or false, true only "
                f"with a window, got {attention!r}"[:200])
  return ModelConfig(dim, tuple(layers), window, tuple(head), padding,
                     attention)


def _layer_sizes(entry: dict, kind: str, units: int, i: int, path
                 ) -> Tuple[Tuple[str, int], ...]:
  """A layer entry's sizes its kind declares (`kinds.Kind.size_names`)."""
  sizes = []
  for name in kinds.get(kind).size_names:
    value = entry.get(name)
    if not _is_size(value, MAX_UNITS):
      raise _fail(path, f"config layer {i} {name} must be a positive "
                  f"integer, got {value!r}"[:200])
    sizes.append((name, value))
  head_size = dict(sizes).get("head_size")
  if head_size is not None and units % head_size:
    raise _fail(path, f"config layer {i} units ({units}) must be a multiple "
                f"of its head_size ({head_size})")
  return tuple(sizes)


def _is_size(value, limit) -> bool:
  return (isinstance(value, int) and not isinstance(value, bool)
          and 0 < value <= limit)


def validate_vocab(vocab, path=None, tokens: bool = False) -> List[str]:
  """Checks a vocabulary: distinct single characters, optional "[UNK]" at id 0.

  Args:
    vocab: the decoded JSON.
    path: the file it came from, for messages.
    tokens: a token vocabulary (format 2): distinct strings of any length.

  Returns:
    The vocabulary as a list.

  Raises:
    ValueError: naming the offending entry.
  """
  if tokens:
    return _validate_tokens(vocab, path)
  if isinstance(vocab, dict):  # textgenrnn's vocab file: {token: index}.
    tokens = [t for t in vocab if not isinstance(t, str) or len(t) != 1]
    found = (f" with multi-character tokens such as {tokens[0]!r}" if tokens
             else "")
    raise _fail(path, f"vocab is a JSON object {{token: index}}{found}, not a "
                "list; rnnstep's vocabularies are characters",
                "give a JSON list of single characters in id order")
  _check_string_list(vocab, path, "characters")
  for i, token in enumerate(vocab):
    if token == UNK_TOKEN and i == 0:
      continue
    if len(token) != 1:
      what = (f"a token of {len(token)} characters" if token
              else "an empty string")
      raise _fail(path, f"vocab entry {i} is {token!r}, {what}; rnnstep's "
                  "vocabularies are characters (one per id)",
                  f"only id 0 may be {UNK_TOKEN!r}")
  if len(set(vocab)) != len(vocab):
    dupes = sorted({t for t in vocab if vocab.count(t) > 1})
    raise _fail(path, f"vocab repeats {dupes!r}")
  return list(vocab)


def _check_string_list(vocab, path, entries: str) -> None:
  """Checks what every vocabulary is: a non-empty list of at most MAX_VOCAB
  strings (`entries` names them in the message)."""
  if not isinstance(vocab, list) or not vocab:
    raise _fail(path, f"vocab must be a non-empty list of {entries}")
  if len(vocab) > MAX_VOCAB:
    raise _fail(path, f"vocab has {len(vocab)} entries, more than {MAX_VOCAB}")
  for i, token in enumerate(vocab):
    if not isinstance(token, str):
      raise _fail(path, f"vocab entry {i} is not a string")


def _validate_tokens(vocab, path) -> List[str]:
  _check_string_list(vocab, path, "token strings")
  if len(set(vocab)) != len(vocab):
    seen, dupes = set(), []
    for token in vocab:
      if token in seen and token not in dupes:
        dupes.append(token)
      seen.add(token)
    raise _fail(path, f"vocab repeats {dupes[:5]!r}")
  return list(vocab)


def validate(config: ModelConfig, vocab: Sequence[str],
             tensors: Mapping[str, np.ndarray], path=None) -> Dict[str, np.ndarray]:
  """Checks tensors against config and vocab; returns them as float32 arrays.

  Raises:
    ValueError: a missing, extra, misshapen, non-float or non-finite tensor.
  """
  expected = config.expected_shapes(len(vocab))
  missing = sorted(set(expected) - set(tensors))
  if missing:
    raise _fail(path, f"missing tensors {missing}")
  extra = sorted(set(tensors) - set(expected))
  if extra:
    raise _fail(path, f"unexpected tensors {extra}",
                "the file does not match its config")
  out = {}
  for key, shape in expected.items():
    array = np.asarray(tensors[key])
    if array.dtype.kind != "f":
      raise _fail(path, f"tensor {key} has dtype {array.dtype}, expected float")
    if tuple(array.shape) != shape:
      raise _fail(path, f"tensor {key} has shape {tuple(array.shape)}, expected "
                  f"{shape} for vocab size {len(vocab)} and the config")
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
      raise _fail(path, f"tensor {key} holds NaN or Inf values")
    out[key] = array
  return out


def write(path, config: ModelConfig, vocab: Sequence[str],
          tensors: Mapping[str, np.ndarray],
          tokens: Optional[vocabulary_lib.Tokens] = None, *,
          chat_template: Optional[ChatTemplateData] = None,
          weights_dtype: str = reduced_weights.FLOAT32) -> None:
  """Validates and writes a model file atomically (temp file, then rename).

  A character model (no `tokens`, or a characters kind) is written as format
  1, exactly as before token vocabularies; any other as format 2. A reduced
  `weights_dtype` stores the large matrices in fewer bits (the module
  docstring): tensors already of that dtype (a model loaded with it) are
  stored exactly; others are rounded first.

  Args:
    path: destination `.npz` path.
    config: the architecture.
    vocab: characters (or token strings) in id order.
    tensors: the arrays named as in the module docstring.
    tokens: the vocabulary's kind and rules; None for characters.
    chat_template: the model's chat template, if one was found (a member
      only then: a file without one is written as before).
    weights_dtype: one of `reduced_weights.WEIGHTS_DTYPES`.

  Raises:
    ValueError: if the contents are inconsistent, or a bad weights dtype
      (nothing is written).
    OSError: if the file cannot be written (nothing is left behind).
  """
  if tokens is not None and tokens.kind == "characters":
    tokens = None
  vocab = validate_vocab(list(vocab), tokens=tokens is not None)
  if tokens is not None and tuple(vocab) != tokens.vocab:
    raise ValueError("the vocab and the tokens' vocabulary differ")
  arrays = validate(config, vocab, tensors)
  # Format 1 members, in their order, then `tokens`: a character model's
  # file is the same bytes as before.
  members = dict(format_version=np.int64(
      FORMAT_VERSION if tokens is None else TOKENS_FORMAT_VERSION),
                 config=np.array(config.to_json()),
                 vocab=np.array(json.dumps(vocab, ensure_ascii=False)))
  if tokens is not None:
    members["tokens"] = np.array(tokens.to_json())
  if chat_template is not None:
    members["chat_template"] = np.array(chat_template.to_json())
  if weights_dtype not in reduced_weights.WEIGHTS_DTYPES:
    raise ValueError(reduced_weights.choices_message(weights_dtype))
  if weights_dtype != reduced_weights.FLOAT32:
    members[WEIGHTS_DTYPE] = np.array(weights_dtype)
    for key, axis in config.reduced_keys().items():
      stored, scale = reduced_weights.encode(arrays[key], weights_dtype,
                                             axis, key)
      arrays[key] = stored
      if scale is not None:
        arrays[key + SCALE_SUFFIX] = scale
  with staging.staged_path(os.fspath(path), prefix=".rnnstep-") as tmp:
    with open(tmp, "wb") as f:
      np.savez(f, **members, **arrays)
      f.flush()
      os.fsync(f.fileno())


def read(path) -> ModelFile:
  """Reads and validates a model file, without unpickling anything.

  Args:
    path: the `.npz` file.

  Returns:
    A ModelFile with float32 tensors (a reduced weights dtype's decoded).

  Raises:
    FileNotFoundError / OSError: the file cannot be opened.
    ValueError: the file is not a valid rnnstep model file; the message names the
      file and the problem.
  """
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such model file")
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path}: is a directory, not an rnnstep .npz model file")
  try:
    members = _read_members(path)
  except zipfile.BadZipFile as e:
    raise _fail(path, f"not an rnnstep model file (not a valid .npz archive: {e})",
                "convert Keras weights with rnnstep-convert") from None
  version = members.pop("format_version", None)
  if version is None or version.shape != () or version.dtype.kind not in "iu":
    raise _fail(path, "not an rnnstep model file (no format_version)",
                "convert Keras weights with rnnstep-convert")
  if int(version) not in (FORMAT_VERSION, TOKENS_FORMAT_VERSION):
    raise _fail(path, f"format_version {int(version)} is not supported "
                f"(this rnnstep reads versions {FORMAT_VERSION} and "
                f"{TOKENS_FORMAT_VERSION})",
                "upgrade rnnstep or re-convert the model")
  has_tokens = int(version) == TOKENS_FORMAT_VERSION
  config = parse_config(_json_member(members.pop("config", None), "config", path),
                        path)
  vocab = validate_vocab(_json_member(members.pop("vocab", None), "vocab", path),
                         path, tokens=has_tokens)
  tokens = None
  if has_tokens:
    tokens = vocabulary_lib.Tokens.from_json(
        _json_member(members.pop("tokens", None), "tokens", path), vocab, path)
  chat_template = members.pop("chat_template", None)
  if chat_template is not None:
    chat_template = ChatTemplateData.from_json(
        _json_member(chat_template, "chat_template", path), path)
  weights_dtype = _decode_reduced(members, config, path)
  tensors = validate(config, vocab, members, path)
  return ModelFile(config, vocab, tensors, tokens, chat_template,
                   weights_dtype)


def _decode_reduced(members: Dict[str, np.ndarray], config: ModelConfig,
                    path) -> str:
  """Replaces a reduced file's stored matrices in `members` with their
  float32 values (and drops their scales); returns the weights dtype."""
  if WEIGHTS_DTYPE not in members:
    return reduced_weights.FLOAT32
  weights_dtype = _json_text(members.pop(WEIGHTS_DTYPE), WEIGHTS_DTYPE, path)
  if weights_dtype not in reduced_weights.WEIGHTS_DTYPES[1:]:
    raise _fail(path, f"{WEIGHTS_DTYPE} {weights_dtype!r} is not one of "
                f"{', '.join(reduced_weights.WEIGHTS_DTYPES[1:])}",
                "upgrade rnnstep or re-convert the model")
  for key, axis in config.reduced_keys().items():
    if key not in members:
      continue  # `validate` names it with the others missing.
    scale = members.pop(key + SCALE_SUFFIX, None)
    problem = reduced_weights.check_stored(members[key], scale, weights_dtype,
                                           axis, key, key + SCALE_SUFFIX)
    if problem:
      raise _fail(path, problem)
    members[key] = reduced_weights.decode(members[key], scale, weights_dtype)
  return weights_dtype


def _json_text(array: np.ndarray, key: str, path) -> str:
  if array.shape != () or array.dtype.kind != "U":
    raise _fail(path, f"{key} must be a text scalar")
  return str(array)


def _json_member(array: Optional[np.ndarray], key: str, path):
  if array is None:
    raise _fail(path, f"missing {key}")
  if array.shape != () or array.dtype.kind != "U":
    raise _fail(path, f"{key} must be a JSON text scalar")
  try:
    return json.loads(str(array))
  except json.JSONDecodeError as e:
    raise _fail(path, f"{key} is not valid JSON ({e})") from None


def _read_members(path) -> Dict[str, np.ndarray]:
  """Reads every `.npy` member, checking headers before allocating anything."""
  out = {}
  with zipfile.ZipFile(path) as archive:
    infos = archive.infolist()
    most = max(len(kind.tensor_names) for kind in kinds.KINDS.values())
    if len(infos) > 2 * most * MAX_LAYERS + 2 * MAX_HEAD + 16:
      raise _fail(path, f"holds {len(infos)} members, too many for a model file")
    total = 0
    for info in infos:
      name = info.filename
      if not name.endswith(".npy") or "/" in name or name.startswith("."):
        raise _fail(path, f"unexpected member {name!r}")
      total += info.file_size
      if info.file_size > MAX_MEMBER_BYTES or total > MAX_MEMBER_BYTES:
        raise _fail(path, f"member {name!r} declares {info.file_size} bytes, "
                    "more than a model file may hold")
      with archive.open(info) as stream:
        header = stream.read(min(info.file_size, 1 << 16))
        shape, dtype = _npy_header(header, name, path)
        if dtype.kind in "OV" or dtype.hasobject:
          raise _fail(path, f"member {name!r} holds {dtype} objects, not numbers")
        declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
        if dtype.kind == "U":
          if declared > MAX_TEXT_BYTES:
            raise _fail(path, f"text member {name!r} is too large")
        if declared > info.file_size:
          raise _fail(path, f"member {name!r} declares {declared} bytes but holds "
                      f"{info.file_size}: truncated or forged")
      try:
        out[name[:-4]] = np.load(io.BytesIO(archive.read(info)),
                                 allow_pickle=False)
      except (ValueError, OSError, EOFError) as e:
        raise _fail(path, f"member {name!r} is unreadable ({e})") from None
  return out


def _npy_header(header: bytes, name: str, path) -> Tuple[Tuple[int, ...], np.dtype]:
  stream = io.BytesIO(header)
  try:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
      shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
      shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
  except (ValueError, EOFError, OSError) as e:
    raise _fail(path, f"member {name!r} is not a valid .npy array ({e})") from None
  return tuple(shape), dtype
