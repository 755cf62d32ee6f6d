"""Proof that rnnstep's runtime never needs Keras.

`import tensorflow` imports Keras by itself when it is installed, so checking
`sys.modules` after the fact proves nothing. Instead a fresh interpreter makes
`keras` and `tf_keras` unimportable (`sys.modules[name] = None` makes any import
of them raise) before anything else is imported, then imports rnnstep, loads a
model file, scores and generates (graph and XLA). A static check also rejects
any `keras` import or `tf.keras` attribute in the package source.
"""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import tensorflow as tf

from tests import keras_reference as kr

from rnnstep import model_file

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "rnnstep"
# The converter reads their files as data; the package never imports them.
FOREIGN_FRAMEWORKS = ("torch", "safetensors", "ai_edge_litert")

SCRIPT = textwrap.dedent("""
    import sys
    for name in ("keras", "tf_keras", "torch", "safetensors"):
      sys.modules[name] = None
    import rnnstep
    model = rnnstep.load(sys.argv[1])
    print(rnnstep.logits(model, [[1, 2, 3]]).shape)
    print(len(rnnstep.generate(model, ["AB", "C"], 20, seed=1, jit_compile=False)[1]))
    print(len(rnnstep.generate(model, "AB", 20, temperature=0, jit_compile=True)))
    print(len(rnnstep.generate(model, "AB", 20, jit_compile="elementwise")))
    print(len("".join(rnnstep.stream(model, "AB", 20, chunk_size=8))))
    loaded = sorted(m for m in sys.modules
                    if m.split(".")[0] in ("keras", "tf_keras")
                    and sys.modules[m] is not None)
    print("keras modules:", loaded)
""")


class KerasFreeTest(tf.test.TestCase):

  def test_runtime_runs_with_keras_unimportable(self):
    layers = [kr.layer("gru", 16), kr.layer("lstm", 8)]
    path = os.path.join(self.create_tempdir().full_path, "m.npz")
    model_file.write(path, model_file.ModelConfig(16, tuple(layers)),
                     kr.default_vocab(65), kr.weights_of(kr.build(layers), layers))
    result = subprocess.run([sys.executable, "-c", SCRIPT, path],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertEqual(result.stdout.split("\n")[:6],
                     ["(1, 3, 65)", "20", "20", "20", "20", "keras modules: []"])

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
          if ("keras" in name or name == "__import__"
              or name.split(".")[0] in FOREIGN_FRAMEWORKS):
            offenders.append(f"{path}:{node.lineno}: {name}")
    self.assertEqual(offenders, [])


if __name__ == "__main__":
  tf.test.main()
