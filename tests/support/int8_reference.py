"""An int8 model's products in numpy (tests only): each `x @ w` by an int8
matrix as LiteRT/XNNPACK's dynamic-range fully-connected kernel computes
it (`tools/bench/int8_products.xnnpack_dynamic_int8`, pinned to LiteRT's
bits by tests/test_weights_dtype_int8_arithmetic.py), with the matrix's
int8 q and scales found here from its values (max |column| / 127), not
from rnnstep's. For the numpy references (`numpy_reference.Reference`'s
and `rwkv7_reference.logits`'s `product`).
"""

import numpy as np

from tools.bench import int8_products


def int8_of(w):
  """(q `[K, N]`, scales `[N]`) where every column of `w [K, N]` is int8
  q times its scale (to float32 rounding of the scale), else None."""
  w = np.asarray(w, np.float64)
  if w.ndim != 2:
    return None
  scale = np.abs(w).max(0) / 127
  q = np.round(w / np.where(scale > 0, scale, 1))
  if (np.abs(q).max(0) > 127).any() or not np.allclose(
      q * scale, w, rtol=1e-6, atol=0):
    return None
  return q.astype(np.int8), scale.astype(np.float32)


def product(x, w):
  """`x @ w` in XNNPACK's int8 arithmetic (float32) for x `[..., K]`."""
  q, scale = int8_of(w)
  x = np.asarray(x, np.float32)
  flat = x.reshape(-1, x.shape[-1])
  out = int8_products.xnnpack_dynamic_int8(flat, q.T, scale)
  return out.reshape(x.shape[:-1] + (q.shape[1],))


def by_key(tensors, keys):
  """`product(x, key)` for `numpy_reference.Reference`: the int8 product
  for `keys`, None (a float product) for the others."""
  return lambda x, key: product(x, tensors[key]) if key in keys else None


def by_values(x, w):
  """`product(x, w)` for `rwkv7_reference.logits`: the int8 product where
  `w`'s values are int8 (RWKV-7's R, K, V, O, feed-forward and head),
  float32 `x @ w` for the others (its LoRAs)."""
  if int8_of(w) is not None:
    return product(x, w)
  return (np.asarray(x, np.float32) @ np.asarray(w, np.float32)).astype(
      np.float32)
