"""rnnstep-convert on real Keras files written during the test run.

Keras 3 writes its files in this process (`.keras` Sequential/Functional/
subclassed, `.weights.h5`, legacy `.h5`, `tf.train.Checkpoint(model=m)`);
tf_keras 2.x writes its files in one subprocess (TF_USE_LEGACY_KERAS=1): `w.h5`,
full `m.h5`, `.keras`, the current tutorial's ModelCheckpoint directory and a
prefix, and the 2019-20 stateful tutorial's checkpoint. For each file the
converted model's logits must be within 1e-5 of the Keras model's on the same
ids, and its greedy text identical to a Keras greedy loop (100 characters).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # pylint: disable=g-import-not-at-top
import numpy as np
import pytest

import rnnstep
from rnnstep import convert
from rnnstep.model import model_file
from tests.support import forkserver
from tests.support import keras_models as km

# Quick tier (-m "not slow") leaves this file out: real Keras files written in
# this process and by tf_keras in a subprocess.
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5

KERAS3_FILES = [
    ("k3_seq_gru", "keras"), ("k3_seq_gru", "weights_h5"),
    ("k3_seq_gru", "legacy_h5"), ("k3_seq_gru", "tf_checkpoint"),
    ("k3_seq_gru", "keras_dir"),
    ("k3_fun_lstm_gru", "keras"), ("k3_fun_lstm_gru", "weights_h5"),
    ("k3_fun_lstm_gru", "legacy_h5"), ("k3_fun_lstm_gru", "tf_checkpoint"),
    ("k3_seq_lstm", "keras"), ("k3_seq_simple_rnn", "keras"),
    ("k3_seq_simple_rnn_relu", "keras"),
    ("k3_seq_gru2", "keras"), ("k3_seq_gru2", "weights_h5"),
    ("k3_sub_tutorial", "keras"), ("k3_sub_tutorial", "weights_h5"),
    ("k3_sub_tutorial", "tf_checkpoint"), ("k3_sub_stack", "keras"),
]
TF_KERAS_FILES = [
    ("k2_seq_gru", "w_h5"), ("k2_seq_gru", "m_h5"), ("k2_seq_gru", "keras"),
    ("k2_seq_lstm_gru", "m_h5"), ("k2_seq_lstm_gru", "w_h5"),
    ("k2_seq_gru2", "m_h5"), ("k2_seq_gru2", "w_h5"),
    ("k2_seq_lstm", "m_h5"), ("k2_seq_simple_rnn", "m_h5"),
    ("k2_fun_rnn_gru", "m_h5"),
    ("k2_tutorial", "tf_checkpoint_dir"), ("k2_tutorial", "tf_checkpoint_prefix"),
    ("k2_tutorial", "w_h5"), ("k2_stateful", "tf_checkpoint_dir"),
]
MAX_ERRORS = {}
# Per case (one Keras model saved in several formats): the tensors of the
# first of its files checked against Keras here. A later format of the case
# that converts to exactly these tensors is exact as that one is, and skips
# the checks that trace a fresh model (a few seconds each).
CHECKED_TENSORS = {}


def subprocess_env(**extra):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
  env.pop("TF_USE_LEGACY_KERAS", None)
  env.update(extra)
  return env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A corpus whose sorted(set(text)) is the 65 tinyshakespeare characters."""
  path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
  text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
  path.write_bytes((text + km.CHARS[::-1] + text).encode("utf-8"))
  return str(path)


@pytest.fixture(scope="module")
def keras3_cases(tmp_path_factory):
  return km.keras3_cases(keras, str(tmp_path_factory.mktemp("keras3")))


@pytest.fixture(scope="module")
def tf_keras_cases(tmp_path_factory):
  out = tmp_path_factory.mktemp("tf_keras")
  result = subprocess.run(
      [sys.executable, "-m", "tests.support.keras_models", "tf_keras", str(out)],
      cwd=REPO, capture_output=True, text=True, timeout=900,
      env=subprocess_env(TF_USE_LEGACY_KERAS="1"))
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads((out / "cases.json").read_text())


@pytest.fixture(scope="module", autouse=True)
def report_errors():
  yield
  if MAX_ERRORS:
    print("\nmax |logit error| per converted file:")
    for key, err in sorted(MAX_ERRORS.items()):
      print(f"  {key}: {err:.2e}")


def check_file(name, fmt, case, corpus, tmp_path):
  """Converts one file; compares logits and greedy text with Keras.

  A file whose tensors are bit for bit those of another format of the same
  case, checked already (`CHECKED_TENSORS`), is checked by that equality.
  """
  path = case["files"][fmt]
  out = tmp_path / "model.npz"
  summary = convert.convert(path, out, corpus=corpus)
  assert summary.output_path == str(out)
  assert summary.has_unk == case["unk"]
  reference = np.load(case["ref"])
  model = rnnstep.load(out)
  assert model.has_unk == case["unk"]
  assert model.vocab == tuple(km.vocab(case["unk"]))
  tensors = model.tensors()
  if name in CHECKED_TENSORS and km.same_tensors(CHECKED_TENSORS[name], tensors):
    return summary
  error = float(np.abs(rnnstep.logits(model, reference["ids"])
                       - reference["logits"]).max())
  MAX_ERRORS[f"{name} {fmt}"] = error
  assert error <= TOLERANCE, f"{name} {fmt}: max logit error {error}"
  expected = str(reference["greedy"])
  assert len(expected) >= 100
  text = rnnstep.generate(model, km.PROMPT, len(expected), temperature=0,
                          jit_compile=False)
  assert text == expected
  CHECKED_TENSORS.setdefault(name, tensors)
  return summary


@pytest.mark.parametrize("name,fmt", KERAS3_FILES)
def test_keras3_file(name, fmt, keras3_cases, corpus, tmp_path):
  check_file(name, fmt, keras3_cases[name], corpus, tmp_path)


@pytest.mark.parametrize("name,fmt", TF_KERAS_FILES)
def test_tf_keras_file(name, fmt, tf_keras_cases, corpus, tmp_path):
  check_file(name, fmt, tf_keras_cases[name], corpus, tmp_path)


def test_every_written_file_is_tested(keras3_cases, tf_keras_cases):
  for cases, tested in ((keras3_cases, KERAS3_FILES),
                        (tf_keras_cases, TF_KERAS_FILES)):
    written = {(name, fmt) for name, c in cases.items() for fmt in c["files"]}
    assert written == set(tested)


def test_stack_under_xla(keras3_cases, corpus, tmp_path):
  case = keras3_cases["k3_fun_lstm_gru"]
  convert.convert(case["files"]["keras"], tmp_path / "m.npz", corpus=corpus)
  model = rnnstep.load(tmp_path / "m.npz")
  expected = str(np.load(case["ref"])["greedy"])
  assert rnnstep.generate(model, km.PROMPT, len(expected), temperature=0,
                          jit_compile=True) == expected


def test_inspect_reports_format_layers_and_vocab_size(keras3_cases,
                                                      tf_keras_cases):
  summary = convert.describe(keras3_cases["k3_fun_lstm_gru"]["files"]["keras"])
  assert "Functional" in summary.format and ".keras" in summary.format
  assert [layer.kind for layer in summary.layers] == [
      "embedding", "lstm", "gru", "dense"]
  assert summary.layers[1].shapes == [(12, 96), (24, 96), (96,)]
  assert summary.config == model_file.ModelConfig(12, (
      model_file.LayerConfig("lstm", 24), model_file.LayerConfig("gru", 16, False)))
  assert summary.vocab_size == km.V and summary.vocab is None
  assert any("Dropout" in note for note in summary.notes)
  text = str(summary)
  assert "LSTM" in text and "zero bias written" in text and "65" in text

  summary = convert.describe(tf_keras_cases["k2_tutorial"]["files"][
      "tf_checkpoint_dir"])
  assert "latest checkpoint" in summary.format and "ckpt_2" in summary.format
  assert summary.vocab_size == km.V_UNK
  assert [layer.name for layer in summary.layers] == ["embedding", "gru", "dense"]

  summary = convert.describe(tf_keras_cases["k2_stateful"]["files"][
      "tf_checkpoint_dir"])
  assert [layer.name for layer in summary.layers] == [
      "layer_with_weights-0", "layer_with_weights-1", "layer_with_weights-2"]


def test_directory_means_latest_checkpoint(tf_keras_cases, corpus, tmp_path):
  files = tf_keras_cases["k2_tutorial"]["files"]
  _, latest = convert.read_weights(files["tf_checkpoint_dir"])
  _, second = convert.read_weights(files["tf_checkpoint_prefix"])
  _, first = convert.read_weights(os.path.join(files["tf_checkpoint_dir"],
                                               "ckpt_1"))
  for key in latest:
    np.testing.assert_array_equal(latest[key], second[key])
  assert not np.array_equal(latest["layer0_kernel"], first["layer0_kernel"])
  # The .index file names the same prefix.
  _, index = convert.read_weights(files["tf_checkpoint_prefix"] + ".index")
  np.testing.assert_array_equal(index["dense_kernel"], latest["dense_kernel"])


def test_read_weights_returns_config_and_tensors(keras3_cases):
  config, tensors = convert.read_weights(
      keras3_cases["k3_fun_lstm_gru"]["files"]["tf_checkpoint"])
  assert config.layers == (model_file.LayerConfig("lstm", 24),
                           model_file.LayerConfig("gru", 16, False))
  shapes = {key: value.shape for key, value in tensors.items()}
  assert shapes == config.expected_shapes(km.V)
  assert all(value.dtype == np.float32 for value in tensors.values())
  np.testing.assert_array_equal(tensors["dense_bias"], np.zeros(km.V))


def test_vocab_file_and_list(keras3_cases, tf_keras_cases, corpus, tmp_path):
  # A JSON vocab file carries newline and space; [UNK] may be given or implied.
  vocab_file = tmp_path / "vocab.json"
  vocab_file.write_text(json.dumps(list(km.CHARS)), encoding="utf-8")
  unk_file = tmp_path / "vocab_unk.json"
  unk_file.write_text(json.dumps(["[UNK]"] + list(km.CHARS), ensure_ascii=False),
                      encoding="utf-8")
  assert convert.read_vocab_file(vocab_file)[:2] == ["\n", " "]
  path = tf_keras_cases["k2_tutorial"]["files"]["tf_checkpoint_dir"]
  for vocab in (str(vocab_file), str(unk_file), list(km.CHARS)):
    summary = convert.convert(path, tmp_path / "m.npz", vocab=vocab)
    assert summary.vocab == km.vocab(True)
    assert rnnstep.load(tmp_path / "m.npz").vocab == tuple(km.vocab(True))
  summary = convert.convert(keras3_cases["k3_seq_lstm"]["files"]["keras"],
                            tmp_path / "m.npz", vocab=str(vocab_file))
  assert summary.vocab == list(km.CHARS) and not summary.has_unk


def test_corpus_vocab_keeps_raw_newlines(tmp_path):
  path = tmp_path / "crlf.txt"
  path.write_bytes("a b\r\nc\u00e9".encode("utf-8"))
  assert convert.read_corpus_vocab(path) == ["\n", "\r", " ", "a", "b", "c",
                                             "\u00e9"]
  assert convert.vocab_from_corpus("ba\nab") == ["\n", "a", "b"]


# ---------------------------------------------- without Keras, through the CLI


NO_KERAS_SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("keras", "tf_keras"):
      sys.modules[name] = None
    from rnnstep import convert
    for source, target, corpus in json.loads(sys.argv[1]):
      convert.convert(source, target, corpus=corpus)
    loaded = sorted(m for m in sys.modules
                    if m.split(".")[0] in ("keras", "tf_keras")
                    and sys.modules[m] is not None)
    print("keras modules:", loaded)
""")


def test_every_format_converts_with_keras_unimportable(
    keras3_cases, tf_keras_cases, corpus, tmp_path):
  jobs = []
  for cases in (keras3_cases, tf_keras_cases):
    for name, case in cases.items():
      for fmt, path in case["files"].items():
        jobs.append((path, str(tmp_path / f"{name}.{fmt}.npz"), corpus))
  result = subprocess.run([sys.executable, "-c", NO_KERAS_SCRIPT,
                           json.dumps(jobs)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=subprocess_env())
  assert result.returncode == 0, result.stderr[-4000:]
  assert result.stdout.strip().splitlines()[-1] == "keras modules: []"
  for source, target, _ in jobs:  # The same bytes as an in-process conversion.
    _, tensors = convert.read_weights(source)
    written = model_file.read(target).tensors
    assert sorted(written) == sorted(tensors)
    for key in tensors:
      np.testing.assert_array_equal(written[key], tensors[key])


def run_cli(*args):
  """The installed console script, as a user runs it."""
  return forkserver.run(["rnnstep-convert", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300,
                        env=subprocess_env())


def stderr_lines(result):
  """stderr without the lines TensorFlow prints while `import rnnstep` loads it
  (see docs/guide/converting.md); what remains is the CLI's own output."""
  lines = result.stderr.splitlines()
  return [line for line in lines if not (
      line.startswith("WARNING: All log messages before absl::InitializeLog")
      or line[:1] in "IWE" and line[1:5].isdigit() and " " in line[:30]
      or line.startswith("To enable the following instructions"))]


def test_cli_help():
  result = run_cli("--help")
  assert result.returncode == 0
  assert "--input" in result.stdout and "--corpus" in result.stdout
  assert "--vocab" in result.stdout and "--inspect" in result.stdout
  assert stderr_lines(result) == []


def test_cli_convert_inspect_and_failure(keras3_cases, corpus, tmp_path):
  source = keras3_cases["k3_seq_gru"]["files"]["keras"]
  out = tmp_path / "out.npz"
  result = run_cli(f"--input={source}", f"--output={out}", f"--corpus={corpus}")
  assert result.returncode == 0, result.stderr
  assert stderr_lines(result) == []
  assert "GRU" in result.stdout and out.exists()
  assert rnnstep.load(out).vocab_size == km.V

  result = run_cli(f"--input={source}", "--inspect", f"--corpus={corpus}")
  assert result.returncode == 0, result.stderr
  assert "Sequential" in result.stdout and "nothing written" in result.stdout

  bad = tmp_path / "random.keras"
  bad.write_bytes(np.random.default_rng(0).bytes(5000))
  out = tmp_path / "never.npz"
  result = run_cli(f"--input={bad}", f"--output={out}", f"--corpus={corpus}")
  assert result.returncode == 1
  lines = stderr_lines(result)
  assert len(lines) == 1 and lines[0].startswith("rnnstep-convert: error: ")
  assert "not a Keras weights file" in lines[0]
  assert not out.exists() and list(tmp_path.glob(".rnnstep-*")) == []
