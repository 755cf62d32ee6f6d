"""Small token models (bytes, words, a byte-level BPE) written as model files.

One GRU shape (`CONFIG`, 256 tokens) for every kind, so the tests that load
several share their compiled programs.
"""

import numpy as np

from rnnstep.model import model_file
from rnnstep.model import vocabulary

CONFIG = model_file.ModelConfig(8, (model_file.LayerConfig("gru", 16),))
WORDS = (["<eos>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
         + [f"w{i}" for i in range(247)])
BPE_TEXT = ("the cat sat on the mat. the dog ran to the cat. naïve café, "
            "a cat and a dog.\n") * 4


def tensors(seed, scale=1.5):
  """Random weights of `CONFIG` over 256 tokens."""
  rng = np.random.default_rng(seed)
  return {k: (rng.normal(size=s) * scale).astype(np.float32)
          for k, s in CONFIG.expected_shapes(256).items()}


def write(path, tokens, seed) -> str:
  """Writes a model of `CONFIG` over `tokens`; returns its path."""
  model_file.write(path, CONFIG, list(tokens.vocab), tensors(seed), tokens)
  return str(path)


def write_bytes(path, seed=4) -> str:
  """A byte model (a UTF-8 character is 1-4 ids)."""
  return write(path, vocabulary.Tokens("bytes", vocabulary.bytes_vocab()),
               seed)


def write_words(path, seed=3) -> str:
  """A word model (no OOV token: unknown words are refused)."""
  return write(path, vocabulary.Tokens("words", WORDS, {"newline": "<eos>"}),
               seed)


def train_bpe(tokenizers):
  """A byte-level BPE (the `tokenizers` library) of 256 tokens: trained on a
  small text, padded with added tokens to the shared vocabulary size.

  Returns:
    (the tokenizer, how many tokens it trained).
  """
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  bpe.train_from_iterator([BPE_TEXT], tokenizers.trainers.BpeTrainer(
      vocab_size=200))
  trained = bpe.get_vocab_size()
  bpe.add_tokens([f"<x{i}>" for i in range(256 - trained)])
  return bpe, trained


def write_bpe(path, tokenizers, seed=2):
  """A subword model of `train_bpe`'s tokenizer (a character it never merged
  is its UTF-8 bytes' tokens: byte fallback).

  Returns:
    (the tokenizer, trained tokens, the model file's path).
  """
  bpe, trained = train_bpe(tokenizers)
  vocab = [bpe.id_to_token(i) for i in range(256)]
  tokens = vocabulary.Tokens("subword", vocab, {"tokenizer": bpe.to_str()})
  return bpe, trained, write(path, tokens, seed)
