"""sherjilozair/char-rnn-tensorflow save directories (TF1 checkpoints with
config.pkl and chars_vocab.pkl), read without running the graph or
unpickling code.

The fixtures in tests/data/charrnn_tf/ were written by the recipe's own
model.py / train.py / sample.py (tools/make_charrnn_tf_fixtures.py: ported to
tf.compat.v1 only where tf.contrib is gone): HEAD's LSTMCell x2, the
pre-2018 BasicLSTMCell x2 (pickles of protocol 0, as Python 2 wrote them),
GRUCell x2 and BasicRNNCell, each with `reference.npz`: the recipe model's
logits fed one character at a time, and the text of its `sample()` loop with
`sampling_type=0` (argmax), prime included. rnnstep must match: logits
within 1e-5, greedy text character for character, on every path. Hostile
pickles are built here and must be refused with nothing run.
"""

import argparse
import os
import pathlib
import pickle
import shutil
import sys

import numpy as np
import pytest

import rnnstep
from rnnstep import convert
from tests.support import forkserver
from tests.support.cli import Result
from tests.support.hostile_pickles import RunsCode
from tests.support.tiers import quick_params

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "charrnn_tf"
TOLERANCE = 1e-5
FIXTURES = ["lstm", "basic_lstm", "gru", "rnn"]

_MODELS = {}


def _model(name):
  """One model per fixture, loaded straight from its save directory."""
  if name not in _MODELS:
    _MODELS[name] = rnnstep.load(DATA / name)
  return _MODELS[name]


def _reference(name):
  ref = np.load(DATA / name / "reference.npz")
  prime, greedy = str(ref["prime"]), str(ref["greedy"])
  return dict(logits_text=str(ref["logits_text"]), logits=ref["logits"],
              prime=prime, num=int(ref["num"]),
              continuation=greedy[len(prime):])


@pytest.mark.parametrize("name", FIXTURES)
def test_logits_and_greedy_text_match_the_recipe(name):
  model, ref = _model(name), _reference(name)
  logits = rnnstep.logits(model, model.encode(ref["logits_text"]))[0]
  assert np.abs(logits - ref["logits"]).max() < TOLERANCE
  text = rnnstep.generate(model, ref["prime"], ref["num"], temperature=0,
                          jit_compile=False)
  assert text == ref["continuation"]


@pytest.mark.parametrize("path", quick_params([True, "elementwise"]))
def test_every_path_gives_the_recipes_greedy_text(path):
  model, ref = _model("lstm"), _reference("lstm")
  assert rnnstep.generate(model, ref["prime"], ref["num"], temperature=0,
                          jit_compile=path) == ref["continuation"]


@pytest.mark.slow  # A stream is a program of its own.
def test_stream_gives_the_recipes_greedy_text():
  model, ref = _model("gru"), _reference("gru")
  pieces = rnnstep.stream(model, ref["prime"], ref["num"], temperature=0,
                          jit_compile=False)
  assert "".join(pieces) == ref["continuation"]


def test_describe_names_the_cells_and_the_folded_forget_bias():
  summary = convert.describe(DATA / "basic_lstm")
  assert "char-rnn-tensorflow TF1 checkpoint" in summary.format
  assert "BasicLSTMCell" in summary.format
  assert [layer.kind for layer in summary.layers] == [
      "embedding", "lstm", "lstm", "dense"]
  assert any("forget_bias=1.0" in note for note in summary.notes)
  gru = convert.describe(DATA / "gru")
  assert [layer.reset_after for layer in gru.config.layers] == [False, False]


def test_read_weights_maps_tf1_gates_to_keras_blocks():
  """Independently of the cells: the stored TF1 tensors, rearranged here."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  directory = DATA / "lstm"
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(directory)))
  stored = reader.get_tensor("rnnlm/multi_rnn_cell/cell_1/lstm_cell/kernel")
  bias = reader.get_tensor("rnnlm/multi_rnn_cell/cell_1/lstm_cell/bias")
  _, tensors = convert.read_weights(directory)
  units = 16
  i, j, f, o = np.split(stored, 4, axis=1)
  np.testing.assert_array_equal(tensors["layer1_kernel"],
                                np.concatenate([i, f, j, o], 1)[:units])
  np.testing.assert_array_equal(tensors["layer1_recurrent_kernel"],
                                np.concatenate([i, f, j, o], 1)[units:])
  bi, bj, bf, bo = np.split(bias, 4)
  np.testing.assert_array_equal(tensors["layer1_bias"],
                                np.concatenate([bi, bf + 1.0, bj, bo]))
  np.testing.assert_array_equal(tensors["dense_kernel"],
                                reader.get_tensor("rnnlm/softmax_w"))


def _copy(tmp_path, name="gru"):
  target = tmp_path / name
  shutil.copytree(DATA / name, target)
  return target


def test_any_tf_checkpoint_folder_s_own_checkpoint_wins(tmp_path):
  """The same rule for any TF checkpoint folder (`tf_checkpoint.resolve`,
  where TensorFlow's `latest_checkpoint` follows the recorded path)."""
  from rnnstep.convert import tf_checkpoint  # pylint: disable=g-import-not-at-top
  original, copy = tmp_path / "original", tmp_path / "copy"
  for folder in (original, copy):
    folder.mkdir()
    (folder / "ckpt-1.index").write_bytes(b"")
    (folder / "checkpoint").write_text(
        f'model_checkpoint_path: "{original}/ckpt-1"\n')
  assert tf_checkpoint.resolve(str(copy))[0] == str(copy / "ckpt-1")
  (copy / "ckpt-1.index").unlink()  # Only now is the recorded path read.
  prefix, how = tf_checkpoint.resolve(str(copy))
  assert prefix == f"{original}/ckpt-1" and "names" in how


@pytest.mark.parametrize("member", ["config.pkl", "chars_vocab.pkl"])
@pytest.mark.parametrize("protocol", [0, 2])
def test_a_hostile_pickle_is_refused_in_one_line_with_nothing_run(
    tmp_path, member, protocol):
  directory = _copy(tmp_path)
  marker = tmp_path / "ran"
  (directory / member).write_bytes(pickle.dumps(RunsCode(marker), protocol))
  for call in (lambda: rnnstep.load(directory), lambda: convert.describe(
      directory), lambda: convert.convert(directory, tmp_path / "m.npz")):
    with pytest.raises(ValueError) as info:
      call()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(directory / member)), message
    assert "'posix.system'" in message or "'nt.system'" in message, message
    assert "never runs code from a file (refused)" in message
  assert not marker.exists()
  assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("member,payload,message", [
    ("config.pkl", {"model": "lstm"},
     "holds 'dict', not the argparse.Namespace"),
    ("config.pkl", argparse.Namespace(model="nas", rnn_size=16, num_layers=2,
                                      vocab_size=58),
     "model='nas': NASCell is not a cell rnnstep runs"),
    ("config.pkl", argparse.Namespace(model="gru", rnn_size=16, num_layers=3,
                                      vocab_size=58),
     "config.pkl says num_layers=3 but the checkpoint holds cells [0, 1]"),
    ("config.pkl", argparse.Namespace(model="lstm", rnn_size=16, num_layers=2,
                                      vocab_size=58),
     "config.pkl says model='lstm' but cell_0 is a GRUCell"),
    ("config.pkl", argparse.Namespace(model="gru", rnn_size="16"),
     "no usable rnn_size"),
    ("chars_vocab.pkl", ["a", "b"],
     "holds a list of 2, not the (chars, vocab)"),
    ("chars_vocab.pkl", (("a", "bc"), {"a": 0, "bc": 1}),
     "chars[1] is 'bc', not one character"),
    ("chars_vocab.pkl", (("a", "b"), {"a": 1, "b": 0}),
     "vocab does not number chars in order"),
    ("chars_vocab.pkl", (tuple("ab"), {"a": 0, "b": 1}),
     "config.pkl says vocab_size=58 but chars_vocab.pkl holds 2 characters"),
])
def test_pickles_other_than_the_recipes_are_refused(tmp_path, member, payload,
                                                    message):
  directory = _copy(tmp_path)
  (directory / member).write_bytes(pickle.dumps(payload, 2))
  with pytest.raises(ValueError) as info:
    convert.describe(directory)
  assert "\n" not in str(info.value)
  assert message in str(info.value)


def test_a_moved_save_directory_and_a_prefix_are_read(tmp_path):
  directory = _copy(tmp_path)
  # train.py's checkpoint file names the prefix where it was written.
  (directory / "checkpoint").write_text(
      'model_checkpoint_path: "/home/someone/save/model.ckpt-599"\n'
      'all_model_checkpoint_paths: "/home/someone/save/model.ckpt-599"\n')
  assert "model.ckpt-599" in convert.describe(directory).format
  prefix = directory / "model.ckpt-599"
  config, _ = convert.read_weights(prefix)
  assert config.layers[0].kind == "gru"
  (directory / "checkpoint").write_text(
      'model_checkpoint_path: "/elsewhere/model.ckpt-7"\n')
  with pytest.raises(ValueError, match="names '/elsewhere/model.ckpt-7', "
                     "which is neither there nor in this directory"):
    convert.describe(directory)


def _resave(directory, rename):
  """Rewrites the lstm fixture's checkpoint in `directory` with its variables
  renamed (a name-based checkpoint, as tf.train.Saver writes it)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  source = tf.train.latest_checkpoint(str(DATA / "lstm"))
  reader = tf.train.load_checkpoint(source)
  names = sorted(reader.get_variable_to_shape_map())
  for old in directory.glob("model.ckpt-*"):
    old.unlink()
  tf.raw_ops.SaveV2(prefix=str(directory / "model.ckpt-1"),
                    tensor_names=[rename(n) for n in names],
                    shape_and_slices=[""] * len(names),
                    tensors=[reader.get_tensor(n) for n in names])
  (directory / "checkpoint").write_text(
      'model_checkpoint_path: "model.ckpt-1"\n')


def test_tf_1_0_names_weights_and_biases_are_read(tmp_path):
  directory = _copy(tmp_path, "lstm")
  _resave(directory, lambda name: name.replace("/kernel", "/weights").replace(
      "/bias", "/biases"))
  renamed = rnnstep.load(directory)
  assert all(np.array_equal(renamed.tensors()[key], value)
             for key, value in _model("lstm").tensors().items())


@pytest.mark.parametrize("rename,message", [
    (lambda name: name.replace("lstm_cell", "nas_cell"),
     "cell_0 holds 'rnnlm/multi_rnn_cell/cell_0/nas_cell/bias', "),
    (lambda name: name.replace("softmax_b", "softmax_bias"),
     "no variable 'rnnlm/softmax_b'"),
    (lambda name: name.replace("embedding/Adam_1", "embedding/extra"),
     "holds variables model.py does not make: 'embedding/extra'"),
])
def test_checkpoints_other_than_model_pys_are_refused(tmp_path, rename,
                                                      message):
  directory = _copy(tmp_path, "lstm")
  _resave(directory, rename)
  with pytest.raises(ValueError) as info:
    convert.describe(directory)
  assert "\n" not in str(info.value)
  assert message in str(info.value)


def test_a_vocabulary_given_for_a_save_directory_is_refused():
  with pytest.raises(ValueError, match="holds its own vocabulary "
                     r"\(chars_vocab.pkl\); give no corpus or vocab"):
    convert.read_any(DATA / "rnn", vocab=["a"])


@pytest.mark.slow  # A fresh interpreter.
def test_convert_cli_writes_a_model_without_a_vocabulary_flag(tmp_path):
  output = tmp_path / "model.npz"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  run = forkserver.run(
      [sys.executable, "-m", "rnnstep.cli.convert", f"--input={DATA / 'rnn'}",
       f"--output={output}"], env=env, capture_output=True, text=True,
      timeout=600, check=False)
  result = Result(run.returncode, run.stdout, run.stderr)
  assert result.returncode == 0, result
  assert "char-rnn-tensorflow TF1 checkpoint" in result.stdout
  model, ref = rnnstep.load(output), _reference("rnn")
  logits = rnnstep.logits(model, model.encode(ref["logits_text"]))[0]
  assert np.abs(logits - ref["logits"]).max() < TOLERANCE


def _rescaled(directory, factor):
  """Rewrites `directory`'s model.ckpt-599 with every tensor times `factor`
  (the original folder training on after it was copied)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  prefix = str(directory / "model.ckpt-599")
  reader = tf.train.load_checkpoint(prefix)
  names = sorted(reader.get_variable_to_shape_map())
  tensors = [reader.get_tensor(n) for n in names]
  for old in directory.glob("model.ckpt-599.*"):
    old.unlink()
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                    shape_and_slices=[""] * len(names),
                    tensors=[t * factor if t.dtype.kind == "f" else t
                             for t in tensors])


def _same_tensors(a, b):
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_named_folder_s_checkpoint_wins_over_a_recorded_path(tmp_path):
  """A copy whose `checkpoint` records the original's absolute path (TF1's
  Saver writes one when --save_dir was absolute) reads its own weights, not
  the original's newer ones beside the copy's config and vocabulary."""
  original = _copy(tmp_path)
  copy = tmp_path / "copy"
  shutil.copytree(original, copy)
  (copy / "checkpoint").write_text(
      f'model_checkpoint_path: "{original}/model.ckpt-599"\n')
  _rescaled(original, 2.0)
  assert _same_tensors(rnnstep.load(copy).tensors(), _model("gru").tensors())
  assert not _same_tensors(rnnstep.load(original).tensors(),
                           _model("gru").tensors())


def test_a_recorded_path_outside_is_followed_only_where_the_folder_lacks_it(
    tmp_path):
  original = _copy(tmp_path)
  copy = tmp_path / "copy"
  shutil.copytree(original, copy)
  for weights in copy.glob("model.ckpt-599.*"):
    weights.unlink()
  (copy / "checkpoint").write_text(
      f'model_checkpoint_path: "{original}/model.ckpt-599"\n')
  summary = convert.describe(copy)
  assert f"model.ckpt-599 in {original}" in summary.format or any(
      str(original) in note for note in summary.notes), summary
  assert _same_tensors(rnnstep.load(copy).tensors(), _model("gru").tensors())


def test_any_tf_checkpoint_folder_s_own_checkpoint_wins(tmp_path):
  """The same rule for any TF checkpoint folder (`tf_checkpoint.resolve`,
  where TensorFlow's `latest_checkpoint` follows the recorded path)."""
  from rnnstep.convert import tf_checkpoint  # pylint: disable=g-import-not-at-top
  original, copy = tmp_path / "original", tmp_path / "copy"
  for folder in (original, copy):
    folder.mkdir()
    (folder / "ckpt-1.index").write_bytes(b"")
    (folder / "checkpoint").write_text(
        f'model_checkpoint_path: "{original}/ckpt-1"\n')
  assert tf_checkpoint.resolve(str(copy))[0] == str(copy / "ckpt-1")
  (copy / "ckpt-1.index").unlink()  # Only now is the recorded path read.
  prefix, how = tf_checkpoint.resolve(str(copy))
  assert prefix == f"{original}/ckpt-1" and "names" in how


@pytest.mark.parametrize("member", ["config.pkl", "chars_vocab.pkl"])
def test_pickles_are_read_with_a_bounded_read(tmp_path, monkeypatch, member):
  """The size check is the read itself, not a `getsize` before it (a file
  that grows in between, or a special file whose size says 0)."""
  from rnnstep.convert import tf1_charrnn  # pylint: disable=g-import-not-at-top
  directory = _copy(tmp_path)
  limit = os.path.getsize(directory / member) - 1
  monkeypatch.setattr(tf1_charrnn, "MAX_PICKLE_BYTES", limit)
  real = os.path.getsize
  monkeypatch.setattr(os.path, "getsize", lambda p: 0 if os.fspath(p).endswith(
      member) else real(p))
  with pytest.raises(ValueError, match=f"{member}: more than {limit} bytes"
                     ) as info:
    convert.describe(directory)
  assert "\n" not in str(info.value)
