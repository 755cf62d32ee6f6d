"""The weights mapping of the llama.cpp peer benchmark (tools/bench/llama_cpp.py,
issue #62), on a tiny RWKV-7 model; llama.cpp itself is not needed.

The official layout is checked by reading it back with rnnstep's own
official-checkpoint reader (which tests/test_rwkv7.py checks against the
official equations); fla's layout against the parameter names and shapes of
flash-linear-attention's `RWKV7ForCausalLM` (fla/models/rwkv7 and
fla/layers/rwkv7.py: every one its `utils/convert_from_rwkv7.py` must fill),
written out here by hand.
"""

import json
import struct

import numpy as np
import pytest

from rnnstep.convert import rwkv7 as rwkv7_reader
from rnnstep.model import kinds
from rnnstep.model import model_file
from tools.bench import llama_cpp

C, H, D, FFN, VOCAB, BLOCKS = 16, 2, 8, 24, 40, 2
LORA = dict(decay_lora=4, a_lora=6, v_lora=2, gate_lora=10)


@pytest.fixture(scope="module")
def tiny():
  sizes = dict(blocks=BLOCKS, head_size=D, ffn=FFN, **LORA)
  layer = model_file.LayerConfig(
      "rwkv7", C, sizes=tuple((k, sizes[k]) for k in kinds.RWKV7_SIZES))
  config = model_file.ModelConfig(C, (layer,))
  rng = np.random.default_rng(0)
  tensors = {key: rng.standard_normal(shape).astype(np.float32)
             for key, shape in config.expected_shapes(VOCAB).items()}
  tensors["dense_bias"][:] = 0
  return config, tensors


def fla_expected_shapes():
  """fla's RWKV7ForCausalLM state dict at the tiny sizes."""
  w, a, v, g = (LORA[k] for k in ("decay_lora", "a_lora", "v_lora",
                                  "gate_lora"))
  shapes = {"model.embeddings.weight": (VOCAB, C),
            "model.norm.weight": (C,), "model.norm.bias": (C,),
            "lm_head.weight": (VOCAB, C)}
  for i in range(BLOCKS):
    p = f"model.layers.{i}."
    norms = ["attn_norm", "ffn_norm"] + (["pre_norm"] if i == 0 else [])
    for norm in norms + ["attn.g_norm"]:
      shapes[p + norm + ".weight"] = shapes[p + norm + ".bias"] = (C,)
    for x in "rwkvag":
      shapes[p + f"attn.x_{x}"] = (1, 1, C)
    shapes.update({p + "attn.k_k": (C,), p + "attn.k_a": (C,),
                   p + "attn.r_k": (H, D)})
    for proj in ("r", "k", "v", "o"):
      shapes[p + f"attn.{proj}_proj.weight"] = (C, C)
    for name, rank, bias in (("w", w, True), ("a", a, True), ("v", v, True),
                             ("g", g, False)):
      if name == "v" and i == 0:
        continue  # Block 0's v is v_first: no LoRA.
      shapes[p + f"attn.{name}_lora.lora.0.weight"] = (rank, C)
      shapes[p + f"attn.{name}_lora.lora.2.weight"] = (C, rank)
      if bias:
        shapes[p + f"attn.{name}_lora.lora.2.bias"] = (C,)
    shapes.update({p + "ffn.x_k": (C,), p + "ffn.key.weight": (FFN, C),
                   p + "ffn.value.weight": (C, FFN)})
  return shapes


def test_official_state_dict_reads_back_as_the_same_model(tiny):
  config, tensors = tiny
  official = llama_cpp.official_state_dict(config, tensors)
  assert rwkv7_reader.is_official_state_dict(official)
  assert official["blocks.1.att.r_k"].shape == (H, D)
  assert official["blocks.0.att.x_r"].shape == (1, 1, C)
  assert official["blocks.1.att.key.weight"].shape == (C, C)
  read = rwkv7_reader.from_state_dict(dict(official), None, "tiny").tensors
  want = dict(tensors)
  # Block 0 reads no v LoRA: the reader writes zeros there.
  want["layer0_vectors"] = want["layer0_vectors"].copy()
  want["layer0_vectors"][0, kinds.RWKV7_VECTORS.index("v0")] = 0
  for name in ("v1", "v2"):
    want[f"layer0_{name}"] = want[f"layer0_{name}"].copy()
    want[f"layer0_{name}"][0] = 0
  assert sorted(read) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(read[name], want[name], err_msg=name)


def test_a_head_bias_has_no_official_place(tiny):
  config, tensors = tiny
  tensors = dict(tensors, dense_bias=np.ones(VOCAB, np.float32))
  with pytest.raises(ValueError, match="no head bias"):
    llama_cpp.official_state_dict(config, tensors)


def test_fla_state_dict_is_fla_s_model_whole(tiny):
  config, tensors = tiny
  official = llama_cpp.official_state_dict(config, tensors)
  fla = llama_cpp.fla_state_dict(official)
  assert {n: a.shape for n, a in fla.items()} == fla_expected_shapes()
  # Values: a LoRA's down and up matrices transposed, its x0 the bias; the
  # projections as they are ([out, in] in both).
  np.testing.assert_array_equal(fla["model.layers.1.attn.w_lora.lora.0.weight"],
                                official["blocks.1.att.w1"].T)
  np.testing.assert_array_equal(fla["model.layers.1.attn.a_lora.lora.2.bias"],
                                official["blocks.1.att.a0"].reshape(-1))
  np.testing.assert_array_equal(fla["model.layers.0.attn.o_proj.weight"],
                                official["blocks.0.att.output.weight"])
  np.testing.assert_array_equal(fla["model.layers.0.attn.g_norm.bias"],
                                official["blocks.0.att.ln_x.bias"])
  config_json = llama_cpp.fla_config(official)
  assert (config_json["hidden_size"], config_json["head_dim"],
          config_json["num_hidden_layers"], config_json["intermediate_size"],
          config_json["vocab_size"]) == (C, D, BLOCKS, FFN, VOCAB)
  assert (config_json["decay_low_rank_dim"], config_json["a_low_rank_dim"],
          config_json["v_low_rank_dim"], config_json["gate_low_rank_dim"]
          ) == tuple(LORA[k] for k in ("decay_lora", "a_lora", "v_lora",
                                       "gate_lora"))


def test_an_unknown_tensor_is_named():
  with pytest.raises(ValueError, match="'blocks.0.mystery.x'"):
    llama_cpp.fla_name("blocks.0.mystery.x")


def test_safetensors_file_reads_back(tmp_path):
  arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
            "b.c": np.float32([1.5])}
  path = tmp_path / "m.safetensors"
  llama_cpp.write_safetensors(path, arrays)
  raw = path.read_bytes()
  (size,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8:8 + size])
  assert (8 + size) % 8 == 0
  for name, array in arrays.items():
    begin, end = header[name]["data_offsets"]
    assert header[name]["dtype"] == "F32"
    np.testing.assert_array_equal(
        np.frombuffer(raw[8 + size + begin:8 + size + end], "<f4").reshape(
            header[name]["shape"]), array)
