"""Every decoding option through the LiteRT artifact, as rnnstep-generate's
warm path runs it (`litert_runner.run_artifact`: the inputs and tables built
with numpy, no TensorFlow), against `rnnstep.generate`: the same text.

One artifact per model (a character, a word and a byte model), converted
once for the file; each case is one interpreter call and one library call.
"""

import pytest

from tests.support import cli as cli_support
from tests.support import token_models
import rnnstep
from rnnstep import errors
from rnnstep.decoding import options as options_lib
from rnnstep.litert import export as litert
from rnnstep.litert import inputs as litert_inputs
from rnnstep.litert import runner as litert_runner

pytest.importorskip("ai_edge_litert.interpreter",
                    reason="ai_edge_litert is not installed")
# Three LiteRT conversions.
pytestmark = pytest.mark.slow

STEPS = 24
PROMPTS = {"characters": ["ROMEO:", "To be"],
           "words": ["the cat", "a dog ran"],
           "bytes": ["the cat", "naïve"]}
# A pattern over each model's text (a byte model's: ASCII only).
PATTERNS = {"characters": r"[a-z ,]+[.!?]", "words": r"( [a-z0-9]+)+",
            "bytes": r"[a-z ]+"}
CASES = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.9, seed=7, top_k=20, top_p=0.9),
    "repetition_penalty": dict(temperature=0.9, seed=3,
                               repetition_penalty=1.4),
    "repetition_window": dict(temperature=0.9, seed=3, repetition_penalty=1.4,
                              repetition_window=4),
    "no_repeat_ngram_size": dict(temperature=0.9, seed=3,
                                 no_repeat_ngram_size=2),
    "openai_penalties": dict(temperature=0.9, seed=3, frequency_penalty=0.7,
                             presence_penalty=[1.2, -0.5]),
    "min_p": dict(temperature=1.2, seed=5, min_p=0.1),
    "typical_p": dict(temperature=1.0, seed=5, typical_p=0.8),
    "per_row": dict(temperature=[0.3, 1.5], seed=-9, top_k=[0, 5],
                    top_p=[0.8, 1.0], min_p=[0.0, 0.05],
                    typical_p=[1.0, 0.9], repetition_penalty=[1.3, 1.0]),
    "stop": dict(temperature=0.8, seed=11, stop="from_text"),
    "regex": dict(temperature=0.8, seed=11, regex="pattern"),
    "everything": dict(temperature=[0.7, 1.1], seed=2**31 - 1,
                       stop="from_text", regex="pattern",
                       repetition_penalty=1.2, repetition_window=8,
                       no_repeat_ngram_size=3, min_p=0.02, typical_p=0.95,
                       top_k=40),
    "beams": dict(num_beams=3),
    "beams_constrained": dict(num_beams=2, length_penalty=0.5,
                              stop="from_text", regex="pattern",
                              repetition_penalty=1.3,
                              no_repeat_ngram_size=2),
}


def write_model(kind, directory) -> str:
  """A small model file of `kind` (the CLI tests' GRU; the token tests')."""
  if kind == "words":
    return token_models.write_words(directory / "words.npz")
  if kind == "bytes":
    return token_models.write_bytes(directory / "bytes.npz")
  cli_support.write_model(directory / "chars.npz", seed=3)
  return str(directory / "chars.npz")


@pytest.fixture(scope="module", params=list(PROMPTS))
def artifact(request, tmp_path_factory):
  """(kind, model, flatbuffer, the runner's tokens) of one model kind."""
  model = rnnstep.load(write_model(
      request.param, tmp_path_factory.mktemp("litert_options")))
  # What the cache's manifest gives the runner: a token model's Tokens.
  tokens = None if model.is_characters else model.tokens
  return request.param, model, litert.convert(model), tokens


def resolve(kind, model, options):
  """A case's options with its stop strings (each row's own, from the text
  the same seed gives without them, so that every row stops) and pattern."""
  options = dict(options)
  if options.get("regex") == "pattern":
    options["regex"] = PATTERNS[kind]
  if options.get("stop") == "from_text":
    plain = dict(options, stop=None)
    if plain.get("num_beams", 1) > 1:
      plain["num_return_sequences"] = 1
    texts = [t[0] if isinstance(t, list) else t for t in rnnstep.generate(
        model, PROMPTS[kind], STEPS, jit_compile=False, **plain)]
    options["stop"] = [t[len(t) // 2:len(t) // 2 + 2] for t in texts
                       if len(t) >= 4] or ["e"]
  return options


@pytest.mark.parametrize("case", list(CASES))
def test_the_warm_runner_gives_the_library_s_text(artifact, case):
  kind, model, flatbuffer, tokens = artifact
  options = resolve(kind, model, CASES[case])
  prompts = PROMPTS[kind]
  got = litert_runner.run_artifact(flatbuffer, list(model.vocab), prompts,
                                   STEPS, tokens=tokens,
                                   **dict(options, seed=options.get("seed", 0)))
  beams = options.get("num_beams", 1)
  want = rnnstep.generate(model, prompts, STEPS, jit_compile=False,
                          **(dict(options, num_return_sequences=beams)
                             if beams > 1 else options))
  if beams > 1:
    want = [text for texts in want for text in texts]
  assert got == want
  if options.get("stop") and beams == 1:  # The stop table is in use.
    assert any(text.endswith(tuple(options["stop"])) for text in got)


def test_zero_steps_give_empty_rows(artifact):
  kind, model, flatbuffer, tokens = artifact
  for beams in (1, 2):
    assert litert_runner.run_artifact(
        flatbuffer, list(model.vocab), PROMPTS[kind], 0, seed=0,
        tokens=tokens, num_beams=beams, stop=["e"]) == [""] * 2 * beams


def test_refusals_are_the_library_s(artifact):
  _, model, flatbuffer, tokens = artifact
  vocab = list(model.vocab)
  for options, argument in ((dict(stop=[""]), "stop"),
                            (dict(regex="a(?=b)"), "regex"),
                            (dict(num_beams=10**6), "num_beams"),
                            (dict(top_p=0.0), "top_p")):
    with pytest.raises(errors.ArgumentError) as e:
      litert_runner.run_artifact(flatbuffer, vocab, ["a"], 5, seed=0,
                                 tokens=tokens, **options)
    assert e.value.argument == argument


def test_the_signature_declares_every_served_option():
  names = [i.name for i in litert_inputs.INPUTS]
  assert [o.name for o in options_lib.OPTIONS if o.served] == [
      n for n in names if n in options_lib.BY_NAME]
  assert litert.signature_text().startswith(
      "generate(prompt_ids: int32[?][?], prompt_lengths: int32[?], ")
