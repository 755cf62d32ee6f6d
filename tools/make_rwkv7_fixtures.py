"""Writes the RWKV-7 fixtures of tests/test_rwkv7.py with KerasHub's own code.

keras-hub pins tensorflow-text, so it lives in a venv of its own beside the
main environment's TensorFlow and Keras (its wheel imports with none of its
other dependencies):

    python3 -m venv --system-site-packages /work/venv-rwkv
    /work/venv-rwkv/bin/pip install --no-deps keras-hub==0.32.0
    KERAS_BACKEND=tensorflow /work/venv-rwkv/bin/python \
        tools/make_rwkv7_fixtures.py            # into tests/data/rwkv7/

What it writes (small: a 3-layer, 32-wide model, 2 heads of 16, over a
world-format vocabulary of the 256 bytes and some longer tokens):

  - `preset/`: `RWKV7CausalLM.save_to_preset` of the model (config.json,
    model.weights.h5, assets/tokenizer/vocabulary.txt and the task's JSON);
  - `rwkv7.pth`: the same weights as an official RWKV-LM state dict
    (`emb.weight`, `blocks.N.att.*`, `blocks.N.ffn.*`, `blocks.0.ln0.*`,
    `ln_out.*`, `head.weight`; block 0's unused `v0`/`v1`/`v2` hold random
    values, as trained checkpoints hold theirs), written by `torch.save`;
  - `reference.npz`: KerasHub's logits from `call_with_cache` (RNN mode,
    token by token) over `PROMPT`'s ids and then its greedy continuation,
    the greedy ids `RWKV7CausalLM.generate` returns (greedy sampler, no stop
    token), and the logits of an independent float32 torch transcription of
    the official RNN-mode equations (RWKV-LM's RWKV-v7/rwkv_v7_demo_rnn.py:
    the decay as `exp(-e^-0.5 * sigmoid(w))`) over the `.pth`, with its own
    greedy ids;
  - `tokenizer.json`: texts and the ids `RWKVTokenizer` gives them, and the
    tokenizer's end token id ("\\n\\n", KerasHub's chat convention; the
    world vocabulary's end-of-text token is id 0).

Weights are seeded random draws at scales that spread the logits (KerasHub's
initializer draws every weight at 0.02, which leaves greedy choices to
rounding).
"""

import json
import os
import shutil
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # pylint: disable=g-import-not-at-top
import torch

import keras  # pylint: disable=g-import-not-at-top
import keras_hub

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_dir  # pylint: disable=g-import-not-at-top

HIDDEN, HEAD, LAYERS, FFN = 32, 16, 3, 64
LORA = dict(gate_lora=8, mv_lora=8, aaa_lora=8, decay_lora=8)
# Longer tokens after the 256 bytes (ids 257 on), as the world vocabulary
# holds such: "\n\n" (KerasHub's end token), words, multi-byte characters,
# and a token that is two bytes of a three-byte character.
LONGER = ["\n\n", " the", "th", "he", "in", "er", " a", "an", "ing", " and",
          " of", "é", "caf", "café", "中", "中文", "東京", "  ", "\r\n",
          "Hello", " world", " poet", " said", ".\n", b"\xe4\xb8", "😀"]
VOCAB_SIZE = 288  # Ids past the last token have none (as 65530.. in world).
PROMPT = "Hello the poet said"
STEPS = 16
TEXTS = ["Hello world", "\n\n", "a\n\nb", "the café 中文 東京 😀",
         "thing and\r\n", "", " " * 5, "\u4e2d\u56fd", "ünïcödé"]


def vocabulary_lines():
  """The vocabulary.txt lines, as the world file writes them."""
  lines = []
  for b in range(256):
    token = chr(b) if b < 0x80 else bytes([b])
    lines.append(f"{b + 1} {token!r} 1\n")
  for i, token in enumerate(LONGER):
    data = token if isinstance(token, bytes) else token.encode("utf-8")
    lines.append(f"{257 + i} {token!r} {len(data)}\n")
  return lines


def randomize(model, rng):
  """Seeded weights at scales that give the model varied logits."""
  for variable in model.weights:
    name = variable.path.split("/")[-1]
    shape = tuple(variable.shape)
    if name == "gamma":
      value = 1 + rng.normal(0, 0.2, shape)
    elif name.startswith("x_") or name in ("time_mix_k", "k_a"):
      value = rng.uniform(0, 1, shape)
    elif name == "embeddings":
      value = rng.normal(0, 1, shape)
    elif name == "w0":
      value = rng.normal(-1, 1, shape)
    elif len(shape) == 2 and name != "r_k":
      value = rng.normal(0, 1, shape) / np.sqrt(shape[0])
    else:
      value = rng.normal(0, 0.5, shape)
    if "head" in variable.path:
      value *= 3
    variable.assign(value.astype(np.float32))


def official_state_dict(backbone, rng):
  """The KerasHub weights under RWKV-LM's names and layouts."""
  vec = lambda v: torch.tensor(np.asarray(v)).reshape(1, 1, -1)
  mat = lambda v: torch.tensor(np.asarray(v))
  linear = lambda dense: torch.tensor(np.asarray(dense.kernel).T.copy())
  out = {"emb.weight": mat(backbone.token_embedding.embeddings)}
  for i, block in enumerate(backbone.rwkv_layers):
    p, att, ffn = f"blocks.{i}.", block.att, block.ffn
    norms = [("ln1", block.ln1), ("ln2", block.ln2)]
    if i == 0:
      norms.insert(0, ("ln0", block.ln0))
    for name, norm in norms:
      out[p + name + ".weight"] = mat(norm.gamma)
      out[p + name + ".bias"] = mat(norm.beta)
    for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0",
                 "k_k", "k_a"):
      out[p + "att." + name] = vec(getattr(att, name))
    for name in ("w1", "w2", "a1", "a2", "g1", "g2", "r_k"):
      out[p + "att." + name] = mat(getattr(att, name))
    if i == 0:  # Unused in block 0; trained checkpoints hold values.
      c, m = HIDDEN, LORA["mv_lora"]
      out[p + "att.v0"] = torch.tensor(rng.normal(0, 1, (1, 1, c)),
                                       dtype=torch.float32)
      out[p + "att.v1"] = torch.tensor(rng.normal(0, 1, (c, m)),
                                       dtype=torch.float32)
      out[p + "att.v2"] = torch.tensor(rng.normal(0, 1, (m, c)),
                                       dtype=torch.float32)
    else:
      out[p + "att.v0"] = vec(att.v0)
      out[p + "att.v1"] = mat(att.v1)
      out[p + "att.v2"] = mat(att.v2)
    for name, dense in (("receptance", att.receptance), ("key", att.key),
                        ("value", att.value), ("output", att.output_layer)):
      out[p + f"att.{name}.weight"] = linear(dense)
    out[p + "att.ln_x.weight"] = mat(att.ln_x.gamma)
    out[p + "att.ln_x.bias"] = mat(att.ln_x.beta)
    out[p + "ffn.x_k"] = vec(ffn.x_k)
    out[p + "ffn.key.weight"] = linear(ffn.key)
    out[p + "ffn.value.weight"] = linear(ffn.value)
  out["ln_out.weight"] = mat(backbone.output_layer_norm.gamma)
  out["ln_out.bias"] = mat(backbone.output_layer_norm.beta)
  out["head.weight"] = linear(backbone.head)
  return out


def official_logits(z, ids):
  """RWKV-7 in RNN mode over a `.pth` state dict, float32, token by token.

  Written from the official equations (RWKV-LM RWKV-v7/rwkv_v7_demo_rnn.py,
  `time_mixing__` and `channel_mixing__`), independently of KerasHub.
  """
  f = torch.nn.functional
  layers = 1 + max(int(k.split(".")[1]) for k in z if k.startswith("blocks."))
  heads, size = z["blocks.0.att.r_k"].shape
  c = heads * size
  norm = lambda x, p: f.layer_norm(x, (c,), z[p + ".weight"], z[p + ".bias"])
  att_x = [torch.zeros(c) for _ in range(layers)]
  ffn_x = [torch.zeros(c) for _ in range(layers)]
  states = [torch.zeros(heads, size, size) for _ in range(layers)]
  logits = []
  for token in ids:
    x = norm(z["emb.weight"][token], "blocks.0.ln0")
    v_first = None
    for i in range(layers):
      a = lambda n: z[f"blocks.{i}.att.{n}"].reshape(-1) if z[
          f"blocks.{i}.att.{n}"].dim() == 3 else z[f"blocks.{i}.att.{n}"]
      xx = norm(x, f"blocks.{i}.ln1")
      shift = att_x[i] - xx
      att_x[i] = xx
      xr, xw, xk, xv, xa, xg = (xx + shift * a(m) for m in
                                ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"))
      r = a("receptance.weight") @ xr
      w = torch.tanh(xw @ a("w1")) @ a("w2")
      k = a("key.weight") @ xk
      v = a("value.weight") @ xv
      aa = torch.sigmoid(a("a0") + (xa @ a("a1")) @ a("a2"))
      g = torch.sigmoid(xg @ a("g1")) @ a("g2")
      kk = f.normalize((k * a("k_k")).view(heads, size), dim=-1,
                       p=2.0).view(-1)
      k = k * (1 + (aa - 1) * a("k_a"))
      if i == 0:
        v_first = v
      else:
        v = v + (v_first - v) * torch.sigmoid(a("v0") + (xv @ a("v1"))
                                              @ a("v2"))
      w = torch.exp(-0.606531 * torch.sigmoid(a("w0") + w))
      vk = v.view(heads, size, 1) @ k.view(heads, 1, size)
      ab = (-kk).view(heads, size, 1) @ (kk * aa).view(heads, 1, size)
      states[i] = states[i] * w.view(heads, 1, size) + states[i] @ ab + vk
      out = (states[i] @ r.view(heads, size, 1)).view(1, c)
      out = f.group_norm(out, heads, a("ln_x.weight"), a("ln_x.bias"),
                         eps=64e-5).view(c)
      out = out + ((r * k * a("r_k").reshape(-1)).view(heads, size).sum(
          -1, keepdim=True) * v.view(heads, size)).view(c)
      x = x + a("output.weight") @ (out * g)
      xx = norm(x, f"blocks.{i}.ln2")
      shift = ffn_x[i] - xx
      ffn_x[i] = xx
      kf = torch.relu(z[f"blocks.{i}.ffn.key.weight"]
                      @ (xx + shift * z[f"blocks.{i}.ffn.x_k"].reshape(-1)))
      x = x + z[f"blocks.{i}.ffn.value.weight"] @ kf ** 2
    x = norm(x, "ln_out")
    logits.append((z["head.weight"] @ x).numpy())
  return np.stack(logits)


def keras_logits(lm, ids):
  """`call_with_cache` in RNN mode, one token at a time, from a zero cache."""
  backbone = lm.backbone
  heads = backbone.hidden_size // backbone.head_size
  cache = [np.zeros([1, backbone.num_layers, heads, backbone.head_size,
                     backbone.head_size], np.float32),
           np.zeros([1, backbone.num_layers, 2, 1, backbone.hidden_size],
                    np.float32)]
  logits = []
  for token in ids:
    out, _, cache = lm.call_with_cache(np.array([[token]], np.int32), cache)
    logits.append(np.asarray(out)[0, 0])
  return np.stack(logits)


def main():
  out_dir = fixture_dir.output_dir(__doc__, "rwkv7")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(0)
  tokenizer = keras_hub.models.RWKVTokenizer(vocabulary=vocabulary_lines())
  preprocessor = keras_hub.models.RWKV7CausalLMPreprocessor(
      tokenizer, sequence_length=32)
  backbone = keras_hub.models.RWKV7Backbone(
      hidden_size=HIDDEN, head_size=HEAD, num_layers=LAYERS,
      vocabulary_size=VOCAB_SIZE, intermediate_dim=FFN, **LORA)
  randomize(backbone, rng)
  lm = keras_hub.models.RWKV7CausalLM(backbone, preprocessor)
  preset = os.path.join(out_dir, "preset")
  shutil.rmtree(preset, ignore_errors=True)
  lm.save_to_preset(preset)

  prompt_ids = [int(i) for i in np.asarray(tokenizer(PROMPT))]
  # generate() with the greedy sampler and no stop token, on the ids the
  # preprocessor makes (its prompt padding and start token).
  bare = keras_hub.models.RWKV7CausalLM(backbone, None)
  bare.compile(sampler="greedy")
  inputs = preprocessor.generate_preprocess([PROMPT], sequence_length=STEPS)
  generated = bare.generate(inputs, stop_token_ids=None)
  ids = np.asarray(generated["token_ids"])[0]
  greedy = [int(i) for i in ids[-STEPS:]]
  assert [int(i) for i in ids[-STEPS - 1:-STEPS]] == prompt_ids[-1:]

  sequence = prompt_ids + greedy
  k_logits = keras_logits(lm, sequence)
  assert [int(i) for i in k_logits[len(prompt_ids) - 1:-1].argmax(-1)] == \
      greedy, "call_with_cache's argmax differs from generate"
  top2 = np.sort(k_logits, -1)[:, -2:]
  print("least greedy margin", float((top2[:, 1] - top2[:, 0]).min()))

  state = official_state_dict(backbone, rng)
  torch.save(state, os.path.join(out_dir, "rwkv7.pth"))
  z = torch.load(os.path.join(out_dir, "rwkv7.pth"), weights_only=True)
  z = {k: v.float() for k, v in z.items()}
  o_logits = official_logits(z, sequence)
  # The official greedy continuation, from its own logits.
  o_greedy, ids_o = [], list(prompt_ids)
  for _ in range(STEPS):
    o_greedy.append(int(official_logits(z, ids_o)[-1].argmax()))
    ids_o.append(o_greedy[-1])
  print("keras vs official logits", float(np.abs(k_logits - o_logits).max()))
  np.savez_compressed(
      os.path.join(out_dir, "reference.npz"),
      prompt_ids=np.array(prompt_ids, np.int32),
      keras_logits=k_logits.astype(np.float32),
      keras_greedy=np.array(greedy, np.int32),
      official_logits=o_logits.astype(np.float32),
      official_greedy=np.array(o_greedy, np.int32))
  cases = {"texts": TEXTS,
           "ids": [[int(i) for i in np.asarray(tokenizer(t))] for t in TEXTS],
           "end_token_id": int(tokenizer.end_token_id),
           "prompt": PROMPT}
  with open(os.path.join(out_dir, "tokenizer.json"), "w",
            encoding="utf-8") as f:
    json.dump(cases, f, ensure_ascii=False, indent=1)
  print("greedy", greedy, "official", o_greedy)


if __name__ == "__main__":
  main()
