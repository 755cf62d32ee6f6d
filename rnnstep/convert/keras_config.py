"""Keras model configs (`config.json`, the `model_config` attribute), read as data.

A config is decoded as plain JSON and read through an allow-list: InputLayer,
Embedding, GRU/LSTM/SimpleRNN (the `kinds.KINDS` Keras classes), Dense, and
Dropout as the inference identity; a Functional graph must be one straight
chain. A TextVectorization layer may come first, on a string Input: its
built-in standardize and split and its vocabulary become the model's
(`text_vectorization`). A Sequential or Functional model used as a layer
(keras.io's end-to-end `Model(text, lm(vectorize(text)))`) is read in place,
its weights under its own path. Nothing is deserialized. Anything else -- Bidirectional or wrapped
layers, layers in between, activations other than tanh/sigmoid (a relu
SimpleRNN is its own kind, `kinds.with_activation`), go_backwards,
masking, custom or Lambda layers -- is refused with a message saying what was
found.
"""

import dataclasses
import json
from typing import Dict, List, Optional, Tuple

from rnnstep.convert.contents import ConfigChain
from rnnstep.convert.contents import KIND_NAMES
from rnnstep.convert.contents import LayerSpec
from rnnstep.convert.contents import ONE_HOT_NAME
from rnnstep.convert.contents import ONE_HOT_NOTE
from rnnstep.convert.contents import snake_case
from rnnstep.convert import safe_io
from rnnstep.convert.safe_io import show
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import vocabulary as vocabulary_lib

RECURRENT_CLASSES = kinds.BY_KERAS_CLASS
# Layers that hold no weights and are the identity at inference.
IDENTITY_CLASSES = ("Dropout",)
MODEL_CLASSES = ("Sequential", "Functional", "Model")
MAX_WINDOW = model_file.MAX_WINDOW


def parse_json(text, label, what: str):
  """Decodes JSON as plain data (dicts, lists, strings, numbers)."""
  if isinstance(text, (bytes, bytearray)):
    try:
      text = bytes(text).decode("utf-8")
    except UnicodeDecodeError:
      raise safe_io.fail(label, f"{what} is not UTF-8 text") from None
  try:
    return json.loads(text)
  except (json.JSONDecodeError, RecursionError) as e:
    raise safe_io.fail(label, f"{what} is not valid JSON ({e})") from None


def parse_model_config(data, label, what: str = "the model config") -> ConfigChain:
  """Reads a Keras 2 or Keras 3 model config as data, through an allow-list.

  Args:
    data: the decoded JSON of `config.json` or the `model_config` attribute.
    label: the file, for messages.
    what: how messages name the config.

  Returns:
    A ConfigChain; `specs` is None for a subclassed model (its config says
    nothing usable about its layers).

  Raises:
    ValueError: the config describes a model rnnstep cannot run exactly.
  """
  if not isinstance(data, dict):
    raise safe_io.fail(label, f"{what} is not a JSON object")
  class_name = data.get("class_name")
  if not isinstance(class_name, str):
    raise safe_io.fail(label, f"{what} has no class_name")
  if class_name not in MODEL_CLASSES:
    return ConfigChain(class_name, None, [
        f"subclassed model {show(class_name)}: its config lists no layers, so "
        "the layers were inferred from the stored weights' names and shapes "
        "(its call() is assumed to be Embedding -> recurrent -> Dense)"])
  notes = []
  ordered, paths, input_shape = _chain_entries(data, label, what, "", 0)
  vectorize = None
  if ordered and ordered[0]["class_name"] == TEXT_VECTORIZATION:
    vectorize = text_vectorization(ordered[0], paths[id(ordered[0])], label,
                                   notes)
    ordered = ordered[1:]
  specs = []
  for entry in ordered:
    spec = _layer_spec(entry, paths[id(entry)], label, notes)
    if spec is not None:
      specs.append(spec)
  if specs and specs[0].kind in kinds.KINDS:
    if vectorize is not None:
      raise safe_io.fail(label, f"{what}: the TextVectorization layer feeds "
                         "its ids to a recurrent layer without an Embedding; "
                         "rnnstep maps TextVectorization -> Embedding -> "
                         "GRU/LSTM/SimpleRNN layer(s) -> Dense")
    specs.insert(0, _one_hot_input(specs[0], input_shape, label, notes))
  _check_chain(specs, label, notes)
  if vectorize is not None:
    _check_stateful_text(ordered, label)
    window = None
  else:
    window = _window(ordered, input_shape, label, notes)
  return ConfigChain(class_name, specs, notes, window=window,
                     text_vectorization=vectorize)


TEXT_VECTORIZATION = "TextVectorization"
# How deep models may nest (a model used as a layer of another: keras.io's
# end-to-end `Model(text, lm(vectorize(text)))`).
MAX_NESTING = 2


def _chain_entries(data, label, what, prefix: str, depth: int):
  """A Sequential or Functional config's layers in chain order, its nested
  models' layers in their place.

  Args:
    data: the model's config entry ({"class_name", "config"}).
    label, what: for messages.
    prefix: the weights path of the model ("" at the top, else
      "<its path>/"); its layers' paths are `<prefix>layers/<snake>[_N]`.
    depth: how deep this model is nested.

  Returns:
    `(ordered entries, {id(entry): weights path}, input batch shape)`.
  """
  class_name = data["class_name"]
  config = data.get("config")
  _check_builtin(data, label, what)
  if not isinstance(config, dict) or not isinstance(config.get("layers"), list):
    raise safe_io.fail(label, f"{what}: {class_name} config has no layer list")
  layers = config["layers"]
  if len(layers) > 4 * model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{what} lists {len(layers)} layers, too many")
  entries = [_layer_entry(entry, i, label) for i, entry in enumerate(layers)]
  _refuse_layers_off_the_stack(entries, label, what)
  if class_name == "Sequential":
    ordered = [e for e in entries if e["class_name"] != "InputLayer"]
    if len(ordered) + 1 < len(entries):
      raise safe_io.fail(label, f"{what}: Sequential model with more than one "
                         "InputLayer")
  else:
    ordered = _functional_chain(config, entries, label, what)
  input_shape = _input_shape(data, entries, label)
  counters: Dict[str, int] = {}
  paths = {}
  for entry in entries:  # Keras 3 numbers paths per class, over all layers.
    snake = snake_case(entry["class_name"])
    count = counters.get(snake, 0)
    counters[snake] = count + 1
    paths[id(entry)] = f"{prefix}layers/{snake}" + (f"_{count}" if count
                                                     else "")
  flat = []
  for entry in ordered:
    if entry["class_name"] not in MODEL_CLASSES:
      flat.append(entry)
      continue
    if depth + 1 >= MAX_NESTING:
      raise safe_io.fail(label, f"{what}: models nested more than "
                         f"{MAX_NESTING} deep")
    inner, inner_paths, _ = _chain_entries(
        entry["raw"], label, f"{what} (in model {show(entry['name'])})",
        paths[id(entry)] + "/", depth + 1)
    flat.extend(inner)
    paths.update(inner_paths)
  return flat, paths, input_shape


def text_vectorization(entry, path, label, notes) -> dict:
  """A TextVectorization layer's settings, through an allow-list.

  Its built-in `standardize` and `split` (`vocabulary.TEXT_VECTORIZATION`),
  `output_mode="int"`, no `ngrams`, UTF-8; the vocabulary from its config
  (given at construction) or, None here, from the archive's assets.

  Returns:
    {"name", "path", "standardize", "split", "vocabulary" (a list, or None),
    "vocabulary_size" (int or None)}.

  Raises:
    ValueError: a setting rnnstep cannot compute exactly, or a custom
      (callable) standardize or split: one line naming it.
  """
  _check_builtin(entry["raw"], label, "the model config")
  cfg, name = entry["config"], entry["name"]
  where = f"layer {show(name)} (TextVectorization)"
  settings = {}
  for key, default in (("standardize", "lower_and_strip_punctuation"),
                       ("split", "whitespace")):
    value = cfg.get(key, default)
    allowed = vocabulary_lib.TEXT_VECTORIZATION[key]
    if not isinstance(value, (str, type(None))):
      raise safe_io.fail(label, f"{where} has a custom {key} function "
                         f"({show(value, 80)}); rnnstep never runs code from "
                         f"a file and computes only the built-in {key} "
                         f"values {', '.join(map(repr, allowed))}")
    if value not in allowed:
      raise safe_io.fail(label, f"{where} has {key}={show(value)}; rnnstep "
                         f"computes {', '.join(map(repr, allowed))}")
    settings[key] = value
  for key, wanted in (("ngrams", None), ("output_mode", "int"),
                      ("encoding", "utf-8"), ("idf_weights", None)):
    value = cfg.get(key, wanted)
    if value != wanted:
      raise safe_io.fail(label, f"{where} has {key}={show(value)}; a language "
                         f"model's TextVectorization needs {key}="
                         f"{wanted!r}")
  vocabulary = cfg.get("vocabulary")
  if isinstance(vocabulary, str):
    raise safe_io.fail(label, f"{where} names the vocabulary file "
                       f"{show(vocabulary)}, outside the archive; rnnstep "
                       "reads only what the .keras file holds")
  if vocabulary is not None and (
      not isinstance(vocabulary, list) or len(vocabulary) > model_file.MAX_VOCAB
      or not all(isinstance(t, str) for t in vocabulary)):
    raise safe_io.fail(label, f"{where} has a vocabulary that is not a list of "
                       "strings")
  size = cfg.get("vocabulary_size")
  if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
    raise safe_io.fail(label, f"{where} has vocabulary_size={show(size)}")
  length = cfg.get("output_sequence_length")
  if length is not None:
    notes.append(f"{where} pads or cuts its output to {show(length)} tokens; "
                 "rnnstep reads the whole text, a token a step")
  notes.append(f"{where}: standardize={settings['standardize']!r}, "
               f"split={settings['split']!r}; its vocabulary is the model's "
               "(no corpus or vocab needed)")
  return dict(name=name, path=path, vocabulary=vocabulary,
              vocabulary_size=size, **settings)


def _check_stateful_text(ordered, label):
  """A TextVectorization model is stepped over its tokens: its last
  recurrent layer must return every step's output."""
  recurrent = [e for e in ordered if e["class_name"] in RECURRENT_CLASSES]
  last = recurrent[-1]
  where = f"layer {show(last['name'])} ({last['class_name']})"
  if not _get(last["config"], "return_sequences", bool, False, label, where):
    raise safe_io.fail(label, f"{where} has return_sequences=False behind a "
                       "TextVectorization layer, which pads a text after its "
                       "end to a fixed length; rnnstep steps a model over "
                       "the text's own tokens (build it with "
                       "return_sequences=True)")


def _one_hot_input(first: LayerSpec, input_shape, label, notes) -> LayerSpec:
  """The identity Embedding(V, V) standing for a one-hot input [T, V]."""
  where = f"{KIND_NAMES[first.kind]} {show(first.name)}"
  width = input_shape[-1] if input_shape and len(input_shape) == 3 else None
  if not isinstance(width, int) or isinstance(width, bool) or not (
      0 < width <= model_file.MAX_VOCAB):
    raise safe_io.fail(label, f"the first layer, {where}, has no Embedding in "
                       f"front of it and its input shape is "
                       f"{show(input_shape)}, not one-hot vectors [batch, T, "
                       "V]; rnnstep maps Embedding -> GRU/LSTM/SimpleRNN "
                       "layer(s) -> Dense, or one-hot inputs to the first "
                       "recurrent layer")
  notes.append(ONE_HOT_NOTE.format(width))
  return LayerSpec("embedding", ONE_HOT_NAME, ONE_HOT_NAME,
                   units=width, input_dim=width, one_hot=True)


def _input_shape(data, entries, label):
  """The model's input batch shape, [batch, T, ...] (None where the config
  does not say): the InputLayer's `batch_shape` (Keras 3) or
  `batch_input_shape` (Keras 2), the first layer's `batch_input_shape`, or the
  model's `build_config`."""
  candidates = []
  for entry in entries[:2]:
    cfg = entry["config"]
    candidates += [cfg.get("batch_shape"), cfg.get("batch_input_shape")]
  build = data.get("build_config")
  if isinstance(build, dict):
    candidates.append(build.get("input_shape"))
  for shape in candidates:
    if isinstance(shape, list) and 1 <= len(shape) <= 8 and all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
        for d in shape):
      return shape
    if shape is not None:
      raise safe_io.fail(label, f"the model's input shape {show(shape)} is "
                         "unreadable")
  return None


def _window(ordered, input_shape, label, notes) -> Optional[int]:
  """T for a model built for fixed windows: its input fixes T timesteps and
  its last recurrent layer returns only its last output
  (return_sequences=False), as it was trained and sampled (e.g. the keras.io
  character-level LSTM example); else None."""
  recurrent = [e for e in ordered if e["class_name"] in RECURRENT_CLASSES
               or e["class_name"] == "Bidirectional"]
  if not recurrent:
    return None
  last = recurrent[-1]
  where = f"layer {show(last['name'])} ({last['class_name']})"
  last_config = last["config"]
  if last["class_name"] == "Bidirectional":  # Its wrapped layer's setting.
    last_config = _wrapped(last, label)["config"]
  if _get(last_config, "return_sequences", bool, False, label, where):
    if last["class_name"] == "Bidirectional":
      raise safe_io.fail(label, f"{where} returns sequences: its backward "
                         "layer reads each text from its end, so rnnstep "
                         "runs a bidirectional model only over fixed windows "
                         "(return_sequences=False on its last layer)")
    return None
  steps = input_shape[1] if input_shape and len(input_shape) >= 2 else None
  if not steps or steps > MAX_WINDOW:
    if last["class_name"] == "Bidirectional":
      raise safe_io.fail(label, f"{where}: the model's input fixes no window "
                         "length, and a bidirectional model is run over "
                         "fixed windows (give the Input or the Embedding "
                         "its length, e.g. input_length=max_len-1)")
    notes.append(f"{where} has return_sequences=False but the input fixes no "
                 "window length; rnnstep steps it statefully")
    return None
  notes.append(f"built for windows of {steps} characters (the input fixes "
               f"{steps} timesteps; {where} has return_sequences=False): "
               f"recorded as window={steps}")
  return steps


STACK_CLASSES = ("InputLayer", "Embedding", "Dense", *RECURRENT_CLASSES,
                 "Bidirectional", *IDENTITY_CLASSES, "TextVectorization",
                 *MODEL_CLASSES)
# Classes `_layer_spec` refuses with a message of its own.
_EXPLAINED_CLASSES = ("Lambda", "TimeDistributed", "RNN",
                      "CuDNNGRU", "CuDNNLSTM", "ConvLSTM1D", "StackedRNNCells")


def _wrapped(entry, label) -> dict:
  """A Bidirectional layer's wrapped recurrent layer, as a layer entry.

  Raises:
    ValueError: a merge_mode other than "concat", a wrapped layer that is
      not GRU/LSTM/SimpleRNN, or a backward layer of its own.
  """
  cfg, name = entry["config"], entry["name"]
  where = f"layer {show(name)} (Bidirectional)"
  merge_mode = cfg.get("merge_mode", "concat")
  if merge_mode != "concat":
    raise safe_io.fail(label, f"{where} has merge_mode={show(merge_mode)}; "
                       "rnnstep runs merge_mode='concat' (the default)")
  inner = cfg.get("layer")
  if not isinstance(inner, dict) or inner.get("class_name") not in (
      RECURRENT_CLASSES):
    found = inner.get("class_name") if isinstance(inner, dict) else inner
    raise safe_io.fail(label, f"{where} wraps {show(found, 60)}; rnnstep "
                       "runs a Bidirectional GRU, LSTM or SimpleRNN")
  wrapped = _layer_entry(inner, 0, label)
  _check_builtin(inner, label, "the model config")
  return wrapped


def _check_backward(entry, forward: LayerSpec, label, notes) -> None:
  """A Bidirectional layer's `backward_layer` (Keras 3 always records it)
  must be the forward layer's copy, reading backwards: the same class and
  settings, `go_backwards=True`."""
  backward = entry["config"].get("backward_layer")
  if backward is None:
    return
  where = f"layer {show(entry['name'])} (Bidirectional)"
  if not isinstance(backward, dict) or not isinstance(
      backward.get("config"), dict):
    raise safe_io.fail(label, f"{where} has an unreadable backward_layer")
  if backward["config"].get("go_backwards") is not True:
    raise safe_io.fail(label, f"{where}: its backward_layer does not have "
                       "go_backwards=True")
  reading_forward = dict(backward, config=dict(backward["config"],
                                               go_backwards=False))
  spec = _layer_spec(_layer_entry(reading_forward, 0, label), forward.path,
                     label, [])
  settings = lambda s: (s.kind, s.units, s.use_bias, s.reset_after)
  if spec is None or settings(spec) != settings(forward):
    raise safe_io.fail(label, f"{where} has a backward_layer unlike its "
                       "forward layer; rnnstep runs a copy of the forward "
                       "layer backwards")


def _refuse_layers_off_the_stack(entries, label, what):
  """Names every layer that is not part of a step-wise stack, before the
  graph's shape is checked: the real blocker (e.g. textgenrnn's
  AttentionWeightedAverage over a Concatenate of its LSTMs) comes first."""
  off = [e for e in entries if e["class_name"] not in STACK_CLASSES]
  if not off or any(e["class_name"] in _EXPLAINED_CLASSES for e in off):
    return
  shown = ", ".join(f"{show(e['name'])} ({show(e['class_name'], 60)})"
                    for e in off[:6]) + (" ..." if len(off) > 6 else "")
  raise safe_io.fail(label, f"{what}: layer{'s' if len(off) > 1 else ''} "
                     f"{shown} cannot be mapped: the model is not a step-wise "
                     "stack; rnnstep maps Embedding (or one-hot inputs) -> "
                     "GRU/LSTM/SimpleRNN layer(s) -> Dense, with Dropout "
                     "ignored")


def _check_builtin(entry, label, what):
  """Refuses classes that a config marks as custom (user code)."""
  module = entry.get("module")
  registered = entry.get("registered_name")
  class_name = entry.get("class_name")
  if module is not None and (not isinstance(module, str) or not (
      module == "keras" or module.startswith(("keras.", "tf_keras.")))):
    raise safe_io.fail(label, f"{what}: {show(class_name)} comes from module "
                       f"{show(module)}, not Keras; refusing custom classes")
  if registered is not None and registered != class_name and not (
      class_name in MODEL_CLASSES and registered in MODEL_CLASSES):
    raise safe_io.fail(label, f"{what}: {show(class_name)} is registered as "
                       f"custom class {show(registered)}; refusing custom "
                       "classes")


def _layer_entry(entry, index, label) -> dict:
  if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
    raise safe_io.fail(label, f"model config layer {index} has no class_name")
  config = entry.get("config")
  if not isinstance(config, dict):
    raise safe_io.fail(label, f"model config layer {index} "
                       f"({show(entry['class_name'])}) has no config object")
  name = entry.get("name", config.get("name"))
  if not isinstance(name, str) or not name:
    raise safe_io.fail(label, f"model config layer {index} has no name")
  return {"class_name": entry["class_name"], "config": config, "name": name,
          "raw": entry}


def _layer_spec(entry, path, label, notes) -> Optional[LayerSpec]:
  """An allow-listed LayerSpec, None for an identity layer; refuses the rest."""
  cls = entry["class_name"]
  cfg = entry["config"]
  name = entry["name"]
  where = f"layer {show(name)} ({cls})"
  if cls == "Lambda":
    raise safe_io.fail(label, f"{where}: a Lambda layer holds arbitrary Python "
                       "code; rnnstep never runs code from a file and cannot "
                       "map it")
  if cls == "Bidirectional":
    # A copy of the wrapped layer reads the window backwards: the model is
    # recomputed over its window at each token (`engine/recompute.py`).
    _check_builtin(entry["raw"], label, "the model config")
    spec = _layer_spec(_wrapped(entry, label), path, label, notes)
    _check_backward(entry, spec, label, notes)
    return dataclasses.replace(spec, name=name, bidirectional=True)
  if cls in ("TimeDistributed", "RNN", "CuDNNGRU", "CuDNNLSTM", "ConvLSTM1D",
             "StackedRNNCells"):
    raise safe_io.fail(label, f"{where} cannot be mapped; rnnstep maps "
                       "Embedding -> GRU/LSTM/SimpleRNN -> Dense")
  if cls == TEXT_VECTORIZATION:
    raise safe_io.fail(label, f"{where} is not the first layer after the "
                       "string Input; rnnstep maps TextVectorization -> "
                       "Embedding -> GRU/LSTM/SimpleRNN layer(s) -> Dense")
  if cls in IDENTITY_CLASSES:
    _check_builtin(entry["raw"], label, "the model config")
    notes.append(f"{cls} layer {show(name)} ignored (the identity at inference)")
    return None
  if cls != "Embedding" and cls != "Dense" and cls not in RECURRENT_CLASSES:
    raise safe_io.fail(label, f"{where} cannot be mapped: rnnstep maps "
                       "Embedding -> GRU/LSTM/SimpleRNN layers -> Dense only")
  _check_builtin(entry["raw"], label, "the model config")
  for key in ("lora_rank",):
    if cfg.get(key):
      raise safe_io.fail(label, f"{where} has {key}={cfg[key]!r}; LoRA layers "
                         "are not supported")
  if cfg.get("quantization_config") is not None or cfg.get("dtype") in (
      "int8", "int4", "float8"):
    raise safe_io.fail(label, f"{where} is quantized; not supported")
  _note_dtype(cfg, where, notes)
  if cls == "Embedding":
    if _get(cfg, "mask_zero", bool, False, label, where):
      raise safe_io.fail(label, f"{where} has mask_zero=True: id 0 would skip "
                         "timesteps, which rnnstep does not implement")
    return LayerSpec("embedding", name, path,
                     units=_get(cfg, "output_dim", int, None, label, where),
                     input_dim=_get(cfg, "input_dim", int, None, label, where))
  if cls == "Dense":
    # Checked in `_check_chain`: the output layer's must be linear or
    # softmax, a head layer's one of `model_file.DENSE_ACTIVATIONS`.
    activation = _get(cfg, "activation", str, "linear", label, where)
    return LayerSpec("dense", name, path,
                     units=_get(cfg, "units", int, None, label, where),
                     use_bias=_get(cfg, "use_bias", bool, True, label, where),
                     activation=activation)
  kind = RECURRENT_CLASSES[cls]
  activation = _get(cfg, "activation", str, "tanh", label, where)
  try:  # An activation variant is its own kind (`kinds.with_activation`).
    kind = kinds.with_activation(kind, activation).name
  except ValueError as e:
    raise safe_io.fail(label, f"{where} has activation {show(activation)}; "
                       f"{e}") from None
  if kinds.KINDS[kind].gates > 1:  # Gates use the recurrent activation.
    recurrent_activation = _get(cfg, "recurrent_activation", str, "sigmoid",
                                label, where)
    if recurrent_activation == "hard_sigmoid":
      raise safe_io.fail(label, f"{where} has recurrent_activation "
                         "'hard_sigmoid' (old Keras default; Keras 2 and 3 "
                         "even compute it differently); rnnstep implements "
                         "sigmoid only")
    if recurrent_activation != "sigmoid":
      raise safe_io.fail(label, f"{where} has recurrent_activation "
                         f"{show(recurrent_activation)}; rnnstep implements "
                         "sigmoid only")
  for flag, why in (("go_backwards", "it reads the text backwards"),
                    ("time_major", "time-major inputs are not supported")):
    if _get(cfg, flag, bool, False, label, where):
      raise safe_io.fail(label, f"{where} has {flag}=True: {why}")
  if _get(cfg, "stateful", bool, False, label, where):
    notes.append(f"{where} is stateful; its saved state is not in the file, "
                 "rnnstep starts from zeros and carries the state itself")
  reset_after = None
  if kinds.KINDS[kind].has_reset_after:
    reset_after = _get(cfg, "reset_after", bool, None, label, where)
  return LayerSpec(kind, name, path,
                   units=_get(cfg, "units", int, None, label, where),
                   use_bias=_get(cfg, "use_bias", bool, True, label, where),
                   reset_after=reset_after)


def _note_dtype(cfg, where, notes):
  dtype = cfg.get("dtype")
  name = dtype
  if isinstance(dtype, dict):
    inner = dtype.get("config")
    name = inner.get("name") if isinstance(inner, dict) else None
  if isinstance(name, str) and name not in ("float32", "float64"):
    notes.append(f"{where} computed in {show(name)} under Keras; rnnstep "
                 "computes in float32 unless told otherwise")


_MISSING = object()


def _get(cfg, key, kind, default, label, where):
  value = cfg.get(key, _MISSING)
  if value is _MISSING or (value is None and default is not None):
    if default is None and kind is not bool:
      raise safe_io.fail(label, f"{where} has no {key} in its config")
    return default
  if kind is int:
    ok = isinstance(value, int) and not isinstance(value, bool) and (
        0 < value <= max(model_file.MAX_UNITS, model_file.MAX_VOCAB))
  elif kind is bool:
    ok = isinstance(value, bool) or (value is None and default is None)
  else:
    ok = isinstance(value, kind)
  if not ok:
    raise safe_io.fail(label, f"{where} has {key}={show(value)}, which rnnstep "
                       "cannot use")
  return value


def _functional_chain(config, entries, label, what) -> List[dict]:
  """Checks a Functional graph is one straight chain; returns it in order."""
  by_name = {}
  for entry in entries:
    if entry["name"] in by_name:
      raise safe_io.fail(label, f"{what} has two layers named "
                         f"{show(entry['name'])}")
    by_name[entry["name"]] = entry
  inputs = [e for e in entries if e["class_name"] == "InputLayer"]
  if len(inputs) != 1:
    raise safe_io.fail(label, f"{what}: a Functional model with {len(inputs)} "
                       "inputs; rnnstep maps a single input of ids")
  previous = inputs[0]["name"]
  chain = []
  for entry in entries:
    if entry is inputs[0]:
      continue
    sources = _inbound_sources(entry, label)
    if sources != [(previous, 0)]:
      found = ", ".join(f"{show(n)}[{i}]" for n, i in sources) or "nothing"
      raise safe_io.fail(label, f"{what}: layer {show(entry['name'])} takes "
                         f"{found}, not the output of {show(previous)}; only a "
                         "straight chain Embedding -> recurrent -> Dense can be "
                         "mapped")
    chain.append(entry)
    previous = entry["name"]
  outputs = _output_refs(config.get("output_layers"))
  if (previous, 0) not in outputs:
    raise safe_io.fail(label, f"{what}: the model's outputs do not include the "
                       f"last layer {show(previous)}")
  return chain


def _inbound_sources(entry, label) -> List[Tuple[str, int]]:
  """The (layer name, tensor index) pairs a Functional layer consumes."""
  nodes = entry["raw"].get("inbound_nodes")
  name = show(entry["name"])
  if not isinstance(nodes, list) or len(nodes) != 1:
    count = len(nodes) if isinstance(nodes, list) else 0
    raise safe_io.fail(label, f"layer {name} is called {count} times in the "
                       "model graph; only a straight chain can be mapped")
  node = nodes[0]
  refs = []
  if isinstance(node, dict):  # Keras 3: {"args": [...], "kwargs": {...}}
    _keras_history(node.get("args"), refs, 0)
    kwarg_refs = []
    _keras_history(node.get("kwargs"), kwarg_refs, 0)
    if kwarg_refs:
      raise safe_io.fail(label, f"layer {name} gets extra tensors (e.g. an "
                         "initial_state) from the graph; cannot be mapped")
  elif isinstance(node, list):  # Keras 2: [[name, node_index, tensor_index, kw]]
    for item in node:
      if (not isinstance(item, list) or len(item) < 3
          or not isinstance(item[0], str) or not isinstance(item[2], int)):
        raise safe_io.fail(label, f"layer {name} has unreadable inbound_nodes")
      if len(item) > 3 and item[3] and any(
          isinstance(v, (list, dict)) for v in item[3].values()
          if isinstance(item[3], dict)):
        raise safe_io.fail(label, f"layer {name} gets extra tensors (e.g. an "
                           "initial_state) from the graph; cannot be mapped")
      refs.append((item[0], item[2]))
  else:
    raise safe_io.fail(label, f"layer {name} has unreadable inbound_nodes")
  return refs


def _keras_history(value, refs, depth):
  if depth > 20:
    return
  if isinstance(value, dict):
    history = value.get("keras_history") if isinstance(
        value.get("keras_history"), list) else None
    if history is None and isinstance(value.get("config"), dict):
      history = value["config"].get("keras_history")
    if isinstance(history, list) and len(history) == 3 and isinstance(
        history[0], str) and isinstance(history[2], int):
      refs.append((history[0], history[2]))
      return
    for item in value.values():
      _keras_history(item, refs, depth + 1)
  elif isinstance(value, list):
    for item in value:
      _keras_history(item, refs, depth + 1)


def _output_refs(value) -> List[Tuple[str, int]]:
  if (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
      and isinstance(value[2], int)):
    return [(value[0], value[2])]
  if isinstance(value, list):
    return [ref for item in value for ref in _output_refs(item)]
  return []


def _check_chain(specs: List[LayerSpec], label, notes):
  kinds = [s.kind for s in specs]
  described = " -> ".join(f"{KIND_NAMES[s.kind]} {show(s.name)}" for s in specs)
  # Embedding, recurrent layers, then Dense layers: a head, and the output.
  recurrent_end = next((i for i, k in enumerate(kinds) if k == "dense"),
                       len(kinds))
  if (len(specs) < 3 or kinds[0] != "embedding" or kinds[-1] != "dense"
      or recurrent_end < 2
      or any(k in ("embedding", "dense") for k in kinds[1:recurrent_end])
      or any(k != "dense" for k in kinds[recurrent_end:])):
    raise safe_io.fail(label, f"the model is {described or 'empty'}; rnnstep "
                       "maps Embedding -> GRU/LSTM/SimpleRNN layer(s) -> "
                       "Dense layer(s)")
  if len(specs) - 1 - recurrent_end > model_file.MAX_HEAD:
    raise safe_io.fail(label, f"{len(specs) - 1 - recurrent_end} Dense layers "
                       f"before the output, more than {model_file.MAX_HEAD}")
  for spec in specs[recurrent_end:-1]:
    if spec.activation not in model_file.DENSE_ACTIVATIONS:
      raise safe_io.fail(label, f"layer {show(spec.name)} (Dense) has "
                         f"activation {show(spec.activation)}; rnnstep "
                         "computes Keras's "
                         f"{', '.join(model_file.DENSE_ACTIVATIONS)}")
  output = specs[-1]
  where = f"layer {show(output.name)} (Dense)"
  if output.activation == "softmax":
    notes.append(f"{where}: softmax dropped; rnnstep works on the logits "
                 "(sampling probabilities are unchanged)")
  elif output.activation != "linear":
    raise safe_io.fail(label, f"{where} has activation "
                       f"{show(output.activation)}; the output layer must be "
                       "linear (logits) or softmax")
  if len(specs) - 2 > model_file.MAX_LAYERS:
    raise safe_io.fail(label, f"{len(specs) - 2} recurrent layers, more than "
                       f"{model_file.MAX_LAYERS}")
