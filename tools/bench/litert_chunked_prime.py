"""Would RWKV-7's LiteRT artifact prime a prompt faster in chunks? A probe
for #62's prefill target, not the export.

    python tools/bench/litert_chunked_prime.py --model=RWKV7.npz \\
        --artifact=INT8.tflite --chunk=32 --rounds=3

The export primes stepwise (`loop.prime(..., stepwise=True)`): each prompt
token runs the whole step, every product a matrix-vector one (167 fully
connected ops a token at the 0.1B shape). TensorFlow's paths run each
block's products once over the prompt (`RWKV7Cell.unroll`). This tool traces
`Network.unroll` over `--chunk` tokens at batch 1, its WKV recurrence
unrolled token by token in Python (the cell's own `_wkv_update`: the
exported graph has no TensorArray, which needs Flex ops, and no XLA
sub-programs), converts it with dynamic-range int8 weights as the export's
`--dynamic_range_int8` does, and times one chunk in the interpreter (two
threads, XNNPACK). Beside it, in the same process and alternating: the
library's float32 prefill (`generate` of a 512-token prompt, 1 step, as
`tools/bench_rwkv7.py`'s pp512) and the stepwise artifact's (`--artifact`,
an export of the same model with `--dynamic_range_int8`; the warm path's
`runner.run_artifact`). Prefill tokens/s, medians over the rounds.

What it left to the export, done in 0.27.0 (`loop.prime` stepwise,
`RWKV7Cell.for_litert_converter`; benchmarks/results/
litert-chunked-priming-epyc-zen5-2026-12.md): the chunks' loop over a
prompt, the masked tail of each row, and the texts checked against the
library's.
"""

import argparse
import statistics
import time

import numpy as np

PREFILL = 512


def chunk_interpreter(model, chunk, int8):
  """(interpreter, the chunk's inputs in order): `Network.unroll` over
  `chunk` tokens of one row, converted."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from ai_edge_litert import interpreter as litert  # pylint: disable=g-import-not-at-top
  from rnnstep.model import network as network_lib  # pylint: disable=g-import-not-at-top
  network = network_lib.network_of(model.architecture, model.network_weights())
  cell = network.cells[0]
  # Blocks inlined and no XLA sub-programs (what one XLA program's trace
  # takes); the recurrence below replaces the cell's looped scan.
  cell.one_xla_program = True

  def wkv_scan(wkv, mask, length, batch, inputs):
    del mask, length  # Every token of the chunk is kept.
    heads, size = cell.heads, cell.head_size
    inputs = tuple(tf.reshape(t, [chunk, batch, -1]) for t in inputs)
    s = tf.reshape(wkv, [batch, heads, size, size])
    ys = []
    for t in range(chunk):
      decay, kk, a, k, v, r = (x[t] for x in inputs)
      s, y = cell._wkv_update(s, decay, cell._heads(kk), a, k, v, r)  # pylint: disable=protected-access
      ys.append(y)
    return (tf.reshape(s, [batch, heads * size * size]),
            tf.reshape(tf.stack(ys), [chunk * batch, heads, size]))

  cell._wkv_scan = wkv_scan  # pylint: disable=protected-access
  state = network.zero_state(1)
  flat = tf.nest.flatten(state)

  @tf.function(autograph=False, input_signature=[
      tf.TensorSpec([1, chunk], tf.int32)] + [
          tf.TensorSpec(t.shape, t.dtype) for t in flat])
  def prime(ids, *values):
    _, final = network.unroll(ids, tf.nest.pack_sequence_as(state,
                                                             list(values)))
    return tf.nest.flatten(final)

  converter = tf.lite.TFLiteConverter.from_concrete_functions(
      [prime.get_concrete_function()], prime)
  if int8:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
  start = time.perf_counter()
  flatbuffer = converter.convert()
  print(f"chunk of {chunk}: converted in {time.perf_counter() - start:.0f} s, "
        f"{len(flatbuffer) / 2**20:.0f} MiB", flush=True)
  interpreter = litert.Interpreter(model_content=flatbuffer, num_threads=2)
  interpreter.allocate_tensors()
  rng = np.random.default_rng(0)
  feed = [rng.integers(1, model.vocab_size, [1, chunk]).astype(np.int32)] + [
      t.numpy() for t in flat]
  for detail, value in zip(sorted(interpreter.get_input_details(),
                                  key=lambda d: d["index"]), feed):
    interpreter.set_tensor(detail["index"], value)
  return interpreter


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", required=True, help="an RWKV-7 model file")
  parser.add_argument("--artifact", required=True,
                      help="its stepwise LiteRT export (model.tflite)")
  parser.add_argument("--chunk", type=int, default=32)
  parser.add_argument("--float32", action="store_true",
                      help="convert the chunk with float32 weights")
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(args.model)
  prompt = bytes(np.random.default_rng(2).integers(
      97, 123, PREFILL).astype(np.uint8)).decode()
  tokens = len(model.encode(prompt))
  with open(args.artifact, "rb") as f:
    flatbuffer = f.read()
  interpreter = chunk_interpreter(model, args.chunk, not args.float32)
  ways = {
      "library float32, pp512": (tokens, lambda: rnnstep.generate(
          model, [prompt], 1, seed=1, temperature=0.0)),
      "LiteRT stepwise artifact, pp512": (tokens, lambda: runner.run_artifact(
          vocab=list(model.vocab), prompts=[prompt], num_steps=1,
          tokens=model.tokens, flatbuffer=flatbuffer, temperature=0.0,
          seed=0)),
      # As many chunks as the prompt's tokens fill (the export's loop would
      # run them in one call).
      f"LiteRT chunks of {args.chunk}, pp512": (
          tokens // args.chunk * args.chunk,
          lambda: [interpreter.invoke() for _ in range(tokens // args.chunk)]),
  }
  rates = {name: [] for name in ways}
  for _, run in ways.values():  # Warm: traces, first invocations.
    run()
  for r in range(args.rounds):
    names = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
    for name in names:
      count, run = ways[name]
      start = time.perf_counter()
      run()
      rates[name].append(count / (time.perf_counter() - start))
  base = statistics.median(rates["library float32, pp512"])
  for name, values in rates.items():
    median = statistics.median(values)
    print(f"{name}: {median:.0f} tokens/s ({min(values):.0f}-{max(values):.0f})"
          f", {median / base:.2f}x the library's float32")


if __name__ == "__main__":
  main()
