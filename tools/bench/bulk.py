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
    --bulk_loop_pairs pairs and scaled per pair. Pairs a second. Beside it,
    the same number of pairs as lm-evaluation-harness's multiple-choice
    tasks give them (each context with 4 continuations; same length ranges,
    so the loop's time a pair is the same), and the roofline: the recurrent
    matmuls of the pairs' real row-steps alone (`h = tanh(h @ R)` in a TF
    while loop at `scoring.MAX_BATCH` rows), the least any batched scoring
    can take.

--bulk_parts picks the comparisons (job, scoring).
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
  job_path = paths.bulk_job_path(model, records, batch, steps)
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
  choice_contexts = _texts(weights, -(-settings.bulk_pairs // 4), 4, 40,
                           settings.seed + 3)
  choice_pairs = [(choice_contexts[i // 4], continuation) for i, continuation
                  in enumerate(_texts(weights, settings.bulk_pairs, 1, 40,
                                      settings.seed + 4))]

  def loglikelihood():
    rnnstep.loglikelihood(model, pairs)

  def loglikelihood_choices():
    rnnstep.loglikelihood(model, choice_pairs)

  roofline, row_steps, flops = _roofline(model, pairs)

  def logits_loop():
    for context, continuation in loop_pairs:
      ids = model.encode(context + continuation)
      logits = rnnstep.logits(model, ids[:-1])[0].astype(np.float64)
      peak = logits.max(-1, keepdims=True)
      logprobs = logits - peak - np.log(np.exp(logits - peak).sum(
          -1, keepdims=True))
      scored = np.arange(len(context) - 1, len(ids) - 1)
      float(logprobs[scored, ids[scored + 1]].sum())

  jobs = []
  if "job" in settings.bulk_parts:
    jobs += [("job", job, ()), ("library, one call", library_one_call, ()),
             ("library, job's batches", library_batches, ())]
  if "scoring" in settings.bulk_parts:
    jobs += [("loglikelihood", loglikelihood, ()),
             ("shared contexts", loglikelihood_choices, ()),
             ("recurrent matmuls alone", roofline, ()),
             ("logits loop", logits_loop, ())]
  samples, _ = timing.run_rounds(jobs, settings.rounds, "bulk")
  seconds = {key: statistics.median(values) for key, values in samples.items()}
  # Ratios per round, then their median.
  ratio = lambda a, b, scale=1.0: statistics.median(
      scale * y / x for x, y in zip(samples[a], samples[b]))
  result = {"section": "bulk", "parts": settings.bulk_parts,
            "seconds": {key: list(values) for key, values in samples.items()},
            "load": os.getloadavg()}
  if "job" in settings.bulk_parts:
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
    print()
    result.update({
        "records": records, "chars": steps, "batch_size": batch,
        "job_path": job_path,
        "job_vs_library_one_call": ratio("job", "library, one call"),
        "job_vs_library_batches": ratio("job", "library, job's batches")})
  if "scoring" in settings.bulk_parts:
    loop_scale = len(pairs) / len(loop_pairs)
    print(f"## scoring: {len(pairs):,} pairs (contexts 4-40, continuations "
          f"1-40 characters; {row_steps:,} real row-steps; the loop timed "
          f"over {len(loop_pairs)} pairs and scaled), medians of "
          f"{settings.rounds} rounds")
    print(f"{'variant':<26} {'seconds':>9} {'pairs/s':>10} {'speed-up':>9}")
    for key in ("loglikelihood", "shared contexts",
                "recurrent matmuls alone"):
      print(f"{key:<26} {seconds[key]:>9.2f} "
            f"{len(pairs) / seconds[key]:>10,.0f} "
            f"{ratio(key, 'logits loop', loop_scale):>9.1f}")
    print(f"{'logits loop (scaled)':<26} "
          f"{seconds['logits loop'] * loop_scale:>9.2f} "
          f"{len(loop_pairs) / seconds['logits loop']:>10,.0f}")
    print(f"(the recurrent matmuls alone: "
          f"{flops / seconds['recurrent matmuls alone'] / 1e9:.1f} GFLOP/s; "
          f"{len(choice_contexts):,} shared contexts)")
    print()
    result.update({
        "pairs": len(pairs), "loop_pairs": len(loop_pairs),
        "row_steps": row_steps,
        "loglikelihood_speedup": ratio("loglikelihood", "logits loop",
                                       loop_scale),
        "shared_contexts_speedup": ratio("shared contexts", "logits loop",
                                         loop_scale),
        "roofline_speedup": ratio("recurrent matmuls alone", "logits loop",
                                  loop_scale)})
  results_out.append(result)


def _roofline(model, pairs):
  """The pairs' recurrent matmuls alone, at `scoring.MAX_BATCH` rows.

  Returns:
    `(run, row_steps, flops)`: a function that runs, for each recurrent
    layer, `h = tanh(h @ R)[:, :U]` over as many row-steps as the pairs have
    real ones (a TF while loop, as scoring's); those row-steps; their FLOPs.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rnnstep import api  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import scoring  # pylint: disable=g-import-not-at-top
  row_steps = sum(len(row.ids) - 1 for row in api.check_pairs(model, pairs))
  kernels = [tf.convert_to_tensor(layer["recurrent_kernel"])
             for layer in model.network_weights()["layers"]]
  batch = scoring.MAX_BATCH
  width = 40  # Steps a call: the pairs' mean length.
  calls = -(-row_steps // (batch * width))

  @tf.function(autograph=False)
  def steps(start):
    for kernel in kernels:
      h = start
      units = kernel.shape[0]
      h = tf.while_loop(
          lambda t, _: t < width,
          lambda t, h, k=kernel, u=units: (t + 1,
                                           tf.tanh(tf.matmul(h, k)[:, :u])),
          (0, start[:, :units]))[1]
    return h

  start = tf.random.normal([batch, max(k.shape[0] for k in kernels)])

  def run():
    for _ in range(calls):
      steps(start).numpy()

  flops = sum(2 * k.shape[0] * k.shape[1] for k in kernels) * (
      calls * batch * width)
  return run, row_steps, flops
