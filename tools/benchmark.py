"""Speed benchmark: rnnstep against the tutorial loops, PyTorch and the matmul floor.

USAGE:
  python tools/benchmark.py                    # full run (several minutes)
  python tools/benchmark.py --quick            # smoke test: tiny model, < 1 min
  python tools/benchmark.py --batch_sizes=1 --rounds=9 --json_out=/tmp/b.json
  python tools/benchmark.py --sections=dtype --dtype=bfloat16,float16
  python tools/benchmark.py --variants=rnnstep_xla,floor,floor_graph

Everything timed runs in ONE process: every variant is compiled (warm-up)
first, then `--rounds` rounds each run every (variant, batch) once, interleaved
(the order rotates from round to round), and the table reports medians. Ratios
taken this way hold up on a busy machine far better than absolute numbers do.

The model is the TensorFlow text-generation tutorial's size (vocab 65,
embedding 256, GRU 1024 with reset_after=True, Dense 65) with seeded random
weights (Keras' initializer families: uniform embedding, Glorot-uniform
kernels, orthogonal recurrent kernel, small random biases), or any model file
with `--weights`. The Keras and PyTorch variants get the same weights.

Variants (sections=speed), each generating `--num_chars` characters after a
`--prompt_len`-character prompt at `--temperature`, for each of `--batch_sizes`:

  eager_keras    the old tutorial loop: a Keras 3 model called eagerly from
                 Python once per character, then tf.random.categorical. Slow:
                 it runs `--eager_steps` steps and is scaled to --num_chars
                 (marked * in the table); batches `--eager_batch_sizes` only.
  onestep_keras  the tutorial's OneStep: one tf.function call per character
                 with the Keras model inside (ids in and out: the tutorial's
                 string lookups are left out, which only flatters it).
  rnnstep        rnnstep.generate(...) with its defaults: what users get (the
                 path `jit_compile=None` picks for the dtype and batch size).
  rnnstep_graph  rnnstep.generate(..., jit_compile=False).
  rnnstep_xla    rnnstep.generate(..., jit_compile=True).
  rnnstep_elementwise  rnnstep.generate(..., jit_compile="elementwise")
                 (not run unless asked for; see the paths section).
  floor          an XLA tf.while_loop doing only the two per-step matmuls,
                 h@R [U, 3U] and h@W_out [U, V], with h = tanh(first U columns
                 of h@R) so that steps stay sequential: what no GRU can beat.
  floor_graph    the same loop without XLA: TF's own (oneDNN) matmul kernels,
                 which beat XLA's at large batches, so this is the floor that
                 matters there ("x best" in the table: the faster floor).
  torch_gru      PyTorch nn.Embedding + nn.GRU + nn.Linear + multinomial, a
                 Python loop over steps under torch.inference_mode.
  torch_fused    PyTorch, TorchScript-scripted loop with a hand-fused GRU cell
                 over a precomputed [V, 3U] embedding x kernel table.
  (the torch variants are skipped when `import torch` fails.)

Other sections:
  dtype    rnnstep float32 vs each `--dtype` (bfloat16, float16) at
           `--dtype_batch` on each path of `--dtype_modes`, timed the same way,
           with the speed-up over the fastest float32 path; fidelity: the
           max |logit error| of rnnstep.logits against float32 over a
           --num_chars text, the teacher-forced argmax agreement, and greedy
           (temperature 0) agreement over --num_chars generated characters.
  paths    every execution path (xla, graph, elementwise) for float32 and each
           `--dtype` at each of `--path_batch_sizes`: the fastest, and the one
           `jit_compile=None` picks (the evidence for `api.default_path`).
  latency  time to first text in a FRESH subprocess (python start, import,
           load the model file, trace/compile, generate), graph and XLA.
  cli      `rnnstep-generate` end-to-end wall time for --num_chars chars
           (the bundled model when installed, else the benchmark's model file).
"""

import collections
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

ALL_VARIANTS = ("eager_keras", "onestep_keras", "rnnstep", "rnnstep_graph",
                "rnnstep_xla", "rnnstep_elementwise", "floor", "floor_graph",
                "torch_gru", "torch_fused")
DEFAULT_VARIANTS = ("eager_keras", "onestep_keras", "rnnstep", "rnnstep_graph",
                    "rnnstep_xla", "floor", "floor_graph", "torch_gru",
                    "torch_fused")
TORCH_VARIANTS = ("torch_gru", "torch_fused")
SECTIONS = ("speed", "dtype", "paths", "latency", "cli")
# rnnstep's execution paths, by their `jit_compile` value (generator.py).
PATHS = {"xla": True, "graph": False, "elementwise": "elementwise"}
RNNSTEP_VARIANTS = ("rnnstep", "rnnstep_graph", "rnnstep_xla",
                    "rnnstep_elementwise")

_QUICK = flags.DEFINE_boolean(
    "quick", False,
    "Smoke test: a tiny model (U=64, E=16), 40 chars, 1 round, batches 1 and 4, "
    "sections speed, dtype (at batch 4) and paths unless --sections is given. "
    "Overrides the size, step, round and batch flags.")
_SECTIONS = flags.DEFINE_list(
    "sections", list(SECTIONS), f"Which sections to run, of {SECTIONS}.")
_VARIANTS = flags.DEFINE_list(
    "variants", list(DEFAULT_VARIANTS), f"Speed variants, of {ALL_VARIANTS}.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "64", "256"],
                                 "Batch sizes (rows generated together).")
_EAGER_BATCH_SIZES = flags.DEFINE_list(
    "eager_batch_sizes", ["1"],
    "Batch sizes at which eager_keras runs (it is slow); 'all' for every one.")
_NUM_CHARS = flags.DEFINE_integer("num_chars", 1000,
                                  "Characters generated per row.", lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 10, "Prompt length in characters.",
                                   lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature (> 0).")
_EAGER_STEPS = flags.DEFINE_integer(
    "eager_steps", 200,
    "Steps the eager loop actually runs; its time is scaled to --num_chars.",
    lower_bound=1)
_ONESTEP_STEPS = flags.DEFINE_integer(
    "onestep_steps", 0,
    "Steps the OneStep loop runs, scaled to --num_chars (0 = all of them).",
    lower_bound=0)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (medians over them).",
                               lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 65, "Vocabulary size.", lower_bound=2)
_EMBEDDING = flags.DEFINE_integer("embedding_dim", 256, "Embedding width.",
                                  lower_bound=1)
_UNITS = flags.DEFINE_integer("units", 1024, "GRU units.", lower_bound=1)
_WEIGHTS = flags.DEFINE_string(
    "weights", None,
    "Benchmark this rnnstep model file (.npz, one GRU reset_after layer) instead "
    "of random weights; overrides the size flags.")
_SEED = flags.DEFINE_integer("seed", 1234, "Seed of the weights, prompts, sampling.")
_INTRA = flags.DEFINE_integer(
    "intra_op_threads", 0, "tf.config.threading intra-op threads (0 = TF default).")
_INTER = flags.DEFINE_integer(
    "inter_op_threads", 0, "tf.config.threading inter-op threads (0 = TF default).")
_TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads", 0, "torch.set_num_threads (0 = the number of usable cores).")
_DTYPE = flags.DEFINE_list(
    "dtype", ["bfloat16"],
    "Reduced-precision dtypes compared with float32 in the dtype section "
    "(bfloat16, float16).")
_DTYPE_BATCH = flags.DEFINE_integer("dtype_batch", 256,
                                    "Batch size of the dtype section.", lower_bound=1)
_DTYPE_MODES = flags.DEFINE_list(
    "dtype_modes", ["default", "xla", "graph", "elementwise"],
    "rnnstep paths timed in the dtype section ('default' = jit_compile=None).")
_PATH_BATCH_SIZES = flags.DEFINE_list(
    "path_batch_sizes", ["1", "8", "16", "32", "64", "128", "256"],
    "Batch sizes of the paths section.")
_PATH_CHARS = flags.DEFINE_integer(
    "path_chars", 300, "Characters per row in the paths section.", lower_bound=1)
_CLI_RUNS = flags.DEFINE_integer("cli_runs", 3, "Runs of the CLI (median).",
                                 lower_bound=1)
_LATENCY_RUNS = flags.DEFINE_integer(
    "latency_runs", 1, "Fresh processes per mode in the latency section (median).",
    lower_bound=1)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write all results here.")
_LATENCY_CHILD = flags.DEFINE_enum(
    "latency_child", None, ["graph", "xla"],
    "(internal) Run one first-call latency measurement and print JSON.")
_MODEL_FILE = flags.DEFINE_string("model_file", None,
                                  "(internal) The latency child's model file.")

Result = collections.namedtuple("Result", "variant batch seconds scale note")


def log(*args):
  print(*args, file=sys.stderr, flush=True)


# -- settings ------------------------------------------------------------------


class Settings:
  """The sizes and counts in force (--quick overrides the flags)."""

  def __init__(self):
    quick = _QUICK.value
    self.quick = quick
    self.vocab_size = _VOCAB.value
    self.embedding_dim = 16 if quick else _EMBEDDING.value
    self.units = 64 if quick else _UNITS.value
    self.num_chars = 40 if quick else _NUM_CHARS.value
    self.prompt_len = _PROMPT_LEN.value
    self.temperature = _TEMPERATURE.value
    self.eager_steps = min(10 if quick else _EAGER_STEPS.value, self.num_chars)
    onestep = _ONESTEP_STEPS.value or self.num_chars
    self.onestep_steps = min(onestep, self.num_chars)
    self.rounds = 1 if quick else _ROUNDS.value
    self.batch_sizes = [1, 4] if quick else [int(b) for b in _BATCH_SIZES.value]
    if _EAGER_BATCH_SIZES.value == ["all"]:
      self.eager_batch_sizes = list(self.batch_sizes)
    else:
      self.eager_batch_sizes = ([1] if quick else
                                [int(b) for b in _EAGER_BATCH_SIZES.value])
    self.dtype_batch = 4 if quick else _DTYPE_BATCH.value
    self.path_batch_sizes = ([1, 4] if quick else
                             [int(b) for b in _PATH_BATCH_SIZES.value])
    self.path_chars = self.num_chars if quick else _PATH_CHARS.value
    self.sections = [s for s in _SECTIONS.value if s]
    if quick and not flags.FLAGS["sections"].present:
      # The latency and cli sections start fresh TensorFlow processes (seconds
      # each): asked for explicitly only.
      self.sections = ["speed", "dtype", "paths"]
    for s in self.sections:
      if s not in SECTIONS:
        raise app.UsageError(f"--sections: unknown section {s!r}; of {SECTIONS}")
    self.variants = [v for v in _VARIANTS.value if v]
    for v in self.variants:
      if v not in ALL_VARIANTS:
        raise app.UsageError(f"--variants: unknown variant {v!r}; of {ALL_VARIANTS}")
    self.dtypes = [d for d in _DTYPE.value if d]
    for d in self.dtypes:
      if d not in ("bfloat16", "float16"):
        raise app.UsageError(f"--dtype: {d!r} is not bfloat16 or float16")
    if self.temperature <= 0:
      raise app.UsageError("--temperature must be > 0 (the variants sample)")


# -- machine facts -------------------------------------------------------------


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          have = set(line.split(":", 1)[1].split())
          wanted = ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile",
                    "avx512_fp16"]
          return " ".join(w for w in wanted if w in have)
  except OSError:
    pass
  return "?"


def usable_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count() or 1


def machine_facts(tf, torch) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    import keras  # pylint: disable=g-import-not-at-top
    keras_version = keras.__version__
  except ImportError:
    keras_version = None
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    onednn = bool(_pywrap_util_port.IsMklEnabled())
  except (ImportError, AttributeError):
    onednn = None
  facts = {
      "cpu": cpu_model(),
      "cpu_flags": cpu_flags(),
      "cores": os.cpu_count(),
      "usable_cores": usable_cores(),
      "python": platform.python_version(),
      "numpy": np.__version__,
      "tensorflow": tf.__version__,
      "keras": keras_version,
      "torch": getattr(torch, "__version__", None),
      "onednn": onednn,
      "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "(unset)"),
      "XLA_FLAGS": os.environ.get("XLA_FLAGS", "(unset)"),
      "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
      "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
      "torch_threads": torch.get_num_threads() if torch else None,
      "loadavg_start": list(os.getloadavg()),
  }
  return facts


def print_header(facts, settings, tensors_desc):
  print("# rnnstep benchmark")
  print(f"machine: {facts['cpu']} | {facts['cores']} cores "
        f"({facts['usable_cores']} usable) | {facts['cpu_flags']}")
  print(f"software: python {facts['python']}, numpy {facts['numpy']}, "
        f"tensorflow {facts['tensorflow']}, keras {facts['keras']}, "
        f"torch {facts['torch'] or 'not importable (torch variants skipped)'}")
  print(f"oneDNN: {facts['onednn']} (TF_ENABLE_ONEDNN_OPTS="
        f"{facts['TF_ENABLE_ONEDNN_OPTS']}); XLA_FLAGS={facts['XLA_FLAGS']}")
  intra = facts["tf_intra_op_threads"]
  inter = facts["tf_inter_op_threads"]
  print(f"threads: tf.config.threading intra_op={intra} inter_op={inter} "
        f"(0 = TF default: all cores); torch={facts['torch_threads']}")
  print(f"load average at start: {' '.join(f'{x:.2f}' for x in facts['loadavg_start'])}"
        f" (>{facts['usable_cores']} means other work shares the cores: noisy)")
  print(f"model: {tensors_desc}")
  print(f"run: {settings.num_chars} chars per row after a {settings.prompt_len}-char "
        f"prompt, temperature {settings.temperature}, batches "
        f"{settings.batch_sizes}, {settings.rounds} round(s) after warm-up"
        f"{' [QUICK MODE]' if settings.quick else ''}")
  print()


# -- weights -------------------------------------------------------------------


def random_tensors(vocab_size, embedding_dim, units, seed):
  """Seeded weights with Keras' initializer families (GRU reset_after=True)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)

  def glorot(fan_in, fan_out):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

  # Orthogonal recurrent kernel, per gate block as Keras' Orthogonal over [U, 3U].
  q, r = np.linalg.qr(rng.standard_normal((3 * units, units)))
  q = q * np.sign(np.diag(r))[None, :]
  recurrent = q.T.astype(np.float32)  # [U, 3U], orthonormal rows.
  return {
      "embedding": rng.uniform(-0.05, 0.05, (vocab_size, embedding_dim)
                               ).astype(np.float32),
      "layer0_kernel": glorot(embedding_dim, 3 * units),
      "layer0_recurrent_kernel": recurrent,
      "layer0_bias": rng.normal(0, 0.1, (2, 3 * units)).astype(np.float32),
      # Somewhat larger than Glorot so that the logits have a realistic spread
      # (a trained char model is fairly confident) and greedy text is not flat.
      "dense_kernel": 4.0 * glorot(units, vocab_size),
      "dense_bias": rng.normal(0, 0.5, (vocab_size,)).astype(np.float32),
  }


# The tutorial's tinyshakespeare vocabulary (65 characters), in id order.
SHAKESPEARE_VOCAB = ("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "abcdefghijklmnopqrstuvwxyz")


def default_vocab(vocab_size):
  extra = [chr(0x100 + i) for i in range(max(vocab_size - 65, 0))]
  return (list(SHAKESPEARE_VOCAB) + extra)[:vocab_size]


def probe_prompt(vocab, length=10):
  """A prompt of `length` characters of `vocab` (never "[UNK]")."""
  usable = [c for c in vocab if len(c) == 1 and c != "\n"] or [vocab[-1]]
  return "".join(usable[(i * 7) % len(usable)] for i in range(length))


class Weights:
  """The model's tensors, vocab and config, shared by every variant."""

  def __init__(self, settings):
    from rnnstep import model_file  # pylint: disable=g-import-not-at-top
    if _WEIGHTS.value:
      data = model_file.read(_WEIGHTS.value)
      layers = data.config.layers
      if len(layers) != 1 or layers[0].kind != "gru" or not layers[0].reset_after:
        raise app.UsageError("--weights: the Keras/PyTorch variants need one GRU "
                             "layer with reset_after=True")
      self.config, self.vocab, self.tensors = data.config, list(data.vocab), dict(
          data.tensors)
      self.source = _WEIGHTS.value
    else:
      self.config = model_file.ModelConfig(
          settings.embedding_dim,
          (model_file.LayerConfig("gru", settings.units, True),))
      self.vocab = default_vocab(settings.vocab_size)
      self.tensors = random_tensors(settings.vocab_size, settings.embedding_dim,
                                    settings.units, _SEED.value)
      self.source = f"random weights, seed {_SEED.value}"
    self.vocab_size = len(self.vocab)
    self.embedding_dim = self.config.embedding_dim
    self.units = self.config.layers[0].units
    # Never sample "[UNK]" (id 0 of a tutorial vocab) in the baselines either.
    self.has_unk = self.vocab[0] == model_file.UNK_TOKEN

  def describe(self):
    params = sum(t.size for t in self.tensors.values())
    return (f"Embedding({self.vocab_size}, {self.embedding_dim}) -> "
            f"GRU({self.units}, reset_after) -> Dense({self.vocab_size}); "
            f"{params / 1e6:.2f} M params; {self.source}")

  def rnnstep_model(self, dtype="float32"):
    from rnnstep import model as model_lib  # pylint: disable=g-import-not-at-top
    return model_lib.Model(self.config, self.vocab, self.tensors, dtype=dtype)

  def write(self, path):
    from rnnstep import model_file  # pylint: disable=g-import-not-at-top
    model_file.write(path, self.config, self.vocab, self.tensors)


def make_prompts(weights, batch, length, seed):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed + 7)
  low = 1 if weights.has_unk else 0
  ids = rng.integers(low, weights.vocab_size, (batch, length)).astype(np.int32)
  texts = ["".join(weights.vocab[i] for i in row) for row in ids]
  return ids, texts


# -- Keras variants ------------------------------------------------------------


def build_keras_model(weights):
  """The tutorial's model class (Keras 3), holding `weights`."""
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class MyModel(keras.Model):
    """As in the TensorFlow text-generation tutorial."""

    def __init__(self, vocab_size, embedding_dim, rnn_units):
      super().__init__()
      self.embedding = keras.layers.Embedding(vocab_size, embedding_dim)
      self.gru = keras.layers.GRU(rnn_units, return_sequences=True,
                                  return_state=True, reset_after=True)
      self.dense = keras.layers.Dense(vocab_size)

    def call(self, inputs, states=None, return_state=False, training=False):
      x = self.embedding(inputs, training=training)
      if states is None:
        states = self.gru.get_initial_state(tf.shape(x)[0])
      x, states = self.gru(x, initial_state=states, training=training)
      x = self.dense(x, training=training)
      if return_state:
        return x, states
      return x

  model = MyModel(weights.vocab_size, weights.embedding_dim, weights.units)
  model(tf.zeros([1, 1], tf.int32))  # Builds the weights.
  t = weights.tensors
  model.embedding.set_weights([t["embedding"]])
  model.gru.set_weights([t["layer0_kernel"], t["layer0_recurrent_kernel"],
                         t["layer0_bias"]])
  model.dense.set_weights([t["dense_kernel"], t["dense_bias"]])
  return model


def banned_mask(weights):
  import numpy as np  # pylint: disable=g-import-not-at-top
  mask = np.zeros([weights.vocab_size], np.float32)
  if weights.has_unk:
    mask[0] = -np.inf
  return mask


class EagerKeras:
  """The old tutorial loop: model(x) eagerly per char, then tf.random.categorical."""

  def __init__(self, keras_model, weights, settings):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf = tf
    self.model = keras_model
    self.mask = tf.constant(banned_mask(weights))
    self.temperature = settings.temperature
    self.steps = settings.eager_steps

  def __call__(self, prompt_ids, seed):
    # No tf.random.set_seed here: it clears TensorFlow's eager kernel cache, so
    # the next call of ANY tf.function re-instantiates (re-optimizes) its graph
    # (~0.15 s for rnnstep's): the global seed is set once, in main().
    del seed
    tf = self.tf
    x = tf.constant(prompt_ids)
    states = None
    out = []
    for _ in range(self.steps):
      logits, states = self.model(x, states=states, return_state=True)
      logits = logits[:, -1, :] / self.temperature + self.mask
      x = tf.random.categorical(logits, num_samples=1, dtype=tf.int32)
      out.append(x)
    return tf.concat(out, 1).numpy()


class OneStepKeras:
  """The tutorial's OneStep: one tf.function call per character."""

  def __init__(self, keras_model, weights, settings):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf = tf
    self.model = keras_model
    self.mask = tf.constant(banned_mask(weights))
    self.temperature = settings.temperature
    self.steps = settings.onestep_steps
    self.generate_one_step = tf.function(self._generate_one_step)

  def _generate_one_step(self, input_ids, states=None):
    tf = self.tf
    predicted_logits, states = self.model(inputs=input_ids, states=states,
                                          return_state=True)
    predicted_logits = predicted_logits[:, -1, :] / self.temperature
    predicted_logits = predicted_logits + self.mask
    predicted_ids = tf.random.categorical(predicted_logits, num_samples=1,
                                          dtype=tf.int32)
    return predicted_ids, states

  def __call__(self, prompt_ids, seed):
    del seed  # See EagerKeras: the global seed is set once, in main().
    tf = self.tf
    ids = tf.constant(prompt_ids)
    states = None
    out = []
    for _ in range(self.steps):
      ids, states = self.generate_one_step(ids, states=states)
      out.append(ids)
    return tf.concat(out, 1).numpy()


# -- rnnstep and the floor -------------------------------------------------------


class Rnnstep:
  """rnnstep.generate on one path, or the default (decoded text, as users get it)."""

  def __init__(self, model, settings, jit_compile):
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.generate = rnnstep.generate
    self.model = model
    self.settings = settings
    self.jit_compile = jit_compile

  def __call__(self, prompt_texts, seed):
    return self.generate(self.model, list(prompt_texts), self.settings.num_chars,
                         temperature=self.settings.temperature, seed=seed,
                         jit_compile=self.jit_compile)


class Floor:
  """Only the two per-step matmuls, in one while_loop (XLA or graph)."""

  def __init__(self, weights, settings, jit_compile):
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf = tf
    units = weights.units
    self.recurrent = tf.constant(weights.tensors["layer0_recurrent_kernel"])
    self.dense = tf.constant(weights.tensors["dense_kernel"])
    self.num_steps = np.int32(settings.num_chars)
    self.units = units
    self.rng = np.random.default_rng(0)
    recurrent, dense = self.recurrent, self.dense

    def loop(h, num_steps):
      def body(t, h, ids):
        h_proj = tf.matmul(h, recurrent)          # [B, 3U], no fused add
        logits = tf.matmul(h, dense)              # [B, V]
        ids = tf.argmax(logits, -1, output_type=tf.int32)
        return t + 1, tf.tanh(h_proj[:, :units]), ids
      _, h, ids = tf.while_loop(
          lambda t, *_: t < num_steps, body,
          (tf.constant(0), h, tf.zeros([tf.shape(h)[0]], tf.int32)))
      return h, ids

    self.fn = tf.function(loop, jit_compile=jit_compile, input_signature=[
        tf.TensorSpec([None, units], tf.float32), tf.TensorSpec([], tf.int32)])

  def __call__(self, batch, seed):
    del seed
    h = self.rng.normal(0, 0.5, (batch, self.units)).astype("float32")
    h, ids = self.fn(h, self.num_steps)
    return ids.numpy()


# -- PyTorch -------------------------------------------------------------------


def import_torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
    return torch
  except Exception:  # pylint: disable=broad-except
    return None


def _torch_gate_order(a, units, axis):
  """Keras [z | r | h] blocks -> PyTorch [r | z | n] along `axis`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  z, r, h = np.split(a, 3, axis=axis)
  return np.concatenate([r, z, h], axis=axis)


class TorchModel:
  """nn.Embedding + nn.GRU + nn.Linear holding the benchmark weights."""

  def __init__(self, torch, weights):
    import numpy as np  # pylint: disable=g-import-not-at-top
    nn = torch.nn
    t = weights.tensors
    units = weights.units
    self.torch = torch
    self.embedding = nn.Embedding(weights.vocab_size, weights.embedding_dim)
    self.gru = nn.GRU(weights.embedding_dim, units, batch_first=True)
    self.linear = nn.Linear(units, weights.vocab_size)

    def tensor(a):
      return torch.from_numpy(np.ascontiguousarray(a, np.float32))

    with torch.no_grad():
      self.embedding.weight.copy_(tensor(t["embedding"]))
      self.gru.weight_ih_l0.copy_(
          tensor(_torch_gate_order(t["layer0_kernel"], units, 1).T))
      self.gru.weight_hh_l0.copy_(
          tensor(_torch_gate_order(t["layer0_recurrent_kernel"], units, 1).T))
      self.gru.bias_ih_l0.copy_(tensor(_torch_gate_order(t["layer0_bias"][0], units, 0)))
      self.gru.bias_hh_l0.copy_(tensor(_torch_gate_order(t["layer0_bias"][1], units, 0)))
      self.linear.weight.copy_(tensor(t["dense_kernel"].T))
      self.linear.bias.copy_(tensor(t["dense_bias"]))
    self.mask = tensor(banned_mask(weights))

  def prime(self, prompt_ids):
    """Runs the prompt: returns (last logits [B, V], h [1, B, U])."""
    out, h = self.gru(self.embedding(prompt_ids))
    return self.linear(out[:, -1]) + self.mask, h


class TorchGRU:
  """The straightforward PyTorch loop: nn.GRU one step at a time from Python."""

  def __init__(self, torch, torch_model, settings):
    self.torch = torch
    self.m = torch_model
    self.settings = settings

  def __call__(self, prompt_ids, seed):
    torch = self.torch
    m = self.m
    gen = torch.Generator().manual_seed(seed)
    temperature = self.settings.temperature
    with torch.inference_mode():
      logits, h = m.prime(torch.from_numpy(prompt_ids).long())
      out = torch.empty(prompt_ids.shape[0], self.settings.num_chars,
                        dtype=torch.long)
      for t in range(self.settings.num_chars):
        probs = torch.softmax(logits / temperature, -1)
        ids = torch.multinomial(probs, 1, generator=gen)
        out[:, t] = ids[:, 0]
        y, h = m.gru(m.embedding(ids), h)
        logits = m.linear(y[:, 0]) + m.mask
      return out.numpy()


_TORCH_FUSED_SOURCE = '''
import torch

@torch.jit.script
def fused_loop(table, recurrent, candidate_bias, dense, dense_bias, h, logits,
               num_steps: int, temperature: float):
    units = h.shape[1]
    out = torch.empty(num_steps, h.shape[0], dtype=torch.long)
    for t in range(num_steps):
        noise = torch.empty_like(logits).exponential_()
        ids = torch.argmax(logits / temperature - torch.log(noise), 1)
        out[t] = ids
        x = table.index_select(0, ids)
        hp = torch.mm(h, recurrent)
        zr = torch.sigmoid(x[:, :2 * units] + hp[:, :2 * units])
        z = zr[:, :units]
        r = zr[:, units:]
        n = torch.tanh(x[:, 2 * units:] + r * (hp[:, 2 * units:] + candidate_bias))
        h = n + z * (h - n)
        logits = torch.addmm(dense_bias, h, dense)
    return out.t()
'''


class TorchFused:
  """TorchScript loop, hand-fused cell over a [V, 3U] input table, Gumbel-max."""

  def __init__(self, torch, torch_model, weights, settings):
    import importlib.util  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.m = torch_model
    self.settings = settings
    # TorchScript needs the function's source in a real file.
    self._dir = tempfile.mkdtemp(prefix="rnnstep_bench_torch_")
    path = os.path.join(self._dir, "torch_fused_loop.py")
    with open(path, "w") as f:
      f.write(_TORCH_FUSED_SOURCE)
    spec = importlib.util.spec_from_file_location("torch_fused_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    self.loop = module.fused_loop
    t = weights.tensors
    units = weights.units
    bias = t["layer0_bias"]
    input_bias = bias[0] + np.concatenate([bias[1, :2 * units],
                                           np.zeros([units], np.float32)])
    table = t["embedding"] @ t["layer0_kernel"] + input_bias
    self.table = torch.from_numpy(np.ascontiguousarray(table, np.float32))
    self.recurrent = torch.from_numpy(np.ascontiguousarray(
        t["layer0_recurrent_kernel"]))
    self.candidate_bias = torch.from_numpy(np.ascontiguousarray(bias[1, 2 * units:]))
    self.dense = torch.from_numpy(np.ascontiguousarray(t["dense_kernel"]))
    self.dense_bias = torch.from_numpy(np.ascontiguousarray(t["dense_bias"])
                                       ) + torch_model.mask

  def __call__(self, prompt_ids, seed):
    torch = self.torch
    torch.manual_seed(seed)
    with torch.inference_mode():
      logits, h = self.m.prime(torch.from_numpy(prompt_ids).long())
      out = self.loop(self.table, self.recurrent, self.candidate_bias, self.dense,
                      self.dense_bias, h[0].contiguous(), logits,
                      self.settings.num_chars, float(self.settings.temperature))
      return out.numpy()


# -- timing --------------------------------------------------------------------


def timed(fn, *args):
  start = time.perf_counter()
  fn(*args)
  return time.perf_counter() - start


def run_rounds(jobs, rounds, label):
  """jobs: list of (key, fn, args). Warm-up each, then interleaved rounds.

  Returns: {key: [seconds per round]} and the warm-up seconds per key.
  """
  warmup = {}
  for key, fn, args in jobs:
    log(f"[{label}] warm-up {key} ...")
    warmup[key] = timed(fn, *args)
    timed(fn, *args)  # A second call: any lazy second trace (OneStep) is done.
  samples = {key: [] for key, _, _ in jobs}
  for r in range(rounds):
    shift = r % len(jobs)
    order = jobs[shift:] + jobs[:shift]
    log(f"[{label}] round {r + 1}/{rounds} (load {os.getloadavg()[0]:.2f})")
    for key, fn, args in order:
      samples[key].append(timed(fn, *args))
  return samples, warmup


def fmt_ms(seconds):
  return f"{seconds * 1e3:,.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def spread(values):
  med = statistics.median(values)
  return (max(values) - min(values)) / med * 100 if med > 0 else 0.0


# -- sections --------------------------------------------------------------------


def speed_section(settings, weights, tf, torch, results_out):
  variants = list(settings.variants)
  skipped = []
  if torch is None:
    for v in TORCH_VARIANTS:
      if v in variants:
        variants.remove(v)
        skipped.append(v)
  keras_model = None
  if "eager_keras" in variants or "onestep_keras" in variants:
    keras_model = build_keras_model(weights)
  model = weights.rnnstep_model()
  runners = {}
  torch_model = TorchModel(torch, weights) if torch is not None and any(
      v in variants for v in TORCH_VARIANTS) else None
  for v in variants:
    if v == "eager_keras":
      runners[v] = EagerKeras(keras_model, weights, settings)
    elif v == "onestep_keras":
      runners[v] = OneStepKeras(keras_model, weights, settings)
    elif v == "rnnstep":
      runners[v] = Rnnstep(model, settings, jit_compile=None)
    elif v == "rnnstep_graph":
      runners[v] = Rnnstep(model, settings, jit_compile=False)
    elif v == "rnnstep_xla":
      runners[v] = Rnnstep(model, settings, jit_compile=True)
    elif v == "rnnstep_elementwise":
      runners[v] = Rnnstep(model, settings, jit_compile="elementwise")
    elif v == "floor":
      runners[v] = Floor(weights, settings, jit_compile=True)
    elif v == "floor_graph":
      runners[v] = Floor(weights, settings, jit_compile=False)
    elif v == "torch_gru":
      runners[v] = TorchGRU(torch, torch_model, settings)
    elif v == "torch_fused":
      runners[v] = TorchFused(torch, torch_model, weights, settings)

  jobs = []
  scale = {}
  for batch in settings.batch_sizes:
    prompt_ids, prompt_texts = make_prompts(weights, batch, settings.prompt_len,
                                            _SEED.value)
    for v in variants:
      if v == "eager_keras" and batch not in settings.eager_batch_sizes:
        continue
      if v.startswith("floor"):
        args = (batch, _SEED.value)
      elif v.startswith("rnnstep"):
        args = (prompt_texts, _SEED.value)
      else:
        args = (prompt_ids, _SEED.value)
      steps = {"eager_keras": settings.eager_steps,
               "onestep_keras": settings.onestep_steps}.get(v, settings.num_chars)
      scale[(v, batch)] = settings.num_chars / steps
      jobs.append(((v, batch), runners[v], args))
  samples, warmup = run_rounds(jobs, settings.rounds, "speed")

  rows = []
  medians = {}
  for (v, batch), secs in samples.items():
    s = scale[(v, batch)]
    per_1000 = statistics.median(secs) * s * 1000.0 / settings.num_chars
    medians[(v, batch)] = per_1000
    results_out.append({
        "section": "speed", "variant": v, "batch": batch,
        "ms_per_1000_chars": per_1000 * 1e3,
        "chars_per_s": batch * 1000.0 / per_1000,
        "scaled_from_steps": settings.num_chars / s if s != 1 else None,
        "round_seconds": secs, "warmup_seconds": warmup[(v, batch)],
        "spread_pct": spread(secs)})
    rows.append((v, batch))

  print("## speed: ms per 1000 chars (median of rounds), chars/s = B x 1000 / time")
  if skipped:
    print(f"(skipped, torch not importable: {', '.join(skipped)})")
  header = (f"{'variant':<15} {'batch':>5} {'ms/1000ch':>11} {'chars/s':>11} "
            f"{'x floor':>8} {'x best':>7} {'spread%':>8} {'warm-up s':>9}")
  print(header)
  print("-" * len(header))
  order = {v: i for i, v in enumerate(ALL_VARIANTS)}
  for batch in settings.batch_sizes:
    floor = medians.get(("floor", batch))
    floors = [medians[(f, batch)] for f in ("floor", "floor_graph")
              if (f, batch) in medians]
    best = min(floors) if floors else None
    for v in sorted((v for v, b in rows if b == batch), key=order.get):
      per_1000 = medians[(v, batch)]
      mark = "*" if scale[(v, batch)] != 1 else " "
      ratio = f"{per_1000 / floor:.2f}" if floor else "-"
      ratio_best = f"{per_1000 / best:.2f}" if best else "-"
      res = next(r for r in results_out if r.get("section") == "speed"
                 and r["variant"] == v and r["batch"] == batch)
      print(f"{v:<15} {batch:>5} {fmt_ms(per_1000):>10}{mark} "
            f"{batch * 1000.0 / per_1000:>11,.0f} {ratio:>8} {ratio_best:>7} "
            f"{res['spread_pct']:>7.0f}% {warmup[(v, batch)]:>9.2f}")
  print()
  scaled = sorted({(v, settings.num_chars / s) for (v, _), s in scale.items()
                   if s != 1})
  for v, steps in scaled:
    print(f"* {v} ran {steps:.0f} of {settings.num_chars} steps per round; "
          f"its time is scaled to {settings.num_chars} (prompt cost included once)")
  print("x floor: time / the (XLA) floor's time at the same batch; x best: / the "
        "faster of floor and floor_graph; spread%: (max - min) / median over rounds")
  print()

  print("## speed-ups of rnnstep (same batch; > 1 means rnnstep is faster)")
  header = (f"{'rnnstep':<15} {'batch':>5} {'vs eager':>9} {'vs OneStep':>11} "
            f"{'vs torch_gru':>13} {'vs torch_fused':>15} {'x floor':>8}")
  print(header)
  print("-" * len(header))
  for batch in settings.batch_sizes:
    for v in RNNSTEP_VARIANTS:
      if (v, batch) not in medians:
        continue
      mine = medians[(v, batch)]
      cells = []
      for other in ("eager_keras", "onestep_keras", "torch_gru", "torch_fused",
                    "floor"):
        theirs = medians.get((other, batch))
        if other == "floor":
          cells.append(f"{mine / theirs:.2f}" if theirs else "-")
        else:
          cells.append(f"{theirs / mine:.2f}" if theirs else "-")
      print(f"{v:<15} {batch:>5} {cells[0]:>9} {cells[1]:>11} {cells[2]:>13} "
            f"{cells[3]:>15} {cells[4]:>8}")
      results_out.append({"section": "speedup", "variant": v, "batch": batch,
                          "vs_eager": _ratio(medians, "eager_keras", batch, mine),
                          "vs_onestep": _ratio(medians, "onestep_keras", batch, mine),
                          "vs_torch_gru": _ratio(medians, "torch_gru", batch, mine),
                          "vs_torch_fused": _ratio(medians, "torch_fused", batch,
                                                   mine),
                          "x_floor": (mine / medians[("floor", batch)]
                                      if ("floor", batch) in medians else None)})
  print()


def _ratio(medians, other, batch, mine):
  theirs = medians.get((other, batch))
  return theirs / mine if theirs else None


def dtype_section(settings, weights, tf, results_out):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  if not settings.dtypes:
    return
  batch = settings.dtype_batch
  models = {"float32": weights.rnnstep_model("float32")}
  for d in settings.dtypes:
    models[d] = weights.rnnstep_model(d)
  _, prompt_texts = make_prompts(weights, batch, settings.prompt_len, _SEED.value)
  jobs = []
  modes = [m for m in _DTYPE_MODES.value if m]
  for mode in modes:
    if mode != "default" and mode not in PATHS:
      raise app.UsageError(f"--dtype_modes: {mode!r} is not default or one of "
                           f"{tuple(PATHS)}")
    for d, model in models.items():
      jit = None if mode == "default" else PATHS[mode]
      jobs.append(((mode, d), Rnnstep(model, settings, jit),
                   (prompt_texts, _SEED.value)))
  samples, _ = run_rounds(jobs, settings.rounds, "dtype")

  medians = {key: statistics.median(secs) for key, secs in samples.items()}
  best_f32 = min(medians[(mode, "float32")] for mode in modes)
  print(f"## reduced precision: rnnstep at batch {batch}, ms per 1000 chars "
        "(median); speed-up over float32 on the same path, and over the "
        "fastest float32 path measured")
  header = (f"{'path':<11} {'dtype':<9} {'ms/1000ch':>11} {'chars/s':>11} "
            f"{'vs f32':>7} {'vs f32 best':>11} {'spread%':>8}")
  print(header)
  print("-" * len(header))
  for mode in modes:
    base = medians[(mode, "float32")]
    for d in models:
      secs = samples[(mode, d)]
      med = medians[(mode, d)]
      per_1000 = med * 1000.0 / settings.num_chars
      print(f"{mode:<11} {d:<9} {fmt_ms(per_1000):>11} "
            f"{batch * 1000.0 / per_1000:>11,.0f} {base / med:>7.2f} "
            f"{best_f32 / med:>11.2f} {spread(secs):>7.0f}%")
      results_out.append({"section": "dtype", "mode": mode, "dtype": d,
                          "batch": batch, "ms_per_1000_chars": per_1000 * 1e3,
                          "chars_per_s": batch * 1000.0 / per_1000,
                          "speedup_vs_float32": base / med,
                          "speedup_vs_fastest_float32": best_f32 / med,
                          "round_seconds": secs})
  print()

  # Fidelity: teacher-forced logits over a sampled float32 text, and greedy text.
  prompt = prompt_texts[0]
  text = rnnstep.generate(models["float32"], prompt, settings.num_chars,
                          temperature=settings.temperature, seed=_SEED.value)
  ids = models["float32"].encode(prompt + text)[None, :]
  ref = rnnstep.logits(models["float32"], ids)
  greedy = {d: rnnstep.generate(m, prompt, settings.num_chars, temperature=0.0)
            for d, m in models.items()}
  print(f"## reduced-precision fidelity (one row: {settings.prompt_len}-char prompt "
        f"+ {settings.num_chars} chars)")
  header = (f"{'dtype':<9} {'max|dlogit|':>11} {'mean|dlogit|':>12} "
            f"{'logit std':>9} {'argmax agree':>12} {'greedy agree':>12} "
            f"{'1st diff':>8}")
  print(header)
  print("-" * len(header))
  for d in settings.dtypes:
    got = rnnstep.logits(models[d], ids)
    err = np.abs(got - ref)
    argmax_agree = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    a, b = greedy["float32"], greedy[d]
    same = [x == y for x, y in zip(a, b)]
    greedy_agree = sum(same) / max(len(same), 1)
    first_diff = next((i for i, s in enumerate(same) if not s), None)
    print(f"{d:<9} {err.max():>11.4f} {err.mean():>12.5f} {ref.std():>9.3f} "
          f"{argmax_agree * 100:>11.1f}% {greedy_agree * 100:>11.1f}% "
          f"{'none' if first_diff is None else first_diff:>8}")
    results_out.append({"section": "fidelity", "dtype": d,
                        "max_abs_logit_error": float(err.max()),
                        "mean_abs_logit_error": float(err.mean()),
                        "logit_std": float(ref.std()),
                        "teacher_forced_argmax_agreement": argmax_agree,
                        "greedy_agreement": greedy_agree,
                        "greedy_first_difference": first_diff})
  print()
  print("argmax agree: teacher-forced argmax equal to float32's; greedy agree: "
        "positions equal in temperature-0 text (after a first difference the "
        "texts drift apart, so this is a lower bound on per-step agreement)")
  print()


def paths_section(settings, weights, tf, results_out):
  """Times every execution path for float32 and each --dtype over batch sizes.

  This is the evidence behind `rnnstep.api.default_jit_compile`, which picks a
  path per (dtype, batch size): the table shows the fastest path and the
  default's time relative to it.
  """
  import copy  # pylint: disable=g-import-not-at-top
  from rnnstep import api  # pylint: disable=g-import-not-at-top
  del tf
  short = copy.copy(settings)
  short.num_chars = settings.path_chars
  models = {d: weights.rnnstep_model(d) for d in ["float32", *settings.dtypes]}
  jobs = []
  for batch in settings.path_batch_sizes:
    _, prompt_texts = make_prompts(weights, batch, settings.prompt_len,
                                   _SEED.value)
    for d, model in models.items():
      for path, jit in PATHS.items():
        jobs.append(((d, batch, path), Rnnstep(model, short, jit),
                     (prompt_texts, _SEED.value)))
  samples, _ = run_rounds(jobs, settings.rounds, "paths")

  print(f"## execution paths: ms per 1000 chars (median; {short.num_chars} chars "
        "per row), the fastest, and the path `jit_compile=None` picks")
  header = (f"{'dtype':<9} {'batch':>5} " + " ".join(f"{p:>11}" for p in PATHS)
            + f" {'fastest':>11} {'default':>11} {'x fastest':>9}")
  print(header)
  print("-" * len(header))
  for d, model in models.items():
    for batch in settings.path_batch_sizes:
      per_1000 = {p: statistics.median(samples[(d, batch, p)]) * 1000.0
                  / short.num_chars for p in PATHS}
      fastest = min(per_1000, key=per_1000.get)
      default = api.default_path(model, batch)
      print(f"{d:<9} {batch:>5} "
            + " ".join(f"{fmt_ms(per_1000[p]):>11}" for p in PATHS)
            + f" {fastest:>11} {default:>11} "
            f"{per_1000[default] / per_1000[fastest]:>9.2f}")
      results_out.append({"section": "paths", "dtype": d, "batch": batch,
                          "ms_per_1000_chars": {p: v * 1e3 for p, v
                                                in per_1000.items()},
                          "fastest": fastest, "default": default})
  print()


def latency_child():
  """Run in a fresh process: times import, load, first and second call."""
  t0 = time.time()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import
  t_tf = time.time()
  import rnnstep  # pylint: disable=g-import-not-at-top
  t_import = time.time()
  model = rnnstep.load(_MODEL_FILE.value)
  t_load = time.time()
  jit = _LATENCY_CHILD.value == "xla"
  num_chars = _NUM_CHARS.value
  prompt = probe_prompt(model.vocab)
  rnnstep.generate(model, prompt, num_chars, seed=1, jit_compile=jit)
  t_first = time.time()
  rnnstep.generate(model, prompt, num_chars, seed=2, jit_compile=jit)
  t_second = time.time()
  print(json.dumps({"t0": t0, "import_tf": t_tf - t0,
                    "import_rnnstep": t_import - t_tf, "load": t_load - t_import,
                    "first_call": t_first - t_load, "second_call": t_second - t_first,
                    "t_first_text": t_first}))


def latency_section(settings, weights, tmpdir, results_out):
  path = os.path.join(tmpdir, "bench_model.npz")
  if not os.path.exists(path):
    weights.write(path)
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  runs = {}
  for _ in range(_LATENCY_RUNS.value):
    for mode in ("graph", "xla"):
      cmd = [sys.executable, os.path.abspath(__file__), f"--latency_child={mode}",
             f"--model_file={path}", f"--num_chars={settings.num_chars}"]
      log(f"[latency] fresh process, {mode} ...")
      start = time.time()
      proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                            check=False)
      end = time.time()
      if proc.returncode != 0:
        print(f"## first-call latency: child failed ({mode}):\n{proc.stderr[-2000:]}")
        return
      data = json.loads(proc.stdout.strip().splitlines()[-1])
      data["python_start"] = data["t0"] - start
      data["time_to_first_text"] = data["t_first_text"] - start
      data["process_wall"] = end - start
      runs.setdefault(mode, []).append(data)
  print(f"## first-call latency: fresh process, batch 1, {settings.num_chars} chars "
        f"(seconds; median of {_LATENCY_RUNS.value})")
  keys = ["python_start", "import_tf", "import_rnnstep", "load", "first_call",
          "second_call", "time_to_first_text", "process_wall"]
  header = f"{'mode':<6} " + " ".join(f"{k:>12}" for k in
                                      ["py start", "import tf", "import rnnstep",
                                       "load", "1st call", "2nd call",
                                       "first text", "process"])
  print(header)
  print("-" * len(header))
  for mode, datas in runs.items():
    med = {k: statistics.median(d[k] for d in datas) for k in keys}
    print(f"{mode:<6} " + " ".join(f"{med[k]:>12.2f}" for k in keys))
    results_out.append({"section": "latency", "mode": mode, **med})
  print()
  print("1st call - 2nd call ~ trace (graph) or trace + XLA compile cost; "
        "first text: from process spawn to the first call's return")
  print()


def cli_section(settings, weights, tmpdir, results_out):
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
      model_args.append(f"--prompt={probe_prompt(weights.vocab, 6)}")
  env = dict(os.environ)
  print(f"## CLI end-to-end: rnnstep-generate --num_steps={settings.num_chars}, "
        f"{what} (wall seconds, median of {_CLI_RUNS.value})")
  for jit in ("--nojit_compile", "--jit_compile", None):
    cmd = [exe, f"--num_steps={settings.num_chars}", "--seed=1", *model_args]
    if jit:
      cmd.append(jit)
    times = []
    for _ in range(_CLI_RUNS.value):
      log(f"[cli] {' '.join(cmd[1:])}")
      start = time.time()
      proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                            check=False)
      times.append(time.time() - start)
      if proc.returncode != 0:
        print(f"  {jit or '(default)'}: failed: {proc.stderr.strip()[-500:]}")
        break
    else:
      label = jit or "(library default)"
      print(f"  {label:<18} {statistics.median(times):6.2f} s")
      results_out.append({"section": "cli", "mode": label,
                          "wall_seconds": statistics.median(times),
                          "runs": times, "model": what})
  print()


# -- main ----------------------------------------------------------------------


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _LATENCY_CHILD.value:
    latency_child()
    return 0
  settings = Settings()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if _INTRA.value:
    tf.config.threading.set_intra_op_parallelism_threads(_INTRA.value)
  if _INTER.value:
    tf.config.threading.set_inter_op_parallelism_threads(_INTER.value)
  # Once, before anything is compiled: tf.random.set_seed clears the eager
  # kernel cache (every tf.function re-instantiates at its next call).
  tf.random.set_seed(_SEED.value)
  torch = None
  if ("speed" in settings.sections
      and any(v in settings.variants for v in TORCH_VARIANTS)):
    torch = import_torch()
    if torch is not None:
      torch.set_num_threads(_TORCH_THREADS.value or usable_cores())
  weights = Weights(settings)
  facts = machine_facts(tf, torch)
  print_header(facts, settings, weights.describe())
  sys.stdout.flush()
  results = []
  started = time.time()
  with tempfile.TemporaryDirectory(prefix="rnnstep_bench_") as tmpdir:
    for section in settings.sections:
      if section == "speed":
        speed_section(settings, weights, tf, torch, results)
      elif section == "dtype":
        dtype_section(settings, weights, tf, results)
      elif section == "paths":
        paths_section(settings, weights, tf, results)
      elif section == "latency":
        latency_section(settings, weights, tmpdir, results)
      elif section == "cli":
        cli_section(settings, weights, tmpdir, results)
      sys.stdout.flush()
  facts["loadavg_end"] = list(os.getloadavg())
  print(f"load average at end: {' '.join(f'{x:.2f}' for x in facts['loadavg_end'])};"
        f" benchmark took {time.time() - started:.0f} s")
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      json.dump({"machine": facts, "argv": sys.argv,
                 "settings": vars(settings), "model": weights.describe(),
                 "results": results}, f, indent=1)
    print(f"results written to {_JSON_OUT.value}")
  return 0


if __name__ == "__main__":
  app.run(main)
