"""Section `speed`: rnnstep against the tutorial loops, PyTorch and the floor."""

import statistics

from bench import keras_loops
from bench import runners
from bench import settings as cfg
from bench import timing
from bench import torch_loops
from bench import weights as weights_lib


def run(ctx, results_out):
  """Times every --variants variant at every --batch_sizes batch."""
  settings, weights, torch = ctx.settings, ctx.weights, ctx.torch
  variants = list(settings.variants)
  skipped = []
  if torch is None:
    for v in cfg.TORCH_VARIANTS:
      if v in variants:
        variants.remove(v)
        skipped.append(v)
  keras_model = None
  if "eager_keras" in variants or "onestep_keras" in variants:
    keras_model = keras_loops.build_keras_model(weights)
  model = weights.rnnstep_model()
  loops = {}
  torch_model = None
  if torch is not None and any(v in variants for v in cfg.TORCH_VARIANTS):
    torch_model = torch_loops.TorchModel(torch, weights)
  for v in variants:
    if v == "eager_keras":
      loops[v] = keras_loops.EagerKeras(keras_model, weights, settings)
    elif v == "onestep_keras":
      loops[v] = keras_loops.OneStepKeras(keras_model, weights, settings)
    elif v == "rnnstep":
      loops[v] = runners.Rnnstep(model, settings, jit_compile=None)
    elif v == "rnnstep_graph":
      loops[v] = runners.Rnnstep(model, settings, jit_compile=False)
    elif v == "rnnstep_xla":
      loops[v] = runners.Rnnstep(model, settings, jit_compile=True)
    elif v == "rnnstep_elementwise":
      loops[v] = runners.Rnnstep(model, settings,
                                 jit_compile="elementwise")
    elif v == "floor":
      loops[v] = runners.Floor(weights, settings, jit_compile=True,
                               priming_steps=settings.prompt_len - 1)
    elif v == "floor_graph":
      loops[v] = runners.Floor(weights, settings, jit_compile=False,
                               priming_steps=settings.prompt_len - 1)
    elif v == "torch_gru":
      loops[v] = torch_loops.TorchGRU(torch, torch_model, settings)
    elif v == "torch_fused":
      loops[v] = torch_loops.TorchFused(torch, torch_model, weights,
                                        settings)

  jobs = []
  scale = {}
  for batch in settings.batch_sizes:
    prompt_ids, prompt_texts = weights_lib.make_prompts(
        weights, batch, settings.prompt_len, settings.seed)
    for v in variants:
      if v == "eager_keras" and batch not in settings.eager_batch_sizes:
        continue
      if v.startswith("floor"):
        args = (batch, settings.seed)
      elif v.startswith("rnnstep"):
        args = (prompt_texts, settings.seed)
      else:
        args = (prompt_ids, settings.seed)
      steps = {"eager_keras": settings.eager_steps,
               "onestep_keras": settings.onestep_steps}.get(v, settings.num_chars)
      scale[(v, batch)] = settings.num_chars / steps
      jobs.append(((v, batch), loops[v], args))
  samples, warmup = timing.run_rounds(jobs, settings.rounds, "speed")

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
        "spread_pct": timing.spread(secs)})
    rows.append((v, batch))

  print("## speed: ms per 1000 chars (median of rounds), chars/s = B x 1000 / time")
  if skipped:
    print(f"(skipped, torch not importable: {', '.join(skipped)})")
  header = (f"{'variant':<15} {'batch':>5} {'ms/1000ch':>11} {'chars/s':>11} "
            f"{'x floor':>8} {'x best':>7} {'spread%':>8} {'warm-up s':>9}")
  print(header)
  print("-" * len(header))
  order = {v: i for i, v in enumerate(cfg.ALL_VARIANTS)}
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
      print(f"{v:<15} {batch:>5} {timing.fmt_ms(per_1000):>10}{mark} "
            f"{batch * 1000.0 / per_1000:>11,.0f} {ratio:>8} {ratio_best:>7} "
            f"{res['spread_pct']:>7.0f}% {warmup[(v, batch)]:>9.2f}")
  print()
  scaled = sorted({(v, settings.num_chars / s) for (v, _), s in scale.items()
                   if s != 1})
  for v, steps in scaled:
    print(f"* {v} ran {steps:.0f} of {settings.num_chars} steps per round; "
          f"its time is scaled to {settings.num_chars} (prompt cost included once)")
  print("x floor: time / the (XLA) floor's time at the same batch (the floors "
        "run the prompt's priming steps too); x best: / the faster of floor and "
        "floor_graph; spread%: (max - min) / median over rounds")
  print()

  print("## speed-ups of rnnstep (same batch; > 1 means rnnstep is faster)")
  header = (f"{'rnnstep':<15} {'batch':>5} {'vs eager':>9} {'vs OneStep':>11} "
            f"{'vs torch_gru':>13} {'vs torch_fused':>15} {'x floor':>8}")
  print(header)
  print("-" * len(header))
  for batch in settings.batch_sizes:
    for v in cfg.RNNSTEP_VARIANTS:
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

