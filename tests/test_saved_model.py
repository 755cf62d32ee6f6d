"""SavedModel export: strings in, strings out, runnable without rnnstep or Keras."""

import json
import os
import subprocess
import sys
import textwrap

import tensorflow as tf

from tests import keras_reference as kr

import rnnstep
from rnnstep import model_file

LAYERS = [kr.layer("lstm", 24), kr.layer("gru", 16)]
PROMPTS = ["HELLO", "A", "THE KING'S SPEECH"]

SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("rnnstep", "keras", "tf_keras"):
      sys.modules[name] = None
    import tensorflow as tf
    loaded = tf.saved_model.load(sys.argv[1])
    prompts = tf.constant(json.loads(sys.argv[2]))
    out = {}
    text = loaded.signatures["serving_default"](
        prompts=prompts, num_steps=tf.constant(50), temperature=tf.constant(0.8),
        seed=tf.constant(5, tf.int64))["text"]
    out["sampled"] = [t.decode() for t in text.numpy()]
    text = loaded.signatures["generate_top_k_top_p"](
        prompts=prompts, num_steps=tf.constant(50), temperature=tf.constant(1.0),
        seed=tf.constant(9, tf.int64), top_k=tf.constant(5),
        top_p=tf.constant(0.9))["text"]
    out["filtered"] = [t.decode() for t in text.numpy()]
    try:
      loaded.signatures["serving_default"](
          prompts=tf.constant(["hello"]), num_steps=tf.constant(5),
          temperature=tf.constant(1.0), seed=tf.constant(1, tf.int64))
      out["error"] = None
    except tf.errors.InvalidArgumentError as e:
      out["error"] = e.message
    print(json.dumps(out))
""")


class SavedModelTest(tf.test.TestCase):

  def serve(self, model, **export_args):
    """Exports `model`, runs SCRIPT on the export; returns its JSON output."""
    export_dir = os.path.join(self.create_tempdir().full_path, "served")
    rnnstep.export(model, export_dir, **export_args)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, export_dir, json.dumps(PROMPTS)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])

  def test_export_runs_without_rnnstep_and_matches_library(self):
    keras_model = kr.build(LAYERS, vocab_size=66, seed=4)
    vocab = ["[UNK]"] + kr.default_vocab(65)
    model = rnnstep.Model(model_file.ModelConfig(16, tuple(LAYERS)), vocab,
                          kr.weights_of(keras_model, LAYERS))
    out = self.serve(model)
    for jit in (False, True):
      self.assertEqual(out["sampled"], rnnstep.generate(
          model, PROMPTS, 50, temperature=0.8, seed=5, jit_compile=jit))
      self.assertEqual(out["filtered"], rnnstep.generate(
          model, PROMPTS, 50, top_k=5, top_p=0.9, seed=9, jit_compile=jit))
    self.assertIn("not in the vocabulary", out["error"])

  def test_elementwise_bfloat16_export_matches_library(self):
    model = rnnstep.Model(model_file.ModelConfig(16, tuple(LAYERS)),
                          kr.default_vocab(65),
                          kr.weights_of(kr.build(LAYERS, seed=4), LAYERS),
                          dtype="bfloat16")
    out = self.serve(model, jit_compile="elementwise")
    self.assertEqual(out["sampled"], rnnstep.generate(
        model, PROMPTS, 50, temperature=0.8, seed=5, jit_compile="elementwise"))

  def test_refuses_non_empty_directory(self):
    layers = [kr.layer("gru", 8)]
    model = kr.rnnstep_model(kr.build(layers), layers)
    directory = self.create_tempdir()
    directory.create_file("keep.txt")
    with self.assertRaisesRegex(ValueError, "not an empty directory"):
      rnnstep.export(model, directory.full_path)


if __name__ == "__main__":
  tf.test.main()
