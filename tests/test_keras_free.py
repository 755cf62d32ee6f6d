"""Proof that rnnstep's runtime never needs Keras.

`import tensorflow` imports Keras by itself when it is installed, so checking
`sys.modules` after the fact proves nothing. Instead a fresh interpreter makes
`keras` and `tf_keras` unimportable (`sys.modules[name] = None` makes any import
of them raise) before anything else is imported, then imports rnnstep, loads a
model file, scores, generates (graph, XLA, elementwise) and streams; the test
process, where Keras is importable, checks those numbers and texts against
Keras (logits, greedy text) and the library's graph path (seeded samples).
A static check also rejects
any `keras` import or `tf.keras` attribute in the package source.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests.support import keras_reference as kr

import rnnstep
from rnnstep.model import model_file

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rnnstep"
# The converter reads their files as data; the package never imports them.
FOREIGN_FRAMEWORKS = ("torch", "safetensors", "ai_edge_litert")
# Except: rnnstep-generate's warm path runs the LiteRT interpreter (an
# optional import inside a function; without it the command takes the
# TensorFlow path).
RUNS_THE_INTERPRETER = PACKAGE / "litert" / "runner.py"

SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("keras", "tf_keras", "torch", "safetensors"):
      sys.modules[name] = None
    import rnnstep
    model = rnnstep.load(sys.argv[1])
    out = {"logits": rnnstep.logits(model, [[1, 2, 3]]).tolist(),
           "graph_sampled": rnnstep.generate(model, ["AB", "C"], 20, seed=1,
                                             jit_compile=False),
           "xla_greedy": rnnstep.generate(model, "HELLO, KING", 20, temperature=0,
                                          jit_compile=True),
           "elementwise_sampled": rnnstep.generate(
               model, "AB", 20, seed=2, jit_compile="elementwise"),
           "stream_sampled": "".join(rnnstep.stream(model, "AB", 20, seed=3,
                                                    chunk_size=8)),
           "keras_modules": sorted(
               m for m in sys.modules if m.split(".")[0] in ("keras", "tf_keras")
               and sys.modules[m] is not None),
           # An optional dependency (rnnstep.pipelines), never imported by
           # rnnstep.
           "beam_modules": sorted(m for m in sys.modules
                                  if m.split(".")[0] == "apache_beam")}
    print(json.dumps(out))
""")


class KerasFreeTest(tf.test.TestCase):

  @pytest.mark.slow  # a fresh interpreter
  def test_runtime_runs_with_keras_unimportable(self):
    layers = [kr.layer("gru", 16), kr.layer("lstm", 8)]
    path = os.path.join(self.create_tempdir().full_path, "m.npz")
    keras_model = kr.lively(kr.build(layers))
    model_file.write(path, model_file.ModelConfig(16, tuple(layers)),
                     kr.default_vocab(65), kr.weights_of(keras_model, layers))
    result = subprocess.run([sys.executable, "-c", SCRIPT, path],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    out = json.loads(result.stdout.strip().splitlines()[-1])
    self.assertEqual(out["keras_modules"], [])
    self.assertEqual(out["beam_modules"], [])
    # What it computed without Keras, against Keras (this process has it) or,
    # for seeded sampling, the library's graph path here.
    self.assertAllClose(out["logits"],
                        keras_model(np.array([[1, 2, 3]]), training=False),
                        atol=1e-5, rtol=0)
    model = rnnstep.load(path)
    self.assertEqual(out["xla_greedy"], model.decode(
        kr.greedy(keras_model, model.encode("HELLO, KING"), 20)))
    for key, prompts, seed in (("graph_sampled", ["AB", "C"], 1),
                               ("elementwise_sampled", "AB", 2),
                               ("stream_sampled", "AB", 3)):
      self.assertEqual(out[key], rnnstep.generate(model, prompts, 20, seed=seed,
                                                  jit_compile=False), key)
      self.assertNotEqual(out[key], out["xla_greedy"])  # Really sampled.

  def test_source_never_imports_keras_or_torch(self):
    offenders = []
    for path in PACKAGE.rglob("*.py"):
      tree = ast.parse(path.read_text(), str(path))
      for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
          names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
          names = [node.module or ""]
        elif isinstance(node, ast.Attribute) and node.attr == "keras":
          names = ["<attribute>.keras"]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "__import__"):
          names = ["__import__"]
        for name in names:
          if (path == RUNS_THE_INTERPRETER
              and name.split(".")[0] == "ai_edge_litert"):
            continue
          if ("keras" in name or name == "__import__"
              or name.split(".")[0] in FOREIGN_FRAMEWORKS):
            offenders.append(f"{path}:{node.lineno}: {name}")
    self.assertEqual(offenders, [])


if __name__ == "__main__":
  tf.test.main()
