"""State files (#61): `rnnstep.load_state`, `save_state`, `prompt_state` and
`rnnstep-generate --state`.

The reference is the official RWKV-7 inference code, never rnnstep's numbers:
tools/make_rwkv7_state_fixtures.py (torch and the `rwkv` package) wrote
random WKV states as RWKV's state tuning saves them (`state.pth`,
`state.safetensors`), web-rwkv's conversion of them (`state.st`: float16,
transposed), and `RWKV_x070`'s logits and greedy ids from them, started as
RWKV-Runner's `load_rwkv_state` starts RWKV-7 (token shifts zero). Where
torch and `rwkv` are importable, `test_the_official_code_from_a_file_built_here`
builds a new file and runs the reference live.
"""

import json
import os
import pathlib
import pickle
import re
import struct
import zipfile

import numpy as np
import pytest

import rnnstep
from rnnstep import errors
from rnnstep.model import model_file
from tests.support import cli
from tests.support import hostile_pickles
from tests.support import torch_files

DATA = pathlib.Path(__file__).parent / "data" / "rwkv7"
PRESET = str(DATA / "preset")
STATES = DATA / "state"
PROMPT = "Hello the poet said"  # The ids of reference.npz's prompt_ids.
CONTEXT, QUESTION = "Hello the", " poet said"


@pytest.fixture(scope="module")
def model():
  return rnnstep.load(PRESET)


@pytest.fixture(scope="module")
def reference():
  return dict(np.load(STATES / "reference.npz"))


@pytest.fixture(scope="module")
def stack_model(tmp_path_factory):
  """A random LSTM -> GRU model file: states with rnnstep's own names."""
  rng = np.random.default_rng(7)
  vocab = [chr(c) for c in range(32, 97)]
  v, d = len(vocab), 8
  config = model_file.ModelConfig(d, (
      model_file.LayerConfig("lstm", 12, True),
      model_file.LayerConfig("gru", 10, True)))
  tensors = {
      "embedding": rng.normal(size=(v, d)),
      "layer0_kernel": rng.normal(size=(d, 48)) * 0.5,
      "layer0_recurrent_kernel": rng.normal(size=(12, 48)) * 0.5,
      "layer0_bias": rng.normal(size=(48,)) * 0.1,
      "layer1_kernel": rng.normal(size=(12, 30)) * 0.5,
      "layer1_recurrent_kernel": rng.normal(size=(10, 30)) * 0.5,
      "layer1_bias": rng.normal(size=(2, 30)) * 0.1,
      "dense_kernel": rng.normal(size=(10, v)) * 2,
      "dense_bias": rng.normal(size=(v,)) * 0.1,
  }
  path = tmp_path_factory.mktemp("stack") / "stack.npz"
  model_file.write(str(path), config, vocab,
                   {k: x.astype(np.float32) for k, x in tensors.items()})
  return rnnstep.load(str(path))


def _greedy(model, prompt, steps, state=None, **kwargs):
  return rnnstep.generate(model, prompt, steps, temperature=0.0,
                          initial_state=state, jit_compile=False, **kwargs)


# ------------------------------------------------ the official reference


@pytest.mark.parametrize("name,rounded", [("state.pth", False),
                                          ("state.safetensors", False),
                                          ("state.st", True)])
def test_a_state_file_gives_the_official_code_s_logits_and_text(
    name, rounded, model, reference):
  """RWKV_x070 from the file's state: its logits over the prompt and its
  greedy ids (float32 rounding), and its greedy text; a `.st` file gives
  the reference's result for the float16-rounded state."""
  suffix = "_f16" if rounded else ""
  state = rnnstep.load_state(STATES / name, model)
  assert [sorted(layer) for layer in state] == [sorted(
      ["h"] + [f"{n}{i}" for i in range(3) for n in ("att_x", "wkv",
                                                     "ffn_x")])]
  want_wkv = reference["wkv"]
  if rounded:
    want_wkv = want_wkv.astype(np.float16).astype(np.float32)
  for i in range(3):
    np.testing.assert_array_equal(state[0][f"wkv{i}"][0],
                                  want_wkv[i].reshape(-1))
    assert not state[0][f"att_x{i}"].any() and not state[0][f"ffn_x{i}"].any()
  greedy = reference["greedy" + suffix]
  ids = np.concatenate([reference["prompt_ids"], greedy])
  np.testing.assert_allclose(
      rnnstep.logits(model, ids, initial_state=state)[0],
      reference["logits" + suffix], rtol=1e-5, atol=2e-5)
  assert _greedy(model, PROMPT, len(greedy), state) == model.tokens.decode(
      greedy)


def test_a_batch_starts_every_row_from_the_file(model, reference):
  state = rnnstep.load_state(STATES / "state.pth", model, batch_size=3)
  assert state[0]["wkv0"].shape == (3, 2 * 16 * 16)
  want = model.tokens.decode(reference["greedy"])
  assert _greedy(model, [PROMPT] * 3, 16, state) == [want] * 3
  with pytest.raises(errors.ArgumentError, match="^batch_size must be a "
                     "positive integer, got 0$"):
    rnnstep.load_state(STATES / "state.pth", model, batch_size=0)


@pytest.mark.slow
def test_the_official_code_from_a_file_built_here(tmp_path, model):
  """Live where torch and `rwkv` are installed (not in CI): a new random
  state saved by torch.save and by rnnstep.save_state, RWKV_x070 from it,
  and rnnstep's logits from both files; torch.load reads rnnstep's `.pth`."""
  torch = pytest.importorskip("torch")
  os.environ["RWKV_V7_ON"] = "1"
  rwkv_model = pytest.importorskip("rwkv.model")
  official = rwkv_model.RWKV_x070(str(DATA / "rwkv7"), "cpu fp32")
  rng = np.random.default_rng(5)
  wkv = rng.normal(0, 0.7, (3, 2, 16, 16)).astype(np.float32)
  torch.save({f"blocks.{i}.att.time_state": torch.tensor(w)
              for i, w in enumerate(wkv)}, tmp_path / "torch.pth")
  ids = model.encode(PROMPT).tolist()
  state = []
  for w in wkv:
    state += [torch.zeros(32), torch.tensor(w), torch.zeros(32)]
  want, _ = official.forward(ids, state, full_output=True)
  loaded = rnnstep.load_state(tmp_path / "torch.pth", model)
  rnnstep.save_state(tmp_path / "ours.pth", model, loaded, token_shift=False)
  back = torch.load(tmp_path / "ours.pth", weights_only=True)
  assert sorted(back) == [f"blocks.{i}.att.time_state" for i in range(3)]
  for i in range(3):
    np.testing.assert_array_equal(back[f"blocks.{i}.att.time_state"].numpy(),
                                  wkv[i])
  for path in ("torch.pth", "ours.pth"):
    got = rnnstep.logits(model, ids, initial_state=rnnstep.load_state(
        tmp_path / path, model))[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=2e-5)


# ----------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_save_then_load_continues_as_the_prompt_does(suffix, model,
                                                     tmp_path):
  """The state after a context, saved and loaded back, continues exactly
  as the state itself does, and as the context and the question together
  (ids: the split keeps the tokens)."""
  context, question = model.encode(CONTEXT), model.encode(QUESTION)
  state = rnnstep.prompt_state(model, [context])
  path = tmp_path / f"s{suffix}"
  rnnstep.save_state(path, model, state)
  loaded = rnnstep.load_state(path, model)
  for name, value in state[0].items():
    if name != "h":  # h, the last output, is not a state the file holds.
      np.testing.assert_array_equal(loaded[0][name], value, name)
  ids = np.concatenate([context, question])
  np.testing.assert_allclose(
      rnnstep.logits(model, question, initial_state=loaded)[0],
      rnnstep.logits(model, ids)[0][len(context):], rtol=1e-5, atol=1e-5)
  carried = _greedy(model, QUESTION, 12, state, seed=3)
  assert _greedy(model, QUESTION, 12, loaded, seed=3) == carried
  assert carried == _greedy(model, CONTEXT + QUESTION, 12, seed=3)
  sampled = rnnstep.generate(model, QUESTION, 12, temperature=0.9, seed=4,
                             initial_state=loaded)
  assert sampled == rnnstep.generate(model, QUESTION, 12, temperature=0.9,
                                     seed=4, initial_state=state)


def test_a_web_rwkv_file_round_trips_through_float16(model, tmp_path):
  state = rnnstep.prompt_state(model, CONTEXT)
  rnnstep.save_state(tmp_path / "s.st", model, state)
  loaded = rnnstep.load_state(tmp_path / "s.st", model)
  rounded = [{k: v.astype(np.float16).astype(np.float32) for k, v in
              state[0].items()}]
  for name in state[0]:
    if name != "h":
      np.testing.assert_array_equal(loaded[0][name], rounded[0][name], name)


def test_wkv_alone_is_the_file_rwkv_runner_loads(model, tmp_path):
  """token_shift=False writes one time_state per block (RWKV-Runner counts
  them); it loads with the token shifts at zero."""
  state = rnnstep.prompt_state(model, CONTEXT)
  rnnstep.save_state(tmp_path / "s.pth", model, state, token_shift=False)
  with zipfile.ZipFile(tmp_path / "s.pth") as archive:
    assert sorted(n.split("/", 1)[1] for n in archive.namelist()) == [
        "byteorder", "data.pkl", "data/0", "data/1", "data/2", "version"]
  loaded = rnnstep.load_state(tmp_path / "s.pth", model)
  for i in range(3):
    np.testing.assert_array_equal(loaded[0][f"wkv{i}"], state[0][f"wkv{i}"])
    assert not loaded[0][f"att_x{i}"].any()


def test_prompt_state_is_hidden_states_last_position(stack_model):
  texts = ["ABCDEF", "XY", "QRSTU"]
  every = rnnstep.hidden_states(stack_model, texts)
  final = rnnstep.prompt_state(stack_model, texts)
  lengths = [len(t) for t in texts]
  for layer, states in zip(final, every):
    assert sorted(layer) == sorted(states)
    for name, value in layer.items():
      want = np.stack([states[name][row, n - 1]
                       for row, n in enumerate(lengths)])
      np.testing.assert_allclose(value, want, rtol=0, atol=1e-6)


def test_a_gru_lstm_stack_s_state_round_trips(stack_model, tmp_path):
  state = rnnstep.prompt_state(stack_model, "HELLO ")
  rnnstep.save_state(tmp_path / "s.safetensors", stack_model, state)
  loaded = rnnstep.load_state(tmp_path / "s.safetensors", stack_model)
  for got, want in zip(loaded, state):
    assert sorted(got) == sorted(want)
    for name in want:
      np.testing.assert_array_equal(got[name], want[name])
  assert (_greedy(stack_model, "WORLD", 20, loaded)
          == _greedy(stack_model, "HELLO WORLD", 20))


# -------------------------------------------------------------- refusals


def _write_safetensors(path, arrays):
  """A safetensors file of {name: array} in the arrays' own dtypes."""
  codes = {"float32": "F32", "float16": "F16", "int32": "I32",
           "uint16": "BF16"}  # bfloat16 as its raw 16 bits.
  header, offset, blobs = {}, 0, []
  for name, array in arrays.items():
    blob = np.ascontiguousarray(array).tobytes()
    header[name] = {"dtype": codes[array.dtype.name],
                    "shape": list(array.shape),
                    "data_offsets": [offset, offset + len(blob)]}
    offset += len(blob)
    blobs.append(blob)
  text = json.dumps(header).encode()
  pathlib.Path(path).write_bytes(struct.pack("<Q", len(text)) + text
                                 + b"".join(blobs))


def _wkv(blocks=3, shape=(2, 16, 16), dtype=np.float32):
  return {f"blocks.{i}.att.time_state": np.zeros(shape, dtype)
          for i in range(blocks)}


BAD_FILES = {
    "two_blocks": (lambda: _wkv(2),
                   r"no tensor 'blocks\.2\.att\.time_state' \(block 2's WKV "
                   r"state .*for an RWKV-7 model of 3 blocks, 2 heads of 16"),
    "four_blocks": (lambda: _wkv(4),
                    r"tensor 'blocks\.3\.att\.time_state' is not part of a "
                    r"state of an RWKV-7 model of 3 blocks"),
    "shape": (lambda: _wkv(shape=(4, 8, 8)),
              r"tensor 'blocks\.0\.att\.time_state' has shape \(4, 8, 8\); "
              r"an RWKV-7 model of 3 blocks, 2 heads of 16 needs \(2, 16, 16\)"),
    "dtype": (lambda: _wkv(dtype=np.int32),
              r"tensor 'blocks\.0\.att\.time_state' has dtype int32; a state "
              r"is float"),
    "nan": (lambda: dict(_wkv(), **{"blocks.1.att.time_state": np.full(
        (2, 16, 16), np.nan, np.float32)}),
            r"tensor 'blocks\.1\.att\.time_state' holds values that are not "
            r"finite"),
    "token_shift": (lambda: dict(_wkv(), **{"blocks.0.att.x_prev": np.zeros(
        16, np.float32)}),
                    r"tensor 'blocks\.0\.att\.x_prev' has shape \(16,\); .* "
                    r"needs \(32,\) \(block 0's time-mix token shift\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_one_line_naming_it_and_the_tensor(case, model,
                                                         tmp_path):
  make, pattern = BAD_FILES[case]
  for suffix in (".safetensors", ".pth"):
    path = tmp_path / f"bad{suffix}"
    arrays = make()
    if suffix == ".pth":
      if any(a.dtype != np.float32 for a in arrays.values()):
        continue  # The hand-made torch.save writes float32 only.
      torch_files.write_state_dict(path, arrays)
    else:
      _write_safetensors(path, arrays)
    with pytest.raises(ValueError) as e:
      rnnstep.load_state(path, model)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: "), message
    assert re.search(pattern, message), message


def test_a_pickle_that_runs_code_is_refused_and_runs_nothing(model,
                                                             tmp_path):
  marker = tmp_path / "ran"
  path = tmp_path / "evil.pth"
  torch_files.write_torch_zip(path, pickle.dumps(
      {"blocks.0.att.time_state": hostile_pickles.RunsCode(marker)},
      protocol=2))
  with pytest.raises(ValueError) as e:
    rnnstep.load_state(path, model)
  message = str(e.value)
  assert message.startswith(f"{path}: ") and "system" in message, message
  assert "\n" not in message
  assert not marker.exists()


def test_a_bfloat16_state_reads_exactly(model, reference, tmp_path):
  """State-tuned files are often bfloat16: widened to float32 exactly."""
  wkv = reference["wkv"]
  bits = (wkv.view(np.uint32) >> 16).astype(np.uint16)
  _write_safetensors(tmp_path / "bf16.safetensors", {
      f"blocks.{i}.att.time_state": bits[i] for i in range(3)})
  state = rnnstep.load_state(tmp_path / "bf16.safetensors", model)
  for i in range(3):
    np.testing.assert_array_equal(
        state[0][f"wkv{i}"][0],
        (bits[i].astype(np.uint32) << 16).view(np.float32).reshape(-1))


def test_other_refusals(model, stack_model, tmp_path):
  with pytest.raises(FileNotFoundError):
    rnnstep.load_state(tmp_path / "missing.pth", model)
  text = tmp_path / "notes.pth"
  text.write_text("not a state\n")
  with pytest.raises(ValueError, match=r"not a state file: neither a "
                     r"torch\.save file"):
    rnnstep.load_state(text, model)
  # An RWKV-7 file for a GRU/LSTM model names what it expects instead.
  with pytest.raises(ValueError, match=r"tensor 'blocks\.0\.att\.time_state' "
                     r"is not part of a state of a model of 2 recurrent layers "
                     r"\(LSTM 12, GRU 10\) \(expected 3 tensors layers\.0\.h, "
                     r"layers\.0\.c, layers\.1\.h\)"):
    rnnstep.load_state(STATES / "state.pth", stack_model)
  state = rnnstep.prompt_state(model, [CONTEXT, QUESTION])
  with pytest.raises(errors.ArgumentError, match=r"^state\[0\]\['h'\] is "
                     r"float32 \[2, 32\]; state must be") as e:
    rnnstep.save_state(tmp_path / "s.pth", model, state)
  assert e.value.argument == "state"
  with pytest.raises(errors.ArgumentError, match=r"a state file's name ends "
                     r"in one of \.pth"):
    rnnstep.save_state(tmp_path / "s.npz", model, state)
  with pytest.raises(errors.ArgumentError, match="^state is None"):
    rnnstep.save_state(tmp_path / "s.pth", model, None)
  assert not any(tmp_path.glob("s.*"))


# ------------------------------------------------------- the command line


@pytest.mark.slow
def test_cli_state_flag_generates_the_official_text(reference, model):
  generate_cmd = cli.command("rnnstep-generate", "rnnstep.cli.generate")
  want = model.tokens.decode(reference["greedy"])
  result = cli.run_binary(generate_cmd, [
      f"--model={PRESET}", f"--state={STATES / 'state.safetensors'}",
      f"--prompt={PROMPT}", "--num_steps=16", "--temperature=0",
      "--verbose"])
  assert result.returncode == 0, result
  assert result.stdout == PROMPT + want + "\n"
  # The warm path's artifact starts from the zero state: TensorFlow's path.
  assert result.stderr_lines[0].startswith(
      "rnnstep-generate: TensorFlow path: --state: the compiled artifact "
      "starts from the zero state"), result
  line = cli.one_error_line(cli.run_binary(generate_cmd, [
      f"--model={PRESET}", f"--state={DATA / 'rwkv7.pth'}", "--num_steps=2"]))
  assert line.startswith(f"rnnstep-generate: error: --state={DATA / 'rwkv7.pth'}"
                         ": tensor 'emb.weight' is not part of a state"), line
