"""Export: a self-contained SavedModel, strings in and strings out.

The exported graph holds the weights, the char <-> id mapping (unicode split +
a lookup table) and the same generation body as `Generator`, so any TensorFlow
runtime (TF Serving, `tf.saved_model.load` in a process without rnnstep or
Keras) can serve it. Signatures:

  serving_default(prompts: string [B], num_steps: int32 [], temperature:
                  float32 [], seed: int64 []) -> {"text": string [B]}
  generate_top_k_top_p(the same + top_k: int32 [], top_p: float32 [])
                  -> {"text": string [B]}
  generate_decoding(prompts, num_steps, seed + one scalar input per served
                  decoding option of `options.py`: repetition_penalty,
                  no_repeat_ngram_size, repetition_window, temperature,
                  top_k, top_p, min_p, typical_p, num_beams, length_penalty)
                  -> {"text": string [B], "logprob": float32 [B]}

`generate_decoding` with num_beams > 1 returns each prompt's best beam;
"logprob" is the model's log-likelihood of the returned text (natural log,
raw logits), as `rnnstep.generate(..., return_scores=True)` gives.

Row i of a call uses the noise key (seed, i), as `rnnstep.generate(...,
seed=seed)` does, so both give the same text. A prompt character outside the
vocabulary, or an empty prompt, fails the call with InvalidArgumentError.

A model whose file records a window (`"window": k`, built for fixed windows
of k characters) is served over its windows, as `rnnstep.generate` runs it by
default; beam search, which steps a model statefully, then fails the call
with InvalidArgumentError naming num_beams.
"""

import os

import tensorflow as tf
# NoDependency: the one way to keep an attribute of a tf.Module out of what
# tf.saved_model.save writes (there is no public spelling).
from tensorflow.python.trackable import data_structures  # pylint: disable=g-direct-tensorflow-import

from rnnstep import staging
from rnnstep.decoding import options
from rnnstep.decoding import sampling
from rnnstep.decoding import stopping
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import paths
from rnnstep.engine import request as request_lib
from rnnstep.engine import window as window_lib


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
_DECODING_INPUTS = [tf.TensorSpec([None], tf.string, name="prompts"),
                    tf.TensorSpec([], tf.int32, name="num_steps"),
                    tf.TensorSpec([], tf.int64, name="seed")] + [
                        tf.TensorSpec([], tf.as_dtype(option.dtype),
                                      name=option.name) for option in _SERVED]


class ServingModule(tf.Module):
  """The exported object: the model's variables, the vocabulary, the signatures.

  Args:
    model: an `rnnstep.Model`.
    jit_compile: False or None (the default, a plain graph: every TF runtime
      can run it), True (the generation body is one XLA program) or
      "elementwise" (a graph loop with XLA-compiled gate math; for bfloat16 at
      large batches). The last two need XLA where the model is served.

  Raises:
    ValueError: a bad jit_compile value.
  """

  def __init__(self, model, jit_compile=False):
    super().__init__(name="rnnstep_serving")
    path = paths.from_jit_compile(jit_compile)
    self.model = model
    # Not tracked: saving would trace and store every compiled function of
    # the Generator's programs (continuations, the server's, `step`), which
    # no signature calls; the signatures' own traces hold what they call.
    self._generator = data_structures.NoDependency(generator_lib.Generator(
        model, paths.GRAPH if path == paths.AUTO else path))
    chars = [c if c != "[UNK]" else "" for c in model.vocab]
    keys = [c for c in chars if c]
    self.char_table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys), tf.constant([chars.index(c) for c in keys],
                                           tf.int32)),
        default_value=-1)
    self.id_to_char = tf.Variable(chars, trainable=False, name="vocab")
    self._no_stop = stopping.stop_automaton([], model.vocab_size)

  def _text(self, prompts, num_steps, seed, values):
    """Generates for string prompts; returns {"text", "logprob"} (see module).

    Args:
      prompts: string `[B]`.
      num_steps: int32 `[]`.
      seed: int64 `[]`.
      values: {option name: scalar tensor or Python value} for some of the
        declared options (the rest take their defaults).
    """
    values = {option.name: values.get(option.name, option.default)
              for option in options.OPTIONS}
    settings = sampling.Params(**{o.name: values[o.name]
                                  for o in options.PER_ROW})
    num_beams = values["num_beams"]
    chars = tf.strings.unicode_split(prompts, "UTF-8")
    ids = self.char_table.lookup(chars)
    lengths = tf.cast(ids.row_lengths(), tf.int32)
    vocab_size = self.model.vocab_size
    checks = [
        tf.debugging.assert_non_negative(
            ids.flat_values, message="a prompt character is not in the "
            "vocabulary of the model"),
        tf.debugging.assert_positive(lengths, message="a prompt is empty"),
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
    with tf.control_dependencies(checks):
      prompt_ids = ids.to_tensor()
    batch = tf.shape(prompt_ids)[0]
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
        stops=self._no_stop, bucket_shapes=generator.jit_compile,
        state_sizes=generator.state_sizes())

    def sample():
      result = (generator.window_fn(request, tf.constant(window)) if window
                else generator.generate_fn(request))
      return result.ids, result.lengths, result.scores

    def beam_search():
      best = tf.nest.map_structure(lambda x: x[:, 0], generator.beam_fn(request))
      # The same width as the sampling branch's buffer.
      return best.ids, best.lengths, best.scores

    if isinstance(num_beams, int):  # The signatures without beams or scores.
      out_ids, out_lengths, scores = sample()
    else:
      out_ids, out_lengths, scores = tf.cond(num_beams > 1, beam_search, sample)
    # The request may hold padding rows after the real ones.
    pieces = tf.gather(self.id_to_char, out_ids[:batch])
    pieces = tf.RaggedTensor.from_tensor(pieces, lengths=out_lengths[:batch])
    return {"text": tf.strings.reduce_join(pieces, axis=1),
            "logprob": scores[:batch]}

  @tf.function(input_signature=_BASIC_INPUTS, autograph=False)
  def serve(self, prompts, num_steps, temperature, seed):
    out = self._text(prompts, num_steps, seed, dict(temperature=temperature))
    return {"text": out["text"]}

  @tf.function(input_signature=_BASIC_INPUTS + _TOP_K_TOP_P_INPUTS, autograph=False)
  def serve_top_k_top_p(self, prompts, num_steps, temperature, seed, top_k, top_p):
    out = self._text(prompts, num_steps, seed, dict(
        temperature=temperature, top_k=top_k, top_p=top_p))
    return {"text": out["text"]}

  @tf.function(input_signature=_DECODING_INPUTS, autograph=False)
  def serve_decoding(self, prompts, num_steps, seed, *values):
    return self._text(prompts, num_steps, seed, {
        option.name: value for option, value in zip(_SERVED, values)})


FORMATS = ("saved_model", "web", "tflite")


# `format` is the keyword the issue and the CLI flag use.
def export(model, export_dir, *, jit_compile=False,
           format="saved_model") -> str:  # pylint: disable=redefined-builtin
  """Writes `model` as a SavedModel with string signatures (see module doc),
  or (`format=`) as a web export or a LiteRT model.

  Args:
    model: an `rnnstep.Model`.
    export_dir: the directory to create; it must not exist yet or be empty.
    jit_compile: False or None (graph), True or "elementwise" (see
      `ServingModule`); SavedModel only.
    format: "saved_model"; "web" (`rnnstep.exporters.web.export_web`: a
      page and ES module that generate in the browser); "tflite"
      (`rnnstep.export_litert`).

  Returns:
    The export directory.

  Raises:
    ValueError: export_dir exists and is not empty, an unknown format,
      jit_compile with another format, or a model that format refuses (a
      token model's SavedModel: its serving signatures map strings to ids
      one character per id).
  """
  if format not in FORMATS:
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got "
                     f"{format!r}")
  if format != "saved_model":
    if jit_compile:
      raise ValueError(f"jit_compile applies to format='saved_model' only, "
                       f"not {format!r}; drop it")
    # pylint: disable=g-import-not-at-top
    if format == "web":
      from rnnstep.exporters import web
      return web.export_web(model, export_dir)
    from rnnstep.exporters import litert
    return litert.export_litert(model, export_dir)
  export_dir = os.fspath(export_dir)
  if not model.is_characters:
    raise ValueError(
        f"{model.source or 'the model'}: a {model.tokens.kind} model has no "
        "SavedModel export yet (its string signatures map one character per "
        "id); use rnnstep.generate, or the LiteRT export, which works on ids")
  staging.require_new_directory(export_dir, "choose a new --output")
  module = ServingModule(model, jit_compile=jit_compile)
  tf.saved_model.save(module, export_dir, signatures={
      "serving_default": module.serve,
      "generate_top_k_top_p": module.serve_top_k_top_p,
      DECODING_SIGNATURE: module.serve_decoding,
  })
  return export_dir
