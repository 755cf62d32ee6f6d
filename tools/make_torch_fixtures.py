"""Writes the PyTorch fixtures of tests/test_convert_torch.py (needs torch).

    pip install torch==2.13.0 safetensors
    python tools/make_torch_fixtures.py                 # into tests/data/torch/
    python tools/make_torch_fixtures.py --out=/tmp/x    # elsewhere

Builds small random char models (nothing is trained) -- nn.Embedding ->
nn.GRU / nn.LSTM / nn.RNN(tanh) -> nn.Linear under various module names --
saves their state dicts the ways people do (torch.save zip, the legacy
non-zip format, safetensors), plus files rnnstep must refuse (a whole pickled
module, a bidirectional GRU, an LSTM with proj_size), and stores torch's own
logits for a fixed id sequence and its greedy continuation of a prompt in
`reference.npz`, with the vocabulary as `vocab.json` and `corpus.txt`.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from torch import nn
import safetensors.torch

CHARS = list("\n !',.:;?abehilmnorst")  # 21 characters: V = 21.
PROMPT = "to be, or not"
CORPUS = "to be, or not to be: that is it!\nis this the mail? no; ablest hints.'\n"
assert sorted(set(CORPUS)) == CHARS
GREEDY_STEPS = 40
IDS_LENGTH = 32


class CharModel(nn.Module):
  """Embedding -> recurrent module(s) -> Linear, under chosen names."""

  def __init__(self, names, embedding, recurrent, linear):
    super().__init__()
    self.names = names
    setattr(self, names[0], embedding)
    for name, module in zip(names[1:-1], recurrent):
      setattr(self, name, module)
    setattr(self, names[-1], linear)

  def forward(self, ids, state=None):
    x = getattr(self, self.names[0])(ids)
    states = []
    for i, name in enumerate(self.names[1:-1]):
      x, s = getattr(self, name)(x, None if state is None else state[i])
      states.append(s)
    return getattr(self, self.names[-1])(x), states


def model(names, kind, dim, units, layers=1, bias=True, linear_bias=True,
          stack=None):
  """A CharModel; `stack` gives several recurrent modules [(kind, units)]."""
  vocab = len(CHARS)
  modules = []
  width = dim
  for k, u in (stack or [(kind, units)]):
    cls = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}[k]
    modules.append(cls(width, u, num_layers=layers, bias=bias,
                       batch_first=True))
    width = u
  return CharModel(names, nn.Embedding(vocab, dim), modules,
                   nn.Linear(width, vocab, bias=linear_bias)).eval()


def randomize(m, scale=1.0):
  """Larger than default weights, so that states and logits vary a lot."""
  with torch.no_grad():
    for p in m.parameters():
      p.uniform_(-scale, scale)
  return m


def reference(m, ids, prompt_ids):
  """torch's logits for `ids` and its greedy ids after `prompt_ids`."""
  with torch.no_grad():
    logits, _ = m(torch.tensor([ids]))
    out, state = m(torch.tensor([prompt_ids]))
    greedy = []
    last = out[0, -1]
    for _ in range(GREEDY_STEPS):
      top2 = torch.topk(last, 2).values
      # A near tie could go either way in another framework: the test
      # would compare rounding, not the mapping.
      assert top2[0] - top2[1] > 1e-3, "near tie on the greedy path; reseed"
      nxt = int(torch.argmax(last))
      greedy.append(nxt)
      out, state = m(torch.tensor([[nxt]]), state)
      last = out[0, -1]
  return logits[0].numpy().astype(np.float32), np.array(greedy, np.int32)


def build(out):
  os.makedirs(out, exist_ok=True)
  torch.manual_seed(1234)
  rng = np.random.default_rng(5)
  ids = rng.integers(0, len(CHARS), IDS_LENGTH).tolist()
  prompt_ids = [CHARS.index(c) for c in PROMPT]
  refs = {"ids": np.array(ids, np.int32), "prompt": np.array(PROMPT)}

  def save_ref(name, m):
    refs[f"{name}_logits"], refs[f"{name}_greedy"] = reference(m, ids,
                                                               prompt_ids)

  # GRU, 2 layers; tutorial-like names; torch.save zip.
  gru2 = randomize(model(["embed", "gru", "fc"], "gru", 12, 16, layers=2))
  torch.save(gru2.state_dict(), os.path.join(out, "gru2.pt"))
  save_ref("gru2", gru2)
  # The same weights in safetensors, and in the legacy (non-zip) format.
  safetensors.torch.save_file(gru2.state_dict(),
                              os.path.join(out, "gru2.safetensors"))
  torch.save(gru2.state_dict(), os.path.join(out, "gru2_legacy.pt"),
             _use_new_zipfile_serialization=False)
  # LSTM; word_language_model names (encoder / rnn / decoder), .pth.
  lstm = randomize(model(["encoder", "rnn", "decoder"], "lstm", 10, 20))
  torch.save(lstm.state_dict(), os.path.join(out, "lstm.pth"))
  save_ref("lstm", lstm)
  # nn.RNN (tanh), 2 layers, no biases anywhere, odd names; safetensors.
  rnn = randomize(model(["chars", "recurrence", "to_logits"], "rnn", 8, 16,
                        layers=2, bias=False, linear_bias=False), scale=0.7)
  safetensors.torch.save_file(rnn.state_dict(),
                              os.path.join(out, "rnn_nobias.safetensors"))
  save_ref("rnn_nobias", rnn)
  # GRU without bias, saved from nn.DataParallel-style `module.` keys, as a
  # training checkpoint dict; .bin.
  gru_nobias = randomize(model(["embedding", "gru", "linear"], "gru", 16, 16,
                               bias=False))
  state = {f"module.{k}": v for k, v in gru_nobias.state_dict().items()}
  torch.save({"epoch": 3, "state_dict": state},
             os.path.join(out, "gru_nobias_checkpoint.bin"))
  save_ref("gru_nobias", gru_nobias)
  # LSTM -> GRU as two modules; bfloat16 weights; `model.` prefix.
  stack = randomize(model(["emb", "lstm", "gru", "head"], None, 8, None,
                          stack=[("lstm", 24), ("gru", 16)]), scale=1.5)
  stack = stack.to(torch.bfloat16).float()  # The values bfloat16 holds.
  state = {f"model.{k}": v.to(torch.bfloat16)
           for k, v in stack.state_dict().items()}
  torch.save(state, os.path.join(out, "stack_bf16.pt"))
  save_ref("stack_bf16", stack)
  # Tied embedding/decoder and non-contiguous views of one shared storage,
  # float16 and float64.
  tied = randomize(model(["encoder", "rnn", "decoder"], "gru", 16, 16))
  tied.decoder.weight = tied.encoder.weight  # Weight tying.
  tied = tied.half().float()
  state = dict(tied.state_dict())
  # One float16 storage holds weight_hh (transposed: a strided view at an
  # offset) and bias_ih (a row further on); bias_hh is float64.
  big = torch.zeros(120, 64, dtype=torch.float16)
  big[:16, 3:51] = state["rnn.weight_hh_l0"].half().t()
  big[100, 5:53] = state["rnn.bias_ih_l0"].half()
  state["rnn.weight_hh_l0"] = big[:16, 3:51].t()
  state["rnn.bias_ih_l0"] = big[100, 5:53]
  state["rnn.bias_hh_l0"] = state["rnn.bias_hh_l0"].double()
  assert not state["rnn.weight_hh_l0"].is_contiguous()
  assert state["encoder.weight"].data_ptr() == state["decoder.weight"].data_ptr()
  torch.save(state, os.path.join(out, "tied_views.pt"))
  save_ref("tied_views", tied)

  # Files to refuse.
  torch.save(gru2, os.path.join(out, "whole_module.pt"))
  bidi = nn.GRU(12, 8, bidirectional=True, batch_first=True)
  torch.save({"embed.weight": gru2.embed.weight.detach(),
              **{f"gru.{k}": v for k, v in bidi.state_dict().items()},
              "fc.weight": torch.zeros(len(CHARS), 16)},
             os.path.join(out, "bidirectional.pt"))
  proj = nn.LSTM(12, 16, proj_size=8, batch_first=True)
  torch.save({"embed.weight": gru2.embed.weight.detach(),
              **{f"lstm.{k}": v for k, v in proj.state_dict().items()},
              "fc.weight": torch.zeros(len(CHARS), 8)},
             os.path.join(out, "lstm_proj.pt"))

  np.savez(os.path.join(out, "reference.npz"), **refs)
  with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(CHARS, f, ensure_ascii=False)
  with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8",
            newline="") as f:
    f.write(CORPUS)
  return refs


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  here = os.path.dirname(os.path.abspath(__file__))
  parser.add_argument("--out", default=os.path.join(here, "..", "tests",
                                                    "data", "torch"))
  args = parser.parse_args(argv)
  build(args.out)
  total = sum(os.path.getsize(os.path.join(args.out, f))
              for f in os.listdir(args.out))
  print(f"wrote {len(os.listdir(args.out))} files, {total} bytes, to "
        f"{os.path.normpath(args.out)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
