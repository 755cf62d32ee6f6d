"""Writes the RWKV-7 state-file fixtures of tests/test_state_file.py with the official code.

Needs torch, safetensors and the `rwkv` package (BlinkDL's ChatRWKV pip
package, whose `RWKV_x070` is the official RNN-mode inference code):

    python3 -m venv --system-site-packages /tmp/venv-torch
    /tmp/venv-torch/bin/pip install torch safetensors
    /tmp/venv-torch/bin/python tools/make_rwkv7_state_fixtures.py
                                           # into tests/data/rwkv7/state/

What it writes, for the test model tests/data/rwkv7/rwkv7.pth (3 blocks,
2 heads of 16):

  - `state.pth`: `torch.save` of {`blocks.{i}.att.time_state`: seeded random
    float32 `[heads, head_size, head_size]`}, the file RWKV's state tuning
    writes and RWKV-Runner loads;
  - `state.safetensors`: the same dict by `safetensors.torch.save_file`;
  - `state.st`: what web-rwkv's `assets/scripts/convert_safetensors.py`
    makes of `state.pth` (each tensor `.half()`, `time_state` transposed in
    its last two axes, saved with metadata {"format": "pt"});
  - `reference.npz`: `RWKV_x070` (strategy "cpu fp32") started from the
    state as RWKV-Runner's `load_rwkv_state` builds it for RWKV-7 (token
    shifts zero, each `time_state` as it is): its greedy ids after the
    prompt of tests/data/rwkv7/reference.npz (`greedy`), and its logits over
    the prompt and those ids (`logits`: row t is after id t); the same from
    the float16-rounded state (`greedy_f16`, `logits_f16`), which is what an
    `.st` file holds; and the states (`wkv`).
"""

import os
import sys

os.environ["RWKV_V7_ON"] = "1"
os.environ.setdefault("RWKV_JIT_ON", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import torch  # pylint: disable=g-import-not-at-top
from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
from rwkv.model import RWKV_x070  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_dir  # pylint: disable=g-import-not-at-top

DATA = os.path.join(fixture_dir.DATA, "rwkv7")
STEPS = 16
# The states' scale: large enough that the greedy text differs from the
# zero state's (trained states' entries are of order 1).
SCALE = 1.0


def official_state(model, wkv):
  """RWKV-Runner's `load_rwkv_state` for RWKV-7: per block, a zero token
  shift, the file's time_state as it is (float32), a zero token shift."""
  state = []
  for block in wkv:
    state += [torch.zeros(model.n_embd), torch.tensor(block).float(),
              torch.zeros(model.n_embd)]
  return state


def run(model, prompt, wkv):
  """Greedy ids from the state after the prompt, and the logits over the
  prompt and those ids (teacher-forced, from the same state)."""
  out, state = model.forward(list(prompt), official_state(model, wkv))
  greedy = []
  for _ in range(STEPS):
    greedy.append(int(torch.argmax(out)))
    out, state = model.forward([greedy[-1]], state)
  ids = list(prompt) + greedy
  logits, _ = model.forward(ids, official_state(model, wkv), full_output=True)
  return np.array(greedy, np.int32), logits.numpy().astype(np.float32)


def main():
  out = fixture_dir.output_dir(__doc__, os.path.join("rwkv7", "state"))
  model = RWKV_x070(os.path.join(DATA, "rwkv7"), "cpu fp32")
  prompt = np.load(os.path.join(DATA, "reference.npz"))["prompt_ids"]
  rng = np.random.default_rng(61)
  heads, size = model.n_head, model.head_size
  wkv = rng.normal(0, SCALE, (model.n_layer, heads, size, size)).astype(
      np.float32)
  tensors = {f"blocks.{i}.att.time_state": torch.tensor(block)
             for i, block in enumerate(wkv)}
  torch.save(tensors, os.path.join(out, "state.pth"))
  save_file(tensors, os.path.join(out, "state.safetensors"))
  # web-rwkv's convert_safetensors.py, step for step, on the .pth.
  loaded = torch.load(os.path.join(out, "state.pth"), map_location="cpu")
  converted = {}
  for name in list(loaded):
    value = loaded[name].half()
    if "time_state" in name:
      value = value.transpose(value.dim() - 2, value.dim() - 1)
    converted[name.lower()] = value.contiguous()
  # (The script's `serialize_file` of raw bytes; the safetensors of today
  # takes tensors there, to the same file.)
  save_file(converted, os.path.join(out, "state.st"),
            metadata={"format": "pt"})
  greedy, logits = run(model, prompt, wkv)
  rounded = wkv.astype(np.float16).astype(np.float32)
  greedy_f16, logits_f16 = run(model, prompt, rounded)
  zero_greedy, _ = run(model, prompt, np.zeros_like(wkv))
  assert (greedy != zero_greedy).any(), "the state changes nothing"
  np.savez(os.path.join(out, "reference.npz"), wkv=wkv, prompt_ids=prompt,
           greedy=greedy, logits=logits, greedy_f16=greedy_f16,
           logits_f16=logits_f16)
  print(f"wrote {out}: greedy {greedy.tolist()} (zero state: "
        f"{zero_greedy.tolist()})")


if __name__ == "__main__":
  main()
