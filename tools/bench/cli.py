"""Section `cli`: `rnnstep-generate` end-to-end wall time."""

import os
import shutil
import statistics
import subprocess
import time

from bench import timing
from bench import weights as weights_lib


def run(ctx, results_out):
  """`rnnstep-generate` end to end, wall time."""
  settings, weights, tmpdir = ctx.settings, ctx.weights, ctx.tmpdir
  exe = shutil.which("rnnstep-generate")
  if exe is None:
    print("## CLI: skipped (rnnstep-generate is not on PATH)\n")
    return
  import rnnstep  # pylint: disable=g-import-not-at-top
  bundled = rnnstep.bundled_model_path()
  if os.path.exists(bundled):
    model_args, what = [], f"bundled model {os.path.basename(bundled)}"
  else:
    path = os.path.join(tmpdir, "bench_model.npz")
    if not os.path.exists(path):
      weights.write(path)
    model_args = [f"--weights={path}"]
    what = "the benchmark's model (no bundled model is installed)"
    if not set("ROMEO:") <= set(weights.vocab):
      model_args.append(f"--prompt={weights_lib.probe_prompt(weights.vocab, 6)}")
  env = dict(os.environ)
  print(f"## CLI end-to-end: rnnstep-generate --num_steps={settings.num_chars}, "
        f"{what} (wall seconds, median of {settings.cli_runs})")
  for jit in ("--nojit_compile", "--jit_compile", None):
    cmd = [exe, f"--num_steps={settings.num_chars}", "--seed=1", *model_args]
    if jit:
      cmd.append(jit)
    times = []
    for _ in range(settings.cli_runs):
      timing.log(f"[cli] {' '.join(cmd[1:])}")
      start = time.time()
      proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                            check=False)
      times.append(time.time() - start)
      if proc.returncode != 0:
        print(f"  {jit or '(default)'}: failed: {proc.stderr.strip()[-500:]}")
        break
    else:
      label = jit or "(library default)"
      print(f"  {label:<18} {statistics.median(times):6.2f} s")
      results_out.append({"section": "cli", "mode": label,
                          "wall_seconds": statistics.median(times),
                          "runs": times, "model": what})
  print()

