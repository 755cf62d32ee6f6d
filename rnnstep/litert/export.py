"""LiteRT (TFLite) export: a whole batch generation in one interpreter call.

`export_litert(model, export_dir)` writes

  export_dir/model.tflite   one signature, "generate": the prompts as
      right-padded ids, num_steps, an int32 seed, every decoding option of
      `rnnstep.generate`, beams included (per-row ones [B], or [1] for
      every row), the stop automaton and the regex DFA as tables ->
      ids int32 [N, num_steps], lengths int32 [N] (N: B rows, or B x k
      with k beams) (`rnnstep.litert.inputs`: the inputs, their "off" values, and
      the tables built on the host with numpy)
  export_dir/vocab.json     the characters (or tokens) in id order (a JSON
                            list)
  export_dir/tokens.json    a token model's vocabulary with its kind and
                            rules (`Tokens.file_json`), what a client
                            tokenizes by; a subword model's also in
  export_dir/tokenizer.json (its Hugging Face `tokenizers` file)

The flatbuffer holds only builtin LiteRT ops (no TF "Flex" ops), so the plain
`ai_edge_litert` interpreter runs it, with no TensorFlow installed. One
flatbuffer serves every request: an option at its "off" value costs nothing
a step (the library's plain tail runs, as in `rnnstep.generate`).

The loop is the library's (`loop.run_decode` over `pipeline.tails`: the same
options in the same order; `beams.search` for num_beams > 1), with two
changes for the converter:

  - prime: `loop.prime` stepwise, a while loop over the prompt columns, each
    row's state advanced only while the column is before its last character
    (masked, as generation's priming is), not layer by layer; RWKV-7's over
    chunks of `request.STEPWISE_PRIME_CHUNK` columns, each block's products
    over a chunk's rows at once and its state update unrolled
    (`RWKV7Cell.for_litert_converter`);
  - the ids go into a `[num_steps, B]` tensor written by a dynamic update
    slice (`SliceBuffer`), not a TensorArray, whose TensorList ops need Flex.

A graph cannot compile stop strings or a regular expression, so the stop
automaton and the regex DFA are inputs (`litert_inputs.build` makes them as
`rnnstep.generate` does). Row i of a call uses the noise key (seed, i), as
`rnnstep.generate(..., seed=seed)` does, so the two give the same text
(greedy: the same text as Keras). The seed is int32, not int64: LiteRT has no
int64 bitwise ops to split a 64-bit seed (see `row_keys`). With num_beams
k > 1 the call is `engine/beams.py`'s search instead (a conditional in the
flatbuffer), and each prompt's k hypotheses come back as k rows, best first.

Only float32 models are exported: LiteRT has no bfloat16 matmul, so a model
loaded with dtype bfloat16/float16 is refused rather than silently changed.
"""

import contextlib
import json
import os
import tempfile
from typing import NamedTuple

import tensorflow as tf
# XlaDynamicUpdateSlice, which the converter maps to LiteRT's builtin
# DYNAMIC_UPDATE_SLICE (tf.raw_ops does not export it).
from tensorflow.compiler.tf2xla.python import xla  # pylint: disable=g-direct-tensorflow-import

from rnnstep.decoding import constraints
from rnnstep.decoding import options
from rnnstep.decoding import pipeline
from rnnstep.decoding import processors
from rnnstep.decoding import sampling
from rnnstep.decoding import stopping
from rnnstep.engine import beams
from rnnstep.engine import loop
from rnnstep.engine import request as request_lib
from rnnstep import errors
from rnnstep.litert import inputs as litert_inputs
from rnnstep.litert import int8_products
from rnnstep import staging
from rnnstep.model import int8_arithmetic
from rnnstep.model import rwkv7
from rnnstep.model.check import check_model
from rnnstep.model import vocabulary

SIGNATURE = litert_inputs.SIGNATURE
MODEL_FILE = "model.tflite"
# In `save_generation`'s SavedModel of an int8 model: its products are to
# be XNNPACK's int8 ones (`int8_products.rewrite`).
INT8_PRODUCTS_MARK = "rnnstep_int8_products"
VOCAB_FILE = "vocab.json"
TOKENS_FILE = vocabulary.Tokens.TOKENS_FILE
TOKENIZER_FILE = vocabulary.Tokens.TOKENIZER_FILE


def _spec(declared: litert_inputs.Input) -> tf.TensorSpec:
  shape = [None if d in (None, litert_inputs.ROWS) else d
           for d in declared.shape]
  return tf.TensorSpec(shape, tf.as_dtype(declared.dtype), name=declared.name)


INPUT_SIGNATURE = [_spec(declared) for declared in litert_inputs.INPUTS]


class SliceBuffer(NamedTuple):
  """The decode loop's ids, `[C, B]`, with no TensorList ops: step t's row
  is written by a dynamic update slice (`loop.run_decode`'s `ids_buffer`).

  LiteRT's builtin DYNAMIC_UPDATE_SLICE is 13-20% faster than
  `tensor_scatter_nd_update` (SCATTER_ND + SELECT) at B=1 x 5000 and B=64 x
  500 steps. It has TF kernels only under XLA: the loop is for the
  converter, not to be called in TensorFlow.
  """
  ids: tf.Tensor
  capacity: tf.Tensor

  @classmethod
  def make(cls, capacity, batch) -> "SliceBuffer":
    # At least one row: the interpreter prepares the loop's update of a
    # [1, B] row even for zero steps, and refuses it into a [0, B] buffer.
    return cls(tf.zeros([tf.maximum(capacity, 1), batch], tf.int32),
               capacity)

  def write(self, step, chosen) -> "SliceBuffer":
    return self._replace(ids=xla.dynamic_update_slice(
        self.ids, chosen[None, :], tf.stack([step, 0])))

  def stack(self) -> tf.Tensor:
    return self.ids[:self.capacity]


class GenerateModule(tf.Module):
  """The exported computation: the model's weights and the `generate` function.

  Args:
    model: a float32 `rnnstep.Model`.
  """

  def __init__(self, model):
    super().__init__(name="rnnstep_litert")
    self.model = model

  @tf.function(autograph=False, input_signature=INPUT_SIGNATURE)
  def generate(self, *inputs):
    """Continues each prompt by up to `num_steps` ids (see the module doc)."""
    values = dict(zip((i.name for i in litert_inputs.INPUTS), inputs))
    network = self.model.network()
    for cell in network.cells:  # See `RWKV7Cell.blocks_sliced_in_step`.
      if isinstance(cell, rwkv7.RWKV7Cell):
        cell.for_litert_converter = True
    prompt_ids = values["prompt_ids"]
    batch = tf.shape(prompt_ids)[0]
    width = tf.shape(prompt_ids)[1]
    # Out-of-range lengths are clamped (the interpreter has no assertions): an
    # empty row primes nothing and starts from its first column.
    lengths = tf.clip_by_value(values["prompt_lengths"], 1, width)
    prompts = request_lib.Prompts(prompt_ids, lengths)
    steps = tf.maximum(values["num_steps"], 0)

    def rows(value):  # [1] or [B] -> [B].
      return tf.broadcast_to(value, [batch])

    params = sampling.Params(*[rows(values[o.name]) for o in options.PER_ROW])
    settings = processors.Settings(values["repetition_window"],
                                   values["no_repeat_ngram_size"], 1)
    looks_back = pipeline.looks_back(
        pipeline.active(params, settings, network.vocab_size))
    # The history holds the prompt and every step (no XLA bucket here).
    settings = settings._replace(
        history_length=tf.where(looks_back, width + steps, 1))
    seed = tf.fill([batch], values["seed"])
    index = tf.range(batch)
    request = request_lib.Request(
        prompts=prompts, initial_state=(), sampling=params,
        seeds=request_lib.Seeds(seed, index),
        stops=stopping.Automaton(values["stop_table"], values["stop_accept"]),
        lookback=settings,
        beams=request_lib.Beams(tf.constant(1), tf.constant(1.0)),
        want_scores=tf.constant(False), num_steps=steps, capacity=steps,
        constraint=constraints.Dfa(values["regex_table"],
                                   values["regex_ends"],
                                   rows(values["regex_start"])))
    primed = loop.prime(network, prompts, unconsumed=1, stepwise=True)
    num_beams = values["num_beams"]

    def sample():
      carry = loop.start_carry(network, request, 1, state=primed)
      result = loop.run_decode(network, request, carry, chooses_first=False,
                               keys=row_keys(seed, index),
                               ids_buffer=SliceBuffer.make)
      return result.ids, result.lengths

    def beam_search():
      # Each prompt's k hypotheses as k rows, best first.
      best = beams.search(network, request._replace(beams=request_lib.Beams(
          num_beams, values["length_penalty"])), primed=primed)
      rows_out = batch * num_beams  # Not -1: zero steps leave no size.
      return (tf.reshape(best.ids, [rows_out, steps]),
              tf.reshape(best.lengths, [rows_out]))

    ids, lengths = tf.cond(num_beams > 1, beam_search, sample)
    # An output made by a control-flow op (the cond's IF) never reaches the
    # caller's buffers in LiteRT's CompiledModel (`runner.pack_weights`'
    # path), which reallocates it: lengths leave through an op of their own
    # (they are at most `steps` already).
    lengths = tf.minimum(lengths, steps)
    ids = tf.where(tf.range(steps)[None, :] < lengths[:, None], ids, 0)
    return {"ids": ids, "lengths": lengths}


def signature_text() -> str:
  """The `generate` signature as one line: 'generate(name: dtype[dims], ...)'."""
  def spec(declared):
    dims = "".join(f"[{'?' if d in (None, litert_inputs.ROWS) else d}]"
                   for d in declared.shape)
    return f"{declared.name}: {declared.dtype}{dims}"
  return (f"{SIGNATURE}({', '.join(map(spec, litert_inputs.INPUTS))}) -> "
          f"{', '.join(map(spec, litert_inputs.OUTPUTS))}")


def row_keys(seeds, index):
  """`sampling.row_keys` for int32 seeds, from ops LiteRT has as builtins.

  `sampling.row_keys` splits an int64 seed with an int64 `bitwise_and` and
  `right_shift`, which LiteRT lacks. For a seed in int32 range the two 32-bit
  words are the seed's own bits and its sign extension, so the same chain of
  mixes gives the same key (tests/test_litert.py checks the two agree).

  Args:
    seeds: int32 `[B]`.
    index: int32 `[B]`.

  Returns:
    uint32 `[B]`, equal to `sampling.row_keys(seeds, index)`.
  """
  low = tf.cast(seeds, tf.uint32)
  high = tf.cast(tf.bitwise.right_shift(seeds, 31), tf.uint32)
  key = sampling.fmix32(
      tf.bitwise.bitwise_xor(low, tf.constant(0x9E3779B9, tf.uint32)))
  key = sampling.fmix32(tf.bitwise.bitwise_xor(key, high))
  return sampling.fmix32(tf.bitwise.bitwise_xor(key, tf.cast(index, tf.uint32)))


def convert(model, dynamic_range_int8: bool = False) -> bytes:
  """Converts `model`'s generation to a LiteRT flatbuffer (builtin ops only);
  `dynamic_range_int8`: the model's weights rounded to int8 first (as
  `rnnstep.load(..., weights_dtype="int8")` rounds them), whose products
  the artifact runs in XNNPACK's int8 kernel (`int8_products`); an int8
  model's products are so without it.

  Raises:
    ValueError: the model is not float32, or its file records a window
      (the LiteRT loop steps a model statefully, which would not give its
      text).
  """
  # Through a SavedModel: the only converter route that names the signature
  # (from_concrete_functions calls a single function "serving_default").
  with tempfile.TemporaryDirectory(prefix="rnnstep_litert_") as saved:
    save_generation(as_int8(model) if dynamic_range_int8 else model, saved)
    return convert_saved(saved)


def as_int8(model):
  """`model` with its weights rounded to int8 (itself if they are)."""
  if model.weights_dtype == "int8":
    return model
  return _copy(model, weights_dtype="int8")


def held_in_float32(model):
  """`model` with its 16-bit matrices held as their float32 values (itself
  if it holds none, `Model.held_16bit`): the same weights, in the ops
  LiteRT's converter takes (a 16-bit product is fenced for XLA:
  `sixteen_bit`)."""
  if not model.held_16bit:
    return model
  return _copy(model, weights_dtype="float32")


def _copy(model, weights_dtype):
  """A new `Model` of `model`'s weights (`tensors()`) loaded with
  `weights_dtype`, its chat template kept."""
  from rnnstep.model import network  # pylint: disable=g-import-not-at-top
  copy = network.Model(model.config, model.vocab, model.tensors(),
                       model.compute_dtype.name, model.source,
                       tokens=model.tokens, weights_dtype=weights_dtype)
  copy.chat_template = model.chat_template
  return copy


def save_generation(model, saved_dir: str):
  """Writes the SavedModel `convert_saved` converts (`generate` as its
  signature) into the existing, empty `saved_dir`.

  Raises:
    ValueError: as `convert`.
  """
  if model.compute_dtype != tf.float32:
    raise ValueError(
        f"the LiteRT export is float32 only, but the model was loaded as "
        f"{model.compute_dtype.name}; load it with dtype='float32'")
  if model.config.window:
    raise ValueError(
        f"{model.source or 'the model'} records window={model.config.window} "
        "(built for fixed windows), but the LiteRT export steps a model "
        "statefully and would not give its text; export a SavedModel "
        "(--format=saved_model), which serves its windows")
  module = GenerateModule(held_in_float32(model))
  int8 = model.architecture.int8_products
  # An int8 model's products traced as float32 products by `q * scale`,
  # which `convert_saved` turns into XNNPACK's int8 ones.
  with (int8_arithmetic.decoded_products() if int8
        else contextlib.nullcontext()):
    tf.saved_model.save(module, saved_dir,
                        signatures={SIGNATURE: module.generate})
  if int8:
    with open(os.path.join(saved_dir, INT8_PRODUCTS_MARK), "w",
              encoding="utf-8") as f:
      f.write("int8 products: rewritten to XNNPACK's dynamic-range int8\n")


def convert_saved(saved_dir: str) -> bytes:
  """The LiteRT flatbuffer (builtin ops only) of `save_generation`'s
  SavedModel. Apart from the model, so that a process converting need not
  hold it (`rnnstep.litert.fill`: ~8.4x the weights at the
  converter's peak, against ~11x with the model loaded).

  An int8 model's products (its SavedModel marked `INT8_PRODUCTS_MARK`)
  become XNNPACK's dynamic-range int8 fully-connected products
  (`int8_products.rewrite`): int8 weights per output channel, a quarter of
  the bytes read, each input row rounded to int8 as the interpreter runs,
  the library's int8 arithmetic (`rnnstep.model.int8_arithmetic`), so the
  library's text.
  """
  int8 = os.path.exists(os.path.join(saved_dir, INT8_PRODUCTS_MARK))
  converter = converter_for(saved_dir, lean=True)
  if int8:
    # A constant multiplying a product's input or output folded into its
    # weights would leave them no longer int8.
    converter._experimental_disable_fuse_mul_and_fc = True  # pylint: disable=protected-access
  _skip_passes_after_mlir(converter)
  flatbuffer = _convert_without_reloading(converter)
  if int8:
    flatbuffer, _ = int8_products.rewrite(flatbuffer)
  return flatbuffer


def converter_for(saved_dir: str, *, lean: bool = False):
  """TensorFlow's LiteRT converter of `save_generation`'s SavedModel, as
  TensorFlow configures it for builtin ops; `convert_saved` leaves out its
  passes after MLIR's.

  `lean`: made without `from_saved_model`'s load of the whole SavedModel
  (its weights included), which only finds the signature's function, known
  here (`save_generation` wrote it); where TensorFlow lacks that converter
  class, as `from_saved_model` makes it.
  """
  converter = None
  if lean:
    try:
      from tensorflow.lite.python import lite  # pylint: disable=g-import-not-at-top
      converter = lite.TFLiteSavedModelConverterV2(
          saved_dir, {tf.saved_model.SERVING}, [SIGNATURE])
    except (ImportError, AttributeError, TypeError):
      converter = None
    if converter is not None and not converter.saved_model_dir:
      converter = None  # It would convert some other way.
  if converter is None:
    converter = tf.lite.TFLiteConverter.from_saved_model(
        saved_dir, signature_keys=[SIGNATURE])
  converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
  return converter


def _convert_without_reloading(converter) -> bytes:
  """`converter.convert()` without its second load of the whole SavedModel,
  which only collects the traced functions' stack traces for the
  converter's error messages: the same flatbuffer byte for byte (checked
  as a process's first conversion, the bundled GRU and the RWKV-7 test
  preset: later ones differ only in names, which the loads renumber), in
  35-40% less of the conversion's CPU on the bundled GRU. Where
  TensorFlow's converter lacks the two steps it is made of, or would
  convert another way, `convert()`."""
  load = getattr(converter, "_load_saved_model", None)
  convert = getattr(converter, "_convert_from_saved_model", None)
  if (load is None or convert is None or not converter.saved_model_dir
      or not getattr(converter, "experimental_new_converter", False)):
    return converter.convert()
  graph_def, _, _ = load(converter.saved_model_dir,
                         converter._saved_model_tags)  # pylint: disable=protected-access
  return convert(graph_def)


def _skip_passes_after_mlir(converter) -> None:
  """Leaves out the converter's two passes that rewrite MLIR's flatbuffer
  in Python, op by op, and change nothing an interpreter runs: the
  conversion metadata (TensorFlow's version and options, which nothing
  reads) and the merging of equal read-only buffers (MLIR's flatbuffer
  stores each weight once; a few equal small constants are left:
  tests/test_litert.py checks). On a 2-vCPU Zen 4 they took a sixth to two
  fifths of small models' conversion CPU and a ninth of the 0.1B RWKV-7's
  (benchmarks/results/litert-convert-epyc-zen4-2026-12.md).

  The metadata is a public switch. The deduplication runs in the
  converter's `_optimize_tflite_model`, which for this export (no
  representative dataset, so no integer quantization; no sparsity) does
  nothing else in TensorFlow 2.21; where a TensorFlow lacks that method,
  its conversion runs as it is."""
  converter.exclude_conversion_metadata = True
  if (hasattr(converter, "_optimize_tflite_model")
      and converter.representative_dataset is None):
    converter._optimize_tflite_model = (  # pylint: disable=protected-access
        lambda model, *args, **kwargs: model)


def export_litert(model, export_dir, dynamic_range_int8: bool = False) -> str:
  """Writes `model.tflite` and `vocab.json` (and a token model's
  `tokens.json`, a subword model's `tokenizer.json`) into a new `export_dir`.

  Written into a temp directory beside `export_dir` and renamed onto it when
  complete, so a failed export leaves nothing behind.

  Args:
    model: a float32 `rnnstep.Model`.
    export_dir: the directory to create; it must not exist yet or be empty.
    dynamic_range_int8: the weights rounded to int8 first, as `convert`'s.

  Returns:
    The export directory.

  Raises:
    ValueError: export_dir exists and is not empty, or the model cannot be
      exported (see `convert`).
  """
  check_model(model)
  export_dir = staging.require_new_directory(
      errors.check_path(export_dir, "export_dir", "directory"))
  flatbuffer = convert(model, dynamic_range_int8)
  with staging.staged_path(export_dir, directory=True) as tmp:
    with open(os.path.join(tmp, MODEL_FILE), "wb") as f:
      f.write(flatbuffer)
    with open(os.path.join(tmp, VOCAB_FILE), "w", encoding="utf-8") as f:
      json.dump(list(model.vocab), f, ensure_ascii=False)
    if not model.is_characters:  # How to map text to these ids and back.
      model.tokens.write_files(tmp)
  return export_dir
