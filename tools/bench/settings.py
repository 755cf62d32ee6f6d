"""The benchmark's flags and the settings in force (--quick overrides them).

Every flag of tools/benchmark.py is defined here, so that importing the
section modules defines them once; the sections read a `Settings`.
"""

from absl import app
from absl import flags

from rnnstep.engine import paths

ALL_VARIANTS = ("eager_keras", "onestep_keras", "rnnstep", "rnnstep_graph",
                "rnnstep_xla", "rnnstep_elementwise", "floor", "floor_graph",
                "torch_gru", "torch_fused")
DEFAULT_VARIANTS = ("eager_keras", "onestep_keras", "rnnstep", "rnnstep_graph",
                    "rnnstep_xla", "floor", "floor_graph", "torch_gru",
                    "torch_fused")
TORCH_VARIANTS = ("torch_gru", "torch_fused")
SECTIONS = ("speed", "dtype", "paths", "lanes", "floors", "decoding",
            "latency", "cli", "window", "words", "bulk")
# rnnstep's execution paths, by their `jit_compile` value (rnnstep/paths.py).
PATHS = paths.JIT_COMPILE
RNNSTEP_VARIANTS = ("rnnstep", "rnnstep_graph", "rnnstep_xla",
                    "rnnstep_elementwise")

QUICK = flags.DEFINE_boolean(
    "quick", False,
    "Smoke test: a tiny model (U=64, E=16), 40 chars, 1 round, batches 1 and 4, "
    "sections speed, dtype (at batch 4), paths, floors (float32 at 1 and "
    "4, bfloat16 at 4), decoding and words (V=300, nhid 16, 10 words, "
    "batch 1) "
    "unless --sections is given. "
    "Overrides the size, step, round and batch flags.")
SECTIONS_FLAG = flags.DEFINE_list(
    "sections", list(SECTIONS), f"Which sections to run, of {SECTIONS}.")
VARIANTS = flags.DEFINE_list(
    "variants", list(DEFAULT_VARIANTS), f"Speed variants, of {ALL_VARIANTS}.")
BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "64", "256"],
                                 "Batch sizes (rows generated together).")
EAGER_BATCH_SIZES = flags.DEFINE_list(
    "eager_batch_sizes", ["1"],
    "Batch sizes at which eager_keras runs (it is slow); 'all' for every one.")
NUM_CHARS = flags.DEFINE_integer("num_chars", 1000,
                                  "Characters generated per row.", lower_bound=1)
PROMPT_LEN = flags.DEFINE_integer("prompt_len", 10, "Prompt length in characters.",
                                   lower_bound=1)
TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature (> 0).")
EAGER_STEPS = flags.DEFINE_integer(
    "eager_steps", 200,
    "Steps the eager loop actually runs; its time is scaled to --num_chars.",
    lower_bound=1)
ONESTEP_STEPS = flags.DEFINE_integer(
    "onestep_steps", 0,
    "Steps the OneStep loop runs, scaled to --num_chars (0 = all of them).",
    lower_bound=0)
ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (medians over them).",
                               lower_bound=1)
VOCAB = flags.DEFINE_integer("vocab_size", 65, "Vocabulary size.", lower_bound=2)
EMBEDDING = flags.DEFINE_integer("embedding_dim", 256, "Embedding width.",
                                  lower_bound=1)
UNITS = flags.DEFINE_integer("units", 1024, "GRU units.", lower_bound=1)
WEIGHTS = flags.DEFINE_string(
    "weights", None,
    "Benchmark this rnnstep model file (.npz, one GRU reset_after layer) instead "
    "of random weights; overrides the size flags.")
SEED = flags.DEFINE_integer("seed", 1234, "Seed of the weights, prompts, sampling.")
INTRA = flags.DEFINE_integer(
    "intra_op_threads", 0, "tf.config.threading intra-op threads (0 = TF default).")
INTER = flags.DEFINE_integer(
    "inter_op_threads", 0, "tf.config.threading inter-op threads (0 = TF default).")
TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads", 0, "torch.set_num_threads (0 = the number of usable cores).")
DTYPE = flags.DEFINE_list(
    "dtype", ["bfloat16"],
    "Reduced-precision dtypes compared with float32 in the dtype section "
    "(bfloat16, float16).")
DTYPE_BATCH = flags.DEFINE_integer("dtype_batch", 256,
                                    "Batch size of the dtype section.", lower_bound=1)
DTYPE_MODES = flags.DEFINE_list(
    "dtype_modes", ["default", "xla", "graph", "elementwise"],
    "rnnstep paths timed in the dtype section ('default' = jit_compile=None).")
PATH_BATCH_SIZES = flags.DEFINE_list(
    "path_batch_sizes", ["1", "8", "16", "32", "64", "128", "256"],
    "Batch sizes of the paths section.")
LANE_ROWS = flags.DEFINE_list(
    "lane_rows", ["4", "8", "16", "32", "64", "128"],
    "Rows a lane of the lanes section (rnnstep-serve's --max_batch 8-256 "
    "over two lanes).")
LANES = flags.DEFINE_integer(
    "lanes", None, "Concurrent calls in the lanes section, one thread each "
    "(default: the usable cores, as rnnstep-serve's --lanes).", lower_bound=1)
PATH_CHARS = flags.DEFINE_integer(
    "path_chars", 300, "Characters per row in the paths section.", lower_bound=1)
CLI_RUNS = flags.DEFINE_integer("cli_runs", 3, "Runs of the CLI (median).",
                                 lower_bound=1)
LATENCY_RUNS = flags.DEFINE_integer(
    "latency_runs", 1, "Fresh processes per mode in the latency section (median).",
    lower_bound=1)
JSON_OUT = flags.DEFINE_string("json_out", None, "Also write all results here.")
FLOOR_CASES = flags.DEFINE_list(
    "floor_cases", ["float32:1", "float32:16", "float32:32", "float32:64",
                    "float32:256", "bfloat16:256"],
    "dtype:batch cases of the floors section.")
TUNE = flags.DEFINE_boolean(
    "tune", False,
    "Before the sections, run rnnstep.tune on the benchmark's model for every "
    "--floor_cases dtype and batch (writes the tuning cache: "
    "$RNNSTEP_CACHE_DIR, else ~/.cache/rnnstep), so that the default columns "
    "show the measured winners ('tuned').")
DECODING_PATH = flags.DEFINE_enum(
    "decoding_path", "xla", ["xla", "graph", "elementwise"],
    "The path of the decoding section's comparisons.")
DECODING_CHARS = flags.DEFINE_integer(
    "decoding_chars", 500, "Characters per row in the decoding section.",
    lower_bound=1)
FLOOR_CHARS = flags.DEFINE_list(
    "floor_chars", ["1:1000", "16:500", "32:300", "256:200"],
    "batch:chars: characters per row in the floors section for batches from "
    "that size up to the next one listed (fewer at large batches keeps the "
    "run short; the per-step time is what is compared).")
WINDOW_BATCH_SIZES = flags.DEFINE_list(
    "window_batch_sizes", ["1", "64"],
    "Batch sizes of the window section (window vs stateful vs the recipe's "
    "predict loop).")
WINDOW_CHARS = flags.DEFINE_integer(
    "window_chars", 200, "Characters per row in the window section.",
    lower_bound=1)
WORDS_VOCAB = flags.DEFINE_integer(
    "words_vocab_size", 33278,
    "Vocabulary of the words section (wikitext-2's word count).", lower_bound=2)
WORDS_EMBEDDING = flags.DEFINE_integer(
    "words_embedding", 200, "emsize of the words section's model.",
    lower_bound=1)
WORDS_UNITS = flags.DEFINE_list(
    "words_units", ["200", "1024"],
    "nhid of each model of the words section (2 LSTM layers each).")
WORDS_BATCH_SIZES = flags.DEFINE_list(
    "words_batch_sizes", ["1", "64"], "Batch sizes of the words section.")
WORDS_STEPS = flags.DEFINE_integer(
    "words_steps", 200, "Words per row in the words section.", lower_bound=1)
WORDS_RECIPE_STEPS = flags.DEFINE_integer(
    "words_recipe_steps", 50,
    "Words the recipe's generate.py loop runs in the words section (timed "
    "per step like the others).", lower_bound=1)
BULK_RECORDS = flags.DEFINE_integer(
    "bulk_records", 10_000, "bulk: prompts of the jsonl job (one record each).",
    lower_bound=1)
BULK_CHARS = flags.DEFINE_integer(
    "bulk_chars", 50, "bulk: characters generated per record.", lower_bound=1)
BULK_PAIRS = flags.DEFINE_integer(
    "bulk_pairs", 10_000, "bulk: (context, continuation) pairs scored.",
    lower_bound=1)
BULK_LOOP_PAIRS = flags.DEFINE_integer(
    "bulk_loop_pairs", 500,
    "bulk: pairs the per-pair rnnstep.logits loop is timed over (its time is "
    "scaled to --bulk_pairs).", lower_bound=1)
BULK_PARTS = flags.DEFINE_list(
    "bulk_parts", ["job", "scoring"],
    "bulk: which comparisons to run: job (the jsonl job against the "
    "library), scoring (loglikelihood against the logits loop).")
WINDOW_PREDICT_STEPS = flags.DEFINE_integer(
    "window_predict_steps", 10,
    "Characters the recipe's model.predict loop runs (scaled to "
    "--window_chars).", lower_bound=1)

# -- settings ------------------------------------------------------------------


class Settings:
  """The sizes and counts in force (--quick overrides the flags)."""

  def __init__(self):
    quick = QUICK.value
    self.quick = quick
    self.vocab_size = VOCAB.value
    self.embedding_dim = 16 if quick else EMBEDDING.value
    self.units = 64 if quick else UNITS.value
    self.num_chars = 40 if quick else NUM_CHARS.value
    self.prompt_len = PROMPT_LEN.value
    self.temperature = TEMPERATURE.value
    self.eager_steps = min(10 if quick else EAGER_STEPS.value, self.num_chars)
    onestep = ONESTEP_STEPS.value or self.num_chars
    self.onestep_steps = min(onestep, self.num_chars)
    self.rounds = 1 if quick else ROUNDS.value
    self.batch_sizes = [1, 4] if quick else [int(b) for b in BATCH_SIZES.value]
    if EAGER_BATCH_SIZES.value == ["all"]:
      self.eager_batch_sizes = list(self.batch_sizes)
    else:
      self.eager_batch_sizes = ([1] if quick else
                                [int(b) for b in EAGER_BATCH_SIZES.value])
    self.dtype_batch = 4 if quick else DTYPE_BATCH.value
    self.path_batch_sizes = ([1, 4] if quick else
                             [int(b) for b in PATH_BATCH_SIZES.value])
    self.path_chars = self.num_chars if quick else PATH_CHARS.value
    self.lane_rows = ([1, 4] if quick else
                      [int(r) for r in LANE_ROWS.value])
    if LANES.value is None:
      from rnnstep.engine import cpu  # pylint: disable=g-import-not-at-top
      self.lanes = cpu.usable_cores()
    else:
      self.lanes = LANES.value
    self.floor_cases = (["float32:1", "float32:4", "bfloat16:4"] if quick
                        else [c for c in FLOOR_CASES.value if c])
    self.floor_cases = [_floor_case(c) for c in self.floor_cases]
    self.floor_chars = ({1: self.num_chars} if quick else
                        _batch_map(FLOOR_CHARS.value, "--floor_chars"))
    self.seed = SEED.value
    self.decoding_path = DECODING_PATH.value
    self.decoding_chars = self.num_chars if quick else DECODING_CHARS.value
    self.tune = TUNE.value
    self.window_batch_sizes = ([1, 4] if quick else
                               [int(b) for b in WINDOW_BATCH_SIZES.value])
    self.window_chars = 20 if quick else WINDOW_CHARS.value
    self.window_predict_steps = 2 if quick else WINDOW_PREDICT_STEPS.value
    self.words_vocab_size = 300 if quick else WORDS_VOCAB.value
    self.words_embedding = 8 if quick else WORDS_EMBEDDING.value
    self.words_units = [16] if quick else [int(u) for u in WORDS_UNITS.value]
    self.words_batch_sizes = ([1] if quick else
                              [int(b) for b in WORDS_BATCH_SIZES.value])
    self.words_steps = 10 if quick else WORDS_STEPS.value
    self.words_recipe_steps = 3 if quick else WORDS_RECIPE_STEPS.value
    self.bulk_records = 40 if quick else BULK_RECORDS.value
    self.bulk_chars = 10 if quick else BULK_CHARS.value
    self.bulk_pairs = 40 if quick else BULK_PAIRS.value
    self.bulk_parts = BULK_PARTS.value
    self.bulk_loop_pairs = min(10 if quick else BULK_LOOP_PAIRS.value,
                               self.bulk_pairs)
    self.weights_path = WEIGHTS.value
    self.dtype_modes = [m for m in DTYPE_MODES.value if m]
    self.cli_runs = CLI_RUNS.value
    self.latency_runs = LATENCY_RUNS.value
    self.sections = [s for s in SECTIONS_FLAG.value if s]
    if quick and not flags.FLAGS["sections"].present:
      # The latency, lanes and cli sections start fresh TensorFlow processes
      # (seconds each): asked for explicitly only.
      self.sections = ["speed", "dtype", "paths", "floors", "decoding",
                       "words"]
    for s in self.sections:
      if s not in SECTIONS:
        raise app.UsageError(f"--sections: unknown section {s!r}; of {SECTIONS}")
    self.variants = [v for v in VARIANTS.value if v]
    for v in self.variants:
      if v not in ALL_VARIANTS:
        raise app.UsageError(f"--variants: unknown variant {v!r}; of {ALL_VARIANTS}")
    self.dtypes = [d for d in DTYPE.value if d]
    for d in self.dtypes:
      if d not in ("bfloat16", "float16"):
        raise app.UsageError(f"--dtype: {d!r} is not bfloat16 or float16")
    if self.temperature <= 0:
      raise app.UsageError("--temperature must be > 0 (the variants sample)")


  def chars_for_floor(self, batch: int) -> int:
    """Characters per row at `batch` in the floors section (see --floor_chars)."""
    fitting = [b for b in self.floor_chars if b <= batch]
    return self.floor_chars[max(fitting) if fitting else min(self.floor_chars)]


def _floor_case(text):
  dtype, _, batch = text.partition(":")
  if dtype not in ("float32", "bfloat16", "float16") or not batch.isdigit() \
      or int(batch) < 1:
    raise app.UsageError(f"--floor_cases: {text!r} is not dtype:batch (e.g. "
                         "bfloat16:256)")
  return dtype, int(batch)


def _batch_map(items, flag):
  out = {}
  for text in items:
    batch, _, chars = text.partition(":")
    if not (batch.isdigit() and chars.isdigit() and int(batch) >= 1
            and int(chars) >= 1):
      raise app.UsageError(f"{flag}: {text!r} is not batch:chars (e.g. 256:200)")
    out[int(batch)] = int(chars)
  if not out:
    raise app.UsageError(f"{flag} is empty")
  return out
