"""Trains a small RWKV-7 on tinyshakespeare and saves it as an official `.pth`.

Issue #62 asks for the weights dtypes' quality loss on a *trained* RWKV-7;
with no trained checkpoint to download, this trains one here, on CPU:

    python tools/train_rwkv7_small.py --data=../shared/data/tinyshakespeare.txt \
        --output=/tmp/rwkv7-small.pth
    rnnstep-convert --input=/tmp/rwkv7-small.pth \
        --vocab=<rwkv package>/rwkv_vocab_v20230424.txt --output=/tmp/r.npz
    python tools/bench/quantization_loss.py --model=/tmp/r.npz \
        --text=tests/data/tinyshakespeare_heldout_excerpt.txt

(about 18 minutes on one core of an AMD EPYC Zen 4, to a held-out loss of
4.22 nats a token against the unigram model's 6.80:
benchmarks/results/rwkv7-trained-loss-epyc-zen4-2026-12.md.)

(torch and the `rwkv` pip package: the world tokenizer and, with --check,
the official `RWKV_x070` to compare the saved file's logits with.)

The model: RWKV-7 ("x070") in BlinkDL's RWKV-LM state-dict layout
(`emb.weight`, `blocks.N.ln0/ln1/ln2`, `blocks.N.att.{x_r..x_g, w0..w2,
a0..a2, v0..v2, g1, g2, k_k, k_a, r_k, receptance/key/value/output, ln_x}`,
`blocks.N.ffn.{x_k, key, value}`, `ln_out`, `head.weight`). Its training
forward is the `rwkv` package's RWKV_x070 `TMix_seq`/`CMix_seq` (CPU path)
over a batch, the state recurrence a per-timestep torch loop so autograd
flows through it; the initial values follow RWKV-LM's x070 `train.py`.

The vocabulary is the world one (65,536 ids), so the saved file converts
and loads like an official checkpoint; only the ids the corpus uses are
trained. Every id the training split does not use shares one head row
(trained: the loss counts all of them in its normalizer) and one
embedding row, so the softmax trained over the used ids plus that shared
row *is* the softmax over all 65,536 ids of the saved file: the held-out
loss printed is the saved model's exact loss. (A full 65,536-row head
would cost six times the compute per step, on CPU.)

Data: the text's last --heldout fraction is held out (every piece of the
excerpt tests/data/tinyshakespeare_heldout_excerpt.txt is in it), the
rest is cut into random windows of --seq_len tokens, each from a zero
state (as tools/bench/quantization_loss.py scores). Seeded: the same flags
give the same weights on the same torch build and thread count.
"""

import math
import os
import time

from absl import app
from absl import flags
import numpy as np
import torch
import torch.nn.functional as F

_DATA = flags.DEFINE_string("data", "../shared/data/tinyshakespeare.txt",
                            "training text (UTF-8)")
_OUTPUT = flags.DEFINE_string("output", "/tmp/rwkv7-small.pth",
                              "where the trained state dict goes (.pth)")
_LAYERS = flags.DEFINE_integer("layers", 4, "blocks")
_WIDTH = flags.DEFINE_integer("width", 128, "embedding width")
_HEAD_SIZE = flags.DEFINE_integer("head_size", 64, "head size")
_LORA = flags.DEFINE_integer("lora", 32, "rank of w/a/v/g's low-rank maps")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 64, "tokens per training window")
_BATCH = flags.DEFINE_integer("batch", 16, "windows per step")
_STEPS = flags.DEFINE_integer("steps", 1000, "Adam steps")
_LR = flags.DEFINE_float("lr", 2e-3, "peak learning rate")
_LR_FINAL = flags.DEFINE_float("lr_final", 1e-4, "learning rate at the end")
_WARMUP = flags.DEFINE_integer("warmup", 50, "steps of linear warm-up")
_HELDOUT = flags.DEFINE_float("heldout", 0.1, "fraction held out (the end)")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 100, "steps between evals")
_EVAL_WINDOWS = flags.DEFINE_integer("eval_windows", 32,
                                     "held-out windows per evaluation")
_MINUTES = flags.DEFINE_float("minutes", 0.0,
                              "stop (and save) after this long; 0: never")
_SEED = flags.DEFINE_integer("seed", 0, "random seed")
_THREADS = flags.DEFINE_integer(
    "threads", 1, "torch CPU threads (one is the fastest for these small ops)")
_CHECK = flags.DEFINE_bool("check", True,
                           "compare the saved file's logits with the rwkv "
                           "package's RWKV_x070")

VOCAB_SIZE = 65536


def _vocab_file():
  import rwkv  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(rwkv.__file__),
                      "rwkv_vocab_v20230424.txt")


def _tokenize(text):
  from rwkv.rwkv_tokenizer import TRIE_TOKENIZER  # pylint: disable=g-import-not-at-top
  return np.array(TRIE_TOKENIZER(_vocab_file()).encode(text), np.int64)


def _orthogonal(shape, gain, gen):
  w = torch.empty(shape)
  torch.nn.init.orthogonal_(w, gain=gain, generator=gen)
  return w


def init_state_dict(layers, c, head_size, lora, ffn, used, gen):
  """Initial weights in RWKV-LM's layout: x070 train.py's scheme.

  The embedding and head are compact: a row per used id, plus one shared
  by every other id (the embedding's last row, `head.other`); `save`
  spreads them over the 65,536 ids.
  """
  h = c // head_size
  z = {}
  u = lambda *s, a: (torch.rand(*s, generator=gen) * 2 - 1) * a
  z["emb.weight"] = u(len(used) + 1, c, a=1e-4)  # the last: every other id
  ddd = torch.arange(c, dtype=torch.float32) / c
  for i in range(layers):
    p = f"blocks.{i}."
    r01 = i / (layers - 1)
    r1a0 = 1.0 - i / layers
    if i == 0:
      z[p + "ln0.weight"], z[p + "ln0.bias"] = torch.ones(c), torch.zeros(c)
    for n in ("ln1", "ln2"):
      z[p + n + ".weight"], z[p + n + ".bias"] = torch.ones(c), torch.zeros(c)
    vec = lambda t: t.reshape(1, 1, c)
    a = p + "att."
    z[a + "x_r"] = vec(1 - ddd ** (0.2 * r1a0))
    z[a + "x_w"] = vec(1 - ddd ** (0.9 * r1a0))
    z[a + "x_k"] = vec(1 - (ddd ** (0.9 * r1a0) + 0.4 * r01))
    z[a + "x_v"] = vec(1 - (ddd ** (0.4 * r1a0) + 0.6 * r01))
    z[a + "x_a"] = vec(1 - ddd ** (0.9 * r1a0))
    z[a + "x_g"] = vec(1 - ddd ** (0.2 * r1a0))
    n = torch.arange(c, dtype=torch.float32)
    decay = -7 + 5 * (n / (c - 1)) ** (0.85 + 1.0 * r01 ** 0.5)
    z[a + "w0"] = vec(decay + 0.5)
    z[a + "w1"] = torch.zeros(c, lora)
    z[a + "w2"] = _orthogonal((lora, c), 0.1, gen)
    z[a + "a0"] = torch.zeros(1, 1, c)
    z[a + "a1"] = torch.zeros(c, lora)
    z[a + "a2"] = _orthogonal((lora, c), 0.1, gen)
    z[a + "v0"] = torch.ones(1, 1, c)
    z[a + "v1"] = torch.zeros(c, lora)
    z[a + "v2"] = _orthogonal((lora, c), 0.1, gen)
    z[a + "g1"] = torch.zeros(c, lora)
    z[a + "g2"] = _orthogonal((lora, c), 0.1, gen)
    z[a + "k_k"] = torch.full((1, 1, c), 0.85)
    z[a + "k_a"] = torch.ones(1, 1, c)
    z[a + "r_k"] = torch.zeros(h, head_size)
    z[a + "receptance.weight"] = u(c, c, a=0.5 / math.sqrt(c))
    z[a + "key.weight"] = u(c, c, a=0.05 / math.sqrt(c))
    z[a + "value.weight"] = u(c, c, a=0.5 / math.sqrt(c))
    z[a + "output.weight"] = torch.zeros(c, c)
    z[a + "ln_x.weight"] = torch.full((c,), ((1 + i) / layers) ** 0.7)
    z[a + "ln_x.bias"] = torch.zeros(c)
    f = p + "ffn."
    z[f + "x_k"] = vec(1 - ddd ** (r1a0 ** 4))
    z[f + "key.weight"] = u(ffn, c, a=0.5 / math.sqrt(c))
    z[f + "value.weight"] = torch.zeros(c, ffn)
  z["ln_out.weight"], z["ln_out.bias"] = torch.ones(c), torch.zeros(c)
  z["head.weight"] = _orthogonal((len(used), c), 0.5, gen)
  z["head.other"] = torch.zeros(1, c)
  return z


def hidden(z, ids, layers, head_size):
  """The RWKV-7 forward from a zero state: ln_out's output `[B, T, C]`."""
  b, t = ids.shape
  c = z["emb.weight"].shape[1]
  h, n = c // head_size, head_size
  norm = lambda x, k: F.layer_norm(x, (c,), z[k + ".weight"], z[k + ".bias"])
  shift = lambda x: F.pad(x, (0, 0, 1, -1)) - x  # previous token's x minus x
  x = norm(z["emb.weight"][ids], "blocks.0.ln0")
  v_first = None
  for i in range(layers):
    a = lambda k: z[f"blocks.{i}.att.{k}"]
    xx = norm(x, f"blocks.{i}.ln1")
    sx = shift(xx)
    xr, xw, xk, xv, xa, xg = (xx + sx * a(m).view(c) for m in
                              ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"))
    r = xr @ a("receptance.weight").T
    w = torch.tanh(xw @ a("w1")) @ a("w2")
    k = xk @ a("key.weight").T
    v = xv @ a("value.weight").T
    aa = torch.sigmoid(a("a0").view(c) + (xa @ a("a1")) @ a("a2"))
    g = torch.sigmoid(xg @ a("g1")) @ a("g2")
    kk = F.normalize((k * a("k_k").view(c)).view(b, t, h, n), dim=-1,
                     p=2.0).view(b, t, c)
    k = k * (1 + (aa - 1) * a("k_a").view(c))
    if i == 0:
      v_first = v
    else:
      v = v + (v_first - v) * torch.sigmoid(
          a("v0").view(c) + (xv @ a("v1")) @ a("v2"))
    w = torch.exp(-0.606531 * torch.sigmoid(a("w0").view(c) + w))
    # state[b, h, value i, key j]; per step: S = S diag(w) + S ab + v k^T
    # with ab = (-kk)(kk*a)^T, so S ab = (S(-kk)) (kk*a)^T.
    rr, ww, kkk, vv = (q.view(b, t, h, n) for q in (r, w, k, v))
    ka, nk = (kk * aa).view(b, t, h, n), (-kk).view(b, t, h, n)
    state = torch.zeros(b, h, n, n)
    outs = []
    for s in range(t):
      sa = (state @ nk[:, s, :, :, None])  # [b, h, n, 1]
      state = (state * ww[:, s, :, None, :] + sa * ka[:, s, :, None, :]
               + vv[:, s, :, :, None] * kkk[:, s, :, None, :])
      outs.append((state @ rr[:, s, :, :, None]).view(b, h * n))
    out = torch.stack(outs, 1)
    out = F.group_norm(out.reshape(b * t, c), h, a("ln_x.weight"),
                       a("ln_x.bias"), eps=64e-5).view(b, t, c)
    out = out + ((r * k * a("r_k").view(c)).view(b, t, h, n).sum(
        -1, keepdim=True) * v.view(b, t, h, n)).view(b, t, c)
    x = x + (out * g) @ a("output.weight").T
    xx = norm(x, f"blocks.{i}.ln2")
    fk = xx + shift(xx) * z[f"blocks.{i}.ffn.x_k"].view(c)
    fk = torch.relu(fk @ z[f"blocks.{i}.ffn.key.weight"].T) ** 2
    x = x + fk @ z[f"blocks.{i}.ffn.value.weight"].T
  return norm(x, "ln_out")


def log_probs(z, x, n_other):
  """Log-probabilities `[B, T, used + 1]` over the used ids and `other`.

  The last column is the log-probability of *one* unused id; the
  normalizer counts all `n_other` of them.
  """
  used = x @ z["head.weight"].T
  other = x @ z["head.other"].T
  total = torch.logsumexp(torch.cat(
      [used, other + math.log(max(n_other, 1))], -1), -1, keepdim=True)
  return torch.cat([used, other], -1) - total


def save(z, used, path):
  """The official state dict: full 65,536-row embedding and head, atomic."""
  out = {}
  for k, v in z.items():
    if k in ("emb.weight", "head.weight", "head.other"):
      continue
    out[k] = v.detach().clone().float().contiguous()
  c = z["emb.weight"].shape[1]
  emb = torch.empty(VOCAB_SIZE, c)
  head = z["head.other"].detach().expand(VOCAB_SIZE, c).clone()
  index = torch.tensor(used)
  emb[:] = z["emb.weight"].detach()[-1]
  emb[index] = z["emb.weight"].detach()[:-1]
  head[index] = z["head.weight"].detach()
  out["emb.weight"], out["head.weight"] = emb, head
  tmp = path + ".tmp"
  torch.save(out, tmp)
  os.replace(tmp, path)


def check_against_official(path, ids):
  """Max |logit difference| of the rwkv package's RWKV_x070 and `hidden`."""
  os.environ["RWKV_V7_ON"] = "1"
  from rwkv.model import RWKV  # pylint: disable=g-import-not-at-top
  model = RWKV(model=path[:-len(".pth")], strategy="cpu fp32")
  official, _ = model.forward([int(i) for i in ids], None, full_output=True)
  z = torch.load(path, weights_only=True)
  layers = 1 + max(int(k.split(".")[1]) for k in z if k.startswith("blocks."))
  with torch.no_grad():
    x = hidden(z, torch.tensor(ids)[None], layers,
               z["blocks.0.att.r_k"].shape[1])
    mine = x[0] @ z["head.weight"].T
  return float((official - mine).abs().max()), float(official.abs().max())


def main(argv):
  del argv
  torch.manual_seed(_SEED.value)
  torch.set_num_threads(_THREADS.value)
  gen = torch.Generator().manual_seed(_SEED.value)
  rng = np.random.default_rng(_SEED.value)
  text = open(_DATA.value, encoding="utf-8").read()
  split = int(len(text) * (1 - _HELDOUT.value))
  t0 = time.time()
  train_ids, held_ids = _tokenize(text[:split]), _tokenize(text[split:])
  used = sorted(set(train_ids.tolist()))
  print(f"tokenized in {time.time() - t0:.0f}s: {len(train_ids):,} training "
        f"and {len(held_ids):,} held-out tokens; {len(used):,} ids used",
        flush=True)
  compact = np.full(VOCAB_SIZE, len(used), np.int64)  # unused: `other`
  compact[used] = np.arange(len(used))
  n_other = VOCAB_SIZE - len(used)
  train_c, held_c = compact[train_ids], compact[held_ids]
  # Unigram cross-entropy of the held-out text (add-one over 65,536 ids).
  counts = np.bincount(train_ids, minlength=VOCAB_SIZE) + 1.0
  unigram = -np.log(counts[held_ids] / counts.sum()).mean()
  print(f"held-out unigram cross-entropy {unigram:.3f} nats/token",
        flush=True)

  c, layers, hs = _WIDTH.value, _LAYERS.value, _HEAD_SIZE.value
  z = init_state_dict(layers, c, hs, _LORA.value, 4 * c, used, gen)
  params = {k: torch.nn.Parameter(v) for k, v in z.items()}
  opt = torch.optim.Adam(params.values(), lr=_LR.value, betas=(0.9, 0.99),
                         eps=1e-8)
  n_params = sum(v.numel() for v in params.values())
  print(f"{layers} blocks x {c}, head size {hs}: {n_params:,} trained "
        "parameters", flush=True)

  seq = _SEQ_LEN.value + 1
  held_windows = held_c[:len(held_c) // seq * seq].reshape(-1, seq)
  held_windows = held_windows[:_EVAL_WINDOWS.value]

  def evaluate():
    with torch.no_grad():
      x = torch.tensor(held_windows)
      logp = log_probs(params, hidden(params, x[:, :-1], layers, hs),
                       n_other)
      return float(-logp.gather(-1, x[:, 1:, None]).mean())

  start = time.time()
  step = 0
  for step in range(1, _STEPS.value + 1):
    progress = step / _STEPS.value
    lr = (_LR_FINAL.value + (_LR.value - _LR_FINAL.value) * 0.5 *
          (1 + math.cos(math.pi * progress)))
    lr *= min(1.0, step / _WARMUP.value)
    for group in opt.param_groups:
      group["lr"] = lr
    offsets = rng.integers(0, len(train_c) - seq, _BATCH.value)
    batch = torch.tensor(np.stack([train_c[o:o + seq] for o in offsets]))
    logp = log_probs(params, hidden(params, batch[:, :-1], layers, hs),
                     n_other)
    loss = -logp.gather(-1, batch[:, 1:, None]).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
    opt.step()
    elapsed = time.time() - start
    out_of_time = _MINUTES.value and elapsed > _MINUTES.value * 60
    if step % 25 == 0:
      print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} "
            f"{elapsed:.0f}s", flush=True)
    if step % _EVAL_EVERY.value == 0 or step == _STEPS.value or out_of_time:
      print(f"step {step} train {loss.item():.3f} held-out "
            f"{evaluate():.3f} nats/token ({elapsed:.0f}s)", flush=True)
      save(params, used, _OUTPUT.value)
    if out_of_time:
      print(f"stopped at step {step}: --minutes={_MINUTES.value}", flush=True)
      break
  save(params, used, _OUTPUT.value)
  print(f"saved {_OUTPUT.value}", flush=True)
  if _CHECK.value:
    diff, scale = check_against_official(_OUTPUT.value, held_ids[:64])
    print(f"rwkv package RWKV_x070 vs this forward, 64 held-out tokens: "
          f"max |logit difference| {diff:.2e} (logits up to {scale:.1f})",
          flush=True)


if __name__ == "__main__":
  app.run(main)
