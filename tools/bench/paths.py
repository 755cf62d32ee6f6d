"""Section `paths`: every execution path, the fastest, and the default's pick."""

import statistics

from bench import runners
from bench import settings as cfg
from bench import timing
from bench import weights as weights_lib


def run(ctx, results_out):
  """Times every execution path for float32 and each --dtype over batch sizes.

  This is the evidence behind `rnnstep.paths.default_path`, which picks a
  path per (dtype, batch size): the table shows the fastest path and the
  default's time relative to it.
  """
  import copy  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  settings, weights = ctx.settings, ctx.weights
  short = copy.copy(settings)
  short.num_chars = settings.path_chars
  models = {d: weights.rnnstep_model(d) for d in ["float32", *settings.dtypes]}
  jobs = []
  for batch in settings.path_batch_sizes:
    _, prompt_texts = weights_lib.make_prompts(weights, batch,
                                               settings.prompt_len, settings.seed)
    for d, model in models.items():
      for path, jit in cfg.PATHS.items():
        jobs.append(((d, batch, path), runners.Rnnstep(model, short, jit),
                     (prompt_texts, settings.seed)))
  samples, _ = timing.run_rounds(jobs, settings.rounds, "paths")

  print(f"## execution paths: ms per 1000 chars (median; {short.num_chars} chars "
        "per row), the fastest, and the path `jit_compile=None` picks")
  header = (f"{'dtype':<9} {'batch':>5} " + " ".join(f"{p:>11}" for p in cfg.PATHS)
            + f" {'fastest':>11} {'default':>11} {'x fastest':>9}")
  print(header)
  print("-" * len(header))
  for d, model in models.items():
    for batch in settings.path_batch_sizes:
      per_1000 = {p: statistics.median(samples[(d, batch, p)]) * 1000.0
                  / short.num_chars for p in cfg.PATHS}
      fastest = min(per_1000, key=per_1000.get)
      default = paths.default_path(model, batch)
      print(f"{d:<9} {batch:>5} "
            + " ".join(f"{timing.fmt_ms(per_1000[p]):>11}" for p in cfg.PATHS)
            + f" {fastest:>11} {default:>11} "
            f"{per_1000[default] / per_1000[fastest]:>9.2f}")
      results_out.append({"section": "paths", "dtype": d, "batch": batch,
                          "ms_per_1000_chars": {p: v * 1e3 for p, v
                                                in per_1000.items()},
                          "fastest": fastest, "default": default})
  print()

