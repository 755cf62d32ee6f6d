"""Window generation (`rnnstep/window.py`) against the recipe and a float64 model.

- The keras.io char-LSTM recipe's model (`Sequential([Input((T, V)),
  LSTM(U), Dense(V, activation="softmax")])` over one-hot vectors, tiny sizes,
  random weights), saved by Keras 3 and read by rnnstep, which records
  `window: T`. Its recipe samples by `model.predict(one_hot(text[-T:]))` per
  character; that loop (argmax for greedy) is the reference text, and the same
  LSTM and Dense with a linear output are the reference logits.
- Any model run with `window=k`, against the float64 numpy forward
  (`tests/support/numpy_reference.py`) over each window from a zero state: logits,
  greedy text, and the scores of sampled text with the options on.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import rnnstep
from rnnstep import convert
from rnnstep.decoding import options
from rnnstep.engine import generator as generator_lib
from rnnstep import errors
from rnnstep.model import model_file
from rnnstep.model import network as model_lib
from tests.support import forkserver
from tests.support import numpy_reference
from tests.support.recipes import recipe_text
from tests.support.tiers import quick_params

keras = pytest.importorskip("keras")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW = 8
UNITS = 16
TOLERANCE = 2e-5
STEPS = 24
PATHS = (True, False, "elementwise")


def window_logits(reference, ids, window):
  """Float64 logits after each position's last `window` ids, from zero."""
  return np.stack([reference.logits(ids[max(0, p - window + 1):p + 1])[-1]
                   for p in range(len(ids))])


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
  """The recipe's model in a .keras file, its vocab, and its references."""
  out = tmp_path_factory.mktemp("recipe")
  text = recipe_text()[:400]
  chars = sorted(set(text))
  size = len(chars)
  model = keras.Sequential([
      keras.Input(shape=(WINDOW, size)), keras.layers.LSTM(UNITS),
      keras.layers.Dense(size, activation="softmax")])
  rng = np.random.default_rng(5)
  model.set_weights([rng.uniform(-0.9, 0.9, w.shape).astype(np.float32)
                     for w in model.get_weights()])
  path = str(out / "recipe.keras")
  model.save(path)
  vocab = str(out / "vocab.json")
  with open(vocab, "w", encoding="utf-8") as f:
    json.dump(chars, f)
  # The same LSTM and Dense with a linear output: the logits.
  probe = keras.Sequential([keras.Input(shape=(None, size)),
                            keras.layers.LSTM(UNITS),
                            keras.layers.Dense(size)])
  probe.set_weights(model.get_weights())
  one_hot = lambda ids: tf.one_hot(np.asarray(ids)[None], size)

  # The recipe's sampling loop, greedy: predict on the last maxlen chars.
  seed = text[100:100 + WINDOW]
  generated = seed
  for _ in range(STEPS):
    ids = [chars.index(c) for c in generated[-WINDOW:]]
    preds = model.predict(one_hot(ids), verbose=0)[0]
    top2 = np.sort(preds)[-2:]
    assert top2[1] - top2[0] > 1e-4, "near tie on the greedy path; reseed"
    generated += chars[int(np.argmax(preds))]
  ids = [chars.index(c) for c in text[:30]]
  logits = np.stack([np.asarray(probe(one_hot(ids[max(0, p - WINDOW + 1):
                                                  p + 1])))[0]
                     for p in range(len(ids))])
  return dict(path=path, vocab=vocab, chars=chars, seed=seed,
              greedy=generated[len(seed):], ids=ids, logits=logits,
              model=rnnstep.load(path, vocab=vocab), out=str(out))


def test_recipe_model_records_its_window(recipe):
  assert recipe["model"].config.window == WINDOW


def test_window_logits_match_keras(recipe):
  """Full windows as the recipe feeds them, and (before position T-1) the
  text so far from a zero state."""
  model = recipe["model"]
  got = rnnstep.logits(model, recipe["ids"])[0]
  assert float(np.abs(got - recipe["logits"]).max()) <= TOLERANCE
  assert rnnstep.logits(model, recipe["ids"], window=0)[0][WINDOW:].tolist() \
      != got[WINDOW:].tolist()


@pytest.mark.parametrize("jit_compile", quick_params(PATHS, False))
def test_greedy_text_is_the_recipes_loop_on_every_path(recipe, jit_compile):
  model = recipe["model"]
  text = rnnstep.generate(model, recipe["seed"], STEPS, temperature=0,
                          jit_compile=jit_compile)
  assert text == recipe["greedy"]
  streamed = "".join(rnnstep.stream(model, recipe["seed"], STEPS, chunk_size=5,
                                    temperature=0, jit_compile=jit_compile))
  assert streamed == recipe["greedy"]


def test_window_zero_steps_statefully(recipe):
  model = recipe["model"]
  reference = numpy_reference.Reference(model.tensors(), model.config.layers)
  stateful = model.decode(reference.greedy(model.encode(recipe["seed"]),
                                           STEPS))
  assert rnnstep.generate(model, recipe["seed"], STEPS, temperature=0,
                          window=0) == stateful
  assert stateful != recipe["greedy"]  # The two reads differ on this model.


@pytest.mark.slow  # a subprocess
def test_cli_window_flag(recipe):
  out = os.path.join(recipe["out"], "recipe.npz")
  convert.convert(recipe["path"], out, vocab=recipe["vocab"])
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
  model = rnnstep.load(out)
  for flags, kwargs in (([], {}), (["--window=0"], {"window": 0}),
                        (["--window=3"], {"window": 3})):
    proc = forkserver.run(
        [sys.executable, "-m", "rnnstep.cli.generate", f"--weights={out}",
         f"--prompt={recipe['seed']}", f"--num_steps={STEPS}",
         "--temperature=0", *flags], cwd=REPO, capture_output=True, text=True,
        env=env, timeout=600, stdin=subprocess.DEVNULL, check=True)
    want = rnnstep.generate(model, recipe["seed"], STEPS, temperature=0,
                            **kwargs)
    assert proc.stdout == recipe["seed"] + want + "\n", (flags, proc.stdout)
    if not flags:
      assert want == recipe["greedy"]


# ------------------------------------------------ any model, window=k


def small_model(window=None):
  """A random LSTM -> GRU stack (V = 14) and its float64 reference."""
  vocab_size = 14
  layers = (model_file.LayerConfig("lstm", 12, True),
            model_file.LayerConfig("gru", 10, True))
  rng = np.random.default_rng(11)
  shapes = {"embedding": (vocab_size, 6), "layer0_kernel": (6, 48),
            "layer0_recurrent_kernel": (12, 48), "layer0_bias": (48,),
            "layer1_kernel": (12, 30), "layer1_recurrent_kernel": (10, 30),
            "layer1_bias": (2, 30), "dense_kernel": (10, vocab_size),
            "dense_bias": (vocab_size,)}
  tensors = {name: rng.uniform(-1.2, 1.2, shape).astype(np.float32)
             for name, shape in shapes.items()}
  vocab = [chr(ord("a") + i) for i in range(vocab_size)]
  config = model_file.ModelConfig(6, layers, window=window)
  return (model_lib.Model(config, vocab, tensors),
          numpy_reference.Reference(tensors, layers))


@pytest.mark.slow  # Several models, each traced: the default run.
def test_any_model_with_window_k_matches_float64():
  model, reference = small_model()
  ids = np.random.default_rng(0).integers(0, model.vocab_size, [2, 17])
  got = rnnstep.logits(model, ids, window=5)
  for row in range(2):
    np.testing.assert_allclose(got[row], window_logits(reference, ids[row], 5),
                               atol=TOLERANCE, rtol=0)
  prompts = ["abcdefg", "hi"]  # Longer and shorter than the window.
  texts = rnnstep.generate(model, prompts, STEPS, temperature=0, window=5)
  assert texts == greedy_over_windows(model, reference, prompts, 5)


def greedy_over_windows(model, reference, prompts, window):
  """The float64 reference's greedy text, each step over the last `window`."""
  texts = []
  for prompt in prompts:
    history = list(model.encode(prompt))
    for _ in range(STEPS):
      history.append(int(np.argmax(window_logits(
          reference, np.array(history), window)[-1])))
    texts.append(model.decode(history[len(prompt):]))
  return texts


def served_inputs(prompts, **values):
  """`generate_decoding`'s inputs: every served option at its default but
  those in `values`."""
  inputs = dict(prompts=tf.constant(prompts), num_steps=tf.constant(STEPS),
                seed=tf.constant(values.pop("seed", 0), tf.int64))
  for option in options.OPTIONS:
    if option.served:
      inputs[option.name] = tf.constant(values.pop(option.name, option.default),
                                        tf.as_dtype(option.dtype))
  assert not values, values
  return inputs


# Exhaustive, every path (an export and a load, 6 CPU-s a path): the default
# run keeps the SavedModel caller (tests/test_saved_model.py) and windows on
# every path in process (test_greedy_text_is_the_recipes_loop_on_every_path).
@pytest.mark.exhaustive
@pytest.mark.parametrize("path", PATHS)
def test_saved_model_serves_the_windows_the_model_records(tmp_path, path):
  """Exported on each path, a model recording window=5 is served over its
  windows, as rnnstep.generate runs it: greedy text is the float64 window
  reference's (stepping statefully gives other text), sampled text the
  library's, and beam search fails the call naming num_beams."""
  model, reference = small_model(window=5)
  prompts = ["abcdefg", "hi"]
  serve = tf.saved_model.load(rnnstep.export(
      model, str(tmp_path / "served"), jit_compile=path)).signatures[
          "generate_decoding"]

  def texts(**values):
    return [t.decode() for t in
            serve(**served_inputs(prompts, **values))["text"].numpy()]

  greedy = texts(temperature=0.0)
  assert greedy == greedy_over_windows(model, reference, prompts, 5)
  assert greedy != rnnstep.generate(model, prompts, STEPS, temperature=0,
                                    window=0)
  assert texts(seed=3, top_k=6) == rnnstep.generate(model, prompts, STEPS,
                                                    seed=3, top_k=6)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="num_beams > 1: this model reads windows of 5"):
    texts(num_beams=2)


def test_litert_export_of_a_window_model_is_refused_in_one_line(tmp_path):
  model, _ = small_model(window=5)
  with pytest.raises(ValueError, match=re.escape(
      "records window=5 (built for fixed windows), but the LiteRT export "
      "steps a model statefully")) as info:
    rnnstep.export_litert(model, str(tmp_path / "lite"))
  assert "\n" not in str(info.value)
  assert not os.path.exists(tmp_path / "lite")


@pytest.mark.slow  # Every path.
def test_sampling_options_stop_strings_and_scores_over_windows():
  """Every option runs in the same tails: the text is the same on every path
  and streamed, and the scores are the float64 window log-likelihoods."""
  model, reference = small_model(window=6)
  prompts = ["abcdefghij", "kl", "mnab"]
  kwargs = dict(temperature=[0.9, 0.0, 1.3], top_k=6, top_p=0.95, min_p=0.02,
                repetition_penalty=1.2, no_repeat_ngram_size=3, seed=7,
                stop=["ba"], return_scores=True)
  texts, scores = rnnstep.generate(model, prompts, STEPS, jit_compile=False,
                                   **kwargs)
  for path in (True, "elementwise"):
    assert rnnstep.generate(model, prompts, STEPS, jit_compile=path,
                            **kwargs)[0] == texts
  pieces = [""] * len(prompts)
  for chunk, _ in rnnstep.stream(model, prompts, STEPS, chunk_size=4,
                                 jit_compile=False, **kwargs):
    pieces = [a + b for a, b in zip(pieces, chunk)]
  assert pieces == texts
  for prompt, text, score in zip(prompts, texts, scores):
    ids = np.concatenate([model.encode(prompt), model.encode(text)])
    logits = window_logits(reference, ids, 6)[len(prompt) - 1:-1]
    chosen = ids[len(prompt):]
    log_norm = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
    want = (logits[np.arange(len(chosen)), chosen] - logits.max(-1)
            - log_norm).sum()
    assert score == pytest.approx(want, abs=1e-4)
    assert len(text) == STEPS or text.endswith("ba")


def test_new_windows_and_batches_do_not_retrace_the_graph_path():
  model, _ = small_model()
  generator = generator_lib.cached(model, "graph")
  counts = []
  for window, prompts in ((3, ["ab"]), (7, ["abc", "d", "ef"]), (2, ["g"])):
    rnnstep.generate(model, prompts, 5, window=window, jit_compile=False,
                     seed=1)
    counts.append(generator.window_fn.experimental_get_tracing_count())
  # The programs are shared by every model of this architecture, so a test
  # before this one may have traced them already (an export traces them once
  # more, inside its own graph): what matters is no new trace after the first.
  assert counts[1:] == counts[:1] * 2, counts


def test_bad_window_arguments_are_one_line_naming_them():
  model, _ = small_model(window=4)
  cases = (
      (dict(window=-1), "window", "window must be a non-negative integer"),
      (dict(window=2.5), "window", "window must be"),
      (dict(window=70000), "window", "at most 65536"),
      (dict(num_beams=3), "num_beams", "num_beams=3 with window=4 (the window "
       "the model records): beam search steps the model statefully"),
  )
  for kwargs, argument, words in cases:
    with pytest.raises(errors.ArgumentError, match=re.escape(words)) as info:
      rnnstep.generate(model, "abc", 3, **kwargs)
    assert info.value.argument == argument and "\n" not in str(info.value)
  assert len(rnnstep.generate(model, "abc", 3, num_beams=3, window=0)) == 3
  state = [{"h": np.zeros([1, 12], np.float32),
            "c": np.zeros([1, 12], np.float32)},
           {"h": np.zeros([1, 10], np.float32)}]
  with pytest.raises(errors.ArgumentError, match="initial_state with window=4"):
    rnnstep.logits(model, [[1, 2]], initial_state=state)
  assert rnnstep.logits(model, [[1, 2]], initial_state=state,
                        window=0).shape == (1, 2, 14)
