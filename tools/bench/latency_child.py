"""The latency section's child: one fresh process's phases, timed.

Run as `python tools/bench/latency_child.py MODE MODEL_FILE NUM_CHARS` in a
fresh process. It imports only what its mode times (the benchmark's own flags
would import TensorFlow and rnnstep before the clock starts) and prints one
JSON line of phase times:

  - graph, xla: import TensorFlow, then rnnstep; load the model file;
    generate NUM_CHARS characters at batch 1 twice (the first call traces,
    and for XLA compiles).
  - litert: what a warm `rnnstep-generate` does, in a process whose
    $RNNSTEP_CACHE_DIR holds a valid compiled-artifact entry for MODEL_FILE
    (the section builds it first): import numpy and ai_edge_litert, then the
    cache module; find and verify the entry (the model file's sha256, the
    manifest, the flatbuffer's sha256); generate twice. It refuses to report
    if TensorFlow was imported on the way.
"""

import json
import os
import sys
import time

# tools/ on the path, for the benchmark's prompt (bench/weights.py imports
# nothing heavy at its top).
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.weights import probe_prompt  # pylint: disable=g-import-not-at-top,wrong-import-position


def _tensorflow(path, model_path, num_chars, clock):
  """The library's graph or XLA path; `clock(phase)` marks each phase's end."""
  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow as tf
  clock("import_runtime")
  import rnnstep
  # pylint: enable=g-import-not-at-top,unused-import
  clock("import_rnnstep")
  model = rnnstep.load(model_path)
  clock("load")
  jit_compile = {"graph": False, "xla": True}[path]
  for seed, phase in ((1, "first_call"), (2, "second_call")):
    rnnstep.generate(model, probe_prompt(model.vocab), num_chars, seed=seed,
                     jit_compile=jit_compile)
    clock(phase)


def _litert(model_path, num_chars, clock):
  """The warm command line's fast path: the cached artifact, no TensorFlow."""
  # pylint: disable=g-import-not-at-top,unused-import
  import numpy as np
  from ai_edge_litert import interpreter
  clock("import_runtime")
  from rnnstep.litert import cache as compiled_cache
  from rnnstep.litert import runner as litert_runner
  # pylint: enable=g-import-not-at-top,unused-import
  clock("import_rnnstep")
  key = compiled_cache.key(model_path, compiled_cache.runtime_version())
  flatbuffer, manifest = compiled_cache.lookup(key)
  clock("load")
  vocab = manifest["vocab"]
  for seed, phase in ((1, "first_call"), (2, "second_call")):
    litert_runner.run_artifact(flatbuffer, vocab, [probe_prompt(vocab)],
                               num_chars, temperature=1.0, top_k=0, top_p=1.0,
                               seed=seed)
    clock(phase)
  if "tensorflow" in sys.modules:
    raise RuntimeError("the fast path imported TensorFlow")


def main(argv):
  t0 = time.time()
  mode, model_path, num_chars = argv[1], argv[2], int(argv[3])
  marks = [("t0", t0)]

  def clock(phase):
    marks.append((phase, time.time()))

  if mode == "litert":
    _litert(model_path, num_chars, clock)
  else:
    _tensorflow(mode, model_path, num_chars, clock)
  # Each phase's seconds since the mark before it; t0 and the first text's
  # moment as clock times, for the parent's process-start arithmetic.
  phases = {name: end - start
            for (_, start), (name, end) in zip(marks, marks[1:])}
  print(json.dumps({**phases, "t0": t0,
                    "t_first_text": dict(marks)["first_call"]}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
