"""Section `lanes`: every path as one of `rnnstep-serve`'s lanes runs it.

The evidence for `paths.LANE_PATHS`: a server on a CPU runs its slots in
lanes, one a core, each calling its programs on one thread while the others
run theirs (rnnstep/serve/lanes.py). The paths section measures one call on
TensorFlow's own threads; this one runs `--lanes` concurrent
`rnnstep.generate` calls of the same rows, one thread each, in a child
process with the server's thread pools (`lanes_child.py`), for each of
`--lane_rows` rows a lane, float32 and each `--dtype`. It reports wall-clock
ms per 1000 steps of the lanes together (median), the fastest path, the
lane table's and the library table's choices, and CPU seconds per 1,000
characters (what other work on the machine inflates least).
"""

import json
import os
import statistics
import subprocess
import sys

from bench import settings as cfg
from bench import timing
from bench import weights as weights_lib

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "lanes_child.py")


def run(ctx, results_out):
  """Times every path at each rows a lane, `settings.lanes` lanes at once."""
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  settings, weights, tmpdir = ctx.settings, ctx.weights, ctx.tmpdir
  model_path = settings.weights_path or os.path.join(tmpdir,
                                                     "bench_model.npz")
  if not os.path.exists(model_path):
    weights.write(model_path)
  _, prompts = weights_lib.make_prompts(weights, max(settings.lane_rows),
                                        settings.prompt_len, settings.seed)
  dtypes = ["float32", *settings.dtypes]
  spec = dict(model=model_path, dtypes=dtypes, lanes=settings.lanes,
              rows=settings.lane_rows, paths=list(cfg.PATHS),
              num_chars=settings.path_chars, rounds=settings.rounds,
              seed=settings.seed, prompts=prompts)
  spec_path = os.path.join(tmpdir, "lanes_spec.json")
  with open(spec_path, "w", encoding="utf-8") as f:
    json.dump(spec, f)
  timing.log(f"[lanes] child: {settings.lanes} lanes, rows "
             f"{settings.lane_rows} ...")
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  proc = subprocess.run([sys.executable, CHILD, spec_path], env=env,
                        stdout=subprocess.PIPE, check=False, text=True)
  if proc.returncode != 0:
    print(f"## lanes: the child failed (exit {proc.returncode})")
    return
  data = json.loads(proc.stdout.strip().splitlines()[-1])
  steps = settings.path_chars
  print(f"## lanes: {settings.lanes} concurrent calls, one thread each "
        f"(threads intra/inter {data['threads'][0]}/{data['threads'][1]}), "
        f"ms per 1000 steps (median; {steps} chars per row), the fastest, "
        "the lane table's path and the library table's (one call on every "
        "core)")
  header = (f"{'dtype':<9} {'rows':>5} "
            + " ".join(f"{p:>11}" for p in cfg.PATHS)
            + f" {'fastest':>11} {'lane':>11} {'x fastest':>9} "
            f"{'library':>11} {'x fastest':>9} {'cpu s/1k':>9}")
  print(header)
  print("-" * len(header))
  for dtype in dtypes:
    for rows in settings.lane_rows:
      key = lambda p: f"{dtype} {rows} {p}"  # pylint: disable=cell-var-from-loop
      per_1000 = {p: statistics.median(data["samples"][key(p)]) * 1e3 / steps
                  for p in cfg.PATHS}
      chars = settings.lanes * rows * steps
      cpu = {p: statistics.median(data["cpu"][key(p)]) * 1e3 / chars
             for p in cfg.PATHS}
      fastest = min(per_1000, key=per_1000.get)
      lane = paths.lane_table_path(dtype, rows)
      library = paths.table_path(dtype, rows)
      print(f"{dtype:<9} {rows:>5} "
            + " ".join(f"{timing.fmt_ms(per_1000[p]):>11}" for p in cfg.PATHS)
            + f" {fastest:>11} {lane:>11} "
            f"{per_1000[lane] / per_1000[fastest]:>9.2f} {library:>11} "
            f"{per_1000[library] / per_1000[fastest]:>9.2f} "
            + "/".join(f"{cpu[p]:.3f}" for p in cfg.PATHS))
      results_out.append({
          "section": "lanes", "dtype": dtype, "rows": rows,
          "lanes": settings.lanes,
          "ms_per_1000_steps": {p: v * 1e3 for p, v in per_1000.items()},
          "cpu_seconds_per_1000_chars": cpu, "fastest": fastest,
          "lane_table": lane, "library_table": library})
  print(f"(cpu s/1k: the process's CPU seconds per 1,000 characters, "
        f"{'/'.join(cfg.PATHS)}; load average at the child's end "
        f"{' '.join(f'{x:.2f}' for x in data['loadavg'])})")
  print()
