"""How often an int8 model's text differs between paths and callers, and
why (issue #62; README "Reproducibility").

    python tools/bench/int8_agreement.py                 # the bundled GRU
    python tools/bench/int8_agreement.py --weights_dtype=float32
    python tools/bench/int8_agreement.py --model=m.npz --prompts=4 --steps=64

An int8 model's products round each input row to int8
(`rnnstep.model.int8_arithmetic`), so a float32 rounding that moves an
activation across a rounding boundary moves that product by one int8 step
of the row: paths that agree to float32 rounding elsewhere agree to that
step here. This measures what it does to texts: --prompts rows (lines of
the tutorial's corpus), greedy and sampled (temperature 0.8), --steps
tokens, generated as one batch on the graph path (the reference), and
against it: each row alone, the batch on XLA and on the elementwise path,
and the batch through the LiteRT export (the warm command line's artifact,
XNNPACK's int8 kernel). For each: rows whose text is the reference's,
tokens that agree before the texts part, and, where they part, the gap
between the two candidates' logits there (the reference's greedy logits;
sampled rows add the noise, so their gap is printed for greedy rows only).
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def prompts_of(count, seed=0):
  lines = [line for line in CORPUS.read_text(encoding="utf-8").split("\n")
           if len(line) > 3]
  rng = np.random.default_rng(seed)
  return [lines[i][:int(rng.integers(1, 30))]
          for i in rng.choice(len(lines), count, replace=False)]


def parting(model, prompt, a, b):
  """(tokens equal before the texts part, the reference's logit gap between
  the two tokens there) for texts a (the reference) and b."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  ids_a, ids_b = model.encode(a).tolist(), model.encode(b).tolist()
  first = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y),
               min(len(ids_a), len(ids_b)))
  if first >= min(len(ids_a), len(ids_b)):
    return first, None
  context = model.encode(prompt).tolist() + ids_a[:first]
  logits = rnnstep.logits(model, np.array(context))[0][-1]
  return first, float(abs(logits[ids_a[first]] - logits[ids_b[first]]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="",
                      help="a model file (default: the bundled GRU)")
  parser.add_argument("--weights_dtype", default="int8")
  parser.add_argument("--prompts", type=int, default=32)
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--callers", default="alone,xla,elementwise,litert")
  args = parser.parse_args()
  sys.path.insert(0, str(ROOT))
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import export  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner  # pylint: disable=g-import-not-at-top
  print(f"machine: {os.cpu_count()} CPUs, load "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
  model = rnnstep.load(args.model or None, weights_dtype=args.weights_dtype)
  prompts = prompts_of(args.prompts)
  # Row i's noise is (seed, i); against rows alone, one seed per row
  # (a row alone reproduces with its own seed).
  seeds = list(range(100, 100 + len(prompts)))
  decodings = {"greedy": dict(temperature=0.0, seed=5),
               "sampled": dict(temperature=0.8, seed=5)}
  flatbuffer = None
  print(f"{args.model or 'bundled GRU'}, weights_dtype={args.weights_dtype}:"
        f" {len(prompts)} prompts x {args.steps} tokens, greedy and sampled "
        "(temperature 0.8); the reference: the batch on the graph path\n")
  print("| against the reference | decoding | rows the same | tokens agreeing "
        "before parting (of each parted row) | logit gap where greedy "
        "parted |")
  print("|---|---|---|---|---|")
  for name, decoding in decodings.items():
    want = rnnstep.generate(model, prompts, args.steps, jit_compile=False,
                            **decoding)
    for caller in args.callers.split(","):
      reference = want
      if caller == "alone":
        reference = rnnstep.generate(model, prompts, args.steps,
                                     jit_compile=False,
                                     **dict(decoding, seed=seeds))
        got = [rnnstep.generate(model, [p], args.steps, jit_compile=False,
                                **dict(decoding, seed=[seed]))[0]
               for p, seed in zip(prompts, seeds)]
      elif caller in ("xla", "elementwise"):
        got = rnnstep.generate(model, prompts, args.steps,
                               jit_compile=True if caller == "xla"
                               else "elementwise", **decoding)
      else:
        if flatbuffer is None:
          flatbuffer = export.convert(model)
        got = runner.run_artifact(flatbuffer, list(model.vocab), prompts,
                                  args.steps, tokens=model.tokens,
                                  **decoding)
      parted = [parting(model, p, a, b)
                for p, a, b in zip(prompts, reference, got) if a != b]
      gaps = [g for _, g in parted if g is not None]
      same = len(prompts) - len(parted)
      print(f"| {caller} | {name} | {same}/{len(prompts)} | "
            f"{', '.join(str(f) for f, _ in parted) or '-'} | "
            + (f"{', '.join(f'{g:.2g}' for g in gaps)}"
               if name == "greedy" and gaps else "-") + " |", flush=True)
    lengths = [len(model.encode(t)) for t in want]
    print(f"|  | ({name}: {sum(lengths):,} tokens, median row "
          f"{statistics.median(lengths):.0f}) | | | |")


if __name__ == "__main__":
  main()
