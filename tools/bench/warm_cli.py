"""rnnstep-generate's warm run against a warm library call (issue 60's
done-when: "at most 1.5 s more than 200 tokens take in a warm library call,
peak memory at most 1.3x the model file, the same text").

    python tools/bench/warm_cli.py cli --model=m.npz --pairs=3
    python tools/bench/warm_cli.py cli --model=m.npz --trees=/work/main,.
    python tools/bench/warm_cli.py cold --model=m.npz --trees=/work/main,.
    python tools/bench/warm_cli.py runs --model=m.npz --configs=builtin:1,packed:1

`cli`: A B A B pairs, back to back, of (A) `rnnstep-generate --model=M
--prompt=P --num_steps=N` as a whole process under `/usr/bin/time -v` (wall
seconds, peak RSS) and (B) the same generation timed in one long-lived
process that has made it already (`rnnstep.generate`, default path: XLA,
once its background compile is done; the process waits for it).
The cache folder is $RNNSTEP_CACHE_DIR's, as a user's; the compiled-artifact
cache must be on (RNNSTEP_COMPILED_CACHE unset) and hold the model's
artifact, else the command runs cold (its --verbose line is printed).

With --trees (source checkouts, e.g. main's and a branch's), each pair
runs the command once per tree (PYTHONPATH=TREE, the order turned each
pair; the library process is this environment's), to compare the trees'
warm runs side by side.

`cold`: the command's cold run (no entry: TensorFlow's path, then the
detached child that builds the entry) as a whole process, once per --trees
tree a pair (the order turned each pair), each in a fresh cache folder;
the child is stopped once the command exits (it would take the CPU from
the next run for minutes), so the figure is the command's own.

`runs`: the model's cached artifact run in this process by
`runner.run_artifact` in each --configs way in turn (kernels and threads),
round after round: seconds, CPU seconds (above the seconds: threads ran in
parallel) and the text's digest. The entry is the current key's
(`--artifact=NAME.tflite` names one outright, its manifest and packed
weights beside it: the key covers rnnstep's sources, so an edited runner
misses).

Each row prints the load average; the machine may be shared, so compare the
pairs' ratios, not the absolute times.
"""

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from rnnstep.litert import cache
from rnnstep.litert import runner
# pylint: enable=g-import-not-at-top,wrong-import-position

_MODEL = flags.DEFINE_string("model", None, "The model file.", required=True)
_PROMPT = flags.DEFINE_string("prompt", "The", "The prompt.")
_NUM_STEPS = flags.DEFINE_integer("num_steps", 200, "Tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0: greedy.")
_SEED = flags.DEFINE_integer("seed", 5, "The seed (sampled text).")
_PAIRS = flags.DEFINE_integer("pairs", 3, "A B pairs.")
_CONFIGS = flags.DEFINE_list(
    "configs", ["builtin:1", "packed:1", "packed:2"],
    "runs: KERNELS:THREADS to compare, KERNELS builtin (LiteRT's builtin "
    "kernels), xnnpack (the interpreter's XNNPACK delegate) or packed "
    "(XNNPACK on the entry's packed weights); THREADS 0: every CPU this "
    "process may use.")
_TREES = flags.DEFINE_list(
    "trees", [], "cli, cold: source checkouts whose rnnstep the command "
    "runs (PYTHONPATH), one run each a pair; default: this environment's.")
_ARTIFACT = flags.DEFINE_string(
    "artifact", None, "runs: an entry's .tflite, its .json and .xnnpack "
    "beside (default: the model's entry for the current key).")

# The long-lived library process: generates once (compiles, warms), then
# times one generation per line read on stdin and answers JSON.
_LIBRARY = """
import json, sys, threading, time
import rnnstep
model_path, prompt, steps, temperature, seed = sys.argv[1:6]
model = rnnstep.load(model_path)
def once():
  start = time.perf_counter()
  text = rnnstep.generate(model, prompt, int(steps),
                          temperature=float(temperature), seed=int(seed))
  return time.perf_counter() - start, text
once()
# The first call ran on the graph path while XLA compiles behind it: the
# warm call is the one after that compile (engine/compiling.py's thread).
while any(t.name == "rnnstep-compile" for t in threading.enumerate()):
  time.sleep(1)
once()
print(json.dumps({"ready": True}), flush=True)
for _ in sys.stdin:
  seconds, text = once()
  print(json.dumps({"seconds": seconds, "text": text}), flush=True)
"""


def _load() -> str:
  return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _generation_flags():
  return [f"--prompt={_PROMPT.value}", f"--num_steps={_NUM_STEPS.value}",
          f"--temperature={_TEMPERATURE.value}", f"--seed={_SEED.value}"]


def _cli_once(tree=None, cache_dir=None):
  """(wall s, peak RSS MB, text, verbose line) of one whole process, with
  `tree`'s rnnstep (None: this environment's) and `cache_dir` (None: the
  environment's)."""
  exe = shutil.which("rnnstep-generate")
  if exe is None:
    raise SystemExit("rnnstep-generate is not on PATH")
  env = dict(os.environ)
  if tree:
    env["PYTHONPATH"] = os.path.abspath(tree)
  if cache_dir:
    env["RNNSTEP_CACHE_DIR"] = cache_dir
  done = subprocess.run(
      ["/usr/bin/time", "-v", exe, f"--model={_MODEL.value}", "--verbose",
       *_generation_flags()], capture_output=True, text=True, check=True,
      env=env)
  wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)",
                   done.stderr)
  hours, minutes, seconds = wall.groups()
  rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                      done.stderr).group(1))
  said = [line for line in done.stderr.splitlines()
          if "compiled artifact" in line or "TensorFlow" in line]
  return (int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds),
          rss / 1024, done.stdout, said[0] if said else "")


def _turned(items, pair):
  """`items` turned by `pair` (A B, B A, ...): each meets the same load."""
  return items[pair % len(items):] + items[:pair % len(items)]


def _cli():
  size = os.path.getsize(_MODEL.value) / 2**20
  library = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-c", _LIBRARY, _MODEL.value, _PROMPT.value,
       str(_NUM_STEPS.value), str(_TEMPERATURE.value), str(_SEED.value)],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  json.loads(library.stdout.readline())
  print(f"model {size:.0f} MB; {_NUM_STEPS.value} tokens after "
        f"{_PROMPT.value!r}, temperature {_TEMPERATURE.value}, seed "
        f"{_SEED.value}")
  print("| pair | tree | load | warm CLI (whole process) | peak RSS | x file "
        "| library, warm call | CLI - library | ratio | same text |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for pair in range(_PAIRS.value):
    for tree in _turned(_TREES.value or [None], pair):
      load = _load()
      wall, rss, cli_text, said = _cli_once(tree)
      library.stdin.write("go\n")
      library.stdin.flush()
      answer = json.loads(library.stdout.readline())
      # The command prints the prompt, its continuation and a newline.
      same = cli_text == _PROMPT.value + answer["text"] + "\n"
      print(f"| {pair + 1} | {tree or '-'} | {load} | {wall:.2f} s | "
            f"{rss:.0f} MB | {rss / size:.2f} | {answer['seconds']:.2f} s | "
            f"{wall - answer['seconds']:+.2f} s | "
            f"{wall / answer['seconds']:.2f} | "
            f"{'yes' if same else 'NO'} ({_digest(answer['text'])}) |",
            flush=True)
      if pair == 0:
        print(f"<!-- the command said: {said} -->", flush=True)
  library.stdin.close()
  library.wait()


def _stop_children_in(folder: str):
  """Stops the processes working in `folder` (the detached child a cold run
  started there: its working directory is the cache's) and waits for
  them."""
  import signal  # pylint: disable=g-import-not-at-top
  stopped = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
      continue
    if cwd == folder or cwd.startswith(folder + os.sep):
      with contextlib.suppress(OSError):
        os.kill(int(pid), signal.SIGKILL)
        stopped.append(pid)
  while any(os.path.exists(f"/proc/{pid}") for pid in stopped):
    time.sleep(0.1)
  return len(stopped)


def _cold():
  size = os.path.getsize(_MODEL.value) / 2**20
  trees = _TREES.value or [None]
  print(f"model {size:.0f} MB; {_NUM_STEPS.value} tokens after "
        f"{_PROMPT.value!r}, temperature {_TEMPERATURE.value}, seed "
        f"{_SEED.value}; a fresh cache folder each run")
  print("| pair | tree | load | cold CLI (whole process) | peak RSS "
        "| x file | children stopped | text |")
  print("|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory(prefix="warm_cli_cold_") as tmp:
    for pair in range(_PAIRS.value):
      for n, tree in enumerate(_turned(trees, pair)):
        folder = os.path.realpath(os.path.join(tmp, f"{pair}-{n}"))
        load = _load()
        wall, rss, text, said = _cli_once(tree, folder)
        stopped = _stop_children_in(folder)
        print(f"| {pair + 1} | {tree or '-'} | {load} | {wall:.2f} s | "
              f"{rss:.0f} MB | {rss / size:.2f} | {stopped} | "
              f"{_digest(text)} |", flush=True)
        if pair == 0:
          print(f"<!-- the command said: {said} -->", flush=True)


def _runs():
  if _ARTIFACT.value:
    base = _ARTIFACT.value[:-len(".tflite")]
    with open(base + ".json", encoding="utf-8") as f:
      manifest = json.load(f)
    path = _ARTIFACT.value
    packed = base + cache.PACKED_SUFFIX
    packed = packed if os.path.exists(packed) else None
  else:
    artifact = cache.open_entry(
        cache.key(os.path.abspath(_MODEL.value), cache.runtime_version()))
    manifest, path, packed = (artifact.manifest, artifact.path,
                              artifact.weight_cache)
  tokens = cache.tokens_of(manifest)
  print(f"artifact {os.path.getsize(path) / 2**20:.0f} MB; {_NUM_STEPS.value} "
        f"tokens after {_PROMPT.value!r}, temperature {_TEMPERATURE.value}")
  print("| round | kernels | threads | load | seconds | CPU seconds | "
        "peak RSS so far | text |")
  print("|---|---|---|---|---|---|---|---|")
  for round_ in range(_PAIRS.value):
    for config in _CONFIGS.value:
      kernels, threads = config.split(":")
      threads = int(threads) or len(os.sched_getaffinity(0))
      if kernels == "packed" and packed is None:
        raise SystemExit("no packed weights beside the artifact")
      load = _load()
      start, cpu = time.perf_counter(), time.process_time()
      text, = runner.run_artifact(
          path, manifest["vocab"],  # Its file: each way maps what it reads.
          [_PROMPT.value], _NUM_STEPS.value, seed=_SEED.value, tokens=tokens,
          builtin_kernels=kernels == "builtin",
          weight_cache=packed if kernels == "packed" else None,
          num_threads=threads, temperature=_TEMPERATURE.value)
      rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
      print(f"| {round_ + 1} | {kernels} | {threads} | {load} | "
            f"{time.perf_counter() - start:.2f} | "
            f"{time.process_time() - cpu:.2f} | {rss:.0f} MB | "
            f"{_digest(text)} |", flush=True)


def main(argv):
  sections = {"cli": _cli, "cold": _cold, "runs": _runs}
  if len(argv) != 2 or argv[1] not in sections:
    raise app.UsageError(f"one section: {' or '.join(sections)}")
  sections[argv[1]]()


if __name__ == "__main__":
  app.run(main)
