"""Models from public recipes, built with real Keras (small, few).

- The keras.io "Character-level text generation with LSTM" model:
  `Sequential([Input((T, V)), LSTM(U), Dense(V, activation="softmax")])` over
  one-hot vectors, saved by Keras 3 (in this process) and by tf_keras 2 (in a
  subprocess, `python -m tests.support.recipes OUT` with
  TF_USE_LEGACY_KERAS=1) in every file kind each writes: rnnstep maps it to an
  identity Embedding, keeps the Dense's pre-softmax logits, and records
  `window: T` (its Input fixes T and its LSTM has return_sequences=False). The
  reference is Keras's own LSTM (return_sequences=True) and linear Dense given
  the saved model's weights: logits on fixed ids, greedy text after a prompt.
- A textgenrnn-shaped graph (Embedding -> 2 LSTM -> concatenate ->
  attention-weighted average -> Dense; its layer names): saved as a full
  model (its config names the custom layer) or by Keras 3, refused in one
  line naming the attention layer, before its {token: index} vocabulary is
  read; written as textgenrnn writes it (tf_keras `save_weights` to HDF5),
  converted (tests/test_recompute.py checks textgenrnn's own files).
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.support import forkserver
from tests.support import keras_models as km
from tests.support.recipes import GREEDY_STEPS, REPO, TOLERANCE, WINDOW
from tests.support.recipes import build_all

import rnnstep
from rnnstep import convert

# Quick tier (-m "not slow") leaves this file out: the recipes' models built
# with Keras 3 and tf_keras (a subprocess).
pytestmark = pytest.mark.slow

keras = pytest.importorskip("keras")


@pytest.fixture(scope="module", params=["keras3", "tf_keras"])
def built(request, tmp_path_factory):
  out = str(tmp_path_factory.mktemp(request.param))
  if request.param == "keras3":
    return build_all(keras, out, keras2=False)
  pytest.importorskip("tf_keras")
  env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
         "PYTHONPATH": REPO}
  subprocess.run([sys.executable, "-m", "tests.support.recipes", out],
                 cwd=REPO, env=env, check=True, timeout=600,
                 stdin=subprocess.DEVNULL)
  with open(os.path.join(out, "cases.json"), encoding="utf-8") as f:
    return json.load(f)


# Per reference (one Keras model saved in several formats): the tensors of
# the first of its files checked against Keras.
CHECKED_TENSORS = {}


@pytest.fixture
def one_hot_files(built):
  case = dict(built["one_hot"])
  ref = np.load(case["ref"])
  case.update(ids=ref["ids"], logits=ref["logits"], prompt=str(ref["prompt"]),
              greedy=str(ref["greedy"]), dir=os.path.dirname(case["ref"]))
  return case


@pytest.mark.parametrize("fmt", ["keras", "legacy_h5", "weights_h5",
                                 "tf_checkpoint"])
def test_one_hot_model_matches_keras(one_hot_files, fmt):
  case = one_hot_files
  model = rnnstep.load(case["files"][fmt], vocab=case["vocab"])
  tensors = model.tensors()
  # A format read into exactly the tensors of one checked already is exact
  # as that one is (the checks below trace a fresh model: seconds each).
  checked = CHECKED_TENSORS.get(case["ref"])
  if checked is None or not km.same_tensors(checked, tensors):
    # The reference steps the LSTM statefully (windows: tests/test_window.py).
    logits = rnnstep.logits(model, case["ids"], window=0)[0]
    assert float(np.abs(logits - case["logits"]).max()) <= TOLERANCE
    text = rnnstep.generate(model, case["prompt"], GREEDY_STEPS, temperature=0,
                            window=0)
    assert text == case["greedy"]
    CHECKED_TENSORS.setdefault(case["ref"], tensors)
  # Only the files with a config know the model was built for windows.
  has_config = fmt in ("keras", "legacy_h5")
  assert model.config.window == (WINDOW if has_config else None)
  summary = convert.describe(case["files"][fmt])
  assert summary.layers[0].name == "(one-hot input)"
  assert any("identity Embedding" in note for note in summary.notes)
  if has_config:
    assert any("softmax dropped" in note for note in summary.notes)
    assert any(f"window={WINDOW}" in note for note in summary.notes)


def test_converted_one_hot_model_file_records_the_window(one_hot_files,
                                                         tmp_path):
  out = tmp_path / "m.npz"
  convert.convert(one_hot_files["files"]["keras"], out,
                  vocab=one_hot_files["vocab"])
  model = rnnstep.load(out)
  assert model.config.window == WINDOW
  assert json.loads(str(np.load(out)["config"]))["window"] == WINDOW
  np.testing.assert_array_equal(model.tensors()["embedding"],
                                np.eye(len(one_hot_files["chars"])))


# ------------------------------------------------------------- textgenrnn


@pytest.fixture
def textgenrnn_like(built):
  return built["textgenrnn"]


@pytest.mark.parametrize("kind", ["full_h5", "weights_hdf5"])
def test_textgenrnn_like_model_is_refused_first_naming_the_attention_layer(
    textgenrnn_like, kind):
  """Unless it is textgenrnn's own form (Keras 2 `save_weights` HDF5, its
  layers' names), which converts (#35; tests/test_recompute.py checks it
  against textgenrnn's code): a full model naming the custom class in its
  config, or Keras 3's weights file, is refused."""
  path = textgenrnn_like["files"][kind]
  if path.endswith("_weights.hdf5"):
    model = rnnstep.load(path, vocab=textgenrnn_like["vocab"])
    assert model.config.attention and model.tokens.rules["start"] == "<s>"
    return
  for call in (lambda: convert.describe(path),
               lambda: rnnstep.load(path, vocab=textgenrnn_like["vocab"])):
    with pytest.raises(ValueError) as info:
      call()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(path)
    assert re.search(r"'(layers/)?attention", message), message
    assert "rnnstep maps Embedding" in message, message
    assert "vocab" not in message, message


def test_a_token_map_is_refused_and_a_token_list_is_a_word_vocabulary(
    one_hot_files, textgenrnn_like, tmp_path):
  # textgenrnn's map (with its '<s>') is textgenrnn's vocabulary (#35):
  # here of another size than the model's.
  with pytest.raises(ValueError, match=r"textgenrnn_vocab.json gives 12 "
                     r"words") as info:
    rnnstep.load(one_hot_files["files"]["keras"],
                 vocab=textgenrnn_like["vocab"])
  assert "\n" not in str(info.value)
  token_map = tmp_path / "map.json"
  token_map.write_text(json.dumps({"ab": 1, "c": 2}))
  with pytest.raises(ValueError, match=r"map.json: vocab is a JSON object "
                     r"\{token: index\} with multi-character tokens such as "
                     r"'ab', not a list") as info:
    rnnstep.load(one_hot_files["files"]["keras"], vocab=token_map)
  assert "\n" not in str(info.value)
  # It names the files read besides lists (a GPT-2 vocab.json is such a map).
  assert "a Hugging Face tokenizer.json" in str(info.value)
  # A byte vocabulary's entries are tokens, not words.
  byte_file = tmp_path / "bytes.json"
  byte_file.write_text(json.dumps({"kind": "bytes"}))
  with pytest.raises(ValueError, match=r"bytes.json gives 256 tokens but"):
    rnnstep.load(one_hot_files["files"]["keras"], vocab=byte_file)
  # A list with a multi-character entry is a word vocabulary (#34), one
  # token per id, in the list's order.
  tokens = os.path.join(one_hot_files["dir"], "tokens.json")
  words = one_hot_files["chars"][:-1] + ["<s>"]
  with open(tokens, "w", encoding="utf-8") as f:
    json.dump(words, f)
  model = rnnstep.load(one_hot_files["files"]["keras"], vocab=tokens)
  assert model.tokens.kind == "words"
  assert list(model.vocab) == words


def test_generate_cli_names_a_missing_vocab_file_once(one_hot_files, tmp_path):
  missing = tmp_path / "missing.json"
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
  proc = forkserver.run(
      [sys.executable, "-m", "rnnstep.cli.generate",
       f"--weights={one_hot_files['files']['keras']}", f"--vocab={missing}",
       "--num_steps=3"], cwd=REPO, capture_output=True, text=True, env=env,
      timeout=600, stdin=subprocess.DEVNULL)
  assert proc.returncode == 1
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, proc.stderr
  assert lines[0].count(str(missing)) == 1, lines[0]
  assert f"--vocab={missing}: No such file or directory" in lines[0]


@pytest.mark.parametrize("steps,return_sequences,window", [
    (8, False, 8), (None, False, None), (8, True, None)])
def test_window_needs_fixed_steps_and_a_last_output_only(
    tmp_path, steps, return_sequences, window):
  """With an Embedding too: the window is a fact of the Input and the last
  recurrent layer, not of one-hot inputs."""
  model = keras.Sequential([
      keras.Input(shape=(steps,), dtype="int32"), keras.layers.Embedding(5, 3),
      keras.layers.GRU(4, return_sequences=True),
      keras.layers.GRU(4, return_sequences=return_sequences),
      keras.layers.Dense(5)])
  path = str(tmp_path / "m.keras")
  model.save(path)
  summary = convert.describe(path)
  assert summary.config.window == window
  if steps is None:
    assert any("fixes no window length" in note for note in summary.notes)
