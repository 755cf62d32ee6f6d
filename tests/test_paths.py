"""rnnstep/paths.py: path names, and the path `jit_compile=None` takes.

The tables' contents are measurements (benchmarks/results/); these tests pin how
they are read: per CPU kind and dtype, the padding rule, the cache first, a
GPU last word, and the one-line note for reduced precision without its
arithmetic.
"""

import os
import pathlib
import types
from unittest import mock

from absl import logging
import numpy as np
import pytest
import tensorflow as tf

from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr

import rnnstep
from rnnstep.engine import cpu
from rnnstep.engine import paths
from rnnstep.engine import tuning_cache
from rnnstep.model import model_file

# These tests are about the choice jit_compile=None makes (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("unpinned_default_path")

LAYERS = [kr.layer("gru", 16)]
EXCERPT = (pathlib.Path(__file__).resolve().parent / "data"
           / "tinyshakespeare_heldout_excerpt.txt")

# CPUs as /proc/cpuinfo would describe them, one per kind.
ZEN3 = cpu.Info("AMD EPYC 7B13", ("avx2", "fma"), 2)
ZEN4 = cpu.Info("AMD EPYC 9B14", ("avx512_bf16", "avx512f", "avx2", "fma"), 2)
SAPPHIRE_RAPIDS = cpu.Info(
    "Intel(R) Xeon(R) Platinum 8481C",
    ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f", "avx2",
     "fma"), 2)
SKYLAKE = cpu.Info("Intel(R) Xeon(R) CPU @ 2.00GHz", ("avx512f", "avx2", "fma"),
                   2)
ARM = cpu.Info("aarch64", (), 4)


def small_models():
  config = model_file.ModelConfig(16, tuple(LAYERS))
  tensors = kr.weights_of(kr.build(LAYERS, seed=2), LAYERS)
  vocab = kr.default_vocab(65)
  return (rnnstep.Model(config, vocab, tensors),
          rnnstep.Model(config, vocab, tensors, dtype="bfloat16"))


class JitCompileTest(tf.test.TestCase):

  def test_names_and_values(self):
    for path, value in paths.JIT_COMPILE.items():
      self.assertEqual(paths.from_jit_compile(value), path)
      self.assertEqual(paths.jit_compile_of(path), value)
    self.assertEqual(paths.from_jit_compile(None), paths.AUTO)
    self.assertEqual(paths.from_jit_compile(np.bool_(True)), paths.XLA)
    for bad in ("xla", 1, "auto"):
      with self.assertRaisesRegex(ValueError, "jit_compile must be"):
        paths.from_jit_compile(bad)
    with self.assertRaisesRegex(ValueError, "path must be one of"):
      paths.jit_compile_of(paths.AUTO)


class CpuKindTest(tf.test.TestCase):

  def test_kinds(self):
    self.assertEqual(cpu.kind(SAPPHIRE_RAPIDS), "amx")
    self.assertEqual(cpu.kind(ZEN4), "avx512_bf16")
    self.assertEqual(cpu.kind(SKYLAKE), "avx512")
    self.assertEqual(cpu.kind(ZEN3), "avx2")
    self.assertEqual(cpu.kind(ARM), "other")
    self.assertIn(cpu.kind(), cpu.KINDS)
    self.assertEqual(set(paths.FASTEST_PATHS), set(cpu.KINDS))

  def test_reduced_arithmetic(self):
    self.assertTrue(cpu.has_reduced_arithmetic("bfloat16", SAPPHIRE_RAPIDS))
    self.assertTrue(cpu.has_reduced_arithmetic("bfloat16", ZEN4))
    for other in (ZEN3, SKYLAKE, ARM):
      self.assertFalse(cpu.has_reduced_arithmetic("bfloat16", other))
    for any_cpu in (ZEN3, ZEN4, SAPPHIRE_RAPIDS):
      self.assertTrue(cpu.has_reduced_arithmetic("float32", any_cpu))
      self.assertFalse(cpu.has_reduced_arithmetic("float16", any_cpu))

  def test_this_machine(self):
    this = cpu.info()
    self.assertTrue(this.name)
    self.assertGreaterEqual(this.cores, 1)
    self.assertTrue(set(this.features) <= set(cpu.FEATURES))
    if os.path.exists("/proc/cpuinfo"):
      with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
      self.assertEqual(set(this.features), set(cpu.FEATURES) & set(flags))


class TablePathTest(tf.test.TestCase):

  def test_every_kind_and_dtype_has_bands_without_gaps(self):
    for kind in cpu.KINDS:
      for dtype in ("float32", "float16", "bfloat16"):
        for batch in range(1, 600):
          self.assertIn(paths.table_path(dtype, batch, kind), paths.CONCRETE)

  def test_measured_bands(self):
    for kind in cpu.KINDS:
      self.assertEqual(paths.table_path("float32", 1, kind), "xla")
      self.assertEqual(paths.table_path("float32", 256, kind), "xla")
      self.assertEqual(paths.table_path("bfloat16", 1, kind), "xla")
    # Sapphire Rapids: XLA's dot is slow at 17-48 rows.
    self.assertEqual(paths.table_path("float32", 32, "amx"), "elementwise")
    self.assertEqual(paths.table_path("float32", 64, "amx"), "xla")
    # Zen 4: oneDNN wins at 33-64 rows.
    self.assertEqual(paths.table_path("float32", 32, "avx512_bf16"), "xla")
    self.assertEqual(paths.table_path("float32", 64, "avx512_bf16"),
                     "elementwise")
    self.assertEqual(paths.table_path("float32", 128, "avx512_bf16"), "xla")
    # Zen 3: oneDNN wins at 17-32 rows; XLA again at 64.
    self.assertEqual(paths.table_path("float32", 16, "avx2"), "xla")
    self.assertEqual(paths.table_path("float32", 32, "avx2"), "elementwise")
    self.assertEqual(paths.table_path("float32", 64, "avx2"), "xla")
    # bfloat16: oneDNN's bf16 kernels where there is bf16 arithmetic, XLA
    # where there is none.
    for kind in ("amx", "avx512_bf16"):
      self.assertEqual(paths.table_path("bfloat16", 64, kind), "elementwise")
      self.assertEqual(paths.table_path("bfloat16", 256, kind), "elementwise")
    for kind in ("avx512", "avx2", "other"):
      self.assertEqual(paths.table_path("bfloat16", 256, kind), "xla")
    # AVX-512 without bf16: Zen 4's float32 bands.
    for batch in (1, 32, 64, 128):
      self.assertEqual(paths.table_path("float32", batch, "avx512"),
                       paths.table_path("float32", batch, "avx512_bf16"))

  def test_padding_rule(self):
    # XLA would pad 48 rows to 64 and 65 to 80: the exact batch wins there...
    for kind in ("avx512_bf16", "avx2"):
      self.assertEqual(paths.table_path("float32", 65, kind), "elementwise")
    self.assertEqual(paths.table_path("float32", 48, "avx2"), "elementwise")
    self.assertEqual(paths.table_path("float32", 63, "avx2"), "xla")
    # ... but not where the elementwise path never wins (no bf16 arithmetic).
    for batch in (24, 48, 65):
      self.assertEqual(paths.table_path("bfloat16", batch, "avx2"), "xla")

  def test_table_follows_this_cpu(self):
    for batch in (1, 32, 64, 256):
      self.assertEqual(paths.table_path("float32", batch),
                       paths.table_path("float32", batch, cpu.kind()))


class LanePathTest(tf.test.TestCase):
  """The path for one of rnnstep-serve's lanes (one thread, beside others)."""

  def setUp(self):
    super().setUp()
    if paths.gpu_visible():
      self.skipTest("with a GPU the default is XLA at every batch")
    env = mock.patch.dict(os.environ, {
        "RNNSTEP_CACHE_DIR": os.path.join(self.create_tempdir().full_path,
                                          "cache")})
    env.start()
    self.addCleanup(env.stop)
    tuning_cache.reload()
    self.addCleanup(tuning_cache.reload)

  def test_every_kind_and_dtype_has_bands_without_gaps(self):
    self.assertEqual(set(paths.LANE_PATHS), set(cpu.KINDS))
    self.assertLessEqual(set(paths.MEASURED_LANE_KINDS), set(cpu.KINDS))
    for kind in cpu.KINDS:
      for dtype in ("float32", "float16", "bfloat16"):
        for rows in range(1, 600):
          self.assertIn(paths.lane_table_path(dtype, rows, kind),
                        paths.CONCRETE)

  def test_measured_bands(self):
    # Zen 3, float32 (the lanes section and the server, two lanes): XLA
    # while a step is bound by dispatch, the graph path from 17 rows, where
    # one call on both cores takes the elementwise path or XLA.
    for rows in (1, 4, 8, 16):
      self.assertEqual(paths.lane_table_path("float32", rows, "avx2"), "xla")
    for rows in (17, 32, 48, 64, 128, 256):
      self.assertEqual(paths.lane_table_path("float32", rows, "avx2"),
                       "graph")
    self.assertEqual(paths.table_path("float32", 32, "avx2"), "elementwise")
    self.assertEqual(paths.table_path("float32", 64, "avx2"), "xla")
    # No bf16 arithmetic: XLA, which computes it in float32 registers.
    for rows in (1, 16, 32, 128):
      self.assertEqual(paths.lane_table_path("bfloat16", rows, "avx2"), "xla")

  def test_unmeasured_kinds_fall_back_to_the_graph_path(self):
    # What the Zen 4 server of issue 47 was fast on; XLA at a few rows.
    for kind in ("amx", "avx512_bf16", "avx512", "other"):
      for dtype in ("float32", "float16", "bfloat16"):
        self.assertEqual(paths.lane_table_path(dtype, 4, kind), "xla")
        for rows in (16, 32, 64, 128, 256):
          self.assertEqual(paths.lane_table_path(dtype, rows, kind), "graph")

  def test_lanes_on_one_thread_take_the_lane_table(self):
    full, half = small_models()
    for rows in (1, 4, 16, 32, 48, 64, 128):
      for lanes in (1, 2, 4):
        self.assertEqual(paths.lane_path(full, rows, lanes),
                         paths.lane_table_path("float32", rows), rows)
        self.assertEqual(paths.lane_path(half, rows, lanes, threads=1),
                         paths.lane_table_path("bfloat16", rows), rows)
      # A call on several threads is what the library's table measured.
      self.assertEqual(paths.lane_path(full, rows, 1, threads=2),
                       paths.default_path(full, rows))
    # The 2-core Zen 4 of issue 47: 64 slots over two lanes of 32 rows ran
    # XLA (the library's path for 32 rows), at half the graph path's speed.
    with mock.patch.object(cpu, "info", return_value=ZEN4):
      self.assertEqual(paths.table_path("float32", 32), "xla")
      self.assertEqual(paths.lane_path(full, 32, 2), "graph")
    with mock.patch.object(paths, "gpu_visible", return_value=True):
      self.assertEqual(paths.lane_path(full, 32, 2), "xla")

  def test_the_server_takes_the_lane_path(self):
    from rnnstep.serve import main as serve_main  # pylint: disable=g-import-not-at-top
    full, _ = small_models()
    self.addCleanup(serve_main.FLAGS.unparse_flags)
    threading = tf.config.threading
    for argv, lanes, threads, expected in (
        # Two lanes, one thread each (the default on two cores): 32 rows.
        (["--max_batch=64"], 2, 1, paths.lane_table_path("float32", 32)),
        (["--max_batch=64"], 2, 2, paths.default_path(full, 32)),
        (["--max_batch=8"], 2, 1, paths.lane_table_path("float32", 4)),
        (["--max_batch=64", "--jit_compile=false"], 2, 1, "graph"),
        (["--max_batch=64", "--jit_compile=true"], 2, 1, "xla")):
      serve_main.FLAGS.unparse_flags()
      serve_main.FLAGS(["rnnstep-serve", *argv])
      with mock.patch.object(threading, "get_intra_op_parallelism_threads",
                             return_value=threads):
        self.assertEqual(serve_main._path(full, lanes), expected, argv)  # pylint: disable=protected-access

  def test_an_rwkv7_server_runs_one_lane_on_tensorflow_s_pools(self):
    """lanes.ONE_LANE_CELL_KINDS: unless told, a CPU server of an RWKV-7
    model runs one lane on TensorFlow's own pools where a GRU's runs a lane
    a core on one thread each; --lanes and --intra_op_threads still rule."""
    from rnnstep.serve import main as serve_main  # pylint: disable=g-import-not-at-top
    self.addCleanup(serve_main.FLAGS.unparse_flags)
    with mock.patch.object(cpu, "info", return_value=ZEN4), \
        mock.patch.object(cpu, "usable_cores", return_value=2):
      for argv, kinds, lanes, intra in (
          ([], ("rwkv7",), 1, 0),
          ([], ("gru",), 2, 1),
          (["--lanes=1"], ("gru",), 1, 1),
          (["--lanes=2"], ("rwkv7",), 2, 1),
          (["--intra_op_threads=1"], ("rwkv7",), 1, 1)):
        serve_main.FLAGS.unparse_flags()
        serve_main.FLAGS(["rnnstep-serve", *argv])
        got = serve_main._lanes(kinds)  # pylint: disable=protected-access
        self.assertEqual(got, lanes, argv)
        self.assertEqual(serve_main._intra_op_threads(got, kinds), intra,  # pylint: disable=protected-access
                         argv)


class DefaultPathTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    if paths.gpu_visible():
      self.skipTest("with a GPU the default is XLA at every batch")
    env = mock.patch.dict(os.environ, {
        "RNNSTEP_CACHE_DIR": os.path.join(self.create_tempdir().full_path,
                                          "cache")})
    env.start()
    self.addCleanup(env.stop)
    tuning_cache.reload()
    self.addCleanup(tuning_cache.reload)

  def test_default_is_the_table_without_a_cache(self):
    full, half = small_models()
    for batch in (1, 3, 16, 20, 32, 48, 64, 65, 256, 2**20):
      self.assertEqual(paths.default_path(full, batch),
                       paths.table_path("float32", batch), batch)
      self.assertEqual(paths.default_path(half, batch),
                       paths.table_path("bfloat16", batch), batch)
    self.assertEqual(paths.default_jit_compile(half, 1), True)

  def test_cached_winner_comes_first(self):
    full, _ = small_models()
    key = tuning_cache.cache_key(full, 1)
    tuning_cache.write(tuning_cache.cache_file(), {key: {"path": "graph"}})
    tuning_cache.reload()
    self.assertEqual(paths.default_path(full, 1), "graph")
    self.assertIs(paths.default_jit_compile(full, 1), False)

  def test_one_shot_runs_take_the_graph_path_where_xla_would_compile(self):
    full, half = small_models()
    for batch in (1, 3, 16, 20, 32, 48, 64, 65, 256):
      default = paths.default_path(full, batch)
      limit = (paths.ONE_SHOT_GRAPH_MAX_ELEMENTWISE_STEPS
               if default == "elementwise" else
               min(paths.ONE_SHOT_GRAPH_MAX_STEPS,
                   paths.ONE_SHOT_GRAPH_MAX_ROW_STEPS // batch))
      short = paths.one_shot_path(full, batch, limit)
      self.assertEqual(short, "graph" if default != "graph" else default,
                       batch)
      # Past the limit (steps, or rows x steps: a bulk job's 256-row
      # batches take XLA past 512 steps in all), and in a reduced dtype, the
      # default stands.
      self.assertEqual(paths.one_shot_path(full, batch, limit + 1), default)
      self.assertEqual(paths.one_shot_path(half, batch, 10),
                       paths.default_path(half, batch))
    with mock.patch.object(paths, "gpu_visible", return_value=True):
      self.assertEqual(paths.one_shot_path(full, 1, 10), "xla")

  def test_one_shot_runs_take_the_graph_path_where_elementwise_would_compile(
      self):
    """Whatever this CPU's table says (a table with an elementwise band)."""
    full, half = small_models()
    limit = paths.ONE_SHOT_GRAPH_MAX_ELEMENTWISE_STEPS
    with mock.patch.object(paths, "default_path",
                           return_value="elementwise"):
      self.assertEqual(paths.one_shot_path(full, 40, limit), "graph")
      self.assertEqual(paths.bulk_job_path(full, 400, 40, limit // 10),
                       "graph")
      self.assertEqual(paths.one_shot_path(full, 40, limit + 1),
                       "elementwise")
      self.assertEqual(paths.bulk_job_path(full, 410, 40, limit // 10),
                       "elementwise")
      self.assertEqual(paths.one_shot_path(half, 40, 10), "elementwise")

  def test_rwkv7_has_its_own_cpu_paths(self):
    """paths.KIND_PATHS: XLA in float32, the graph path in bfloat16, whatever
    the GRU tables say for the batch; a one-shot run takes the graph path;
    a server's lane of one thread the graph path (`KIND_LANE_PATHS`), a
    lane on TensorFlow's pools the library's."""
    def rwkv7(dtype):
      return types.SimpleNamespace(
          compute_dtype=dtype,
          config=types.SimpleNamespace(layers=[types.SimpleNamespace(
              kind="rwkv7")]))
    full, half = rwkv7(tf.float32), rwkv7(tf.bfloat16)
    with mock.patch.object(tuning_cache, "cached_path", return_value=None), \
        mock.patch.object(paths, "gpu_visible", return_value=False):
      for batch in (1, 16, 24, 64):
        self.assertEqual(paths.default_path(full, batch), "xla")
        self.assertEqual(paths.default_path(half, batch), "graph")
        self.assertEqual(paths.one_shot_path(full, batch, 200), "graph")
        # A server's lane: the graph path on one thread, the library's on
        # TensorFlow's pools.
        for lanes in (1, 2):
          self.assertEqual(paths.lane_path(full, batch, lanes, 1), "graph")
          self.assertEqual(paths.lane_path(half, batch, lanes, 1), "graph")
        self.assertEqual(paths.lane_path(full, batch, 1, 0), "xla")
        self.assertEqual(paths.lane_path(half, batch, 1, 0), "graph")
      with mock.patch.object(paths, "gpu_visible", return_value=True):
        self.assertEqual(paths.default_path(half, 1), "xla")

  def test_gpu_takes_xla(self):
    full, _ = small_models()
    key = tuning_cache.cache_key(full, 1)
    tuning_cache.write(tuning_cache.cache_file(), {key: {"path": "graph"}})
    with mock.patch.object(paths, "gpu_visible", return_value=True):
      self.assertEqual(paths.default_path(full, 1), "xla")

  def test_rnnstep_default_path_pins_every_automatic_choice(self):
    """RNNSTEP_DEFAULT_PATH wins over a GPU, the tuning cache, a cell kind's
    own bands, the tables, the lanes' table, one-shot runs, windows and
    scoring; a value that names no path is refused naming the variable."""
    from rnnstep import api  # pylint: disable=g-import-not-at-top
    from rnnstep import errors  # pylint: disable=g-import-not-at-top
    from rnnstep.engine import scoring  # pylint: disable=g-import-not-at-top
    full, half = small_models()
    tuning_cache.write(tuning_cache.cache_file(),
                       {tuning_cache.cache_key(full, 1): {"path": "xla"}})
    tuning_cache.reload()
    for pinned in paths.CONCRETE:
      with mock.patch.dict(os.environ, {paths.DEFAULT_PATH_ENV: pinned}):
        for model in (full, half):
          for batch in (1, 32, 256):
            self.assertEqual(paths.default_path(model, batch), pinned)
            self.assertEqual(paths.lane_path(model, batch, 2), pinned)
            self.assertEqual(paths.one_shot_path(model, batch, 10), pinned)
          self.assertEqual(api._path(model, None, 1, window=8), pinned)
        self.assertEqual(api._path(full, False, 1), "graph")  # Explicit.
        for window in (0, 8):
          self.assertEqual(scoring.default_path(window), pinned)
        with mock.patch.object(paths, "gpu_visible", return_value=True):
          self.assertEqual(paths.default_path(full, 1), pinned)
    with mock.patch.dict(os.environ, {paths.DEFAULT_PATH_ENV: " Graph "}):
      self.assertEqual(paths.default_path(full, 1), "graph")
    with mock.patch.dict(os.environ, {paths.DEFAULT_PATH_ENV: "fast"}):
      with self.assertRaisesRegex(
          errors.ArgumentError,
          "RNNSTEP_DEFAULT_PATH must be one of xla, graph, elementwise "
          r"\(or unset\), got 'fast'"):
        paths.default_path(full, 1)

  def test_reduced_precision_without_arithmetic_is_said_once(self):
    full, half = small_models()
    self.enter_context(mock.patch.object(paths, "_warned", set()))
    for this, says in ((ZEN3, True), (ZEN4, False)):
      with mock.patch.object(cpu, "info", return_value=this):
        paths._warned.clear()  # pylint: disable=protected-access
        with self.assertLogs(level="WARNING") as logs:
          logging.warning("marker")  # assertLogs needs one record.
          for batch in (1, 64, 256):
            paths.default_path(half, batch)
          paths.default_path(full, 1)
        said = [r.getMessage() for r in logs.records
                if r.getMessage() != "marker"]
        if says:
          self.assertLen(said, 1)
          self.assertEqual(said[0].count("\n"), 0)
          self.assertIn("bfloat16 will not be faster than float32", said[0])
          self.assertIn(this.name, said[0])
          self.assertIn("AVX512-BF16", said[0])
        else:
          self.assertEqual(said, [])

  @pytest.mark.slow  # The bundled model at batch 256.
  def test_default_bfloat16_batch_agrees_with_float64(self):
    """The default path at batch 256 in bfloat16, on the bundled model from
    256 real held-out prompts, against an independent float64 forward:
    rounding may flip near-ties, so the agreement of each step's choice
    (given the same history) is measured and bounded."""
    model = rnnstep.load(dtype="bfloat16")
    text = EXCERPT.read_text()
    prompts = [text[i:i + 16] for i in range(0, 256 * 61, 61)]
    texts = rnnstep.generate(model, prompts, 24, temperature=0)
    data = model_file.read(rnnstep.bundled_model_path())
    reference = nr.Reference(*nr.tensors_of_file(data))
    agreement, gap, _ = reference.greedy_agreement(
        np.stack([model.encode(p) for p in prompts]),
        np.stack([model.encode(t) for t in texts]))
    # Measured over these 6144 choices: agreement 0.992, the worst a near-tie
    # whose float64 logits differ by 0.060 (float16: 0.999 and 0.0024).
    self.assertGreaterEqual(agreement, 0.98)
    self.assertLessEqual(gap, 0.15)


if __name__ == "__main__":
  tf.test.main()
