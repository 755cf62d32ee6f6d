"""Long generation runs with bounded memory: peak RSS for long and wide outputs.

Usage (from the repo root):
  python tools/long_run.py                      # the issue's two runs, tutorial size
  python tools/long_run.py --steps=20000 --batch=1 --stream_chunk=4096

Each run is a fresh subprocess so its peak RSS (ru_maxrss) is its own. Reports
wall time, characters per second and peak RSS, plus the RSS right after loading
(the baseline TensorFlow + weights cost) for comparison.
"""

import json
import subprocess
import sys
import time

from absl import app
from absl import flags

_RUNS = flags.DEFINE_multi_string(
    "run", ["1x200000", "512x10000"], "BATCHxSTEPS runs to make.")
_UNITS = flags.DEFINE_integer("units", 1024, "GRU units (tutorial: 1024).")
_STREAM_CHUNK = flags.DEFINE_integer(
    "stream_chunk", 0, "If > 0, also make each run streamed in chunks of this size.")
_JIT = flags.DEFINE_bool("jit_compile", True, "Use XLA.")

CHILD = r"""
import json, resource, sys, time
import numpy as np
import rnnstep
from rnnstep.model import model_file
from rnnstep.model import network as model
batch, steps, units, chunk, jit = (int(a) for a in sys.argv[1:6])
rng = np.random.default_rng(0)
config = model_file.ModelConfig(256, (model_file.LayerConfig("gru", units, True),))
vocab = [chr(32 + i) for i in range(65)]
tensors = {k: (rng.standard_normal(s) / np.sqrt(s[0] if len(s) > 1 else 1)).astype(
    np.float32) for k, s in config.expected_shapes(65).items()}
m = model.Model(config, vocab, tensors)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
loaded = rss()
start = time.perf_counter()
prompts = ["ROMEO: "] * batch
if chunk:
  total = 0
  for pieces in rnnstep.stream(m, prompts, steps, chunk_size=chunk, seed=1,
                               jit_compile=bool(jit)):
    total += sum(len(p) for p in pieces)   # consumed and dropped, as a writer would
else:
  total = sum(len(t) for t in rnnstep.generate(m, prompts, steps, seed=1,
                                               jit_compile=bool(jit)))
seconds = time.perf_counter() - start
print(json.dumps(dict(batch=batch, steps=steps, streamed=bool(chunk), chars=total,
                      seconds=round(seconds, 2), chars_per_s=round(total / seconds),
                      rss_after_load_mb=round(loaded), peak_rss_mb=round(rss()))))
"""


def main(argv):
  del argv
  for spec in _RUNS.value:
    batch, steps = (int(x) for x in spec.split("x"))
    for chunk in ([0, _STREAM_CHUNK.value] if _STREAM_CHUNK.value else [0]):
      start = time.time()
      out = subprocess.run([sys.executable, "-c", CHILD, str(batch), str(steps),
                            str(_UNITS.value), str(chunk), str(int(_JIT.value))],
                           capture_output=True, text=True)
      if out.returncode:
        print(f"{spec} failed:\n{out.stderr[-2000:]}")
        continue
      result = json.loads(out.stdout.strip().splitlines()[-1])
      result["process_seconds"] = round(time.time() - start, 1)
      print(json.dumps(result), flush=True)


if __name__ == "__main__":
  app.run(main)
