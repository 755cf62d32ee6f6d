"""Writes the byte-level and BPE PyTorch fixtures of tests/test_tokens.py
(needs torch and tokenizers).

    pip install torch==2.13.0 tokenizers
    python tools/make_token_torch_fixtures.py               # into tests/data/token_torch/
    python tools/make_token_torch_fixtures.py --out=/tmp/x  # elsewhere

Two small models, trained a few hundred steps on `TEXT` (English with
accented letters, CJK and an emoji, so that characters span bytes and
tokens), saved as state dicts (`torch.save(model.state_dict())`):

  - `bytes_gru.pt`: nn.Embedding(256) -> nn.GRU -> nn.Linear(256) over the
    text's UTF-8 bytes; `bytes.json` is its vocabulary file,
    `{"kind": "bytes"}`;
  - `bpe_lstm.pt`: nn.Embedding(V) -> 2-layer nn.LSTM -> nn.Linear(V) over a
    Hugging Face `tokenizers` byte-level BPE trained on the text
    (`tokenizer.json`, saved by the library).

`reference.npz` holds each model's log-probabilities over its encoded text
and its greedy continuation of `PROMPT` (argmax each step), as ids and as
the text its tokenizer decodes (bytes: `bytes(...).decode("utf-8",
"replace")`; BPE: `tokenizer.decode(prompt ids + new ids)`).
"""

import json
import os

import numpy as np
import torch
from torch import nn
import tokenizers

import fixture_dir  # tools/: the --out flag the fixture scripts share

TEXT = ("the café served crème brûlée to the naïve poet. 東京 is far; "
        "the poet said 😀 and left the café.\n") * 3
PROMPT = "the poet said"
STEPS = 40


class Net(nn.Module):
  """Embedding -> GRU/LSTM -> Linear, batch first."""

  def __init__(self, vocab, kind, layers):
    super().__init__()
    self.embed = nn.Embedding(vocab, 16)
    self.rnn = getattr(nn, kind)(16, 32, layers, batch_first=True)
    self.fc = nn.Linear(32, vocab)

  def forward(self, ids, state=None):
    out, state = self.rnn(self.embed(ids), state)
    return self.fc(out), state


def train(net, ids, steps=300):
  torch.manual_seed(0)
  optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
  ids = torch.tensor(ids)
  for step in range(steps):
    i = (step * 13) % (len(ids) - 33)
    logits, _ = net(ids[None, i:i + 32])
    loss = nn.functional.cross_entropy(logits[0], ids[i + 1:i + 33])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def greedy(net, prompt_ids, steps):
  with torch.no_grad():
    logits, state = net(torch.tensor([prompt_ids]))
    out = []
    for _ in range(steps):
      token = int(logits[0, -1].argmax())
      out.append(token)
      logits, state = net(torch.tensor([[token]]), state)
  return out


def main():
  out = fixture_dir.output_dir(__doc__, "token_torch")
  reference = {}

  torch.manual_seed(1)
  byte_ids = list(TEXT.encode("utf-8"))
  net = Net(256, "GRU", 1)
  train(net, byte_ids)
  net.eval()
  torch.save(net.state_dict(), os.path.join(out, "bytes_gru.pt"))
  with open(os.path.join(out, "bytes.json"), "w") as f:
    json.dump({"kind": "bytes"}, f)
  with torch.no_grad():
    reference["bytes_ids"] = np.array(byte_ids[:64], np.int32)
    reference["bytes_logp"] = torch.log_softmax(
        net(torch.tensor([byte_ids[:64]]))[0][0], -1).numpy()
  new = greedy(net, list(PROMPT.encode("utf-8")), STEPS)
  reference["bytes_greedy"] = np.array(new, np.int32)
  reference["bytes_text"] = np.array(bytes(new).decode("utf-8", "replace"))

  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  bpe.train_from_iterator([TEXT], tokenizers.trainers.BpeTrainer(
      vocab_size=300,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  bpe.save(os.path.join(out, "tokenizer.json"))
  ids = bpe.encode(TEXT).ids
  net = Net(bpe.get_vocab_size(), "LSTM", 2)
  train(net, ids)
  net.eval()
  torch.save(net.state_dict(), os.path.join(out, "bpe_lstm.pt"))
  with torch.no_grad():
    reference["bpe_ids"] = np.array(ids[:48], np.int32)
    reference["bpe_logp"] = torch.log_softmax(
        net(torch.tensor([ids[:48]]))[0][0], -1).numpy()
  prompt_ids = bpe.encode(PROMPT).ids
  new = greedy(net, prompt_ids, STEPS)
  reference["bpe_greedy"] = np.array(new, np.int32)
  reference["bpe_text"] = np.array(bpe.decode(prompt_ids + new))
  np.savez(os.path.join(out, "reference.npz"), **reference)
  print(f"wrote bytes_gru.pt, bpe_lstm.pt and reference.npz to {out}")
  print(repr(str(reference["bytes_text"])), repr(str(reference["bpe_text"])))


if __name__ == "__main__":
  main()
