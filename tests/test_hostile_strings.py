"""Hostile strings (issue 47): what a client can put in `prompt`, `stop` and
`regex` is refused in one line naming that argument, within the build's
budgets, whatever it holds (lone surrogates, deep nesting, absurd repeats,
huge classes, patterns whose automaton explodes); a pattern's automaton is
refused while it is being built, and its build stops at a thread's deadline
or cancellation.

References: interegular's own construction (`to_fsm().reduce()`), the
automaton `regex_dfa` must equal (up to the numbering of states), on the
patterns of the test suite and on random ones; Python's `re.fullmatch` for a
pattern interegular could not build in time.
"""

import functools
import re
import threading
import time

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest

import rnnstep
from rnnstep import api
from rnnstep import errors
from rnnstep.decoding import constraints
from rnnstep.decoding import regex_dfa
from rnnstep.engine import host
from rnnstep.model import model_file
from rnnstep.model import vocabulary

# How long a refusal takes is the benchmark's to measure
# (tools/bench/serve_hostile.py's regex cases, under load), not a wall-clock
# bound here: what bounds a build is regex_dfa.Meter's states and work,
# counted, which these tests reach.
CONFIG = model_file.ModelConfig(8, (model_file.LayerConfig("gru", 8),))


@functools.lru_cache(maxsize=None)
def _model(kind, directory):
  """The bundled character model, or a tiny token model of `kind`."""
  if kind == "characters":
    return rnnstep.load()
  if kind == "bytes":
    tokens = vocabulary.Tokens("bytes", vocabulary.bytes_vocab())
  elif kind == "words":
    tokens = vocabulary.Tokens("words", ["<eos>", "the", "cat", "a", "b"],
                               {"newline": "<eos>"})
  else:
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
        add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator(["the cat sat on a mat, naïve café\n"] * 4,
                            tokenizers.trainers.BpeTrainer(vocab_size=280))
    size = bpe.get_vocab_size()
    tokens = vocabulary.Tokens(
        "subword", [bpe.id_to_token(i) for i in range(size)],
        {"tokenizer": bpe.to_str()})
  rng = np.random.default_rng(0)
  tensors = {k: rng.normal(size=s).astype(np.float32)
             for k, s in CONFIG.expected_shapes(len(tokens.vocab)).items()}
  path = f"{directory}/{kind}.npz"
  model_file.write(path, CONFIG, list(tokens.vocab), tensors, tokens)
  return rnnstep.load(path)


@pytest.fixture(scope="module", params=["characters", "bytes", "words",
                                        "subword"])
def model(request, tmp_path_factory):
  return _model(request.param, str(tmp_path_factory.getbasetemp()))


def serve_checks(model, prompt="the", stop=None, regex=None):
  """What the server runs on a request before admitting it
  (`rnnstep/serve/checks.py`): the library's checks, the prompt's ids, the stop
  automaton and the pattern's table."""
  prompts, options = api.check_request(model, [prompt], 4, stop=stop,
                                       regex=regex)
  host.prompt_batch(model, prompts)
  host.stop_automaton(model, options.stop)
  if options.regex:
    constraints.combine(model, options.regex)


def refusal(argument, call):
  """`call`'s ArgumentError message, checked: names `argument`, one line, and
  text a server can send (UTF-8)."""
  with pytest.raises(errors.ArgumentError) as caught:
    call()
  message = str(caught.value)
  assert caught.value.argument == argument, message
  assert "\n" not in message and message.encode("utf-8")
  return message


# Each row: a pattern, and words of its refusal. Today's answers (before
# this change, same machine): the first two ran for minutes, the nesting and
# the repeat count escaped as RecursionError and OverflowError, the class
# ran for over a minute in 1.4 GiB.
HOSTILE_PATTERNS = (
    ("[ab]*a[ab]{20}", "DFA states while being built"),
    ("(a|b)*a(a|b){15}", "DFA states while being built"),
    ("(a|b|c|d)*a(a|b|c|d){14}", "DFA states while being built"),
    ("(" * 2000 + "a" + ")" * 2000, "nests groups 2000 deep"),
    ("a{4294967295}", "repetition number is too large"),
    ("a{99999999999999999999}", "repetition number is too large"),
    ("(?:a{1000}){1000}", "1000000 character positions"),
    ("a{1000}{1000}", "multiple repeat"),
    ("|".join(f"w{i}x{i}y" for i in range(1500)), "character positions"),
    ("[\x00-\U0010ffff]", "names 1114112 characters in its classes"),
    ("[\u0100-\uffff]" * 2, "characters in its classes"),
    ("a?" * 4000 + "b", "steps to build"),
    ("a" * 20000, "20000 characters long"),
    ("(a)\\1", "not supported"),
    ("(?<=a)b", "look-around"),
    ("(?>a)b", "atomic group or a possessive repeat"),
    ("a*+", "atomic group or a possessive repeat"),
    ("(a)?(?(1)b|c)", "not supported"),
    ("\\p{L}", "does not compile"),
    ("(?m:a)", "not supported"),
    ("(?x:a b)", "not supported"),
    ("\ud800", "lone surrogate U+D800 at position 0"),
    ("a[\udfff]", "lone surrogate U+DFFF at position 2"),
)


@pytest.mark.parametrize("pattern, words", HOSTILE_PATTERNS,
                         ids=lambda value: ascii(value)[:30])
def test_hostile_patterns_are_refused_quickly(pattern, words):
  model = _model("characters", "")
  message = refusal("regex", lambda: serve_checks(model, regex=pattern))
  assert words in message


def test_a_small_automaton_interegular_cannot_reduce_compiles():
  """22 states, but 2^21 reversed: interegular's reduction (reversing
  twice) ran for minutes; Hopcroft's takes milliseconds."""
  model = _model("characters", "")
  pattern = "[ab]{20}a[ab]*"
  dfa = constraints.combine(model, [pattern])
  rng = np.random.default_rng(1)
  for _ in range(300):
    text = "".join(rng.choice(["a", "b"], size=rng.integers(1, 26)))
    state = dfa.start[0]
    for i in model.encode(text):
      state = dfa.table[state, i]
    # A prefix of a match: up to 20 characters, or an "a" 21st.
    assert (state != constraints.DEAD) == (len(text) <= 20
                                           or text[20] == "a"), text
    assert not dfa.ends[state]


def test_the_deepest_nesting_allowed_compiles_from_a_deep_stack():
  """The parsers recurse on groups: `MAX_NESTING` leaves a caller (a
  server's thread) 300 frames and more of Python's 1000."""
  model = _model("characters", "")
  depth = constraints.MAX_NESTING
  pattern = "(" * depth + "ab" + ")" * depth

  def nested(frames):
    return nested(frames - 1) if frames else constraints.combine(
        model, [pattern])

  assert nested(300).table.shape[0] == 2 + 3
  refusal("regex", lambda: constraints.combine(
      model, ["(" + pattern + ")"]))


@pytest.mark.parametrize("argument", ["prompts", "stop", "regex"])
def test_lone_surrogates_are_refused_naming_their_argument(model, argument):
  text = "a\ud800b"
  given = {"prompts": dict(prompt=text), "stop": dict(stop=["ok", text]),
           "regex": dict(regex=text)}[argument]
  message = refusal(argument, lambda: serve_checks(model, **given))
  assert "U+D800" in message or "\\ud800" in message, message


def test_not_text():
  assert errors.not_text("caf\u00e9 \U0001f600") == ""
  assert errors.not_text("ab\udc80") == (
      "a lone surrogate U+DC80 at position 2, which is not text (it has no "
      "UTF-8 encoding)")


# Limits: a deadline and a cancellation per thread.
def test_a_build_past_its_deadline_is_refused_naming_regex():
  model = _model("characters", "")
  with constraints.limits(deadline=time.monotonic() - 1):
    message = refusal("regex", lambda: constraints.combine(
        model, ["(a|b)*a(a|b){11}"]))
  assert "took over 0 s to build" in message
  # Not cached as refused: without the deadline it compiles.
  assert constraints.combine(model, ["(a|b)*a(a|b){11}"]).table.shape[0] > 2


def test_a_cancelled_build_raises_cancelled_on_its_thread_only():
  model = _model("characters", "")
  cancelled = threading.Event()
  cancelled.set()
  entered, checked = threading.Event(), threading.Event()
  outcome = {}

  def cancelled_check():
    with constraints.limits(cancelled=cancelled):
      entered.set()
      checked.wait(30)
      try:
        constraints.combine(model, ["(a|b)*a(a|b){10}c"])
        outcome["result"] = "compiled"
      except constraints.Cancelled:
        outcome["result"] = "cancelled"

  thread = threading.Thread(target=cancelled_check)
  thread.start()
  entered.wait(30)
  # This thread's builds do not see the other's limits.
  assert constraints.combine(model, ["(a|b)*a(a|b){10}d"]).table.shape[0] > 2
  checked.set()
  thread.join(30)
  assert outcome == {"result": "cancelled"}


def test_limits_nest_the_earlier_deadline_and_either_event():
  outer, inner = threading.Event(), threading.Event()
  with constraints.limits(deadline=time.monotonic() + 100, cancelled=outer):
    with constraints.limits(deadline=time.monotonic() - 1, cancelled=inner):
      with pytest.raises(regex_dfa.TimeUp):
        regex_dfa.poll()
      outer.set()
      with pytest.raises(constraints.Cancelled):
        regex_dfa.poll()
    outer.clear()
    regex_dfa.poll()  # The outer deadline is far.
  regex_dfa.poll()  # No limits.


# The automaton against interegular's own construction.
def _canonical(start, step, final, probes):
  """A DFA numbered breadth-first over `probes` (characters): equal for
  automata equal up to their states' numbering."""
  number, order, rows = {start: 0}, [start], []
  for state in order:
    row = []
    for char in probes:
      target = step(state, char)
      if target is not None and target not in number:
        number[target] = len(order)
        order.append(target)
      row.append(None if target is None else number[target])
    rows.append((final(state), tuple(row)))
  return rows


def assert_same_automaton(pattern):
  import interegular  # pylint: disable=g-import-not-at-top
  from interegular import fsm as ifsm  # pylint: disable=g-import-not-at-top
  theirs = interegular.parse_pattern(pattern).to_fsm().reduce()
  ours = regex_dfa.build(interegular.parse_pattern(pattern),
                         constraints.MAX_POSITIONS,
                         constraints.MAX_BUILD_STATES,
                         constraints.MAX_BUILD_WORK)
  probes = sorted({c for c in theirs.alphabet
                   if c is not ifsm.anything_else and len(c) == 1}
                  | {c for c in ours.keys if len(c) == 1} | {"\uffff"})

  def their_step(state, char):
    return theirs.map.get(state, {}).get(theirs.alphabet[char])

  def our_step(state, char):
    target = ours.table[state, ours.key(char)]
    return None if target < 0 else int(target)

  assert _canonical(0, our_step, lambda s: bool(ours.finals[s]), probes) == (
      _canonical(theirs.initial, their_step, lambda s: s in theirs.finals,
                 probes)), pattern


@pytest.mark.parametrize("pattern", [
    r"[a-e]+(, [a-e]+)*\.", r"([a-e]+ )+[f-j]+\.", r"(ab|c)*d?[hij]{2,3}",
    r"a\.|b+", "a{50}", "(a|b)*a(a|b){5}", "[ab]{8}a[ab]*", "(?i:ab)c",
    "(?i:[a-cX])+", "(?s:.)x.", "[^ab]+c", r"\d\w\s\D\W\S", r"[a\D]x",
    r"[^a\d]", "(x+x+)+y", "a?b?c?d?e?", "(a{2,4}|b{0,3})*c", "z+",
    "(abc|abd|aef)g", r"[\w-]+@[\w-]+\.(com|org)", "(?:(?:a|b)c?){3,}",
    "()", "a|", r"[^\n]*\n", "x{0,5}y{3}", "(?P<n>ab)+?c*?", "caf\u00e9",
    "[\u4e00-\u4e0f]{2}", r"\x41\101[\]\-]", "a{,3}b{2,}"])
def test_the_automaton_is_interegulars(pattern):
  assert_same_automaton(pattern)


_ATOMS = st.sampled_from(["a", "b", "c", ".", "[ab]", "[^a]", r"\d", "\\.",
                          "(?i:a)", "(?s:.)", "[a-c]", "\n"])


def _quantified(inner):
  return st.tuples(inner, st.sampled_from(
      ["", "*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}", "*?"])).map(
          lambda t: f"(?:{t[0]}){t[1]}")


_PATTERNS = st.recursive(
    _ATOMS,
    lambda inner: (st.lists(_quantified(inner), min_size=1, max_size=3)
                   .map("".join)
                   | st.lists(inner, min_size=2, max_size=3).map("|".join)),
    max_leaves=8)


# Derandomized: the same draws every run. A fresh seed can draw a pattern
# whose reference construction (interegular's, unbounded: the blow-up our
# builder bounds) runs for many minutes: a quick-tier run stalled on one.
@settings(max_examples=150, deadline=None, derandomize=True)
@given(pattern=_PATTERNS)
def test_random_patterns_give_interegulars_automaton(pattern):
  assert_same_automaton(pattern)


# Random strings through the server's checks: an ArgumentError naming the
# argument, or success; never another exception.
_HOSTILE_CHARS = st.sampled_from(list("ab ()[]{}*+?|\\^$.-,:=!<>#0123456789")
                                 + ["\ud800", "\udfff", "\x00", "\n",
                                    "\u00e9", "\U0001f600", "?P<", "(?"])
_HOSTILE_TEXT = st.lists(_HOSTILE_CHARS, max_size=24).map("".join)


@settings(max_examples=120, deadline=None)
@given(prompt=_HOSTILE_TEXT, stop=st.none() | _HOSTILE_TEXT
       | st.lists(_HOSTILE_TEXT, max_size=3),
       regex=st.none() | _HOSTILE_TEXT | _PATTERNS)
def test_random_strings_raise_only_argument_errors(model, prompt, stop,
                                                    regex):
  try:
    serve_checks(model, prompt=prompt, stop=stop, regex=regex)
  except errors.ArgumentError as e:
    assert e.argument in ("prompts", "stop", "regex"), e
    assert "\n" not in str(e) and str(e).encode("utf-8")
