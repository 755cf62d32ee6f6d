"""int8 weights through LiteRT/XNNPACK: does the 0.1B RWKV-7 decode at
>= 2.6x rnnstep's float32 and >= llama.cpp's Q8_0? (issue 62).

    python tools/bench/int8_litert.py random_model --model=/tmp/int8lite/m.npz
    python tools/bench/int8_litert.py convert --model=/tmp/int8lite/m.npz
    python tools/bench/int8_litert.py bench --model=/tmp/int8lite/m.npz \\
        --threads=2 --kernels=xnnpack --rounds=5
    python tools/bench/int8_litert.py check      # a small RWKV-7's int8 text
    python tools/bench/int8_litert.py quality --quality_models=bundled \\
        --text=../shared/data/tinyshakespeare.txt --heldout=0.1
    python tools/bench/int8_litert.py quality --quality_models=R.npz

random_model: writes the 0.1B shape with `bench_rwkv7.py`'s seeded random
weights (the llama.cpp comparison's) to --model. (R.npz: a trained RWKV-7,
tools/train_rwkv7_small.py's, converted by rnnstep-convert.)

convert: rnnstep's LiteRT export of --model (`rnnstep.litert.export`: the
whole generation, one flatbuffer), once as it is (float32) and once
loaded with weights_dtype="int8" (its products XNNPACK's int8 ones,
`rnnstep.litert.int8_products`: each product's weights int8 per output
channel, its input rows rounded to int8 as the interpreter runs, the
library's int8 arithmetic; until 0.20.0 the converter's own
`Optimize.DEFAULT`, which also made the priming loop's input table int8).
One process at a time (a child
saves the SavedModel, one child a conversion: ~6 GB each at the 0.1B
shape); prints each one's time, peak resident memory and what the
flatbuffer holds (its int8 and float32 constants, its products).

bench: at batch 1, greedy, `bench_rwkv7.RnnstepPeer`'s calls (llama-bench's
tg128 and pp512): decode tokens/s from a 16-token prompt, the 128-token
call less the 1-token call over 127 steps; prefill tokens/s, a 512-token
prompt's 1-token call:
  - litert {float32, int8} x --kernels {xnnpack, builtin} x --threads: each
    a fresh process a round (the flatbuffer mapped from its file, the
    interpreter built with num_threads, XNNPACK the interpreter's default
    delegate, builtin its kernels without it), a 1-token call first
    (XNNPACK packs its weights then), then the timed calls; its peak
    resident memory;
  - rnnstep float32: `rnnstep.generate` on the default path of --model
    (this process; TensorFlow's own threads);
  - llama.cpp: `llama-bench -p 512 -n 128 -r 3 -t T` on each --gguf (the
    median of its repetitions), T in --threads; GGUFs of the same weights,
    checked against the official reference, from
    `tools/bench_rwkv7.py --llama_cpp_dir=... --gguf_dir=DIR --rounds=0`.
The variants run in rounds, the order rotated each round; figures are
medians over --rounds with their ranges, ratios paired by round (against
rnnstep float32, LiteRT float32 on the same kernels and threads, and
llama.cpp Q8_0). Every variant's greedy ids are compared with the
library's (float32's text) and the first int8 variant's.

check: the small RWKV-7 fixture (tests/data/rwkv7/rwkv7.pth) exported
with dynamic-range int8, its greedy ids on XNNPACK and builtin kernels against a numpy RWKV-7
(`tests/support/rwkv7_reference.py`'s equations in float32) whose
int8-weight products are XNNPACK's arithmetic
(`int8_products.xnnpack_dynamic_int8`) with the flatbuffer's own int8
weights and scales.

quality: each --quality_models (bundled: the bundled GRU) scored in
numpy with its int8 artifact's own weights in XNNPACK's arithmetic,
against float32 (see `quality`).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

import bench_rwkv7  # pylint: disable=g-import-not-at-top,wrong-import-position

# llama-bench's tg128 and pp512, as bench_rwkv7's llama.cpp comparison.
DECODE_PROMPT = bench_rwkv7.DECODE_PROMPT
DECODE_STEPS = bench_rwkv7.DECODE_STEPS
PREFILL_PROMPT = bench_rwkv7.PREFILL_PROMPT
KINDS = ("float32", "int8")
LIBRARY = "rnnstep float32 (library)"


def load():
  return os.getloadavg()[0]


def say(text=""):
  print(text, flush=True)


# ----------------------------------------------------------------- convert


def random_model(args):
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.dirname(os.path.abspath(args.model)), exist_ok=True)
  model_file.write(args.model, *bench_rwkv7._random_parts())  # pylint: disable=protected-access
  say(f"wrote {args.model}")


# Runs argv as its child and prints, last on stderr, that child's peak
# resident bytes. Not wait4 on the child directly: a process exec'd from a
# fork of this one reports at least this one's resident size at the fork
# (Linux keeps the replaced memory's high-water mark), and this one holds
# the library's model while it measures.
PEAK_SHIM = """
import os, sys
pid = os.fork()
if not pid:
  os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(f"peak_bytes {usage.ru_maxrss * 1024}", file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def child_peak(argv, **kwargs):
  """Runs argv to its end: (exit status, stdout, stderr, its peak resident
  bytes)."""
  done = subprocess.run([sys.executable, "-c", PEAK_SHIM] + list(argv),
                        capture_output=True, text=True, check=False, **kwargs)
  err, _, last = done.stderr.rstrip().rpartition("\n")
  peak = int(last.split()[1]) if last.startswith("peak_bytes ") else 0
  return done.returncode, done.stdout, err, peak


CONVERT_CHILD = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from rnnstep.litert import export
saved, kind, out = sys.argv[2:5]
start = time.perf_counter()
flatbuffer = export.convert_saved(saved)
with open(out + ".tmp", "wb") as f:
  f.write(flatbuffer)
os.replace(out + ".tmp", out)
print(time.perf_counter() - start)
"""


SAVE_CHILD = """
import json, os, sys
import rnnstep
from rnnstep.litert import export
model_path, saved, kind = sys.argv[1:4]
model = rnnstep.load(model_path, weights_dtype=kind)
export.save_generation(model, saved)
with open(os.path.join(os.path.dirname(saved), "vocab.json"), "w") as f:
  json.dump([list(model.vocab), None if model.is_characters
             else model.tokens.to_json()], f)
"""


def artifact_path(out, kind):
  return os.path.join(out, f"{kind}.tflite")


def convert(args):
  from rnnstep.litert import cache  # pylint: disable=g-import-not-at-top
  os.makedirs(args.out, exist_ok=True)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join(
                 [str(ROOT), os.environ.get("PYTHONPATH", "")]))
  del cache
  for kind in KINDS:
    path = artifact_path(args.out, kind)
    # The int8 model's SavedModel (weights_dtype="int8"), which the export
    # converts with XNNPACK's int8 products.
    saved = os.path.join(args.out, "saved" if kind == "float32"
                         else f"saved_{kind}")
    if not os.path.isfile(path) and not os.path.isdir(saved):
      start = time.perf_counter()
      status, _, err, peak = child_peak(
          [sys.executable, "-c", SAVE_CHILD, args.model, saved, kind],
          env=env)
      if status:
        raise SystemExit(f"saving {args.model} failed: {err.strip()[-400:]}")
      say(f"SavedModel of {args.model} ({kind}): "
          f"{time.perf_counter() - start:.0f} s, peak {peak / 1e9:.1f} GB")
    if os.path.isfile(path):
      say(f"{path}: kept")
    else:
      status, out, err, peak = child_peak(
          [sys.executable, "-c", CONVERT_CHILD, str(ROOT), saved, kind, path],
          env=env)
      if status:
        raise SystemExit(f"converting {kind} failed: {err.strip()[-400:]}")
      say(f"{kind}: converted in {float(out):.0f} s, peak "
          f"{peak / 1e9:.1f} GB (load {load():.1f})")
    say(f"  {describe(path)}")


def describe(path):
  """What a flatbuffer holds: its size, its constants by type (each buffer
  once, over every subgraph), and its products (fully-connected ops) by
  the type of their weights, over the loops' bodies."""
  from ai_edge_litert import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    flatbuffer = f.read()
  model = schema.Model.GetRootAs(flatbuffer, 0)
  type_name = {v: k for k, v in vars(schema.TensorType).items()
               if not k.startswith("_")}
  fully_connected = [i for i in range(model.OperatorCodesLength()) if max(
      model.OperatorCodes(i).BuiltinCode(),
      model.OperatorCodes(i).DeprecatedBuiltinCode())
                     == schema.BuiltinOperator.FULLY_CONNECTED]
  constants, products, seen = {}, {}, set()
  for g in range(model.SubgraphsLength()):
    graph = model.Subgraphs(g)
    for t in range(graph.TensorsLength()):
      tensor = graph.Tensors(t)
      buffer = model.Buffers(tensor.Buffer())
      size = buffer and max(buffer.DataLength(), buffer.Size())
      if size and tensor.Buffer() not in seen:
        seen.add(tensor.Buffer())
        name = type_name[tensor.Type()]
        constants[name] = constants.get(name, 0) + size
    for o in range(graph.OperatorsLength()):
      op = graph.Operators(o)
      if op.OpcodeIndex() in fully_connected:
        name = type_name[graph.Tensors(op.Inputs(1)).Type()]
        products[name] = products.get(name, 0) + 1
  return (f"{len(flatbuffer) / 1e6:.0f} MB; constants "
          + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(
              constants.items()) if v >= 1e5)
          + "; fully-connected ops by weight type "
          + ", ".join(f"{k} {v}" for k, v in sorted(products.items())))


# ------------------------------------------------------------------- bench


class Ids:
  """What the worker's inputs need of a vocabulary (no stop strings, no
  pattern)."""

  def __init__(self, vocab_size):
    self.vocab_size, self.has_unk = vocab_size, False


WORKER = """
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from tools.bench import int8_litert
print(json.dumps(int8_litert.litert_decode(*json.loads(sys.argv[2]))))
"""


def litert_decode(path, kernels, threads, prompt_ids, prefill_ids,
                  vocab_size, steps):
  """One fresh interpreter's decode and prefill: {"tg": tokens/s, "pp":
  prompt tokens/s, "ids": [...], "start_s": building it and its first
  1-token call, "peak": bytes}."""
  import resource  # pylint: disable=g-import-not-at-top
  from ai_edge_litert import interpreter as interpreter_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import inputs as litert_inputs  # pylint: disable=g-import-not-at-top
  resolver = (interpreter_lib.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
              if kernels == "builtin" else interpreter_lib.OpResolverType.AUTO)
  start = time.perf_counter()
  runner = interpreter_lib.Interpreter(
      model_path=path, num_threads=threads,
      experimental_op_resolver_type=resolver).get_signature_runner(
          litert_inputs.SIGNATURE)

  def call(prompt, num_steps):
    inputs = litert_inputs.build(Ids(vocab_size), [prompt], num_steps,
                                 seed=1, temperature=0.0)
    begin = time.perf_counter()
    out = runner(**inputs)
    return time.perf_counter() - begin, out["ids"][0][:out["lengths"][0]]

  call(prompt_ids, 1)
  start_s = time.perf_counter() - start
  one, _ = call(prompt_ids, 1)
  many, ids = call(prompt_ids, steps)
  prefill, _ = call(prefill_ids, 1)
  return {"tg": (steps - 1) / max(many - one, 1e-9),
          "pp": len(prefill_ids) / prefill, "ids": ids.tolist(),
          "start_s": start_s,
          "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


class LiteRT:
  """A LiteRT variant: one fresh worker process a round."""

  def __init__(self, path, kernels, threads, prompt_ids, prefill_ids,
               vocab_size):
    self.argv = [sys.executable, "-c", WORKER, str(ROOT), json.dumps(
        [path, kernels, threads, prompt_ids, prefill_ids, vocab_size,
         DECODE_STEPS])]

  def run(self):
    status, out, err, peak = child_peak(self.argv)
    if status:
      raise RuntimeError(f"the LiteRT worker failed: {err.strip()[-600:]}")
    got = json.loads(out.strip().splitlines()[-1])
    got["peak"] = peak
    return got


def library_name(weights_dtype):
  return LIBRARY.replace("float32", weights_dtype)


def library(model_path, weights_dtype="float32"):
  """`rnnstep.generate` on the default path of model_path loaded with
  `weights_dtype`, in this process: `bench_rwkv7.RnnstepPeer`'s decode and
  prefill, with this table's peak (the process's: shared by the library's
  variants) and greedy ids. The warm-up waits for the compiles it started
  in the background (meanwhile the calls run on the graph path)."""
  import resource  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import compiling  # pylint: disable=g-import-not-at-top
  peer = bench_rwkv7.RnnstepPeer(model_path, weights_dtype)
  peer.run()  # Traces each call's shape.
  compiling.wait_idle(timeout=None)
  peer.run()
  text = peer.rnnstep.generate(peer.model, peer.decode_prompt, DECODE_STEPS,
                               seed=1, temperature=0.0)[0]
  ids = peer.model.encode(text).tolist()
  return lambda: dict(
      peer.run(), ids=ids,
      peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


class LlamaBench:
  """`llama-bench -p 512 -n 128 -r 3 -t T` on a GGUF: the median of its
  tg samples and of its pp samples."""

  def __init__(self, binary_dir, gguf, threads):
    self.argv = [os.path.join(binary_dir, "llama-bench"), "-m", gguf, "-t",
                 str(threads), "-p", str(PREFILL_PROMPT), "-n",
                 str(DECODE_STEPS), "-r", "3", "-o", "json"]

  def run(self):
    status, out, err, peak = child_peak(self.argv)
    if status:
      raise RuntimeError(f"llama-bench failed: {err.strip()[-600:]}")
    got = {"peak": peak}
    for test in json.loads(out):
      got["tg" if test["n_gen"] else "pp"] = statistics.median(
          float(s) for s in test["samples_ts"])
    return got


def bench(args):
  if args.replay:
    return replay(args.replay)
  from rnnstep.model import vocabulary  # pylint: disable=g-import-not-at-top
  say(bench_rwkv7.machine_line())
  threads = [int(t) for t in args.threads.split(",")]
  with open(os.path.join(args.out, "vocab.json"), encoding="utf-8") as f:
    vocab, tokens_json = json.load(f)[:2]
  tokens = vocabulary.Tokens.from_json(json.loads(tokens_json), vocab)
  # RnnstepPeer's prompts (one letter a token).
  prompt_ids, prefill_ids = ([int(i) for i in tokens.encode(
      bench_rwkv7.letters(count, seed))] for count, seed in (
          (DECODE_PROMPT, 1), (PREFILL_PROMPT, 2)))
  assert len(prompt_ids) == DECODE_PROMPT, prompt_ids
  assert len(prefill_ids) == PREFILL_PROMPT, len(prefill_ids)
  runners = {}
  for kind in (k for k in args.kinds.split(",") if k):
    for kernels in (k for k in args.kernels.split(",") if k):
      for t in threads:
        runners[f"LiteRT {kind}, {kernels}, {t}T"] = LiteRT(
            artifact_path(args.out, kind), kernels, t, prompt_ids,
            prefill_ids, len(vocab)).run
  dtypes = {"1": "float32", "0": ""}.get(args.library, args.library)
  for weights_dtype in (d for d in dtypes.split(",") if d):
    start = time.perf_counter()
    runners[library_name(weights_dtype)] = library(args.model, weights_dtype)
    say(f"rnnstep {weights_dtype} loaded and warmed up in "
        f"{time.perf_counter() - start:.0f} s")
  for spec in (s for s in args.gguf.split(",") if s):
    kind, path, *only = spec.split(":")
    for t in [int(t) for t in only[0].split("+")] if only else threads:
      runners[f"llama.cpp {kind}, {t}T"] = LlamaBench(args.llama_cpp_bin,
                                                       path, t).run
  names = list(runners)
  results = {name: [] for name in names}
  loads = []
  try:
    for r in range(args.rounds):
      for name in names[r % len(names):] + names[:r % len(names)]:
        got = runners[name]()
        got["round"] = r
        results[name].append(got)
        loads.append(load())
        extra = (f", first call {got['start_s']:.1f} s"
                 if "start_s" in got else "")
        say(f"  round {r} {name}: {got['tg']:.1f} tokens/s, prefill "
            f"{got.get('pp', float('nan')):.1f} tokens/s, peak "
            f"{got['peak'] / 1e9:.2f} GB{extra} (load {loads[-1]:.1f})")
  except KeyboardInterrupt:
    say(f"  stopped in round {r}: the table holds the rounds done")
  say(f"load during the rounds {min(loads, default=0):.1f}-"
      f"{max(loads, default=0):.1f}; at end "
      f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
  table(results, names)
  agreement(results, names)


def paired(results, name, base, key="tg"):
  """The median over rounds of name's `key` tokens/s / base's, in the same
  round."""
  by_round = {g["round"]: g[key] for g in results.get(base, []) if key in g}
  ratios = [g[key] / by_round[g["round"]] for g in results[name]
            if g["round"] in by_round and key in g]
  return f"{statistics.median(ratios):.2f}x" if ratios else ""


def spread(values):
  """Median (range) of values."""
  return (f"{statistics.median(values):.1f} ({min(values):.1f}-"
          f"{max(values):.1f})" if values else "")


def table(results, names):
  peers = [n for n in names if n.startswith("llama.cpp")]
  say()
  say(f"| variant | decode, tokens/s (tg{DECODE_STEPS}) | vs rnnstep float32 | "
      "vs LiteRT float32 (same kernels, threads) | "
      + "".join(f"vs {p} | " for p in peers)
      + f"prefill, tokens/s (pp{PREFILL_PROMPT}) | vs rnnstep float32 | "
      "peak resident memory | first call |")
  say("|---|---|---|---|" + "---|" * len(peers) + "---|---|---|---|")
  for name in (n for n in names if results[n]):
    got = results[name]
    starts = [g["start_s"] for g in got if "start_s" in g]
    float32 = name.replace("LiteRT int8,", "LiteRT float32,")
    say(f"| {name} | {spread([g['tg'] for g in got])} | "
        f"{paired(results, name, LIBRARY)} | "
        f"{paired(results, name, float32) if float32 != name else ''} | "
        + "".join(f"{paired(results, name, p)} | " for p in peers)
        + f"{spread([g['pp'] for g in got if 'pp' in g])} | "
        f"{paired(results, name, LIBRARY, 'pp')} | "
        f"{max(g['peak'] for g in got) / 1e9:.2f} GB | "
        + (f"{statistics.median(starts):.1f} s" if starts else "") + " |")


def replay(path):
  """The table of a run's log (its round lines)."""
  import re  # pylint: disable=g-import-not-at-top
  results = {}
  line_re = re.compile(r"  round (\d+) (.+?): ([\d.]+) tokens/s, prefill "
                       r"([\d.]+|nan) tokens/s, peak ([\d.]+) GB"
                       r"(?:, first call ([\d.]+) s)?")
  with open(path, encoding="utf-8") as f:
    for line in f:
      m = line_re.match(line)
      if m:
        got = {"round": int(m.group(1)), "tg": float(m.group(3)),
               "peak": float(m.group(5)) * 1e9}
        if m.group(4) != "nan":
          got["pp"] = float(m.group(4))
        if m.group(6):
          got["start_s"] = float(m.group(6))
        results.setdefault(m.group(2), []).append(got)
  table(results, list(results))


def agreement(results, names):
  """Each variant's greedy ids against the library's (float32's text) and
  the first int8 variant's."""
  ids = {name: results[name][0]["ids"] for name in names
         if results[name] and "ids" in results[name][0]}
  int8 = next((n for n in ids if "int8" in n), None)
  say()
  for name, mine in ids.items():
    line = [f"{same_ids(mine, ids[base])} ids as {base}'s"
            for base in (LIBRARY, int8) if base in ids and base != name]
    say(f"{name}: " + "; ".join(line))


# ------------------------------------------------------------------- check


def int8_flatbuffer(model):
  """`model`'s LiteRT export with its weights rounded to int8 (XNNPACK's
  int8 products)."""
  from rnnstep.litert import export  # pylint: disable=g-import-not-at-top
  return export.convert(model, dynamic_range_int8=True)


def check(args):
  """The small fixture's int8 artifact against a numpy RWKV-7 whose int8
  products are XNNPACK's arithmetic."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from ai_edge_litert import interpreter as interpreter_lib  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(args.check_model, vocab=args.check_vocab or None)
  flatbuffer = int8_flatbuffer(model)
  resolver = interpreter_lib.OpResolverType
  int8 = int8_constants(flatbuffer)
  table = primed_table(int8)
  prompt = model.encode(args.check_prompt)
  say(f"{args.check_model}: {len(flatbuffer) / 1e6:.1f} MB int8 artifact, "
      f"{len(int8)} int8 matrices (the priming loop's input table among "
      f"them: {table is not None}); prompt {len(prompt)} ids, "
      f"{args.check_steps} greedy steps")
  want, shapes = numpy_greedy(model, int8, prompt, args.check_steps, table)
  products_only, _ = numpy_greedy(model, int8, prompt, args.check_steps)
  plain, _ = numpy_greedy(model, [], prompt, args.check_steps)
  say(f"  the reference's products (weights [in, out]): {shapes}")
  say(f"  the reference without the int8 table: "
      f"{same_ids(products_only, want)} its ids")
  library = rnnstep.generate(model, [args.check_prompt], args.check_steps,
                             seed=1, temperature=0.0)[0]
  say(f"  rnnstep.generate float32 == the float32 reference's text: "
      f"{library == model.decode(plain)}")
  for kernels, kind in (("xnnpack", resolver.AUTO), (
      "builtin", resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES)):
    from rnnstep.litert import inputs as litert_inputs  # pylint: disable=g-import-not-at-top
    runner = interpreter_lib.Interpreter(
        model_content=flatbuffer, experimental_op_resolver_type=kind
    ).get_signature_runner(litert_inputs.SIGNATURE)
    out = runner(**litert_inputs.build(model, [prompt], args.check_steps,
                                       seed=1, temperature=0.0))
    got = out["ids"][0][:out["lengths"][0]].tolist()
    say(f"  int8 artifact on {kernels}: {same_ids(got, want)} the numpy "
        f"XNNPACK-arithmetic reference's; {same_ids(got, plain)} the "
        "float32 reference's")
  say(f"  the numpy references: XNNPACK arithmetic vs float32: "
      f"{same_ids(want, plain)}")


def same_ids(a, b):
  same = sum(x == y for x, y in zip(a, b))
  first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
  return f"{same}/{len(b)}" + (f" (first differs at {first})"
                               if first is not None else "")


def int8_constants(flatbuffer):
  """[(int8 `[N, K]`, float32 scales, int zero points)]: the flatbuffer's
  constant int8 matrices, in every subgraph (the loops' bodies hold the
  products), each buffer once: the products' weights (a scale per output
  channel) and the input table the priming loop gathers (one scale)."""
  from ai_edge_litert import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  model = schema.Model.GetRootAs(flatbuffer, 0)
  found, seen = [], set()
  for g in range(model.SubgraphsLength()):
    graph = model.Subgraphs(g)
    for t in range(graph.TensorsLength()):
      tensor = graph.Tensors(t)
      buffer = model.Buffers(tensor.Buffer())
      quantization = tensor.Quantization()
      if (tensor.Type() != schema.TensorType.INT8 or tensor.ShapeLength() != 2
          or tensor.Buffer() in seen or buffer is None
          or quantization is None or not quantization.ScaleLength()):
        continue
      if buffer.DataLength():
        data = buffer.DataAsNumpy()
      else:  # Past 2 GB the converter keeps buffers after the flatbuffer.
        data = np.frombuffer(flatbuffer, np.uint8, int(buffer.Size()),
                             int(buffer.Offset()))
      shape = tensor.ShapeAsNumpy()
      if data.size != np.prod(shape):  # Not a constant.
        continue
      seen.add(tensor.Buffer())
      found.append((data.view(np.int8).reshape(shape),
                    quantization.ScaleAsNumpy().astype(np.float32),
                    quantization.ZeroPointAsNumpy()))
  return found


def matcher(int8):
  """product(x, w): x @ w in XNNPACK's arithmetic where w `[K, N]` is one
  of the flatbuffer's int8 matrices (its dequantized values within half a
  step of w's), else in float32."""
  from tools.bench import int8_products  # pylint: disable=g-import-not-at-top

  int8 = [(q, scale) for q, scale, _ in int8 if scale.size == q.shape[0]]
  known = {}  # A matrix's shape and sampled values -> its int8 or None.

  def product(x, w):
    x = np.asarray(x, np.float32)
    key = w.shape + (w.ravel()[::max(1, w.size // 64)].tobytes(),)
    if key not in known:
      known[key] = next((
          (q, scale) for q, scale in int8 if q.shape == w.shape[::-1]
          and np.all(np.abs(q.T * scale - w) <= scale * 0.5001)), None)
    if known[key] is not None:
      product.shapes.add(("int8",) + w.shape)
      return int8_products.xnnpack_dynamic_int8(x[None], *known[key])[0]
    product.shapes.add(("float32",) + w.shape)
    return (x @ w).astype(np.float32)
  product.shapes = set()
  return product


def primed_table(int8):
  """The input table the priming loop gathers, float32 from its int8 (one
  scale for the whole table), or None."""
  for q, scale, zero_point in int8:
    if scale.size == 1 and q.shape[0] > 1:
      return (q.astype(np.float32) - np.float32(zero_point[0])) * scale[0]
  return None


def numpy_greedy(model, int8, prompt, steps, table=None):
  """Greedy ids from `rwkv7_reference`'s equations in float32, its products
  by `matcher(int8)`, the prompt but its last id (the priming loop's) from
  `table` where given (the decode loop gathers float32 rows)."""
  from tests.support import rwkv7_reference  # pylint: disable=g-import-not-at-top
  tensors = model.tensors()
  head_size = model.config.layers[0].size["head_size"]
  ids = list(prompt)
  product = matcher(int8)
  primed = lambda position, token: (
      table[token] if table is not None and position < len(prompt) - 1
      else None)
  for _ in range(steps):
    logits = rwkv7_reference.logits(tensors, head_size, ids, product=product,
                                    dtype=np.float32, input_row=primed)
    ids.append(int(np.argmax(logits[-1])))
  return ids[len(prompt):], sorted(product.shapes)


# ----------------------------------------------------------------- quality


class Rwkv7Scorer:
  """`rwkv7_reference`'s RWKV-7 in float32, one window at a time."""

  windows_a_call = 1

  def __init__(self, model):
    from tests.support import rwkv7_reference  # pylint: disable=g-import-not-at-top
    self.reference = rwkv7_reference
    self.tensors = model.tensors()
    self.head_size = model.config.layers[0].size["head_size"]

  def logits(self, ids, product, input_row=None):
    """`[B, T, V]` logits of ids `[B, T]`; `input_row(position, id)` as
    `rwkv7_reference.logits`'s."""
    return np.stack([self.reference.logits(
        self.tensors, self.head_size, row, product=product, dtype=np.float32,
        input_row=input_row) for row in ids])


class GruScorer:
  """`int8_activation_loss.NumpyGru` (the bundled model's GRU), its
  products by the matrices' values (`matcher`'s). Many windows a call:
  XNNPACK rounds each row apart, so a batch's rows are each one's own."""

  windows_a_call = 64

  def __init__(self, model):
    from tools.bench import int8_activation_loss  # pylint: disable=g-import-not-at-top
    self.gru = int8_activation_loss.NumpyGru(model)
    self.float32_table = self.gru.table

  def logits(self, ids, product, input_row=None):
    table = self.float32_table.copy()
    if input_row:  # The GRU's input row depends on the id alone.
      for i in set(np.asarray(ids).ravel().tolist()):
        row = input_row(0, i)
        if row is not None:
          table[i] = row
    self.gru.table = table
    return self.gru.logits(np.asarray(ids),
                           lambda x, name: product(x, self.gru.kernels[name]))


def artifact_greedy(flatbuffer, model, prompt, steps):
  """The flatbuffer's greedy ids on XNNPACK (the interpreter's default)."""
  from ai_edge_litert import interpreter as interpreter_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import inputs as litert_inputs  # pylint: disable=g-import-not-at-top
  runner = interpreter_lib.Interpreter(
      model_content=flatbuffer).get_signature_runner(litert_inputs.SIGNATURE)
  out = runner(**litert_inputs.build(model, [model.encode(prompt)], steps,
                                     seed=1, temperature=0.0))
  return out["ids"][0][:out["lengths"][0]].tolist()


def quality(args):
  """Mean KL(float32 || XNNPACK int8), held-out NLL and greedy agreement of
  each --quality_models, teacher-forced in windows from a zero state (as
  `quantization_loss.py` scores), with the converter's own int8 weights:
  the products in XNNPACK's arithmetic, the input rows float32 (the decode
  loop's) or from the int8 table (the priming loop's: what a prompt's
  tokens go through). Scored a window at a time (a 65,536-id model's
  log-probabilities of a whole text do not fit in memory)."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from tools.bench import quantization_loss as loss  # pylint: disable=g-import-not-at-top
  say(bench_rwkv7.machine_line())
  for spec in (m for m in args.quality_models.split(",") if m):
    path, _, text_path = spec.partition("@")
    model = rnnstep.load(None if path == "bundled" else path)
    text = pathlib.Path(text_path or args.text).read_text("utf-8")
    if args.heldout:
      text = text[int(len(text) * (1 - args.heldout)):]
    text = text[:args.chars or None]
    flatbuffer = int8_flatbuffer(model)
    int8 = int8_constants(flatbuffer)
    table = primed_table(int8)
    scorer = (Rwkv7Scorer if model.config.layers[0].kind == "rwkv7"
              else GruScorer)(model)
    windows = loss._windows(model.encode(text), args.window)  # pylint: disable=protected-access
    tokens = windows.size - len(windows)
    say(f"\n{path}: {len(text):,} characters of {text_path or args.text}"
        f"{f' (its last {args.heldout:.0%})' if args.heldout else ''}, "
        f"{tokens:,} tokens in windows of {args.window}; the int8 artifact "
        f"{len(flatbuffer) / 1e6:.1f} MB, {len(int8)} int8 matrices")

    # Float32's greedy text, then each variant's argmax along it
    # (teacher-forced), the prompt's rows as the artifact primes them.
    prompt_ids = model.encode(args.prompt).tolist()
    greedy = rnnstep.generate(model, [args.prompt], loss.GREEDY_STEPS, seed=1,
                              temperature=0.0)[0]
    along = prompt_ids + model.encode(greedy).tolist()[:loss.GREEDY_STEPS]
    start = len(prompt_ids) - 1
    want = loss._argmax(model, rnnstep.logits(  # pylint: disable=protected-access
        model, np.array(along[:-1]))[0])[start:]
    free = artifact_greedy(flatbuffer, model, args.prompt, loss.GREEDY_STEPS)
    first = next((i for i, (a, b) in enumerate(zip(free, along[start + 1:]))
                  if a != b), None)
    say(f"the int8 artifact's own greedy text (XNNPACK) from {args.prompt!r}: "
        f"{same_ids(free, along[start + 1:])} float32's ids"
        + ("" if first is None else f"; from step {first}: "
           f"{model.decode(free[first:first + 12])!r} against "
           f"{model.decode(along[start + 1 + first:][:12])!r}"))

    calls = [windows[i:i + scorer.windows_a_call]
             for i in range(0, len(windows), scorer.windows_a_call)]
    logp = [loss._log_softmax(rnnstep.logits(model, w[:, :-1]))  # pylint: disable=protected-access
            for w in calls]
    nll = float(np.mean(np.concatenate([
        -np.take_along_axis(lp, w[:, 1:, None], -1).ravel()
        for lp, w in zip(logp, calls)])))
    say("| model | arithmetic | tokens | mean KL(f32 ‖ q), nats/token | "
        "held-out NLL, nats/token | NLL / float32's | greedy agreement "
        f"({loss.GREEDY_STEPS} steps, teacher-forced) |")
    say("|---|---|---|---|---|---|---|")
    say(f"| {path} | float32 (rnnstep.logits) | {tokens:,} | 0 | {nll:.4f} "
        "| 1 | 1 |")
    primed = lambda position, token: (
        table[token] if table is not None and position < start else None)
    for name, weights, rows, greedy_rows in (
        ("float32 reference (numpy)", [], None, None),
        ("XNNPACK int8 products, float32 input rows", int8, None, primed),
        ("XNNPACK int8 products, int8 input table", int8,
         lambda _, token: table[token], primed)):
      begin = time.perf_counter()
      product = matcher(weights)
      kl, nll_q = [], []
      for lp, w in zip(logp, calls):
        lq = loss._log_softmax(scorer.logits(w[:, :-1], product, rows))  # pylint: disable=protected-access
        kl.append((np.exp(lp) * (lp - lq)).sum(-1).ravel())
        nll_q.append(-np.take_along_axis(lq, w[:, 1:, None], -1).ravel())
      kl, nll_q = float(np.concatenate(kl).mean()), float(
          np.concatenate(nll_q).mean())
      got = loss._argmax(model, scorer.logits(  # pylint: disable=protected-access
          np.array(along[:-1])[None], product, greedy_rows))[0, start:]
      say(f"| {path} | {name} | {tokens:,} | {kl:.2e} | {nll_q:.4f} | "
          f"{nll_q / nll:.4f} | {float((got == want).mean()):.3f} |  "
          f"({time.perf_counter() - begin:.0f} s, load {load():.1f})")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("command",
                      choices=("random_model", "convert", "bench", "check",
                               "quality"))
  parser.add_argument("--model", default="/tmp/int8lite/m.npz",
                      help="the 0.1B RWKV-7 model file")
  parser.add_argument("--out", default="/tmp/int8lite",
                      help="where the SavedModel and the artifacts are kept")
  parser.add_argument("--threads", default="1,2")
  parser.add_argument("--kinds", default="float32,int8",
                      help="the LiteRT artifacts to run")
  parser.add_argument("--kernels", default="xnnpack,builtin")
  parser.add_argument("--library", default="float32",
                      help="rnnstep.generate as variants, a comma list of "
                      "weights dtypes (1: float32, 0: none)")
  parser.add_argument("--llama_cpp_bin", default="")
  parser.add_argument("--gguf", default="",
                      help="KIND:PATH[:T+T],... GGUFs of the same "
                      "weights (and their threads, else --threads)")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--replay", default="",
                      help="bench: print the table of this earlier run's "
                      "log instead of running")
  parser.add_argument("--check_model",
                      default=str(ROOT / "tests/data/rwkv7/rwkv7.pth"))
  parser.add_argument(
      "--check_vocab",
      default=str(ROOT / "tests/data/rwkv7/preset/assets/tokenizer/"
                  "vocabulary.txt"))
  parser.add_argument("--check_prompt", default="The quick brown fox")
  parser.add_argument("--check_steps", type=int, default=40)
  parser.add_argument(
      "--quality_models", default="bundled",
      help="quality: comma list of model files (bundled: the bundled GRU), "
      "each @TEXT for its own held-out text (else --text)")
  parser.add_argument("--text", default=str(
      ROOT / "tests/data/tinyshakespeare_heldout_excerpt.txt"))
  parser.add_argument("--heldout", type=float, default=0.0,
                      help="quality: score the text's last this fraction "
                      "(0.1: tinyshakespeare's held-out part)")
  parser.add_argument("--chars", type=int, default=0,
                      help="quality: then its first this many characters "
                      "(0: all)")
  parser.add_argument("--prompt", default="ROMEO:",
                      help="quality: the greedy texts' prompt")
  parser.add_argument("--window", type=int, default=256)
  args = parser.parse_args()
  {"random_model": random_model, "convert": convert, "bench": bench,
   "check": check, "quality": quality}[args.command](args)


if __name__ == "__main__":
  main()
