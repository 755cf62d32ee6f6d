"""SavedModel export: strings in, strings out, runnable without rnnstep or Keras.

Every export path (graph, XLA, elementwise) is served in a process where
`rnnstep`, `keras` and `tf_keras` are unimportable; greedy text is checked
against a real Keras greedy loop, seeded sampling against the library's text on
the same path.
"""

import json
import os
import shutil
import tempfile
import textwrap

from absl.testing import parameterized
import pytest
import tensorflow as tf

from tests.support import keras_reference as kr
from tests.support import reference_models
from tests.support import cli as cli_support
from tests.support.cli import run_script

import rnnstep
from rnnstep.model import model_file

# Quick tier (-m "not slow") leaves this file out: SavedModel exports served in
# fresh interpreters.
pytestmark = pytest.mark.slow

LAYERS = [kr.layer("lstm", 24), kr.layer("gru", 16)]
PROMPTS = ["HELLO", "A", "THE KING'S SPEECH"]
STEPS = 50

# The generate_decoding signature's inputs (besides prompts and num_steps).
DECODING_DEFAULTS = dict(temperature=1.0, seed=0, top_k=0, top_p=1.0,
                         min_p=0.0, repetition_penalty=1.0, repetition_window=0,
                         no_repeat_ngram_size=0, num_beams=1,
                         length_penalty=1.0, typical_p=1.0,
                         frequency_penalty=0.0, presence_penalty=0.0)
DECODING_DTYPES = dict(temperature="float32", seed="int64", top_k="int32",
                       top_p="float32", min_p="float32",
                       repetition_penalty="float32", repetition_window="int32",
                       no_repeat_ngram_size="int32", num_beams="int32",
                       length_penalty="float32", typical_p="float32",
                       frequency_penalty="float32",
                       presence_penalty="float32")
DECODING_CASES = {
    "penalized": dict(DECODING_DEFAULTS, temperature=0.9, seed=3, min_p=0.1,
                      repetition_penalty=1.4, repetition_window=8,
                      no_repeat_ngram_size=3),
    "beams": dict(DECODING_DEFAULTS, num_beams=4, length_penalty=0.8),
    "typical": dict(DECODING_DEFAULTS, temperature=1.2, seed=4, typical_p=0.6),
    "openai_penalties": dict(DECODING_DEFAULTS, temperature=0.9, seed=5,
                             frequency_penalty=0.8, presence_penalty=-0.6),
}

# Serves every export directory given; prints one JSON object per directory.
SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("rnnstep", "keras", "tf_keras"):
      sys.modules[name] = None
    import tensorflow as tf
    prompts = tf.constant(json.loads(sys.argv[1]))
    steps = tf.constant(int(sys.argv[2]))
    CASES = json.loads(sys.argv[3])  # {export_dir: {name: options}}
    DECODING_DTYPES = json.loads(sys.argv[4])
    DECODING_DEFAULTS = json.loads(sys.argv[5])
    results = {}
    for export_dir, DECODING_CASES in CASES.items():
      loaded = tf.saved_model.load(export_dir)
      serve = loaded.signatures["serving_default"]
      def text(signature, **kwargs):
        out = signature(prompts=prompts, num_steps=steps, **kwargs)["text"]
        return [t.decode() for t in out.numpy()]
      out = {}
      out["greedy"] = text(serve, temperature=tf.constant(0.0),
                           seed=tf.constant(0, tf.int64))
      out["sampled"] = text(serve, temperature=tf.constant(0.8),
                            seed=tf.constant(5, tf.int64))
      out["filtered"] = text(loaded.signatures["generate_top_k_top_p"],
                             temperature=tf.constant(1.0),
                             seed=tf.constant(9, tf.int64),
                             top_k=tf.constant(5), top_p=tf.constant(0.9))
      decoding = loaded.signatures["generate_decoding"]
      constrained = loaded.signatures["generate_constrained"]
      def constraints(stop=(), regex=""):
        return dict(stop=tf.constant(stop, tf.string, [len(stop)]),
                    regex=tf.constant(regex))
      for name, options in DECODING_CASES.items():
        options = dict(options)
        stop, regex = options.pop("stop", None), options.pop("regex", None)
        args = {k: tf.constant(v, DECODING_DTYPES[k]) for k, v in options.items()}
        if stop is None and regex is None:
          got = decoding(prompts=prompts, num_steps=steps, **args)
        else:
          got = constrained(prompts=prompts, num_steps=steps, **args,
                            **constraints(stop or (), regex or ""))
        out[name] = ([t.decode() for t in got["text"].numpy()],
                     got["logprob"].numpy().tolist())
      for name, bad in (("unknown_regex", dict(regex="Q+")),
                        ("bad_stop", dict(stop=["ok"])))[:len(DECODING_CASES)]:
        try:
          constrained(prompts=prompts, num_steps=steps, **{
              k: tf.constant(v, DECODING_DTYPES[k])
              for k, v in DECODING_DEFAULTS.items()},
                      **constraints(**bad))
          out[name] = None
        except tf.errors.InvalidArgumentError as e:
          out[name] = e.message
      try:
        serve(prompts=tf.constant(["hello"]), num_steps=tf.constant(5),
              temperature=tf.constant(1.0), seed=tf.constant(1, tf.int64))
        out["error"] = None
      except tf.errors.InvalidArgumentError as e:
        out["error"] = e.message
      # An export served for its basic signatures only (no cases) leaves
      # generate_decoding unloaded (its first call costs a second of CPU).
      if DECODING_CASES:
        try:
          bad = dict(DECODING_DEFAULTS, typical_p=0.0)
          decoding(prompts=prompts, num_steps=steps, **{
              k: tf.constant(v, DECODING_DTYPES[k]) for k, v in bad.items()})
          out["typical_error"] = None
        except tf.errors.InvalidArgumentError as e:
          out["typical_error"] = e.message
      results[export_dir] = out
    print(json.dumps(results))
""")

# Serves one export's sampled text for each batch of prompts given, in one
# process: prints one JSON list, a list of texts per batch.
SAMPLED_SCRIPT = textwrap.dedent("""
    import json, sys
    for name in ("rnnstep", "keras", "tf_keras"):
      sys.modules[name] = None
    import tensorflow as tf
    export_dir, batches, steps = json.loads(sys.argv[1])
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    print(json.dumps([[t.decode() for t in serve(
        prompts=tf.constant(prompts), num_steps=tf.constant(steps),
        temperature=tf.constant(0.8),
        seed=tf.constant(5, tf.int64))["text"].numpy()] for prompts in batches]))
""")

# Every export path, as `jit_compile` values. None exports the same module as
# False (ServingModule maps AUTO to the graph path): the default run exports
# None (`SavedModelTest`), the exhaustive tier False and the compiled paths.
EXPORT_PATHS = (False, True, "elementwise")


# The patterns every export here serves (generate_constrained's regex), over
# the test vocabulary (" " to "`": capitals, no lowercase).
PATTERNS = ["[A-Z]+( [A-Z]+)*[.!]", "(YES|NO)!"]


def constrained_cases(penalized):
  """generate_constrained's cases: stop strings taken from the rows'
  "penalized" text, so that each row meets one and stops early; and with
  beams and a pattern."""
  stops = [penalized[0][10:12], penalized[1][20:23], penalized[2][30:31]]
  return {
      "stopped_penalized": dict(DECODING_CASES["penalized"], stop=stops),
      "stopped_beams_pattern": dict(DECODING_CASES["beams"], stop=stops,
                                    regex=PATTERNS[1]),
  }


def serve(cases, prompts=PROMPTS, steps=STEPS):
  """Runs SCRIPT on the exports, `{export_dir: {case name: options}}` (the
  generate_decoding or generate_constrained calls besides the basic ones);
  returns {export_dir: outputs}."""
  return run_script(SCRIPT, json.dumps(prompts), str(steps),
                    json.dumps(cases), json.dumps(DECODING_DTYPES),
                    json.dumps(DECODING_DEFAULTS))


class SavedModelTest(tf.test.TestCase, parameterized.TestCase):
  """The default run exports the float32 model with jit_compile=None, the
  library's portable default, which serves the graph path's text (its XLA
  and elementwise programs are exported by the large projection's and the
  bfloat16 model's tests); `EveryPathSavedModelTest` every path."""

  export_paths = (None,)

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    keras_model = kr.build(LAYERS, vocab_size=66, seed=4)
    vocab = ["[UNK]"] + kr.default_vocab(65)
    cls.keras_model = keras_model
    cls.model = rnnstep.Model(model_file.ModelConfig(16, tuple(LAYERS)), vocab,
                              kr.weights_of(keras_model, LAYERS))
    # Every export this class serves, made once, and served in one fresh
    # interpreter (each start pays TensorFlow's import): the float32 model on
    # every path, and the bfloat16 model on the elementwise path.
    cls.bfloat16_model = rnnstep.Model(
        model_file.ModelConfig(16, tuple(LAYERS)), kr.default_vocab(65),
        kr.weights_of(kr.build(LAYERS, seed=4), LAYERS), dtype="bfloat16")
    root = tempfile.mkdtemp(prefix="rnnstep_saved_model_")
    cls.addClassCleanup(shutil.rmtree, root, True)
    cls.export_dirs = {}
    for jit in cls.export_paths:
      cls.export_dirs[jit] = os.path.join(root, f"served_{jit}")
      rnnstep.export(cls.model, cls.export_dirs[jit], jit_compile=jit,
                     regex=PATTERNS)
    cls.bfloat16_dir = os.path.join(root, "served_bfloat16")
    rnnstep.export(cls.bfloat16_model, cls.bfloat16_dir,
                   jit_compile="elementwise")
    cls.cases = dict(DECODING_CASES, **constrained_cases(rnnstep.generate(
        cls.model, PROMPTS, STEPS, jit_compile=False,
        **DECODING_CASES["penalized"])))
    # The bfloat16 export's test checks the basic signatures only.
    cls.served = serve(dict({d: cls.cases for d in cls.export_dirs.values()},
                            **{cls.bfloat16_dir: {}}))

  def test_every_export_path_serves_the_library_text(self):
    dirs, served = self.export_dirs, self.served
    model = self.model
    # The independent reference for greedy text: a Keras loop ([UNK] banned).
    keras_greedy = [model.decode(kr.greedy(self.keras_model, model.encode(p),
                                           STEPS, banned=[0]))
                    for p in PROMPTS]
    for jit, export_dir in dirs.items():
      out = served[export_dir]
      library_path = False if jit is None else jit
      with self.subTest(jit_compile=jit):
        self.assertEqual(out["greedy"], keras_greedy)
        for text in out["sampled"] + out["filtered"]:
          self.assertLen(text, STEPS)
        self.assertEqual(out["sampled"], rnnstep.generate(
            model, PROMPTS, STEPS, temperature=0.8, seed=5,
            jit_compile=library_path))
        self.assertEqual(out["filtered"], rnnstep.generate(
            model, PROMPTS, STEPS, top_k=5, top_p=0.9, seed=9,
            jit_compile=library_path))
        self.assertIn("not in the vocabulary", out["error"])
        self.assertIn("typical_p must be in (0, 1]", out["typical_error"])
        self.assertIn("regex: not a pattern this SavedModel was exported "
                      "with (it has 2,", out["unknown_regex"])
        self.assertIn("stop: a stop string can never be generated",
                      out["bad_stop"])
        for name, options in self.cases.items():
          texts, scores = out[name]
          want_texts, want_scores = rnnstep.generate(
              model, PROMPTS, STEPS, return_scores=True,
              jit_compile=library_path, **options)
          self.assertEqual(texts, want_texts, name)
          self.assertAllClose(scores, want_scores, rtol=1e-5, msg=name)
        # The stop strings end every row early (each is in its row's text).
        for text in out["stopped_penalized"][0]:
          self.assertLess(len(text), STEPS)

  def test_xla_export_of_a_large_projection_serves_the_library_text(self):
    # Its projection is kept out of XLA's output fusion at batch 1 by an
    # optimization barrier (network.py): served without rnnstep at batch 1,
    # the text is the library's (batches across XLA's buckets:
    # EveryPathSavedModelTest's test_xla_export_serves_batches_across_buckets).
    _, model = reference_models.large_projection_model()
    export_dir = os.path.join(tempfile.mkdtemp(prefix="rnnstep_large_"), "1")
    self.addCleanup(shutil.rmtree, os.path.dirname(export_dir), True)
    rnnstep.export(model, export_dir, jit_compile=True)
    batches = (["HELLO"],)
    served = run_script(SAMPLED_SCRIPT, json.dumps([export_dir, batches, 24]))
    for prompts, texts in zip(batches, served, strict=True):
      self.assertEqual(texts, rnnstep.generate(
          model, prompts, 24, temperature=0.8, seed=5, jit_compile=True))

  def test_elementwise_bfloat16_export_matches_library(self):
    model = self.bfloat16_model
    out = self.served[self.bfloat16_dir]
    library = dict(jit_compile="elementwise")
    self.assertEqual(out["greedy"], rnnstep.generate(
        model, PROMPTS, STEPS, temperature=0.0, **library))
    self.assertEqual(out["sampled"], rnnstep.generate(
        model, PROMPTS, STEPS, temperature=0.8, seed=5, **library))
    self.assertEqual(out["filtered"], rnnstep.generate(
        model, PROMPTS, STEPS, top_k=5, top_p=0.9, seed=9, **library))

  def test_refuses_non_empty_directory(self):
    layers = [kr.layer("gru", 8)]
    model = kr.rnnstep_model(kr.build(layers), layers)
    directory = self.create_tempdir()
    directory.create_file("keep.txt")
    with self.assertRaisesRegex(ValueError, "not an empty directory"):
      rnnstep.export(model, directory.full_path)

  def test_refuses_a_bad_path(self):
    with self.assertRaisesRegex(ValueError, "jit_compile must be"):
      rnnstep.export(self.model, self.create_tempdir().full_path,
                     jit_compile="fast")


@pytest.mark.exhaustive  # Three more exports (minutes on two cores).
class EveryPathSavedModelTest(SavedModelTest):
  """The float32 model exported on every path, each serving the library's
  text and options; the XLA export across batch buckets."""

  export_paths = EXPORT_PATHS

  def test_xla_export_serves_batches_across_buckets(self):
    # Batches of 1, 3 and 5 rows pad to 1, 4 and 8 rows under XLA; the served
    # rows are the real ones, each as the library generates it.
    export_dir = self.export_dirs[True]
    batches = (["Q"], PROMPTS, PROMPTS + ["XY", "Z"])
    served = run_script(SAMPLED_SCRIPT, json.dumps([export_dir, batches,
                                                    STEPS]))
    for prompts, texts in zip(batches, served, strict=True):
      self.assertEqual(texts, rnnstep.generate(
          self.model, prompts, STEPS, temperature=0.8, seed=5,
          jit_compile=True))


if __name__ == "__main__":
  tf.test.main()


def test_the_export_is_staged_and_a_failure_leaves_nothing(tmp_path,
                                                           monkeypatch):
  """tf.saved_model.save writes into a temp sibling that is renamed into
  place: a server polling `served/` never sees a half-written `1`, and a
  failed export leaves no folder (which the next export would refuse)."""
  path = str(tmp_path / "m.npz")
  cli_support.write_model(path, seed=1)
  model = rnnstep.load(path)
  target = tmp_path / "served" / "1"
  seen = []

  def half_written(module, export_dir, **kwargs):
    del module, kwargs
    seen.append((os.fspath(export_dir), target.exists()))
    os.makedirs(export_dir, exist_ok=True)
    with open(os.path.join(export_dir, "saved_model.pb"), "wb") as f:
      f.write(b"half")
    raise RuntimeError("disk full")
  monkeypatch.setattr(tf.saved_model, "save", half_written)
  with pytest.raises(RuntimeError, match="disk full"):
    rnnstep.export(model, target)
  [(written, target_existed)] = seen
  assert not target_existed
  assert os.path.dirname(written) == str(target.parent) != written
  assert not target.exists()
  assert os.listdir(target.parent) == []
