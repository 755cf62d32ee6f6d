"""Export: a self-contained SavedModel, strings in and strings out.

The exported graph holds the weights, the vocabulary's mapping of text to ids
and back and the same generation body as `Generator`, so any TensorFlow
runtime (TF Serving, `tf.saved_model.load` in a process without rnnstep or
Keras) can serve it. Signatures:

  serving_default(prompts: string [B], num_steps: int32 [], temperature:
                  float32 [], seed: int64 []) -> {"text": string [B]}
  generate_top_k_top_p(the same + top_k: int32 [], top_p: float32 [])
                  -> {"text": string [B]}
  generate_decoding(prompts, num_steps, seed + one scalar input per served
                  decoding option of `options.py`: repetition_penalty,
                  frequency_penalty, presence_penalty,
                  no_repeat_ngram_size, repetition_window, temperature,
                  top_k, top_p, min_p, typical_p, num_beams, length_penalty)
                  -> {"text": string [B], "logprob": float32 [B]}

  generate_constrained(generate_decoding's inputs + stop: string [K],
                  regex: string []) -> {"text": string [B],
                  "logprob": float32 [B]}

`generate_decoding` with num_beams > 1 returns each prompt's best beam;
"logprob" is the model's log-likelihood of the returned text (natural log,
raw logits), as `rnnstep.generate(..., return_scores=True)` gives.

`generate_constrained` adds `rnnstep.generate`'s `stop=` and `regex=`. The
stop automaton is built in the graph from the strings
(`stop_ops.StopTables`), so any stop strings serve; a token model's text is
cut at its stop string's end, as the library cuts it. A graph cannot
compile a regular expression, so the patterns are compiled at export
(`export(..., regex=[...])`, `rnnstep-export --regex`) and `regex` names one
of them ("": none; another fails the call); `assets/patterns.json` lists
them.

A token model (words, bytes, subword) also has

  generate_ids(prompt_ids: int32 [B, T] right-padded, prompt_lengths: int32
               [B], num_steps, seed + the served decoding options, as
               generate_decoding) -> {"ids": int32 [B, N], "lengths": int32
               [B], "text": string [B], "logprob": float32 [B]}

and `generate_ids_constrained` (the same + `stop`, `regex`), and its
vocabulary as assets: `assets/tokens.json` (the kind, its rules and
the tokens in id order, the form `rnnstep.load(..., vocab=)` reads) and, for
a subword model, `assets/tokenizer.json` (its Hugging Face `tokenizers`
file). The string signatures tokenize a prompt as `Tokens.encode` does, in
graph ops (`token_ops.GraphTokens`): words by the recipe's own rules, bytes
as UTF-8. A subword model's tokenizer does not run in a graph, so its
SavedModel takes ids: its `serving_default` is `generate_ids` (encode the
prompts with the `tokenizers` library and tokenizer.json). Text out is the
ids' pieces decoded as UTF-8 (U+FFFD where they are not), as
`rnnstep.generate` returns it.

Row i of a call uses the noise key (seed, i), as `rnnstep.generate(...,
seed=seed)` does, so both give the same text. A prompt character (or word,
without an OOV token) outside the vocabulary, or an empty prompt, fails the
call with InvalidArgumentError.

A model whose file records a window (`"window": k`, built for fixed windows
of k characters) is served over its windows, as `rnnstep.generate` runs it by
default; beam search, which steps a model statefully, then fails the call
with InvalidArgumentError naming num_beams.
"""

import json
import os
import tempfile

import tensorflow as tf
# NoDependency: the one way to keep an attribute of a tf.Module out of what
# tf.saved_model.save writes (there is no public spelling).
from tensorflow.python.trackable import data_structures  # pylint: disable=g-direct-tensorflow-import

from rnnstep import staging
from rnnstep import errors
from rnnstep.decoding import constraints
from rnnstep.decoding import options
from rnnstep.decoding import sampling
from rnnstep.decoding import stopping
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import paths
from rnnstep.engine import request as request_lib
from rnnstep.engine import window as window_lib
from rnnstep.exporters import stop_ops
from rnnstep.exporters import token_ops
from rnnstep.model import vocabulary


# The signature with every decoding setting and the log-likelihood output.
DECODING_SIGNATURE = "generate_decoding"

# The inputs every signature starts with, and the two of top-k/top-p.
_BASIC_INPUTS = [
    tf.TensorSpec([None], tf.string, name="prompts"),
    tf.TensorSpec([], tf.int32, name="num_steps"),
    tf.TensorSpec([], tf.float32, name="temperature"),
    tf.TensorSpec([], tf.int64, name="seed")]
_TOP_K_TOP_P_INPUTS = [tf.TensorSpec([], tf.int32, name="top_k"),
                       tf.TensorSpec([], tf.float32, name="top_p")]
# generate_decoding: one input per served option, in declaration order.
_SERVED = tuple(option for option in options.OPTIONS if option.served)
_OPTION_INPUTS = [tf.TensorSpec([], tf.as_dtype(option.dtype),
                                name=option.name) for option in _SERVED]
_DECODING_INPUTS = [tf.TensorSpec([None], tf.string, name="prompts"),
                    tf.TensorSpec([], tf.int32, name="num_steps"),
                    tf.TensorSpec([], tf.int64, name="seed")] + _OPTION_INPUTS
# generate_ids (token models): prompts as right-padded ids.
IDS_SIGNATURE = "generate_ids"
_IDS_INPUTS = [tf.TensorSpec([None, None], tf.int32, name="prompt_ids"),
               tf.TensorSpec([None], tf.int32, name="prompt_lengths"),
               tf.TensorSpec([], tf.int32, name="num_steps"),
               tf.TensorSpec([], tf.int64, name="seed")] + _OPTION_INPUTS
# The two signatures above with stop strings and a pattern added.
CONSTRAINED_SIGNATURE = "generate_constrained"
IDS_CONSTRAINED_SIGNATURE = "generate_ids_constrained"
_CONSTRAINT_INPUTS = [tf.TensorSpec([None], tf.string, name="stop"),
                      tf.TensorSpec([], tf.string, name="regex")]

# The vocabulary's assets of a token model's export.
TOKENS_ASSET = vocabulary.Tokens.TOKENS_FILE
TOKENIZER_ASSET = vocabulary.Tokens.TOKENIZER_FILE
# The patterns `generate_constrained`'s regex input may name (a JSON list).
PATTERNS_ASSET = "patterns.json"


class ServingModule(tf.Module):
  """The exported object: the model's variables, the vocabulary, the signatures.

  Args:
    model: an `rnnstep.Model`.
    jit_compile: False or None (the default, a plain graph: every TF runtime
      can run it), True (the generation body is one XLA program) or
      "elementwise" (a graph loop with XLA-compiled gate math; for bfloat16 at
      large batches). The last two need XLA where the model is served.
    regex: the patterns the constrained signatures serve (see `export`).

  Raises:
    ValueError: a bad jit_compile value, or a bad pattern
      (`errors.ArgumentError`).
  """

  def __init__(self, model, jit_compile=False, regex=()):
    super().__init__(name="rnnstep_serving")
    path = paths.from_jit_compile(jit_compile)
    self.patterns = data_structures.NoDependency(
        _check_patterns(model, regex))
    self.model = model
    # Not tracked: saving would trace and store every compiled function of
    # the Generator's programs (continuations, the server's, `step`), which
    # no signature calls; the signatures' own traces hold what they call.
    self._generator = data_structures.NoDependency(generator_lib.Generator(
        model, paths.GRAPH if path == paths.AUTO else path))
    self._no_stop = stopping.stop_automaton([], model.vocab_size)
    if model.is_characters:
      chars = [c if c != "[UNK]" else "" for c in model.vocab]
      keys = [c for c in chars if c]
      self.char_table = tf.lookup.StaticHashTable(
          tf.lookup.KeyValueTensorInitializer(
              tf.constant(keys), tf.constant([chars.index(c) for c in keys],
                                             tf.int32)),
          default_value=-1)
      self.id_to_char = tf.Variable(chars, trainable=False, name="vocab")
      strings = True
    else:
      self.tokens = token_ops.GraphTokens(model.tokens)
      strings = self.tokens.strings
    self.stops = stop_ops.StopTables(
        model, self.char_table if model.is_characters else None)
    self._add_patterns(self.patterns)
    # Traced without autograph: their control flow is explicit (tf.cond), as
    # the Generator's.
    if strings:
      self.serve = tf.function(self._serve, input_signature=_BASIC_INPUTS,
                               autograph=False)
      self.serve_top_k_top_p = tf.function(
          self._serve_top_k_top_p,
          input_signature=_BASIC_INPUTS + _TOP_K_TOP_P_INPUTS,
          autograph=False)
      self.serve_decoding = tf.function(self._serve_decoding,
                                        input_signature=_DECODING_INPUTS,
                                        autograph=False)
      self.serve_constrained = tf.function(
          self._serve_constrained,
          input_signature=_DECODING_INPUTS + _CONSTRAINT_INPUTS,
          autograph=False)
    if not model.is_characters:
      self.serve_ids = tf.function(self._serve_ids,
                                   input_signature=_IDS_INPUTS,
                                   autograph=False)
      self.serve_ids_constrained = tf.function(
          self._serve_ids_constrained,
          input_signature=_IDS_INPUTS + _CONSTRAINT_INPUTS, autograph=False)

  def _add_patterns(self, patterns):
    """The exported patterns' combined `Dfa` (as variables) and the map from
    a pattern to its start state ("": none, `FREE`)."""
    dfa = (constraints.combine(self.model, list(patterns)) if patterns
           else constraints.unconstrained(0, self.model.vocab_size))
    self.regex_table = tf.Variable(dfa.table, trainable=False,
                                   name="regex_table")
    self.regex_ends = tf.Variable(dfa.ends, trainable=False,
                                  name="regex_ends")
    self.regex_starts = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant([""] + list(patterns)),
            tf.constant([constraints.FREE] + dfa.start.tolist(), tf.int32)),
        default_value=-1)
    self._unknown_pattern = (
        f"regex: not a pattern this SavedModel was exported with (it has "
        f"{len(patterns)}, listed in assets/{PATTERNS_ASSET}; rnnstep-export "
        "--regex compiles one); an empty regex is none")

  def served_signatures(self) -> dict:
    """{signature name: tf.function}, what `export` saves: the string
    signatures where the vocabulary's rules run in a graph (every kind but
    subword), and `generate_ids` for a token model (a subword model's
    `serving_default`)."""
    out = {}
    if hasattr(self, "serve"):
      out = {"serving_default": self.serve,
             "generate_top_k_top_p": self.serve_top_k_top_p,
             DECODING_SIGNATURE: self.serve_decoding,
             CONSTRAINED_SIGNATURE: self.serve_constrained}
    if hasattr(self, "serve_ids"):
      out[IDS_SIGNATURE] = self.serve_ids
      out[IDS_CONSTRAINED_SIGNATURE] = self.serve_ids_constrained
      out.setdefault("serving_default", self.serve_ids)
    return out

  def _encode(self, prompts):
    """Prompt strings `[B]` -> (int32 ids `[B, T]`, lengths `[B]`, checks)."""
    if not self.model.is_characters:
      ids, checks = self.tokens.encode(prompts)
    else:
      chars = tf.strings.unicode_split(prompts, "UTF-8")
      ids = self.char_table.lookup(chars)
      checks = [tf.debugging.assert_non_negative(
          ids.flat_values, message="a prompt character is not in the "
          "vocabulary of the model")]
    lengths = tf.cast(ids.row_lengths(), tf.int32)
    checks.append(tf.debugging.assert_positive(lengths,
                                               message="a prompt is empty"))
    return ids.to_tensor(), lengths, checks

  def _decode(self, ids, lengths, stop=None):
    """string `[B]`: the rows' texts (a token model's cut at `stop`)."""
    if not self.model.is_characters:
      return self.tokens.decode(ids, lengths, cut=None if stop is None else (
          lambda text: self.stops.cut(text, ids, lengths, stop)))
    pieces = tf.gather(self.id_to_char, ids)
    pieces = tf.RaggedTensor.from_tensor(pieces, lengths=lengths)
    return tf.strings.reduce_join(pieces, axis=1)

  def _text(self, prompts, num_steps, seed, values, stop=None, regex=None):
    """Generates for string prompts; returns {"text", "logprob"} (see module).

    Args:
      prompts: string `[B]`.
      num_steps: int32 `[]`.
      seed: int64 `[]`.
      values: {option name: scalar tensor or Python value} for some of the
        declared options (the rest take their defaults).
      stop: string `[K]`, the stop strings; None: none.
      regex: string `[]`, an exported pattern ("": none); None: none.
    """
    prompt_ids, lengths, checks = self._encode(prompts)
    ids, out_lengths, scores = self._generate(prompt_ids, lengths, num_steps,
                                              seed, values, checks, stop,
                                              regex)
    if not self.model.is_characters and self.model.tokens.rules.get(
        "recipe") == "textgenrnn":  # Its text starts from the prompt's words.
      return {"text": self.tokens.continuation(prompts, ids, out_lengths),
              "logprob": scores}
    return {"text": self._decode(ids, out_lengths, stop), "logprob": scores}

  def _generate(self, prompt_ids, lengths, num_steps, seed, values, checks,
                stop=None, regex=None):
    """The generation itself, for prompts as right-padded ids.

    Args:
      prompt_ids: int32 `[B, T]`.
      lengths: int32 `[B]`.
      num_steps, seed, values, stop, regex: as for `_text`.
      checks: the assertions the prompts' encoding made.

    Returns:
      `(ids [B, N], lengths [B], scores [B])` of the real rows.
    """
    values = {option.name: values.get(option.name, option.default)
              for option in options.OPTIONS}
    settings = sampling.Params(**{o.name: values[o.name]
                                  for o in options.PER_ROW})
    num_beams = values["num_beams"]
    vocab_size = self.model.vocab_size
    checks = list(checks) + [
        tf.debugging.assert_non_negative(num_steps,
                                         message="num_steps must be >= 0"),
        tf.debugging.assert_less_equal(
            num_beams, vocab_size - int(self.model.has_unk),
            message="num_beams must not exceed the usable vocabulary"),
    ]
    for option in options.OPTIONS:  # The declared bounds, as graph checks.
      if isinstance(values[option.name], tf.Tensor):
        checks += option.valid.graph_checks(values[option.name], option.name)
    # The model's own window, as `rnnstep.generate` resolves it.
    window = window_lib.resolve(self.model, None)
    if window and not isinstance(num_beams, int):
      checks.append(tf.debugging.assert_less_equal(
          num_beams, 1, message=f"num_beams > 1: this model reads windows of "
          f"{window} characters, and {window_lib.BEAMS_STEP_STATEFULLY}; "
          "pass num_beams=1"))
    stops, constraint = self._no_stop, None
    if stop is not None:
      stops, stop_checks = self.stops.automaton(stop)
      start = self.regex_starts.lookup(regex)
      checks += stop_checks + [
          tf.debugging.assert_non_negative(start,
                                           message=self._unknown_pattern)]
      recipe = self.model.tokens.rules.get("recipe")
      if recipe:  # As the library refuses them (`api._check_arguments`).
        checks.append(tf.debugging.assert_equal(
            (tf.size(stop) > 0) | (regex != ""), False,
            message=vocabulary.recipe_refuses("stop", recipe)))
    with tf.control_dependencies(checks):
      prompt_ids = tf.identity(prompt_ids)
    batch = tf.shape(prompt_ids)[0]
    if stop is not None:
      constraint = constraints.Dfa(
          tf.convert_to_tensor(self.regex_table),
          tf.convert_to_tensor(self.regex_ends), tf.fill([batch], start))
    generator = self._generator
    served = request_lib.Options(
        sampling=settings, repetition_window=values["repetition_window"],
        no_repeat_ngram_size=values["no_repeat_ngram_size"],
        num_beams=num_beams, length_penalty=values["length_penalty"],
        # Only generate_decoding (num_beams an input) returns "logprob".
        return_scores=not isinstance(num_beams, int))
    request = request_lib.build(
        request_lib.Prompts(prompt_ids, lengths), num_steps, served,
        seeds=request_lib.Seeds(tf.fill([batch], seed), tf.range(batch)),
        stops=stops, bucket_shapes=generator.jit_compile,
        chunked_prompts=generator.chunked_prompts,
        state_sizes=generator.state_sizes(), constraint=constraint)

    def sample():
      result = (generator.window_fn(request, tf.constant(window)) if window
                else generator.generate_fn(request))
      return result.ids, result.lengths, result.scores

    def beam_search():
      best = tf.nest.map_structure(lambda x: x[:, 0], generator.beam_fn(request))
      # The same width as the sampling branch's buffer.
      return best.ids, best.lengths, best.scores

    if isinstance(num_beams, int) or self.model.config.recomputes:
      # The signatures without beams or scores; or a model without a
      # stateful step for beams to take (the check above fails num_beams >
      # 1), whose beam search cannot even be traced.
      out_ids, out_lengths, scores = sample()
    else:
      out_ids, out_lengths, scores = tf.cond(num_beams > 1, beam_search, sample)
    # The request may hold padding rows after the real ones.
    return out_ids[:batch], out_lengths[:batch], scores[:batch]

  def _serve(self, prompts, num_steps, temperature, seed):
    out = self._text(prompts, num_steps, seed, dict(temperature=temperature))
    return {"text": out["text"]}

  def _serve_top_k_top_p(self, prompts, num_steps, temperature, seed, top_k,
                         top_p):
    out = self._text(prompts, num_steps, seed, dict(
        temperature=temperature, top_k=top_k, top_p=top_p))
    return {"text": out["text"]}

  def _serve_decoding(self, prompts, num_steps, seed, *values):
    # generate_constrained without stop strings or a pattern: one traced
    # generation for both (each trace of it is seconds of export), at the
    # cost of a no-stop table (0.5 ms a call at 33k tokens).
    return self.serve_constrained(prompts, num_steps, seed, *values,
                                  *_no_constraints())

  def _serve_constrained(self, prompts, num_steps, seed, *values):
    *values, stop, regex = values
    return self._text(prompts, num_steps, seed, {
        option.name: value for option, value in zip(_SERVED, values)},
                      stop, regex)

  def _serve_ids(self, prompt_ids, prompt_lengths, num_steps, seed, *values):
    # generate_ids_constrained without stop strings or a pattern (as
    # generate_decoding).
    return self.serve_ids_constrained(prompt_ids, prompt_lengths, num_steps,
                                      seed, *values, *_no_constraints())

  def _serve_ids_constrained(self, prompt_ids, prompt_lengths, num_steps,
                             seed, *values):
    *values, stop, regex = values
    width = tf.shape(prompt_ids)[1]
    checks = [
        tf.debugging.assert_positive(prompt_lengths, message="a prompt is "
                                     "empty (prompt_lengths must be >= 1)"),
        tf.debugging.assert_less_equal(
            prompt_lengths, width, message="prompt_lengths must be at most "
            "prompt_ids' width"),
        tf.debugging.assert_equal(tf.shape(prompt_lengths)[0],
                                  tf.shape(prompt_ids)[0],
                                  message="prompt_ids and prompt_lengths "
                                  "must have one row per prompt"),
        tf.debugging.assert_non_negative(prompt_ids, message="prompt_ids "
                                         "must be in [0, vocabulary size)"),
        tf.debugging.assert_less(prompt_ids, self.model.vocab_size,
                                 message="prompt_ids must be in [0, "
                                 "vocabulary size)")]
    ids, lengths, scores = self._generate(
        prompt_ids, prompt_lengths, num_steps, seed,
        {option.name: value for option, value in zip(_SERVED, values)},
        checks, stop, regex)
    text = self._decode(ids, lengths, stop)
    # num_steps columns (the buffer is a bucket wide), zeros past a row's end.
    ids = ids[:, :tf.maximum(num_steps, 0)]
    ids = tf.where(tf.range(tf.shape(ids)[1])[None, :] < lengths[:, None],
                   ids, 0)
    return {"ids": ids, "lengths": lengths, "text": text, "logprob": scores}


def _check_patterns(model, regex) -> tuple:
  """The export's `regex=` as a tuple of distinct non-empty patterns.

  Raises:
    errors.ArgumentError: not a str or list of str, an empty or repeated
      pattern, a model whose text the patterns would not act on, or one
      that does not compile (`constraints.combine`, naming it).
  """
  patterns = (regex,) if isinstance(regex, str) else regex
  if not isinstance(patterns, (list, tuple)) or not all(
      isinstance(p, str) and p for p in patterns):
    raise errors.ArgumentError(
        "regex", f"regex must be a pattern or a list of non-empty patterns, "
        f"got {regex!r}")
  if len(set(patterns)) != len(patterns):
    raise errors.ArgumentError("regex", "regex lists a pattern twice; give "
                               "each once")
  recipe = model.tokens.rules.get("recipe")
  if patterns and recipe:
    raise errors.ArgumentError("regex", vocabulary.recipe_refuses("regex",
                                                                  recipe))
  return tuple(patterns)


def _no_constraints():
  """The constrained signatures' inputs for none: no stop, no pattern."""
  return tf.zeros([0], tf.string), tf.constant("")


def export_saved_model(model, export_dir, *, jit_compile=False,
                       regex=()) -> str:
  """Writes `model` as a SavedModel with string signatures (see module doc).

  `rnnstep.export` (the exporters' package front) dispatches here for
  format="saved_model".

  Args:
    model: an `rnnstep.Model`.
    export_dir: the directory to create; it must not exist yet or be empty.
    jit_compile: False or None (graph), True or "elementwise" (see
      `ServingModule`).
    regex: the patterns the SavedModel serves (`generate_constrained`'s
      `regex` input names one), each compiled now: a graph cannot compile
      one at serving time. A str or a list of str.

  Returns:
    The export directory.

  Raises:
    ValueError: export_dir exists and is not empty, or a bad pattern
      (`errors.ArgumentError`).
    OSError: the folder cannot be written; nothing is left.
  """
  export_dir = os.fspath(export_dir)
  staging.require_new_directory(export_dir)
  module = ServingModule(model, jit_compile=jit_compile, regex=regex)
  os.makedirs(os.path.dirname(os.path.abspath(export_dir)), exist_ok=True)
  # Staged: written to a temp sibling renamed into place whole, so a server
  # polling the parent (TF Serving's model base path) never loads a version
  # being written, and a failed export leaves nothing.
  with tempfile.TemporaryDirectory(prefix="rnnstep_assets_") as assets, \
      staging.staged_path(export_dir, directory=True) as staged:
    patterns = os.path.join(assets, PATTERNS_ASSET)
    with open(patterns, "w", encoding="utf-8") as f:
      json.dump(list(module.patterns), f, ensure_ascii=False, indent=0)
    module.patterns_file = tf.saved_model.Asset(patterns)
    if not model.is_characters:  # The vocabulary, for clients' tokenizers.
      files = model.tokens.write_files(assets)
      module.tokens_file = tf.saved_model.Asset(files[TOKENS_ASSET])
      if TOKENIZER_ASSET in files:
        module.tokenizer_file = tf.saved_model.Asset(files[TOKENIZER_ASSET])
    tf.saved_model.save(module, staged,
                        signatures=module.served_signatures())
  return export_dir
