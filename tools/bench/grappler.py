"""The graph path with and without Grappler (`rnnstep/model/graph_calls.py`):
each model's first graph-path call in fresh processes, and its steps at one
and at several rows in one process, the two kinds of call alternated.

    python tools/bench/grappler.py                          # the bundled GRU
    python tools/bench/grappler.py --rwkv7=rwkv7.npz --processes=4

First calls: `--processes` pairs of fresh processes (each imports rnnstep,
loads the model, then times one 2-step greedy call with
`jit_compile=False`), the two kinds alternated, medians and ranges. Steps:
one process calls each kind once (the instantiations, untimed), then
alternates the kinds over `--rounds` rounds of a `--steps`-step sampled call
at each row count, medians in ms a step, and checks the two kinds' texts are
equal. "with Grappler" sets `graph_calls.ENABLED = False` (TensorFlow's
default call options); "without" is rnnstep's default.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

_RWKV7 = flags.DEFINE_string("rwkv7", None,
                             "An RWKV-7 .npz to measure besides the GRU.")
_PROCESSES = flags.DEFINE_integer("processes", 3,
                                  "Fresh processes per kind (first calls).")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Alternated rounds (steps).")
_CHILD = flags.DEFINE_string("child", None,
                             "first:<model>:<on|off> or steps:<model>.")

# (prompts at one row, rows for the many-row case, steps) per model kind.
CASES = {"gru": ("ROMEO:", 64, 300), "rwkv7": ("The quick brown fox", 8, 48)}
KINDS = {"with Grappler": False, "without (default)": True}


def _load(which):
  import rnnstep  # pylint: disable=g-import-not-at-top
  return rnnstep, rnnstep.load(None if which == "gru" else _RWKV7.value)


def _first(which, enabled):
  from rnnstep.model import graph_calls  # pylint: disable=g-import-not-at-top
  graph_calls.ENABLED = enabled
  rnnstep, model = _load(which)
  start = time.perf_counter()
  rnnstep.generate(model, CASES[which][0], 2, temperature=0.0,
                   jit_compile=False)
  print(json.dumps(dict(first=time.perf_counter() - start)), flush=True)


def _steps(which):
  from rnnstep.model import graph_calls  # pylint: disable=g-import-not-at-top
  rnnstep, model = _load(which)
  prompt, rows, steps = CASES[which]

  def call(enabled, prompts, n):
    graph_calls.ENABLED = enabled
    start = time.perf_counter()
    text = rnnstep.generate(model, prompts, n, temperature=0.8, seed=3,
                            jit_compile=False)
    return time.perf_counter() - start, text

  for enabled in KINDS.values():
    call(enabled, [prompt], 2)
  for prompts in ([prompt], [prompt] * rows):
    times = {kind: [] for kind in KINDS}
    texts = {}
    for r in range(_ROUNDS.value):
      order = list(KINDS.items())
      for kind, enabled in (order if r % 2 == 0 else order[::-1]):
        seconds, texts[kind] = call(enabled, prompts, steps)
        times[kind].append(seconds * 1000 / steps)
    print(json.dumps(dict(rows=len(prompts), times=times,
                          same_text=len(set(map(str, texts.values()))) == 1)),
          flush=True)


def _run_child(arg):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("RNNSTEP_DEFAULT_PATH", None)
  argv = [sys.executable, os.path.abspath(__file__), f"--child={arg}"]
  if _RWKV7.value:
    argv.append(f"--rwkv7={_RWKV7.value}")
  out = subprocess.run(argv, env=env, capture_output=True, text=True,
                       check=True).stdout
  return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _span(values, digits=2):
  return (f"{statistics.median(values):.{digits}f} "
          f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def main(argv):
  del argv
  if _CHILD.value:
    kind, which, *enabled = _CHILD.value.split(":")
    if kind == "first":
      _first(which, enabled == ["on"])
    else:
      _steps(which)
    return
  for which in ["gru"] + (["rwkv7"] if _RWKV7.value else []):
    firsts = {kind: [] for kind in KINDS}
    for p in range(_PROCESSES.value):
      order = list(KINDS.items())
      for kind, enabled in (order if p % 2 == 0 else order[::-1]):
        arg = f"first:{which}:{'on' if enabled else 'off'}"
        firsts[kind].append(_run_child(arg)[0]["first"])
    print(f"\n{which}: first graph-path call, s, median (range) of "
          f"{_PROCESSES.value} processes each")
    for kind, values in firsts.items():
      print(f"  {kind:18s} {_span(values)}")
    ratio = (statistics.median(firsts["without (default)"])
             / statistics.median(firsts["with Grappler"]))
    print(f"  without / with     {ratio:.2f}")
    print(f"{which}: ms a step, median (range) of {_ROUNDS.value} rounds")
    for row in _run_child(f"steps:{which}"):
      times = row["times"]
      without = statistics.median(times["without (default)"])
      with_ = statistics.median(times["with Grappler"])
      print(f"  {row['rows']:3d} rows: with {_span(times['with Grappler'])}, "
            f"without {_span(times['without (default)'])}, without / with "
            f"{without / with_:.3f}, same text {row['same_text']}")


if __name__ == "__main__":
  app.run(main)
