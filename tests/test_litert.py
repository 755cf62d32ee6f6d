"""LiteRT export: the flatbuffer run in the ai_edge_litert interpreter.

Greedy text must equal a real Keras greedy loop (and the library); seeded text
must equal `rnnstep.generate(..., seed=s)`; the flatbuffer must hold builtin
ops only (no Flex ops: the plain interpreter could not run them).
"""

import ast
import atexit
import collections
import functools
import hashlib
import json
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from tests.support import keras_reference as kr
from tests.support.litert_interpreter import run
from tests.support.tiers import quick_params

import rnnstep
from rnnstep.decoding import sampling
from rnnstep.litert import export as litert
from rnnstep.litert import runner as litert_runner
from rnnstep.model import model_file

# Quick tier (-m "not slow") leaves this file out: LiteRT exports of every
# stack.
pytestmark = pytest.mark.slow

pytest.importorskip(
    "ai_edge_litert.interpreter",
    reason="ai_edge_litert is not installed (pip install ai-edge-litert)")
schema = pytest.importorskip("ai_edge_litert.schema_py_generated")

STACKS = {
    "gru_reset_after": [kr.layer("gru", 24, True)],
    "gru_reset_before": [kr.layer("gru", 24, False)],
    "lstm": [kr.layer("lstm", 20)],
    "simple_rnn": [kr.layer("simple_rnn", 20)],
    "lstm_then_gru": [kr.layer("lstm", 16), kr.layer("gru", 12, False)],
}
# Wide enough that XNNPACK splits a product's output channels across
# threads (the stacks above are too narrow to be split).
WIDE_STACK = "wide_gru"
STACK_LAYERS = dict(STACKS, **{WIDE_STACK: [kr.layer("gru", 256, True)]})
PROMPTS = ["ROMEO: ", "A", "THE KING'S SPEECH"]  # Mixed lengths: padded rows.
STEPS = 30


@functools.lru_cache(maxsize=None)
def models(name):
  """(keras model, rnnstep model) for a stack.

  Keras' initial weights are scaled up so that greedy text depends on the
  state (at init it settles on one repeated character), and id 0 is "[UNK]"
  with a raised bias, so that it is often the argmax: the export must never
  generate it.
  """
  layers = STACK_LAYERS[name]
  keras_model = kr.build(layers, vocab_size=66, seed=7)
  embedding, *recurrent, dense = keras_model.layers[1:]
  embedding.set_weights([embedding.get_weights()[0] * 40])
  for lay in recurrent:
    kernel, recurrent_kernel, bias = lay.get_weights()
    lay.set_weights([kernel, recurrent_kernel * 3, bias])
  kernel, bias = dense.get_weights()
  bias[0] = 1.0
  dense.set_weights([kernel * 3, bias])
  vocab = ["[UNK]"] + kr.default_vocab(65)
  return keras_model, kr.rnnstep_model(keras_model, layers, vocab)


@functools.lru_cache(maxsize=None)
def exported_to(name):
  """(keras model, rnnstep model, folder) for a stack: `rnnstep.export_litert`
  writes the folder, `out` in a temporary directory of its own (removed at
  exit). Each conversion (seconds of CPU) is made once, and only for the
  stacks that the selected tests run."""
  keras_model, model = models(name)
  parent = tempfile.mkdtemp(prefix="rnnstep_litert_")
  atexit.register(shutil.rmtree, parent, True)
  target = os.path.join(parent, "out")
  assert rnnstep.export_litert(model, target) == target  # It says where.
  return keras_model, model, target


@functools.lru_cache(maxsize=None)
def exported(name):
  """(keras model, rnnstep model, flatbuffer bytes) for a stack, as
  `exported_to` wrote it."""
  keras_model, model, folder = exported_to(name)
  with open(os.path.join(folder, "model.tflite"), "rb") as f:
    return keras_model, model, f.read()


# The stack the default run converts; a test about something other than
# the cell kinds (banning, padding, zero steps) runs on it by default and on
# its other stack in the exhaustive tier, so the default run converts one
# model (`test_export_writes_both_files_and_leaves_no_temp` checks its
# folder).
QUICK_STACK = "lstm_then_gru"


def op_codes(flatbuffer):
  """(builtin op name, custom code) of every op code, all subgraphs."""
  root = schema.Model.GetRootAsModel(flatbuffer, 0)
  names = {v: k for k, v in vars(schema.BuiltinOperator).items()
           if not k.startswith("_")}
  codes = []
  for i in range(root.OperatorCodesLength()):
    code = root.OperatorCodes(i)
    builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
    codes.append((names.get(builtin), code.CustomCode()))
  return codes


@pytest.mark.parametrize("name", quick_params(list(STACKS), QUICK_STACK))
def test_greedy_equals_keras_and_the_library(name):
  keras_model, model, flatbuffer = exported(name)
  got = run(flatbuffer, model, PROMPTS, STEPS)
  want = [model.decode(kr.greedy(keras_model, model.encode(p), STEPS,
                                 banned=(0,))) for p in PROMPTS]
  assert got == want
  assert got == rnnstep.generate(model, PROMPTS, STEPS, temperature=0.0,
                                 jit_compile=False)


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0.8, seed=5),
    dict(temperature=1.0, seed=-3, top_k=5),
    dict(temperature=1.3, seed=2**31 - 1, top_p=0.9),
    dict(temperature=1.0, seed=-2**31, top_k=8, top_p=0.8),
])
def test_seeded_text_equals_the_library_and_repeats(kwargs):
  _, model, flatbuffer = exported("lstm_then_gru")
  got = run(flatbuffer, model, PROMPTS, STEPS, **kwargs)
  assert got == rnnstep.generate(model, PROMPTS, STEPS, jit_compile=False,
                                 **kwargs)
  assert got == run(flatbuffer, model, PROMPTS, STEPS, **kwargs)
  assert got != run(flatbuffer, model, PROMPTS, STEPS,
                    **dict(kwargs, seed=kwargs["seed"] ^ 1))


@pytest.mark.parametrize("name", quick_params(["gru_reset_after",
                                                  QUICK_STACK], QUICK_STACK))
def test_unk_is_never_generated(name):
  _, model, flatbuffer = exported(name)
  text = "".join(run(flatbuffer, model, PROMPTS, 200, temperature=5.0, seed=1))
  assert len(text) == 600 and "[UNK]" not in text


@pytest.mark.parametrize("name", quick_params(["gru_reset_before",
                                                  QUICK_STACK], QUICK_STACK))
def test_each_row_of_a_mixed_batch_equals_its_prompt_alone(name):
  _, model, flatbuffer = exported(name)
  batch = run(flatbuffer, model, PROMPTS, STEPS)
  assert batch == [run(flatbuffer, model, [p], STEPS)[0] for p in PROMPTS]
  # Row 0 of a seeded batch has the key (seed, 0), as it has alone.
  sampled = run(flatbuffer, model, PROMPTS, STEPS, temperature=1.0, seed=4)
  assert sampled[0] == run(flatbuffer, model, PROMPTS[:1], STEPS,
                           temperature=1.0, seed=4)[0]


@pytest.mark.parametrize("name", quick_params(["simple_rnn", QUICK_STACK],
                                              QUICK_STACK))
def test_zero_steps_give_an_empty_row_each(name):
  _, model, flatbuffer = exported(name)
  assert run(flatbuffer, model, PROMPTS, 0) == ["", "", ""]


def test_the_runtime_takes_tensorflow_s_threads(monkeypatch):
  """Unless told, the artifact runs on as many threads as TensorFlow's
  products would: its `TF_NUM_INTRAOP_THREADS` where that is a positive
  integer (TensorFlow ignores any other value, and so does the runtime),
  else every core this process may use; never more than those cores."""
  cores = len(os.sched_getaffinity(0))
  for value, threads in (("1", 1), (f" {cores} ", cores), ("0", cores),
                         ("-2", cores), ("two", cores), ("", cores),
                         (str(cores + 1), cores), ("100000", cores)):
    monkeypatch.setenv(litert_runner.THREADS_ENV, value)
    assert litert_runner.default_threads() == threads, value
  monkeypatch.delenv(litert_runner.THREADS_ENV)
  assert litert_runner.default_threads() == cores


def test_every_kernel_set_on_two_threads_gives_the_library_s_text(tmp_path):
  """rnnstep-generate's warm path runs an artifact on LiteRT's builtin
  kernels, the interpreter's XNNPACK delegate, or XNNPACK on weights packed
  into a file once (`runner.pack_weights`, the cache's large artifacts): on
  one thread and on two, each gives the library's greedy and seeded text
  (threads split a product's output channels, never its sums)."""
  _, model, flatbuffer = exported(WIDE_STACK)
  path = str(tmp_path / "model.tflite")
  with open(path, "wb") as f:
    f.write(flatbuffer)
  packed = str(tmp_path / "model.xnnpack")
  litert_runner.pack_weights(path, packed)
  ways = {"builtin": dict(flatbuffer=flatbuffer, builtin_kernels=True),
          "xnnpack": dict(flatbuffer=flatbuffer, builtin_kernels=False),
          "packed": dict(flatbuffer=path, weight_cache=packed)}
  for options in (dict(temperature=0.0), dict(temperature=0.8, seed=5)):
    want = rnnstep.generate(model, PROMPTS, STEPS, jit_compile=False,
                            **options)
    for threads in (1, 2):
      for way, how in ways.items():
        got = litert_runner.run_artifact(
            vocab=list(model.vocab), prompts=PROMPTS, num_steps=STEPS,
            num_threads=threads, **how, **dict(options,
                                               seed=options.get("seed", 0)))
        assert got == want, (way, threads, options)


def test_the_flatbuffer_holds_builtin_ops_only():
  _, _, flatbuffer = exported("lstm_then_gru")
  codes = op_codes(flatbuffer)
  assert ("WHILE", None) in codes  # The whole loop is in the flatbuffer.
  assert [c for c in codes if c[0] == "CUSTOM" or c[1] is not None] == []


def test_no_weight_is_stored_twice():
  """`convert_saved` skips TensorFlow's pass that merges equal read-only
  buffers (and its metadata pass): MLIR's flatbuffer must leave nothing of
  size to merge (a few equal small constants, shapes or scalars, at most).
  The stack's kernels and the loops' reads of them are what could repeat."""
  _, _, flatbuffer = exported("lstm_then_gru")
  root = schema.Model.GetRootAsModel(flatbuffer, 0)
  copies = collections.Counter()
  for i in range(root.BuffersLength()):
    data = root.Buffers(i).DataAsNumpy()
    if not isinstance(data, int) and data.size > 64:
      copies[hashlib.sha256(data.tobytes()).digest()] += 1
  assert copies and max(copies.values()) == 1
  assert not any(root.Metadata(i).Name() == b"CONVERSION_METADATA"
                 for i in range(root.MetadataLength()))


def test_row_keys_equal_the_library_s_for_int32_seeds():
  seeds = np.array([0, 1, -1, 5, 2**31 - 1, -2**31, 123456789, -987654321],
                   np.int32)
  index = np.arange(len(seeds), dtype=np.int32) * 7
  np.testing.assert_array_equal(
      litert.row_keys(tf.constant(seeds), tf.constant(index)).numpy(),
      sampling.row_keys(tf.constant(seeds, tf.int64),
                        tf.constant(index)).numpy())


def test_export_writes_both_files_and_leaves_no_temp():
  _, model, folder = exported_to(QUICK_STACK)
  target = pathlib.Path(folder)
  assert target.name == "out"
  assert sorted(os.listdir(target.parent)) == ["out"]
  assert sorted(os.listdir(target)) == ["model.tflite", "vocab.json"]
  vocab = json.loads((target / "vocab.json").read_text(encoding="utf-8"))
  assert vocab == list(model.vocab) and vocab[0] == "[UNK]"
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(target).st_mode & 0o777 == 0o777 & ~umask
  flatbuffer = (target / "model.tflite").read_bytes()
  assert run(flatbuffer, model, PROMPTS[:1], 10) == rnnstep.generate(
      model, PROMPTS[:1], 10, temperature=0.0, jit_compile=False)


def test_export_refuses_a_non_empty_directory(tmp_path):
  _, model = models("gru_reset_after")
  (tmp_path / "keep.txt").write_text("keep")
  with pytest.raises(ValueError, match="not an empty directory"):
    rnnstep.export_litert(model, tmp_path)
  assert os.listdir(tmp_path) == ["keep.txt"]


def test_export_refuses_a_reduced_precision_model(tmp_path):
  layers = STACKS["gru_reset_after"]
  model = rnnstep.Model(model_file.ModelConfig(16, tuple(layers)),
                        kr.default_vocab(65),
                        kr.weights_of(kr.build(layers), layers),
                        dtype="bfloat16")
  with pytest.raises(ValueError, match="float32 only.*dtype='float32'"):
    rnnstep.export_litert(model, tmp_path / "out")
  assert os.listdir(tmp_path) == []



def test_the_package_never_imports_the_interpreter():
  """ai_edge_litert is for tests and users; rnnstep only writes the file,
  except rnnstep-generate's warm path (litert/runner.py), which
  runs it (an optional import inside a function: without it the command
  uses TF)."""
  package = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "rnnstep")
  offenders = []
  for directory, _, files in os.walk(package):
    for name in [f for f in files if f.endswith(".py")]:
      path = os.path.join(directory, name)
      if os.path.relpath(path, package) == os.path.join("litert",
                                                        "runner.py"):
        continue
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
      for node in ast.walk(tree):
        if isinstance(node, ast.Import):
          modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
          modules = [node.module or ""]
        else:
          continue
        offenders += [f"{path}:{node.lineno}" for m in modules
                      if m.split(".")[0] in ("ai_edge_litert", "tflite_runtime")]
  assert offenders == []
