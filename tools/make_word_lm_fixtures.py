"""Writes the word_language_model fixtures of tests/test_tokens.py (needs torch).

    pip install torch==2.13.0
    python tools/make_word_lm_fixtures.py               # into tests/data/word_lm/
    python tools/make_word_lm_fixtures.py --out=/tmp/x  # elsewhere

pytorch/examples' word_language_model, with its own code: `RNNModel` and
`data.Dictionary` / `data.Corpus` below are the recipe's `model.py` and
`data.py` (the RNN classes only; its Transformer is left out), defined in
modules named `model` and `data` so that `torch.save(model)` pickles
`model.RNNModel` as the recipe's `main.py --save` does. A tiny corpus folder
(`corpus/train.txt`, `valid.txt`, `test.txt`) is read by `data.Corpus`; one
model per `--model` kind (LSTM, GRU, RNN_TANH, RNN_RELU; LSTM also `--tied`)
is trained a few steps the way `main.py` trains (truncated BPTT, gradient
clipping, plain SGD) so that its greedy text is not one word repeated, and is
saved whole (`<kind>.pt`, `lstm_tied.pt`). `reference.npz` holds, per model,
the recipe model's log-probabilities over a fixed id sequence (its
`forward` returns `log_softmax`) and the greedy words of `generate.py`'s loop
(argmax in place of `torch.multinomial`: its limit at temperature 0) from a
prompt; `vocab.json` is `corpus.dictionary.idx2word`.
"""

import json
import os
import sys
import types

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

import fixture_dir  # tools/: the --out flag the fixture scripts share

CORPUS = {
    "train.txt": (" the cat sat on the mat \n the dog sat on the log \n"
                  " a cat and a dog ran to the mat \n"),
    "valid.txt": " the dog ran on the log \n",
    "test.txt": " a bird sat on the cat \n",
}
PROMPT = ["the", "cat"]
GREEDY_WORDS = 30
IDS_LENGTH = 24
KINDS = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")

# --------------------------------------------------------------- data.py
data = types.ModuleType("data")
sys.modules["data"] = data


class Dictionary(object):
  def __init__(self):
    self.word2idx = {}
    self.idx2word = []

  def add_word(self, word):
    if word not in self.word2idx:
      self.idx2word.append(word)
      self.word2idx[word] = len(self.idx2word) - 1
    return self.word2idx[word]

  def __len__(self):
    return len(self.idx2word)


class Corpus(object):
  def __init__(self, path):
    self.dictionary = Dictionary()
    self.train = self.tokenize(os.path.join(path, "train.txt"))
    self.valid = self.tokenize(os.path.join(path, "valid.txt"))
    self.test = self.tokenize(os.path.join(path, "test.txt"))

  def tokenize(self, path):
    """Tokenizes a text file."""
    assert os.path.exists(path)
    # Add words to the dictionary
    with open(path, "r", encoding="utf8") as f:
      for line in f:
        words = line.split() + ["<eos>"]
        for word in words:
          self.dictionary.add_word(word)

    # Tokenize file content
    with open(path, "r", encoding="utf8") as f:
      idss = []
      for line in f:
        words = line.split() + ["<eos>"]
        ids = []
        for word in words:
          ids.append(self.dictionary.word2idx[word])
        idss.append(torch.tensor(ids).type(torch.int64))
      ids = torch.cat(idss)
    return ids


for _cls in (Dictionary, Corpus):
  _cls.__module__ = "data"
  setattr(data, _cls.__name__, _cls)

# -------------------------------------------------------------- model.py
model = types.ModuleType("model")
sys.modules["model"] = model


class RNNModel(nn.Module):
  """Container module with an encoder, a recurrent module, and a decoder."""

  def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5,
               tie_weights=False):
    super(RNNModel, self).__init__()
    self.ntoken = ntoken
    self.drop = nn.Dropout(dropout)
    self.encoder = nn.Embedding(ntoken, ninp)
    if rnn_type in ["LSTM", "GRU"]:
      self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
    else:
      try:
        nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}[rnn_type]
      except KeyError as e:
        raise ValueError("""An invalid option for `--model` was supplied,
                         options are ['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']""") from e
      self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity,
                        dropout=dropout)
    self.decoder = nn.Linear(nhid, ntoken)

    # Optionally tie weights as in:
    # "Using the Output Embedding to Improve Language Models" (Press & Wolf 2016)
    if tie_weights:
      if nhid != ninp:
        raise ValueError("When using the tied flag, nhid must be equal to emsize")
      self.decoder.weight = self.encoder.weight

    self.init_weights()

    self.rnn_type = rnn_type
    self.nhid = nhid
    self.nlayers = nlayers

  def init_weights(self):
    initrange = 0.1
    nn.init.uniform_(self.encoder.weight, -initrange, initrange)
    nn.init.zeros_(self.decoder.bias)
    nn.init.uniform_(self.decoder.weight, -initrange, initrange)

  def forward(self, input, hidden):
    emb = self.drop(self.encoder(input))
    output, hidden = self.rnn(emb, hidden)
    output = self.drop(output)
    decoded = self.decoder(output)
    decoded = decoded.view(-1, self.ntoken)
    return F.log_softmax(decoded, dim=1), hidden

  def init_hidden(self, bsz):
    weight = next(self.parameters())
    if self.rnn_type == "LSTM":
      return (weight.new_zeros(self.nlayers, bsz, self.nhid),
              weight.new_zeros(self.nlayers, bsz, self.nhid))
    else:
      return weight.new_zeros(self.nlayers, bsz, self.nhid)


RNNModel.__module__ = "model"
model.RNNModel = RNNModel


# ------------------------------------------------- main.py, generate.py
def repackage_hidden(h):
  """main.py's: wraps hidden states in new Tensors, detached from history."""
  if isinstance(h, torch.Tensor):
    return h.detach()
  return tuple(repackage_hidden(v) for v in h)


def train(net, ids, steps, bptt=8, lr=5.0, clip=0.25):
  """A few steps of main.py's loop (batch 1, no shuffling)."""
  net.train()
  hidden = net.init_hidden(1)
  for step in range(steps):
    i = (step * bptt) % (len(ids) - bptt - 1)
    source = ids[i:i + bptt].view(-1, 1)
    target = ids[i + 1:i + 1 + bptt].view(-1)
    hidden = repackage_hidden(hidden)
    net.zero_grad()
    output, hidden = net(source, hidden)
    loss = nn.NLLLoss()(output, target)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
    for p in net.parameters():
      p.data.add_(p.grad, alpha=-lr)
  net.eval()


def greedy(net, dictionary, prompt, words):
  """generate.py's loop from a prompt, argmax for torch.multinomial."""
  hidden = net.init_hidden(1)
  out = []
  with torch.no_grad():
    for word in prompt[:-1]:
      _, hidden = net(torch.tensor([[dictionary.word2idx[word]]]), hidden)
    input = torch.tensor([[dictionary.word2idx[prompt[-1]]]])
    for _ in range(words):
      output, hidden = net(input, hidden)
      word_weights = output.squeeze().div(1.0).exp().cpu()
      word_idx = int(torch.argmax(word_weights))
      input.fill_(word_idx)
      out.append(dictionary.idx2word[word_idx])
  return out


def main():
  out = fixture_dir.output_dir(__doc__, "word_lm")
  os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
  for name, text in CORPUS.items():
    with open(os.path.join(out, "corpus", name), "w") as f:
      f.write(text)
  corpus = Corpus(os.path.join(out, "corpus"))
  ntokens = len(corpus.dictionary)
  with open(os.path.join(out, "vocab.json"), "w") as f:
    json.dump(corpus.dictionary.idx2word, f)
  torch.manual_seed(1111)
  ids = torch.arange(IDS_LENGTH) * 7 % ntokens
  reference = {"ids": ids.numpy().astype(np.int32)}
  for kind, tied in [(k, False) for k in KINDS] + [("LSTM", True)]:
    name = kind.lower() + ("_tied" if tied else "")
    net = RNNModel(kind, ntokens, 16, 16, 2, dropout=0.2, tie_weights=tied)
    train(net, corpus.train, 300)
    with open(os.path.join(out, name + ".pt"), "wb") as f:
      torch.save(net, f)
    with torch.no_grad():
      logp, _ = net(ids.view(-1, 1), net.init_hidden(1))
    reference[name + "_logp"] = logp.numpy()
    reference[name + "_greedy"] = np.array(
        " ".join(greedy(net, corpus.dictionary, PROMPT, GREEDY_WORDS)))
  np.savez(os.path.join(out, "reference.npz"), **reference)
  print(f"wrote {len(KINDS) + 1} models and reference.npz to {out}")


if __name__ == "__main__":
  main()
