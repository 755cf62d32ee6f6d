"""rnnstep-generate with long prompts, tree against tree: which path runs
(the cached artifact or TensorFlow's) and how long the whole command takes.

    python tools/bench/warm_prompts.py --model=m.npz --trees=/work/wt-A,. \\
        --prompt_chars=300,2000,8000 --num_steps=16 --pairs=2

Each pair runs every tree once per prompt length (`PYTHONPATH=TREE python
-m rnnstep.cli.generate --verbose`, the order turned each pair) under
`/usr/bin/time` (wall seconds, peak resident memory), with the prompt the
first N characters of --text, greedy; prints the path --verbose names and
whether the trees printed the same text. The cache folder is
$RNNSTEP_CACHE_DIR's and must hold each tree's entry (a tree's sources are
part of its key: run each tree once cold and let its background fill
finish; `RNNSTEP_CACHE_MAX_MB` large enough for all of them).
(benchmarks/results/warm-cli-prompts-epyc-zen4-2026-12.md)
"""

import argparse
import os
import subprocess
import sys


def run(tree, model, prompt, steps):
  """(seconds, peak kB, the --verbose path line, stdout) of one command."""
  argv = ["/usr/bin/time", "-f", "TIME %e %M", sys.executable, "-m",
          "rnnstep.cli.generate", f"--weights={model}", f"--prompt={prompt}",
          f"--num_steps={steps}", "--temperature=0", "--verbose"]
  env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
  done = subprocess.run(argv, env=env, capture_output=True, text=True,
                        check=False)
  lines = done.stderr.splitlines()
  seconds, peak = next(l for l in lines if l.startswith("TIME ")).split()[1:]
  path = next((l for l in lines if l.startswith("rnnstep-generate: ")), "")
  return float(seconds), int(peak), path[len("rnnstep-generate: "):], (
      done.stdout)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", required=True)
  parser.add_argument("--trees", default=".")
  parser.add_argument("--text", default=os.path.join(
      os.path.dirname(__file__), "..", "..", "..", "shared", "data",
      "tinyshakespeare.txt"))
  parser.add_argument("--prompt_chars", default="300,2000,8000")
  parser.add_argument("--num_steps", type=int, default=16)
  parser.add_argument("--pairs", type=int, default=2)
  args = parser.parse_args()
  trees = args.trees.split(",")
  with open(args.text, encoding="utf-8") as f:
    text = f.read()
  for chars in (int(c) for c in args.prompt_chars.split(",")):
    for pair in range(args.pairs):
      order = trees if pair % 2 == 0 else trees[::-1]
      outputs = set()
      for tree in order:
        seconds, peak, path, out = run(tree, args.model, text[:chars],
                                       args.num_steps)
        outputs.add(out)
        load = os.getloadavg()[0]
        print(f"{tree} chars={chars} steps={args.num_steps} {seconds:.2f} s "
              f"peak {peak / 1e6:.2f} GB load {load:.2f} | {path[:110]}",
              flush=True)
      print("  same text" if len(outputs) == 1 else "  TEXTS DIFFER",
            flush=True)


if __name__ == "__main__":
  main()
