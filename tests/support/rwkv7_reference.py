"""An independent float64 numpy forward of RWKV-7 (tests only).

Written from the official RNN-mode equations (RWKV-LM
RWKV-v7/rwkv_v7_demo_rnn.py, as tools/make_rwkv7_fixtures.py's
`official_logits` writes them in torch), over the model file's tensors
(`kinds.rwkv7_shapes`: per block stacked, matrices `[in, out]`). It shares
no code with rnnstep, so it is the reference for models whose weights
rnnstep changed (tests/test_weights_dtype.py: the reduced weights dtypes).
"""

import numpy as np


def _layer_norm(x, gamma, beta, epsilon=1e-5):
  mean = x.mean(-1, keepdims=True)
  variance = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def logits(tensors, head_size, ids, product=np.matmul, dtype=np.float64,
           input_row=None):
  """Teacher-forced logits `[T, V]` of ids `[T]` from a zero state.

  Another arithmetic (tools/bench/int8_litert.py's XNNPACK int8):
  `product(x, w)` computes each `x @ w` by a weight matrix `w` `[in, out]`;
  `dtype` is that of the tensors and the state; `input_row(position, id)`,
  where it returns a row, replaces LayerNorm_0(embedding[id]) there.
  """
  t = {k: np.asarray(v, dtype) for k, v in tensors.items()}
  blocks, c = t["layer0_ln"].shape[0], t["layer0_ln"].shape[-1]
  heads = c // head_size
  att_x = [np.zeros(c, dtype) for _ in range(blocks)]
  ffn_x = [np.zeros(c, dtype) for _ in range(blocks)]
  states = [np.zeros((heads, head_size, head_size), dtype)
            for _ in range(blocks)]
  out = []
  for position, token in enumerate(ids):
    x = input_row(position, token) if input_row else None
    if x is None:
      x = _layer_norm(t["embedding"][token], *t["layer0_kernel"])
    v_first = None
    for i in range(blocks):
      ln, mix, vec = t["layer0_ln"][i], t["layer0_mix"][i], t[
          "layer0_vectors"][i]
      w0, a0, v0, k_k, k_a, r_k = vec
      m = lambda name: t[f"layer0_{name}"][i]
      xx = _layer_norm(x, ln[0], ln[1])
      shift = att_x[i] - xx
      att_x[i] = xx
      xr, xw, xk, xv, xa, xg = (xx + shift * mix[j] for j in range(6))
      r = product(xr, m("receptance"))
      w = product(np.tanh(product(xw, m("w1"))), m("w2"))
      k = product(xk, m("key"))
      v = product(xv, m("value"))
      a = _sigmoid(a0 + product(product(xa, m("a1")), m("a2")))
      g = product(_sigmoid(product(xg, m("g1"))), m("g2"))
      kk = (k * k_k).reshape(heads, head_size)
      kk = (kk / np.maximum(np.linalg.norm(kk, axis=-1, keepdims=True),
                            1e-12)).reshape(-1)
      k = k * (1 + (a - 1) * k_a)
      if i == 0:
        v_first = v
      else:
        v = v + (v_first - v) * _sigmoid(
            v0 + product(product(xv, m("v1")), m("v2")))
      decay = np.exp(-np.exp(-0.5) * _sigmoid(w0 + w))
      vk = v.reshape(heads, head_size, 1) @ k.reshape(heads, 1, head_size)
      ab = (-kk).reshape(heads, head_size, 1) @ (kk * a).reshape(
          heads, 1, head_size)
      states[i] = (states[i] * decay.reshape(heads, 1, head_size)
                   + states[i] @ ab + vk)
      y = (states[i] @ r.reshape(heads, head_size, 1)).reshape(heads,
                                                              head_size)
      mean = y.mean(-1, keepdims=True)
      variance = ((y - mean) ** 2).mean(-1, keepdims=True)
      y = ((y - mean) / np.sqrt(variance + 64e-5)).reshape(-1)
      y = y * m("ln_x")[0] + m("ln_x")[1]
      y = y + ((r * k * r_k).reshape(heads, head_size).sum(-1, keepdims=True)
               * v.reshape(heads, head_size)).reshape(-1)
      x = x + product(y * g, m("output"))
      xx = _layer_norm(x, ln[2], ln[3])
      shift = ffn_x[i] - xx
      ffn_x[i] = xx
      hidden = np.maximum(product(xx + shift * mix[6], m("ffn_key")), 0)
      x = x + product(hidden ** 2, m("ffn_value"))
    x = _layer_norm(x, *t["layer0_output_norm"])
    out.append(product(x, t["dense_kernel"]) + t["dense_bias"])
  return np.stack(out)
