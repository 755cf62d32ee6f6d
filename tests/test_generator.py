"""Generation: Keras-exact greedy text, batching, XLA, seeds, traces, streams, stops."""

import functools

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from tests.support import decoding_reference as dr
from tests.support import keras_reference as kr
from tests.support import numpy_reference as nr
from tests.support import reference_models
from tests.support import row_contract
from tests.support.tiers import quick_cases

import rnnstep
from rnnstep import api
from rnnstep.decoding import stopping
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import paths
from rnnstep.model import model_file
from rnnstep.model import functions as functions_lib
from rnnstep.model import network as model_lib

# Every execution path (`jit_compile` values; see generator.py).
PATHS = (False, True, "elementwise")

STACKS = reference_models.STACKS
models = reference_models.stack_models


def unk_tensors():
  """The tensors of a model whose bias strongly favours id 0."""
  layers = STACKS["gru_reset_after"]
  keras_model = kr.build(layers, vocab_size=66, embedding_dim=16, seed=3)
  tensors = kr.weights_of(keras_model, layers)
  tensors["dense_bias"][0] = 50.0
  return tensors


def unk_model(dtype="float32"):
  """A model whose id 0 is [UNK] and whose bias strongly favours id 0."""
  vocab = ["[UNK]"] + kr.default_vocab(65)
  config = model_file.ModelConfig(16, tuple(STACKS["gru_reset_after"]))
  return rnnstep.Model(config, vocab, unk_tensors(), dtype)


class GreedyTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(n, n) for n in STACKS])
  @quick_cases("gru_reset_after")
  def test_greedy_matches_keras_loop(self, name):
    # The quick stack's compiled paths (a first XLA and elementwise compile
    # each) are the slow test below.
    self.check_greedy(name, (False,) if name == "gru_reset_after" else PATHS)

  @pytest.mark.slow  # XLA and elementwise programs.
  def test_greedy_matches_keras_loop_on_the_compiled_paths(self):
    self.check_greedy("gru_reset_after", (True, "elementwise"))

  def check_greedy(self, name, jits):
    keras_model, model = models(name)
    prompt = "ROMEO: "
    want = model.decode(kr.greedy(keras_model, model.encode(prompt), 120))
    for jit in jits:
      got = rnnstep.generate(model, prompt, 120, temperature=0.0, jit_compile=jit)
      self.assertEqual(got, want, f"jit_compile={jit}")

  @parameterized.named_parameters(("graph", False), ("xla", True),
                                  ("elementwise", "elementwise"),
                                  ("default", None))
  @quick_cases("graph")
  def test_unk_is_never_generated(self, jit):
    model = unk_model()  # Its bias makes [UNK] the argmax at every step.
    reference = nr.Reference(unk_tensors(), STACKS["gru_reset_after"],
                             banned=[0])
    want = model.decode(reference.greedy(model.encode("AB"), 200))
    for temperature in (0.0, 1.0):
      text = rnnstep.generate(model, "AB", 200, temperature=temperature, seed=1,
                              jit_compile=jit)
      streamed = "".join(rnnstep.stream(model, "AB", 200, chunk_size=64,
                                        temperature=temperature, seed=1,
                                        jit_compile=jit))
      for got in (text, streamed):
        self.assertNotIn("[UNK]", got)
        self.assertLen(got, 200)
      if temperature == 0:
        self.assertEqual(text, want)  # The runner-up, as a banning reference.

  @parameterized.named_parameters(("graph", False),
                                  ("elementwise", "elementwise"))
  @pytest.mark.slow  # XLA programs with a 16,384-wide projection.
  # Only the xla path unfuses the projection (`one_xla_program`): it is
  # checked against the graph path by default, the elementwise path too in
  # the exhaustive tier.
  @quick_cases("graph")
  def test_a_large_projection_at_batch_1_matches_keras_on_every_path(
      self, other_path):
    """A projection of `UNFUSED_PROJECTION_ELEMENTS` weights, which the xla
    path keeps out of XLA's output fusion at batch 1 (network.py): greedy
    text is the Keras loop's, and a sampled text and its score are the same
    on the xla path, in its stream and on `other_path`."""
    keras_model, model = reference_models.large_projection_model()
    self.assertTrue(model_lib.network_of(
        model.architecture, model.network_weights(),
        one_xla_program=True).unfused_projection)
    prompt = model.decode([7, 4000, 123, 9999])
    want = model.decode(kr.greedy(keras_model, model.encode(prompt), 24))
    sampled = {}
    for jit in (True, other_path):
      self.assertEqual(rnnstep.generate(model, prompt, 24, temperature=0.0,
                                        jit_compile=jit), want, jit)
      sampled[jit] = rnnstep.generate(model, [prompt], 24, seed=3,
                                      return_scores=True, jit_compile=jit)
    streamed = "".join(rnnstep.stream(model, prompt, 24, chunk_size=10,
                                      seed=3, jit_compile=True))
    (xla_text,), (xla_score,) = sampled[True]
    self.assertEqual(streamed, xla_text)
    for (text,), (score,) in sampled.values():
      self.assertEqual(text, xla_text)
      self.assertAllClose(score, xla_score, rtol=1e-5, atol=0)

class BatchTest(tf.test.TestCase, parameterized.TestCase):
  """The batch contract (README "Reproducibility", tests/support/row_contract.py)."""

  PROMPTS = ["A", "THE QUICK BROWN FOX", "HELLO, ", "Z" * 40, "KING RICHARD"]
  SEEDS = [11, 22, 33, 44, 55]
  TEMPERATURES = [0.0, 1.0, 0.0, 1.0, 0.8]  # Greedy and sampled rows.

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_the_same_request_gives_the_same_bits(self, jit):
    _, model = models("lstm_then_gru")
    runs = [rnnstep.generate(model, self.PROMPTS, 40, seed=9,
                             temperature=self.TEMPERATURES,
                             return_scores=True, jit_compile=jit)
            for _ in range(2)]
    self.assertEqual(runs[0], runs[1])  # Texts, and scores as exact floats.

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_each_row_alone_gives_its_text_but_at_a_near_tie(self, jit):
    keras_model, model = models("lstm_then_gru")
    layers = STACKS["lstm_then_gru"]
    reference = nr.Reference(kr.weights_of(keras_model, layers), layers)
    batch = rnnstep.generate(model, self.PROMPTS, 40, seed=self.SEEDS,
                             temperature=self.TEMPERATURES, jit_compile=jit)
    for prompt, seed, temperature, text in zip(
        self.PROMPTS, self.SEEDS, self.TEMPERATURES, batch):
      alone = rnnstep.generate(model, [prompt], 40, seed=[seed],
                               temperature=temperature, jit_compile=jit)[0]
      row_contract.assert_same_or_near_tie(
          reference, model.encode(prompt), model.encode(text),
          model.encode(alone), temperature=temperature,
          key=dr.row_key(seed, 0), message=(jit, prompt, temperature))

  def test_a_row_s_logits_equal_it_alone_to_float32_rounding(self):
    _, model = models("lstm_then_gru")
    ids = np.random.default_rng(4).integers(0, 65, [7, 50]).astype(np.int32)
    batch = rnnstep.logits(model, ids)
    for row in range(len(ids)):
      self.assertAllClose(batch[row], rnnstep.logits(model, ids[row])[0],
                          atol=1e-5, rtol=0)

  @pytest.mark.slow  # Every path.
  def test_paths_agree_when_sampling(self):
    _, model = models("gru_reset_after")
    prompts = ["ABC", "HELLO"]
    graph, xla, elementwise = (
        rnnstep.generate(model, prompts, 100, temperature=0.9, top_k=20,
                         top_p=0.95, seed=5, jit_compile=jit) for jit in PATHS)
    self.assertEqual(graph, xla)
    self.assertEqual(elementwise, xla)


class InitialStateTest(tf.test.TestCase, parameterized.TestCase):
  """Generation from a given state: from the state after p1, prompt p2 gives
  what prompt p1 + p2 gives (text, stream, beams, logits), on every path."""

  P1 = ["ROMEO: ", "AB", "THE QUICK"]
  P2 = ["HEL", "Q", " BROWN"]

  def states_after_p1(self, model):
    states = rnnstep.hidden_states(model, self.P1)
    return [{k: v[:, -1] for k, v in layer.items()} for layer in states]

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_continuing_from_a_state_equals_the_joined_prompt(self, jit):
    _, model = models("lstm_then_gru")
    state = self.states_after_p1(model)
    joined = [a + b for a, b in zip(self.P1, self.P2)]
    settings = dict(temperature=[0.0, 1.0, 0.7], seed=[3, 4, 5],
                    jit_compile=jit)
    want = rnnstep.generate(model, joined, 30, **settings)
    self.assertEqual(rnnstep.generate(model, self.P2, 30, initial_state=state,
                                      **settings), want)
    chunks = list(rnnstep.stream(model, self.P2, 30, chunk_size=7,
                                 initial_state=state, **settings))
    self.assertEqual(["".join(c[i] for c in chunks) for i in range(3)], want)
    self.assertEqual(
        rnnstep.generate(model, self.P2, 12, num_beams=3, initial_state=state,
                         jit_compile=jit),
        rnnstep.generate(model, joined, 12, num_beams=3, jit_compile=jit))

  @pytest.mark.slow  # A program per batch.
  def test_one_state_per_row_equals_each_row_alone(self):
    keras_model, model = models("lstm_then_gru")
    layers = STACKS["lstm_then_gru"]
    reference = nr.Reference(kr.weights_of(keras_model, layers), layers)
    state = self.states_after_p1(model)
    batch = rnnstep.generate(model, self.P2, 30, temperature=0.0,
                             initial_state=state)
    for row, (p1, p2) in enumerate(zip(self.P1, self.P2)):
      alone = rnnstep.generate(
          model, [p2], 30, temperature=0.0,
          initial_state=[{k: v[row:row + 1] for k, v in layer.items()}
                         for layer in state])[0]
      self.assertEqual(alone, batch[row])
      # And the float64 reference from the joined prompt (up to near-ties).
      want = model.decode(reference.greedy(model.encode(p1 + p2), 30))
      row_contract.assert_same_or_near_tie(
          reference, model.encode(p1 + p2), model.encode(batch[row]),
          model.encode(want))

  def test_a_bad_state_is_one_line_naming_it(self):
    _, model = models("lstm_then_gru")
    state = self.states_after_p1(model)
    bad = [dict(layer) for layer in state]
    bad[0]["c"] = bad[0]["c"][:, :5]
    for call in (rnnstep.generate, rnnstep.stream):
      with self.assertRaisesRegex(ValueError, r"^initial_state\[0\]\['c'\] "
                                  r"is float32 \[3, 5\]") as ctx:
        out = call(model, self.P2, 5, initial_state=bad)
        if call is rnnstep.stream:
          next(out)
      self.assertNotIn("\n", str(ctx.exception))
      self.assertEqual(ctx.exception.argument, "initial_state")


class SeedTest(tf.test.TestCase):

  def test_same_seed_same_text_other_seed_other_text(self):
    _, model = models("gru_reset_after")
    a = rnnstep.generate(model, ["HI", "HI"], 80, seed=123)
    b = rnnstep.generate(model, ["HI", "HI"], 80, seed=123)
    c = rnnstep.generate(model, ["HI", "HI"], 80, seed=124)
    self.assertEqual(a, b)
    self.assertNotEqual(a, c)
    self.assertNotEqual(a[0], a[1])  # Rows of one seed differ: (seed, row index).

  def test_no_seed_is_fresh(self):
    _, model = models("gru_reset_after")
    texts = {rnnstep.generate(model, "HI", 60) for _ in range(3)}
    self.assertLen(texts, 3)


class SamplingLawTest(tf.test.TestCase):
  """The first sampled character follows softmax(logits / T) and its filters."""

  def setUp(self):
    super().setUp()
    _, self.model = models("gru_reset_after")
    self.prompt = "ROMEO: "
    self.logits = rnnstep.logits(self.model, [self.model.encode(self.prompt)])[0, -1]

  def first_char_counts(self, rows, **kwargs):
    texts = rnnstep.generate(self.model, [self.prompt] * rows, 1, seed=99, **kwargs)
    ids = self.model.encode("".join(texts))
    return np.bincount(ids, minlength=self.model.vocab_size)

  @pytest.mark.slow  # Statistics over thousands of draws: the default run.
  def test_frequencies_follow_softmax(self):
    rows = 20000
    for temperature in (1.0, 0.5, 2.0):
      counts = self.first_char_counts(rows, temperature=temperature)
      expected = tf.nn.softmax(self.logits / temperature).numpy()
      total_variation = 0.5 * np.abs(counts / rows - expected).sum()
      self.assertLess(total_variation, 0.03, f"T={temperature}")

  @pytest.mark.slow  # Statistics over thousands of draws: the default run.
  def test_top_k_and_top_p_stay_in_support(self):
    order = np.argsort(-self.logits)
    counts = self.first_char_counts(4000, top_k=3)
    self.assertEqual(set(np.nonzero(counts)[0]), set(order[:3]))
    probs = tf.nn.softmax(self.logits).numpy()[order]
    nucleus = int(np.searchsorted(np.cumsum(probs), 0.6) + 1)
    counts = self.first_char_counts(4000, top_p=0.6)
    self.assertTrue(set(np.nonzero(counts)[0]) <= set(order[:nucleus]))
    self.assertLen(set(np.nonzero(counts)[0]), nucleus)


class TraceTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_no_retrace(self, jit):
    # A fresh model of a stack the file's other tests use: its programs are
    # shared, so the test costs no trace of its own (only counts them).
    layers = STACKS["gru_reset_after"]
    model = kr.rnnstep_model(kr.build(layers, seed=1), layers)
    calls = [
        dict(prompts=["AB"], num_steps=5),
        dict(prompts=["ABCDEFG", "X"], num_steps=9, temperature=0.0),
        dict(prompts=["A"] * 5, num_steps=30, temperature=0.7, top_k=3, seed=1),
        dict(prompts=["QQ", "WWW"], num_steps=2, top_p=0.5, seed=[1, 2]),
        dict(prompts=["LONGER PROMPT " * 4], num_steps=70, stop=["A", "BC"]),
    ]
    generator = generator_lib.cached(model, paths.from_jit_compile(jit))
    rnnstep.generate(model, jit_compile=jit, **calls[0])
    list(rnnstep.stream(model, ["AB", "C"], 20, chunk_size=6, jit_compile=jit))
    # Programs are shared per architecture (another test may have traced
    # them): no call after the first of each function traces again.
    first = (generator.generate_fn.experimental_get_tracing_count(),
             generator.continue_fn.experimental_get_tracing_count())
    self.assertGreaterEqual(min(first), 1)
    for kwargs in calls[1:]:
      rnnstep.generate(model, jit_compile=jit, **kwargs)
    list(rnnstep.stream(model, ["ABC", "D", "E"], 25, chunk_size=4,
                        jit_compile=jit))
    self.assertEqual(
        (generator.generate_fn.experimental_get_tracing_count(),
         generator.continue_fn.experimental_get_tracing_count()), first)


  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_models_of_one_architecture_share_their_programs(self, jit):
    # A reloaded or retrained model of the same shape (other weights) runs
    # the first one's compiled programs with its own weights: no new trace,
    # and each model's greedy text is its own Keras model's.
    layers = STACKS["lstm_then_gru"]  # (One the file already compiles.)
    keras_models = [kr.lively(kr.build(layers, seed=seed))
                    for seed in (11, 12)]
    models = [kr.rnnstep_model(k, layers) for k in keras_models]
    path = paths.from_jit_compile(jit)
    prompt = "ROMEO"
    texts, counts = [], []
    for model in models:
      texts.append(rnnstep.generate(model, prompt, 40, temperature=0.0,
                                    jit_compile=jit))
      generator = generator_lib.cached(model, path)
      counts.append(generator.generate_fn.experimental_get_tracing_count())
      self.assertIs(generator.programs,
                    generator_lib.cached(models[0], path).programs)
    self.assertEqual(counts, [1, 1])
    for keras_model, model, text in zip(keras_models, models, texts):
      want = model.decode(kr.greedy(keras_model, model.encode(prompt), 40))
      self.assertEqual(text, want)
    self.assertNotEqual(texts[0], texts[1])
    # Scoring and hidden states share theirs too.
    for model in models:
      rnnstep.logits(model, [model.encode(prompt)])
      rnnstep.hidden_states(model, prompt)
    score = model_lib.score_function(models[1])
    sequences = functions_lib.sequence_function(models[1])
    self.assertEqual(score.experimental_get_tracing_count(), 1)
    self.assertEqual(sequences.experimental_get_tracing_count(), 1)

  @pytest.mark.slow  # XLA and elementwise programs.
  @pytest.mark.usefixtures("unpinned_default_path")
  def test_default_path_traces_each_path_once(self):
    if paths.gpu_visible():
      self.skipTest("with a GPU the default is XLA at every batch")
    layers = STACKS["gru_reset_after"]  # Its batch-1 programs are made.
    model = kr.rnnstep_model(kr.build(layers, seed=1), layers)
    # Batch sizes in every float32 band (paths.FASTEST_PATHS): xla, elementwise.
    for batch in (1, 3, 20, 40, 64, 2):
      rnnstep.generate(model, ["AB"] * batch, 4, seed=1)
    cache = generator_lib._CACHE[model]  # pylint: disable=protected-access
    # The graph path: where XLA's calls run while their programs compile
    # (rnnstep/engine/compiling.py).
    self.assertEqual(set(cache), {"xla", "elementwise", "graph"})
    for generator in cache.values():
      self.assertEqual(generator.generate_fn.experimental_get_tracing_count(), 1)

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_one_shot_programs_trace_only_the_loop_their_request_takes(self,
                                                                     jit):
    """rnnstep-generate's programs (`generator.one_tail`): each call runs a
    program traced with only the decode loop its request takes (the plain
    one; the general one for an option the plain loop lacks or for scores),
    a stream's continuations too, with the library's texts and scores."""
    layers = STACKS["gru_x2"]  # (One the file already compiles.)
    model = kr.rnnstep_model(kr.build(layers, seed=3), layers)
    calls = [
        dict(temperature=0.0),
        dict(temperature=0.8, seed=4, return_scores=True),
        dict(temperature=0.9, seed=5, top_k=4),
        dict(temperature=0.0, window=4),  # Over windows: their functions.
    ]
    streams = [dict(seed=6), dict(seed=7, window=5, top_p=0.8)]
    prompts = ["ROMEO", "A"]
    want = [rnnstep.generate(model, prompts, 30, jit_compile=jit, **kwargs)
            for kwargs in calls]
    want_chunks = [list(rnnstep.stream(model, prompts, 30, chunk_size=7,
                                       jit_compile=jit, **kwargs))
                   for kwargs in streams]
    programs = generator_lib.cached(model, paths.from_jit_compile(jit)).programs
    with generator_lib.one_tail():
      got = [rnnstep.generate(model, prompts, 30, jit_compile=jit, **kwargs)
             for kwargs in calls]
      chunks = [list(rnnstep.stream(model, prompts, 30, chunk_size=7,
                                    jit_compile=jit, **kwargs))
                for kwargs in streams]
    self.assertEqual(got, want)
    self.assertEqual(chunks, want_chunks)
    self.assertEqual(
        {name: [programs.traced(f"{name}/{tail}")
                for tail in ("plain", "general")]
         for name in generator_lib.ONE_TAIL_FUNCTIONS},
        {"generate_fn": [True, True], "continue_fn": [True, False],
         "window_fn": [True, True], "window_continue_fn": [False, True]})
    # Each traced one decode loop: a graph of about half the nodes.
    nodes = lambda name: sum(
        len(f.node_def) for f in programs.concrete(name).graph.as_graph_def(
        ).library.function)
    whole = nodes("generate_fn")
    self.assertLess(nodes("generate_fn/plain"), whole * 0.6)
    self.assertLess(nodes("generate_fn/general"), whole)
    # Outside it, the library's one program for every request again.
    self.assertEqual(rnnstep.generate(model, prompts, 30, jit_compile=jit,
                                      **calls[2]), want[2])


class StreamAndStopTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_stream_chunks_join_to_one_shot(self, jit):
    _, model = models("lstm_then_gru")
    prompts = ["ABC", "HELLO THERE"]
    whole = rnnstep.generate(model, prompts, 75, seed=4, top_k=10, jit_compile=jit)
    chunks = list(rnnstep.stream(model, prompts, 75, chunk_size=16, seed=4,
                                 top_k=10, jit_compile=jit))
    self.assertLen(chunks, 5)
    self.assertEqual(["".join(c[i] for c in chunks) for i in range(2)], whole)
    pieces = list(rnnstep.stream(model, "ABC", 75, chunk_size=16, seed=4,
                                 top_k=10, jit_compile=jit))
    self.assertEqual("".join(pieces), whole[0])

  @parameterized.named_parameters(*[(n, n) for n in STACKS])
  @pytest.mark.slow  # Two paths; one stack by default, every stack exhaustive.
  @quick_cases("lstm_then_gru")
  def test_elementwise_chunks_join_to_the_xla_text(self, name):
    # The elementwise loop chooses before it consumes (its carry's state has
    # consumed the last id): with a first layer it fuses (GRU reset_after,
    # LSTM, SimpleRNN) or steps after the call (GRU reset_after=False), and
    # with layers above, chunks of 1 and 7 steps join to the one-shot text of
    # the loop that consumes first.
    _, model = models(name)
    prompts = ["ABC", "HELLO THERE", "Q"]
    want = rnnstep.generate(model, prompts, 30, seed=9, temperature=0.8,
                            jit_compile=True)
    self.assertEqual(rnnstep.generate(model, prompts, 30, seed=9,
                                      temperature=0.8,
                                      jit_compile="elementwise"), want)
    for chunk_size in (1, 7):
      chunks = list(rnnstep.stream(model, prompts, 30, chunk_size=chunk_size,
                                   seed=9, temperature=0.8,
                                   jit_compile="elementwise"))
      self.assertEqual(["".join(c[i] for c in chunks) for i in range(3)], want)

  @parameterized.parameters(*PATHS)
  @quick_cases(0)  # The graph path.
  def test_stop_strings(self, jit):
    _, model = models("gru_reset_after")
    free = rnnstep.generate(model, ["AB", "XY"], 300, seed=8, jit_compile=jit)
    stop = free[0][40:42]
    stopped = rnnstep.generate(model, ["AB", "XY"], 300, seed=8, stop=stop,
                               jit_compile=jit)
    for full, cut in zip(free, stopped):
      end = full.find(stop)
      expected = full if end < 0 else full[:end + len(stop)]
      self.assertEqual(cut, expected)
    streamed = list(rnnstep.stream(model, ["AB", "XY"], 300, chunk_size=7, seed=8,
                                   stop=stop, jit_compile=jit))
    self.assertEqual(["".join(c[i] for c in streamed) for i in range(2)], stopped)

  def test_stop_automaton_overlapping_patterns(self):
    table, accept = stopping.stop_automaton([[1, 1, 2], [1, 3]], 4)
    def run(seq):
      state = 0
      for i, token in enumerate(seq):
        state = table[state, token]
        if accept[state]:
          return i
      return None
    self.assertEqual(run([1, 1, 1, 2]), 3)
    self.assertEqual(run([1, 1, 3]), 2)
    self.assertIsNone(run([1, 2, 1, 1, 0, 2]))

  def test_zero_steps(self):
    _, model = models("gru_reset_after")
    self.assertEqual(rnnstep.generate(model, ["A", "B"], 0), ["", ""])
    self.assertEqual(rnnstep.generate(model, "A", 0), "")


class StepTest(tf.test.TestCase, parameterized.TestCase):
  """`Generator.step` / `zero_state`, the research entry points, per path."""

  @parameterized.named_parameters(*[(f"{n}_{mode}", n, jit) for n in STACKS
                                     for mode, jit in zip(
                                         ("graph", "xla", "elementwise"), PATHS)])
  @quick_cases("gru_reset_after_graph")
  def test_step_logits_match_keras_over_a_sequence(self, name, jit):
    keras_model, model = models(name)
    ids = np.random.default_rng(1).integers(0, 65, [3, 30]).astype(np.int32)
    want = keras_model(ids, training=False).numpy()
    generator = generator_lib.cached(model, paths.from_jit_compile(jit))
    state = generator.zero_state(3)
    widths = [u for layer in STACKS[name] for u in
              [layer.units] * (2 if layer.kind == "lstm" else 1)]
    self.assertEqual([t.shape.as_list() for s in state for t in s],
                     [[3, u] for u in widths])
    self.assertAllEqual(tf.concat([t for s in state for t in s], 1),
                        np.zeros([3, sum(widths)]))
    for t in range(ids.shape[1]):
      logits, state = generator.step(tf.constant(ids[:, t]), state)
      self.assertAllClose(logits, want[:, t], atol=1e-5, rtol=0,
                          msg=f"step {t}")


@functools.lru_cache(maxsize=None)
def bundled_reference():
  data = model_file.read(rnnstep.bundled_model_path())
  return nr.Reference(*nr.tensors_of_file(data))


class ReducedPrecisionTest(tf.test.TestCase, parameterized.TestCase):
  """bfloat16 and float16 against the float64 numpy forward (no identity
  assumed: the error and the agreement are measured and bounded)."""

  # Largest |logit - float64 logit| seen on these stacks (measured: bfloat16
  # 8.0e-3, float16 9.7e-4), with margin; and a floor that proves the reduced
  # dtype is really used (float32 errs by < 1e-6 here).
  ERROR_BOUNDS = {"bfloat16": (1e-4, 2e-2), "float16": (1e-5, 3e-3)}

  # Every stack and dtype on the graph path, and every path on one stack per
  # dtype: each pair of (stack, dtype, path) values (the step logits of each
  # stack on every path in float32 are StepTest's).
  @parameterized.named_parameters(*[
      (f"{n}_{d}", n, d, PATHS if n == "lstm_then_gru" else PATHS[:1])
      for n in STACKS for d in ("bfloat16", "float16")])
  @pytest.mark.slow  # Every path; every stack is exhaustive.
  @quick_cases("lstm_then_gru_bfloat16", "lstm_then_gru_float16")
  def test_step_logits_within_bounds_of_float64(self, name, dtype, jits):
    keras_model, _ = models(name)
    layers = STACKS[name]
    reference = nr.Reference(kr.weights_of(keras_model, layers), layers)
    model = kr.rnnstep_model(keras_model, layers, dtype=dtype)
    ids = np.random.default_rng(0).integers(0, 65, [3, 40]).astype(np.int32)
    want = np.stack([reference.logits(row) for row in ids])
    low, high = self.ERROR_BOUNDS[dtype]
    for jit in jits:
      generator, out = generator_lib.cached(model, paths.from_jit_compile(jit)), []
      state = generator.zero_state(3)
      for t in range(ids.shape[1]):
        logits, state = generator.step(tf.constant(ids[:, t]), state)
        out.append(logits.numpy())
      got = np.stack(out, 1)
      error = np.abs(got - want).max()
      self.assertBetween(error, low, high, f"jit_compile={jit}")
      agreement = (got.argmax(-1) == want.argmax(-1)).mean()
      self.assertGreaterEqual(agreement, 0.95, f"jit_compile={jit}")

  # On the bundled model (real weights, real text), greedy from "ROMEO:":
  # measured per-step agreement 0.987 (bfloat16; first divergence at step 96,
  # every disagreement a near-tie with a float64 gap < 1e-3) and 1.0 (float16).
  # The bounds on the gap are those of test_api's batch of 256 real prompts
  # (worst gaps measured there: bfloat16 0.060, float16 0.0024).
  GAP_BOUNDS = {"bfloat16": 0.15, "float16": 0.02}

  @parameterized.parameters(*GAP_BOUNDS)
  @pytest.mark.exhaustive  # The bundled model's programs in each dtype, every
  # path (the default run checks reduced precision on every path with
  # test_step_logits_within_bounds_of_float64, and test_paths at batch 256).
  def test_greedy_text_agrees_with_float64_on_every_path(self, dtype):
    model = rnnstep.load(dtype=dtype)
    reference = bundled_reference()
    prompt, steps = "ROMEO:", 300
    prompt_ids = model.encode(prompt)
    texts = {jit: rnnstep.generate(model, prompt, steps, temperature=0,
                                   jit_compile=jit) for jit in PATHS + (None,)}
    texts["stream"] = "".join(rnnstep.stream(
        model, prompt, steps, chunk_size=100, temperature=0))
    for how, text in texts.items():
      agreement, gap, first = reference.greedy_agreement(
          prompt_ids, model.encode(text))
      self.assertGreaterEqual(agreement, 0.95, (how, first))
      self.assertLessEqual(gap, self.GAP_BOUNDS[dtype], (how, first))
      self.assertGreaterEqual(first, 50, how)

  @pytest.mark.exhaustive  # test_step_logits_within_bounds_of_float64's
  # floor proves the same by default.
  def test_bfloat16_really_rounds(self):
    """The reduced dtype is used: bfloat16 scores a text other than float32
    does, on each path, by far more than float32's rounding. (Its greedy
    text need not part from float32's: on an AVX2 ISA, where TensorFlow
    runs without oneDNN, the bundled model's did not in 1,000 characters.)"""
    pair = [("ROMEO: what light", " through yonder window breaks")]
    for jit_compile in (False, True, "elementwise"):
      full = rnnstep.loglikelihood(rnnstep.load(), pair,
                                   jit_compile=jit_compile)[0][0]
      half = rnnstep.loglikelihood(rnnstep.load(dtype="bfloat16"), pair,
                                   jit_compile=jit_compile)[0][0]
      self.assertGreater(abs(full - half), 1e-3, jit_compile)


if __name__ == "__main__":
  tf.test.main()


@pytest.mark.slow  # a fresh interpreter
class CrossProcessTest(tf.test.TestCase):

  def test_same_seed_same_text_in_another_process(self):
    import os, subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
    layers = STACKS["gru_reset_after"]
    keras_model, model = models("gru_reset_after")
    path = os.path.join(self.create_tempdir().full_path, "m.npz")
    model_file.write(path, model.config, model.vocab,
                     kr.weights_of(keras_model, layers))
    script = ("import sys, rnnstep; m = rnnstep.load(sys.argv[1]); "
              "print(repr(rnnstep.generate(m, ['AB', 'CD'], 80, seed=42, top_p=0.9)))")
    result = subprocess.run([sys.executable, "-c", script, path],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    here = rnnstep.generate(rnnstep.load(path), ["AB", "CD"], 80, seed=42, top_p=0.9)
    self.assertEqual(result.stdout.strip(), repr(here))
