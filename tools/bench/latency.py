"""Section `latency`: time to first text in a fresh process."""

import json
import os
import statistics
import subprocess
import sys
import time

from bench import settings as cfg
from bench import timing
from bench import weights as weights_lib

# The child runs the entry script itself (`--latency_child`).
BENCHMARK = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "benchmark.py")


def latency_child():
  """Run in a fresh process: times import, load, first and second call."""
  t0 = time.time()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import
  t_tf = time.time()
  import rnnstep  # pylint: disable=g-import-not-at-top
  t_import = time.time()
  model = rnnstep.load(cfg.MODEL_FILE.value)
  t_load = time.time()
  jit = cfg.LATENCY_CHILD.value == "xla"
  num_chars = cfg.NUM_CHARS.value
  prompt = weights_lib.probe_prompt(model.vocab)
  rnnstep.generate(model, prompt, num_chars, seed=1, jit_compile=jit)
  t_first = time.time()
  rnnstep.generate(model, prompt, num_chars, seed=2, jit_compile=jit)
  t_second = time.time()
  print(json.dumps({"t0": t0, "import_tf": t_tf - t0,
                    "import_rnnstep": t_import - t_tf, "load": t_load - t_import,
                    "first_call": t_first - t_load, "second_call": t_second - t_first,
                    "t_first_text": t_first}))


def run(ctx, results_out):
  """Time to first text in fresh processes (graph and XLA)."""
  settings, weights, tmpdir = ctx.settings, ctx.weights, ctx.tmpdir
  path = os.path.join(tmpdir, "bench_model.npz")
  if not os.path.exists(path):
    weights.write(path)
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  runs = {}
  for _ in range(settings.latency_runs):
    for mode in ("graph", "xla"):
      cmd = [sys.executable, BENCHMARK, f"--latency_child={mode}",
             f"--model_file={path}", f"--num_chars={settings.num_chars}"]
      timing.log(f"[latency] fresh process, {mode} ...")
      start = time.time()
      proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                            check=False)
      end = time.time()
      if proc.returncode != 0:
        print(f"## first-call latency: child failed ({mode}):\n{proc.stderr[-2000:]}")
        return
      data = json.loads(proc.stdout.strip().splitlines()[-1])
      data["python_start"] = data["t0"] - start
      data["time_to_first_text"] = data["t_first_text"] - start
      data["process_wall"] = end - start
      runs.setdefault(mode, []).append(data)
  print(f"## first-call latency: fresh process, batch 1, {settings.num_chars} chars "
        f"(seconds; median of {settings.latency_runs})")
  keys = ["python_start", "import_tf", "import_rnnstep", "load", "first_call",
          "second_call", "time_to_first_text", "process_wall"]
  header = f"{'mode':<6} " + " ".join(f"{k:>12}" for k in
                                      ["py start", "import tf", "import rnnstep",
                                       "load", "1st call", "2nd call",
                                       "first text", "process"])
  print(header)
  print("-" * len(header))
  for mode, datas in runs.items():
    med = {k: statistics.median(d[k] for d in datas) for k in keys}
    print(f"{mode:<6} " + " ".join(f"{med[k]:>12.2f}" for k in keys))
    results_out.append({"section": "latency", "mode": mode, **med})
  print()
  print("1st call - 2nd call ~ trace (graph) or trace + XLA compile cost; "
        "first text: from process spawn to the first call's return")
  print()

