"""The latency section's TensorFlow child: a fresh process's phases, timed.

Run as `python tools/bench/tf_child.py MODEL_FILE NUM_CHARS PATH` (PATH:
graph or xla) in a fresh process. It imports TensorFlow and rnnstep (nothing
else of the benchmark, whose flags would import both before the clock
starts), loads the model file, and generates NUM_CHARS characters at batch 1
twice (the first call traces, and for XLA compiles). It prints one JSON line
of phase times.
"""

import json
import sys
import time


def main(argv):
  t0 = time.time()
  model_path, num_chars, path = argv[1], int(argv[2]), argv[3]
  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow as tf
  t_runtime = time.time()
  import rnnstep
  # pylint: enable=g-import-not-at-top,unused-import
  t_import = time.time()
  model = rnnstep.load(model_path)
  t_load = time.time()
  usable = [c for c in model.vocab if len(c) == 1 and c != "\n"]
  prompt = "".join(usable[(i * 7) % len(usable)] for i in range(10))
  jit_compile = {"graph": False, "xla": True}[path]
  rnnstep.generate(model, prompt, num_chars, seed=1, jit_compile=jit_compile)
  t_first = time.time()
  rnnstep.generate(model, prompt, num_chars, seed=2, jit_compile=jit_compile)
  t_second = time.time()
  print(json.dumps({"t0": t0, "import_runtime": t_runtime - t0,
                    "import_rnnstep": t_import - t_runtime,
                    "load": t_load - t_import, "first_call": t_first - t_load,
                    "second_call": t_second - t_first,
                    "t_first_text": t_first}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
