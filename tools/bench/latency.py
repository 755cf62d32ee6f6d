"""Section `latency`: time to first text in a fresh process, phase by phase.

Three ways a fresh process generates: the library's graph and XLA paths
(TensorFlow imported, the loop traced, and compiled for XLA), and the fast
path a warm `rnnstep-generate` takes (`latency_child.py litert`: the cached
LiteRT artifact, no TensorFlow).
"""

import json
import os
import statistics
import subprocess
import sys
import time

from bench import timing

# Each mode's child imports only what it times (the benchmark's own flags
# import TensorFlow and rnnstep).
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "latency_child.py")
MODES = ("graph", "xla", "litert")


def run(ctx, results_out):
  """Time to first text in fresh processes (graph and XLA)."""
  settings, weights, tmpdir = ctx.settings, ctx.weights, ctx.tmpdir
  path = os.path.join(tmpdir, "bench_model.npz")
  if not os.path.exists(path):
    weights.write(path)
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  modes = list(MODES)
  refusal = _fill_artifact(path, env, os.path.join(tmpdir, "latency_cache"))
  if refusal:
    print(f"## first-call latency: the fast path is left out: {refusal}")
    modes.remove("litert")
  runs = {}
  for _ in range(settings.latency_runs):
    for mode in modes:
      cmd = [sys.executable, CHILD, mode, path, str(settings.num_chars)]
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
  keys = ["python_start", "import_runtime", "import_rnnstep", "load", "first_call",
          "second_call", "time_to_first_text", "process_wall"]
  header = f"{'mode':<6} " + " ".join(f"{k:>12}" for k in
                                      ["py start", "import rt", "import rnnstep",
                                       "load", "1st call", "2nd call",
                                       "first text", "process"])
  print(header)
  print("-" * len(header))
  for mode, datas in runs.items():
    med = {k: statistics.median(d[k] for d in datas) for k in keys}
    print(f"{mode:<6} " + " ".join(f"{med[k]:>12.2f}" for k in keys))
    results_out.append({"section": "latency", "mode": mode, **med})
  print()
  print("import rt: TensorFlow (graph, xla) or numpy + ai_edge_litert "
        "(litert, no TensorFlow); load: the model file (litert: hash it, find "
        "and verify the cached artifact); 1st call - 2nd call ~ trace (graph), "
        "trace + XLA compile (xla), interpreter set-up (litert); first text: "
        "from process spawn to the first call's return")
  print()


def _fill_artifact(model_path, env, cache_dir):
  """Builds rnnstep-generate's cached artifact for the fast path's child.

  Sets RNNSTEP_CACHE_DIR in `env` to `cache_dir`. Returns None, or why the
  fast path cannot be timed (no ai_edge_litert, a model it cannot export).
  """
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  runtime = compiled_cache.runtime_version()
  if runtime is None:
    return "ai_edge_litert is not installed"
  env["RNNSTEP_CACHE_DIR"] = cache_dir
  env["RNNSTEP_COMPILED_CACHE"] = "on"
  os.makedirs(os.path.join(cache_dir, compiled_cache.SUBDIR), exist_ok=True)
  timing.log("[latency] building the compiled artifact ...")
  key = json.dumps(compiled_cache.key(model_path, runtime), sort_keys=True)
  proc = subprocess.run(
      [sys.executable, "-m", "rnnstep.litert.fill", model_path, key],
      capture_output=True, text=True, env=env, check=False)
  if proc.stdout.strip() != "built":
    return f"building it said {(proc.stdout + proc.stderr).strip()[-300:]!r}"
  return None

