"""rnnstep-convert refuses bad, unmappable and hostile inputs with one line.

Every case is checked twice: through the library (a ValueError/OSError whose
message names the problem, on one line) and through the CLI in this process
(exit status non-zero, exactly one stderr line "rnnstep-convert: error: ...",
no file at --output).
"""

import json
import os
import shutil
import struct
import warnings
import zipfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import h5py  # pylint: disable=g-import-not-at-top
import keras
import numpy as np
import pytest
import tensorflow as tf

from rnnstep.cli import convert as cli
from rnnstep import convert
from tests.support import keras_models as km

V = km.V


def sequential(*layers, dim=8, mask_zero=False):
  model = keras.Sequential([keras.Input((None,), dtype="int32"),
                            keras.layers.Embedding(V, dim, mask_zero=mask_zero),
                            *layers])
  return model


def gru(units=16, **kwargs):
  return keras.layers.GRU(units, return_sequences=True, **kwargs)


def dense():
  return keras.layers.Dense(V)


class Ambiguous(keras.Model):
  """Two GRUs of one shape: a subclassed model's order is not in its weights."""

  def __init__(self, **kw):
    super().__init__(**kw)
    self.embedding = keras.layers.Embedding(V, 16)
    self.first = gru()
    self.second = gru()
    self.dense = dense()

  def call(self, inputs):
    return self.dense(self.second(self.first(self.embedding(inputs))))


def rewrite_zip(source, target, config_edit=None, members=None):
  """Copies a .keras archive, editing config.json or replacing the members."""
  with zipfile.ZipFile(source) as archive:
    items = [(i.filename, archive.read(i)) for i in archive.infolist()]
  if members is not None:
    items = members(items)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Duplicate member names.
    with zipfile.ZipFile(target, "w") as archive:
      for name, data in items:
        if name == "config.json" and config_edit is not None:
          data = json.dumps(config_edit(json.loads(data))).encode()
        archive.writestr(name, data)


def forge_central_size(path, member, size):
  """Makes the central directory declare `size` bytes for one stored member."""
  data = bytearray(open(path, "rb").read())
  start = 0
  while True:
    start = data.index(b"PK\x01\x02", start)
    name_length = struct.unpack("<H", data[start + 28:start + 30])[0]
    if data[start + 46:start + 46 + name_length] == member.encode():
      data[start + 24:start + 28] = struct.pack("<I", size)
      break
    start += 4
  open(path, "wb").write(bytes(data))


def edit_layer(config, target, **changes):
  for layer in config["config"]["layers"]:
    if layer["class_name"] == target:
      layer.update(changes)
  return config


def replace_dataset(path, name, make):
  with h5py.File(path, "r+") as f:
    del f[name]
    make(f, name)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """Every bad input, written once: {case: path}."""
  d = tmp_path_factory.mktemp("bad")
  out = {}

  def p(name):
    return str(d / name)

  good = sequential(gru(), dense())
  out["good_keras"] = p("good.keras")
  good.save(out["good_keras"])
  good.save_weights(p("good.weights.h5"))
  good.save(p("good.h5"))
  tf.train.Checkpoint(model=good).write(p("good_ckpt/ckpt"))

  for name, model in (
      ("bidirectional", sequential(keras.layers.Bidirectional(gru(8)), dense())),
      ("dense_between", sequential(gru(), keras.layers.Dense(16), gru(),
                                   dense())),
      ("hard_sigmoid", sequential(gru(recurrent_activation="hard_sigmoid"),
                                  dense())),
      ("softsign", sequential(keras.layers.SimpleRNN(
          16, activation="softsign", return_sequences=True), dense())),
      ("go_backwards", sequential(gru(go_backwards=True), dense())),
      ("mask_zero", sequential(gru(), dense(), mask_zero=True)),
      ("lambda", sequential(keras.layers.Lambda(lambda x: x * 2.0), gru(),
                            dense()))):
    out[name] = p(f"{name}.keras")
    model.save(out[name])
    if name == "bidirectional":
      out["bidirectional_weights"] = p("bidirectional.weights.h5")
      model.save_weights(out["bidirectional_weights"])

  model = sequential(gru(), keras.layers.LayerNormalization(), dense())
  out["layer_norm_weights"] = p("layer_norm.weights.h5")
  model.save_weights(out["layer_norm_weights"])

  model = Ambiguous()
  model(np.zeros((1, 3), np.int32))
  out["ambiguous_subclassed"] = p("ambiguous.weights.h5")
  model.save_weights(out["ambiguous_subclassed"])

  # Archives.
  out["unknown_class"] = p("unknown_class.keras")
  rewrite_zip(out["good_keras"], out["unknown_class"], lambda c: edit_layer(
      c, "GRU", class_name="MyEvilLayer", module="__main__",
      registered_name="Custom>MyEvilLayer"))
  out["module_not_keras"] = p("module_not_keras.keras")
  rewrite_zip(out["good_keras"], out["module_not_keras"],
              lambda c: edit_layer(c, "GRU", module="os"))
  raw = open(out["good_keras"], "rb").read()
  out["truncated_zip"] = p("truncated.keras")
  open(out["truncated_zip"], "wb").write(raw[:len(raw) * 6 // 10])
  out["zip_without_weights"] = p("no_weights.keras")
  rewrite_zip(out["good_keras"], out["zip_without_weights"],
              members=lambda items: [i for i in items if i[0] == "config.json"])
  out["zip_duplicate_member"] = p("duplicate.keras")
  rewrite_zip(out["good_keras"], out["zip_duplicate_member"],
              members=lambda items: items + [i for i in items
                                             if i[0] == "config.json"])
  out["zip_bomb"] = p("bomb.keras")
  shutil.copy(out["good_keras"], out["zip_bomb"])
  forge_central_size(out["zip_bomb"], "model.weights.h5", 0xFFFFFF00)
  out["random_bytes"] = p("random.bin")
  open(out["random_bytes"], "wb").write(np.random.default_rng(1).bytes(4096))
  out["empty_file"] = p("empty.h5")
  open(out["empty_file"], "wb").close()

  # HDF5.
  weights = p("good.weights.h5")
  raw = open(weights, "rb").read()
  out["truncated_hdf5"] = p("truncated.weights.h5")
  open(out["truncated_hdf5"], "wb").write(raw[:len(raw) // 2])
  other = p("other.h5")
  with h5py.File(other, "w") as f:
    f["data"] = np.ones((16, 48), np.float32)
  raw_floats = p("floats.bin")
  np.ones((16, 48), np.float32).tofile(raw_floats)
  target = "layers/gru/cell/vars/1"

  def variant(name, make, dataset=target, source=weights):
    out[name] = p(f"{name}{os.path.splitext(source)[1]}")
    shutil.copy(source, out[name])
    replace_dataset(out[name], dataset, make)

  def soft(f, name):
    f[name] = h5py.SoftLink("/layers/gru/cell/vars/0")

  def external_link(f, name):
    f[name] = h5py.ExternalLink(other, "/data")

  def external_data(f, name):
    f.create_dataset(name, shape=(16, 48), dtype="<f4",
                     external=[(raw_floats, 0, 16 * 48 * 4)])

  def virtual(f, name):
    layout = h5py.VirtualLayout(shape=(16, 48), dtype="f4")
    layout[:] = h5py.VirtualSource(other, "data", shape=(16, 48))
    f.create_virtual_dataset(name, layout)

  def int_weights(f, name):
    f[name] = np.ones((16, 48), np.int32)

  def bomb(shape):
    def make(f, name):
      f.create_dataset(name, shape=shape, dtype="f4", chunks=(1, 4096))
    return make

  variant("hdf5_soft_link", soft)
  variant("hdf5_external_link", external_link)
  variant("hdf5_external_dataset", external_data)
  variant("hdf5_virtual_dataset", virtual)
  variant("hdf5_int_dataset", int_weights)
  variant("shape_bomb_huge", bomb((V, 1 << 26)), "layers/embedding/vars/0")
  variant("shape_bomb_ratio", bomb((V, 1 << 20)), "layers/embedding/vars/0")
  with h5py.File(p("good.h5"), "r") as f:  # Layer names depend on history.
    group = f["model_weights"]
    layer = [n for n in group.attrs["layer_names"] if n.startswith("gru")][0]
    first = group[layer].attrs["weight_names"][0]
  variant("legacy_h5_soft_link", soft, f"model_weights/{layer}/{first}",
          source=p("good.h5"))
  out["hdf5_not_keras"] = p("plain.h5")
  with h5py.File(out["hdf5_not_keras"], "w") as f:
    f["x"] = np.ones(3)

  # TF checkpoints.
  out["missing_path"] = p("does_not_exist.keras")
  out["empty_directory"] = p("empty_dir")
  os.makedirs(out["empty_directory"])
  out["saved_model"] = p("saved_model_dir")
  os.makedirs(out["saved_model"])
  open(os.path.join(out["saved_model"], "saved_model.pb"), "wb").close()

  def module(**variables):
    m = tf.Module()
    for key, value in variables.items():
      setattr(m, key, value)
    return m

  rng = np.random.default_rng(0)

  def var(*shape):
    return tf.Variable(rng.normal(size=shape).astype(np.float32))

  out["checkpoint_missing_variable"] = p("missing_var/ckpt")
  tf.train.Checkpoint(
      embedding=module(embeddings=var(V, 8)),
      gru=module(cell=module(kernel=var(8, 48), bias=var(2, 48))),
      dense=module(kernel=var(16, V), bias=var(V))).write(
          out["checkpoint_missing_variable"])
  out["truncated_checkpoint"] = p("truncated_ckpt/ckpt")
  shutil.copytree(p("good_ckpt"), p("truncated_ckpt"))
  data_file = out["truncated_checkpoint"] + ".data-00000-of-00001"
  raw = open(data_file, "rb").read()
  open(data_file, "wb").write(raw[:len(raw) // 3])

  out["checkpoint_truncated_tail"] = p("tail_ckpt/ckpt")
  shutil.copytree(p("good_ckpt"), p("tail_ckpt"))
  data_file = out["checkpoint_truncated_tail"] + ".data-00000-of-00001"
  raw = open(data_file, "rb").read()
  open(data_file, "wb").write(raw[:-16])

  # Vocabularies.
  out["corpus"] = p("corpus.txt")
  open(out["corpus"], "w", encoding="utf-8").write(km.CHARS)
  out["small_corpus"] = p("small_corpus.txt")
  open(out["small_corpus"], "w", encoding="utf-8").write(km.CHARS[5:])
  out["latin1_corpus"] = p("latin1.txt")
  open(out["latin1_corpus"], "wb").write(b"abc \xe9\xff")
  out["bad_json_vocab"] = p("bad.json")
  open(out["bad_json_vocab"], "w").write("a b c\n")
  out["multichar_vocab"] = p("multi.json")
  open(out["multichar_vocab"], "w").write(json.dumps(["ab"] + list(km.CHARS)))
  return out


# (case, input, vocabulary flag and file, words the message must contain)
CASES = [
    ("missing_path", "missing_path", "corpus", "no such file"),
    ("empty_directory", "empty_directory", "corpus", "no TF checkpoint"),
    ("saved_model", "saved_model", "corpus", "SavedModel"),
    ("truncated_zip", "truncated_zip", "corpus", "not a readable zip archive"),
    ("truncated_hdf5", "truncated_hdf5", "corpus", "(truncated file"),
    ("random_bytes", "random_bytes", "corpus", "not a Keras weights file"),
    ("empty_file", "empty_file", "corpus", "empty"),
    ("wrong_vocab_size", "good_keras", "small_corpus", "gives 60 characters"),
    ("bidirectional", "bidirectional", "corpus", "bidirectional"),
    ("bidirectional_weights", "bidirectional_weights", "corpus",
     "bidirectional"),
    ("dense_between", "dense_between", "corpus",
     "maps Embedding -> GRU/LSTM/SimpleRNN layer(s) -> Dense"),
    ("layer_norm_weights", "layer_norm_weights", "corpus",
     "not an Embedding, GRU, LSTM, SimpleRNN or Dense"),
    ("hard_sigmoid", "hard_sigmoid", "corpus", "hard_sigmoid"),
    ("softsign", "softsign", "corpus",
     "activation 'softsign'; SimpleRNN with activation 'softsign' is not a "
     "kind rnnstep runs"),
    ("go_backwards", "go_backwards", "corpus", "go_backwards=True"),
    ("mask_zero", "mask_zero", "corpus", "mask_zero=True"),
    ("lambda", "lambda", "corpus", "Lambda layer"),
    ("unknown_class", "unknown_class", "corpus", "MyEvilLayer"),
    ("module_not_keras", "module_not_keras", "corpus", "module 'os'"),
    ("zip_without_weights", "zip_without_weights", "corpus",
     "not a .keras model file"),
    ("zip_duplicate_member", "zip_duplicate_member", "corpus",
     "2 members named 'config.json'"),
    ("zip_bomb", "zip_bomb", "corpus", "zip bomb"),
    ("hdf5_soft_link", "hdf5_soft_link", "corpus", "soft link"),
    ("hdf5_external_link", "hdf5_external_link", "corpus", "external link"),
    ("hdf5_external_dataset", "hdf5_external_dataset", "corpus",
     "external file"),
    ("hdf5_virtual_dataset", "hdf5_virtual_dataset", "corpus",
     "virtual dataset"),
    ("hdf5_int_dataset", "hdf5_int_dataset", "corpus", "dtype int32"),
    ("shape_bomb_huge", "shape_bomb_huge", "corpus", "more than 4294967296"),
    ("shape_bomb_ratio", "shape_bomb_ratio", "corpus", "shape bomb"),
    ("legacy_h5_soft_link", "legacy_h5_soft_link", "corpus", "soft link"),
    ("hdf5_not_keras", "hdf5_not_keras", "corpus", "no layer weights"),
    ("ambiguous_subclassed", "ambiguous_subclassed", "corpus",
     "cannot tell the order"),
    ("checkpoint_missing_variable", "checkpoint_missing_variable", "corpus",
     "no recurrent_kernel"),
    ("truncated_checkpoint", "truncated_checkpoint", "corpus",
     "may be truncated or corrupt"),
    ("checkpoint_truncated_tail", "checkpoint_truncated_tail", "corpus",
     "may be truncated or corrupt"),
    ("latin1_corpus", "good_keras", "latin1_corpus", "not UTF-8"),
    ("bad_json_vocab", "good_keras", "bad_json_vocab", "not a vocab file"),
    # Entries of several characters make a list a word vocabulary (#34).
    ("multichar_vocab", "good_keras", "multichar_vocab",
     "gives 66 words but the model's embedding has 65 rows"),
]


def vocab_args(files, vocab_key):
  if vocab_key.endswith("corpus"):
    return {"corpus": files[vocab_key]}
  return {"vocab": files[vocab_key]}


@pytest.mark.parametrize("case,source,vocab_key,words", CASES,
                         ids=[c[0] for c in CASES])
def test_library_refuses(case, source, vocab_key, words, files, tmp_path):
  del case
  out = tmp_path / "out.npz"
  with pytest.raises((ValueError, OSError)) as raised:
    convert.convert(files[source], out, **vocab_args(files, vocab_key))
  message = str(raised.value)
  assert words in message
  assert "\n" not in message and "\r" not in message
  assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("case,source,vocab_key,words", CASES,
                         ids=[c[0] for c in CASES])
def test_cli_refuses_with_one_line(case, source, vocab_key, words, files,
                                   tmp_path, capfd):
  del case
  out = tmp_path / "out.npz"
  flag, value = next(iter(vocab_args(files, vocab_key).items()))
  status = run_cli(f"--input={files[source]}", f"--output={out}",
                   f"--{flag}={value}")
  captured = capfd.readouterr()
  assert status == 1
  lines = captured.err.splitlines()
  assert len(lines) == 1, captured.err
  assert lines[0].startswith("rnnstep-convert: error: ")
  assert words in lines[0]
  assert not out.exists() and os.listdir(tmp_path) == []


def run_cli(*args):
  with pytest.raises(SystemExit) as raised:
    cli.run(["rnnstep-convert", *args])
  return raised.value.code


def test_wrong_vocab_size_message_gives_both_sizes(files, tmp_path):
  with pytest.raises(ValueError) as raised:
    convert.convert(files["good_keras"], tmp_path / "o.npz",
                    corpus=files["small_corpus"])
  assert "60 characters" in str(raised.value)
  assert "65 rows" in str(raised.value)
  with pytest.raises(ValueError, match=r"gives 63 characters plus \[UNK\].*65"):
    convert.convert(files["good_keras"], tmp_path / "o.npz",
                    vocab=["[UNK]"] + list(km.CHARS[2:]))


def test_truncated_checkpoint_data_is_refused_before_reading(files):
  with pytest.raises(ValueError, match="may be truncated or corrupt"):
    convert.read_weights(files["truncated_checkpoint"])


@pytest.mark.parametrize("args,words", [
    ((), "--input must have a value"),
    (("--input=x.keras",), "--output is required"),
    # A weights file holds no vocabulary; a missing one is named first.
    (("--input={keras}", "--output=o.npz"), "--corpus=TEXT_FILE or --vocab"),
    (("--input=x", "--output=o.npz", "--corpus=a", "--vocab=b"),
     "At most one of (corpus, vocab)"),
    (("--input=x", "--inspect", "--output=o.npz"), "drop --output"),
    (("--input=x", "--output=", "--corpus=a"), "--output must not be empty"),
    (("--input=x", "--bogus=1"), "Unknown command line flag 'bogus'"),
    (("--input=x", "--output=o.npz", "--corpus=a", "extra"),
     "unexpected arguments"),
])
def test_cli_flag_errors_are_one_line(args, words, files, capfd, tmp_path,
                                      monkeypatch):
  monkeypatch.chdir(tmp_path)
  status = run_cli(*(arg.format(keras=files["good_keras"]) for arg in args))
  captured = capfd.readouterr()
  assert status == 2
  lines = captured.err.splitlines()
  assert len(lines) == 1, captured.err
  assert lines[0].startswith("rnnstep-convert: error: ") and words in lines[0]
  assert os.listdir(tmp_path) == []


def test_cli_names_a_missing_input_before_asking_for_a_vocabulary(
    capfd, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  status = run_cli("--input=typo.keras", "--output=o.npz")
  lines = capfd.readouterr().err.splitlines()
  assert status == 1 and lines == [
      "rnnstep-convert: error: typo.keras: no such file, directory or "
      "checkpoint prefix"]
  assert os.listdir(tmp_path) == []


def test_cli_inspect_writes_nothing(files, capfd, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  status = run_cli(f"--input={files['good_keras']}", "--inspect",
                   f"--corpus={files['corpus']}")
  captured = capfd.readouterr()
  assert status == 0, captured.err
  assert "GRU" in captured.out and "vocabulary:" in captured.out
  assert captured.err == ""
  assert os.listdir(tmp_path) == []


def test_cli_help_in_process(capfd):
  status = run_cli("--help")
  captured = capfd.readouterr()
  assert status == 0
  assert captured.out.startswith("rnnstep-convert:")
  assert "--vocab" in captured.out and captured.err == ""


def test_output_directory_must_exist(files, tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    convert.convert(files["good_keras"], tmp_path / "no" / "o.npz",
                    corpus=files["corpus"])
  with pytest.raises(convert.VocabularyRequired, match="hold no vocabulary"):
    convert.convert(files["good_keras"], tmp_path / "o.npz")
  with pytest.raises(ValueError, match="only one of corpus"):
    convert.convert(files["good_keras"], tmp_path / "o.npz",
                    corpus=files["corpus"], vocab=["a"])


@pytest.mark.parametrize("index", ["ckpt_read_less.index",
                                   "ckpt_bad_alloc.index"])
def test_fuzzed_checkpoint_index_is_refused_in_one_line(tmp_path, index):
  """Fuzzed .index files made tf.train.load_checkpoint raise IndexError and
  MemoryError (tests/data/fuzz/README.md)."""
  fuzz = os.path.join(os.path.dirname(__file__), "data", "fuzz")
  shutil.copy(os.path.join(fuzz, index), tmp_path / "ckpt_1.index")
  (tmp_path / "ckpt_1.data-00000-of-00001").write_bytes(b"")
  for read in (convert.describe, convert.read_weights):
    with pytest.raises(ValueError, match="not a readable TF checkpoint") as info:
      read(tmp_path / "ckpt_1")
    assert "\n" not in str(info.value)


def test_a_vocabulary_json_is_read_with_a_bounded_read(tmp_path, monkeypatch):
  """A JSON sidecar longer than the limit is refused by the read itself,
  whatever `getsize` said before it (a file that grew, a special file):
  a prefix of it is never parsed as if it were the whole."""
  from rnnstep.convert import vocabulary  # pylint: disable=g-import-not-at-top
  path = tmp_path / "vocab.json"
  path.write_text('["a", "b"]' + " " * 200)
  monkeypatch.setattr(vocabulary, "MAX_VOCAB_FILE_BYTES", 100)
  real = os.path.getsize
  monkeypatch.setattr(os.path, "getsize", lambda p: 0 if os.fspath(p) == str(
      path) else real(p))
  with pytest.raises(ValueError, match="more than 100 bytes") as info:
    vocabulary.load_vocab_json(path)
  assert "\n" not in str(info.value)
