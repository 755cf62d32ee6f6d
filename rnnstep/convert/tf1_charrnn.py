"""sherjilozair/char-rnn-tensorflow save directories: TF1 name-based
checkpoints of `model.py`'s `MultiRNNCell`, with `config.pkl` and
`chars_vocab.pkl` beside them.

A save directory (`train.py --save_dir`) holds the `checkpoint` file,
`model.ckpt-N.index` / `.data-*` (written by `tf.train.Saver`), the pickled
`argparse.Namespace` of `train.py` (`config.pkl`) and the pickled
`(chars, vocab)` of `utils.TextLoader` (`chars_vocab.pkl`: characters sorted
by frequency, and {char: id}). `find_save_dir` recognises one from a path (the
directory, or a checkpoint prefix or file with the pickles beside it) with
`os.path` only; `read` lists its weights in Keras layouts, with the model's
chain and its own vocabulary (`Contents.vocab`).

The pickles are read as data by the restricted unpickler
(`unpickler.unpickle`): the one class it may meet, `argparse.Namespace`,
becomes an inert record whose attribute dict is taken as the config; the
vocabulary must be a tuple (or list) of one-character strings and a dict of
{str: int}. Anything else, and any call the pickle asks for (a `REDUCE` of
`os.system`), is refused in one line before anything runs.

The weights (read by name with `tf.train.load_checkpoint`; the graph is never
run, Adam slots, `beta1_power` / `beta2_power` and the learning-rate
`Variable` are ignored):

  embedding                                          [V, R]
  rnnlm/softmax_w, rnnlm/softmax_b                   [R, V], [V]
  rnnlm/multi_rnn_cell/cell_k/<cell>/...             per layer k

with R = `rnn_size` (the embedding width is R too). TF 1.0-1.2 named a
cell's variables `weights` / `biases`, later TFs `kernel` / `bias`; both are
read. Every TF1 cell multiplies `concat([x, h]) @ W`, so its W `[R + U, G*U]`
splits into the Keras kernel (the first R rows) and recurrent kernel (the
last U); the gate blocks are reordered to Keras's (docs/dev/cell-kinds.md):

  - `lstm_cell` (HEAD's `LSTMCell`, no peepholes or projection) and
    `basic_lstm_cell` (`BasicLSTMCell`, before May 2018): gates `i, j, f, o`
    of `lstm_matrix = concat([x, h]) @ W + b`, then
    `c' = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(j)`,
    `h' = sigmoid(o) * tanh(c')`, with `forget_bias=1.0` added at run time
    (model.py never sets it, and the checkpoint does not hold it). That is
    Keras's LSTM with blocks `[i | f | c | o]` = TF1's `[i | f | j | o]` and
    the forget bias folded into the stored one: `b_f + 1.0`. Folding moves
    one float32 rounding (`(z + b_f) + 1` becomes `z + (b_f + 1)`), like the
    regrouping rnnstep already does for every kind: on the fixtures the
    logits stay within 1e-5 of the recipe's and the greedy text is
    identical (tests/test_convert_charrnn_tf.py), so no run-time constant is
    kept.
  - `gru_cell` (`GRUCell`): `gates/{kernel,bias}` `[R + U, 2U]` with blocks
    `r, u`, `candidate/{kernel,bias}` `[R + U, U]`:
    `r, u = sigmoid(concat([x, h]) @ Wg + bg)`,
    `c = tanh(concat([x, r * h]) @ Wc + bc)`, `h' = u * h + (1 - u) * c`.
    The reset applies before the candidate's product and the update gate
    keeps the old state, which is exactly Keras's GRU with
    `reset_after=False` (z = u): blocks `[z | r | h]` = `[u | r | c]`, the
    bias `[bg_u | bg_r | bc]`.
  - `basic_rnn_cell` (`BasicRNNCell`, before May 2018; HEAD's `rnn.RNNCell`
    is the abstract class and never trained): `h' = tanh(concat([x, h]) @ W
    + b)`, Keras's SimpleRNN.

The embedding is used as it is, `softmax_w` is the Dense kernel and
`softmax_b` its bias (the logits are `h @ softmax_w + softmax_b`; model.py's
`probs` are their softmax).
"""

import collections
import glob
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from rnnstep.convert import contents
from rnnstep.convert import safe_io
from rnnstep.convert import tf_checkpoint
from rnnstep.convert import unpickler
from rnnstep.convert.safe_io import show
from rnnstep.model import model_file

CONFIG_FILE = "config.pkl"
VOCAB_FILE = "chars_vocab.pkl"
MAX_PICKLE_BYTES = 16 << 20

# The only globals the pickles may name and have made: train.py's
# argparse.Namespace is rebuilt without __init__ (protocol 0-1:
# copyreg._reconstructor; 2+: NEWOBJ via copyreg.__newobj__) as an inert
# record; every other name is a record class, never called.
_PICKLE_GLOBALS = {key: make for key, make in unpickler.PLAIN_GLOBALS.items()
                   if key[0] == "copyreg"}
NAMESPACE = "argparse.Namespace"

# model.py's --model, the cell scopes TF1 gave its cells, and the rnnstep kind.
CELLS = {"lstm_cell": ("lstm", "lstm", "LSTMCell"),
         "basic_lstm_cell": ("lstm", "lstm", "BasicLSTMCell"),
         "gru_cell": ("gru", "gru", "GRUCell"),
         "basic_rnn_cell": ("rnn", "simple_rnn", "BasicRNNCell")}
FORGET_BIAS = 1.0  # LSTMCell / BasicLSTMCell's default; model.py keeps it.
# TF1 LSTM blocks i, j, f, o -> Keras [i | f | c | o].
_LSTM_BLOCKS = (0, 2, 1, 3)
_KERNEL_NAMES = ("kernel", "weights")
_BIAS_NAMES = ("bias", "biases")
_CELL_KEY = re.compile(r"^rnnlm/multi_rnn_cell/cell_(\d+)/([a-z_]+)/(.+)$")
# Optimizer slots (`<var>/Adam`, `<var>/Adam_1`, RMSProp's, Momentum's) and
# the optimizer's own variables.
_SLOT = re.compile(r"/(Adam|Adam_\d+|RMSProp|RMSProp_\d+|Momentum|"
                   r"Adagrad|Adadelta(_\d+)?)$")
_IGNORED_NAMES = ("beta1_power", "beta2_power", "Variable", "global_step")


def find_save_dir(path) -> Optional[str]:
  """The char-rnn-tensorflow save directory `path` names, or None.

  A save directory holds `config.pkl` and `chars_vocab.pkl` beside a
  checkpoint (the `checkpoint` file or a `.index`); `path` is that
  directory, or a checkpoint prefix or `.index` / `.data-*` file in it.
  Only file names are looked at (nothing is read).
  """
  path = os.fspath(path)
  if not path:
    return None
  if os.path.isdir(path):
    directory = path
    has_checkpoint = os.path.isfile(os.path.join(path, "checkpoint")) or bool(
        glob.glob(os.path.join(glob.escape(path), "*.index")))
  elif tf_checkpoint.is_checkpoint_file(path) or os.path.isfile(
      path + ".index"):
    directory = os.path.dirname(path) or "."
    has_checkpoint = True
  else:
    return None
  if has_checkpoint and all(os.path.isfile(os.path.join(directory, name))
                            for name in (CONFIG_FILE, VOCAB_FILE)):
    return directory
  return None


def read(path) -> contents.Contents:
  """Lists a save directory's weights in Keras layouts, with its chain and
  vocabulary (tensors read later).

  Args:
    path: what `find_save_dir` accepts.

  Raises:
    FileNotFoundError: no checkpoint.
    ValueError: a pickle that is not the recipe's, a cell rnnstep does not
      run, or weights that do not fit the config; in one line.
  """
  path = os.fspath(path)
  directory = find_save_dir(path)
  if directory is None:
    raise FileNotFoundError(f"{path}: not a char-rnn-tensorflow save directory "
                            f"({CONFIG_FILE} and {VOCAB_FILE} beside a "
                            "checkpoint)")
  config = read_config(os.path.join(directory, CONFIG_FILE))
  chars = read_chars_vocab(os.path.join(directory, VOCAB_FILE))
  model, rnn_size, num_layers, vocab_size = _check_config(
      config, os.path.join(directory, CONFIG_FILE))
  if vocab_size != len(chars):
    raise safe_io.fail(directory, f"{CONFIG_FILE} says vocab_size={vocab_size} "
                       f"but {VOCAB_FILE} holds {len(chars)} characters")
  prefix = _prefix(path, directory)
  reader, shapes, dtypes, data_bytes = tf_checkpoint.open_reader(prefix,
                                                                prefix)
  variables = _model_variables(shapes, dtypes, data_bytes, prefix)
  groups, specs, cell_class = _layers(variables, reader, model, rnn_size,
                                      num_layers, vocab_size, prefix)
  notes = [f"{VOCAB_FILE}: {len(chars)} characters, sorted by frequency as "
           "utils.TextLoader sorts them"]
  if os.path.isdir(path) and os.path.dirname(os.path.abspath(prefix)) != (
      os.path.abspath(directory)):
    notes.append(f"the weights are read from {prefix}, which this folder's "
                 "'checkpoint' file names: the folder holds no "
                 f"{os.path.basename(prefix)}")
  if specs[1].kind == "lstm":
    notes.append(f"{cell_class}'s forget_bias={FORGET_BIAS} (added at run time "
                 "by TF1, not stored) is folded into the stored forget-gate "
                 "bias")
  fmt = (f"char-rnn-tensorflow TF1 checkpoint ({os.path.basename(prefix)} in "
         f"{directory}; {num_layers} x {cell_class}, rnn_size {rnn_size})")
  chain = contents.ConfigChain(f"char-rnn-tensorflow Model ({model})", specs,
                               [])
  return contents.Contents(label=prefix, format=fmt, groups=groups,
                           chain=chain, key="name", notes=notes, vocab=chars)


# ------------------------------------------------------------------ pickles


def _load_pickle(path: str):
  """One pickle file through the restricted unpickler (one-line errors)."""
  try:
    data = safe_io.read_file(path, MAX_PICKLE_BYTES, path,
                             "char-rnn-tensorflow's pickles are small "
                             "(refused)")
  except OSError as e:
    raise safe_io.fail(path, f"cannot read it ({e.strerror or e})") from None
  if not data:
    raise safe_io.fail(path, "the file is empty")
  return unpickler.unpickle(data, path, _PICKLE_GLOBALS, _no_persistent_ids(
      path))


def _no_persistent_ids(path):
  def refuse(pid):
    raise safe_io.fail(path, f"the pickle names a persistent id ({show(pid)}); "
                       "train.py's pickles have none")
  return refuse


_PLAIN = (str, int, float, bool, type(None), bytes)


def _is_plain(value, depth: int = 0) -> bool:
  """Whether a value is plain data (what argparse flags hold)."""
  if isinstance(value, _PLAIN):
    return True
  if depth < 4 and isinstance(value, (list, tuple)):
    return all(_is_plain(v, depth + 1) for v in value)
  return False


def read_config(path: str) -> Dict[str, object]:
  """`config.pkl`, train.py's pickled `argparse.Namespace`, as a dict.

  Raises:
    ValueError: anything but a Namespace of plain values, or a pickle that
      asks to call something (refused before it runs); in one line.
  """
  obj = _load_pickle(path)
  if not (isinstance(obj, unpickler.InertRecord)
          and obj.qualified_name == NAMESPACE and isinstance(obj.state, dict)):
    found = (obj.qualified_name if isinstance(obj, unpickler.InertRecord)
             else type(obj).__name__)
    raise safe_io.fail(path, f"holds {show(found)}, not the {NAMESPACE} that "
                       "char-rnn-tensorflow's train.py pickles (refused)")
  config = obj.state
  for key, value in config.items():
    if not isinstance(key, str) or not _is_plain(value):
      raise safe_io.fail(path, f"the Namespace's {show(key)} is not plain data "
                         f"({type(value).__name__}; refused)")
  return config


def read_chars_vocab(path: str) -> List[str]:
  """`chars_vocab.pkl`, the pickled `(chars, vocab)`: the characters in id
  order, checked against `vocab` ({char: id}).

  Raises:
    ValueError: anything but a tuple of characters and a dict of {str: int}
      that agree, or a pickle that asks to call something; in one line.
  """
  obj = _load_pickle(path)
  if not (isinstance(obj, (tuple, list)) and len(obj) == 2
          and isinstance(obj[0], (tuple, list)) and isinstance(obj[1], dict)):
    raise safe_io.fail(path, f"holds {_describe(obj)}, not the (chars, vocab) "
                       "tuple of char-rnn-tensorflow's train.py (refused)")
  chars, vocab = obj
  if not chars:
    raise safe_io.fail(path, "the vocabulary is empty")
  for i, char in enumerate(chars):
    if not isinstance(char, str) or len(char) != 1:
      raise safe_io.fail(path, f"chars[{i}] is {show(char)}, not one character")
  if len(set(chars)) != len(chars):
    raise safe_io.fail(path, "chars repeats a character")
  wrong = [c for i, c in enumerate(chars) if vocab.get(c) != i or isinstance(
      vocab.get(c), bool)]
  if wrong or len(vocab) != len(chars):
    raise safe_io.fail(path, "vocab does not number chars in order (vocab"
                       f"[{show(wrong[0]) if wrong else '...'}] differs, or it "
                       "holds other keys)")
  return list(chars)


def _describe(obj) -> str:
  if isinstance(obj, unpickler.InertRecord):
    return f"a {show(obj.qualified_name)} object"
  if isinstance(obj, (tuple, list)):
    return f"a {type(obj).__name__} of {len(obj)}"
  return f"a {type(obj).__name__}"


def _check_config(config, path) -> Tuple[str, int, int, int]:
  """The config's (model, rnn_size, num_layers, vocab_size), checked."""
  values = []
  for key, kind in (("model", str), ("rnn_size", int), ("num_layers", int),
                    ("vocab_size", int)):
    value = config.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) or (
        kind is int and not 0 < value <= (1 << 20)):
      raise safe_io.fail(path, f"the Namespace has no usable {key} (found "
                         f"{show(value)}); is it char-rnn-tensorflow's "
                         "config.pkl?")
    values.append(value)
  model = values[0]
  known = sorted({recipe for recipe, _, _ in CELLS.values()})
  if model == "nas":
    raise safe_io.fail(path, "model='nas': NASCell is not a cell rnnstep runs "
                       f"(it runs {', '.join(known)})")
  if model not in known:
    raise safe_io.fail(path, f"model={show(model)}: not one of model.py's "
                       f"cells rnnstep runs ({', '.join(known)})")
  if values[2] > model_file.MAX_LAYERS:
    raise safe_io.fail(path, f"num_layers={values[2]}, more than "
                       f"{model_file.MAX_LAYERS}")
  return tuple(values)


# ------------------------------------------------------------------ weights


def _prefix(path: str, directory: str) -> str:
  """The checkpoint prefix: the one given, or the directory's latest.

  The `checkpoint` file names the prefix where it was written (train.py
  saves under its --save_dir); the folder's own file wins over the recorded
  path (`tf_checkpoint.folder_checkpoint`: a copy of the folder reads its
  own weights, never the original's newer ones beside the copy's config and
  vocabulary), which is followed only where the folder lacks the file
  (`read` notes it).
  """
  if not os.path.isdir(path):
    return tf_checkpoint.resolve(path)[0]
  named = tf_checkpoint.folder_checkpoint(path)
  if named is not None:
    return named
  found = sorted(glob.glob(os.path.join(glob.escape(path), "*.index")))
  if len(found) == 1:
    return found[0][:-len(".index")]
  names = ", ".join(os.path.basename(f)[:-len(".index")] for f in found[:3])
  raise safe_io.fail(path, "no 'checkpoint' file naming the latest checkpoint"
                     + (f"; pass one of {names} as a prefix" if found else ""))


def _model_variables(shapes, dtypes, data_bytes, label):
  """{name: shape} of the model's variables, optimizer state left out."""
  out = {}
  for name, shape in shapes.items():
    shape = tuple(int(d) for d in shape)
    if _SLOT.search(name) or name in _IGNORED_NAMES or not shape:
      continue
    if not dtypes[name].is_floating:
      raise safe_io.fail(label, f"variable {show(name)} has dtype "
                         f"{dtypes[name].name}, expected float weights")
    tf_checkpoint.check_declared_size(name, shape, dtypes[name], data_bytes,
                                      label)
    out[name] = shape
  return out


def _layers(variables, reader, model, rnn_size, num_layers, vocab_size, label):
  """The groups (Keras layouts) and chain of the model's variables."""
  cache = {}

  def raw(name):
    if name not in cache:
      try:
        cache[name] = np.asarray(reader.get_tensor(name), np.float32)
      except tf_checkpoint.READER_ERRORS as e:
        raise safe_io.fail(label, f"cannot read variable {show(name)} "
                           f"({tf_checkpoint.message(e)}); the checkpoint may "
                           "be truncated or corrupt") from None
      if cache[name].shape != variables[name]:
        raise safe_io.fail(label, f"{show(name)} read with shape "
                           f"{cache[name].shape}, declared {variables[name]}")
    return cache[name]

  def tensor(path, shape, role, fn):
    return contents.Tensor(path=path, shape=tuple(shape), role=role,
                           reader=fn)

  def expect(name, shape):
    found = variables.get(name)
    if found is None:
      raise safe_io.fail(label, f"no variable {show(name)} (found: "
                         f"{_list(variables)}); not a char-rnn-tensorflow "
                         "checkpoint of this config")
    if found != shape:
      raise safe_io.fail(label, f"{show(name)} has shape {found}, but "
                         f"config.pkl (rnn_size={rnn_size}, vocab_size="
                         f"{vocab_size}) says {shape}")
    return name

  used = set()
  embedding = expect("embedding", (vocab_size, rnn_size))
  softmax_w = expect("rnnlm/softmax_w", (rnn_size, vocab_size))
  softmax_b = expect("rnnlm/softmax_b", (vocab_size,))
  used.update((embedding, softmax_w, softmax_b))
  cells = collections.defaultdict(dict)
  for name in variables:
    match = _CELL_KEY.match(name)
    if match:
      cells[int(match.group(1))].setdefault(match.group(2), []).append(name)
  if sorted(cells) != list(range(num_layers)):
    raise safe_io.fail(label, f"config.pkl says num_layers={num_layers} but "
                       f"the checkpoint holds cells {sorted(cells) or 'none'} "
                       "under rnnlm/multi_rnn_cell")
  groups = [contents.Group(name="embedding", hint="embedding", tensors=[
      tensor(embedding, (vocab_size, rnn_size), "embeddings",
             lambda: raw(embedding))])]
  specs = [contents.LayerSpec("embedding", "embedding", "embedding", rnn_size,
                              input_dim=vocab_size)]
  cell_class = None
  for k in range(num_layers):
    scope = next(iter(cells[k])) if len(cells[k]) == 1 else None
    if scope not in CELLS:
      held = [name for names in cells[k].values() for name in names]
      raise safe_io.fail(label, f"cell_{k} holds {_list(held)}; rnnstep reads "
                         "model.py's cells LSTMCell, BasicLSTMCell, GRUCell "
                         "and BasicRNNCell")
    recipe, kind, cell_class = CELLS[scope]
    if recipe != model:
      raise safe_io.fail(label, f"config.pkl says model={show(model)} but "
                         f"cell_{k} is a {cell_class}")
    where = f"rnnlm/multi_rnn_cell/cell_{k}/{scope}"
    group, more = _cell_group(where, kind, rnn_size, variables, raw, tensor,
                              label)
    used.update(more)
    groups.append(group)
    specs.append(contents.LayerSpec(
        kind, where, where, rnn_size,
        reset_after=False if kind == "gru" else None))
  groups.append(contents.Group(name="rnnlm/softmax", hint="dense", tensors=[
      tensor(softmax_w, (rnn_size, vocab_size), "kernel",
             lambda: raw(softmax_w)),
      tensor(softmax_b, (vocab_size,), "bias", lambda: raw(softmax_b))]))
  specs.append(contents.LayerSpec("dense", "rnnlm/softmax", "rnnlm/softmax",
                                  vocab_size))
  unused = sorted(set(variables) - used)
  if unused:
    raise safe_io.fail(label, f"the checkpoint holds variables model.py does "
                       f"not make: {_list(unused)}")
  return groups, specs, cell_class


def _leaf(variables, where, names, shape, label):
  """The one of `where/<names>` present, its shape checked."""
  found = [f"{where}/{n}" for n in names if f"{where}/{n}" in variables]
  if len(found) != 1:
    raise safe_io.fail(label, f"expected one of {where}/"
                       f"{{{', '.join(names)}}}, found {len(found)}")
  if variables[found[0]] != shape:
    raise safe_io.fail(label, f"{show(found[0])} has shape "
                       f"{variables[found[0]]}, but config.pkl's rnn_size "
                       f"gives {shape}")
  return found[0]


def _cell_group(where, kind, units, variables, raw, tensor, label):
  """One TF1 cell's variables as a Keras layer (kernel, recurrent, bias)."""
  inputs = units  # model.py: the embedding and every cell are rnn_size wide.
  rows = inputs + units
  if kind == "gru":
    gates_w = _leaf(variables, f"{where}/gates", _KERNEL_NAMES,
                    (rows, 2 * units), label)
    gates_b = _leaf(variables, f"{where}/gates", _BIAS_NAMES, (2 * units,),
                    label)
    cand_w = _leaf(variables, f"{where}/candidate", _KERNEL_NAMES,
                   (rows, units), label)
    cand_b = _leaf(variables, f"{where}/candidate", _BIAS_NAMES, (units,),
                   label)

    def columns():  # Keras [z | r | h] = TF1 [u | r | c]
      gates = raw(gates_w)
      return np.concatenate([gates[:, units:], gates[:, :units],
                             raw(cand_w)], axis=1)

    def bias():
      gates = raw(gates_b)
      return np.concatenate([gates[units:], gates[:units], raw(cand_b)])
    used = (gates_w, gates_b, cand_w, cand_b)
    width = 3 * units
  else:
    gates = 4 if kind == "lstm" else 1
    width = gates * units
    kernel_name = _leaf(variables, where, _KERNEL_NAMES, (rows, width), label)
    bias_name = _leaf(variables, where, _BIAS_NAMES, (width,), label)
    used = (kernel_name, bias_name)
    order = _LSTM_BLOCKS if kind == "lstm" else (0,)

    def columns():
      kernel = raw(kernel_name)
      return np.concatenate([kernel[:, b * units:(b + 1) * units]
                             for b in order], axis=1)

    def bias():
      stored = raw(bias_name)
      blocks = [stored[b * units:(b + 1) * units] for b in order]
      if kind == "lstm":  # Keras block 1 is TF1's f: add forget_bias.
        blocks[1] = blocks[1] + np.float32(FORGET_BIAS)
      return np.concatenate(blocks)
  source = ", ".join(used)
  group = contents.Group(name=where, hint=kind, cell=True, tensors=[
      tensor(f"{source} (rows :{inputs})", (inputs, width), "kernel",
             lambda: columns()[:inputs]),
      tensor(f"{source} (rows {inputs}:)", (units, width), "recurrent_kernel",
             lambda: columns()[inputs:]),
      tensor(source, (width,), "bias", bias)])
  return group, used


def _list(names) -> str:
  names = sorted(names)
  shown = ", ".join(show(n) for n in names[:6])
  return shown + (f" ... ({len(names) - 6} more)" if len(names) > 6 else "")

