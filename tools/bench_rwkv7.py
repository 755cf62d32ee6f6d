"""RWKV-7 at the 0.1B shape: rnnstep against its weight-reading floor and
KerasHub's own generate (issue #50).

    python tools/bench_rwkv7.py --batches=1,16 --rounds=3 --paths=default,graph
    python tools/bench_rwkv7.py --keras_hub_python=/work/venv-rwkv/bin/python

The model is the 0.1B shape (12 blocks, 768 wide, 12 heads of 64,
feed-forward 3,072, LoRAs 64/64/32/128, 65,536 ids) with seeded random
weights; each run primes a 100-token prompt and generates 200 tokens
(sampling at temperature 1, so nothing stops early).

  - rnnstep: `rnnstep.generate` on the default path (or each of
    --paths=graph,xla,elementwise), warmed up first (one compile a shape);
  - floor: the least of two `tf.while_loop`s (graph and XLA) that do only
    one token's products of the same weights a step: per block R, K, V, O,
    the four LoRAs' eight, the feed-forward's two, then the head: the bytes
    a token must read;
  - KerasHub: `RWKV7CausalLM.generate` (greedy sampler, no stop token) in
    the keras-hub venv, as it runs by default and with jit_compile=True,
    whole call including the prefill, timed in that process after one
    warm-up call (its first call compiles for long).

Each figure is the median over --rounds, in ms per generated token (the
prefill included, divided over the 200 tokens), and the ratios are taken
within one run. Prints the machine and its load.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np

SHAPE = dict(units=768, blocks=12, head_size=64, ffn=3072, decay_lora=64,
             a_lora=64, v_lora=32, gate_lora=128, vocab=65536)
PROMPT, STEPS = 100, 200


def random_model(dtype="float32"):
  """The 0.1B-shaped rnnstep model, seeded random weights."""
  from rnnstep.model import kinds, model_file, network, vocabulary
  sizes = {k: SHAPE[k] for k in kinds.RWKV7_SIZES}
  layer = model_file.LayerConfig("rwkv7", SHAPE["units"],
                                 sizes=tuple(sizes.items()))
  config = model_file.ModelConfig(SHAPE["units"], (layer,))
  rng = np.random.default_rng(0)
  tensors = {}
  for key, shape in config.expected_shapes(SHAPE["vocab"]).items():
    scale = 1 / np.sqrt(shape[-2]) if len(shape) >= 2 else 0.5
    tensors[key] = (rng.standard_normal(shape, np.float32) * scale)
  layer0 = tensors["layer0_ln"]
  layer0[:, 0] = layer0[:, 2] = 1  # LayerNorm gammas.
  vocab = [vocabulary.world_entry(bytes([i]) if i < 256 else
                                  f"t{i}".encode(), i)
           for i in range(SHAPE["vocab"])]
  tokens = vocabulary.Tokens("world", vocab)
  return network.Model(config, vocab, tensors, dtype, tokens=tokens)


def floor_ms(model, batch, rounds, xla=True):
  """ms per token of the matmul-only loops (the least of graph and XLA)."""
  import tensorflow as tf
  w = model.layer_weights[0]
  names = ("receptance", "key", "value", "output", "w1", "w2", "a1", "a2",
           "v1", "v2", "g1", "g2", "ffn_key", "ffn_value")
  mats = [tf.convert_to_tensor(w[n]) for n in names]
  head = tf.convert_to_tensor(model.dense_kernel)
  c = SHAPE["units"]

  def loop(x):
    def body(t, x):
      acc = x
      for i in range(SHAPE["blocks"]):
        r, k, v, o, w1, w2, a1, a2, v1, v2, g1, g2, fk, fv = (
            m[i] for m in mats)
        y = (tf.matmul(acc, r) + tf.matmul(acc, k) + tf.matmul(acc, v)
             + tf.matmul(tf.matmul(acc, w1), w2)
             + tf.matmul(tf.matmul(acc, a1), a2)
             + tf.matmul(tf.matmul(acc, v1), v2)
             + tf.matmul(tf.matmul(acc, g1), g2))
        acc = tf.matmul(y * 1e-3, o)
        acc = tf.matmul(tf.matmul(acc, fk) * 1e-3, fv)
      logits = tf.matmul(acc, head)
      return t + 1, x + logits[:, :c] * 1e-9
    return tf.while_loop(lambda t, x: t < STEPS, body, (0, x))[1]

  best = None
  for jit in (False, True) if xla else (False,):
    fn = tf.function(loop, jit_compile=jit)
    x = tf.random.normal([batch, c])
    fn(x).numpy()
    times = []
    for _ in range(rounds):
      start = time.perf_counter()
      fn(x).numpy()
      times.append(time.perf_counter() - start)
    ms = statistics.median(times) / STEPS * 1e3
    best = ms if best is None else min(best, ms)
  return best


def rnnstep_ms(model, batch, rounds, path):
  import rnnstep
  rng = np.random.default_rng(1)
  # One letter a token (bytes of uint8: int64's would be 8 tokens a letter).
  prompts = [bytes(rng.integers(97, 123, PROMPT).astype(np.uint8)).decode()
             for _ in range(batch)]
  assert all(len(model.encode(p)) == PROMPT for p in prompts)
  run = lambda: rnnstep.generate(model, prompts, STEPS, seed=1,
                                 temperature=1.0, jit_compile=path)
  start = time.perf_counter()
  run()
  print(f"  rnnstep {path} first call (compiles): "
        f"{time.perf_counter() - start:.1f} s", flush=True)
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return statistics.median(times) / STEPS * 1e3


KERAS_HUB_SCRIPT = textwrap.dedent("""
  import json, os, statistics, sys, time
  os.environ["KERAS_BACKEND"] = "tensorflow"
  import numpy as np, keras, keras_hub
  shape, batch, rounds, jit, prompt, steps = json.loads(sys.argv[1])
  backbone = keras_hub.models.RWKV7Backbone(
      hidden_size=shape["units"], head_size=shape["head_size"],
      num_layers=shape["blocks"], vocabulary_size=shape["vocab"],
      intermediate_dim=shape["ffn"], gate_lora=shape["gate_lora"],
      mv_lora=shape["v_lora"], aaa_lora=shape["a_lora"],
      decay_lora=shape["decay_lora"])
  lm = keras_hub.models.RWKV7CausalLM(backbone, None)
  lm.compile(sampler="greedy", jit_compile=jit)
  rng = np.random.default_rng(1)
  ids = rng.integers(1, 256, (batch, prompt)).astype("int32")
  inputs = {"token_ids": ids[:, :-1],
            "input_padding_mask": np.ones_like(ids[:, :-1], bool),
            "predict_token_ids": np.concatenate(
                [ids[:, -1:], np.zeros((batch, steps), "int32")], 1),
            "padding_mask": np.concatenate(
                [np.ones((batch, 1), bool), np.zeros((batch, steps), bool)],
                1)}
  start = time.perf_counter()
  lm.generate(inputs, stop_token_ids=None)
  first = time.perf_counter() - start
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    lm.generate(inputs, stop_token_ids=None)
    times.append(time.perf_counter() - start)
  print(json.dumps([first, statistics.median(times)]))
""")


def keras_hub_ms(python, batch, rounds, jit):
  out = subprocess.run(
      [python, "-c", KERAS_HUB_SCRIPT,
       json.dumps([SHAPE, batch, rounds, jit, PROMPT, STEPS])],
      capture_output=True, text=True, check=False)
  if out.returncode:
    return None, out.stderr.strip().splitlines()[-1:]
  first, median = json.loads(out.stdout.strip().splitlines()[-1])
  return median / STEPS * 1e3, first


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,16")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--paths", default="default",
                      help="comma list of default, graph, xla, elementwise")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--keras_hub_python", default="")
  parser.add_argument("--steps", type=int, default=200,
                      help="tokens generated a call")
  parser.add_argument("--floor_xla", type=int, default=1,
                      help="0: the floor's graph loop only (XLA compiles "
                      "its 12 blocks for minutes on a loaded machine)")
  parser.add_argument("--floor", type=int, default=1)
  args = parser.parse_args()
  global STEPS
  STEPS = args.steps
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  print(f"machine: {os.cpu_count()} CPUs; load {os.getloadavg()}")
  with open("/proc/cpuinfo") as f:
    model_name = next((l.split(":", 1)[1].strip() for l in f
                       if l.startswith("model name")), "?")
  print(f"cpu: {model_name}")
  model = random_model(args.dtype)
  print(f"model: 0.1B shape, {model.num_parameters:,} parameters, "
        f"{args.dtype}; prompt {PROMPT}, {STEPS} tokens")
  for batch in map(int, args.batches.split(",")):
    row = {"floor": floor_ms(model, batch, args.rounds, args.floor_xla)
                    if args.floor else None}
    if row["floor"]:
      print(f"  batch {batch} floor {row['floor']:.2f} ms/token", flush=True)
    names = {"default": None, "graph": False, "xla": True,
             "elementwise": "elementwise"}
    for name in filter(None, args.paths.split(",")):
      path = names[name]
      row[f"rnnstep {name}"] = rnnstep_ms(model, batch, args.rounds, path)
      print(f"  batch {batch} rnnstep {name} {row[f'rnnstep {name}']:.2f} "
            "ms/token", flush=True)
    if args.keras_hub_python:
      for jit in (False, True):
        ms, first = keras_hub_ms(args.keras_hub_python, batch,
                                 max(1, args.rounds // 2), jit)
        row[f"keras_hub jit={jit}"] = ms
        print(f"  keras_hub jit={jit} {ms} ms/token; first call: {first}",
              flush=True)
    print(f"batch {batch} (load {os.getloadavg()[0]:.1f}):")
    floor = row["floor"] or float("nan")
    for name, ms in row.items():
      if ms is None:
        print(f"  {name:<22} failed")
        continue
      print(f"  {name:<22} {ms:8.2f} ms/token  {ms / floor:5.2f}x floor  "
            f"{1e3 * batch / ms:8.1f} tokens/s")


if __name__ == "__main__":
  main()
