"""Smoke tests of tools/benchmark.py: it runs in quick mode and reports every variant.

No timing is asserted (machines are noisy). What is asserted could fail: every
section prints every (variant, batch) row; every derived figure (ratios,
"fastest", the floor) is recomputed here from the raw medians in --json_out
and must equal what was printed; and the default column follows the tuning
cache (a winner planted in it) or, without one, the built-in table.
"""

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

import pytest

from tests.support import keras_reference as kr

from rnnstep.engine import paths
from rnnstep.engine import tuning_cache

# The exhaustive tier (-m exhaustive): tools/benchmark.py, a developer's tool,
# runs in subprocesses over every section (two minutes on two cores); run it
# when touching tools/ or the figures it reports.
pytestmark = pytest.mark.exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(ROOT, "tools", "benchmark.py")
MID_BATCH_LOOPS = os.path.join(ROOT, "tools", "mid_batch_loops.py")

DEFAULT_VARIANTS = ["eager_keras", "onestep_keras", "rnnstep", "rnnstep_graph",
                    "rnnstep_xla", "floor", "floor_graph", "torch_gru",
                    "torch_fused"]
PATHS = ("xla", "graph", "elementwise")
TORCH_VARIANTS = ["torch_gru", "torch_fused"]


def torch_importable() -> bool:
  if importlib.util.find_spec("torch") is None:
    return False
  probe = subprocess.run([sys.executable, "-c", "import torch"],
                         capture_output=True, check=False)
  return probe.returncode == 0


# The --quick model (tools/bench/settings.py) and the winner planted for it.
QUICK_LAYERS = [kr.layer("gru", 64)]
PLANTED = ("float32", 1, "elementwise")  # The table would say xla.


def quick_model(dtype):
  """An rnnstep Model of the quick benchmark's shape (for its cache key)."""
  return kr.rnnstep_model(kr.build(QUICK_LAYERS, embedding_dim=16), QUICK_LAYERS,
                          dtype=dtype)


def plant_winner(cache_dir):
  """A tuning cache naming PLANTED's path for the quick model; returns its dir."""
  dtype, batch, path = PLANTED
  key = tuning_cache.cache_key(quick_model(dtype), batch)
  os.makedirs(cache_dir, exist_ok=True)
  with open(os.path.join(cache_dir, tuning_cache.CACHE_FILE), "w") as f:
    json.dump({"format": tuning_cache.FORMAT, "version": tuning_cache.VERSION,
               "entries": {key: {"path": path}}}, f)
  return cache_dir


def expected_default(dtype, batch):
  """The path the benchmark's default must take with the planted cache."""
  if paths.gpu_visible():
    return "xla"
  if (dtype, batch) == PLANTED[:2]:
    return PLANTED[2]
  return paths.table_path(dtype, batch)


def number(cell):
  """A printed figure as a float: '1,234' -> 1234.0, '41,305*' -> 41305.0."""
  return float(cell.rstrip("*%").replace(",", ""))


def run_benchmark(*args, timeout=600, cache_dir=None):
  with tempfile.TemporaryDirectory() as tmp:
    json_path = os.path.join(tmp, "out.json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               RNNSTEP_CACHE_DIR=cache_dir or os.path.join(tmp, "cache"))
    # The benchmark's "default" is what users get: not the suite's pinned
    # graph path (tests/conftest.py).
    env.pop("RNNSTEP_DEFAULT_PATH", None)
    proc = subprocess.run(
        [sys.executable, BENCHMARK, "--quick", f"--json_out={json_path}", *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False)
    data = None
    if os.path.exists(json_path):
      with open(json_path) as f:
        data = json.load(f)
  return proc, data


def table_rows(stdout, title_prefix):
  """The cells of each row of the table under the heading `title_prefix`.

  A table is its heading, a column header, a line of dashes, then rows up to
  the first empty line.
  """
  lines = stdout.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(title_prefix))
  dashes = next(i for i in range(start, len(lines)) if lines[i].startswith("---"))
  rows = []
  for line in lines[dashes + 1:]:
    if not line.strip():
      break
    rows.append(line.split())
  return rows


class QuickBenchmarkTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    cls.cache = tempfile.TemporaryDirectory()
    cls.proc, cls.data = run_benchmark(
        cache_dir=plant_winner(os.path.join(cls.cache.name, "cache")))
    cls.torch = torch_importable()

  @classmethod
  def tearDownClass(cls):
    cls.cache.cleanup()

  def results(self, section):
    return [r for r in self.data["results"] if r["section"] == section]

  def assertPrinted(self, printed, exact, decimals=2):
    """`printed` is `exact` rounded to `decimals` places."""
    self.assertAlmostEqual(number(printed), exact,
                           delta=0.5 * 10**-decimals + 1e-9 * abs(exact))

  def test_runs(self):
    self.assertEqual(self.proc.returncode, 0,
                     f"stdout:\n{self.proc.stdout}\nstderr:\n{self.proc.stderr[-4000:]}")

  def test_header_has_machine_facts(self):
    out = self.proc.stdout
    for word in ("machine:", "tensorflow", "oneDNN:", "tf.config.threading",
                 "load average", "QUICK MODE"):
      self.assertIn(word, out)
    machine = next(line for line in out.splitlines()
                   if line.startswith("machine:"))
    facts = self.data["machine"]
    for part in (facts["cpu"], f"{facts['cores']} cores", f"L3 {facts['l3']}",
                 f"AMX {'yes' if facts['amx'] else 'no'}",
                 f"AVX512-BF16 {'yes' if facts['avx512_bf16'] else 'no'}",
                 f"TF {facts['tensorflow']}"):
      self.assertIn(part, machine)
    with open("/proc/cpuinfo") as f:
      has_bf16 = " avx512_bf16" in f.read()
    self.assertEqual(facts["avx512_bf16"], has_bf16)

  def test_speed_table_has_every_variant_and_batch(self):
    rows = table_rows(self.proc.stdout, "## speed:")
    seen = {(row[0], int(row[1])) for row in rows}
    expected = [v for v in DEFAULT_VARIANTS
                if self.torch or v not in TORCH_VARIANTS]
    for variant in expected:
      self.assertIn((variant, 1), seen, self.proc.stdout)
      if variant != "eager_keras":  # Batch 1 only by default.
        self.assertIn((variant, 4), seen, self.proc.stdout)
    if not self.torch:
      self.assertFalse({v for v, _ in seen} & set(TORCH_VARIANTS))
      self.assertIn("skipped, torch not importable", self.proc.stdout)
    self.assertIn("* eager_keras ran", self.proc.stdout)

  def test_speed_table_matches_the_medians(self):
    ms = {(r["variant"], r["batch"]): r["ms_per_1000_chars"]
          for r in self.results("speed")}
    rows = table_rows(self.proc.stdout, "## speed:")
    self.assertEqual(len(rows), len(ms))
    for row in rows:
      variant, batch = row[0], int(row[1])
      mine = ms[(variant, batch)]
      self.assertAlmostEqual(number(row[2]), mine,
                             delta=0.5 + 0.005 * mine)  # Printed as '1,234'.
      floor = ms[("floor", batch)]
      best = min(floor, ms[("floor_graph", batch)])
      self.assertPrinted(row[4], mine / floor)  # x floor
      self.assertPrinted(row[5], mine / best)  # x best
      self.assertEqual(row[2].endswith("*"), variant == "eager_keras")

  def test_speedups_and_ratios_printed(self):
    rows = table_rows(self.proc.stdout, "## speed-ups of rnnstep")
    self.assertEqual({(r[0], int(r[1])) for r in rows},
                     {(v, b) for v in ("rnnstep", "rnnstep_graph", "rnnstep_xla")
                      for b in (1, 4)})
    ms = {(r["variant"], r["batch"]): r["ms_per_1000_chars"]
          for r in self.results("speed")}
    for row in rows:
      mine = ms[(row[0], int(row[1]))]
      others = ["eager_keras", "onestep_keras", "torch_gru", "torch_fused"]
      for cell, other in zip(row[2:6], others):
        theirs = ms.get((other, int(row[1])))
        if theirs is None:
          self.assertEqual(cell, "-")
        else:
          self.assertPrinted(cell, theirs / mine)  # > 1: rnnstep faster.
      self.assertPrinted(row[6], mine / ms[("floor", int(row[1]))])  # x floor

  def test_dtype_and_fidelity_tables(self):
    rows = table_rows(self.proc.stdout, "## reduced precision")
    self.assertEqual({(r[0], r[1]) for r in rows},
                     {(m, d) for m in ("default", *PATHS)
                      for d in ("float32", "bfloat16")})
    ms = {(r["mode"], r["dtype"]): r["ms_per_1000_chars"]
          for r in self.results("dtype")}
    best_f32 = min(v for (_, d), v in ms.items() if d == "float32")
    for row in rows:
      mine = ms[(row[0], row[1])]
      self.assertPrinted(row[4], ms[(row[0], "float32")] / mine)  # vs f32
      self.assertPrinted(row[5], best_f32 / mine)  # vs f32 best
    rows = table_rows(self.proc.stdout, "## reduced-precision fidelity")
    self.assertEqual([r[0] for r in rows], ["bfloat16"])
    self.assertLess(float(rows[0][1]), 1.0)  # max |logit error|, bf16 tiny model

  def test_paths_table(self):
    rows = table_rows(self.proc.stdout, "## execution paths")
    self.assertEqual({(r[0], int(r[1])) for r in rows},
                     {(d, b) for d in ("float32", "bfloat16") for b in (1, 4)})
    results = {(r["dtype"], r["batch"]): r for r in self.results("paths")}
    for row in rows:
      result = results[(row[0], int(row[1]))]
      ms = result["ms_per_1000_chars"]
      self.assertEqual(row[-3], min(ms, key=ms.get))  # fastest = argmin
      self.assertEqual(row[-3], result["fastest"])
      # The default column follows the planted cache, else the table.
      self.assertEqual(row[-2], expected_default(row[0], int(row[1])))
      self.assertPrinted(row[-1], ms[row[-2]] / ms[row[-3]])  # x fastest
      for cell, path in zip(row[2:5], PATHS):
        self.assertAlmostEqual(number(cell), ms[path], delta=0.5 + 0.005 * ms[path])

  def test_floors_table(self):
    rows = table_rows(self.proc.stdout, "## floors")
    cases = [("float32", 1), ("float32", 4), ("bfloat16", 4)]
    self.assertEqual([(r[0], int(r[1])) for r in rows], cases)
    results = {(r["dtype"], r["batch"]): r for r in self.results("floors")}
    self.assertEqual(list(results), cases)
    for row in rows:
      dtype, batch = row[0], int(row[1])
      result = results[(dtype, batch)]
      ms = result["ms_per_1000_steps"]
      self.assertEqual(set(ms), {"floor_xla", "floor_graph", "default", *PATHS})
      floor = min(ms["floor_xla"], ms["floor_graph"])
      self.assertEqual(result["floor"], floor)
      fastest = min(PATHS, key=ms.get)
      took = expected_default(dtype, batch)
      cells = dict(zip(["chars", "floor_xla", "floor_graph", "floor", *PATHS,
                        "fastest", "default", "took", "from", "dflt/fast",
                        "fast/flr", "dflt/flr"], row[2:]))
      self.assertEqual(int(cells["chars"]), 40)
      for name in ("floor_xla", "floor_graph", *PATHS, "default"):
        self.assertPrinted(cells[name], ms[name], decimals=1)
      self.assertPrinted(cells["floor"], floor, decimals=1)
      self.assertEqual(cells["fastest"], fastest)
      self.assertEqual(cells["took"], took)
      self.assertEqual(cells["from"],
                       "tuned" if (dtype, batch) == PLANTED[:2] else "table")
      # Ratios are paired: the median over rounds of each round's ratio.
      rounds = result["round_seconds"]
      floor_rounds = [min(x, g) for x, g in zip(rounds["floor_xla"],
                                                 rounds["floor_graph"])]

      def paired(times, reference):
        return statistics.median(t / r for t, r in zip(times, reference))

      default_over_fastest = paired(rounds["default"], rounds[fastest])
      self.assertPrinted(cells["dflt/fast"], default_over_fastest)
      self.assertPrinted(cells["fast/flr"], paired(rounds[fastest], floor_rounds))
      self.assertPrinted(cells["dflt/flr"], paired(rounds["default"], floor_rounds))
      self.assertEqual(result["default_over_fastest"], default_over_fastest)

  def test_decoding_ratios_are_the_medians_ratios(self):
    rows = self.results("decoding")
    ms = next(r["ms"] for r in rows if "ms" in r)
    self.assertEqual(ms["floor_1"], min(ms["floor_xla"], ms["floor_graph"]))
    ratios = {r["ratio"]: r for r in rows if "ratio" in r}
    self.assertEqual(set(ratios), {"beam_8/sample_8", "penalty_ngram_1/sample_1",
                                   "scores_1/sample_1", "sample_1/floor_1",
                                   "regex_1/sample_1", "regex_64/sample_64"})
    for name, row in ratios.items():
      a, b = name.split("/")
      self.assertAlmostEqual(row["value"], ms[a] / ms[b], places=9)
      printed = next(line for line in self.proc.stdout.splitlines()
                     if line.startswith(f"{a} / {b}:"))
      self.assertPrinted(printed.split()[3], ms[a] / ms[b])
      if row["target"] is not None:
        met = ms[a] / ms[b] <= row["target"]
        self.assertIn("met" if met else "NOT met", printed)

  def test_words_table(self):
    # The word_language_model section at its --quick size (V=300, nhid 16,
    # batch 1).
    torch_rows = ["recipe", "torchscript"] if self.torch else []
    names = ["rnnstep", *(f"rnnstep_{p}" for p in PATHS), *torch_rows,
             "floor_xla", "floor_graph", "floor"]
    rows = table_rows(self.proc.stdout, "## words:")
    self.assertEqual([(r[0], int(r[1])) for r in rows], [(n, 1) for n in names])
    results = {r["batch"]: r for r in self.results("words")}
    self.assertEqual(set(results), {1})
    for row in rows:
      result = results[int(row[1])]
      rounds, steps = result["round_seconds"], result["steps"]
      floor = [min(x, g) for x, g in zip(rounds["floor_xla"],
                                         rounds["floor_graph"])]
      mine = floor if row[0] == "floor" else rounds[row[0]]
      per_step = statistics.median(mine) / steps.get(row[0], steps["floor_xla"])
      self.assertPrinted(row[2], per_step * 1e3, decimals=3)  # ms/step
      self.assertEqual(row[2].endswith("*"), row[0] == "recipe")
      self.assertAlmostEqual(number(row[3]), result["batch"] / per_step,
                             delta=0.5 + 1e-3 * result["batch"] / per_step)
      self.assertPrinted(row[4], statistics.median(  # x floor, paired
          (t / steps.get(row[0], steps["floor_xla"])) / (f / steps["floor_xla"])
          for t, f in zip(mine, floor)))
      self.assertEqual(row[5] == "-", not self.torch)
    for batch, result in results.items():
      # No tuning cache entry is the words model's: the built-in table's pick.
      self.assertEqual(result["default_path"],
                       "xla" if paths.gpu_visible()
                       else paths.table_path("float32", batch))
      self.assertIn(result["best_path"], [f"rnnstep_{p}" for p in PATHS])

  def test_json_out(self):
    self.assertIsNotNone(self.data)
    speed = [r for r in self.data["results"] if r["section"] == "speed"]
    self.assertTrue(all(r["ms_per_1000_chars"] > 0 for r in speed))
    self.assertIn("tf_intra_op_threads", self.data["machine"])
    self.assertEqual(
        {r["variant"] for r in speed},
        {v for v in DEFAULT_VARIANTS if self.torch or v not in TORCH_VARIANTS})


class SkipsTorchTest(unittest.TestCase):

  def test_torch_absent_is_skipped_gracefully(self):
    if not torch_importable():  # The quick run above met torch absent itself.
      self.skipTest("torch is absent here: QuickBenchmarkTest checks the skip")
    # A directory whose torch package fails to import stands in for "absent".
    with tempfile.TemporaryDirectory() as fake:
      os.makedirs(os.path.join(fake, "torch"))
      with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
        f.write("raise ImportError('no torch here')\n")
      env_path = os.pathsep.join([fake, os.environ.get("PYTHONPATH", "")])
      with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, BENCHMARK, "--quick", "--sections=speed",
             "--variants=rnnstep_xla,floor,torch_gru,torch_fused",
             "--batch_sizes=1"],
            capture_output=True, text=True, timeout=600, check=False, cwd=tmp,
            env=dict(os.environ, PYTHONPATH=env_path, TF_CPP_MIN_LOG_LEVEL="3"))
    self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
    self.assertIn("skipped, torch not importable: torch_gru, torch_fused",
                  proc.stdout)
    rows = table_rows(proc.stdout, "## speed:")
    self.assertEqual({r[0] for r in rows}, {"rnnstep_xla", "floor"})


class LatencySectionTest(unittest.TestCase):

  def test_latency_section(self):
    proc, data = run_benchmark("--sections=latency")
    self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
    rows = table_rows(proc.stdout, "## first-call latency")
    # The TensorFlow paths, and the warm command line's fast path (the cached
    # LiteRT artifact; its child refuses to report if TensorFlow came in).
    self.assertEqual([r[0] for r in rows], ["graph", "xla", "litert"])
    latency = [r for r in data["results"] if r["section"] == "latency"]
    self.assertEqual([r["mode"] for r in latency], ["graph", "xla", "litert"])
    for r in latency:
      self.assertGreater(r["time_to_first_text"], r["import_runtime"])


GPU_CHECK = os.path.join(ROOT, "tools", "bench", "gpu.py")


class MidBatchLoopsTest(unittest.TestCase):
  """tools/mid_batch_loops.py on a tiny shape: every loop runs and is printed."""

  def test_every_loop_is_timed(self):
    proc = subprocess.run(
        [sys.executable, MID_BATCH_LOOPS, "--units=8", "--vocab_size=5",
         "--steps=3", "--rounds=1", "--batch_sizes=2"],
        capture_output=True, text=True, timeout=600, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
    rows = table_rows(proc.stdout, "## mid-batch loops")
    self.assertEqual([row[0] for row in rows], ["2"])
    self.assertEqual(len(rows[0]), 1 + 2 * 5)  # µs and (ratio) per loop.
    self.assertEqual(rows[0][2], "(1.00x)")  # floor_graph against itself.
    self.assertTrue(proc.stdout.startswith("machine: "))


class GpuCheckTest(unittest.TestCase):
  """tools/bench/gpu.py on a tiny model, on whatever device this machine has
  (the CPU here): every line it documents is printed, and the call counts
  prove one function execution per generation on every path."""

  def test_gpu_check_runs_on_a_tiny_model(self):
    with tempfile.TemporaryDirectory() as tmp:
      json_path = os.path.join(tmp, "gpu.json")
      proc = subprocess.run(
          [sys.executable, GPU_CHECK, "--units=16", "--embedding_dim=8",
           "--batch_sizes=1", "--num_steps=10", "--rounds=1",
           "--bandwidth_mb=4", "--keras_steps=3", f"--json_out={json_path}"],
          capture_output=True, text=True, timeout=600, check=False, cwd=tmp,
          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                   RNNSTEP_CACHE_DIR=os.path.join(tmp, "cache")))
      self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
      with open(json_path) as f:
        data = json.load(f)
    lines = proc.stdout.splitlines()
    words = [line.split(":", 1)[0].split()[0] for line in lines]
    self.assertEqual(sorted(set(words)), ["bound", "calls", "device", "done",
                                          "keras", "model", "path", "step"])
    device = lines[0]
    if "GPU:0" not in device:
      for part in ("device: CPU", "AMX", "AVX512-BF16", "AVX-512", "AVX2",
                   "cores", "TF "):
        self.assertIn(part, device)
    paths_seen = {(r["path"], r["batch"]) for r in data["paths"]}
    self.assertEqual(paths_seen, {(p, 1) for p in (*PATHS, "default")})
    for row in data["paths"]:
      self.assertGreater(row["chars_per_second"], 0)
      self.assertIn(row["took"], PATHS)
    self.assertEqual(set(data["calls"]), set(PATHS))
    for path, counts in data["calls"].items():
      for n, count in counts.items():
        self.assertEqual(count["functions"], 1, (path, n))
      self.assertIn(f"calls {path} B=1: 1 / 1 function executions",
                    proc.stdout)
    self.assertEqual(proc.stdout.count("one call, no per-step sync"), 3)
    self.assertGreater(data["bandwidth_bytes_per_second"], 0)
    self.assertEqual(data["weight_bytes_per_step"],
                     4 * (16 * 48 + 16 * 65 + 65 + 48) + 4 * 48)
    self.assertGreater(data["keras"]["onestep_chars_per_second"], 0)


if __name__ == "__main__":
  unittest.main()
