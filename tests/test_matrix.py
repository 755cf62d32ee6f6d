"""One matrix: execution path x caller x dtype x cell kind, greedy text checked.

Every cell generates greedy text for a few prompts and checks it against an
independent reference: for float32 a Keras greedy loop (char for char); for
bfloat16/float16 the float64 numpy forward (tests/support/numpy_reference.py), with the
per-step agreement (teacher-forced along the generated text) and the logit gap
of any disagreement measured and bounded, since rounding may flip near-ties.

The full product (4 x 5 x 3 x 5 = 300 cells) is pruned by a deterministic
pairwise covering design (`covering`): every pair of axis values appears in at
least one cell, in 25 cells (the fewest: 5 callers x 5 cell kinds).
docs/dev/testing.md says how to list them.

Callers are functions `caller(models, prompts, num_steps, paths) -> texts per
cell`, keyed by name in `CALLERS` (generate, stream, strategy, CLI, SavedModel
served without rnnstep). LiteRT is not a caller here: it runs its own loop, so
it has no path axis, and float32 only, so its one axis left is the cell kind,
which tests/test_litert.py sweeps against the same Keras greedy loop. Each takes
a list of cells, so that the strategy and SavedModel callers start one fresh
interpreter for all their cells (`ONE_PROCESS`: each start pays TensorFlow's
import); the CLI starts one per cell, as a user would. Callers that start a
process get `model.source` (a model file) and `model.compute_dtype`; the
jobs run through a small thread pool so that the subprocesses overlap.
"""

import atexit
import concurrent.futures
import functools
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import textwrap

from absl.testing import parameterized
import pytest

from tests.support import forkserver
from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support.cli import ENV, TIMEOUT, command, run_script

import rnnstep
from rnnstep.model import model_file

# Quick tier (-m "not slow") leaves this file out: the 30-cell matrix
# (subprocesses, exports).
pytestmark = pytest.mark.slow

PROMPTS = ["ROMEO: ", "HELLO", "A"]  # Odd: the strategy pads its last replica.
STEPS = 32

# `jit_compile` per path name.
PATHS = {"graph": False, "xla": True, "elementwise": "elementwise",
         "default": None}
DTYPES = ("float32", "bfloat16", "float16")
CELLS = {
    "gru_reset_after": [kr.layer("gru", 32, True)],
    "gru_reset_before": [kr.layer("gru", 32, False)],
    "lstm": [kr.layer("lstm", 32)],
    "simple_rnn": [kr.layer("simple_rnn", 32)],
    "gru_lstm_stack": [kr.layer("gru", 24), kr.layer("lstm", 16)],
}

# Reduced precision bounds: the fraction of steps whose choice is the float64
# argmax, and the largest float64 logit gap of a step that differs (a
# near-tie). Measured over every reduced-precision cell: see BUILD_NOTES.md.
MIN_AGREEMENT = 0.9
MAX_GAP = {"bfloat16": 0.15, "float16": 0.02}


# -- callers --------------------------------------------------------------------


def each_cell(call):
  """A caller over all its cells from `call(model, prompts, num_steps, path)`."""

  def caller(models, prompts, num_steps, paths):
    return [call(model, prompts, num_steps, path)
            for model, path in zip(models, paths)]

  return caller


@each_cell
def call_generate(model, prompts, num_steps, path):
  return rnnstep.generate(model, prompts, num_steps, temperature=0,
                          jit_compile=PATHS[path])


@each_cell
def call_stream(model, prompts, num_steps, path):
  chunks = list(rnnstep.stream(model, prompts, num_steps, chunk_size=10,
                               temperature=0, jit_compile=PATHS[path]))
  return ["".join(chunk[i] for chunk in chunks) for i in range(len(prompts))]


STRATEGY_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import rnnstep
    prompts, num_steps, cells = json.loads(sys.argv[1])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    texts = []
    for path, dtype, jit in cells:
      with strategy.scope():
        model = rnnstep.load(path, dtype=dtype)
      texts.append(rnnstep.generate(model, prompts, num_steps, temperature=0,
                                    jit_compile=jit, strategy=strategy))
    print(json.dumps(texts))
""")


def call_strategy(models, prompts, num_steps, paths):
  """MirroredStrategy over two logical CPUs, in one fresh interpreter."""
  return run_script(STRATEGY_SCRIPT, json.dumps([prompts, num_steps, [
      [model.source, model.compute_dtype.name, PATHS[path]]
      for model, path in zip(models, paths)]]))


CLI_JIT_FLAGS = {"graph": ["--nojit_compile"], "xla": ["--jit_compile"],
                 "default": []}  # The CLI has no elementwise flag.


@each_cell
def call_cli(model, prompts, num_steps, path):
  """rnnstep-generate, jsonl out."""
  result = forkserver.run(
      command("rnnstep-generate", "rnnstep.cli.generate")
      + [f"--weights={model.source}", f"--dtype={model.compute_dtype.name}",
         f"--num_steps={num_steps}", "--temperature=0", "--format=jsonl"]
      + [f"--prompt={p}" for p in prompts] + CLI_JIT_FLAGS[path],
      capture_output=True, text=True, timeout=TIMEOUT, env=ENV,
      stdin=subprocess.DEVNULL)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads(line)["text"] for line in result.stdout.splitlines()]


SERVE_SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("rnnstep", "keras", "tf_keras"):
      sys.modules[name] = None
    import tensorflow as tf
    prompts, num_steps, export_dirs = json.loads(sys.argv[1])
    texts = []
    for export_dir in export_dirs:
      serve = tf.saved_model.load(export_dir).signatures["serving_default"]
      text = serve(prompts=tf.constant(prompts),
                   num_steps=tf.constant(num_steps),
                   temperature=tf.constant(0.0), seed=tf.constant(0, tf.int64))
      texts.append([t.decode() for t in text["text"].numpy()])
    print(json.dumps(texts))
""")


def call_saved_model(models, prompts, num_steps, paths):
  """rnnstep.export on each path, served where rnnstep cannot be imported."""
  export_dirs = []
  for model, path in zip(models, paths):
    export_dir = os.path.join(
        tempfile.mkdtemp(prefix="served_", dir=workdir()), "1")
    rnnstep.export(model, export_dir, jit_compile=PATHS[path])
    export_dirs.append(export_dir)
  return run_script(SERVE_SCRIPT, json.dumps([prompts, num_steps,
                                                export_dirs]))


CALLERS = {
    "generate": call_generate,
    "stream": call_stream,
    "strategy": call_strategy,
    "cli": call_cli,
    "saved_model": call_saved_model,
}


# The callers that run all their cells in one fresh interpreter (the others
# run a cell at a time, concurrently).
ONE_PROCESS = ("strategy", "saved_model")


def allowed(cell):
  """Whether a (partial) cell can run.

  The CLI cannot name the elementwise path.
  """
  return not (cell.get("caller") == "cli" and cell.get("path") == "elementwise")


# -- the covering design -------------------------------------------------------


def covering(axes, allowed_fn=lambda cell: True):
  """A deterministic greedy pairwise covering of the product of `axes`.

  Args:
    axes: {axis name: list of values}, in order.
    allowed_fn: takes a partial cell {axis: value}; False excludes it.

  Returns:
    A list of cells {axis: value} in which every allowed pair of values of
    two axes appears at least once.
  """
  names = list(axes)
  pairs = [((n1, a), (n2, b))
           for n1, n2 in itertools.combinations(names, 2)
           for a in axes[n1] for b in axes[n2]
           if allowed_fn({n1: a, n2: b})]
  uncovered = set(pairs)
  cells = []
  while uncovered:
    (n1, a), (n2, b) = next(p for p in pairs if p in uncovered)
    cell = {n1: a, n2: b}
    for name in names:
      if name in cell:
        continue

      def gain(value, name=name, cell=cell):
        return sum(((m, cell[m]), (name, value)) in uncovered
                   or ((name, value), (m, cell[m])) in uncovered
                   for m in cell)

      options = [v for v in axes[name] if allowed_fn({**cell, name: v})]
      cell[name] = max(options, key=gain)  # max keeps the first of ties.
    cell = {name: cell[name] for name in names}
    cells.append(cell)
    uncovered -= {((n1, cell[n1]), (n2, cell[n2]))
                  for n1, n2 in itertools.combinations(names, 2)}
  return cells


AXES = {"path": list(PATHS), "caller": list(CALLERS), "dtype": list(DTYPES),
        "cell": list(CELLS)}
MATRIX = covering(AXES, allowed)


def cell_name(cell):
  return "_".join(cell[axis] for axis in AXES)


# -- models and references ------------------------------------------------------


@functools.lru_cache(maxsize=None)
def workdir():
  path = tempfile.mkdtemp(prefix="rnnstep_matrix_")
  atexit.register(shutil.rmtree, path, True)  # Each run's models and exports.
  return path


@functools.lru_cache(maxsize=None)
def keras_model(kind):
  # recurrent_scale 1.5: prompt-dependent text, not chaotic for any kind
  # (at 3 a SimpleRNN's float32 state drifts from float64's within 30 steps,
  # and bfloat16 text would then disagree with the reference by chaos alone).
  return kr.lively(kr.build(CELLS[kind], seed=11, bias_scale=0.5),
                   recurrent_scale=1.5)


@functools.lru_cache(maxsize=None)
def model_path(kind):
  layers = CELLS[kind]
  path = os.path.join(workdir(), f"{kind}.npz")
  model_file.write(path, model_file.ModelConfig(16, tuple(layers)),
                   kr.default_vocab(65), kr.weights_of(keras_model(kind), layers))
  return path


@functools.lru_cache(maxsize=None)
def keras_greedy(kind, prompt):
  model = rnnstep.load(model_path(kind))
  return model.decode(kr.greedy(keras_model(kind), model.encode(prompt), STEPS))


def reference(kind):
  return nr.Reference(kr.weights_of(keras_model(kind), CELLS[kind]), CELLS[kind])


def run_caller(caller, cells):
  """Each cell's texts, or for all of them the exception the caller raised."""
  try:
    models = [rnnstep.load(model_path(c["cell"]), dtype=c["dtype"])
              for c in cells]
    texts = CALLERS[caller](models, PROMPTS, STEPS, [c["path"] for c in cells])
    assert len(texts) == len(cells), (caller, len(texts))
    return texts
  except Exception as e:  # pylint: disable=broad-except
    return [e] * len(cells)


@functools.lru_cache(maxsize=None)
def results():
  """Every cell's texts (or its exception), computed once, 3 jobs at a time."""
  for kind in CELLS:
    model_path(kind)  # Written before the threads start.
  groups = [[c for c in MATRIX if c["caller"] == caller]
            for caller in ONE_PROCESS] + [
                [c] for c in MATRIX if c["caller"] not in ONE_PROCESS]
  with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
    done = [(cells, pool.submit(run_caller, cells[0]["caller"], cells))
            for cells in groups if cells]
    return {cell_name(cell): texts for cells, future in done
            for cell, texts in zip(cells, future.result())}


@pytest.mark.exhaustive
class MatrixTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(cell_name(c), c) for c in MATRIX])
  def test_greedy_text_against_the_reference(self, cell):
    texts = results()[cell_name(cell)]
    if isinstance(texts, Exception):
      raise texts
    self.assertEqual([len(t) for t in texts], [STEPS] * len(PROMPTS))
    kind = cell["cell"]
    if cell["dtype"] == "float32":
      self.assertEqual(texts, [keras_greedy(kind, p) for p in PROMPTS])
      return
    model = rnnstep.load(model_path(kind))
    for prompt, text in zip(PROMPTS, texts):
      agreement, gap, first = reference(kind).greedy_agreement(
          model.encode(prompt), model.encode(text))
      self.assertGreaterEqual(agreement, MIN_AGREEMENT, (prompt, first))
      self.assertLessEqual(gap, MAX_GAP[cell["dtype"]], (prompt, first))


class CoveringTest(parameterized.TestCase):

  def test_every_pair_is_covered_and_the_design_is_small(self):
    names = list(AXES)
    for n1, n2 in itertools.combinations(names, 2):
      for a in AXES[n1]:
        for b in AXES[n2]:
          if allowed({n1: a, n2: b}):
            self.assertTrue(any(c[n1] == a and c[n2] == b for c in MATRIX),
                            (n1, a, n2, b))
    self.assertTrue(all(allowed(c) for c in MATRIX))
    self.assertLessEqual(len(MATRIX), 25)
    self.assertEqual(MATRIX, covering(AXES, allowed))  # Deterministic.
