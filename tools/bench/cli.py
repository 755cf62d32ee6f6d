"""Section `cli`: `rnnstep-generate` end-to-end wall time and peak RSS.

Rows: the TensorFlow paths (--nojit_compile, --jit_compile, and the library's
default with --nocache), then the compiled-artifact cache
(rnnstep/cli/compiled_cache.py) in a fresh cache directory: "cold" is the
first run (TensorFlow, then a detached export), "warm" the runs after the
export is in place (LiteRT, no TensorFlow import).
"""

import json
import os
import shutil
import statistics
import subprocess
import tempfile
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
  cache_dir = tempfile.mkdtemp(prefix="bench_cli_cache_", dir=tmpdir)
  env = dict(os.environ, RNNSTEP_CACHE_DIR=cache_dir)
  print(f"## CLI end-to-end: rnnstep-generate --num_steps={settings.num_chars}, "
        f"{what} (median of {settings.cli_runs}: wall seconds, peak RSS MB)")
  base = [exe, f"--num_steps={settings.num_chars}", "--seed=1", *model_args]
  rows = [("--nojit_compile", ["--nojit_compile"]),
          ("--jit_compile", ["--jit_compile"]),
          ("--nocache (default)", ["--nocache"])]
  for label, extra in rows:
    _row(label, base + extra, env, settings.cli_runs, what, results_out)
  # The cache: one cold run, the wait for its background export, warm runs.
  _row("cache cold", base, env, 1, what, results_out)
  if _wait_for_entry(cache_dir):
    _row("cache warm", base + ["--verbose"], env, settings.cli_runs, what,
         results_out, expect="fast path")
  else:
    print("  cache warm: skipped (no compiled artifact appeared in 600 s)")
  print()


def _run(cmd, env):
  """(wall seconds, peak RSS MB or None, returncode, stderr) of one run.

  The peak RSS comes from /usr/bin/time (GNU time's %M) where it exists: the
  rusage of a child forked from this process would count this process's own
  pages from before its exec.
  """
  time_binary = shutil.which("time", path="/usr/bin:/bin")
  rss_file = None
  if time_binary:
    fd, rss_file = tempfile.mkstemp(suffix=".rss")
    os.close(fd)
    cmd = [time_binary, "-f", "%M", "-o", rss_file, *cmd]
  start = time.time()
  proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        env=env, text=True, check=False)
  seconds = time.time() - start
  peak = None
  if rss_file:
    with open(rss_file, encoding="utf-8") as f:
      text = f.read().strip().splitlines()
    os.unlink(rss_file)
    peak = int(text[-1]) / 1024 if text and text[-1].isdigit() else None
  return seconds, peak, proc.returncode, proc.stderr


def _row(label, cmd, env, runs, what, results_out, expect=None):
  times, peaks = [], []
  for _ in range(runs):
    timing.log(f"[cli] {' '.join(cmd[1:])}")
    seconds, peak, returncode, stderr = _run(cmd, env)
    if returncode != 0 or (expect and expect not in stderr):
      print(f"  {label}: failed: {stderr.strip()[-500:]}")
      return
    times.append(seconds)
    peaks.append(peak)
  peak = (statistics.median(peaks) if None not in peaks else None)
  print(f"  {label:<22} {statistics.median(times):6.2f} s "
        + (f"{peak:7.0f} MB" if peak is not None else "      ? MB"))
  results_out.append({"section": "cli", "mode": label,
                      "wall_seconds": statistics.median(times),
                      "peak_rss_mb": peak,
                      "runs": times, "model": what})


def _wait_for_entry(cache_dir, timeout=600):
  """Whether a manifest with an artifact appears under `cache_dir`."""
  directory = os.path.join(cache_dir, "litert")
  deadline = time.time() + timeout
  while time.time() < deadline:
    for name in (os.listdir(directory) if os.path.isdir(directory) else []):
      if name.endswith(".json") and not name.startswith("."):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
          return "tflite_sha256" in json.load(f)
    time.sleep(1)
  return False
