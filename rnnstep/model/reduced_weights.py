"""Weights stored in fewer bits: `weights_dtype` (issue #62).

A model's large matrices may be stored as float16, bfloat16 or int8
(`WEIGHTS_DTYPES`; float32, the default, leaves every tensor as it is).
The reduced values ARE the model's weights (`reduce`: what the file
stores, decoded), and a model file written with a weights dtype reads back
to the same weights bit for bit. float16 and bfloat16 weights are
multiplied as float32 values; an int8 matrix's products are XNNPACK's
dynamic-range int8 arithmetic (`int8_arithmetic`), the one arithmetic of
every path and caller, which the LiteRT artifact runs on XNNPACK's own
int8 kernel. This is not `dtype=` (the arithmetic's precision,
`network.DTYPES`).

Which tensors: the large matrices (`model_file.ModelConfig.reduced_keys`:
the embedding, every kind's `Kind.reduced_tensors`, the head's kernels and
the output Dense's kernel); biases, norms, RWKV-7's LoRAs and vectors, and
the attention kernel stay float32.

  float16, bfloat16: each value rounded to nearest (ties to even).
  int8: symmetric, per output channel: a matrix `[..., in, out]` is
    `q * scale` with q int8 in [-127, 127] and a float32 scale per output
    column (`[..., 1, out]`); the embedding (a gather: its rows are its
    outputs) has a scale per row (`[V, 1]`). The scale is max|column| / 127,
    nudged to the nearest float32 that dividing 127 times it by 127 gives
    back, so that reducing the decoded weights again gives the same q and
    scale (`reduce` is idempotent).

A model file (`model_file`) stores a reduced tensor as its bits: float16
as float16, bfloat16 as its uint16 bits, int8 as the int8 q and its
float32 scales. This module imports nothing heavy (numpy only), as
`model_file`.
"""

from typing import Optional, Tuple

import numpy as np


FLOAT32 = "float32"
WEIGHTS_DTYPES = (FLOAT32, "float16", "bfloat16", "int8")
INT8_MAX = 127
# How each dtype is stored in a file: numpy dtype of the member.
_STORED = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16),
           "int8": np.dtype(np.int8)}
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def choices_message(weights_dtype, what: str = "weights_dtype") -> str:
  """The one line saying `weights_dtype` is not one of `WEIGHTS_DTYPES`."""
  return (f"{what} must be one of {', '.join(WEIGHTS_DTYPES)}, got "
          f"{weights_dtype!r}")


def int8_scale(array: np.ndarray, axis: int) -> np.ndarray:
  """The float32 scales of `array` (keepdims along `axis`): max|x| / 127,
  each moved to a fixed point of s -> fl(fl(127 s) / 127) (see the module
  docstring); 0 for an all-zero channel."""
  scale = (np.abs(array).max(axis, keepdims=True).astype(np.float32)
           / np.float32(INT8_MAX)).astype(np.float32)
  for _ in range(4):  # One step reaches the fixed point in practice.
    again = ((scale * np.float32(INT8_MAX)).astype(np.float32)
             / np.float32(INT8_MAX)).astype(np.float32)
    if np.array_equal(again, scale):
      break
    scale = again
  return scale


def _bfloat16_bits(array: np.ndarray) -> np.ndarray:
  """float32 -> bfloat16 bits (uint16), rounded to nearest, ties to even."""
  bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
  rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
  return (rounded >> np.uint32(16)).astype(np.uint16)


def _from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
  return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def encode(array: np.ndarray, weights_dtype: str, axis: int, name: str
           ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
  """One float32 tensor as a file stores it for a reduced `weights_dtype`:
  (the stored array, the int8 scales or None). `axis`: the one an int8
  scale is shared along (a matrix's input rows -2, the embedding's columns
  -1); `name`: the tensor, for messages.

  Raises:
    ValueError: float16 and a value beyond its range (naming the tensor).
  """
  array = np.asarray(array, np.float32)
  if weights_dtype == "float16":
    if array.size and np.abs(array).max() > _FLOAT16_MAX:
      raise ValueError(
          f"weights_dtype=float16: tensor {name} holds values beyond "
          f"float16's range (|x| up to {np.abs(array).max():.3g}, float16 "
          f"stops at {_FLOAT16_MAX:g}); use bfloat16 or int8")
    return array.astype(np.float16), None
  if weights_dtype == "bfloat16":
    return _bfloat16_bits(array), None
  scale = int8_scale(array, axis)
  safe = np.where(scale > 0, scale, np.float32(1))
  q = np.clip(np.rint(array / safe), -INT8_MAX, INT8_MAX).astype(np.int8)
  return q, scale


def decode(stored: np.ndarray, scale: Optional[np.ndarray],
           weights_dtype: str) -> np.ndarray:
  """The float32 tensor from what `encode` stored."""
  if weights_dtype == "float16":
    return stored.astype(np.float32)
  if weights_dtype == "bfloat16":
    return _from_bfloat16_bits(stored)
  return stored.astype(np.float32) * scale


def reduce(array: np.ndarray, weights_dtype: str, axis: int,
           name: str = "") -> np.ndarray:
  """The float32 weights a tensor is under `weights_dtype` (float32: as
  given): rounded to it and decoded. Idempotent."""
  if weights_dtype == FLOAT32:
    return array
  return decode(*encode(array, weights_dtype, axis, name), weights_dtype)


def check_stored(stored: np.ndarray, scale: Optional[np.ndarray],
                 weights_dtype: str, axis: int, name: str, scale_name: str
                 ) -> str:
  """What is wrong with a tensor stored for `weights_dtype` (a message
  naming `name` or `scale_name`), or '' when it is right."""
  if stored.dtype != _STORED[weights_dtype]:
    return (f"tensor {name} is stored as {stored.dtype}, expected "
            f"{_STORED[weights_dtype]} for weights_dtype {weights_dtype}")
  if weights_dtype != "int8":
    return ""
  want = list(stored.shape)
  if want:
    want[axis] = 1
  if scale is None:
    return f"missing tensor {scale_name} (int8 {name}'s scales)"
  if scale.dtype != np.float32 or list(scale.shape) != want:
    return (f"tensor {scale_name} is {scale.dtype} {tuple(scale.shape)}, "
            f"expected float32 {tuple(want)}")
  if not np.isfinite(scale).all() or (scale < 0).any():
    return f"tensor {scale_name} holds negative, NaN or Inf scales"
  if (stored == -INT8_MAX - 1).any():
    return f"tensor {name} holds -128 (int8 weights are symmetric: -127..127)"
  return ""
