"""PyTorch state dicts, read without torch: committed fixtures vs torch's logits.

The fixtures in tests/data/torch/ were written by real torch
(tools/make_torch_fixtures.py, torch 2.13 CPU): random char models (nothing
trained) saved with torch.save (zip and legacy), safetensors, as a training
checkpoint dict with `module.` keys, with bfloat16 / float16 / float64
tensors, tied weights and strided views of a shared storage; whole pickled
modules as spro/char-rnn.pytorch saves them (`torch.save(model)` of a
`model.CharRNN`, zip and legacy), a module nesting nn.Sequential (pickle
protocol 1); plus files that must be refused, among them module pickles that
hide a call of os.system / eval. `reference.npz` holds torch's logits for a fixed id sequence
and torch's greedy continuation of a prompt. Here rnnstep reads the files
(torch is not needed) and must match: logits within 2e-5, greedy text char for
char. Hostile pickles are built here with `pickle` (never unpickled by us) and
must be refused without running anything. One test rebuilds the fixtures with
live torch when it is importable (skipped in CI, which has no torch).
"""

import collections
import copyreg
import json
import os
import pathlib
import pickle
import re
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import rnnstep
from rnnstep.cli import common
from rnnstep import convert
from rnnstep.convert import torch_legacy
from rnnstep.convert import torch_zip
from rnnstep.convert import unpickler
from tests.support import forkserver
from tests.support.cli import Result
from tests.support.hostile_pickles import RunsCode
from tests.support.tiers import quick_params
from tests.support.torch_files import pickle_int
from tests.support.torch_files import pickle_str
from tests.support.torch_files import tensor_pickle
from tests.support.torch_files import write_torch_zip

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "torch"
TOLERANCE = 2e-5

# (file, reference name): every readable fixture.
CASES = [
    ("gru2.pt", "gru2"), ("gru2.safetensors", "gru2"),
    ("gru2_legacy.pt", "gru2"), ("lstm.pth", "lstm"),
    ("rnn_nobias.safetensors", "rnn_nobias"),
    ("gru_nobias_checkpoint.bin", "gru_nobias"),
    ("stack_bf16.pt", "stack_bf16"), ("tied_views.pt", "tied_views"),
]
# Whole pickled modules (vocabulary string.printable, ids `charrnn_ids`).
MODULE_CASES = [
    ("charrnn_gru.pt", "charrnn_gru"), ("charrnn_gru_legacy.pt", "charrnn_gru"),
    ("charrnn_lstm.pt", "charrnn_lstm"), ("nested_protocol1.pt", "nested"),
]
HOSTILE = ["hostile_attribute.pt", "hostile_submodule.pt",
           "hostile_parameter.pt", "hostile_parameter_legacy.pt"]
HOSTILE_MARKER = "rnnstep_hostile_pickle_ran"  # As in make_torch_fixtures.


def check_against_reference(directory, file_name, ref_name):
  """Loads a fixture directly and compares it with torch's stored outputs."""
  ref = np.load(os.path.join(directory, "reference.npz"))
  whole = ref_name.startswith(("charrnn", "nested"))
  vocab_path = os.path.join(directory, "charrnn_vocab.json" if whole
                            else "vocab.json")
  chars = json.load(open(vocab_path, encoding="utf-8"))
  model = rnnstep.load(os.path.join(directory, file_name), vocab=vocab_path)
  logits = rnnstep.logits(model, ref["charrnn_ids" if whole else "ids"])[0]
  error = float(np.abs(logits - ref[f"{ref_name}_logits"]).max())
  assert error <= TOLERANCE, (file_name, error)
  prompt = str(ref["prompt"])
  greedy = ref[f"{ref_name}_greedy"]
  text = rnnstep.generate(model, prompt, len(greedy), temperature=0)
  assert text == "".join(chars[i] for i in greedy), file_name
  return error


@pytest.mark.slow  # Torch's loop (14 s); whole pickled modules stay quick.
@pytest.mark.parametrize("file_name,ref_name",
                         quick_params(CASES, ("gru2.pt", "gru2")))
def test_logits_and_greedy_text_match_torch(file_name, ref_name):
  check_against_reference(DATA, file_name, ref_name)


@pytest.mark.slow  # Whole pickled torch modules, loaded by torch itself.
@pytest.mark.parametrize("file_name,ref_name",
                         quick_params(MODULE_CASES,
                                      ("charrnn_gru.pt", "charrnn_gru")))
def test_whole_pickled_modules_match_torch(file_name, ref_name):
  check_against_reference(DATA, file_name, ref_name)


def test_a_whole_module_converts_and_names_its_tensors_as_state_dict(
    tmp_path):
  out = tmp_path / "charrnn.npz"
  summary = convert.convert(DATA / "charrnn_gru_legacy.pt", out,
                            vocab=DATA / "charrnn_vocab.json")
  assert summary.format == ("PyTorch whole module 'model.CharRNN' (legacy "
                            "torch.save file, 11 tensors)")
  assert [layer.name for layer in summary.layers] == [
      "encoder", "rnn[l0]", "rnn[l1]", "decoder"]
  assert any("neither imported nor run" in note for note in summary.notes)
  assert rnnstep.load(out).vocab_size == 100
  # nn.Sequential children are numbered as state_dict() numbers them.
  text = str(convert.describe(DATA / "nested_protocol1.pt"))
  assert "'embed.0'" in text and "'head.1'" in text


@pytest.mark.parametrize("file_name", HOSTILE)
def test_hostile_module_pickles_are_refused_and_nothing_runs(
    tmp_path, monkeypatch, file_name):
  """Each fixture would create HOSTILE_MARKER in the working directory if its
  os.system / eval call ran (in an attribute, a submodule's attribute, in
  place of a parameter)."""
  monkeypatch.chdir(tmp_path)
  for call in (convert.describe,
               lambda p: rnnstep.load(p, vocab=DATA / "charrnn_vocab.json")):
    with pytest.raises(ValueError) as info:
      call(DATA / file_name)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(DATA / file_name))
    assert re.search(r"asks to call '(posix|nt)\.system'|asks to call "
                     r"'builtins\.eval'", message), message
    assert message.endswith("never runs code from a file (refused)")
  assert not (tmp_path / HOSTILE_MARKER).exists()
  assert not os.listdir(tmp_path)


def test_corpus_gives_the_same_vocabulary_and_convert_writes_it(tmp_path):
  ref = np.load(DATA / "reference.npz")
  direct = rnnstep.load(DATA / "lstm.pth", corpus=DATA / "corpus.txt")
  out = tmp_path / "lstm.npz"
  summary = convert.convert(DATA / "lstm.pth", out, corpus=DATA / "corpus.txt")
  assert "PyTorch state dict" in summary.format
  converted = rnnstep.load(out)
  for model in (direct, converted):
    error = np.abs(rnnstep.logits(model, ref["ids"])[0]
                   - ref["lstm_logits"]).max()
    assert error <= TOLERANCE
  assert list(converted.vocab) == json.load(open(DATA / "vocab.json"))


def test_describe_reports_the_mapping():
  # `inspect`, its former name, is gone (`rnnstep.inspect` is the package
  # of neuron activations).
  assert not hasattr(convert, "inspect")
  text = str(convert.describe(DATA / "rnn_nobias.safetensors"))
  assert "safetensors" in text and "SimpleRNN  'recurrence[l1]'" in text
  assert "assumed nonlinearity='tanh'" in text
  assert "use_bias=False (zero bias written)" in text
  text = str(convert.describe(DATA / "gru_nobias_checkpoint.bin"))
  assert "under the key 'state_dict'" in text
  assert "'module.embedding'" in text and "'module.linear'" in text
  text = str(convert.describe(DATA / "stack_bf16.pt"))
  assert "LSTM       'model.lstm[l0]'" in text
  assert "GRU        'model.gru[l0]'" in text


def test_read_weights_matches_the_keras_layout_from_safetensors():
  """An independent reading of the safetensors file (numpy only) and the
  documented mapping (keras-formats.md section 5) give the same arrays."""
  raw = (DATA / "gru2.safetensors").read_bytes()
  (length,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8:8 + length])
  def tensor(name):
    entry = header[name]
    begin, end = entry["data_offsets"]
    return np.frombuffer(raw[8 + length + begin:8 + length + end],
                         "<f4").reshape(entry["shape"])
  def permute(a):  # PyTorch r,z,n -> Keras z,r,h.
    h = a.shape[0] // 3
    return np.concatenate([a[h:2 * h], a[:h], a[2 * h:]])
  config, tensors = convert.read_weights(DATA / "gru2.safetensors")
  assert [layer.kind for layer in config.layers] == ["gru", "gru"]
  np.testing.assert_array_equal(tensors["embedding"], tensor("embed.weight"))
  for k in range(2):
    np.testing.assert_array_equal(tensors[f"layer{k}_kernel"],
                                  permute(tensor(f"gru.weight_ih_l{k}")).T)
    np.testing.assert_array_equal(tensors[f"layer{k}_recurrent_kernel"],
                                  permute(tensor(f"gru.weight_hh_l{k}")).T)
    np.testing.assert_array_equal(tensors[f"layer{k}_bias"], np.stack([
        permute(tensor(f"gru.bias_ih_l{k}")),
        permute(tensor(f"gru.bias_hh_l{k}"))]))
  np.testing.assert_array_equal(tensors["dense_kernel"], tensor("fc.weight").T)
  np.testing.assert_array_equal(tensors["dense_bias"], tensor("fc.bias"))


# -------------------------------------------------------------------- refusals


@pytest.mark.parametrize("file_name,message", [
    ("bidirectional.pt", r"'gru.weight_ih_l0_reverse': a bidirectional RNN"),
    ("lstm_proj.pt", r"'lstm.weight_hr_l0': an LSTM with proj_size"),
])
def test_refusals_are_one_line(file_name, message):
  for call in (lambda p: convert.describe(p),
               lambda p: rnnstep.load(p, vocab=DATA / "vocab.json")):
    with pytest.raises(ValueError, match=message) as info:
      call(DATA / file_name)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(str(DATA / file_name))


class _Evaluates:

  def __reduce__(self):
    return (eval, ("__import__('os').getcwd()",))


def _legacy(path, pickle_bytes):
  with open(path, "wb") as f:
    f.write(pickle.dumps(torch_legacy.LEGACY_MAGIC, protocol=2))
    f.write(pickle.dumps(torch_legacy.LEGACY_PROTOCOL, protocol=2))
    f.write(pickle.dumps({"protocol_version": 1001, "little_endian": True,
                          "type_sizes": {"short": 2, "int": 4, "long": 4}},
                         protocol=2))
    f.write(pickle_bytes)
    f.write(pickle.dumps([], protocol=2))


@pytest.mark.parametrize("layout", ["zip", "legacy"])
def test_a_pickle_that_would_run_code_is_refused_without_running_it(
    tmp_path, layout):
  marker = tmp_path / "ran"
  payloads = {
      "system": pickle.dumps(RunsCode(marker), protocol=2),
      "in_dict": pickle.dumps({"embed.weight": RunsCode(marker)}, protocol=2),
      "eval": pickle.dumps(_Evaluates(), protocol=2),
  }
  for name, payload in payloads.items():
    path = tmp_path / f"{name}.pt"
    (write_torch_zip if layout == "zip" else _legacy)(path, payload)
    with pytest.raises(ValueError) as info:
      convert.read_any(path, vocab=DATA / "vocab.json")
    message = str(info.value)
    assert "\n" not in message
    assert "never runs code from a file (refused)" in message, message
    assert "system" in message or "eval" in message, message
    assert not marker.exists()


class _Module:
  """Pickles as an nn.Module does (protocol 2: GLOBAL, NEWOBJ, BUILD with
  its attribute dict), without torch."""

  def __init__(self, parameters=(), modules=(), **attributes):
    self._parameters = collections.OrderedDict(parameters)
    self._buffers = collections.OrderedDict()
    self._modules = collections.OrderedDict(modules)
    self.__dict__.update(attributes)


class _CallsModuleClass:
  """Pickles as a call of a module class with arguments (REDUCE)."""

  def __reduce__(self):
    return (_Module, ((("w", 1),),))


class _Reconstructs:
  """Pickles as copyreg._reconstructor(cls, dict, state): the real helper
  would run dict.__init__(obj, state)."""

  def __reduce__(self):
    return (copyreg._reconstructor, (_Module, dict, {"a": 1}))  # pylint: disable=protected-access


@pytest.mark.parametrize("layout", ["zip", "legacy"])
@pytest.mark.parametrize("payload,message", [
    (_Module(modules=[("rnn", _CallsModuleClass())]),
     r"asks to call 'tests\.test_convert_torch\._Module'.*never runs code"),
    (_Module(modules=[("rnn", _Reconstructs())]),
     r"asks to call 'copyreg._reconstructor with a base class other than "
     r"object'"),
    (_Module(parameters=[("weight", os.getcwd)]),
     r"parameter 'weight' of module '\(top level\)' \('tests\.test_convert_"
     r"torch\._Module'\) is the class or function '(posix|nt)\.getcwd', not a "
     "tensor"),
    (_Module(modules=[("inner", _Module(parameters=[("bias", None)],
                                        modules=[("x", dict)]))]),
     r"module 'inner\.x' is the class or function 'builtins\.dict', not an "
     r"nn\.Module"),
    ({"model": _Module(modules=[("a", {"not": "a module"})])},
     r"module 'a' is a dict, not an nn.Module"),
])
def test_handmade_module_pickles_are_read_as_records_or_refused(
    tmp_path, layout, payload, message):
  path = tmp_path / "module.pt"
  (write_torch_zip if layout == "zip" else _legacy)(
      path, pickle.dumps(payload, protocol=2))
  with pytest.raises(ValueError, match=message) as info:
    convert.describe(path)
  assert "\n" not in str(info.value)


def test_a_module_in_a_cycle_is_refused(tmp_path):
  outer = _Module()
  outer._modules["self"] = outer  # pylint: disable=protected-access
  path = tmp_path / "cycle.pt"
  write_torch_zip(path, pickle.dumps(outer, protocol=2))
  with pytest.raises(ValueError, match="nested too deeply or in a cycle"):
    convert.describe(path)


def test_handmade_tensor_pickle_reads_views(tmp_path):
  path = tmp_path / "views.pt"
  values = np.arange(24, dtype="<f4")
  write_torch_zip(path, tensor_pickle(24, (3, 4), (1, 6), offset=2),
             [("0", values.tobytes())])
  obj, _, close = torch_zip.read_zip(path)
  got = obj["w"].read(str(path), "w")
  close()
  want = np.lib.stride_tricks.as_strided(values[2:], (3, 4), (4, 24))
  np.testing.assert_array_equal(got, want)


def test_a_pickle_cannot_rewrite_a_checked_tensor(tmp_path):
  path = tmp_path / "build.pt"
  state = b"}" + pickle_str("offset") + pickle_int(10**6) + b"sb"  # BUILD {'offset': 1e6}
  write_torch_zip(path, tensor_pickle(24, (2, 2), (2, 1), build=state),
             [("0", bytes(96))])
  with pytest.raises(ValueError, match="tried to modify a tensor"):
    torch_zip.read_zip(path)


@pytest.mark.parametrize("numel,size,stride,offset,data_bytes,message", [
    (24, (3, 4), (1, 6), 6, 96, "reaches past the end of storage"),
    (24, (5, 5), (5, 1), 0, 96, "reaches past the end of storage"),
    (24, (2, 2), (-1, 1), 0, 96, "invalid stride"),
    (24, (2, 2), (2, 1), 0, 40, "declares 24 float32 elements"),
    (1 << 40, (4,), (1,), 0, 96, "declares 1099511627776 float32 elements"),
])
def test_bad_tensor_records_are_refused(tmp_path, numel, size, stride, offset,
                                        data_bytes, message):
  path = tmp_path / "bad.pt"
  write_torch_zip(path, tensor_pickle(numel, size, stride, offset),
             [("0", bytes(data_bytes))])
  with pytest.raises(ValueError, match=message) as info:
    torch_zip.read_zip(path)
  assert "\n" not in str(info.value)


def _safetensors(path, header, data=b""):
  raw = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("header,data,message", [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}},
     bytes(16), "outside the 16 data bytes"),
    ({"w": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 16]}},
     bytes(16), "needs 4398046511104 bytes"),
    ({"w": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}},
     bytes(16), "unsupported dtype 'C64'"),
    ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
     bytes(16), "invalid shape"),
])
def test_bad_safetensors_are_refused(tmp_path, header, data, message):
  path = tmp_path / "bad.safetensors"
  _safetensors(path, header, data)
  with pytest.raises(ValueError, match=message) as info:
    convert.describe(path)
  assert "\n" not in str(info.value)


def test_truncated_and_corrupt_files_are_refused(tmp_path):
  raw = (DATA / "gru2.pt").read_bytes()
  for cut in (len(raw) // 2, len(raw) - 30):
    path = tmp_path / f"cut{cut}.pt"
    path.write_bytes(raw[:cut])
    with pytest.raises(ValueError) as info:
      convert.read_any(path, vocab=DATA / "vocab.json")
    assert "\n" not in str(info.value)
  legacy = (DATA / "gru2_legacy.pt").read_bytes()
  path = tmp_path / "legacy_cut.pt"
  path.write_bytes(legacy[:-100])
  with pytest.raises(ValueError, match="truncated") as info:
    convert.read_any(path, vocab=DATA / "vocab.json")
  plain = tmp_path / "plain.pkl"
  plain.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
  with pytest.raises(ValueError, match="a Python pickle that is not a "
                     "torch.save file"):
    convert.describe(plain)


# ------------------------------------------------------------- direct loading


def test_load_needs_a_vocabulary_for_weights_but_not_for_model_files(tmp_path):
  with pytest.raises(convert.VocabularyRequired, match="hold no vocabulary"):
    rnnstep.load(DATA / "gru2.pt")
  out = tmp_path / "m.npz"
  convert.convert(DATA / "gru2.pt", out, vocab=DATA / "vocab.json")
  assert rnnstep.load(out).vocab_size == 21
  with pytest.raises(convert.VocabularyNotAllowed, match="holds its own"):
    rnnstep.load(out, corpus=DATA / "corpus.txt")
  with pytest.raises(ValueError, match="vocabulary size mismatch"):
    rnnstep.load(DATA / "gru2.pt", vocab=list("abc"))
  with pytest.raises(ValueError, match="already an rnnstep model file"):
    convert.convert(out, tmp_path / "again.npz", vocab=DATA / "vocab.json")


@pytest.mark.slow  # subprocesses
def test_cli_errors_name_the_flag(tmp_path):
  with pytest.raises(common.Failure, match=r"^--weights=.*gru2.pt: Keras and "
                     r"PyTorch weights hold no vocabulary; give --corpus"):
    common.load_model(str(DATA / "gru2.pt"), "float32", flag="--weights")
  with pytest.raises(common.Failure, match=r"^--vocab=.*missing.json: "):
    common.load_model(str(DATA / "gru2.pt"), "float32",
                      vocab=str(tmp_path / "missing.json"))
  with pytest.raises(common.Failure, match=r"^--corpus: --weights \(the "
                     r"bundled model\) is an rnnstep model file"):
    common.load_model(None, "float32", corpus=str(DATA / "corpus.txt"),
                      flag="--weights")


def _run(module, *args):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
  proc = forkserver.run([sys.executable, "-m", module, *args], cwd=REPO,
                        capture_output=True, text=True, timeout=600, env=env,
                        stdin=subprocess.DEVNULL)
  return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.slow  # a subprocess
def test_generate_cli_reads_pytorch_weights():
  ref = np.load(DATA / "reference.npz")
  chars = json.load(open(DATA / "vocab.json"))
  prompt = str(ref["prompt"])
  result = _run("rnnstep.cli.generate", f"--weights={DATA / 'lstm.pth'}",
                f"--vocab={DATA / 'vocab.json'}", f"--prompt={prompt}",
                "--temperature=0", f"--num_steps={len(ref['lstm_greedy'])}")
  assert result.returncode == 0, result
  assert result.stdout == (prompt + "".join(chars[i] for i in
                                            ref["lstm_greedy"]) + "\n")
  result = _run("rnnstep.cli.generate", f"--weights={DATA / 'lstm.pth'}",
                "--num_steps=5")
  assert result.returncode == 1
  assert len(result.stderr_lines) == 1, result
  assert "hold no vocabulary; give --corpus" in result.stderr_lines[0]


# --------------------------------------------------------------- live torch


@pytest.mark.slow  # trains torch models in a subprocess
def test_fixtures_rebuilt_with_live_torch_match(tmp_path):
  """Regenerates the fixtures with the installed torch and compares again;
  checks the direct tensor reading against torch.load too."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("safetensors")
  subprocess.run([sys.executable, str(REPO / "tools" / "make_torch_fixtures.py"),
                  f"--out={tmp_path}"], check=True, capture_output=True,
                 timeout=600)
  for file_name, ref_name in CASES + MODULE_CASES:
    check_against_reference(str(tmp_path), file_name, ref_name)
  for name in ("tied_views.pt", "stack_bf16.pt", "gru2_legacy.pt"):
    want = torch.load(tmp_path / name, weights_only=True)
    opener = (torch_legacy.read_legacy if "legacy" in name
              else torch_zip.read_zip)
    got, _, close = opener(tmp_path / name)
    for key, value in want.items():
      np.testing.assert_array_equal(got[key].read(name, key),
                                    value.float().numpy())
    close()


# A 10-byte pickle whose LONG_BINPUT names memo entry 2**31 - 1:
# Python's unpickler would size its memo for it (~16 GiB) before any object
# exists.
HUGE_MEMO_PICKLE = b"\x80\x02]r\xff\xff\xff\x7f."


def test_a_huge_memo_index_is_refused_before_unpickling(tmp_path):
  with pytest.raises(ValueError, match=r"memo entry 2147483647 after 2 "
                     r"opcodes; the file is corrupt") as info:
    unpickler.check_memo_indices(HUGE_MEMO_PICKLE, "x.pt")
  assert "\n" not in str(info.value)
  # The same pickle as a torch.save zip's data.pkl: refused in one line.
  path = tmp_path / "memo.pt"
  with zipfile.ZipFile(DATA / "gru2.pt") as source, \
      zipfile.ZipFile(path, "w") as target:
    for item in source.infolist():
      data = source.read(item)
      if item.filename.endswith("/data.pkl"):
        data = HUGE_MEMO_PICKLE
      target.writestr(item, data)
  with pytest.raises(ValueError, match="memo entry 2147483647") as info:
    convert.describe(path)
  assert "\n" not in str(info.value)
  assert str(info.value).startswith(str(path))
  # Real pickles number their memo entries from 0: each fixture passes.
  with zipfile.ZipFile(DATA / "gru2.pt") as source:
    name = next(n for n in source.namelist() if n.endswith("/data.pkl"))
    unpickler.check_memo_indices(source.read(name), "gru2.pt")
  unpickler.check_memo_indices(pickle.dumps([[1, 2]] * 3 + [{"a": (4,)}],
                                            protocol=2), "plain")
