"""Section `dtype`: reduced precision against float32, speed and fidelity."""

import statistics

from absl import app

from bench import runners
from bench import settings as cfg
from bench import timing
from bench import weights as weights_lib


def run(ctx, results_out):
  """rnnstep float32 against each --dtype at --dtype_batch: speed, fidelity."""
  settings, weights = ctx.settings, ctx.weights
  import numpy as np  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  if not settings.dtypes:
    return
  batch = settings.dtype_batch
  models = {"float32": weights.rnnstep_model("float32")}
  for d in settings.dtypes:
    models[d] = weights.rnnstep_model(d)
  _, prompt_texts = weights_lib.make_prompts(weights, batch,
                                             settings.prompt_len, settings.seed)
  jobs = []
  modes = [m for m in settings.dtype_modes if m]
  for mode in modes:
    if mode != "default" and mode not in cfg.PATHS:
      raise app.UsageError(f"--dtype_modes: {mode!r} is not default or one of "
                           f"{tuple(cfg.PATHS)}")
    for d, model in models.items():
      jit = None if mode == "default" else cfg.PATHS[mode]
      jobs.append(((mode, d), runners.Rnnstep(model, settings, jit),
                   (prompt_texts, settings.seed)))
  samples, _ = timing.run_rounds(jobs, settings.rounds, "dtype")

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
      print(f"{mode:<11} {d:<9} {timing.fmt_ms(per_1000):>11} "
            f"{batch * 1000.0 / per_1000:>11,.0f} {base / med:>7.2f} "
            f"{best_f32 / med:>11.2f} {timing.spread(secs):>7.0f}%")
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
                          temperature=settings.temperature, seed=settings.seed)
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

