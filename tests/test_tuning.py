"""rnnstep/tuning.py and tuning_cache.py: the measured default, its cache, rnnstep-tune.

Timings are never asserted (machines are noisy): these tests pin the
mechanism -- what is measured, what is written where under which key, what is
read back, and that nothing measures unasked.
"""

import concurrent.futures
import json
import os
import stat
import subprocess
import sys
from unittest import mock

import pytest
import tensorflow as tf

from tests.support import forkserver
from tests.support import keras_reference as kr
from tests.support import reference_models
from tests.support.cli import ENV, TIMEOUT, Result, command, ok
from tests.support.cli import one_error_line, write_model

import rnnstep
from rnnstep.engine import compiling
from rnnstep.engine import cpu
from rnnstep.engine import paths
from rnnstep.engine import tuning_cache
from rnnstep import tuning

# These tests are about the choice jit_compile=None makes (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("unpinned_default_path")

LAYERS = reference_models.TINY_LAYERS
PATHS = ("xla", "graph", "elementwise")


def small_model(dtype="float32", layers=LAYERS, embedding_dim=16):
  keras_model = kr.build(layers, embedding_dim=embedding_dim, seed=2)
  return kr.rnnstep_model(keras_model, layers, dtype=dtype)


def write_cache(directory, entries, **overrides):
  """A cache file as tuning.py documents it, written here by hand."""
  data = {"format": "rnnstep-tuning", "version": 2, "entries": entries}
  data.update(overrides)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "tuning.json"), "w") as f:
    json.dump(data, f)


class TuningTestCase(tf.test.TestCase):
  """Each test has its own empty cache directory and a fresh in-process memo."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = small_model()

  def setUp(self):
    super().setUp()
    if paths.gpu_visible():
      self.skipTest("with a GPU the default is XLA whatever the cache says")
    self.cache_dir = os.path.join(self.create_tempdir().full_path, "cache")
    env = mock.patch.dict(os.environ, {"RNNSTEP_CACHE_DIR": self.cache_dir})
    env.start()
    self.addCleanup(env.stop)
    os.environ.pop("RNNSTEP_TUNING", None)
    tuning_cache.reload()
    self.addCleanup(tuning_cache.reload)

  def cache_entry(self, path, model=None, batch=1, machine=None):
    key = tuning_cache.cache_key(model or self.model, batch, machine)
    return {key: {"path": path, "batch_size": batch}}


class KeyTest(TuningTestCase):

  def test_batch_ranges(self):
    expected = {1: "1", 2: "2-4", 4: "2-4", 5: "5-8", 8: "5-8", 9: "9-16",
                16: "9-16", 17: "17-32", 32: "17-32", 33: "33-64", 64: "33-64",
                65: "65-128", 128: "65-128", 129: "129-256", 256: "129-256",
                257: ">256", 10**6: ">256"}
    for batch, bucket in expected.items():
      self.assertEqual(tuning_cache.batch_range(batch), bucket, batch)

  def test_cache_dir_precedence(self):
    with mock.patch.dict(os.environ, {"RNNSTEP_CACHE_DIR": "/a/b",
                                      "XDG_CACHE_HOME": "/x"}):
      self.assertEqual(tuning_cache.cache_file(), "/a/b/tuning.json")
    with mock.patch.dict(os.environ, {"XDG_CACHE_HOME": "/x"}):
      del os.environ["RNNSTEP_CACHE_DIR"]
      self.assertEqual(tuning_cache.cache_dir(), "/x/rnnstep")
    with mock.patch.dict(os.environ, {"HOME": "/home/u"}):
      os.environ.pop("RNNSTEP_CACHE_DIR", None)
      os.environ.pop("XDG_CACHE_HOME", None)
      self.assertEqual(tuning_cache.cache_dir(), "/home/u/.cache/rnnstep")

  def test_machine_and_model_key(self):
    machine = tuning_cache.machine_key()
    self.assertEqual(machine["tensorflow"], tf.__version__)
    self.assertGreaterEqual(machine["cores"], 1)
    self.assertTrue(set(machine["cpu_flags"]) <= set(cpu.FEATURES))
    self.assertTrue(machine["cpu"])
    self.assertEqual(machine["device"], "cpu")
    self.assertEqual(tuning_cache.model_key(self.model),
                     {"vocab_size": 65, "embedding_dim": 16,
                      "layers": [["gru", 32, True]], "dtype": "float32"})

  def test_every_key_part_separates_entries(self):
    write_cache(self.cache_dir, self.cache_entry("graph"))
    self.assertEqual(tuning_cache.cached_path(self.model, 1), "graph")
    machine = tuning_cache.machine_key()
    other_machines = [dict(machine, cpu=machine["cpu"] + " v2"),
                      dict(machine, cpu_flags=["amx_bf16", "amx_tile"]),
                      dict(machine, cores=machine["cores"] + 1),
                      dict(machine, tensorflow="2.0.0")]
    for other in other_machines:
      tuning_cache.reload()
      write_cache(self.cache_dir, self.cache_entry("graph", machine=other))
      self.assertIsNone(tuning_cache.cached_path(self.model, 1), other)
      self.assertEqual(paths.default_path(self.model, 1), "xla")
    tuning_cache.reload()
    write_cache(self.cache_dir, self.cache_entry("graph"))
    other_models = [small_model(layers=[kr.layer("gru", 24)]),
                    small_model(layers=[kr.layer("gru", 16, False)]),
                    small_model(layers=[kr.layer("lstm", 16)]),
                    small_model(embedding_dim=8),
                    small_model(dtype="bfloat16")]
    for other in other_models:
      self.assertIsNone(tuning_cache.cached_path(other, 1), tuning_cache.model_key(other))
    self.assertIsNone(tuning_cache.cached_path(self.model, 2))  # Another bucket.

  def test_lanes_are_keyed_apart(self):
    """A winner for a server's lanes answers only for as many lanes, one
    thread each (`paths.lane_path`); one call's answers only `generate`."""
    lanes_key = tuning_cache.cache_key(self.model, 32, lanes=2)
    write_cache(self.cache_dir, {lanes_key: {"path": "graph"}})
    self.assertEqual(tuning_cache.cached_path(self.model, 32, lanes=2),
                     "graph")
    self.assertEqual(paths.lane_path(self.model, 32, 2), "graph")
    self.assertIsNone(tuning_cache.cached_path(self.model, 32))
    self.assertIsNone(tuning_cache.cached_path(self.model, 32, lanes=3))
    self.assertEqual(paths.default_path(self.model, 32),
                     paths.table_path("float32", 32))
    self.assertEqual(paths.lane_path(self.model, 32, 3),
                     paths.lane_table_path("float32", 32))
    # On several threads a lane is one call: the library's answer.
    self.assertEqual(paths.lane_path(self.model, 32, 2, threads=2),
                     paths.default_path(self.model, 32))


class CacheReadTest(TuningTestCase):

  def test_default_path_takes_the_cached_winner(self):
    entries = self.cache_entry("graph", batch=1)
    entries.update(self.cache_entry("elementwise", batch=16))
    write_cache(self.cache_dir, entries)
    self.assertEqual(paths.default_path(self.model, 1), "graph")
    self.assertIs(paths.default_jit_compile(self.model, 1), False)
    # 12 is in 16's bucket; 3 was not measured, so the table answers.
    self.assertEqual(paths.default_path(self.model, 12), "elementwise")
    self.assertEqual(paths.default_path(self.model, 3), "xla")
    # jit_compile=None runs the winner: the graph path's text.
    self.assertEqual(rnnstep.generate(self.model, "AB", 8, seed=3),
                     rnnstep.generate(self.model, "AB", 8, seed=3,
                                      jit_compile=False))

  def test_read_once_per_process(self):
    write_cache(self.cache_dir, self.cache_entry("graph"))
    self.assertEqual(paths.default_path(self.model, 1), "graph")
    write_cache(self.cache_dir, self.cache_entry("elementwise"))
    self.assertEqual(paths.default_path(self.model, 1), "graph")  # Memo.
    tuning_cache.reload()
    self.assertEqual(paths.default_path(self.model, 1), "elementwise")

  def test_tuning_off(self):
    write_cache(self.cache_dir, self.cache_entry("graph"))
    for value in ("off", "OFF", "0", "false", "no"):
      with mock.patch.dict(os.environ, {"RNNSTEP_TUNING": value}):
        self.assertEqual(paths.default_path(self.model, 1), "xla", value)
    with mock.patch.dict(os.environ, {"RNNSTEP_TUNING": "on"}):
      self.assertEqual(paths.default_path(self.model, 1), "graph")

  def test_unusable_caches_are_ignored(self):
    good_key = next(iter(self.cache_entry("graph")))
    path = os.path.join(self.cache_dir, "tuning.json")
    bad_files = {
        "not_json": b"{not json",
        "binary": b"\x80\x04\x95 pickle-ish \xff\x00",
        "empty": b"",
        "a_list": b"[1, 2]",
        "wrong_format": json.dumps({"format": "other", "version": 2,
                                    "entries": {good_key: {"path": "graph"}}}
                                   ).encode(),
        # Version 1 keyed fewer CPU features: its winners may be another CPU's.
        "version_1": json.dumps({"format": "rnnstep-tuning", "version": 1,
                                 "entries": {good_key: {"path": "graph"}}}
                                ).encode(),
        "future_version": json.dumps({"format": "rnnstep-tuning", "version": 99,
                                      "entries": {good_key: {"path": "graph"}}}
                                     ).encode(),
        "bad_path": json.dumps({"format": "rnnstep-tuning", "version": 2,
                                "entries": {good_key: {"path": "gpu!"}}}
                               ).encode(),
        "entry_not_dict": json.dumps({"format": "rnnstep-tuning", "version": 2,
                                      "entries": {good_key: "graph"}}).encode(),
        "too_big": b" " * (tuning_cache.MAX_CACHE_BYTES + 1),
    }
    os.makedirs(self.cache_dir)
    for name, content in bad_files.items():
      tuning_cache.reload()
      with open(path, "wb") as f:
        f.write(content)
      self.assertIsNone(tuning_cache.cached_path(self.model, 1), name)
      self.assertEqual(paths.default_path(self.model, 1), "xla", name)
    # A directory where the file should be, and an unreadable file.
    os.remove(path)
    os.mkdir(path)
    tuning_cache.reload()
    self.assertEqual(paths.default_path(self.model, 1), "xla")
    os.rmdir(path)
    write_cache(self.cache_dir, self.cache_entry("graph"))
    os.chmod(path, 0)
    self.addCleanup(os.chmod, path, stat.S_IRUSR | stat.S_IWUSR)
    if not os.access(path, os.R_OK):  # Root reads it anyway.
      tuning_cache.reload()
      self.assertEqual(paths.default_path(self.model, 1), "xla")

  def test_missing_cache_dir_is_not_created_by_reading(self):
    self.assertEqual(paths.default_path(self.model, 1), "xla")
    rnnstep.generate(self.model, "AB", 4, seed=1)
    self.assertFalse(os.path.exists(self.cache_dir))
    # The call left XLA's program compiling on a thread of its own: done
    # before the test ends, it never runs into the next tests (it crashed a
    # worker, a segfault in that thread's call while a later test removed
    # its temporary folder; the tests' own hook waits after tearDown, which
    # removes that folder).
    self.assertTrue(compiling.wait_idle(300))


class TuneTest(TuningTestCase):

  @pytest.mark.slow  # Measures every path.
  def test_tune_measures_every_path_and_writes_the_cache(self):
    lines = []
    report = tuning.tune(self.model, batch_sizes=(1, 3), num_steps=8,
                         rounds=2, progress=lines.append)
    self.assertEqual(report["cache_file"],
                     os.path.join(self.cache_dir, "tuning.json"))
    self.assertIsNone(report["cache_error"])
    self.assertEqual([r["batch_size"] for r in report["results"]], [1, 3])
    for row in report["results"]:
      self.assertEqual(set(row["ms_per_1000_steps"]), set(PATHS))
      for path in PATHS:
        self.assertLen(row["round_seconds"][path], 2)
        self.assertGreater(row["ms_per_1000_steps"][path], 0)
      ms = row["ms_per_1000_steps"]
      self.assertEqual(row["fastest"], min(ms, key=ms.get))
      self.assertEqual(row["previous_default"], "xla")  # The table's answer.
      self.assertEqual((row["num_steps"], row["rounds"]), (8, 2))
    self.assertIn("batch 3: round 2, 8 steps", lines)
    # The file holds one entry per range, keyed as `cache_key`, JSON only.
    with open(report["cache_file"]) as f:
      data = json.load(f)
    self.assertEqual((data["format"], data["version"]), ("rnnstep-tuning", 2))
    for row in report["results"]:
      entry = data["entries"][tuning_cache.cache_key(self.model, row["batch_size"])]
      self.assertEqual(entry["path"], row["fastest"])
    self.assertEqual(os.listdir(self.cache_dir), ["tuning.json"])  # No temps.
    # This process and a fresh read both use the winners.
    self.assertEqual(paths.default_path(self.model, 4),
                     report["results"][1]["fastest"])
    tuning_cache.reload()
    self.assertEqual(paths.default_path(self.model, 1),
                     report["results"][0]["fastest"])

  @pytest.mark.slow  # Measures every path.
  def test_tune_keeps_other_entries_and_can_skip_saving(self):
    other = self.cache_entry("graph", batch=64)
    write_cache(self.cache_dir, other)
    tuning.tune(self.model, batch_sizes=[1], num_steps=8, rounds=1)
    with open(os.path.join(self.cache_dir, "tuning.json")) as f:
      entries = json.load(f)["entries"]
    self.assertEqual(set(entries), set(other) | {tuning_cache.cache_key(self.model, 1)})
    with open(os.path.join(self.cache_dir, "tuning.json"), "rb") as f:
      before = f.read()
    report = tuning.tune(self.model, batch_sizes=[1], num_steps=8, rounds=1,
                         save=False)
    self.assertIsNone(report["cache_file"])
    with mock.patch.dict(os.environ, {"RNNSTEP_TUNING": "off"}):
      report = tuning.tune(self.model, batch_sizes=[1], num_steps=8, rounds=1)
    self.assertIsNone(report["cache_file"])
    with open(os.path.join(self.cache_dir, "tuning.json"), "rb") as f:
      self.assertEqual(f.read(), before)

  @pytest.mark.slow  # Measures every path.
  def test_unwritable_cache_is_reported_not_raised(self):
    blocker = os.path.join(self.create_tempdir().full_path, "file")
    with open(blocker, "w") as f:
      f.write("x")
    with mock.patch.dict(os.environ, {"RNNSTEP_CACHE_DIR": blocker}):
      report = tuning.tune(self.model, batch_sizes=[1], num_steps=8, rounds=1)
      self.assertIsNone(report["cache_file"])
      self.assertIn("cannot write the tuning cache", report["cache_error"])
      self.assertIn("RNNSTEP_CACHE_DIR", report["cache_error"])
      # This process still uses what it measured.
      self.assertEqual(paths.default_path(self.model, 1),
                       report["results"][0]["fastest"])

  def test_bad_arguments(self):
    for kwargs, pattern in [
        (dict(batch_sizes=[]), "batch_sizes is empty"),
        (dict(batch_sizes=[0]), "batch_sizes must be a positive integer"),
        (dict(batch_sizes=[1.5]), "batch_sizes must be a positive integer"),
        (dict(num_steps=0), "num_steps must be a positive integer"),
        (dict(rounds=True), "rounds must be a positive integer"),
        (dict(budget_seconds=float("nan")), "budget_seconds must be"),
        (dict(lanes=0), "lanes must be a positive integer"),
        # This process runs TensorFlow's own pools, not a lane's one thread.
        (dict(lanes=2), "lanes: each lane runs on one thread"),
    ]:
      with self.assertRaisesRegex(ValueError, pattern):
        tuning.tune(self.model, **kwargs)
    self.assertFalse(os.path.exists(self.cache_dir))

  def test_exported_lazily(self):
    self.assertIs(rnnstep.tune, tuning.tune)
    self.assertIn("tune", rnnstep.__all__)


@pytest.mark.slow  # rnnstep-tune and rnnstep-generate subprocesses
class CommandLineTest(TuningTestCase):
  """rnnstep-tune, and that a plain rnnstep-generate never measures."""

  def test_commands(self):
    tmp = self.create_tempdir().full_path
    weights = os.path.join(tmp, "model.npz")
    write_model(weights)
    tune_dir, generate_dir = os.path.join(tmp, "tune"), os.path.join(tmp, "gen")
    tune_cmd = command("rnnstep-tune", "rnnstep.cli.tune")
    # The generate run must be this tree's code: `python -m`, not the console
    # script of whichever checkout is installed.
    generate_cmd = [sys.executable, "-m", "rnnstep.cli.generate"]
    # Batch sizes whose XLA programs (batch buckets 1 and 4) TuneTest has
    # compiled in this process, so that the runs can load them from the
    # suite's persistent XLA cache (tests/conftest.py) instead of compiling.
    runs = {
        "tune": (tune_cmd + [f"--weights={weights}", "--batch_sizes=1,3",
                             "--num_steps=6", "--rounds=2"], tune_dir),
        "bad_batch": (tune_cmd + ["--batch_sizes=1,x"], tune_dir + "_bad"),
        "lanes": (tune_cmd + [f"--weights={weights}", "--batch_sizes=3",
                              "--num_steps=6", "--rounds=1", "--lanes=2"],
                  tune_dir + "_lanes"),
        # --nocache: the compiled-artifact cache (its own directory entry,
        # written by a detached child) is tests/test_fast_path.py's.
        "generate": (generate_cmd + [f"--weights={weights}", "--num_steps=20",
                                     "--seed=1", "--prompt=AB", "--nocache"],
                     generate_dir),
    }

    def run(args, cache):
      proc = forkserver.run(args, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=TIMEOUT,
                            env=dict(ENV, RNNSTEP_CACHE_DIR=cache))
      return Result(proc.returncode, proc.stdout, proc.stderr)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
      futures = {name: pool.submit(run, *spec) for name, spec in runs.items()}
      results = {name: future.result() for name, future in futures.items()}
    tuned = results["tune"]
    self.assertEqual(tuned.returncode, 0, tuned)
    # stderr has progress lines only (no TensorFlow noise, no errors).
    self.assertEqual(tuned.stderr_lines, [
        f"rnnstep-tune: batch {b}: {what}" for b in (1, 3)
        for what in ("warming up (compiling) xla, graph, elementwise",
                     "round 1, 6 steps", "round 2, 6 steps")])
    out = tuned.stdout.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("batch"))
    rows = [line.split() for line in out[header + 2:header + 4]]
    self.assertEqual([(r[0], r[1], r[2], r[3]) for r in rows],
                     [("1", "1", "6", "2"), ("3", "2-4", "6", "2")])
    for r in rows:
      times = dict(zip(out[header].split()[4:7], map(float, r[4:7])))
      self.assertEqual(set(times), set(PATHS))
      self.assertEqual(r[7], min(times, key=times.get))
    self.assertEqual(out[-1], f"saved to {tune_dir}/tuning.json")
    with open(os.path.join(tune_dir, "tuning.json")) as f:
      self.assertLen(json.load(f)["entries"], 2)
    # --lanes: two concurrent calls on one thread each, kept for lanes.
    lanes = results["lanes"]
    self.assertEqual(lanes.returncode, 0, lanes)
    self.assertIn("2 lanes at once, one thread each", lanes.stdout)
    with open(os.path.join(tune_dir + "_lanes", "tuning.json")) as f:
      (key,) = json.load(f)["entries"]
    self.assertEqual(json.loads(key)["lanes"], 2)
    one_error_line(results["bad_batch"], 2)
    self.assertIn("--batch_sizes", results["bad_batch"].stderr_lines[0])
    self.assertFalse(os.path.exists(tune_dir + "_bad"))
    # A plain generate with a cold cache prints its text and measures nothing:
    # it does not even create the cache directory.
    self.assertTrue(ok(results["generate"]).startswith("AB"))
    self.assertFalse(os.path.exists(generate_dir))


if __name__ == "__main__":
  tf.test.main()
