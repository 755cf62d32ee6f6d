"""Section `window`: window generation against stateful, and the recipe's loop.

The keras.io char-LSTM recipe's model at its own size (`Input((40, V))`,
LSTM 128, Dense(V, softmax); V from the held-out excerpt prepared as the recipe
does: lower case, newlines as spaces), random weights, saved by Keras 3 and
loaded by rnnstep (which records `window: 40`). Timed side by side
(interleaved rounds, medians), for each of `--window_batch_sizes`:

  window     rnnstep.generate with the model's window (the default), on the
             default path: B*40 window slots, one cell step each a character;
  stateful   the same call with window=0;
  predict    the recipe's own loop: model.predict(one-hot of the last 40
             characters of each row) per character, then the draw; it runs
             `--window_predict_steps` characters and is scaled to
             `--window_chars` (marked *).
"""

import json
import os
import statistics

import numpy as np

from bench import timing

WINDOW, UNITS = 40, 128
_EXCERPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "data",
                        "tinyshakespeare_heldout_excerpt.txt")


def _recipe_text():
  with open(_EXCERPT, encoding="utf-8") as f:
    return f.read().lower().replace("\n", " ")


def build(tmpdir, seed):
  """Saves the recipe's model; returns (keras model, rnnstep model, chars)."""
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import keras  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  chars = sorted(set(_recipe_text()))
  size = len(chars)
  model = keras.Sequential([
      keras.Input(shape=(WINDOW, size)), keras.layers.LSTM(UNITS),
      keras.layers.Dense(size, activation="softmax")])
  rng = np.random.default_rng(seed)
  model.set_weights([rng.uniform(-0.3, 0.3, w.shape).astype(np.float32)
                     for w in model.get_weights()])
  path = os.path.join(tmpdir, "recipe.keras")
  model.save(path)
  vocab = os.path.join(tmpdir, "recipe_vocab.json")
  with open(vocab, "w", encoding="utf-8") as f:
    json.dump(chars, f)
  return model, rnnstep.load(path, vocab=vocab), chars


class RecipeLoop:
  """The recipe's sampling loop: predict on the last 40 chars, then sample."""

  def __init__(self, keras_model, chars, steps, temperature):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf, self.model, self.size = tf, keras_model, len(chars)
    self.index = {c: i for i, c in enumerate(chars)}
    self.steps, self.temperature = steps, temperature

  def __call__(self, prompts, seed):
    rng = np.random.default_rng(seed)
    rows = [[self.index[c] for c in p] for p in prompts]
    for _ in range(self.steps):
      x = np.zeros([len(rows), WINDOW, self.size], np.float32)
      for r, ids in enumerate(rows):
        x[r, np.arange(WINDOW), ids[-WINDOW:]] = 1.0
      preds = self.model.predict(x, verbose=0).astype(np.float64)
      # The recipe's `sample`: log, divide by the temperature, renormalize.
      logits = np.log(preds) / self.temperature
      probs = np.exp(logits - logits.max(-1, keepdims=True))
      probs /= probs.sum(-1, keepdims=True)
      for r in range(len(rows)):
        rows[r].append(int(rng.choice(self.size, p=probs[r])))


class Generate:
  def __init__(self, model, num_chars, temperature, **options):
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.generate, self.model = rnnstep.generate, model
    self.num_chars, self.options = num_chars, dict(options,
                                                   temperature=temperature)

  def __call__(self, prompts, seed):
    return self.generate(self.model, list(prompts), self.num_chars, seed=seed,
                         **self.options)


def run(ctx, results_out):
  """Times window, stateful and the recipe's loop at each batch size."""
  settings = ctx.settings
  keras_model, model, chars = build(ctx.tmpdir, settings.seed)
  text = _recipe_text()
  chars_per_row = settings.window_chars
  predict_steps = min(settings.window_predict_steps, chars_per_row)
  jobs = []
  for batch in settings.window_batch_sizes:
    starts = np.random.default_rng(settings.seed).integers(
        0, len(text) - WINDOW, batch)
    prompts = [text[s:s + WINDOW] for s in starts]  # The recipe's seeds.
    args = (prompts, settings.seed)
    jobs += [((batch, "window"), Generate(model, chars_per_row,
                                          settings.temperature), args),
             ((batch, "stateful"), Generate(model, chars_per_row,
                                            settings.temperature, window=0),
              args),
             ((batch, "predict"), RecipeLoop(keras_model, chars, predict_steps,
                                             settings.temperature), args)]
  samples, _ = timing.run_rounds(jobs, settings.rounds, "window")
  print(f"## window generation: the keras.io recipe's LSTM {UNITS} (window "
        f"{WINDOW}, V={len(chars)}), ms for {chars_per_row} chars per row "
        f"(median of {settings.rounds}; * predict runs {predict_steps} chars, "
        "scaled)")
  print(f"{'batch':>5} {'window':>10} {'stateful':>10} {'predict*':>10} "
        f"{'window/stateful':>16} {'predict/window':>15}")
  for batch in settings.window_batch_sizes:
    ms = {kind: statistics.median(samples[(batch, kind)]) * 1e3
          for kind in ("window", "stateful", "predict")}
    ms["predict"] *= chars_per_row / predict_steps
    print(f"{batch:>5} {timing.fmt_ms(ms['window'] / 1e3):>10} "
          f"{timing.fmt_ms(ms['stateful'] / 1e3):>10} "
          f"{timing.fmt_ms(ms['predict'] / 1e3):>10} "
          f"{ms['window'] / ms['stateful']:>16.2f} "
          f"{ms['predict'] / ms['window']:>15.1f}")
    results_out.append({"section": "window", "batch": batch, "ms": ms,
                        "chars": chars_per_row,
                        "predict_steps": predict_steps})
  print()
