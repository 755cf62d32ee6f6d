"""weights_dtype: float16, bfloat16 and int8 weights (issue #62).

Each reduced model's logits against an independent numpy forward of the
same rounded weights (rounded here, with numpy and ml_dtypes: int8 per
output channel, max|w| / 127; an int8 model's products in XNNPACK's
dynamic-range arithmetic, `tests/support/int8_reference.py`), every path's
text the same, the model file's round trip, and bad values refused in one
line naming weights_dtype.
"""

import os
import pathlib

import ml_dtypes
import numpy as np
import pytest

from tests.support import cli
from tests.support import int8_reference
from tests.support import numpy_reference as nr
from tests.support import rwkv7_reference
from tests.support.tiers import quick_params

import rnnstep
from rnnstep import errors
from rnnstep.model import model_file

REDUCED = ("float16", "bfloat16", "int8")
RWKV7_PRESET = str(pathlib.Path(__file__).parent / "data" / "rwkv7" /
                   "preset")
# The large matrices each model's weights dtype rounds (the rest stay).
GRU_KEYS = ("embedding", "layer0_kernel", "layer0_recurrent_kernel",
            "layer1_kernel", "layer1_recurrent_kernel", "dense_kernel")
RWKV7_KEYS = ("embedding", "dense_kernel") + tuple(
    f"layer0_{name}" for name in ("receptance", "key", "value", "output",
                                  "ffn_key", "ffn_value"))
PROMPT = "ROMEO: the king"


def rounded(array, weights_dtype, per_row=False):
  """numpy's rounding of one float32 tensor to `weights_dtype`."""
  array = np.asarray(array, np.float32)
  if weights_dtype == "float16":
    return array.astype(np.float16).astype(np.float32)
  if weights_dtype == "bfloat16":
    return array.astype(ml_dtypes.bfloat16).astype(np.float32)
  axis = -1 if per_row else -2  # The embedding's rows; a matrix's columns.
  scale = np.abs(array).max(axis, keepdims=True) / 127
  return (np.round(array / np.where(scale > 0, scale, 1)) * scale).astype(
      np.float32)


def reference_tensors(tensors, keys, weights_dtype):
  return {k: rounded(v, weights_dtype, k == "embedding") if k in keys else v
          for k, v in tensors.items()}


@pytest.fixture(scope="module")
def gru_file(tmp_path_factory):
  """A two-layer model (LSTM then GRU) over cli.VOCAB, random weights."""
  rng = np.random.default_rng(3)
  v, d = len(cli.VOCAB), 16
  layers = (model_file.LayerConfig("lstm", 24),
            model_file.LayerConfig("gru", 20, True))
  config = model_file.ModelConfig(d, layers)
  tensors = {k: (rng.normal(size=s) * 0.4).astype(np.float32)
             for k, s in config.expected_shapes(v).items()}
  path = tmp_path_factory.mktemp("weights_dtype") / "stack.npz"
  model_file.write(path, config, cli.VOCAB, tensors)
  return str(path)


@pytest.fixture(scope="module")
def rwkv7_tensors():
  return rnnstep.load(RWKV7_PRESET).tensors()


@pytest.mark.parametrize("weights_dtype", REDUCED)
def test_stack_logits_are_the_rounded_weights_numpy_forward(gru_file,
                                                            weights_dtype):
  model = rnnstep.load(gru_file, weights_dtype=weights_dtype)
  assert model.weights_dtype == weights_dtype
  plain = model_file.read(gru_file)
  want = reference_tensors(plain.tensors, GRU_KEYS, weights_dtype)
  got = model.tensors()
  for key, value in want.items():
    # int8's scales may sit one float32 step from max|w| / 127 (rnnstep
    # keeps them where rounding again changes nothing).
    np.testing.assert_allclose(got[key], value, rtol=2e-7, atol=0,
                               err_msg=key)
    if key not in GRU_KEYS:
      np.testing.assert_array_equal(got[key], value, err_msg=key)
  ids = model.encode(PROMPT)
  int8 = weights_dtype == "int8"
  reference = nr.Reference(
      want, plain.config.layers,
      product=int8_reference.by_key(want, GRU_KEYS) if int8 else None)
  np.testing.assert_allclose(rnnstep.logits(model, ids)[0],
                             reference.logits(ids), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("weights_dtype", REDUCED)
def test_rwkv7_logits_are_the_rounded_weights_numpy_forward(rwkv7_tensors,
                                                            weights_dtype):
  model = rnnstep.load(RWKV7_PRESET, weights_dtype=weights_dtype)
  want = reference_tensors(rwkv7_tensors, RWKV7_KEYS, weights_dtype)
  ids = model.encode("Hello the poet said")
  head_size = model.config.layers[0].size["head_size"]
  int8 = weights_dtype == "int8"
  np.testing.assert_allclose(
      rnnstep.logits(model, ids)[0],
      rwkv7_reference.logits(want, head_size, ids, **(
          dict(product=int8_reference.by_values) if int8 else {})),
      rtol=1e-4, atol=1e-4)
  # What stays float32 is untouched.
  got = model.tensors()
  for key in set(rwkv7_tensors) - set(RWKV7_KEYS):
    np.testing.assert_array_equal(got[key], rwkv7_tensors[key], err_msg=key)


def test_float32_is_the_weights_as_they_are(gru_file):
  plain = model_file.read(gru_file)
  assert plain.weights_dtype == "float32"
  for model in (rnnstep.load(gru_file),
                rnnstep.load(gru_file, weights_dtype="float32")):
    assert model.weights_dtype == "float32"
    for key, value in model.tensors().items():
      np.testing.assert_array_equal(value, plain.tensors[key])


# XLA against the graph path in the default run; the elementwise path (and
# the graph against itself) in the exhaustive tier, as the other sweeps.
@pytest.mark.slow  # XLA compiles (the default run's case).
@pytest.mark.parametrize("path", quick_params([False, True, "elementwise"],
                                              True))
def test_every_path_gives_int8_s_text(gru_file, path):
  model = rnnstep.load(gru_file, weights_dtype="int8")
  want = rnnstep.generate(model, [PROMPT, "A"], 24, temperature=0.0,
                          jit_compile=False)
  assert rnnstep.generate(model, [PROMPT, "A"], 24, temperature=0.0,
                          jit_compile=path) == want
  sampled = dict(temperature=0.9, seed=4, top_k=8)
  assert (rnnstep.generate(model, PROMPT, 24, jit_compile=path, **sampled)
          == rnnstep.generate(model, PROMPT, 24, jit_compile=False,
                              **sampled))


# Exhaustive (RWKV-7's XLA program, 10 s): the default run keeps RWKV-7's
# int8 logits against numpy (test_rwkv7_logits_are_the_rounded_weights_
# numpy_forward) and int8 on XLA (test_every_path_gives_int8_s_text).
@pytest.mark.exhaustive
@pytest.mark.parametrize("path", [False, "elementwise"])
def test_rwkv7_paths_give_int8_s_text(path):
  model = rnnstep.load(RWKV7_PRESET, weights_dtype="int8")
  prompts = ["Hello the poet said", "A"]
  assert (rnnstep.generate(model, prompts, 12, temperature=0.0,
                           jit_compile=path)
          == rnnstep.generate(model, prompts, 12, temperature=0.0,
                              jit_compile=True))


def _rwkv7_numpy_greedy(tensors, head_size, ids, steps):
  """Greedy ids after `ids` and their summed log-softmax, by the float64
  numpy forward."""
  ids, chosen, score = list(ids), [], 0.0
  for _ in range(steps):
    last = rwkv7_reference.logits(tensors, head_size, np.array(ids))[-1]
    logp = last - last.max()
    logp -= np.log(np.exp(logp).sum())
    ids.append(int(last.argmax()))
    chosen.append(ids[-1])
    score += logp[ids[-1]]
  return chosen, score


# 16-bit RWKV-7 (`rnnstep.model.sixteen_bit`): the graph path in the default
# run (its step blocks are XLA programs, its head and priming products small
# XLA programs of their own); the whole XLA program and the elementwise path
# exhaustive (an XLA program of the generation each).
@pytest.mark.parametrize("path", quick_params([False, True, "elementwise"],
                                              False))
@pytest.mark.parametrize("weights_dtype", ("float16", "bfloat16"))
def test_rwkv7_holds_16bit_weights_and_decodes_them(rwkv7_tensors,
                                                    weights_dtype, path):
  """R, K, V, O, the feed-forward's two and the head are variables of the
  weights dtype (the head `[V, U]`), `tensors()` gives their float32
  values as filed, and greedy decoding gives the numpy forward's ids and
  score on the rounded weights."""
  model = rnnstep.load(RWKV7_PRESET, weights_dtype=weights_dtype)
  assert model.held_16bit == weights_dtype
  held = [model.layer_weights[0][key.split("_", 1)[1]]
          for key in RWKV7_KEYS[2:]]
  assert {w.dtype.name for w in held + [model.dense_kernel]} == {
      weights_dtype}
  assert model.dense_kernel.shape == (model.vocab_size, model.config.layers[
      0].units)
  want = reference_tensors(rwkv7_tensors, RWKV7_KEYS, weights_dtype)
  for key, value in model.tensors().items():
    np.testing.assert_array_equal(value, want[key], err_msg=key)
  prompt = "Hello the poet said"
  greedy, want_score = _rwkv7_numpy_greedy(
      want, model.config.layers[0].size["head_size"], model.encode(prompt),
      12)
  texts, scores = rnnstep.generate(model, [prompt], 12, temperature=0.0,
                                   return_scores=True, jit_compile=path)
  assert texts == [model.tokens.decode(greedy)]
  np.testing.assert_allclose(scores[0], want_score, rtol=1e-5)


@pytest.mark.slow  # An XLA compile.
def test_rwkv7_16bit_rows_in_a_batch_give_the_numpy_forward_s_ids(
    rwkv7_tensors):
  """Under XLA a batch of several rows takes each 16-bit matrix widened once
  a call and one row reads it as 16 bits (`sixteen_bit.product`): each row
  of a batch still decodes the numpy forward's greedy ids on the rounded
  weights, as it does alone, in one XLA program, streamed in chunks, and on
  the graph path (whose step blocks are XLA programs of their own)."""
  model = rnnstep.load(RWKV7_PRESET, weights_dtype="float16")
  want = reference_tensors(rwkv7_tensors, RWKV7_KEYS, "float16")
  prompts = ["Hello the poet said", "A", "the café"]
  head_size = model.config.layers[0].size["head_size"]
  expected = [model.tokens.decode(_rwkv7_numpy_greedy(
      want, head_size, model.encode(p), 10)[0]) for p in prompts]
  for path in (True, False):
    assert rnnstep.generate(model, prompts, 10, temperature=0.0,
                            jit_compile=path) == expected, path
  chunks = list(rnnstep.stream(model, prompts, 10, temperature=0.0,
                               chunk_size=4, jit_compile=True))
  assert ["".join(c[i] for c in chunks)
          for i in range(len(prompts))] == expected


@pytest.fixture(scope="module")
def rwkv7_file(tmp_path_factory):
  """The RWKV-7 preset as a model file (float32)."""
  from rnnstep import convert  # pylint: disable=g-import-not-at-top
  path = tmp_path_factory.mktemp("rwkv7_16bit") / "preset.npz"
  convert.convert(RWKV7_PRESET, path)
  return str(path)


# Exhaustive (a cold and a warm command line, a LiteRT conversion): the
# default run decodes 16-bit RWKV-7 in process
# (test_rwkv7_holds_16bit_weights_and_decodes_them).
@pytest.mark.exhaustive
def test_the_command_line_gives_the_library_s_16bit_text_cold_and_warm(
    rwkv7_file, tmp_path, monkeypatch):
  """--weights_dtype=float16: the cold run's TensorFlow program reads the
  16-bit matrices; the warm run's LiteRT artifact holds their float32
  values (`litert.export.held_in_float32`); both print the library's
  text."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from tests import test_fast_path as fast  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(rwkv7_file, weights_dtype="float16")
  want = fast.render(rnnstep.generate(model, ["ROMEO:"] * 2 + ["To be"] * 2,
                                      40, seed=7, temperature=0.8, top_k=20),
                     7)
  cache = tmp_path / "cache"
  args = [f"--weights={rwkv7_file}", *fast.BASE, "--weights_dtype=float16"]
  cold = fast.cli(cache, args)
  assert cold.returncode == 0, cold.stderr[-3000:]
  assert cold.stdout == want
  fast.wait_for_valid_entry(
      cache, compiled_cache.key(rwkv7_file, compiled_cache.runtime_version(),
                                "float16"),
      monkeypatch)
  warm = fast.cli(cache, args)
  assert warm.returncode == 0, warm.stderr[-3000:]
  assert "fast path: compiled artifact" in fast.verbose_line(warm)
  assert warm.stdout == want


# Exhaustive (a server process, an export): the default run's 16-bit test
# decodes on the graph path, the server's lanes' and the export's.
@pytest.mark.exhaustive
def test_server_and_saved_model_give_the_library_s_16bit_text(rwkv7_file,
                                                              tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests.support import http  # pylint: disable=g-import-not-at-top
  from tests.support import serve_process  # pylint: disable=g-import-not-at-top
  from tests.test_saved_model import DECODING_DEFAULTS  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(rwkv7_file, weights_dtype="bfloat16")
  prompt = "Hello the poet said"
  export_dir = rnnstep.export(model, str(tmp_path / "served"))
  dtypes = {k: tf.int64 if k == "seed" else tf.float32 if isinstance(
      v, float) else tf.int32 for k, v in DECODING_DEFAULTS.items()}
  ids = model.encode(prompt)
  out = tf.saved_model.load(export_dir).signatures["generate_ids"](
      prompt_ids=tf.constant([ids], tf.int32),
      prompt_lengths=tf.constant([len(ids)], tf.int32),
      num_steps=tf.constant(12),
      **{k: tf.constant(v, dtypes[k]) for k, v in
         dict(DECODING_DEFAULTS, temperature=0.0).items()})
  assert out["text"].numpy()[0].decode("utf-8") == rnnstep.generate(
      model, prompt, 12, temperature=0.0, jit_compile=False)
  if not serve_process.stack_installed():
    pytest.skip("the serving stack is not installed (pip install "
                "'rnnstep[serve]')")
  # Two rows in one call (each matrix widened once a call:
  # `sixteen_bit.product`), then one (read as 16 bits).
  bodies = [dict(prompt=[prompt, "the café"], max_tokens=12, seed=1,
                 temperature=0.9),
            dict(prompt=prompt, max_tokens=12, seed=2, temperature=0.9)]
  with serve_process.RemoteServer([f"--model={rwkv7_file}",
                                   "--weights_dtype=bfloat16",
                                   "--max_batch=2"],
                                  startup_timeout=300) as server:
    for body in bodies:
      reply = http.post(server.url("/v1/completions"), json=body,
                        timeout=120)
      assert reply.status_code == 200, reply.text
      assert [c["text"] for c in reply.json()["choices"]] == (
          serve_process.expected(model, body, body["seed"])[0])


# Exhaustive: test_litert_int8_products_are_every_cell_kind_s runs a GRU
# (and every other kind) through an int8 artifact in the default run.
@pytest.mark.exhaustive  # A LiteRT conversion.
def test_litert_gives_int8_s_text(gru_file):
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from rnnstep.litert import export as litert  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner as litert_runner  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(gru_file, weights_dtype="int8")
  got = litert_runner.run_artifact(litert.convert(model), list(model.vocab),
                                   [PROMPT, "A"], 24, tokens=model.tokens,
                                   temperature=0.0, seed=0)
  assert got == rnnstep.generate(model, [PROMPT, "A"], 24, temperature=0.0,
                                 jit_compile=False)


@pytest.mark.slow  # A LiteRT conversion.
def test_litert_int8_products_are_every_cell_kind_s(tmp_path):
  """Every product of every cell kind (LSTM, GRU both ways, SimpleRNN, a
  head) is XNNPACK's int8 one in the artifact, none left a float32 matmul
  (a GRU without reset_after slices its recurrent kernel: sliced outside
  the loops, it reached the converter as a loop operand, a float32
  BATCH_MATMUL), so the artifact gives the library's int8 texts."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  from rnnstep.litert import export as litert  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner as litert_runner  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(7)
  layers = (model_file.LayerConfig("lstm", 20),
            model_file.LayerConfig("gru", 18, False),
            model_file.LayerConfig("simple_rnn", 16),
            model_file.LayerConfig("gru", 24, True))
  config = model_file.ModelConfig(12, layers,
                                  head=(model_file.HeadLayer(20, "tanh"),))
  tensors = {k: (rng.normal(size=shape) * (
      2.5 / np.sqrt(shape[0]) if len(shape) > 1 else 0.3)).astype(np.float32)
             for k, shape in config.expected_shapes(len(cli.VOCAB)).items()}
  path = tmp_path / "kinds.npz"
  model_file.write(path, config, cli.VOCAB, tensors)
  model = rnnstep.load(str(path), weights_dtype="int8")
  flatbuffer = litert.convert(model)
  stored = schema.Model.GetRootAs(flatbuffer, 0)
  codes = [max(stored.OperatorCodes(i).BuiltinCode(),
               stored.OperatorCodes(i).DeprecatedBuiltinCode())
           for i in range(stored.OperatorCodesLength())]
  assert schema.BuiltinOperator.BATCH_MATMUL not in codes
  prompts = ["ROMEO: the", "A", "To be or", "pin\nkin, ok", "the king"]
  for decoding in (dict(temperature=0.0, seed=0),
                   dict(temperature=1.0, seed=3, top_p=0.9)):
    assert litert_runner.run_artifact(
        flatbuffer, list(model.vocab), prompts, 60, tokens=model.tokens,
        **decoding) == rnnstep.generate(model, prompts, 60, jit_compile=False,
                                        **decoding)


@pytest.mark.parametrize("weights_dtype", REDUCED)
def test_file_stores_fewer_bytes_and_reads_back_the_same_weights(
    gru_file, tmp_path, weights_dtype):
  model = rnnstep.load(gru_file, weights_dtype=weights_dtype)
  path = tmp_path / f"{weights_dtype}.npz"
  model_file.write(path, model.config, model.vocab, model.tensors(),
                   weights_dtype=weights_dtype)
  # A tiny model: the biases and the members' headers are much of it.
  assert os.path.getsize(path) < os.path.getsize(gru_file) * (
      0.5 if weights_dtype == "int8" else 0.65)
  with np.load(path) as members:
    assert str(members["weights_dtype"]) == weights_dtype
    stored = {"float16": np.float16, "bfloat16": np.uint16,
              "int8": np.int8}[weights_dtype]
    for key in GRU_KEYS:
      assert members[key].dtype == stored, key
    assert members["layer0_bias"].dtype == np.float32
  again = rnnstep.load(str(path))  # No flag: the file's dtype.
  assert again.weights_dtype == weights_dtype
  for key, value in model.tensors().items():
    np.testing.assert_array_equal(again.tensors()[key], value, err_msg=key)
  # Rounding the rounded weights again changes nothing.
  twice = rnnstep.load(str(path), weights_dtype=weights_dtype)
  for key, value in model.tensors().items():
    np.testing.assert_array_equal(twice.tensors()[key], value, err_msg=key)


# The default run serves the flag (its own cache key, the fill loading the
# float32 file as int8); a file stored int8 (the fill reads its dtype as
# `rnnstep.load` does) is exhaustive.
@pytest.mark.slow  # Command-line runs, artifacts built in the background.
@pytest.mark.parametrize("stored", quick_params([True, False], False))
def test_the_warm_command_line_serves_int8_with_its_text(
    gru_file, tmp_path, monkeypatch, stored):
  """An int8 model's compiled artifact multiplies on XNNPACK's int8 kernel
  (`rnnstep.litert.int8_products`): the cold run (TensorFlow) and the warm
  one (the artifact) print the library's int8 text, for a file stored int8
  and for a float32 file with --weights_dtype=int8 (its own entry)."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from tests import test_fast_path as fast  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  small, flag, dtype = gru_file, ["--weights_dtype=int8"], "int8"
  if stored:
    small, flag, dtype = tmp_path / "int8.npz", [], None
    plain = model_file.read(gru_file)
    model_file.write(small, plain.config, plain.vocab, plain.tensors,
                     weights_dtype="int8")
  model = rnnstep.load(str(small), weights_dtype="int8")
  want = fast.render(rnnstep.generate(model, ["ROMEO:"] * 2 + ["To be"] * 2,
                                      40, seed=7, temperature=0.8, top_k=20),
                     7)
  cache = tmp_path / "cache"
  args = [f"--weights={small}", *fast.BASE, *flag]
  cold = fast.cli(cache, args)
  assert cold.returncode == 0, cold.stderr[-3000:]
  assert cold.stdout == want
  fast.wait_for_valid_entry(
      cache, compiled_cache.key(str(small), compiled_cache.runtime_version(),
                                dtype),
      monkeypatch)
  warm = fast.cli(cache, args)
  assert warm.returncode == 0, warm.stderr[-3000:]
  assert "fast path: compiled artifact" in fast.verbose_line(warm)
  assert warm.stdout == want


@pytest.mark.slow  # Command-line runs.
def test_cli_convert_stores_int8_and_generate_gives_the_library_s_text(
    gru_file, tmp_path):
  small = tmp_path / "int8.npz"
  cli.ok(cli.run_binary(cli.command("rnnstep-convert", "rnnstep.cli.convert"),
                        [f"--input={gru_file}", f"--output={small}",
                         "--weights_dtype=int8"]))
  want = rnnstep.generate(rnnstep.load(gru_file, weights_dtype="int8"),
                          PROMPT, 20, temperature=0.0, seed=1)
  generate = cli.command("rnnstep-generate", "rnnstep.cli.generate")
  for args in ([f"--model={small}"],
               [f"--model={gru_file}", "--weights_dtype=int8"]):
    result = cli.run_binary(generate, args + [
        f"--prompt={PROMPT}", "--num_steps=20", "--temperature=0",
        "--seed=1", "--nocache"])
    cli.ok(result)
    assert result.stdout.rstrip("\n") == PROMPT + want


def test_bad_values_are_refused_in_one_line(gru_file, tmp_path):
  with pytest.raises(errors.ArgumentError, match="weights_dtype must be one"
                     " of float32, float16, bfloat16, int8, got 'int4'"):
    rnnstep.load(gru_file, weights_dtype="int4")
  plain = model_file.read(gru_file)
  with pytest.raises(ValueError, match="weights_dtype must be one of"):
    model_file.write(tmp_path / "x.npz", plain.config, plain.vocab,
                     plain.tensors, weights_dtype="int4")
  big = dict(plain.tensors, dense_kernel=plain.tensors["dense_kernel"] * 1e5)
  with pytest.raises(ValueError, match="weights_dtype=float16: tensor "
                     "dense_kernel holds values beyond float16's range"):
    model_file.write(tmp_path / "x.npz", plain.config, plain.vocab, big,
                     weights_dtype="float16")
  assert not (tmp_path / "x.npz").exists()


@pytest.mark.slow  # A command-line run.
def test_the_command_line_refuses_a_bad_weights_dtype_in_one_line(gru_file):
  result = cli.run_binary(cli.command("rnnstep-generate",
                                      "rnnstep.cli.generate"),
                          [f"--model={gru_file}", "--weights_dtype=int4"])
  assert "--weights_dtype" in cli.one_error_line(result)


def test_a_forged_reduced_file_is_refused_in_one_line(gru_file, tmp_path):
  path = tmp_path / "int8.npz"
  plain = model_file.read(gru_file)
  model_file.write(path, plain.config, plain.vocab, plain.tensors,
                   weights_dtype="int8")
  with np.load(path) as members:
    members = dict(members)
  forged = [("dense_kernel__scale", members["dense_kernel__scale"][0],
             "dense_kernel__scale is float32"),
            ("dense_kernel", members["dense_kernel"].astype(np.int16),
             "dense_kernel is stored as int16, expected int8"),
            ("weights_dtype", np.array("int4"), "weights_dtype 'int4'")]
  for key, value, message in forged:
    bad = tmp_path / f"bad_{key}.npz"
    np.savez(bad, **dict(members, **{key: value}))
    with pytest.raises(ValueError, match=message):
      model_file.read(bad)
  bad = tmp_path / "no_scale.npz"
  np.savez(bad, **{k: v for k, v in members.items()
                   if k != "embedding__scale"})
  with pytest.raises(ValueError, match="missing tensor embedding__scale"):
    model_file.read(bad)


@pytest.mark.slow  # A server process.
def test_server_gives_the_library_s_int8_text(gru_file):
  from tests.support import serve_process  # pylint: disable=g-import-not-at-top
  if not serve_process.stack_installed():
    pytest.skip("the serving stack is not installed (pip install "
                "'rnnstep[serve]')")
  from tests.support import http  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(gru_file, weights_dtype="int8")
  body = dict(prompt=PROMPT, max_tokens=20, seed=1, temperature=0.9)
  want = serve_process.expected(model, body, body["seed"])[0]
  with serve_process.RemoteServer([f"--model={gru_file}",
                                   "--weights_dtype=int8", "--max_batch=2",
                                   "--jit_compile=false",
                                   "--lanes=1"], startup_timeout=300) as server:
    reply = http.post(server.url("/v1/completions"), json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert [c["text"] for c in reply.json()["choices"]] == want


def test_converting_weights_stores_them_reduced(tmp_path):
  """rnnstep.convert.convert (rnnstep-convert) on PyTorch weights, stored
  int8: the file loads as the weights loaded with weights_dtype int8."""
  from rnnstep import convert  # pylint: disable=g-import-not-at-top
  data = pathlib.Path(__file__).parent / "data" / "word_lm"
  path = tmp_path / "gru-int8.npz"
  summary = convert.convert(data / "gru.pt", path, corpus=data / "corpus",
                            weights_dtype="int8")
  assert "weights:    int8" in str(summary)
  stored = rnnstep.load(str(path))
  assert stored.weights_dtype == "int8"
  loaded = rnnstep.load(str(data / "gru.pt"), corpus=str(data / "corpus"),
                        weights_dtype="int8")
  for key, value in loaded.tensors().items():
    np.testing.assert_array_equal(stored.tensors()[key], value, err_msg=key)


# Exhaustive (an export and a load, 5 CPU-s): the default run keeps the
# SavedModel caller (tests/test_saved_model.py) and int8 on the CLI, the
# server, LiteRT and every path in process.
@pytest.mark.exhaustive
def test_saved_model_serves_the_library_s_int8_text(gru_file, tmp_path):
  """The SavedModel of an int8 model holds its int8 kernels and computes
  the int8 arithmetic in its graph: the library's int8 text."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(gru_file, weights_dtype="int8")
  export_dir = rnnstep.export(model, str(tmp_path / "served"))
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  out = serve(prompts=tf.constant([PROMPT, "A"]),
              temperature=tf.constant(0.0), seed=tf.constant(1, tf.int64),
              num_steps=tf.constant(24))
  assert [t.decode() for t in out["text"].numpy()] == rnnstep.generate(
      model, [PROMPT, "A"], 24, temperature=0.0, seed=1)
