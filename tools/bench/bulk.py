"""Section `bulk`: the jsonl job against the library, and batched scoring.

Two comparisons, each timed in one process with interleaved rounds (medians;
ratios from the same rounds):

  - `rnnstep-generate --input=IN.jsonl --output=OUT.jsonl` over
    --bulk_records prompts (4-16 characters, no seeds of their own),
    --bulk_chars characters each, run in this process (`rnnstep.cli.generate
    .run`, so TensorFlow's import is left out; its model load, input checks,
    JSON and fsync per batch are in), against the library's own batched
    `rnnstep.generate` over the same prompts and seeds (`return_scores=True`,
    as the job's lines carry them): in one call, and in calls of the job's
    batch size on the job's path. Characters a second.
  - `rnnstep.loglikelihood` over --bulk_pairs (context, continuation) pairs
    against a per-pair loop of `rnnstep.logits` plus a numpy log-softmax
    (what a user writes without it), the loop timed over the first
    --bulk_loop_pairs pairs and scaled per pair. Pairs a second.
"""

import json
import os
import statistics

import numpy as np

from bench import timing


def _texts(weights, count, low, high, seed):
  """`count` random texts of `low`..`high` characters of the vocabulary."""
  rng = np.random.default_rng(seed)
  first = 1 if weights.has_unk else 0
  return ["".join(weights.vocab[i] for i in rng.integers(
      first, weights.vocab_size, rng.integers(low, high + 1)))
          for _ in range(count)]


def run(ctx, results_out):
  """Times the bulk job and batched scoring against their baselines."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from rnnstep.cli import generate as generate_cli
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  settings, weights, tmpdir = ctx.settings, ctx.weights, ctx.tmpdir
  model = weights.rnnstep_model("float32")
  model_path = os.path.join(tmpdir, "bulk_model.npz")
  weights.write(model_path)
  records, steps = settings.bulk_records, settings.bulk_chars
  prompts = _texts(weights, records, 4, 16, settings.seed)
  source = os.path.join(tmpdir, "bulk_in.jsonl")
  with open(source, "w", encoding="utf-8") as f:
    for prompt in prompts:
      f.write(json.dumps({"prompt": prompt}) + "\n")
  out = os.path.join(tmpdir, "bulk_out.jsonl")
  seeds = [rnnstep.record_seed(settings.seed, i) for i in range(records)]
  batch = paths.bulk_batch_size(model)
  batches = -(-records // batch)
  job_path = paths.one_shot_path(model, min(batch, records), steps * batches)
  argv = ["rnnstep-generate", f"--weights={model_path}", f"--input={source}",
          f"--output={out}", f"--num_steps={steps}",
          f"--seed={settings.seed}", "--overwrite"]

  def job():
    try:
      generate_cli.run(argv)
    except SystemExit as e:
      if e.code:
        raise RuntimeError(f"the job failed with status {e.code}") from None

  def library_one_call():
    rnnstep.generate(model, prompts, steps, seed=seeds, return_scores=True)

  def library_batches():
    for begin in range(0, records, batch):
      rnnstep.generate(model, prompts[begin:begin + batch], steps,
                       seed=seeds[begin:begin + batch], return_scores=True,
                       jit_compile=paths.jit_compile_of(job_path))

  pairs = list(zip(_texts(weights, settings.bulk_pairs, 4, 40,
                          settings.seed + 1),
                   _texts(weights, settings.bulk_pairs, 1, 40,
                          settings.seed + 2)))
  loop_pairs = pairs[:settings.bulk_loop_pairs]

  def loglikelihood():
    rnnstep.loglikelihood(model, pairs)

  def logits_loop():
    for context, continuation in loop_pairs:
      ids = model.encode(context + continuation)
      logits = rnnstep.logits(model, ids[:-1])[0].astype(np.float64)
      peak = logits.max(-1, keepdims=True)
      logprobs = logits - peak - np.log(np.exp(logits - peak).sum(
          -1, keepdims=True))
      scored = np.arange(len(context) - 1, len(ids) - 1)
      float(logprobs[scored, ids[scored + 1]].sum())

  jobs = [("job", job, ()), ("library, one call", library_one_call, ()),
          ("library, job's batches", library_batches, ()),
          ("loglikelihood", loglikelihood, ()),
          ("logits loop", logits_loop, ())]
  samples, _ = timing.run_rounds(jobs, settings.rounds, "bulk")
  seconds = {key: statistics.median(values) for key, values in samples.items()}
  # Ratios per round, then their median.
  ratio = lambda a, b, scale=1.0: statistics.median(
      scale * y / x for x, y in zip(samples[a], samples[b]))
  chars = records * steps  # No stop strings: every row runs every step.
  print(f"## bulk jobs: {records:,} prompts x {steps} characters (job: "
        f"batches of {batch}, {job_path} path; the one call: "
        f"{paths.default_path(model, records)} path), medians of "
        f"{settings.rounds} rounds")
  print(f"{'variant':<26} {'seconds':>9} {'chars/s':>10} {'job / it':>9}")
  for key in ("job", "library, one call", "library, job's batches"):
    per_second = chars / seconds[key]
    versus = "" if key == "job" else f"{ratio('job', key):>9.2f}"
    print(f"{key:<26} {seconds[key]:>9.2f} {per_second:>10,.0f} {versus}")
  loop_scale = len(pairs) / len(loop_pairs)
  print(f"\n## scoring: {len(pairs):,} pairs (contexts 4-40, continuations "
        f"1-40 characters; the loop timed over {len(loop_pairs)} pairs and "
        "scaled)")
  print(f"{'variant':<26} {'seconds':>9} {'pairs/s':>10} {'speed-up':>9}")
  print(f"{'loglikelihood':<26} {seconds['loglikelihood']:>9.2f} "
        f"{len(pairs) / seconds['loglikelihood']:>10,.0f} "
        f"{ratio('loglikelihood', 'logits loop', loop_scale):>9.1f}")
  print(f"{'logits loop (scaled)':<26} "
        f"{seconds['logits loop'] * loop_scale:>9.2f} "
        f"{len(loop_pairs) / seconds['logits loop']:>10,.0f}")
  print()
  results_out.append({
      "section": "bulk", "records": records, "chars": steps,
      "batch_size": batch, "job_path": job_path,
      "seconds": {key: list(values) for key, values in samples.items()},
      "job_vs_library_one_call": ratio("job", "library, one call"),
      "job_vs_library_batches": ratio("job", "library, job's batches"),
      "pairs": len(pairs), "loop_pairs": len(loop_pairs),
      "loglikelihood_speedup": ratio("loglikelihood", "logits loop",
                                     loop_scale)})
