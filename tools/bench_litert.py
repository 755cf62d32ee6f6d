"""LiteRT export against the library: file size and characters per second.

USAGE (from the repo root):
  python tools/bench_litert.py             # bundled model, B=1, 500 chars
  python tools/bench_litert.py --num_chars=200 --rounds=3 --batch_size=8
  python tools/bench_litert.py --weights=my.npz --num_threads=1

Exports the model with `rnnstep.export_litert`, loads `model.tflite` in the
`ai_edge_litert` interpreter (XNNPACK, `--num_threads`), and times one
`generate` signature call of `--num_chars` steps after a `--prompt`, against
`rnnstep.generate` on its default path (`jit_compile=None`). Both are warmed
up first; the rounds interleave the two and the table reports medians. The
greedy texts of both are also compared (they must be equal).
"""

import os
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WEIGHTS = flags.DEFINE_string("weights", None,
                               "Model file (default: the bundled model).")
_NUM_CHARS = flags.DEFINE_integer("num_chars", 500, "Characters per call.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows per call.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (medians reported).")
_PROMPT = flags.DEFINE_string("prompt", "ROMEO:", "The prompt of every row.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Sampling temperature.")
_THREADS = flags.DEFINE_integer("num_threads", 2,
                                "Interpreter threads (the machine's cores).")


def main(argv):
  del argv
  from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import inputs as litert_inputs  # pylint: disable=g-import-not-at-top

  model = rnnstep.load(_WEIGHTS.value)
  steps, batch = _NUM_CHARS.value, _BATCH.value
  prompts = [_PROMPT.value] * batch
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    export_dir = rnnstep.export_litert(model, os.path.join(tmp, "litert"))
    export_seconds = time.perf_counter() - start
    path = os.path.join(export_dir, "model.tflite")
    size = os.path.getsize(path)
    interpreter = Interpreter(model_path=path, num_threads=_THREADS.value)
  runner = interpreter.get_signature_runner(litert_inputs.SIGNATURE)
  encoded = [model.encode(p) for p in prompts]

  def litert(temperature):
    out = runner(**litert_inputs.build(model, encoded, steps, 1,
                                       temperature=temperature))
    return litert_inputs.texts(model, out["ids"], out["lengths"])

  def library(temperature):
    return rnnstep.generate(model, prompts, steps, temperature=temperature,
                            seed=1)

  greedy_equal = litert(0.0) == library(0.0)  # Also the warm-up.
  variants = {f"litert ({_THREADS.value} threads)": litert,
              f"rnnstep [{paths.default_path(model, batch)}]": library}
  times = {name: [] for name in variants}
  for round_ in range(_ROUNDS.value):
    order = list(variants)
    if round_ % 2:
      order.reverse()
    for name in order:
      start = time.perf_counter()
      variants[name](_TEMPERATURE.value)
      times[name].append(time.perf_counter() - start)

  print(f"model: {_WEIGHTS.value or 'bundled'} ({model.config.layers}), "
        f"B={batch}, {steps} chars, temperature {_TEMPERATURE.value}, "
        f"medians of {_ROUNDS.value}")
  print(f"model.tflite: {size} bytes ({size / 2**20:.1f} MiB), export "
        f"{export_seconds:.1f} s; greedy text equal to the library: "
        f"{greedy_equal}")
  print(f"{'variant':32s} {'seconds':>9s} {'chars/s':>10s}")
  for name, values in times.items():
    seconds = statistics.median(values)
    print(f"{name:32s} {seconds:9.3f} {steps * batch / seconds:10.0f}")


if __name__ == "__main__":
  app.run(main)
