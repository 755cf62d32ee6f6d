"""The latency section's fast-path child: rnnstep-generate's warm path, timed.

Run as `python tools/bench/litert_child.py MODEL_FILE NUM_CHARS` in a fresh
process whose $RNNSTEP_CACHE_DIR holds a valid compiled-artifact entry for
MODEL_FILE (the section builds it first). It does what a warm
`rnnstep-generate` does, phase by phase: import the runtime (numpy and
ai_edge_litert, no TensorFlow), import the cache module, find and verify the
entry (the model file's sha256, the manifest, the flatbuffer's sha256), then
generate twice. It prints one JSON line of phase times, and refuses to report
if TensorFlow was imported on the way.
"""

import json
import sys
import time


def main(argv):
  t0 = time.time()
  model_path, num_chars = argv[1], int(argv[2])
  # pylint: disable=g-import-not-at-top,unused-import
  import numpy as np
  from ai_edge_litert import interpreter
  t_runtime = time.time()
  from rnnstep.cli import compiled_cache
  # pylint: enable=g-import-not-at-top,unused-import
  t_import = time.time()
  key = compiled_cache.key(model_path, compiled_cache.runtime_version())
  flatbuffer, manifest = compiled_cache.lookup(key)
  t_load = time.time()
  vocab = manifest["vocab"]
  usable = [c for c in vocab if len(c) == 1 and c != "\n"] or [vocab[-1]]
  prompt = "".join(usable[(i * 7) % len(usable)] for i in range(10))
  for seed in (1, 2):
    compiled_cache.run_artifact(flatbuffer, vocab, [prompt], num_chars,
                                temperature=1.0, top_k=0, top_p=1.0, seed=seed)
    if seed == 1:
      t_first = time.time()
  t_second = time.time()
  if "tensorflow" in sys.modules:
    print("the fast path imported TensorFlow", file=sys.stderr)
    return 1
  print(json.dumps({"t0": t0, "import_runtime": t_runtime - t0,
                    "import_rnnstep": t_import - t_runtime,
                    "load": t_load - t_import, "first_call": t_first - t_load,
                    "second_call": t_second - t_first,
                    "t_first_text": t_first}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
