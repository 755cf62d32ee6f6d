"""What each XLA program of a model keeps resident, and what a call costs.

    PYTHONPATH=<tree> python tools/bench/program_memory.py --model=m.npz \\
        [--weights_dtype=float16] [--rows=1,2,64]

In one process: `rnnstep.load`, then one XLA generation (`jit_compile=True`,
2 steps from a 3-id prompt) at each batch size of --rows, each compiling
(or loading from XLA's disk cache) a program of its own; after the load and
after each program, the resident memory once glibc has given back what it
can (`malloc_trim`). Then, at batch 1, the median of 3 calls of 1 step
(a 3-id prompt, and a 64-id one) and the decode time a token (33 steps
less 1, over 32). Pair trees (`PYTHONPATH=`) under `flock /tmp/bench.lock`
(benchmarks/results/rwkv7-program-arguments-xeon-amx-2026-12.md).
"""

import argparse
import ctypes
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import rnnstep  # pylint: disable=g-import-not-at-top

_LIBC = ctypes.CDLL("libc.so.6")


def resident_gb() -> float:
  _LIBC.malloc_trim(0)
  with open("/proc/self/status") as status:
    for line in status:
      if line.startswith("VmRSS"):
        return int(line.split()[1]) * 1024 / 1e9
  raise RuntimeError("no VmRSS in /proc/self/status")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", required=True)
  parser.add_argument("--weights_dtype", default="float32")
  parser.add_argument("--rows", default="1,2,64")
  args = parser.parse_args()
  model = rnnstep.load(args.model, weights_dtype=args.weights_dtype)
  out = [f"{os.path.dirname(rnnstep.__file__)} {args.weights_dtype} "
         f"loaded {resident_gb():.2f} GB"]
  for rows in (int(r) for r in args.rows.split(",")):
    rnnstep.generate(model, [[1, 2, 3]] * rows, 2, jit_compile=True)
    out.append(f"b{rows} {resident_gb():.2f}")

  def seconds(steps, prompt=(1, 2, 3)):
    times = []
    for _ in range(3):
      start = time.perf_counter()
      rnnstep.generate(model, [list(prompt)], steps, jit_compile=True)
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  one, many = seconds(1), seconds(33)
  out.append(f"| a 1-step call {one * 1000:.0f} ms, from 64 ids "
             f"{seconds(1, range(1, 65)) * 1000:.0f} ms | decode "
             f"{(many - one) / 32 * 1000:.1f} ms a token")
  print(" ".join(out), flush=True)


if __name__ == "__main__":
  main()
