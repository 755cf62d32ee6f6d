"""The lanes section's child: every path as `rnnstep-serve`'s lanes run it.

Run as `python tools/bench/lanes_child.py SPEC_JSON` (the section writes the
spec: model file, dtype, lanes, rows per lane, characters, rounds, seed). A
fresh process, because TensorFlow's thread pools are fixed at its first op:
this one sets them as `rnnstep-serve` does with several lanes (one intra-op
thread, an inter-op thread a lane: `rnnstep/serve/main.py`'s `_threads`),
then times, per rows per lane and path, `lanes` concurrent
`rnnstep.generate` calls of those rows, each on a thread of its own (as each
lane's scheduler calls its programs), from the first call's start to the
last one's end, and the process's CPU seconds over the same span (on a
machine shared with other work a lane loses wall-clock time to it, but
hardly CPU time). Timed like the paths section (`timing.run_rounds`: a
warm-up of each job, then interleaved rounds; medians in the parent).
Prints one JSON line: {"samples": {"dtype rows path": [seconds per round]},
"cpu": {the same keys: [CPU seconds per round]}, "loadavg": [...],
"threads": [intra, inter]}.
"""

import json
import os
import sys
import threading
import time

# tools/ on the path, for the bench package.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from bench import timing
# pylint: enable=g-import-not-at-top,wrong-import-position


class Concurrent:
  """`lanes` concurrent `rnnstep.generate` calls, one thread each."""

  def __init__(self, model, lanes, num_chars, jit_compile):
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.generate = rnnstep.generate
    self.model = model
    self.lanes = lanes
    self.num_chars = num_chars
    self.jit_compile = jit_compile
    self.cpu_seconds = []  # Per call, warm-up calls included.

  def __call__(self, prompt_texts, seed):
    errors = []
    cpu = time.process_time()

    def lane(i):
      try:
        self.generate(self.model, list(prompt_texts), self.num_chars,
                      seed=seed + i, jit_compile=self.jit_compile)
      except Exception as e:  # pylint: disable=broad-except
        errors.append(e)

    threads = [threading.Thread(target=lane, args=(i,))
               for i in range(self.lanes)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    self.cpu_seconds.append(time.process_time() - cpu)
    if errors:
      raise errors[0]


def main(spec_path):
  with open(spec_path, encoding="utf-8") as f:
    spec = json.load(f)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  lanes = spec["lanes"]
  # rnnstep-serve's pools with several lanes (main.py `_threads`).
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(lanes)
  tf.random.set_seed(spec["seed"])
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  jobs = []
  for dtype in spec["dtypes"]:
    model = rnnstep.load(spec["model"], dtype=dtype)
    for rows in spec["rows"]:
      prompts = [spec["prompts"][i % len(spec["prompts"])]
                 for i in range(rows)]
      for path in spec["paths"]:
        jobs.append((f"{dtype} {rows} {path}",
                     Concurrent(model, lanes, spec["num_chars"],
                                paths.JIT_COMPILE[path]),
                     (prompts, spec["seed"])))
  samples, _ = timing.run_rounds(jobs, spec["rounds"], f"lanes x{lanes}")
  # run_rounds calls each job twice to warm it up, then once a round.
  cpu = {key: fn.cpu_seconds[2:] for key, fn, _ in jobs}
  print(json.dumps({"samples": samples, "cpu": cpu,
                    "loadavg": list(os.getloadavg()),
                    "threads": [
                        tf.config.threading.get_intra_op_parallelism_threads(),
                        tf.config.threading.get_inter_op_parallelism_threads()]
                    }))


if __name__ == "__main__":
  main(sys.argv[1])
