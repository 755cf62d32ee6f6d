"""How long a LiteRT export's conversion takes: TensorFlow's converter as it
comes against `rnnstep.litert.export.convert_saved`, which leaves out the
converter's passes after MLIR's (the conversion metadata and the
deduplication of read-only buffers, both rewriting the flatbuffer in Python).

    python tools/bench/litert_convert.py --rounds=3
    python tools/bench/litert_convert.py --models=/tmp/int8lite/m.npz \\
        --int8=1 --rounds=2

Each model's generation is saved once as the export saves it
(`export.save_generation`); then, in rounds, the order alternating, each
conversion runs in a fresh process of its own (TensorFlow imported before
the clock starts): its CPU and wall seconds for `convert()` alone, the
flatbuffer's bytes, and whether the two flatbuffers hold the same buffers
(the tensors' weights and constants; the pass left out merges a few small
equal ones). Medians over the rounds, ranges in brackets.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

CHILD = r"""
import hashlib, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from rnnstep.litert import export
saved, how, int8 = sys.argv[2], sys.argv[3], sys.argv[4] == "1"
def cpu():
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime
start, wall = cpu(), time.perf_counter()
if how == "tensorflow":
  flatbuffer = export.converter_for(saved, int8).convert()
else:
  flatbuffer = export.convert_saved(saved, int8)
cpu_s, wall_s = cpu() - start, time.perf_counter() - wall
from ai_edge_litert import schema_py_generated as schema
root = schema.Model.GetRootAsModel(flatbuffer, 0)
# The tensors' buffers (not the metadata's).
used = {root.Subgraphs(g).Tensors(t).Buffer()
        for g in range(root.SubgraphsLength())
        for t in range(root.Subgraphs(g).TensorsLength())}
buffers = [hashlib.sha256(root.Buffers(i).DataAsNumpy().tobytes()).hexdigest()
           for i in used if root.Buffers(i).DataLength()]
print(json.dumps({"cpu": cpu_s, "wall": wall_s, "bytes": len(flatbuffer),
                  "distinct_buffers": sorted(set(buffers))}))
"""

HOWS = ("tensorflow", "rnnstep")


def save(model_path, folder):
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import export  # pylint: disable=g-import-not-at-top
  model = (rnnstep.load() if model_path == "bundled"
           else rnnstep.load(model_path))
  saved = os.path.join(folder, "saved")
  os.makedirs(saved)
  export.save_generation(model, saved)
  return saved


def convert_in_child(saved, how, int8):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run([sys.executable, "-c", CHILD, ROOT, saved, how,
                         "1" if int8 else "0"], capture_output=True,
                        text=True, env=env, check=False)
  if done.returncode:
    raise SystemExit(f"the {how} conversion failed: {done.stderr[-600:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values, digits=1):
  return (f"{statistics.median(values):.{digits}f} "
          f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      "--models", default="bundled," + os.path.join(
          ROOT, "tests", "data", "rwkv7", "rwkv7.pth"),
      help="comma list of model files (bundled: the bundled GRU); an "
      "RWKV-7 .pth is converted with --vocab first")
  parser.add_argument("--vocab", default=os.path.join(
      ROOT, "tests", "data", "rwkv7", "preset", "assets", "tokenizer",
      "vocabulary.txt"))
  parser.add_argument("--int8", type=int, default=0,
                      help="1: the dynamic-range int8 conversion")
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  for model_path in args.models.split(","):
    shown = model_path
    with tempfile.TemporaryDirectory(prefix="litert_convert_") as folder:
      if model_path.endswith(".pth"):  # An official RWKV-7 checkpoint.
        from rnnstep import convert  # pylint: disable=g-import-not-at-top
        model_path = os.path.join(folder, "model.npz")
        convert.convert(shown, model_path, vocab=args.vocab)
      saved = save(model_path, folder)
      results = {how: [] for how in HOWS}
      for r in range(args.rounds):
        for how in HOWS[r % 2:] + HOWS[:r % 2]:
          results[how].append(convert_in_child(saved, how, args.int8))
      print(f"{shown} ({'int8' if args.int8 else 'float32'}), "
            f"{args.rounds} rounds:")
      for how in HOWS:
        runs = results[how]
        print(f"  {how:10s}: CPU {spread([x['cpu'] for x in runs])} s, "
              f"wall {spread([x['wall'] for x in runs])} s, "
              f"{runs[0]['bytes']:,} bytes")
      ratio = [b["cpu"] / a["cpu"] for a, b in zip(results["tensorflow"],
                                                   results["rnnstep"])]
      same = (results["tensorflow"][0]["distinct_buffers"]
              == results["rnnstep"][0]["distinct_buffers"])
      print(f"  rnnstep / tensorflow CPU: {spread(ratio, 2)}x paired; the same "
            f"distinct buffers: {same}")


if __name__ == "__main__":
  main()
