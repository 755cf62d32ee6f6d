"""llama.cpp as a peer of rnnstep on RWKV-7 (issue #62): the same weights as
a GGUF, checked against the official reference, timed by `llama-bench`.

`tools/bench_rwkv7.py --llama_cpp_dir=...` runs it (its docstring has the
usage). llama.cpp is no part of rnnstep: it is built apart, from the
llama-cpp-python source package's `vendor/llama.cpp`, and found by
`--llama_cpp_dir` (the tree, with `build/bin/` holding `llama-bench`,
`llama-quantize`, `llama-simple` and `llama-debug`). Its converter needs
a Python with torch, transformers and numpy (`--convert_python`); the
official reference (the `rwkv` package's RWKV_x070) runs there too.

The weights travel as a real checkpoint's would:

  rnnstep's tensors -> `official_state_dict`: RWKV-LM's names and layouts,
    written as a `.pth` (what `rnnstep-convert` and the `rwkv` package read);
  -> `fla_state_dict` + `fla_config`: flash-linear-attention's
    `RWKV7ForCausalLM`, named as fla's `utils/convert_from_rwkv7.py` names
    an official checkpoint, written as a Hugging Face folder (safetensors,
    config.json, the world vocabulary `rwkv_vocab_v20230424.txt`);
  -> llama.cpp's `convert_hf_to_gguf.py` (F32, F16), then `llama-quantize`
    (Q8_0 and any other type it names).
"""

import json
import os
import pathlib
import re
import struct
import subprocess
import tempfile

import numpy as np

from rnnstep.model import kinds

# RWKV-7 tensors fla's converter leaves out: block 0 reads no value LoRA
# (its v is v_first), though trained checkpoints carry one.
FLA_UNUSED = ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2")
FLA_TOP = {"emb.weight": "model.embeddings.weight",
           "ln_out.weight": "model.norm.weight",
           "ln_out.bias": "model.norm.bias",
           "head.weight": "lm_head.weight"}
FLA_PARTS = {"att": "attn", "ffn": "ffn", "ln0": "pre_norm",
             "ln1": "attn_norm", "ln2": "ffn_norm"}
FLA_PROJECTIONS = {"receptance": "r_proj", "key": "k_proj",
                   "value": "v_proj", "output": "o_proj", "ln_x": "g_norm"}
# A LoRA's x0 (bias), x1 (down) and x2 (up) as fla's two Linear layers; the
# matrices are [out, in] there, [in, out] (`x @ W`) in the official file.
FLA_LORA = {"0": "2.bias", "1": "0.weight", "2": "2.weight"}
# The world vocabulary file llama.cpp's converter reads from the folder.
WORLD_VOCABULARY = "rwkv_vocab_v20230424.txt"
BINARIES = ("llama-bench", "llama-quantize", "llama-simple", "llama-debug")
# llama.cpp's end-of-generation ids for the world vocabulary: 0 and "\n\n".
WORLD_END_IDS = (0, 261)


# ------------------------------------------------------------ the mapping


def official_state_dict(config, tensors):
  """An `rwkv7` layer's tensors (`kinds.rwkv7_shapes`) under RWKV-LM's
  names and layouts: `rnnstep.convert.rwkv7.from_state_dict` inverted.

  Args:
    config: the `model_file.ModelConfig` (one `rwkv7` layer).
    tensors: the model file's float32 arrays (`layer0_*`, `embedding`,
      `dense_kernel`, `dense_bias`).

  Raises:
    ValueError: a model an official checkpoint cannot hold (not one
      RWKV-7 layer; a head bias that is not zero).
  """
  layers = config.layers
  if len(layers) != 1 or layers[0].kind != "rwkv7":
    raise ValueError("an official RWKV-7 checkpoint holds one rwkv7 layer")
  if np.any(tensors["dense_bias"]):
    raise ValueError("an official RWKV-7 checkpoint has no head bias; this "
                     "model's is not zero")
  layer = layers[0]
  units, head_size = layer.units, layer.size["head_size"]
  t = lambda name: np.asarray(tensors[f"layer0_{name}"], np.float32)
  vec = lambda v: v.reshape(1, 1, -1)
  out = {"emb.weight": np.asarray(tensors["embedding"], np.float32)}
  for i in range(layer.size["blocks"]):
    p = f"blocks.{i}."
    if i == 0:
      out[p + "ln0.weight"], out[p + "ln0.bias"] = t("kernel")
    ln = t("ln")[i]
    out.update({p + "ln1.weight": ln[0], p + "ln1.bias": ln[1],
                p + "ln2.weight": ln[2], p + "ln2.bias": ln[3]})
    for row, name in zip(t("mix")[i], kinds.RWKV7_MIX):
      out[p + ("ffn.x_k" if name == "ffn_x_k" else "att." + name)] = vec(row)
    for row, name in zip(t("vectors")[i], kinds.RWKV7_VECTORS):
      out[p + "att." + name] = (row.reshape(units // head_size, head_size)
                                if name == "r_k" else vec(row))
    for name in ("w1", "w2", "a1", "a2", "v1", "v2", "g1", "g2"):
      out[p + "att." + name] = t(name)[i]
    for name in ("receptance", "key", "value", "output"):
      out[p + f"att.{name}.weight"] = t(name)[i].T
    out[p + "att.ln_x.weight"], out[p + "att.ln_x.bias"] = t("ln_x")[i]
    out[p + "ffn.key.weight"] = t("ffn_key")[i].T
    out[p + "ffn.value.weight"] = t("ffn_value")[i].T
  out["ln_out.weight"], out["ln_out.bias"] = t("output_norm")
  out["head.weight"] = np.asarray(tensors["dense_kernel"], np.float32).T
  return {name: np.ascontiguousarray(a) for name, a in out.items()}


def fla_name(name):
  """(fla's name, whether the matrix is transposed) of an official tensor;
  (None, False) for one fla leaves out (`FLA_UNUSED`)."""
  if name in FLA_UNUSED:
    return None, False
  if name in FLA_TOP:
    return FLA_TOP[name], False
  parts = name.split(".")
  if parts[0] != "blocks" or len(parts) < 4 or parts[2] not in FLA_PARTS:
    raise ValueError(f"{name!r} is not an RWKV-7 tensor")
  parts[0:3] = ["model.layers", parts[1], FLA_PARTS[parts[2]]]
  transposed = False
  if re.fullmatch("[wvag][012]", parts[3]):
    kind, number = parts[3]
    parts[3] = f"{kind}_lora.lora.{FLA_LORA[number]}"
    transposed = number != "0"
  elif parts[2] == "attn" and parts[3] in FLA_PROJECTIONS:
    parts[3] = FLA_PROJECTIONS[parts[3]]
  return ".".join(parts), transposed


def fla_state_dict(official):
  """The official tensors under fla's names and shapes: LoRA matrices
  transposed, [1, 1, C] vectors flattened except the token-shift mixes
  `attn.x_*`, which fla keeps [1, 1, C]."""
  out = {}
  for name, array in official.items():
    new, transposed = fla_name(name)
    if new is None:
      continue
    if transposed:
      array = array.T
    if array.ndim == 3 and array.shape[:2] == (1, 1) and ".attn.x_" not in new:
      array = array.reshape(-1)
    out[new] = np.ascontiguousarray(array, np.float32)
  return out


def fla_config(official):
  """fla's `RWKV7Config` (config.json) of an official state dict, its sizes
  read from the shapes as fla's converter reads them."""
  vocab, hidden = official["emb.weight"].shape
  ffn = official["blocks.0.ffn.key.weight"].shape[0]
  blocks = len({n.split(".")[1] for n in official if n.startswith("blocks.")})
  heads, head_dim = official["blocks.0.att.r_k"].shape
  v_lora = official.get("blocks.1.att.v1", official["blocks.0.att.v1"])
  return {"architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7",
          "attn_mode": "chunk", "hidden_size": int(hidden),
          "hidden_ratio": ffn / hidden, "intermediate_size": int(ffn),
          "num_hidden_layers": blocks, "head_dim": int(head_dim),
          "num_heads": int(heads),
          "decay_low_rank_dim": int(official["blocks.0.att.w1"].shape[1]),
          "gate_low_rank_dim": int(official["blocks.0.att.g1"].shape[1]),
          "a_low_rank_dim": int(official["blocks.0.att.a1"].shape[1]),
          "v_low_rank_dim": int(v_lora.shape[1]),
          "value_dim": [int(hidden)] * blocks, "hidden_act": "sqrelu",
          "norm_first": True, "norm_bias": True, "norm_eps": 1e-5,
          "vocab_size": int(vocab), "bos_token_id": 0, "eos_token_id": 0,
          "tie_word_embeddings": False, "torch_dtype": "float32"}


# ---------------------------------------------------------------- files


def write_safetensors(path, arrays):
  """{name: float32 array} as a safetensors file (an 8-byte little-endian
  header length, the JSON header, the tensors' bytes in order)."""
  header, offset = {}, 0
  for name, array in arrays.items():
    size = array.size * 4
    header[name] = {"dtype": "F32", "shape": list(array.shape),
                    "data_offsets": [offset, offset + size]}
    offset += size
  data = json.dumps(header, separators=(",", ":")).encode()
  data += b" " * (-len(data) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(data)) + data)
    for array in arrays.values():
      f.write(np.ascontiguousarray(array, "<f4").tobytes())


def write_hf_folder(folder, official, vocab_path):
  """fla's Hugging Face folder of an official state dict, with the world
  vocabulary llama.cpp's converter reads."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "config.json").write_text(json.dumps(fla_config(official),
                                                 indent=1))
  write_safetensors(folder / "model.safetensors", fla_state_dict(official))
  (folder / WORLD_VOCABULARY).write_bytes(pathlib.Path(vocab_path).read_bytes())


# --------------------------------------------------------------- llama.cpp


class CommandFailed(RuntimeError):
  """A llama.cpp or --convert_python command exited non-zero."""


def checked(argv, **kwargs):
  """subprocess.run with the output captured; CommandFailed (the command
  and its last lines of stderr) when it exits non-zero."""
  done = subprocess.run(argv, capture_output=True, check=False, **kwargs)
  if done.returncode:
    err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(
        "utf-8", "replace")
    tail = "\n    ".join(err.strip().splitlines()[-8:])
    raise CommandFailed(f"{os.path.basename(str(argv[0]))} "
                        f"{' '.join(map(str, argv[1:3]))} ... exited "
                        f"{done.returncode}:\n    {tail}")
  return done


class LlamaCpp:
  """A llama.cpp tree built apart (see the module docstring)."""

  def __init__(self, tree, convert_python):
    self.tree = pathlib.Path(tree)
    self.python = convert_python
    self.bin = self.tree / "build" / "bin"
    self.converter = self.tree / "convert_hf_to_gguf.py"
    missing = [str(p) for p in [self.converter] + [
        self.bin / b for b in BINARIES] if not p.is_file()]
    if missing:
      raise FileNotFoundError(
          f"--llama_cpp_dir={tree}: no {', '.join(missing)} (build llama.cpp "
          "there: cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON "
          "-DLLAMA_CURL=OFF -B build, then ninja -C build "
          f"{' '.join(BINARIES)})")

  def run(self, argv, **kwargs):
    """A llama.cpp binary's run, its output captured."""
    return checked([str(self.bin / argv[0])] + list(argv[1:]), **kwargs)

  def convert(self, hf_folder, outtype, out):
    checked([self.python, str(self.converter), str(hf_folder),
             f"--outtype={outtype}", f"--outfile={out}"])

  def quantize(self, source, kind, out):
    self.run(["llama-quantize", str(source), str(out), kind])

  def build_ggufs(self, hf_folder, kinds_wanted, folder):
    """{kind: GGUF path}: F32 (always: the check reads it) and F16 from
    the converter, the others `llama-quantize`d from the F32 file."""
    f32 = pathlib.Path(folder) / "model-F32.gguf"
    self.convert(hf_folder, "f32", f32)
    paths = {"F32": f32}
    for kind in kinds_wanted:
      path = pathlib.Path(folder) / f"model-{kind}.gguf"
      if kind == "F32":
        path = f32
      elif kind == "F16":
        self.convert(hf_folder, "f16", path)
      else:
        self.quantize(f32, kind, path)
      paths[kind] = path
    return paths

  def tensor_bytes(self, gguf_path):
    """{tensor name: bytes} of a GGUF (read by the tree's gguf-py)."""
    script = ("import json, sys; from gguf import GGUFReader; "
              "r = GGUFReader(sys.argv[1]); "
              "print(json.dumps({t.name: int(t.n_bytes) for t in r.tensors}))")
    env = dict(os.environ, PYTHONPATH=str(self.tree / "gguf-py"))
    out = checked([self.python, "-c", script, str(gguf_path)], text=True,
                  env=env)
    return json.loads(out.stdout)

  def bench(self, gguf_path, threads, prompt, generate, repetitions):
    """`llama-bench`'s tokens/s samples: {"pp": [...], "tg": [...]}."""
    out = self.run(["llama-bench", "-m", str(gguf_path), "-t", str(threads),
                    "-p", str(prompt), "-n", str(generate), "-r",
                    str(repetitions), "-o", "json"], text=True)
    samples = {}
    for test in json.loads(out.stdout):
      key = "pp" if test["n_gen"] == 0 else "tg"
      samples[key] = [float(s) for s in test["samples_ts"]]
    return samples


def bytes_a_token(tensor_bytes, vocab):
  """What decoding one token reads: every tensor but the input table, of
  which one row."""
  table = tensor_bytes["token_embd.weight"]
  return sum(tensor_bytes.values()) - table + table // vocab


# ---------------------------------------------------- the reference check


REFERENCE_SCRIPT = """
import os, sys
os.environ["RWKV_V7_ON"] = "1"
os.environ["RWKV_JIT_ON"] = "0"
import numpy as np, torch
torch.set_num_threads(2)
from rwkv.model import RWKV
from rwkv.rwkv_tokenizer import TRIE_TOKENIZER
pth, vocab, prompt, steps, out = sys.argv[1:]
model = RWKV(model=pth[:-len(".pth")], strategy="cpu fp32")
tokenizer = TRIE_TOKENIZER(vocab)
ids = tokenizer.encode(prompt)
with torch.no_grad():
  logits, state = model.forward(ids, None)
  rows, greedy = [logits.float().numpy().copy()], []
  for _ in range(int(steps)):
    greedy.append(int(np.argmax(rows[-1])))
    logits, state = model.forward([greedy[-1]], state)
    rows.append(logits.float().numpy().copy())
text = tokenizer.decodeBytes(greedy)
# Whether prompt + the greedy text tokenizes back to prompt + greedy ids.
try:
  again = tokenizer.encode(prompt + text.decode("utf-8"))
except UnicodeDecodeError:
  again = []
np.savez(out, prompt_ids=np.array(ids), greedy=np.array(greedy),
         logits=np.stack(rows), greedy_bytes=np.frombuffer(text, np.uint8),
         round_trips=np.array(again == ids + greedy))
"""


def official_reference(python, pth, vocab_path, prompt, steps):
  """The `rwkv` package's RWKV_x070 (fp32, CPU) on the `.pth`: the prompt's
  ids, `steps` greedy ids, the logits after the prompt and after each
  greedy id ([steps + 1, V]), the greedy ids' bytes."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "reference.npz")
    checked([python, "-c", REFERENCE_SCRIPT, str(pth), str(vocab_path),
             prompt, str(steps), out])
    with np.load(out) as data:
      return {k: data[k] for k in data.files}


def llama_greedy_bytes(llama, gguf_path, prompt, steps):
  """What `llama-simple` (greedy) prints after the prompt, as bytes."""
  out = llama.run(["llama-simple", "-m", str(gguf_path), "-n", str(steps),
                   prompt]).stdout
  head = prompt.encode()
  if not out.startswith(head):
    raise RuntimeError(f"llama-simple printed {out[:80]!r}, not the prompt "
                       "first")
  return out[len(head):].rstrip(b"\n")


def llama_last_logits(llama, gguf_path, prompt):
  """(the prompt's ids, the logits after it) as `llama-debug` saves them."""
  with tempfile.TemporaryDirectory() as tmp:
    llama.run(["llama-debug", "-m", str(gguf_path), "-p", prompt, "-t", "2",
               "--save-logits", "--logits-output-dir", tmp])
    files = os.listdir(tmp)
    pick = lambda end: os.path.join(tmp, next(
        f for f in files if f.endswith(end) and "-embeddings" not in f))
    ids = np.fromfile(pick("-tokens.bin"), np.int32)
    logits = np.fromfile(next(
        os.path.join(tmp, f) for f in files
        if f.endswith(".bin") and not f.endswith("-tokens.bin")), np.float32)
  return ids, logits


def check_conversion(llama, gguf_path, reference, prompt, say):
  """llama.cpp's F32 GGUF against the official reference: the greedy text
  (hence ids) and the logits after the prompt (and after prompt + greedy
  text where it tokenizes back to the same ids). Returns whether all
  agree; says each figure."""
  greedy = [int(i) for i in reference["greedy"]]
  steps = next((k for k, i in enumerate(greedy) if i in WORLD_END_IDS),
               len(greedy))
  want = reference["greedy_bytes"].tobytes()
  got = llama_greedy_bytes(llama, gguf_path, prompt, len(greedy))
  same_text = (got == want) if steps == len(greedy) else want.startswith(got)
  say(f"  llama.cpp F32 greedy text of {len(greedy)} tokens "
      f"{'equals' if same_text else 'differs from'} the official reference's"
      + ("" if steps == len(greedy) else
         f" (an end id at step {steps}: compared up to it)"))
  ok = same_text
  ids, logits = llama_last_logits(llama, gguf_path, prompt)
  same_ids = ids.tolist() == reference["prompt_ids"].tolist()
  diff = float(np.max(np.abs(logits - reference["logits"][0])))
  say(f"  llama.cpp F32 prompt ids {'equal' if same_ids else 'differ from'} "
      f"the reference tokenizer's; logits after the prompt: max |diff| "
      f"{diff:.1e} (of max |logit| {np.max(np.abs(logits)):.1f})")
  ok &= same_ids and diff < 1e-3
  if bool(reference["round_trips"]):
    text = prompt + want.decode("utf-8")
    ids, logits = llama_last_logits(llama, gguf_path, text)
    diff = float(np.max(np.abs(logits - reference["logits"][-1])))
    say(f"  logits after the prompt and the {len(greedy)} greedy tokens: max "
        f"|diff| {diff:.1e}")
    ok &= diff < 1e-3
  return ok


def check_rnnstep(model, reference, say):
  """rnnstep's logits (a model converted from the same `.pth`) against the
  official reference's, over the prompt and its greedy ids: each step's
  argmax is the next greedy id (so greedy generation gives the same ids)."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  prompt = reference["prompt_ids"].tolist()
  greedy = reference["greedy"].tolist()
  logits = np.asarray(rnnstep.logits(model, prompt + greedy))[0]
  ours = logits[len(prompt) - 1:]
  same = bool(np.all(np.argmax(ours[:-1], -1) == greedy))
  diff = float(np.max(np.abs(ours - reference["logits"])))
  say(f"  rnnstep float32 (the .pth converted): greedy ids "
      f"{'equal' if same else 'differ from'} the reference's; logits max "
      f"|diff| {diff:.1e}")
  return same and diff < 1e-3
