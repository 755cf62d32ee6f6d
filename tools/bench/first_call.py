"""A new shape's first call against the warm graph-path call of that shape
(issue 60's done-when: "the bundled GRU: a new bucket's first call <=1.5x
its warm graph-path call", with the defaults users get).

    python tools/bench/first_call.py                 # 3 fresh processes
    python tools/bench/first_call.py --processes=5 --rnnstep=/path/to/tree

Each process (a child of this one, `--child`) starts as a new user's: an
empty cache folder (`RNNSTEP_CACHE_DIR`, a temporary one: no XLA program on
disk, no tuning), `RNNSTEP_DEFAULT_PATH` unset, the bundled model, greedy.
It warms up on one row (the graph path traced, that bucket's XLA program
compiled), then for each case: the first call with `jit_compile=None`;
after the background compiles are done, the median of 5 calls with
`jit_compile=False` (the warm graph path) and of 3 with `jit_compile=None`
(the settled default). The cases: the issue's buckets (prompt length,
batch, steps) and one batch in each band of this CPU's table
(`paths.FASTEST_PATHS`; the elementwise band and the padding rule's), then
scoring's first call of a new batch size (`rnnstep.loglikelihood`, whose
default on a CPU is the elementwise path) against its warm graph call, and
the graph path's own first call at a shape it had not run (one character
longer).

Prints each case's ratio first / warm graph as the median over processes
and its range, with the path `jit_compile=None` took.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_PROCESSES = flags.DEFINE_integer("processes", 3, "Fresh processes.")
_RNNSTEP = flags.DEFINE_string(
    "rnnstep", os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))),
    "The source tree whose rnnstep the processes import.")
_CHILD = flags.DEFINE_bool("child", False, "Run the cases (one process).")

PROMPT = "ROMEO: " * 3
# (name, prompts, steps): the buckets, then a batch per band.
GENERATE_CASES = [
    ("prompt 6", ["ROMEO:"], 100),
    ("prompt 27", ["ROMEO: ROMEO: ROMEO: ROMEO"], 100),
    ("batch 2", [PROMPT] * 2, 100),
    ("batch 13", [PROMPT] * 13, 100),
    ("77 steps", [PROMPT], 77),
    ("prompt 300", ["ROMEO: " * 43], 100),
    ("batch 40", [PROMPT] * 40, 100),
    ("batch 65", [PROMPT] * 65, 100),
    ("batch 96", [PROMPT] * 96, 100),
]
SCORE_CASES = [
    ("score batch 7", [("ROMEO: ", "x" * 20)] * 7),
    ("score batch 40", [("ROMEO: ", "x" * 20)] * 40),
]


def _child():
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import compiling  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(rnnstep.bundled_model_path())

  def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start

  def measure(name, path, run, graph_first=None):
    # Scoring's graph path pays a first call of its own at a new shape:
    # timed on a sibling shape that nothing ran before.
    graph_first = None if graph_first is None else timed(graph_first)
    first = timed(lambda: run(None))
    compiling.wait_idle()
    graph = statistics.median(timed(lambda: run(False)) for _ in range(5))
    settled = statistics.median(timed(lambda: run(None)) for _ in range(3))
    print(json.dumps(dict(case=name, path=path, first=first, graph=graph,
                          settled=settled, graph_first=graph_first)),
          flush=True)

  warm_up = lambda: rnnstep.generate(model, PROMPT, 100, temperature=0.0)
  warm_up()
  compiling.wait_idle()
  warm_up()
  for name, prompts, steps in GENERATE_CASES:
    measure(name, paths.default_path(model, len(prompts)),
            lambda jit, p=prompts, s=steps: rnnstep.generate(
                model, p, s, temperature=0.0, jit_compile=jit))
  rnnstep.loglikelihood(model, [("ROMEO: ", "x")], jit_compile=False)
  rnnstep.loglikelihood(model, [("ROMEO: ", "x")])
  compiling.wait_idle()
  for name, pairs in SCORE_CASES:
    sibling = [(context, text + "y") for context, text in pairs]
    measure(name, "elementwise (scoring)",
            lambda jit, p=pairs: rnnstep.loglikelihood(model, p,
                                                       jit_compile=jit),
            lambda p=sibling: rnnstep.loglikelihood(model, p,
                                                    jit_compile=False))


def main(argv):
  del argv
  if _CHILD.value:
    _child()
    return
  rows = {}
  for process in range(_PROCESSES.value):
    with tempfile.TemporaryDirectory(prefix="rnnstep_first_call_") as folder:
      env = dict(os.environ, RNNSTEP_CACHE_DIR=folder, TF_XLA_FLAGS="",
                 PYTHONPATH=_RNNSTEP.value, TF_CPP_MIN_LOG_LEVEL="2")
      env.pop("RNNSTEP_DEFAULT_PATH", None)
      out = subprocess.run(
          [sys.executable, os.path.abspath(__file__), "--child"], env=env,
          capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
      if line.startswith("{"):
        row = json.loads(line)
        rows.setdefault(row["case"], []).append(row)
        print(f"process {process}: {row['case']:15s} {row['path']:22s} "
              f"first {row['first']:.3f} s, warm graph {row['graph']:.3f} "
              f"s, settled default {row['settled']:.3f} s", flush=True)
  print("\n| case | jit_compile=None | first / warm graph, median (range) "
        "| first s | warm graph s | settled default s | graph's own first "
        "call s |\n|---|---|---|---|---|---|---|")
  for case, found in rows.items():
    ratios = [r["first"] / r["graph"] for r in found]
    median = lambda key: statistics.median(r[key] for r in found)
    own = ("-" if found[0]["graph_first"] is None
           else f"{median('graph_first'):.3f}")
    print(f"| {case} | {found[0]['path']} | "
          f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-"
          f"{max(ratios):.2f}) | {median('first'):.3f} | "
          f"{median('graph'):.3f} | {median('settled'):.3f} | {own} |")


if __name__ == "__main__":
  app.run(main)
