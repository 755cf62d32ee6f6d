"""RWKV-7 models: KerasHub presets and official RWKV-LM `.pth` state dicts.

Both are read as data, without Keras or torch, into one layer of the kind
`rwkv7` (`kinds.rwkv7_shapes`: every block's tensors stacked, matrices as
`x @ W`), with the world vocabulary (`vocabulary.Tokens` kind `world`):

  - a KerasHub preset folder (`RWKV7CausalLM.save_to_preset`): its
    `config.json` (`RWKV7Backbone`'s sizes, read through an allow-list),
    `model.weights.h5` (through `safe_io.H5File`: the backbone's layers
    `embedding`, `rwkv7__block[_N]`, `layer_normalization` (the output
    norm) and `dense` (the head), each object's variables `vars/0, 1, ...`
    in creation order) and `assets/tokenizer/vocabulary.txt`;
  - an official `.pth` (RWKV-LM's `emb.weight`, `blocks.N.ln0/ln1/ln2`,
    `blocks.N.att.*`, `blocks.N.ffn.*`, `ln_out.*`, `head.weight`), read by
    the torch-zip reader rnnstep's PyTorch converter uses, with the world
    vocabulary file given beside it (`rwkv_vocab_v20230424.txt`).

The world vocabulary file (`read_world_vocabulary`): one token a line,
`<id> <Python str or bytes literal> <byte length>`; the literal is parsed as
a literal alone (`ast.parse`, a constant node: nothing is evaluated). Its
lines end as the file's own tokenizer reads them (the `rwkv` package's
`TRIE_TOKENIZER` opens it as text: Python's universal newlines), so the
copies RWKV-LM and the `rwkv` package ship, with CRLF line ends, read as
LF ones do.

`rnnstep.convert` asks `file_kind` first and, for an RWKV-7 file, reads it
with `read_model` (the vocabulary rules of each kind of file) and describes
it with `summary`.
"""

import ast
import io
import json
import os
import re
from typing import Dict, List, Optional

import numpy as np

from rnnstep.convert import safe_io
from rnnstep.convert import torch_state_dict
from rnnstep.convert import torch_zip
from rnnstep.convert.contents import LayerSummary
from rnnstep.convert.contents import Summary
from rnnstep.convert.safe_io import show
from rnnstep.convert.vocabulary import VocabularyNotAllowed
from rnnstep.convert.vocabulary import VocabularyRequired
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import vocabulary as vocabulary_lib

BACKBONE_CLASS = "RWKV7Backbone"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
VOCABULARY_FILE = os.path.join("assets", "tokenizer", "vocabulary.txt")
MAX_VOCABULARY_BYTES = 16 << 20
MAX_CONFIG_BYTES = 1 << 20
# KerasHub's config keys for `kinds.RWKV7_SIZES`.
_KERAS_SIZES = {"head_size": "head_size", "ffn": "intermediate_dim",
                "decay_lora": "decay_lora", "a_lora": "aaa_lora",
                "v_lora": "mv_lora", "gate_lora": "gate_lora"}
# KerasHub's time-mix variables in creation order (`RWKV7TimeMix.build`);
# block 0 (`add_v_first=False`) has no v0, v1, v2.
_TIME_MIX_VARS = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "w1", "w2",
                  "a0", "a1", "a2", "v0", "v1", "v2", "g1", "g2", "k_k",
                  "k_a", "r_k")
_WORLD_LINE = re.compile(r"^(\d+) (.+) (\d+)$")
_BLOCK = re.compile(r"^rwkv7__block(?:_(\d+))?$")
_PTH_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.")


def _fail(label, problem):
  return safe_io.fail(label, problem)


# ------------------------------------------------------------- vocabulary


def read_world_vocabulary(data: bytes, size: int, label
                          ) -> vocabulary_lib.Tokens:
  """The world vocabulary of a model of `size` ids from its file's bytes.

  Args:
    data: the file (UTF-8 text).
    size: the model's vocabulary size V (its embedding's rows).
    label: how messages name the file.

  Raises:
    ValueError: a line that is not `<id> <literal> <length>`, a literal that
      is not a str or bytes constant, a wrong length, a repeated id or
      token, or an id the model has no row for; naming the line.
  """
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _fail(label, f"the vocabulary is not UTF-8 text ({e.reason} at "
                f"byte {e.start})") from None
  tokens: Dict[int, bytes] = {}
  seen = set()
  for number, line in enumerate(_lines(text), 1):
    if not line.strip():
      continue
    match = _WORLD_LINE.match(line)
    where = f"vocabulary line {number} ({show(line, 60)})"
    if not match or len(line) > 4096:
      raise _fail(label, f"{where} is not '<id> <token literal> <length>'")
    token_id, length = int(match.group(1)), int(match.group(3))
    try:
      node = ast.parse(match.group(2).strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
      node = None
    if not isinstance(node, ast.Constant) or not isinstance(
        node.value, (str, bytes)):
      raise _fail(label, f"{where}: the token is not a str or bytes literal")
    token = node.value
    token = token.encode("utf-8") if isinstance(token, str) else token
    if len(token) != length or not token:
      raise _fail(label, f"{where}: the token has {len(token)} bytes, the "
                  f"line says {length}")
    if not 0 < token_id < size:
      raise _fail(label, f"{where}: id {token_id} is outside the model's "
                  f"ids 1..{size - 1} (id 0 is the end-of-text token)")
    if token_id in tokens or token in seen:
      raise _fail(label, f"{where} repeats an id or a token")
    tokens[token_id] = token
    seen.add(token)
  if not tokens:
    raise _fail(label, "the vocabulary holds no tokens")
  vocab = [vocabulary_lib.world_entry(tokens.get(i), i) for i in range(size)]
  return vocabulary_lib.Tokens("world", vocab, path=label)


def _lines(text: str) -> List[str]:
  """The file's lines as its own tokenizer reads them: Python's universal
  newlines (LF, CRLF and CR end a line, nothing else does)."""
  return io.StringIO(text, newline=None).read().split("\n")


def is_world_vocabulary(path) -> bool:
  """Whether a file starts like a world vocabulary (`<id> <literal> <n>`)."""
  try:
    with open(path, "rb") as f:
      head = f.read(256)
  except OSError:
    return False
  first = _lines(head.decode("utf-8", "replace"))[0]
  return bool(_WORLD_LINE.match(first)) and not first.startswith("{")


def _read_file(path, limit, label) -> bytes:
  size = os.path.getsize(path)
  if size > limit:
    raise _fail(label, f"{os.path.basename(path)} is {size} bytes, more than "
                f"the {limit} allowed")
  with open(path, "rb") as f:
    return f.read(limit + 1)


# ------------------------------------------------------- KerasHub presets


def is_preset(path) -> bool:
  """Whether `path` is a KerasHub preset folder of an RWKV-7 backbone."""
  config = os.path.join(os.fspath(path), CONFIG_FILE)
  if not os.path.isdir(path) or not os.path.isfile(config):
    return False
  try:
    data = json.loads(_read_file(config, MAX_CONFIG_BYTES, path))
  except (OSError, ValueError):
    return False
  return isinstance(data, dict) and data.get("class_name") == BACKBONE_CLASS


def _preset_config(path, label) -> model_file.LayerConfig:
  data = json.loads(_read_file(os.path.join(path, CONFIG_FILE),
                               MAX_CONFIG_BYTES, label))
  config = data.get("config") if isinstance(data, dict) else None
  if not isinstance(config, dict):
    raise _fail(label, f"{CONFIG_FILE} has no backbone config")
  dtype = config.get("dtype")
  if isinstance(dtype, dict):
    dtype = (dtype.get("config") or {}).get("name")
  if dtype not in (None, "float32", "bfloat16", "float16", "mixed_bfloat16",
                   "mixed_float16"):
    raise _fail(label, f"{CONFIG_FILE}: dtype {show(dtype)} is not a float "
                "dtype rnnstep reads")
  entry = {"kind": "rwkv7", "units": config.get("hidden_size"),
           "blocks": config.get("num_layers")}
  entry.update({name: config.get(key) for name, key in _KERAS_SIZES.items()})
  return _layer(entry, config.get("vocabulary_size"), label)


def _layer(entry, vocab_size, label):
  """The model config of an RWKV-7 stack, checked by the model file's own
  rules; returns (ModelConfig, V)."""
  try:
    config = model_file.parse_config(
        {"embedding_dim": entry["units"], "layers": [entry]}, label)
  except ValueError as e:
    raise _fail(label, str(e).split(": ", 1)[-1]) from None
  if not isinstance(vocab_size, int) or not 0 < vocab_size <= (
      model_file.MAX_VOCAB):
    raise _fail(label, f"vocabulary_size {show(vocab_size)} is not a size")
  return config, vocab_size


def read_preset(path) -> model_file.ModelFile:
  """Reads a KerasHub RWKV-7 preset folder (see the module docstring).

  Raises:
    ValueError: naming the file and what does not fit.
  """
  label = os.fspath(path)
  config, vocab_size = _preset_config(path, label)
  vocab_path = os.path.join(path, VOCABULARY_FILE)
  if not os.path.isfile(vocab_path):
    raise _fail(label, f"no {VOCABULARY_FILE} (the RWKVTokenizer's "
                "vocabulary)")
  tokens = read_world_vocabulary(
      _read_file(vocab_path, MAX_VOCABULARY_BYTES, label), vocab_size,
      f"{label}/{VOCABULARY_FILE}")
  weights = os.path.join(path, WEIGHTS_FILE)
  if not os.path.isfile(weights):
    raise _fail(label, f"no {WEIGHTS_FILE}")
  per_block, top = _read_h5(weights, f"{label}/{WEIGHTS_FILE}",
                            config.layers[0].size["blocks"])
  return _model(config, tokens, per_block, top, label)


def is_keras_weights(path) -> bool:
  """Whether `path` is the Keras 3 weights of an RWKV-7 model: the
  `save_weights` of an `RWKV7Backbone` or `RWKV7CausalLM` (its optimizer's
  variables beside), or a preset's `model.weights.h5`."""
  try:
    with safe_io.H5File(path, os.fspath(path)) as h5:
      return all(h5.get(where) is not None for where in (
          "layers/rwkv7__block/att/vars", "layers/embedding/vars"))
  except ValueError:
    return False


def read_keras_weights(path, vocab_path) -> model_file.ModelFile:
  """Reads an RWKV-7 model's `.weights.h5` alone (`is_keras_weights`).

  The backbone's config (`config.json`) adds nothing the weights' shapes do
  not hold (its sizes are the shapes, as for the official `.pth`), so it is
  not needed, as for other Keras `.weights.h5` files.

  Args:
    path: the `.weights.h5`.
    vocab_path: the world vocabulary file (a preset's
      `assets/tokenizer/vocabulary.txt` or `rwkv_vocab_v20230424.txt`);
      None for the shapes alone (`convert.describe`).

  Raises:
    ValueError: naming the file and what does not fit.
  """
  label = os.fspath(path)
  per_block, top = _read_h5(path, label)
  config, vocab_size = _layer(*_sizes(per_block, top["embedding"]), label)
  return _model(config, _world_tokens(vocab_path, vocab_size), per_block,
                top, label)


def _read_h5(path, label, expected_blocks=None):
  """The per-block and top tensors (`_model`'s) of an RWKV7Backbone's
  weights file; `expected_blocks`: the config's count, when there is one."""
  with safe_io.H5File(path, label) as h5:
    def var(group, index):
      where = f"layers/{group}/vars/{index}"
      dataset = h5.get(where)
      if dataset is None:
        raise _fail(h5.label, f"no dataset {where}; not an RWKV7Backbone's "
                    "weights")
      return h5.read_dataset(dataset, where).astype(np.float32)

    layers = h5.get("layers")
    if layers is None:
      raise _fail(h5.label, "no layers group; not a Keras 3 weights file")
    blocks = {}
    for name in h5.names(layers, "layers"):
      match = _BLOCK.match(name)
      if match:
        blocks[int(match.group(1) or 0)] = name
    count = len(blocks) if expected_blocks is None else expected_blocks
    if not blocks or sorted(blocks) != list(range(count)):
      says = ("are not numbered 0..N-1" if expected_blocks is None else
              f"the config says {expected_blocks}")
      raise _fail(h5.label, f"holds RWKV-7 blocks {sorted(blocks)[:8]}, "
                  f"{says}")
    per_block = []
    for i in range(count):
      group = blocks[i]
      names = [n for n in _TIME_MIX_VARS if i or n not in ("v0", "v1", "v2")]
      att = {n: var(f"{group}/att", j) for j, n in enumerate(names)}
      block = dict(
          ln1=(var(f"{group}/ln1", 0), var(f"{group}/ln1", 1)),
          ln2=(var(f"{group}/ln2", 0), var(f"{group}/ln2", 1)),
          ln_x=(var(f"{group}/att/ln_x", 0), var(f"{group}/att/ln_x", 1)),
          receptance=var(f"{group}/att/receptance", 0),
          key=var(f"{group}/att/key", 0), value=var(f"{group}/att/value", 0),
          output=var(f"{group}/att/output_layer", 0),
          ffn_x_k=var(f"{group}/ffn", 0),
          ffn_key=var(f"{group}/ffn/key", 0),
          ffn_value=var(f"{group}/ffn/value", 0), **att)
      if i == 0:
        block["ln0"] = (var(f"{group}/ln0", 0), var(f"{group}/ln0", 1))
      per_block.append(block)
    top = dict(embedding=var("embedding", 0),
               ln_out=(var("layer_normalization", 0),
                       var("layer_normalization", 1)),
               head=var("dense", 0))
  return per_block, top


def _sizes(per_block, embedding):
  """The `rwkv7` layer entry and vocabulary size V that the tensors' shapes
  give (matrices as `x @ W`); the config's rules check them (`_layer`)."""
  first = per_block[0]
  shape = lambda name, axis, block=first: (
      int(np.shape(block[name])[axis]) if np.ndim(block[name]) == 2 else None)
  # Block 0 reads no v LoRA (KerasHub stores none there; a checkpoint's is
  # unused): block 1's size, else any (`_model` writes zeros).
  with_v = next((b for b in per_block if "v1" in b), None)
  vocab_size, units = (int(n) for n in np.shape(embedding))
  entry = {"kind": "rwkv7", "units": units, "blocks": len(per_block),
           "head_size": shape("r_k", 1), "ffn": shape("ffn_key", 1),
           "decay_lora": shape("w1", 1), "a_lora": shape("a1", 1),
           "v_lora": 1 if with_v is None else shape("v1", 1, with_v),
           "gate_lora": shape("g1", 1)}
  return entry, vocab_size


def _world_tokens(vocab_path, vocab_size) -> vocabulary_lib.Tokens:
  """The world vocabulary file's tokens; None: ids without tokens (for a
  model's shapes alone, `convert.describe`)."""
  if vocab_path is None:
    return vocabulary_lib.Tokens("world", [
        vocabulary_lib.world_entry(None, i) for i in range(vocab_size)])
  return read_world_vocabulary(
      _read_file(vocab_path, MAX_VOCABULARY_BYTES, os.fspath(vocab_path)),
      vocab_size, os.fspath(vocab_path))


# ----------------------------------------------------- official .pth files


def is_official_state_dict(names) -> bool:
  """Whether a state dict's keys are RWKV-7's official ones."""
  return {"emb.weight", "head.weight", "blocks.0.att.r_k"} <= set(names)


def read_pth(path, vocab_path) -> model_file.ModelFile:
  """Reads an official RWKV-7 `.pth` with its world vocabulary file.

  Args:
    path: the `.pth` (torch's zip format; read without torch).
    vocab_path: `rwkv_vocab_v20230424.txt` or one in its format.

  Raises:
    ValueError: naming the file and what does not fit.
  """
  label = os.fspath(path)
  obj, _, close = torch_zip.read_zip(path)
  try:
    state = torch_state_dict.find_state_dict(obj, label).tensors
    if not is_official_state_dict(state):
      raise _fail(label, "not an RWKV-7 state dict (no emb.weight, "
                  "head.weight and blocks.0.att.r_k)")
    arrays = {name: tensor.read(label, name) for name, tensor in
              state.items()}
  finally:
    close()
  return from_state_dict(arrays, vocab_path, label)


def from_state_dict(arrays: Dict[str, np.ndarray], vocab_path, label
                    ) -> model_file.ModelFile:
  """An official RWKV-7 state dict's float32 arrays as a model file."""
  def get(name, rank=None):
    if name not in arrays:
      raise _fail(label, f"no tensor {name}")
    array = arrays[name]
    if rank == 1:
      array = array.reshape(-1)
    return array

  blocks = sorted({int(m.group(1)) for m in map(_PTH_BLOCK_KEY.match, arrays)
                   if m})
  if not blocks or blocks != list(range(len(blocks))):
    raise _fail(label, f"blocks {blocks[:8]} are not numbered 0..N-1")
  used = {"emb.weight", "head.weight", "ln_out.weight", "ln_out.bias",
          "blocks.0.ln0.weight", "blocks.0.ln0.bias"}
  per_block = []
  for i in blocks:
    p = f"blocks.{i}."
    names = [n for n in _TIME_MIX_VARS if i or n not in ("v0", "v1", "v2")]
    block = {n: get(p + "att." + n) for n in names}
    block["r_k"] = get(p + "att.r_k")
    for name in ("receptance", "key", "value", "output"):
      block[name] = get(p + f"att.{name}.weight").T
    block.update(
        ln1=(get(p + "ln1.weight"), get(p + "ln1.bias")),
        ln2=(get(p + "ln2.weight"), get(p + "ln2.bias")),
        ln_x=(get(p + "att.ln_x.weight"), get(p + "att.ln_x.bias")),
        ffn_x_k=get(p + "ffn.x_k", 1), ffn_key=get(p + "ffn.key.weight").T,
        ffn_value=get(p + "ffn.value.weight").T)
    per_block.append(block)
    used.update(p + "att." + n for n in _TIME_MIX_VARS)
    used.update(p + n for n in (
        "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "ffn.x_k",
        "ffn.key.weight", "ffn.value.weight", "att.ln_x.weight",
        "att.ln_x.bias", "att.receptance.weight", "att.key.weight",
        "att.value.weight", "att.output.weight"))
  per_block[0]["ln0"] = (get("blocks.0.ln0.weight"), get("blocks.0.ln0.bias"))
  extra = sorted(set(arrays) - used)
  if extra:
    raise _fail(label, f"tensors {[show(n, 40) for n in extra[:5]]} are not "
                "part of an RWKV-7 model")
  top = dict(embedding=get("emb.weight"),
             ln_out=(get("ln_out.weight"), get("ln_out.bias")),
             head=get("head.weight").T)
  config, vocab_size = _layer(*_sizes(per_block, top["embedding"]), label)
  return _model(config, _world_tokens(vocab_path, vocab_size), per_block,
                top, label)


# ------------------------------------------------------------- the model


def _model(config, tokens, per_block, top, label) -> model_file.ModelFile:
  """Stacks per-block tensors into the `rwkv7` layer's (`kinds.rwkv7_shapes`)
  and validates the whole against the config."""
  units = config.layers[0].units
  v_lora = config.layers[0].size["v_lora"]
  # Block 0 reads no v0/v1/v2 (its v is v_first): zeros there, whatever a
  # checkpoint holds.
  first = per_block[0]
  first.update(v0=np.zeros(units), v1=np.zeros((units, v_lora)),
               v2=np.zeros((v_lora, units)))
  stack = lambda fn: np.stack([fn(b) for b in per_block]).astype(np.float32)
  tensors = {
      "kernel": np.stack(first["ln0"]),
      "ln": stack(lambda b: np.stack(b["ln1"] + b["ln2"])),
      "mix": stack(lambda b: np.stack([b[n].reshape(-1)
                                       for n in kinds.RWKV7_MIX])),
      "vectors": stack(lambda b: np.stack([b[n].reshape(-1)
                                           for n in kinds.RWKV7_VECTORS])),
      "ln_x": stack(lambda b: np.stack(b["ln_x"])),
      "output_norm": np.stack(top["ln_out"])}
  for name in ("w1", "w2", "a1", "a2", "v1", "v2", "g1", "g2", "receptance",
               "key", "value", "output", "ffn_key", "ffn_value"):
    tensors[name] = stack(lambda b, name=name: b[name])
  tensors = {f"layer0_{name}": value for name, value in tensors.items()}
  tensors.update(embedding=top["embedding"], dense_kernel=top["head"],
                 dense_bias=np.zeros(top["head"].shape[1], np.float32))
  try:
    tensors = model_file.validate(config, list(tokens.vocab), tensors, label)
  except ValueError as e:
    raise _fail(label, str(e).split(": ", 1)[-1]) from None
  return model_file.ModelFile(config, list(tokens.vocab), tensors, tokens)


# -------------------------------------------------- the converter's entry


def file_kind(input_path) -> Optional[str]:
  """'preset' for a KerasHub RWKV-7 preset folder, 'h5' for the Keras
  weights of one (by its layers' names), 'pth' for an official RWKV-7
  torch.save state dict (by its keys; its pickle is read as data, its
  tensors are not), else None."""
  path = os.fspath(input_path)
  if is_preset(path):
    return "preset"
  if not os.path.isfile(path):
    return None
  if safe_io.sniff(path) == "hdf5":
    return "h5" if is_keras_weights(path) else None
  if safe_io.sniff(path) != "zip":
    return None
  try:
    with safe_io.open_zip(path) as archive:
      if not torch_zip.is_torch_zip(safe_io.member_names(archive)):
        return None
    obj, _, close = torch_zip.read_zip(path)
  except ValueError:
    return None  # Its own reader says what is wrong.
  try:
    names = torch_state_dict.find_state_dict(obj, path).tensors
  except ValueError:
    return None
  finally:
    close()
  return "pth" if is_official_state_dict(names) else None


def read_model(input_path, corpus, vocab, describe=False
               ) -> model_file.ModelFile:
  """Reads an RWKV-7 preset, `.weights.h5` or `.pth` (`file_kind`) with
  its vocabulary.

  A `.weights.h5` or `.pth` needs `vocab=`: the world vocabulary file; a
  preset holds its own. `describe`: a file without one gets ids without
  tokens (for its shapes alone).
  """
  path = os.fspath(input_path)
  kind = file_kind(path)
  read = read_keras_weights if kind == "h5" else read_pth
  what = ("a KerasHub RWKV-7 weights file" if kind == "h5" else
          "an official RWKV-7 checkpoint")
  if kind == "preset":
    if corpus is not None or vocab is not None:
      raise VocabularyNotAllowed(
          f"{path}: a KerasHub preset holds its own vocabulary "
          f"({VOCABULARY_FILE}); give no corpus or vocab")
    return read_preset(path)
  if vocab is None and corpus is None and describe:
    return read(path, None)
  if vocab is None or corpus is not None:
    raise VocabularyRequired(
        f"{path}: {what} holds no vocabulary; give its world vocabulary "
        "file as vocab (rwkv_vocab_v20230424.txt or a preset's "
        f"{VOCABULARY_FILE}: '<id> <token> <length>' lines), not a "
        "corpus")
  if isinstance(vocab, (str, os.PathLike)) and not os.path.isfile(vocab):
    raise FileNotFoundError(f"{os.fspath(vocab)}: no such vocabulary file "
                            f"(the world vocabulary of {path})")
  if not isinstance(vocab, (str, os.PathLike)) or not (
      is_world_vocabulary(vocab)):
    raise ValueError(f"{path}: vocab must be RWKV's world vocabulary file "
                     "(rwkv_vocab_v20230424.txt: '<id> <token> <length>' "
                     "lines)")
  return read(path, vocab)


def summary(input_path, read: model_file.ModelFile) -> Summary:
  """The `Summary` of an RWKV-7 model read whole (`read_model`)."""
  config, layer = read.config, read.config.layers[0]
  vocab, dim = read.tensors["embedding"].shape
  kind = file_kind(input_path)
  shapes = [tuple(read.tensors[f"layer0_{name}"].shape)
            for name in kinds.RWKV7_TENSORS]
  detail = ", ".join(f"{name}={value}" for name, value in
                     (("units", layer.units),) + layer.sizes)
  layers = [LayerSummary("embedding", "embedding", [(vocab, dim)],
                         f"vocab {vocab} x dim {dim}"),
            LayerSummary("rwkv7", "blocks", shapes, detail),
            LayerSummary("dense", "head", [(dim, vocab)],
                         f"{dim} -> {vocab}, use_bias=False")]
  fmt = {"preset": "KerasHub RWKV7Backbone preset folder",
         "h5": "KerasHub RWKV7Backbone .weights.h5 (sizes from its shapes)",
         "pth": "official RWKV-7 .pth state dict (torch zip)"}[kind]
  params = sum(int(np.prod(t.shape)) for t in read.tensors.values())
  return Summary(input_path=os.fspath(input_path), format=fmt, layers=layers,
                 config=config, vocab_size=int(vocab), embedding_dim=int(dim),
                 num_parameters=params, tokens=read.tokens, notes=[
                     "block 0's LayerNorm ln0 is folded into the input table; "
                     "the head has no bias (zeros written)"])
