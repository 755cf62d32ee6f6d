"""Speed benchmark: rnnstep against the tutorial loops, PyTorch and the matmul floor.

USAGE:
  python tools/benchmark.py                    # full run (several minutes)
  python tools/benchmark.py --quick            # smoke test: tiny model, ~1 min
  python tools/benchmark.py --batch_sizes=1 --rounds=9 --json_out=/tmp/b.json
  python tools/benchmark.py --sections=dtype --dtype=bfloat16,float16
  python tools/benchmark.py --variants=rnnstep_xla,floor,floor_graph
  python tools/benchmark.py --sections=floors --rounds=7   # paths vs the floor
  python tools/benchmark.py --sections=floors --tune       # tune first, then see

Everything timed runs in ONE process: every variant is compiled (warm-up)
first, then `--rounds` rounds each run every (variant, batch) once, interleaved
(the order rotates from round to round), and the table reports medians. Ratios
taken this way hold up on a busy machine far better than absolute numbers do.

Layout: this file is the entry (flags are parsed here, sections run in
order); each section is a module of tools/bench/ (speed.py, dtype.py,
paths.py, lanes.py, floors.py, latency.py, cli.py, window.py, words.py,
bulk.py) with `run(ctx, results)`; shared
parts are bench/settings.py (every flag), machine.py (the header),
weights.py, runners.py (rnnstep on a path, the matmul floor), keras_loops.py,
torch_loops.py and timing.py. The Keras models come from the tests' builders
(tests/support/keras_reference.py, tests/support/keras_models.py).

The model is the TensorFlow text-generation tutorial's size (vocab 65,
embedding 256, GRU 1024 with reset_after=True, Dense 65) with seeded random
weights (Keras' initializer families: uniform embedding, Glorot-uniform
kernels, orthogonal recurrent kernel, small random biases), or any model file
with `--weights`. The Keras and PyTorch variants get the same weights. The
random weights are those of a real Keras 3 model made by
tests/support/keras_reference.build (its initializers; random biases; the output
kernel scaled 4x for a realistic logit spread).

Variants (sections=speed), each generating `--num_chars` characters after a
`--prompt_len`-character prompt at `--temperature`, for each of `--batch_sizes`:

  eager_keras    the old tutorial loop: a Keras 3 model called eagerly from
                 Python once per character, then tf.random.categorical. Slow:
                 it runs `--eager_steps` steps and is scaled to --num_chars
                 (marked * in the table); batches `--eager_batch_sizes` only.
  onestep_keras  the tutorial's OneStep: one tf.function call per character
                 with the Keras model inside (ids in and out: the tutorial's
                 string lookups are left out, which only flatters it).
  rnnstep        rnnstep.generate(...) with its defaults: what users get (the
                 path `jit_compile=None` picks for the dtype and batch size).
  rnnstep_graph  rnnstep.generate(..., jit_compile=False).
  rnnstep_xla    rnnstep.generate(..., jit_compile=True).
  rnnstep_elementwise  rnnstep.generate(..., jit_compile="elementwise")
                 (not run unless asked for; see the paths section).
  floor          an XLA tf.while_loop doing only the two per-step matmuls,
                 h@R [U, 3U] and h@W_out [U, V], with h = tanh(first U columns
                 of h@R) so that steps stay sequential: what no GRU can beat.
  floor_graph    the same loop without XLA: TF's own (oneDNN) matmul kernels,
                 which beat XLA's at large batches, so this is the floor that
                 matters there ("x best" in the table: the faster floor).
  torch_gru      PyTorch nn.Embedding + nn.GRU + nn.Linear + multinomial, a
                 Python loop over steps under torch.inference_mode.
  torch_fused    PyTorch, TorchScript-scripted loop with a hand-fused GRU cell
                 over a precomputed [V, 3U] embedding x kernel table.
  (the torch variants are skipped when `import torch` fails.)

Other sections:
  dtype    rnnstep float32 vs each `--dtype` (bfloat16, float16) at
           `--dtype_batch` on each path of `--dtype_modes`, timed the same way,
           with the speed-up over the fastest float32 path; fidelity: the
           max |logit error| of rnnstep.logits against float32 over a
           --num_chars text, the teacher-forced argmax agreement, and greedy
           (temperature 0) agreement over --num_chars generated characters.
  paths    every execution path (xla, graph, elementwise) for float32 and each
           `--dtype` at each of `--path_batch_sizes`: the fastest, and the one
           `jit_compile=None` picks (the evidence for `paths.default_path`).
  lanes    every path as rnnstep-serve's lanes run it: `--lanes` concurrent
           calls (default: the usable cores), one thread each, in a child
           process with the server's thread pools, at each of `--lane_rows`
           rows a lane (the evidence for `paths.lane_path`).
  floors   for each --floor_cases dtype:batch (float32 at 1, 16, 32, 64, 256
           and bfloat16 at 256): the floor (min of the XLA and graph matmul
           loops), each explicit path, the fastest, the default
           (jit_compile=None, tuned or table) and the ratios default/fastest,
           fastest/floor, default/floor; --floor_chars sets fewer chars at
           large batches (1000 at 1, 500 at 16, 300 at 32-64, 200 at 256).
  decoding beam search (8 beams, 1 prompt) vs sampling 8 rows; repetition
           penalty (window 32) + 4-gram ban at batch 1 vs plain sampling;
           regex= sampling vs plain at batch 1 and 64; return_scores vs
           plain; plain sampling vs the floor, on
           --decoding_path (XLA), --decoding_chars chars.
  latency  time to first text in a FRESH subprocess (python start, import,
           load the model file, trace/compile, generate), graph and XLA.
  cli      `rnnstep-generate` end-to-end wall time for --num_chars chars
           (the bundled model when installed, else the benchmark's model file).
  window   the keras.io char-LSTM recipe's model (window 40, LSTM 128):
           window generation (its default) vs stateful (window=0) vs the
           recipe's own model.predict loop, at --window_batch_sizes
           (tools/bench/window.py).
  words    pytorch/examples word_language_model (2-layer LSTM, emsize 200,
           a 33,278-word vocabulary) at nhid --words_units (200, 1024) and
           --words_batch_sizes (1, 64): rnnstep (default and each path), the
           recipe's own generate.py loop, a TorchScript loop of the same
           model, and the matmul floor, in words per second, with the issue's
           targets (tools/bench/words.py).
  bulk     `rnnstep-generate --input` (the resumable jsonl job) over
           --bulk_records prompts of --bulk_chars characters against the
           library's batched generate over the same prompts and seeds (one
           call, and the job's batches), and rnnstep.loglikelihood over
           --bulk_pairs pairs against a per-pair rnnstep.logits loop
           (tools/bench/bulk.py).
"""

import collections
import json
import os
import sys
import tempfile
import time

from absl import app

# `python tools/benchmark.py` puts tools/ on sys.path (the bench package); the
# repository root goes last, for the tests' Keras builders, so an installed
# rnnstep keeps precedence over the checkout's as before.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.append(_ROOT)

# pylint: disable=g-import-not-at-top,g-bad-import-order
from bench import bulk
from bench import cli
from bench import decoding
from bench import dtype
from bench import floors
from bench import lanes
from bench import latency
from bench import machine
from bench import paths
from bench import settings as cfg
from bench import speed
from bench import torch_loops
from bench import weights as weights_lib
from bench import window
from bench import words
# pylint: enable=g-import-not-at-top,g-bad-import-order

SECTION_MODULES = {"speed": speed, "dtype": dtype, "paths": paths,
                   "lanes": lanes, "floors": floors, "decoding": decoding, "latency": latency,
                   "cli": cli, "window": window, "words": words, "bulk": bulk}
assert tuple(SECTION_MODULES) == cfg.SECTIONS

# What every section's `run(ctx, results)` gets.
Context = collections.namedtuple("Context", "settings weights tf torch tmpdir")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  settings = cfg.Settings()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if cfg.INTRA.value:
    tf.config.threading.set_intra_op_parallelism_threads(cfg.INTRA.value)
  if cfg.INTER.value:
    tf.config.threading.set_inter_op_parallelism_threads(cfg.INTER.value)
  # Once, before anything is compiled: tf.random.set_seed clears the eager
  # kernel cache (every tf.function re-instantiates at its next call).
  tf.random.set_seed(cfg.SEED.value)
  torch = None
  if ("words" in settings.sections or (
      "speed" in settings.sections
      and any(v in settings.variants for v in cfg.TORCH_VARIANTS))):
    torch = torch_loops.import_torch()
    if torch is not None:
      torch.set_num_threads(cfg.TORCH_THREADS.value or machine.usable_cores())
  weights = weights_lib.Weights(settings)
  facts = machine.machine_facts(tf, torch)
  machine.print_header(facts, settings, weights.describe())
  sys.stdout.flush()
  results = []
  started = time.time()
  with tempfile.TemporaryDirectory(prefix="rnnstep_bench_") as tmpdir:
    ctx = Context(settings, weights, tf, torch, tmpdir)
    if settings.tune:
      floors.tune(ctx, results)
    for section in settings.sections:
      SECTION_MODULES[section].run(ctx, results)
      sys.stdout.flush()
  facts["loadavg_end"] = list(os.getloadavg())
  print(f"load average at end: {' '.join(f'{x:.2f}' for x in facts['loadavg_end'])};"
        f" benchmark took {time.time() - started:.0f} s")
  if cfg.JSON_OUT.value:
    with open(cfg.JSON_OUT.value, "w") as f:
      json.dump({"machine": facts, "argv": sys.argv,
                 "settings": vars(settings), "model": weights.describe(),
                 "results": results}, f, indent=1)
    print(f"results written to {cfg.JSON_OUT.value}")
  return 0


if __name__ == "__main__":
  app.run(main)
