"""Every path x caller x decoding setting's text, as one JSON file, for refactors.

Usage (from the repo root):
  python tools/texts_snapshot.py --output=/tmp/before.json   # on the old code
  python tools/texts_snapshot.py --output=/tmp/after.json    # on the new code
  cmp /tmp/before.json /tmp/after.json

A refactor of the decode core must leave every text and score unchanged: this
runs a small lively two-layer model and the bundled model through generate
(batches 1, 4 and 37), stream (chunks of 7), beams and strategy-free
SavedModel-free callers on every path, in float32 and bfloat16, with greedy,
sampled, mixed rows, filters, stop strings, penalties with the n-gram ban and
scores, and writes what each returned.
"""

import json
import pathlib
import sys

from absl import app
from absl import flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# pylint: disable=g-import-not-at-top,wrong-import-position
from tests.support import keras_reference as kr
import rnnstep

_OUTPUT = flags.DEFINE_string("output", None, "Where to write the JSON.",
                              required=True)
_QUICK = flags.DEFINE_bool("quick", False, "The small model only.")

PATHS = {"graph": False, "xla": True, "elementwise": "elementwise"}
SETTINGS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.9, seed=3),
    "mixed": dict(temperature=[0.0, 1.0, 0.5, 2.0], seed=[1, 2, 3, 4]),
    "filters": dict(temperature=1.2, top_k=7, top_p=0.8, min_p=0.05, seed=5),
    "stops": dict(temperature=1.0, seed=6, stop=["E", "AB"]),
    "lookback": dict(temperature=0.8, seed=7, repetition_penalty=1.3,
                     repetition_window=8, no_repeat_ngram_size=3),
    "scores": dict(temperature=1.0, seed=8, return_scores=True, top_k=20),
}


def rows_of(setting, batch):
  """A setting whose per-row lists are cut or cycled to `batch` rows."""
  out = {}
  for key, value in setting.items():
    if isinstance(value, list) and key != "stop":
      value = [value[i % len(value)] for i in range(batch)]
    out[key] = value
  return out


def snapshot(model, prompts_pool, steps):
  out = {}
  for path, jit in PATHS.items():
    for name, setting in SETTINGS.items():
      for batch in (1, 4, 37):
        prompts = [prompts_pool[i % len(prompts_pool)] for i in range(batch)]
        kwargs = rows_of(setting, batch)
        out[f"{path}/{name}/generate/{batch}"] = rnnstep.generate(
            model, prompts, steps, jit_compile=jit, **kwargs)
      prompts = prompts_pool[:4]
      kwargs = rows_of(setting, 4)
      out[f"{path}/{name}/stream/4"] = list(rnnstep.stream(
          model, prompts, steps, chunk_size=7, jit_compile=jit, **kwargs))
    out[f"{path}/beams"] = rnnstep.generate(
        model, prompts_pool[:3], steps // 2, num_beams=4,
        num_return_sequences=2, stop="E", return_scores=True, jit_compile=jit)
    out[f"{path}/beams_lookback"] = rnnstep.generate(
        model, prompts_pool[:2], steps // 2, num_beams=3,
        repetition_penalty=1.2, no_repeat_ngram_size=2, jit_compile=jit)
  return out


def main(argv):
  del argv
  layers = [kr.layer("lstm", 32), kr.layer("gru", 24, False)]
  keras_model = kr.lively(kr.build(layers, seed=7, bias_scale=1.0))
  results = {}
  for dtype in ("float32", "bfloat16"):
    small = kr.rnnstep_model(keras_model, layers, dtype=dtype)
    results[f"small/{dtype}"] = snapshot(
        small, ["ROMEO: ", "A", "THE QUICK BROWN", "HELLO, Z"], 40)
    if not _QUICK.value:
      bundled = rnnstep.load(dtype=dtype)
      results[f"bundled/{dtype}"] = snapshot(
          bundled, ["ROMEO:", "First Citizen:\n", "K", "JULIET: O Romeo"], 60)
  pathlib.Path(_OUTPUT.value).write_text(
      json.dumps(results, indent=1, sort_keys=True, ensure_ascii=False))


if __name__ == "__main__":
  app.run(main)
