"""What rounding the activations to int8 too would cost in quality, on the
bundled GRU (issue #62: int8 weights that decode faster).

    python tools/bench/int8_activation_loss.py

int8 weights decode faster only where each product's input row is rounded
to int8 too (tools/bench/int8_products.py). This scores the bundled model
(one GRU layer of 768, reset_after) over the held-out excerpt
(tests/data/tinyshakespeare_heldout_excerpt.txt, windows of --window
characters from a zero state, as tools/bench/quantization_loss.py does)
with its int8 weights (`rnnstep.load(weights_dtype="int8")`) under three
arithmetics of the recurrent and the output products (layer 0's input
product is a gathered table, computed once, as rnnstep computes it):

  - float32: the int8 weights' values in float32 products (today's int8);
  - int8 rows: each row to int8, symmetric (`int8_products.numpy_int8_product`);
  - XNNPACK: LiteRT's dynamic-range int8 (`int8_products.xnnpack_dynamic_int8`).

Against the float32 model: mean KL(float32 || variant) per token, the
held-out NLL and its ratio to float32's, and the fraction of 200 greedy
steps (along the float32 model's own greedy text, teacher-forced) whose
argmax agrees. The GRU is written in numpy here (the products swapped per
variant); its float32 variant is first checked against `rnnstep.logits`
of the int8 model.
"""

import argparse
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
GREEDY_STEPS = 200


def sigmoid(x):
  return 1 / (1 + np.exp(-x))


class NumpyGru:
  """The bundled model's GRU (reset_after, as `cells.GRUCell`) and head in
  numpy, `product(x, name)` doing each large product."""

  def __init__(self, model):
    tensors = model.tensors()  # An int8 kernel's float32 values.
    self.units = tensors["layer0_recurrent_kernel"].shape[0]
    self.table = model.input_table.numpy()
    self.kernels = {"recurrent": tensors["layer0_recurrent_kernel"],
                    "head": tensors["dense_kernel"]}
    self.candidate_bias = tensors["layer0_bias"][1, 2 * self.units:]
    self.head_bias = tensors["dense_bias"]

  def logits(self, ids, product):
    """`[B, T, V]` logits of ids `[B, T]` from a zero state."""
    u = self.units
    h = np.zeros((ids.shape[0], u), np.float32)
    out = []
    for t in range(ids.shape[1]):
      x_proj = self.table[ids[:, t]]
      h_proj = product(h, "recurrent")
      zr = sigmoid(x_proj[:, :2 * u] + h_proj[:, :2 * u])
      z, r = zr[:, :u], zr[:, u:]
      n = np.tanh(x_proj[:, 2 * u:]
                  + r * (h_proj[:, 2 * u:] + self.candidate_bias))
      h = (z * h + (1 - z) * n).astype(np.float32)
      out.append(product(h, "head") + self.head_bias)
    return np.stack(out, 1)


def products(gru):
  """{variant: product(x, name)}."""
  from tools.bench import int8_products
  quantized = {name: int8_products.quantize_columns(kernel)
               for name, kernel in gru.kernels.items()}
  return {
      "float32": lambda x, name: x @ gru.kernels[name],
      "int8 rows": lambda x, name: int8_products.numpy_int8_product(
          x, *quantized[name]),
      "XNNPACK": lambda x, name: int8_products.xnnpack_dynamic_int8(
          x, quantized[name][0].T, quantized[name][1])}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--window", type=int, default=256)
  parser.add_argument("--prompt", default="ROMEO:")
  args = parser.parse_args()
  sys.path.insert(0, str(ROOT))
  import rnnstep
  from tools.bench import quantization_loss as loss
  print(f"machine: {os.cpu_count()} CPUs; load "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
  reference = rnnstep.load()
  model = rnnstep.load(weights_dtype="int8")
  gru = NumpyGru(model)
  ids = reference.encode(loss.HELDOUT.read_text(encoding="utf-8"))
  windows = loss._windows(ids, args.window)  # pylint: disable=protected-access
  logp = loss._scored(reference, windows)  # pylint: disable=protected-access
  nll = loss._nll(logp, windows)  # pylint: disable=protected-access
  greedy = rnnstep.generate(reference, args.prompt, GREEDY_STEPS,
                            temperature=0.0)
  along = reference.encode(args.prompt + greedy)
  start = len(reference.encode(args.prompt)) - 1
  want = rnnstep.logits(reference, along[:-1])[0].argmax(-1)[start:]

  variants = products(gru)
  check = gru.logits(windows[:4, :-1], variants["float32"])
  library = rnnstep.logits(model, windows[:4, :-1])
  gap = float(np.abs(check - library).max())
  print(f"numpy GRU (float32 products) against rnnstep.logits of the int8 "
        f"model: max |difference| {gap:.2e}", flush=True)
  if gap > 1e-3:
    sys.exit("int8_activation_loss: the numpy GRU does not match rnnstep")
  print(f"\n| bundled GRU, int8 weights, products | tokens | mean KL(f32 ‖ q), "
        f"nats/token | held-out NLL | / float32's | greedy agreement "
        f"({GREEDY_STEPS} steps, teacher-forced) |\n|---|---|---|---|---|---|")
  print(f"| float32 model | {windows.size - len(windows):,} | 0 | {nll:.4f} "
        "| 1 | 1 |", flush=True)
  for name, product in variants.items():
    logq = loss._log_softmax(  # pylint: disable=protected-access
        gru.logits(windows[:, :-1], product))
    kl = float((np.exp(logp) * (logp - logq)).sum(-1).mean())
    nll_q = loss._nll(logq, windows)  # pylint: disable=protected-access
    got = gru.logits(along[None, :-1], product)[0].argmax(-1)[start:]
    print(f"| {name} | {windows.size - len(windows):,} | {kl:.2e} | "
          f"{nll_q:.4f} | {nll_q / nll:.4f} | {(got == want).mean():.3f} |",
          flush=True)


if __name__ == "__main__":
  main()
