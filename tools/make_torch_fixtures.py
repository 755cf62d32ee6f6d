"""Writes the PyTorch fixtures of tests/test_convert_torch.py (needs torch).

    pip install torch==2.13.0 safetensors
    python tools/make_torch_fixtures.py                 # into tests/data/torch/
    python tools/make_torch_fixtures.py --out=/tmp/x    # elsewhere

Builds small random char models (nothing is trained) -- nn.Embedding ->
nn.GRU / nn.LSTM / nn.RNN(tanh) -> nn.Linear under various module names --
saves their state dicts the ways people do (torch.save zip, the legacy
non-zip format, safetensors), plus files rnnstep must refuse (a bidirectional
GRU, an LSTM with proj_size), and stores torch's own logits for a fixed id
sequence and its greedy continuation of a prompt in `reference.npz`, with the
vocabulary as `vocab.json` and `corpus.txt`.

Whole pickled modules, as spro/char-rnn.pytorch saves them
(`torch.save(decoder, path)` of its `model.CharRNN`): a class shaped like the
recipe's (encoder = nn.Embedding, rnn = sequence-first nn.GRU / nn.LSTM with
n_layers, decoder = nn.Linear; over `string.printable`, `charrnn_vocab.json`)
is defined in a module named `model`, as the recipe's is, and saved whole in
the zip and the legacy format; a model nesting nn.Sequential is saved with
pickle protocol 1 (the copyreg reconstruction). Hostile module pickles hide a
call of os.system / builtins.eval in an attribute, in a submodule and in place
of a parameter: each would create the file `HOSTILE_MARKER` in the current
directory if anything ran it.
"""

import argparse
import json
import os
import string
import sys
import types

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
CHARRNN_CHARS = list(string.printable)  # The recipe's vocabulary: V = 100.
HOSTILE_MARKER = "rnnstep_hostile_pickle_ran"

# The recipe's module name: a whole-module pickle names `model.CharRNN`.
recipe_module = types.ModuleType("model")
sys.modules["model"] = recipe_module


class CharRNN(nn.Module):
  """Shaped like spro/char-rnn.pytorch's model.CharRNN (written afresh)."""

  def __init__(self, input_size, hidden_size, output_size, model="gru",
               n_layers=1):
    super().__init__()
    self.model = model.lower()
    self.input_size = input_size
    self.hidden_size = hidden_size
    self.output_size = output_size
    self.n_layers = n_layers
    self.encoder = nn.Embedding(input_size, hidden_size)
    cls = nn.GRU if self.model == "gru" else nn.LSTM
    self.rnn = cls(hidden_size, hidden_size, n_layers)  # Sequence first.
    self.decoder = nn.Linear(hidden_size, output_size)

  def forward(self, ids, hidden=None):
    """Logits for a 1-D id sequence (one batch row), and the state."""
    encoded = self.encoder(ids).view(len(ids), 1, -1)
    output, hidden = self.rnn(encoded, hidden)
    return self.decoder(output.view(len(ids), -1)), hidden


class NestedCharModel(nn.Module):
  """Embedding and Linear inside nn.Sequential containers (state_dict names
  `embed.0.weight`, `head.1.weight`)."""

  def __init__(self, vocab, dim, units):
    super().__init__()
    self.embed = nn.Sequential(nn.Embedding(vocab, dim), nn.Dropout(0.1))
    self.rnn = nn.GRU(dim, units)
    self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(units, vocab))

  def forward(self, ids, hidden=None):
    encoded = self.embed(ids).view(len(ids), 1, -1)
    output, hidden = self.rnn(encoded, hidden)
    return self.head(output.view(len(ids), -1)), hidden


for _cls in (CharRNN, NestedCharModel):
  _cls.__module__ = "model"
  setattr(recipe_module, _cls.__name__, _cls)


class RunsCode:
  """Pickles as a call of os.system that would create HOSTILE_MARKER."""

  def __reduce__(self):
    return (os.system, (f"touch {HOSTILE_MARKER}",))


class Evaluates:
  """Pickles as a call of builtins.eval that would create HOSTILE_MARKER."""

  def __reduce__(self):
    return (eval, (f"open({HOSTILE_MARKER!r}, 'w').close()",))


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


def sequence_reference(m, ids, prompt_ids):
  """torch's logits for `ids` and the greedy ids after `prompt_ids`, stepped
  as the recipe's generate() steps (the state carried, one id at a time)."""
  with torch.no_grad():
    logits, _ = m(torch.tensor(ids))
    out, hidden = m(torch.tensor(prompt_ids))
    last = out[-1]
    greedy = []
    for _ in range(GREEDY_STEPS):
      top2 = torch.topk(last, 2).values
      assert top2[0] - top2[1] > 1e-3, "near tie on the greedy path; reseed"
      greedy.append(int(torch.argmax(last)))
      out, hidden = m(torch.tensor(greedy[-1:]), hidden)
      last = out[-1]
  return logits.numpy().astype(np.float32), np.array(greedy, np.int32)


def build_whole_modules(out, refs, rng):
  """The whole-module fixtures (see the module docstring)."""
  vocab = len(CHARRNN_CHARS)
  ids = rng.integers(0, vocab, IDS_LENGTH // 2).tolist()
  prompt_ids = [CHARRNN_CHARS.index(c) for c in PROMPT]
  refs["charrnn_ids"] = np.array(ids, np.int32)

  def save(name, m, file_name, **kwargs):
    torch.save(m, os.path.join(out, file_name), **kwargs)
    if f"{name}_logits" not in refs:
      refs[f"{name}_logits"], refs[f"{name}_greedy"] = sequence_reference(
          m, ids, prompt_ids)

  gru = randomize(CharRNN(vocab, 12, vocab, "gru", n_layers=2)).eval()
  save("charrnn_gru", gru, "charrnn_gru.pt")
  save("charrnn_gru", gru, "charrnn_gru_legacy.pt",
       _use_new_zipfile_serialization=False)
  lstm = randomize(CharRNN(vocab, 10, vocab, "lstm")).eval()
  save("charrnn_lstm", lstm, "charrnn_lstm.pt")
  nested = randomize(NestedCharModel(vocab, 8, 12)).eval()
  save("nested", nested, "nested_protocol1.pt", pickle_protocol=1)
  with open(os.path.join(out, "charrnn_vocab.json"), "w",
            encoding="utf-8") as f:
    json.dump(CHARRNN_CHARS, f)

  def hostile(file_name, poison, **kwargs):
    m = CharRNN(vocab, 4, vocab)
    poison(m)
    torch.save(m, os.path.join(out, file_name), **kwargs)

  hostile("hostile_attribute.pt",
          lambda m: setattr(m, "settings", {"seed": RunsCode()}))
  hostile("hostile_submodule.pt",
          lambda m: setattr(m.rnn, "flatten_hook", Evaluates()))
  hostile("hostile_parameter.pt",
          lambda m: m.decoder._parameters.__setitem__("bias", RunsCode()))  # pylint: disable=protected-access
  hostile("hostile_parameter_legacy.pt",
          lambda m: m.decoder._parameters.__setitem__("bias", Evaluates()),  # pylint: disable=protected-access
          _use_new_zipfile_serialization=False)


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

  build_whole_modules(out, refs, rng)
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
