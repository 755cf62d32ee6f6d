"""Smoke tests of tools/benchmark.py: it runs in quick mode and reports every variant.

No timing is asserted (machines are noisy): only that every section prints its
table with every variant, and that --json_out holds the same results.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARK = os.path.join(ROOT, "tools", "benchmark.py")

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


def run_benchmark(*args, timeout=600):
  with tempfile.TemporaryDirectory() as tmp:
    json_path = os.path.join(tmp, "out.json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
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
    cls.proc, cls.data = run_benchmark()
    cls.torch = torch_importable()

  def test_runs(self):
    self.assertEqual(self.proc.returncode, 0,
                     f"stdout:\n{self.proc.stdout}\nstderr:\n{self.proc.stderr[-4000:]}")

  def test_header_has_machine_facts(self):
    out = self.proc.stdout
    for word in ("machine:", "tensorflow", "oneDNN:", "tf.config.threading",
                 "load average", "QUICK MODE"):
      self.assertIn(word, out)

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

  def test_speedups_and_ratios_printed(self):
    rows = table_rows(self.proc.stdout, "## speed-ups of rnnstep")
    self.assertEqual({(r[0], int(r[1])) for r in rows},
                     {(v, b) for v in ("rnnstep", "rnnstep_graph", "rnnstep_xla")
                      for b in (1, 4)})
    for row in rows:
      self.assertGreater(float(row[-1]), 0)  # x floor

  def test_dtype_and_fidelity_tables(self):
    rows = table_rows(self.proc.stdout, "## reduced precision")
    self.assertEqual({(r[0], r[1]) for r in rows},
                     {(m, d) for m in ("default", *PATHS)
                      for d in ("float32", "bfloat16")})
    for row in rows:
      self.assertGreater(float(row[5]), 0)  # vs f32 best
    rows = table_rows(self.proc.stdout, "## reduced-precision fidelity")
    self.assertEqual([r[0] for r in rows], ["bfloat16"])
    self.assertLess(float(rows[0][1]), 1.0)  # max |logit error|, bf16 tiny model

  def test_paths_table(self):
    rows = table_rows(self.proc.stdout, "## execution paths")
    self.assertEqual({(r[0], int(r[1])) for r in rows},
                     {(d, b) for d in ("float32", "bfloat16") for b in (1, 4)})
    for row in rows:
      self.assertIn(row[-3], PATHS)  # fastest
      self.assertIn(row[-2], PATHS)  # what the default picks
      self.assertGreaterEqual(float(row[-1]), 1.0)  # default / fastest

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
    self.assertEqual([r[0] for r in rows], ["graph", "xla"])
    latency = [r for r in data["results"] if r["section"] == "latency"]
    self.assertEqual(len(latency), 2)
    for r in latency:
      self.assertGreater(r["time_to_first_text"], r["import_tf"])


if __name__ == "__main__":
  unittest.main()
