"""Section `words`: pytorch/examples word_language_model at a word vocabulary.

The recipe's own model (`RNNModel`, from tools/make_word_lm_fixtures.py:
Embedding -> 2-layer LSTM -> Linear, the recipe's initialization, random
weights) at its default size (emsize 200, nhid 200) and at each of
--words_units, with wikitext-2's vocabulary size (--words_vocab_size 33,278;
ids only, the words are "w1", "w2", ...). rnnstep reads the recipe's
`torch.save(model)` file as users do (`rnnstep.load(path, vocab=...)`).
Timed side by side (interleaved rounds, medians), at each of
--words_batch_sizes, each row --words_steps words after a --prompt_len-word
prompt (P - 1 priming steps everywhere):

  rnnstep          rnnstep.generate with jit_compile=None (the default path);
  rnnstep_<path>   each explicit path (xla, graph, elementwise);
  recipe           generate.py's own loop: `output, hidden = model(input,
                   hidden)`, `output.squeeze().div(temperature).exp()`,
                   `torch.multinomial(word_weights, 1)`, `input.fill_`, the
                   word looked up; at batch B > 1 the same lines over B rows
                   (generate.py itself runs one). It runs
                   --words_recipe_steps words, scaled (marked *);
  torchscript      a `torch.jit.script` loop of the same model: embedding,
                   both LSTM cell steps, the projection, softmax and
                   `torch.multinomial`, all in TorchScript;
  floor            the faster of two TensorFlow while_loops (XLA, graph) doing
                   only the step's matmuls: h0@R0, h0@W1, h1@R1 and the
                   [U, V] projection (each gate block summed into the next h,
                   so that every column is used), with the projection's argmax
                   id fed back as a sampled word is: its row of a [V, 4U]
                   input table (rnnstep's folded embedding) enters the next
                   step. Without that feedback nothing waits for the
                   projection, and TF's executor overlapped it with later
                   steps' recurrence (a while_loop runs up to 10 iterations
                   at once), which no generation loop can do.

Torch runs as many threads as TensorFlow's intra-op pool (--torch_threads).
Ratios are paired: each is the median over rounds of that round's ratio. The
issue's targets (#34): at batch 1 rnnstep within 1.3x of the floor and at
least 2x the recipe's words per second; at batch 64 at least 20x the recipe
loop's words per second (its batch-1 figure: the recipe generates one text).
"""

import json
import os
import statistics
import sys

import numpy as np

from bench import settings as cfg
from bench import timing

EMSIZE = 200
LAYERS = 2
TORCH_VARIANTS = ("recipe", "torchscript")
FLOORS = {"floor_xla": True, "floor_graph": False}
TARGETS = {"floor_at_1": 1.3, "recipe_at_1": 2.0, "recipe_at_64": 20.0}


def words_of(vocab_size):
  """The vocabulary: `<eos>` (the recipe's newline) and numbered words."""
  return ["<eos>"] + [f"w{i}" for i in range(1, vocab_size)]


def build(torch, settings, units, tmpdir):
  """The recipe's model and rnnstep's reading of it; (net or None, model)."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  vocab_path = os.path.join(tmpdir, f"words_{settings.words_vocab_size}.json")
  with open(vocab_path, "w", encoding="utf-8") as f:
    json.dump(words_of(settings.words_vocab_size), f)
  if torch is None:
    return None, rnnstep.load(_model_file(settings, units, tmpdir))
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import make_word_lm_fixtures as recipe  # pylint: disable=g-import-not-at-top
  torch.manual_seed(settings.seed)
  net = recipe.RNNModel("LSTM", settings.words_vocab_size,
                        settings.words_embedding, units, LAYERS, dropout=0.2)
  net.eval()
  path = os.path.join(tmpdir, f"word_lm_{units}.pt")
  with open(path, "wb") as f:
    torch.save(net, f)
  return net, rnnstep.load(path, vocab=vocab_path)


def _model_file(settings, units, tmpdir):
  """Without torch: an rnnstep file of the same shapes (random weights)."""
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  from rnnstep.model import vocabulary  # pylint: disable=g-import-not-at-top
  config = model_file.ModelConfig(settings.words_embedding, (
      model_file.LayerConfig("lstm", units),) * LAYERS)
  rng = np.random.default_rng(settings.seed)
  tensors = {k: rng.uniform(-0.1, 0.1, s).astype(np.float32)
             for k, s in config.expected_shapes(
                 settings.words_vocab_size).items()}
  words = words_of(settings.words_vocab_size)
  path = os.path.join(tmpdir, f"word_lm_{units}.npz")
  model_file.write(path, config, words, tensors,
                   vocabulary.Tokens("words", words, {"newline": "<eos>"}))
  return path


class Rnnstep:
  """rnnstep.generate on one path (None: the default) from word prompts."""

  def __init__(self, model, steps, temperature, jit_compile):
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.generate, self.model = rnnstep.generate, model
    self.steps, self.temperature = steps, temperature
    self.jit_compile = jit_compile

  def __call__(self, prompt_ids, seed):
    words = self.model.vocab
    prompts = [" ".join(words[i] for i in row) for row in prompt_ids]
    return self.generate(self.model, prompts, self.steps, seed=seed,
                         temperature=self.temperature,
                         jit_compile=self.jit_compile)


class RecipeLoop:
  """generate.py's loop (its lines, over B rows), after priming the prompt."""

  def __init__(self, torch, net, steps, temperature):
    self.torch, self.net = torch, net
    self.steps, self.temperature = steps, temperature
    self.idx2word = words_of(net.ntoken)

  def __call__(self, prompt_ids, seed):
    torch, model = self.torch, self.net
    torch.manual_seed(seed)
    batch = prompt_ids.shape[0]
    texts = [[] for _ in range(batch)]
    with torch.no_grad():  # no tracking history
      hidden = model.init_hidden(batch)
      prompt = torch.from_numpy(prompt_ids.T.astype(np.int64))
      _, hidden = model(prompt[:-1], hidden)
      input = prompt[-1:].clone()  # pylint: disable=redefined-builtin
      for _ in range(self.steps):
        output, hidden = model(input, hidden)
        word_weights = output.squeeze().div(self.temperature).exp().cpu()
        if batch == 1:  # generate.py's own lines.
          word_idx = torch.multinomial(word_weights, 1)[0]
          input.fill_(word_idx)
          texts[0].append(self.idx2word[word_idx])
        else:
          word_idx = torch.multinomial(word_weights, 1)
          input.copy_(word_idx.view(1, batch))
          for row, idx in enumerate(word_idx[:, 0].tolist()):
            texts[row].append(self.idx2word[idx])
    return [" ".join(t) for t in texts]


_TORCHSCRIPT_SOURCE = '''
import torch
from typing import List

@torch.jit.script
def lstm_loop(encoder, w_ih: List[torch.Tensor], w_hh: List[torch.Tensor],
              bias: List[torch.Tensor], decoder_w, decoder_b,
              h: List[torch.Tensor], c: List[torch.Tensor], ids,
              num_steps: int, temperature: float):
    out = torch.empty(num_steps, ids.shape[0], dtype=torch.long)
    for t in range(num_steps):
        x = encoder.index_select(0, ids)
        for layer in range(len(h)):
            gates = torch.addmm(bias[layer], x, w_ih[layer]) + torch.mm(
                h[layer], w_hh[layer])
            i, f, g, o = gates.chunk(4, 1)
            c[layer] = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
            h[layer] = torch.sigmoid(o) * torch.tanh(c[layer])
            x = h[layer]
        logits = torch.addmm(decoder_b, x, decoder_w)
        probs = torch.softmax(logits / temperature, -1)
        ids = torch.multinomial(probs, 1).squeeze(1)
        out[t] = ids
    return out.t()
'''


class TorchScriptLoop:
  """The same model's step fused into one TorchScript loop."""

  def __init__(self, torch, net, steps, temperature, tmpdir):
    import importlib.util  # pylint: disable=g-import-not-at-top
    self.torch, self.net = torch, net
    self.steps, self.temperature = steps, temperature
    path = os.path.join(tmpdir, "word_lm_torchscript_loop.py")
    with open(path, "w") as f:  # TorchScript needs its source in a file.
      f.write(_TORCHSCRIPT_SOURCE)
    spec = importlib.util.spec_from_file_location("word_lm_torchscript_loop",
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    self.loop = module.lstm_loop
    rnn = net.rnn
    with torch.no_grad():
      self.w_ih = [getattr(rnn, f"weight_ih_l{k}").t().contiguous()
                   for k in range(LAYERS)]
      self.w_hh = [getattr(rnn, f"weight_hh_l{k}").t().contiguous()
                   for k in range(LAYERS)]
      self.bias = [getattr(rnn, f"bias_ih_l{k}") + getattr(rnn, f"bias_hh_l{k}")
                   for k in range(LAYERS)]
      self.decoder_w = net.decoder.weight.t().contiguous()
      self.decoder_b = net.decoder.bias.detach().clone()
      self.encoder = net.encoder.weight.detach().clone()

  def __call__(self, prompt_ids, seed):
    torch = self.torch
    torch.manual_seed(seed)
    with torch.inference_mode():
      prompt = torch.from_numpy(prompt_ids.T.astype(np.int64))
      _, (h, c) = self.net(prompt[:-1], self.net.init_hidden(prompt.shape[1]))
      out = self.loop(self.encoder, self.w_ih, self.w_hh, self.bias,
                      self.decoder_w, self.decoder_b, list(h.unbind(0)),
                      list(c.unbind(0)), prompt[-1], self.steps,
                      float(self.temperature))
      return out.numpy()


class Floor:
  """Only the step's matmuls, in a while_loop (XLA or graph), step after step.

  Each step's argmax id picks the next step's input-table row, so the
  projection is on the path from one step to the next, as in generation.
  The priming steps (P - 1, as everywhere) read id 0's row.
  """

  def __init__(self, settings, units, steps, jit_compile):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf, self.units = tf, units
    rng = np.random.default_rng(settings.seed)

    def weight(*shape):
      return tf.constant(rng.uniform(-0.1, 0.1, shape).astype(np.float32))

    recurrent0, kernel1, recurrent1 = (weight(units, 4 * units)
                                       for _ in range(3))
    projection = weight(units, settings.words_vocab_size)
    input_table = weight(settings.words_vocab_size, 4 * units)
    self.steps = np.int32(steps)
    self.priming = np.int32(settings.prompt_len - 1)

    def gates_to_h(z):  # Every gate column read: no matmul can be sliced.
      return tf.tanh(tf.reduce_sum(tf.reshape(z, [-1, 4, units]), 1))

    def recur(h0, h1, ids):
      h0 = gates_to_h(tf.gather(input_table, ids) + tf.matmul(h0, recurrent0))
      return h0, gates_to_h(tf.matmul(h0, kernel1) + tf.matmul(h1, recurrent1))

    def loop(h0, h1, priming, num_steps):
      ids = tf.zeros([tf.shape(h0)[0]], tf.int32)
      _, h0, h1 = tf.while_loop(lambda t, *_: t < priming,
                                lambda t, a, b: (t + 1, *recur(a, b, ids)),
                                (tf.constant(0), h0, h1))

      def body(t, h0, h1, ids):
        ids = tf.argmax(tf.matmul(h1, projection), -1, output_type=tf.int32)
        return (t + 1, *recur(h0, h1, ids), ids)
      return tf.while_loop(lambda t, *_: t < num_steps, body,
                           (tf.constant(0), h0, h1,
                            tf.zeros([tf.shape(h0)[0]], tf.int32)))[-1]

    spec = tf.TensorSpec([None, units], tf.float32)
    self.fn = tf.function(loop, jit_compile=jit_compile, input_signature=[
        spec, spec, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])

  def __call__(self, prompt_ids, seed):
    h = np.random.default_rng(seed).normal(
        0, 0.5, (2, prompt_ids.shape[0], self.units)).astype(np.float32)
    return self.fn(h[0], h[1], self.priming, self.steps).numpy()


def _paired(rounds, a, b, steps):
  """Median over rounds of (a's time per step) / (b's time per step)."""
  return statistics.median(
      (ta / steps[a]) / (tb / steps[b]) for ta, tb in zip(rounds[a], rounds[b]))


def run(ctx, results_out):
  """Times rnnstep, the recipe's loops and the floor for every size and batch."""
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  settings, torch = ctx.settings, ctx.torch
  steps = {name: settings.words_steps for name in (
      "rnnstep", *(f"rnnstep_{p}" for p in cfg.PATHS), "torchscript",
      *FLOORS)}
  steps["recipe"] = min(settings.words_recipe_steps, settings.words_steps)
  if torch is None:
    print("(words: skipped, torch not importable: "
          f"{', '.join(TORCH_VARIANTS)})")
  for units in settings.words_units:
    net, model = build(torch, settings, units, ctx.tmpdir)
    jobs, took = [], {}
    for batch in settings.words_batch_sizes:
      rng = np.random.default_rng(settings.seed + batch)
      prompt_ids = rng.integers(1, settings.words_vocab_size,
                                (batch, settings.prompt_len))
      args = (prompt_ids, settings.seed)
      took[batch] = paths.default_path(model, batch)
      variants = {"rnnstep": Rnnstep(model, steps["rnnstep"],
                                     settings.temperature, None)}
      for path, jit in cfg.PATHS.items():
        variants[f"rnnstep_{path}"] = Rnnstep(model, steps["rnnstep"],
                                              settings.temperature, jit)
      if net is not None:
        variants["recipe"] = RecipeLoop(torch, net, steps["recipe"],
                                        settings.temperature)
        variants["torchscript"] = TorchScriptLoop(
            torch, net, steps["torchscript"], settings.temperature, ctx.tmpdir)
      for name, jit in FLOORS.items():
        variants[name] = Floor(settings, units, steps[name], jit)
      jobs += [((batch, name), fn, args) for name, fn in variants.items()]
    samples, _ = timing.run_rounds(jobs, settings.rounds, f"words {units}")
    _report(settings, units, took, samples, steps, results_out)


def _report(settings, units, took, samples, steps, results_out):
  """Prints one size's table and the targets; appends its results."""
  vocab, rounds = settings.words_vocab_size, settings.rounds
  print(f"## words: word_language_model LSTM, emsize {settings.words_embedding}"
        f", nhid {units}, {LAYERS} layers, V={vocab:,}: ms per step (median of "
        f"{rounds}), words/s over all rows; x floor and recipe/x paired by "
        f"round (* recipe runs {steps['recipe']} of {settings.words_steps} "
        "words, per step)")
  header = (f"{'variant':<20} {'batch':>5} {'ms/step':>9} {'words/s':>10} "
            f"{'x floor':>8} {'recipe/x':>8}")
  print(header)
  print("-" * len(header))
  notes = []  # Printed under the table.
  recipe_1 = None
  if ("recipe" in steps and (1, "recipe") in samples):
    recipe_1 = statistics.median(samples[(1, "recipe")]) / steps["recipe"]
  for batch in settings.words_batch_sizes:
    names = [name for b, name in samples if b == batch]
    rounds_of = {name: samples[(batch, name)] for name in names}
    floor_rounds = [min(x, g) for x, g in zip(rounds_of["floor_xla"],
                                               rounds_of["floor_graph"])]
    rounds_of["floor"] = floor_rounds
    per_step = {name: statistics.median(rounds_of[name]) / steps[name]
                for name in names}
    per_step["floor"] = statistics.median(floor_rounds) / steps["floor_xla"]
    every = {**steps, "floor": steps["floor_xla"]}
    best = min((n for n in names if n.startswith("rnnstep_")),
               key=per_step.get)
    ratios = {"best_path": best, "default_path": took[batch]}
    ratios["rnnstep/floor"] = _paired(rounds_of, "rnnstep", "floor", every)
    ratios["best/floor"] = _paired(rounds_of, best, "floor", every)
    if "recipe" in names:
      ratios["recipe/rnnstep"] = _paired(rounds_of, "recipe", "rnnstep", every)
      ratios["recipe/torchscript"] = _paired(rounds_of, "recipe",
                                             "torchscript", every)
    for name in [*names, "floor"]:
      x_floor = _paired(rounds_of, name, "floor", every)
      x_recipe = ("-" if "recipe" not in names else
                  f"{_paired(rounds_of, 'recipe', name, every):.2f}")
      star = "*" if name == "recipe" else ""
      print(f"{name:<20} {batch:>5} {per_step[name] * 1e3:>8.3f}{star or ' '}"
            f"{batch / per_step[name]:>11,.0f} {x_floor:>8.2f} {x_recipe:>8}")
    results_out.append({
        "section": "words", "units": units, "batch": batch,
        "vocab_size": vocab, "embedding_dim": settings.words_embedding,
        "steps": steps, "ms_per_step": {n: v * 1e3 for n, v in per_step.items()},
        "words_per_second": {n: batch / v for n, v in per_step.items()},
        "round_seconds": {n: rounds_of[n] for n in names}, **ratios})
    notes.append(f"default path at batch {batch}: {took[batch]}; fastest: "
                 f"{best[len('rnnstep_'):]}")
    if batch == 1:
      r = ratios["rnnstep/floor"]
      met = "met" if r <= TARGETS["floor_at_1"] else "NOT met"
      notes.append(f"rnnstep / floor at batch 1: {r:.2f} (target <= "
                   f"{TARGETS['floor_at_1']}: {met})")
    if recipe_1 is not None:
      speedup = batch / per_step["rnnstep"] * recipe_1
      target = {1: TARGETS["recipe_at_1"], 64: TARGETS["recipe_at_64"]}.get(
          batch)
      verdict = "" if target is None else (
          f" (target >= {target}: {'met' if speedup >= target else 'NOT met'})")
      notes.append(f"rnnstep words/s at batch {batch} / recipe's at batch 1: "
                   f"{speedup:.1f}{verdict}")
      results_out[-1]["rnnstep_over_recipe_at_1"] = speedup
  print()
  for note in notes:
    print(note)
  print()
