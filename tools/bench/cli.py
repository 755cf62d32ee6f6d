"""Section `cli`: `rnnstep-generate` end-to-end wall time and peak RSS.

Rows: the TensorFlow paths (--nojit_compile, --jit_compile), then paired
rounds (A B C D, A B C D, ...) of four whole processes on the same weights:
the TF tutorial's own generation script (tools/bench/tutorial_script.py:
Keras 3, OneStep), rnnstep-generate on TensorFlow (--nocache), and the
compiled-artifact cache (rnnstep/litert/cache.py) in a fresh cache
directory each round: "cold" is its first run (TensorFlow, then a detached
export, which is waited for before the next timed run), "warm" the run after
the export is in place (LiteRT, no TensorFlow import), then warm runs with
decoding options (`WARM_OPTIONS`: each of --stop, --regex, the penalties,
the n-gram ban, min-p, typical-p alone, and all six together). Each row's
ratio to the tutorial's script is the median of the per-round ratios.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench import timing
from bench import weights as weights_lib

TUTORIAL_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               "tutorial_script.py")


# The warm runs with decoding options (one artifact serves them all): each
# option alone, then all together.
WARM_OPTIONS = {
    "--stop": ["--stop=\n\n"],
    "--regex": ["--regex=[A-Za-z ,.;:'!?\n-]+"],
    "--repetition_penalty": ["--repetition_penalty=1.3"],
    "--no_repeat_ngram_size": ["--no_repeat_ngram_size=3"],
    "--min_p": ["--min_p=0.05"],
    "--typical_p": ["--typical_p=0.9"],
}
WARM_OPTIONS["all six"] = [f for flags in WARM_OPTIONS.values() for f in flags]


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
  model_path = bundled if not model_args else model_args[0].split("=", 1)[1]
  prompts = [a.split("=", 1)[1] for a in model_args if a.startswith("--prompt")]
  env = dict(os.environ,
             RNNSTEP_CACHE_DIR=tempfile.mkdtemp(prefix="bench_cli_", dir=tmpdir))
  print(f"## CLI end-to-end: rnnstep-generate --num_steps={settings.num_chars}, "
        f"{what} (median of {settings.cli_runs}: wall seconds, peak RSS MB)")
  base = [exe, f"--num_steps={settings.num_chars}", "--seed=1", *model_args]
  for label, extra in (("--nojit_compile", ["--nojit_compile"]),
                       ("--jit_compile", ["--jit_compile"])):
    _row(label, base + extra, env, settings.cli_runs, what, results_out)
  tutorial = [sys.executable, TUTORIAL_SCRIPT, model_path,
              str(settings.num_chars), *prompts[:1]]
  labels = ("tutorial OneStep script", "--nocache (TF path)", "cache cold",
            "cache warm") + tuple(f"warm {name}" for name in WARM_OPTIONS)
  runs = {label: [] for label in labels}
  for _ in range(settings.cli_runs):
    cache_env = dict(env, RNNSTEP_CACHE_DIR=tempfile.mkdtemp(
        prefix="bench_cli_cache_", dir=tmpdir))
    warm = [(f"warm {name}", base + flags + ["--verbose"], cache_env,
             "fast path") for name, flags in WARM_OPTIONS.items()]
    for label, cmd, run_env, expect in (
        (labels[0], tutorial, env, None),
        (labels[1], base + ["--nocache"], env, None),
        (labels[2], base, cache_env, None),
        (labels[3], base + ["--verbose"], cache_env, "fast path"), *warm):
      if label == labels[3] and not _wait_for_entry(
          cache_env["RNNSTEP_CACHE_DIR"]):
        print("  cache warm: skipped (no compiled artifact appeared in 600 s)")
        break
      timing.log(f"[cli] {label}")
      seconds, peak, returncode, stderr = _run(cmd, run_env)
      if returncode != 0 or (expect and expect not in stderr):
        print(f"  {label}: failed: {stderr.strip()[-500:]}")
        continue
      runs[label].append((seconds, peak))
    # The cold run's export must not overlap the next round's timings.
    _wait_for_entry(cache_env["RNNSTEP_CACHE_DIR"])
  script = [seconds for seconds, _ in runs[labels[0]]]
  for label in labels:
    if not runs[label]:
      continue
    times = [seconds for seconds, _ in runs[label]]
    peaks = [peak for _, peak in runs[label]]
    peak = statistics.median(peaks) if None not in peaks else None
    ratio = (statistics.median(t / s for t, s in zip(times, script))
             if len(script) == len(times) else None)
    print(f"  {label:<28} {statistics.median(times):6.2f} s "
          + (f"{peak:7.0f} MB" if peak is not None else "      ? MB")
          + (f"   {ratio:5.2f}x the tutorial's script" if ratio else ""))
    results_out.append({"section": "cli", "mode": label,
                        "wall_seconds": statistics.median(times),
                        "peak_rss_mb": peak, "ratio_to_tutorial": ratio,
                        "runs": times, "model": what})
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
