"""Section `decoding`: beam search, look-back rules, regex and scores against
sampling.

Four comparisons, each timed side by side in one process (interleaved rounds,
medians) on `--decoding_path` (XLA by default), tutorial-size model:

  - beam search with 8 beams from 1 prompt vs sampling 8 rows;
  - sampling at batch 1 with a repetition penalty (window 32) and a 4-gram
    ban vs plain sampling at batch 1;
  - sampling at batch 1 and 64 inside a regular expression (`REGEX`, which
    never ends a row early, so both sides run every step) vs plain sampling:
    the constraint's per-step mask and DFA gather, and the general tail it
    takes instead of the plain one;
  - plain sampling with return_scores vs without, and plain sampling vs the
    matmul floor (what a row with default settings pays for the machinery).
"""

import statistics

from bench import runners
from bench import settings as cfg
from bench import timing
from bench import weights as weights_lib


class _Generate:
  """rnnstep.generate with fixed decoding options."""

  def __init__(self, model, num_chars, jit_compile, **options):
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.generate = rnnstep.generate
    self.model, self.num_chars = model, num_chars
    self.jit_compile, self.options = jit_compile, options

  def __call__(self, prompt_texts, seed):
    return self.generate(self.model, list(prompt_texts), self.num_chars,
                         seed=seed, jit_compile=self.jit_compile,
                         **self.options)


# Every character of the tutorial corpus but '-', '&', '$' and '3':
# an accepting state that always continues.
REGEX = r"[A-Za-z ,.;:!?'\n]+"

# (name, batch, options); ratios below pair them up.
CASES = (
    ("sample_8", 8, {}),
    ("beam_8", 1, dict(num_beams=8)),
    ("sample_1", 1, {}),
    ("penalty_ngram_1", 1, dict(repetition_penalty=1.3, repetition_window=32,
                                no_repeat_ngram_size=4)),
    ("scores_1", 1, dict(return_scores=True)),
    ("regex_1", 1, dict(regex=REGEX)),
    ("sample_64", 64, {}),
    ("regex_64", 64, dict(regex=REGEX)),
)
RATIOS = (("beam_8", "sample_8", 1.5), ("penalty_ngram_1", "sample_1", 1.15),
          ("regex_1", "sample_1", 1.15), ("regex_64", "sample_64", 1.15),
          ("scores_1", "sample_1", None), ("sample_1", "floor_1", None))


def run(ctx, results_out):
  """Times CASES and the floor at batch 1; prints the ratios and targets."""
  settings, weights = ctx.settings, ctx.weights
  jit = cfg.PATHS[settings.decoding_path]
  model = weights.rnnstep_model("float32")
  chars = settings.decoding_chars
  jobs = []
  for name, batch, options in CASES:
    _, prompts = weights_lib.make_prompts(weights, batch, settings.prompt_len,
                                          settings.seed)
    jobs.append((name, _Generate(model, chars, jit,
                                 temperature=settings.temperature, **options),
                 (prompts, settings.seed)))
  floors = {}
  for floor_jit in (True, False):
    floor_settings = type("S", (), {"num_chars": chars})()
    floors[floor_jit] = runners.Floor(weights, floor_settings, floor_jit)
    jobs.append((f"floor_{'xla' if floor_jit else 'graph'}", floors[floor_jit],
                 (1, settings.seed)))
  samples, _ = timing.run_rounds(jobs, settings.rounds, "decoding")
  ms = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
  ms["floor_1"] = min(ms["floor_xla"], ms["floor_graph"])
  print(f"## decoding: ms for {chars} chars (median of {settings.rounds}), "
        f"path {settings.decoding_path}")
  for name, _, options in CASES:
    print(f"{name:<16} {ms[name]:>9.1f}   {options or ''}")
  print(f"{'floor_1':<16} {ms['floor_1']:>9.1f}   (min of XLA "
        f"{ms['floor_xla']:.1f} and graph {ms['floor_graph']:.1f})")
  for a, b, target in RATIOS:
    verdict = "" if target is None else (
        f"  (target <= {target}: {'met' if ms[a] / ms[b] <= target else 'NOT met'})")
    print(f"{a} / {b}: {ms[a] / ms[b]:.2f}{verdict}")
    results_out.append({"section": "decoding", "ratio": f"{a}/{b}",
                        "value": ms[a] / ms[b], "target": target})
  results_out.append({"section": "decoding", "ms": ms,
                      "path": settings.decoding_path, "chars": chars})
  print()
