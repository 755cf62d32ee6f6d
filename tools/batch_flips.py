"""How often a row's text within a batch differs from the row alone, and why.

Usage (from the repo root):
  python tools/batch_flips.py                       # bundled model, every path
  python tools/batch_flips.py --batch=64 --num_steps=300 --paths=xla

For each path, generates `--batch` rows (prompts from the tutorial corpus,
greedy and sampled at temperature 1) as one batch and then each row alone
(batch 1, its own seed), and counts the rows whose texts differ. Where one
does, it prints the step where the two part and the gap between the two
candidates' scores there under the independent float64 forward
(tests/support/numpy_reference.py) and the noise's spec: a gap of float32-rounding
size is the contract's near-tie (README "Reproducibility").
"""

import pathlib
import sys

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# pylint: disable=g-import-not-at-top,wrong-import-position
from tests.support import decoding_reference as dr
from tests.support import numpy_reference as nr
from tests.support import row_contract
import rnnstep
from rnnstep.model import model_file

_BATCH = flags.DEFINE_integer("batch", 64, "Rows in the batch.")
_STEPS = flags.DEFINE_integer("num_steps", 300, "Characters per row.")
_PATHS = flags.DEFINE_list("paths", ["xla", "graph", "elementwise"], "Paths.")
_CORPUS = flags.DEFINE_string(
    "corpus", str(pathlib.Path(__file__).resolve().parents[2] / "shared" /
                  "data" / "tinyshakespeare.txt"), "Prompts come from here.")

_JIT = {"xla": True, "graph": False, "elementwise": "elementwise"}


def main(argv):
  del argv
  model = rnnstep.load()
  data = model_file.read(rnnstep.bundled_model_path())
  reference = nr.Reference(*nr.tensors_of_file(data))
  lines = [l for l in open(_CORPUS.value, encoding="utf-8").read().split("\n")
           if len(l) > 3]
  rng = np.random.default_rng(0)
  prompts = [lines[i][:int(rng.integers(1, 30))]
             for i in rng.choice(len(lines), _BATCH.value, replace=False)]
  seeds = list(range(100, 100 + _BATCH.value))
  # Teacher-forced logits: a row in the batch against the row alone.
  ids = np.stack([model.encode(l[:64].ljust(64)) for l in lines[:_BATCH.value]
                  if all(c in model.vocab for c in l[:64])][:_BATCH.value])
  together = rnnstep.logits(model, ids)
  gap = max(np.abs(together[r] - rnnstep.logits(model, ids[r])[0]).max()
            for r in range(len(ids)))
  print(f"logits: a row of {len(ids)} against it alone, 64 steps: largest "
        f"difference {gap:.2e} (logits span {np.ptp(together):.1f})")
  for path in _PATHS.value:
    for temperature in (0.0, 1.0):
      batch = rnnstep.generate(model, prompts, _STEPS.value, seed=seeds,
                               temperature=temperature, jit_compile=_JIT[path])
      differ = 0
      for prompt, seed, text in zip(prompts, seeds, batch):
        alone = rnnstep.generate(model, [prompt], _STEPS.value, seed=[seed],
                                 temperature=temperature,
                                 jit_compile=_JIT[path])[0]
        if alone == text:
          continue
        differ += 1
        got, want = model.encode(text), model.encode(alone)
        step = row_contract.parting_step(list(got), list(want))
        history = list(model.encode(prompt)) + list(got[:step])
        scores = reference.logits(np.array(history))[-1]
        if temperature:
          scores = scores / temperature + dr.gumbel_noise(
              dr.row_key(seed, 0), step, len(scores))
        print(f"  {path} T={temperature} seed {seed}: parts at step {step}, "
              f"gap {abs(scores[got[step]] - scores[want[step]]):.2e}")
      print(f"{path} T={temperature}: {differ} of {len(prompts)} rows differ "
            f"from alone over {_STEPS.value} steps")


if __name__ == "__main__":
  app.run(main)
