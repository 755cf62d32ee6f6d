"""rnnstep-tune: measure which execution path is fastest here, and remember it.

USAGE: rnnstep-tune [flags]

  rnnstep-tune                                  # the bundled model, float32
  rnnstep-tune --model=model.npz --dtype=bfloat16 --batch_sizes=1,64,256

For each batch size, every path rnnstep can run a generation on (xla: one XLA
program; graph: a TensorFlow graph; elementwise: a graph with XLA-compiled gate
math) is compiled once, then timed in interleaved rounds (a few seconds per
batch size); the fastest median wins. The winners are written to the tuning
cache, keyed by this machine (CPU model and features, cores, TensorFlow
version), the model's shape and dtype, and the batch size's range (1, 2-4,
5-8, 9-16, 17-32, 33-64, 65-128, 129-256, >256). From then on
`jit_compile=None` (the default of rnnstep.generate and rnnstep-generate)
takes the winner for that range; nothing else measures. The cache is tuning.json in $RNNSTEP_CACHE_DIR,
else $XDG_CACHE_HOME/rnnstep, else ~/.cache/rnnstep; RNNSTEP_TUNING=off makes
rnnstep ignore it (this command then measures and prints, saving nothing).

With --lanes=N it measures for rnnstep-serve's lanes instead: TensorFlow on
one intra-op thread, each timed call N concurrent generations of the batch
size, one thread each (give each lane's rows: --max_batch / lanes); the
winners are kept apart, for a server with N lanes (docs/guide/serving.md).

Prints one row per batch size: ms per 1000 steps of the whole batch (median)
per path, the fastest, and the path the default took before.

Errors are reported as one line on stderr naming the flag. Exit status: 0
success, 1 failure (model file, cache not writable), 2 bad command line, 130
Ctrl-C, 143 SIGTERM.
"""

from absl import flags

from rnnstep.cli import common  # pylint: disable=g-bad-import-order

PROGRAM = "rnnstep-tune"

# Private flags: see common.py.
FLAGS = flags.FlagValues()
_MODEL, _DTYPE = common.define_model_flags(FLAGS)
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", ["1", "16", "32", "64", "256"],
    "Batch sizes to measure (comma-separated); each stands for its range, so "
    "give the batch sizes you generate with.", flag_values=FLAGS)
_NUM_STEPS = flags.DEFINE_integer(
    "num_steps", 0,
    "Characters per row in each timed call; 0 = by batch size (200 up to "
    "batch 16, fewer above, at least 32).", flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 0,
    "Timed rounds per batch size; 0 = as many as fit --seconds (3 to 9).",
    flag_values=FLAGS)
_SECONDS = flags.DEFINE_float(
    "seconds", 3.0,
    "Seconds of timed rounds per batch size when --rounds=0 (compiling each "
    "path first comes on top).", flag_values=FLAGS)

_LANES = flags.DEFINE_integer(
    "lanes", 0, "Measure for rnnstep-serve with this many lanes (concurrent "
    "calls of --batch_sizes rows, one thread each); 0: one call on "
    "TensorFlow's threads, for rnnstep.generate.", lower_bound=0,
    flag_values=FLAGS)


def _batch_sizes_valid(values):
  try:
    return bool(values) and all(int(v) >= 1 for v in values)
  except ValueError:
    return False


flags.register_validator(
    "batch_sizes", _batch_sizes_valid,
    "must be a comma-separated list of positive integers", flag_values=FLAGS)
flags.register_validator("num_steps", lambda n: 0 <= n < 2**31,
                         "must be an integer >= 0 (0 = by batch size)",
                         flag_values=FLAGS)
flags.register_validator("rounds", lambda n: 0 <= n <= 1000,
                         "must be an integer in [0, 1000] (0 = by --seconds)",
                         flag_values=FLAGS)
flags.register_validator("seconds", lambda s: 0 < s < float("inf"),
                         "must be a number > 0", flag_values=FLAGS)


def main(argv):
  common.reject_arguments(argv)
  from rnnstep import tuning  # pylint: disable=g-import-not-at-top
  if _LANES.value:
    # rnnstep-serve's pools with lanes, before TensorFlow runs anything.
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(_LANES.value)
  model = common.load_model(_MODEL.value, _DTYPE.value, flag=_MODEL.name)
  out = common.stderr()

  def progress(line):
    out.write(f"{PROGRAM}: {line}\n")
    out.flush()

  report = tuning.tune(
      model, [int(b) for b in _BATCH_SIZES.value],
      num_steps=_NUM_STEPS.value or None, rounds=_ROUNDS.value or None,
      budget_seconds=_SECONDS.value, progress=progress,
      lanes=_LANES.value or None)
  print(format_report(report))
  if report["cache_error"]:
    raise common.Failure(report["cache_error"])
  return 0


def format_report(report) -> str:
  """The measurements as a text table, with the machine and where they went."""
  machine, model = report["machine"], report["model"]
  layers = ", ".join(f"{kind}{units}" for kind, units, _ in model["layers"])
  paths = list(report["results"][0]["ms_per_1000_steps"])
  lines = [
      f"machine: {machine['cpu']} | {machine['cores']} cores | flags: "
      f"{' '.join(machine['cpu_flags']) or 'none of amx/avx512/avx2'} | TF "
      f"{machine['tensorflow']} | {machine['device']}",
      f"model: vocab {model['vocab_size']}, embedding {model['embedding_dim']}, "
      f"{layers}, {model['dtype']}",
      "ms per 1000 steps of the whole batch (median of rounds)"
      + (f", {report['lanes']} lanes at once, one thread each (batch: a "
         "lane's rows)" if report.get("lanes") else ""),
  ]
  header = (f"{'batch':>5} {'range':>7} {'steps':>5} {'rounds':>6} "
            + " ".join(f"{p:>11}" for p in paths)
            + f" {'fastest':>11} {'was':>11}")
  lines += [header, "-" * len(header)]
  for row in report["results"]:
    ms = row["ms_per_1000_steps"]
    lines.append(f"{row['batch_size']:>5} {row['batch_range']:>7} "
                 f"{row['num_steps']:>5} {row['rounds']:>6} "
                 + " ".join(f"{ms[p]:>11.1f}" for p in paths)
                 + f" {row['fastest']:>11} {row['previous_default']:>11}")
  if report["cache_file"]:
    lines.append(f"saved to {report['cache_file']}")
  elif not report["cache_error"]:
    lines.append("not saved: RNNSTEP_TUNING is off")
  return "\n".join(lines)


# The console-script entry point: run(argv=None).
run = common.entry_point(PROGRAM, __doc__, FLAGS, main)

if __name__ == "__main__":
  run()
