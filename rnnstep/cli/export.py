"""rnnstep-export: write a model as a SavedModel (strings in and out) or LiteRT.

USAGE: rnnstep-export --output=DIR [--format=saved_model|tflite|web]
                      [--model=NPZ] [--dtype=...] [--jit_compile]
                      [--regex=PATTERN ...] [--dynamic_range_int8]
       [--corpus=TEXT_FILE | --vocab=VOCAB_FILE  (with Keras/PyTorch --model)]

  rnnstep-export --output=served/1                     # the bundled model
  rnnstep-export --model=my.npz --output=served/1
  rnnstep-export --model=char_rnn.pt --vocab=vocab.json --output=served/1
  saved_model_cli show --dir served/1 --all            # its signatures
  rnnstep-export --format=tflite --output=litert  # model.tflite, vocab.json
  rnnstep-export --format=web --output=web        # index.html, rnnstep.js, ...

The SavedModel holds the weights, the vocabulary and the whole generation loop,
so any TensorFlow runtime (TF Serving, tf.saved_model.load) serves it without
rnnstep or Keras. Its signatures:
  serving_default(prompts: string [B], num_steps: int32, temperature: float32,
                  seed: int64) -> {"text": string [B]}
  generate_top_k_top_p(the same + top_k: int32, top_p: float32) -> the same
  generate_decoding(prompts, num_steps, seed + every served decoding option)
                  -> {"text", "logprob"}
  generate_constrained(generate_decoding's inputs + stop: string [K],
                  regex: string) -> the same, with stop strings and one of
                  the --regex patterns ("" for none)
Row i of a call uses the seed pair (seed, i), as rnnstep.generate(...,
seed=seed) does, so both give the same text. A token model (words, bytes,
subword) also has generate_ids (prompt_ids int32 [B, T], prompt_lengths
int32 [B] -> ids, lengths, text, logprob), generate_ids_constrained (the same
+ stop, regex) and its vocabulary in assets/; a
subword model's tokenizer does not run in a graph, so it takes ids only
(docs/guide/serving.md).

--format=tflite writes DIR/model.tflite and DIR/vocab.json (the characters in
id order) for the LiteRT interpreter (ai_edge_litert; builtin ops only, no
TensorFlow needed). Its one signature works on ids, float32 models only:
  generate(prompt_ids: int32 [B, T] (right-padded), prompt_lengths: int32 [B],
           num_steps: int32, temperature: float32, top_k: int32,
           top_p: float32, seed: int32) -> {"ids": int32 [B, num_steps]}
An int8 model (a file stored with rnnstep-convert --weights_dtype=int8, or
--weights_dtype=int8 here; --dynamic_range_int8 is the same) stores its
products' weights int8 (a quarter of their bytes), which XNNPACK's int8
kernel multiplies, rounding each input row to int8 as the library's int8
arithmetic does: the library's int8 text, about 3x as fast on the 0.1B
RWKV-7 as float32; its measured loss: docs/guide/performance.md.

--format=web writes DIR/index.html (a page that generates in the browser,
everything inline, so it works from file:// and loads nothing), DIR/rnnstep.js
(an ES module: load, generate, stream, step), DIR/model.json and
DIR/weights.bin (float32). Same prompt, options and seed, same text as
rnnstep.generate (docs/guide/web.md). Float32 models only.

--output must not exist or be an empty directory; missing parent directories
are created. The export is written to a temp directory beside --output and
renamed to it when complete: a failed run leaves nothing there and removes the
parent directories it created.

Errors are one line on stderr. Exit status: 0 success, 1 failure (model file,
output directory, export), 2 bad command line, 130 Ctrl-C, 143 SIGTERM.
TensorFlow's own log lines are hidden; set RNNSTEP_DEBUG=1 to see them and
tracebacks.
"""

import contextlib
import os
import time

from absl import flags

from rnnstep.cli import common  # pylint: disable=g-bad-import-order
import rnnstep  # pylint: disable=g-bad-import-order
from rnnstep import errors  # pylint: disable=g-bad-import-order

PROGRAM = "rnnstep-export"

# Private flags: see common.py.
FLAGS = flags.FlagValues()
_MODEL, _DTYPE = common.define_model_flags(FLAGS)
_WEIGHTS_DTYPE = common.define_weights_dtype_flag(FLAGS)
_CORPUS, _VOCAB = common.define_vocab_flags(FLAGS)
_OUTPUT = flags.DEFINE_string(
    "output", None,
    "The directory to create (e.g. served/1: TF Serving loads numbered "
    "versions). It must not exist or be empty.", flag_values=FLAGS)
_FORMAT = flags.DEFINE_enum(
    "format", "saved_model", ["saved_model", "tflite", "web"],
    "saved_model: a TensorFlow SavedModel, strings in and out. tflite: "
    "model.tflite (LiteRT, builtin ops, ids in and out) and vocab.json. web: "
    "index.html (open it in a browser), rnnstep.js, model.json, weights.bin.",
    flag_values=FLAGS)
_JIT_COMPILE = flags.DEFINE_boolean(
    "jit_compile", False,
    "Mark the generation body for XLA compilation (--format=saved_model "
    "only). Off by default: every TensorFlow runtime can run the plain graph.",
    flag_values=FLAGS)
_DYNAMIC_RANGE_INT8 = flags.DEFINE_boolean(
    "dynamic_range_int8", False,
    "--format=tflite only: the weights rounded to int8 first, as "
    "--weights_dtype=int8 rounds them (the products' weights stored int8, "
    "multiplied by XNNPACK's int8 kernel: fewer bytes a token, faster); the "
    "text of rnnstep.load(..., weights_dtype='int8'), not float32's "
    "(docs/guide/performance.md has its measured loss).",
    flag_values=FLAGS)
_REGEX = flags.DEFINE_multi_string(
    "regex", [],
    "A pattern (Python syntax; repeatable) the SavedModel serves: "
    "generate_constrained's regex input names one. Each is compiled now, "
    "over the model's vocabulary; a graph cannot compile one when serving.",
    flag_values=FLAGS)
flags.mark_flag_as_required("output", flag_values=FLAGS)
common.forbid_empty(FLAGS, "output")


def main(argv):
  common.reject_arguments(argv)
  output = _OUTPUT.value
  litert = _FORMAT.value == "tflite"
  web = _FORMAT.value == "web"
  for name in ("jit_compile", "regex"):
    if (litert or web) and FLAGS[name].present:
      raise common.Failure(f"--{name} applies to --format=saved_model only; "
                           "drop it", common.EXIT_USAGE)
  if _DYNAMIC_RANGE_INT8.value and not litert:
    raise common.Failure("--dynamic_range_int8 applies to --format=tflite "
                         "only; add --format=tflite or drop it",
                         common.EXIT_USAGE)
  if _DYNAMIC_RANGE_INT8.value and _WEIGHTS_DTYPE.value not in (None,
                                                                "int8"):
    raise common.Failure(
        f"--weights_dtype={_WEIGHTS_DTYPE.value}: --dynamic_range_int8 "
        "rounds the weights to int8; drop one of them", common.EXIT_USAGE)
  if (litert or web) and _DTYPE.value != "float32":
    raise common.Failure(f"--dtype={_DTYPE.value}: --format={_FORMAT.value} "
                         "exports float32 models only; drop --dtype",
                         common.EXIT_USAGE)
  if os.path.exists(output) and (not os.path.isdir(output)
                                 or os.listdir(output)):
    raise common.Failure(f"--output={output}: already exists and is not an "
                         "empty directory; choose a new one")
  model = common.load_model(_MODEL.value, _DTYPE.value, _CORPUS.value,
                            _VOCAB.value, flag=_MODEL.name,
                            weights_dtype=_WEIGHTS_DTYPE.value)
  with _parents_made(output):
    with common.staged_path(output, directory=True) as tmp:
      _pause_for_tests()
      if litert:
        rnnstep.export_litert(model, tmp,
                              dynamic_range_int8=_DYNAMIC_RANGE_INT8.value)
      elif web:
        rnnstep.export(model, tmp, format="web")
      else:
        try:
          rnnstep.export(model, tmp, jit_compile=_JIT_COMPILE.value,
                         regex=_REGEX.value)
        except errors.ArgumentError as e:  # A pattern, named by the error.
          raise common.Failure(f"--regex: {e}", common.EXIT_USAGE) from None
  weights = _MODEL.value or "the bundled model"
  if web:
    print(f"wrote a web export of {weights} (float32) to {output}: "
          f"index.html, rnnstep.js, model.json, weights.bin")
    print(f"open: chromium {os.path.join(output, 'index.html')}  "
          "(or any browser; it works from file://)")
    return 0
  if litert:
    from rnnstep.litert import export as lib  # pylint: disable=g-import-not-at-top
    arithmetic = ("dynamic-range int8: XNNPACK's int8 arithmetic, its own "
                  "text" if _DYNAMIC_RANGE_INT8.value else "float32")
    print(f"wrote a LiteRT model of {weights} ({arithmetic}) to {output}: "
          f"{lib.MODEL_FILE}, {lib.VOCAB_FILE}")
    print("signature:")
    print(f"  {lib.signature_text()}")
    print("every decoding option is an input (off: its default); the stop "
          "and regex tables are built on the host "
          "(rnnstep.litert.inputs)")
    return 0
  print(f"wrote a SavedModel of {weights} ({_DTYPE.value}, "
        f"jit_compile={_JIT_COMPILE.value}) to {output}")
  print("signatures:")
  for line in _signatures(output):
    print(f"  {line}")
  print(f"inspect: saved_model_cli show --dir {output} --all")
  return 0


# Test-only: tests/test_cli_export.py signals the tool while it exports. With
# this variable set to a file path, the tool creates that file once its temp
# directory exists and then waits (at most a minute) before saving, so the
# signal lands at a known point instead of racing a fast export.
PAUSE_ENV = "RNNSTEP_TEST_PAUSE_BEFORE_SAVE"


def _pause_for_tests():
  path = os.environ.get(PAUSE_ENV)
  if not path:
    return
  with open(path, "w"):
    pass
  deadline = time.monotonic() + 60
  while os.path.exists(path) and time.monotonic() < deadline:
    time.sleep(0.01)


@contextlib.contextmanager
def _parents_made(path):
  """Creates the missing parent directories of `path`; if the block fails,
  removes those it created (when still empty)."""
  missing = []
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.lexists(parent):
    missing.append(parent)
    parent = os.path.dirname(parent)
  made = []
  try:
    for directory in reversed(missing):
      try:
        os.mkdir(directory)
      except OSError as e:
        raise common.Failure(f"--output={path}: {common.reason(e)}") from None
      made.append(directory)
    yield
  except BaseException:
    for directory in reversed(made):
      with contextlib.suppress(OSError):
        os.rmdir(directory)
    raise


def _signatures(export_dir):
  """'name(input: dtype[shape], ...) -> output: dtype[shape]' per signature,
  read from the saved_model.pb just written (no graph loaded)."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tensorflow.core.protobuf import saved_model_pb2

  def spec(info):
    dims = "".join(f"[{d.size if d.size >= 0 else '?'}]"
                   for d in info.tensor_shape.dim)
    return f"{tf.dtypes.as_dtype(info.dtype).name}{dims}"

  def fields(tensors):
    return ", ".join(f"{name}: {spec(tensors[name])}"
                     for name in sorted(tensors))

  saved = saved_model_pb2.SavedModel()
  with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
    saved.ParseFromString(f.read())
  signatures = saved.meta_graphs[0].signature_def
  return [f"{name}({fields(sig.inputs)}) -> {fields(sig.outputs)}"
          for name, sig in sorted(signatures.items())
          if not name.startswith("__")]


# The console-script entry point: run(argv=None).
run = common.entry_point(PROGRAM, __doc__, FLAGS, main)

if __name__ == "__main__":
  run()
