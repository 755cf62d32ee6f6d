"""What each weights dtype costs in quality (issue #62 item 3).

    python tools/bench/quantization_loss.py
    python tools/bench/quantization_loss.py --models=bundled --markdown=FILE
    python tools/bench/quantization_loss.py --model=my.npz --text=heldout.txt
    python tools/bench/quantization_loss.py --model=rwkv7-small.npz \
        --text=tests/data/tinyshakespeare_heldout_excerpt.txt --chars=8000

Per model and weights dtype (float16, bfloat16, int8), against the same
model in float32, over held-out text (teacher-forced, from a zero state, in
windows of --window tokens, as tools/train_reference.py scores):

  - KL: mean over tokens of KL(float32 || reduced) of the next-token
    distributions, in nats;
  - NLL: the held-out negative log-likelihood per token, nats, and its
    ratio to float32's;
  - greedy agreement: along float32's own 200-token greedy continuation of
    a prompt, the fraction of steps whose reduced argmax is float32's
    (teacher-forced: one early flip does not count every later step), and
    the first step at which the two free-running greedy texts differ.

The models: the bundled GRU over tests/data/tinyshakespeare_heldout_excerpt.txt;
word_language_model's five (tests/data/word_lm: a 13-word toy corpus,
scored over its valid and test splits); the RWKV-7 fixture
(tests/data/rwkv7/preset: seeded random weights, not trained: its figures
show the rounding's effect on the logits, not a trained model's loss),
over the held-out excerpt's first 2,000 characters in the world
vocabulary. Prints the machine and a Markdown table.
"""

import argparse
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
HELDOUT = DATA / "tinyshakespeare_heldout_excerpt.txt"
DTYPES = ("float16", "bfloat16", "int8")
GREEDY_STEPS = 200


def _models():
  """{name: (load kwargs, held-out text, prompt)}."""
  text = HELDOUT.read_text(encoding="utf-8")
  word_text = " ".join((DATA / "word_lm" / "corpus" / name).read_text()
                       for name in ("valid.txt", "test.txt"))
  models = {"bundled GRU (768)": (dict(path=None), text, "ROMEO:")}
  for kind in ("gru", "lstm", "lstm_tied", "rnn_tanh", "rnn_relu"):
    models[f"word_lm {kind}"] = (
        dict(path=str(DATA / "word_lm" / f"{kind}.pt"),
             corpus=str(DATA / "word_lm" / "corpus")), word_text, "the cat")
  models["RWKV-7 fixture (random)"] = (
      dict(path=str(DATA / "rwkv7" / "preset")), text[:2000], "ROMEO:")
  return models


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _windows(ids, window):
  """ids as consecutive full windows `[N, window]` (or one shorter row)."""
  if len(ids) <= window:
    return ids[None]
  n = len(ids) // window
  return ids[:n * window].reshape(n, window)


def _scored(model, windows, batch=16):
  """Log-probabilities `[N, T-1, V]` of each window's next ids."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  out = [_log_softmax(rnnstep.logits(model, windows[i:i + batch, :-1]))
         for i in range(0, len(windows), batch)]
  return np.concatenate(out)


def _nll(logp, windows):
  targets = windows[:, 1:]
  return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


def _argmax(model, logits):
  if model.has_unk:
    logits = logits.copy()
    logits[..., 0] = -np.inf
  return logits.argmax(-1)


def measure(name, load, text, prompt, window):
  """The table's rows for one model."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  reference = rnnstep.load(**load)
  ids = reference.encode(text)
  windows = _windows(ids, window)
  logp = _scored(reference, windows)
  nll = _nll(logp, windows)
  greedy = rnnstep.generate(reference, prompt, GREEDY_STEPS,
                            temperature=0.0)
  along = reference.encode(prompt + greedy)
  start = len(reference.encode(prompt)) - 1
  want = _argmax(reference, rnnstep.logits(reference, along[:-1])[0])[start:]
  rows = [(name, "float32", windows.size - len(windows), 0.0, nll, 1.0,
           1.0, GREEDY_STEPS)]
  for weights_dtype in DTYPES:
    model = rnnstep.load(**load, weights_dtype=weights_dtype)
    logq = _scored(model, windows)
    kl = float((np.exp(logp) * (logp - logq)).sum(-1).mean())
    got = _argmax(model, rnnstep.logits(model, along[:-1])[0])[start:]
    text_q = rnnstep.generate(model, prompt, GREEDY_STEPS, temperature=0.0)
    a, b = reference.encode(prompt + greedy), model.encode(prompt + text_q)
    differ = np.nonzero(a[:min(len(a), len(b))] != b[:min(len(a), len(b))])[0]
    first = (int(differ[0]) - start - 1 if len(differ)
             else min(len(a), len(b)) - start - 1)
    rows.append((name, weights_dtype, windows.size - len(windows), kl,
                 _nll(logq, windows), _nll(logq, windows) / nll,
                 float((got == want).mean()), first))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="",
                      help="comma list of name prefixes (default: all)")
  parser.add_argument("--model", default="",
                      help="measure this model file instead (with --text)")
  parser.add_argument("--text", default="",
                      help="--model's held-out text (UTF-8)")
  parser.add_argument("--chars", type=int, default=0,
                      help="--text's first this many characters (0: all)")
  parser.add_argument("--prompt", default="ROMEO:",
                      help="--model's greedy prompt")
  parser.add_argument("--window", type=int, default=256)
  parser.add_argument("--markdown", default="")
  args = parser.parse_args()
  sys.path.insert(0, str(ROOT))
  with open("/proc/cpuinfo") as f:
    cpu = next((l.split(":", 1)[1].strip() for l in f
                if l.startswith("model name")), "?")
  lines = [f"machine: {cpu}, {os.cpu_count()} CPUs; load "
           f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
           "| model | weights | tokens | mean KL(f32 ‖ q), nats/token | "
           "held-out NLL, nats/token | NLL / float32's | greedy agreement "
           f"({GREEDY_STEPS} steps, teacher-forced) | first free-running "
           "difference |", "|---|---|---|---|---|---|---|---|"]
  print(lines[0], flush=True)
  wanted = [m for m in args.models.split(",") if m]
  models = _models()
  if args.model:
    if not args.text:
      parser.error("--model needs --text (its held-out text)")
    models = {args.model: (dict(path=args.model),
                           pathlib.Path(args.text).read_text("utf-8")[
                               :args.chars or None],
                           args.prompt)}
  for name, (load, text, prompt) in models.items():
    if wanted and not any(name.startswith(m) for m in wanted):
      continue
    for row in measure(name, load, text, prompt, args.window):
      name_, dtype, tokens, kl, nll, ratio, agree, first = row
      first = "none" if first >= GREEDY_STEPS else f"step {first}"
      line = (f"| {name_} | {dtype} | {tokens:,} | {kl:.2e} | {nll:.4f} | "
              f"{ratio:.4f} | {agree:.3f} | {first} |")
      lines.append(line)
      print(line, flush=True)
  if args.markdown:
    pathlib.Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
