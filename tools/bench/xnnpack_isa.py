"""Does XNNPACK's dynamic-range int8 give the same floats on every x86 kind?
(issue #62: whether the library's int8 arithmetic can be XNNPACK's, the same
text on an AVX2 machine as on an AVX-512 one).

    python tools/bench/xnnpack_isa.py build OUT_DIR   # TensorFlow: the files
    python tools/bench/xnnpack_isa.py run OUT_DIR NAME  # LiteRT only
    python tools/bench/xnnpack_isa.py compare OUT_DIR   # native against the rest
    python tools/bench/xnnpack_isa.py all OUT_DIR       # the three, with qemu

`build` writes one fully connected product (768 x 2304, the bundled GRU's
input projection's shape, random weights) converted with the converter's
dynamic-range int8 (`Optimize.DEFAULT`: int8 weights per output channel, each
activation row rounded to int8 at run time, int32 sums), 16 input rows over
four magnitudes, and the bundled model's int8 LiteRT export
(`export_litert(..., dynamic_range_int8=True)`). `run` runs both on XNNPACK
(the product's output floats; the export's greedy, sampled and top-p text
on one and two threads) and saves them as NAME. `all` runs them natively and
under qemu-user (Debian's `qemu-user`, which emulates the CPUID of the model
it is given, so XNNPACK picks that CPU's kernels: Haswell and EPYC-Milan have
AVX2 and FMA, Nehalem SSE4.2 only), then compares each with the native run
bit for bit. The emulation is slow (seconds) but exact: it changes which
kernels run, not their arithmetic.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np

EMULATED = ("Haswell", "EPYC-Milan", "Nehalem")
ROWS, COLUMNS = 768, 2304
TEXT_CASES = {"greedy": dict(temperature=0.0),
              "sampled": dict(temperature=0.8),
              "top_p": dict(temperature=1.0, top_p=0.9)}


def build(out):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  weights = (rng.standard_normal((ROWS, COLUMNS)) * 0.05).astype(np.float32)
  bias = (rng.standard_normal(COLUMNS) * 0.1).astype(np.float32)

  class Product(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([4, ROWS], tf.float32)])
    def product(self, x):
      return tf.matmul(x, tf.constant(weights)) + tf.constant(bias)

  module = Product()
  converter = tf.lite.TFLiteConverter.from_concrete_functions(
      [module.product.get_concrete_function()], module)
  converter.optimizations = [tf.lite.Optimize.DEFAULT]
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "product.tflite"), "wb") as f:
    f.write(converter.convert())
  inputs = np.stack([rng.standard_normal((4, ROWS)).astype(np.float32) * scale
                     for scale in (0.1, 1.0, 7.3, 100.0)])
  inputs[1, 2, :10] = 0.0  # Ties and an outlier in the rows' ranges.
  inputs[2, 1, 5] = 55.0
  np.save(os.path.join(out, "inputs.npy"), inputs)
  export = os.path.join(out, "bundled_int8")
  shutil.rmtree(export, ignore_errors=True)
  rnnstep.export_litert(rnnstep.load(), export, dynamic_range_int8=True)


def run(out, name):
  from ai_edge_litert.interpreter import Interpreter  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner  # pylint: disable=g-import-not-at-top
  interpreter = Interpreter(model_path=os.path.join(out, "product.tflite"),
                            num_threads=1)
  interpreter.allocate_tensors()
  given = interpreter.get_input_details()[0]["index"]
  taken = interpreter.get_output_details()[0]["index"]
  outputs = []
  for rows in np.load(os.path.join(out, "inputs.npy")):
    interpreter.set_tensor(given, rows)
    interpreter.invoke()
    outputs.append(interpreter.get_tensor(taken).copy())
  np.save(os.path.join(out, f"product_{name}.npy"), np.stack(outputs))
  export = os.path.join(out, "bundled_int8")
  with open(os.path.join(export, "vocab.json"), encoding="utf-8") as f:
    vocab = json.load(f)
  texts = {f"{case}/{threads}": runner.run_artifact(
      os.path.join(export, "model.tflite"), vocab,
      ["ROMEO:", "JULIET:\nO", "A"], 150, seed=5, builtin_kernels=False,
      num_threads=threads, **options)
           for case, options in TEXT_CASES.items() for threads in (1, 2)}
  with open(os.path.join(out, f"texts_{name}.json"), "w",
            encoding="utf-8") as f:
    json.dump(texts, f)


def compare(out):
  native = np.load(os.path.join(out, "product_native.npy"))
  with open(os.path.join(out, "texts_native.json"), encoding="utf-8") as f:
    native_texts = json.load(f)
  for name in EMULATED:
    path = os.path.join(out, f"product_{name}.npy")
    if not os.path.exists(path):
      continue
    other = np.load(path)
    differ = int((native.view(np.uint32) != other.view(np.uint32)).sum())
    with open(os.path.join(out, f"texts_{name}.json"), encoding="utf-8") as f:
      texts = json.load(f)
    same = sum(texts[k] == v for k, v in native_texts.items())
    print(f"{name}: product floats differing from native: {differ} of "
          f"{native.size} (max |diff| {np.abs(native - other).max():.3g}); "
          f"texts equal: {same} of {len(native_texts)}")


def main(argv):
  command, out = argv[1], argv[2]
  if command == "build":
    build(out)
  elif command == "run":
    run(out, argv[3])
  elif command == "compare":
    compare(out)
  elif command == "all":
    python = os.path.realpath(sys.executable)
    here = os.path.abspath(__file__)
    subprocess.run([python, here, "build", out], check=True)
    subprocess.run([python, here, "run", out, "native"], check=True)
    for cpu in EMULATED:
      subprocess.run(["qemu-x86_64", "-cpu", cpu, python, here, "run", out,
                      cpu], check=True, stderr=subprocess.DEVNULL)
    compare(out)
  else:
    raise SystemExit(__doc__)


if __name__ == "__main__":
  main(sys.argv)
