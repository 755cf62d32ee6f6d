"""Section `floors`: each path and the default against the matmul floor.

For each --floor_cases (dtype, batch): the floor (the faster of the XLA and the
graph loop doing only h@R and h@W_out, `runners.Floor`, over the steps the
generation runs: prompt_len - 1 priming steps, then num_chars), each explicit
path (xla, graph, elementwise), the fastest of them, and the default
(`jit_compile=None`: the tuning cache's winner, else the built-in table), all
timed in one set of interleaved rounds. The ratios answer the issue's
questions directly: default / fastest (did the default pick well?), fastest /
floor (how close is the best path to the matmuls alone?) and default / floor.

The ratios are paired: each is the median over rounds of that round's ratio
(the floor of a round being the faster of its two floors). A shared machine's
load drifts between rounds; the jobs of one round run back to back, so the
drift mostly cancels in a round's ratio and not in a ratio of medians.
"""

import copy
import statistics

from bench import runners
from bench import settings as cfg
from bench import timing
from bench import weights as weights_lib

FLOORS = {"floor_xla": True, "floor_graph": False}


def run(ctx, results_out):
  """Times the floors, every path and the default for every case."""
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import tuning_cache  # pylint: disable=g-import-not-at-top
  settings, weights = ctx.settings, ctx.weights
  jobs = []
  chars = {}
  for dtype, batch in settings.floor_cases:
    case = copy.copy(settings)
    case.num_chars = chars[(dtype, batch)] = settings.chars_for_floor(batch)
    model = weights.rnnstep_model(dtype)
    _, prompt_texts = weights_lib.make_prompts(weights, batch,
                                               settings.prompt_len, settings.seed)
    for name, jit in FLOORS.items():
      jobs.append(((dtype, batch, name),
                   runners.Floor(weights, case, jit, dtype=dtype,
                                 priming_steps=settings.prompt_len - 1),
                   (batch, settings.seed)))
    for path, jit in [*cfg.PATHS.items(), ("default", None)]:
      jobs.append(((dtype, batch, path), runners.Rnnstep(model, case, jit),
                   (prompt_texts, settings.seed)))
  samples, _ = timing.run_rounds(jobs, settings.rounds, "floors")

  print("## floors: ms per 1000 steps (median), floor = min(floor_xla, "
        "floor_graph) over the same priming and decoding steps; fastest of the "
        "explicit paths; default = jit_compile=None; ratios paired by round")
  header = (f"{'dtype':<9} {'batch':>5} {'chars':>5} {'floor_xla':>10} "
            f"{'floor_graph':>11} {'floor':>9} "
            + " ".join(f"{p:>11}" for p in cfg.PATHS)
            + f" {'fastest':>11} {'default':>9} {'took':>11} {'from':>5}"
            f" {'dflt/fast':>9} {'fast/flr':>8} {'dflt/flr':>8}")
  print(header)
  print("-" * len(header))
  for dtype, batch in settings.floor_cases:
    num_chars = chars[(dtype, batch)]
    ms = {name: statistics.median(samples[(dtype, batch, name)]) * 1e6
          / num_chars
          for name in [*FLOORS, *cfg.PATHS, "default"]}
    floor = min(ms[name] for name in FLOORS)
    fastest = min(cfg.PATHS, key=ms.get)
    model = weights.rnnstep_model(dtype)
    took = paths.default_path(model, batch)
    source = "tuned" if tuning_cache.cached_path(model, batch) else "table"
    rounds = {name: samples[(dtype, batch, name)] for name in ms}
    floor_rounds = [min(pair) for pair in zip(*(rounds[f] for f in FLOORS))]
    ratios = {"default_over_fastest": paired(rounds["default"], rounds[fastest]),
              "fastest_over_floor": paired(rounds[fastest], floor_rounds),
              "default_over_floor": paired(rounds["default"], floor_rounds)}
    print(f"{dtype:<9} {batch:>5} {num_chars:>5} {ms['floor_xla']:>10.1f} "
          f"{ms['floor_graph']:>11.1f} {floor:>9.1f} "
          + " ".join(f"{ms[p]:>11.1f}" for p in cfg.PATHS)
          + f" {fastest:>11} {ms['default']:>9.1f} {took:>11} {source:>5}"
          f" {ratios['default_over_fastest']:>9.2f}"
          f" {ratios['fastest_over_floor']:>8.2f}"
          f" {ratios['default_over_floor']:>8.2f}")
    results_out.append({
        "section": "floors", "dtype": dtype, "batch": batch,
        "num_chars": num_chars, "ms_per_1000_steps": ms, "floor": floor,
        "fastest": fastest, "default_path": took, "default_from": source,
        **ratios,
        "round_seconds": rounds})
  print()
  print("took: the path jit_compile=None ran, from the tuning cache "
        "(rnnstep-tune) or the built-in table; dflt/fast = default / fastest "
        "(near 1 when the default took the fastest path: the two are timed "
        "separately, so noise shows here), fast/flr = fastest / floor, "
        "dflt/flr = default / floor; each the median of the rounds' ratios")
  print()


def paired(times, reference_times):
  """The median over rounds of times[r] / reference_times[r]."""
  return statistics.median(t / r for t, r in zip(times, reference_times))


def tune(ctx, results_out):
  """rnnstep.tune for every floor case's dtype and batch (--tune)."""
  from rnnstep import tuning  # pylint: disable=g-import-not-at-top
  settings, weights = ctx.settings, ctx.weights
  dtypes = sorted({dtype for dtype, _ in settings.floor_cases})
  print("## tuning (rnnstep.tune): ms per 1000 steps per path, the winner "
        "saved for the batch's range")
  header = (f"{'dtype':<9} {'batch':>5} {'range':>7} {'steps':>5} "
            f"{'rounds':>6} " + " ".join(f"{p:>11}" for p in cfg.PATHS)
            + f" {'fastest':>11} {'was':>11}")
  print(header)
  print("-" * len(header))
  for dtype in dtypes:
    batches = [b for d, b in settings.floor_cases if d == dtype]
    report = tuning.tune(weights.rnnstep_model(dtype), batches,
                         progress=lambda line: timing.log(f"[tune] {line}"))
    for row in report["results"]:
      ms = row["ms_per_1000_steps"]
      print(f"{dtype:<9} {row['batch_size']:>5} {row['batch_range']:>7} "
            f"{row['num_steps']:>5} {row['rounds']:>6} "
            + " ".join(f"{ms[p]:>11.1f}" for p in cfg.PATHS)
            + f" {row['fastest']:>11} {row['previous_default']:>11}")
      results_out.append({"section": "tune", "dtype": dtype, **row})
    where = report["cache_file"] or report["cache_error"] or "not saved"
    print(f"({dtype}: {where})")
  print()
