"""Export: a self-contained SavedModel, strings in and strings out.

The exported graph holds the weights, the char <-> id mapping (unicode split +
a lookup table) and the same generation body as `Generator`, so any TensorFlow
runtime (TF Serving, `tf.saved_model.load` in a process without rnnstep or
Keras) can serve it. Signatures:

  serving_default(prompts: string [B], num_steps: int32 [], temperature:
                  float32 [], seed: int64 []) -> {"text": string [B]}
  generate_top_k_top_p(the same + top_k: int32 [], top_p: float32 [])
                  -> {"text": string [B]}

Row i of a call uses the noise key (seed, i), as `rnnstep.generate(...,
seed=seed)` does, so both give the same text. A prompt character outside the
vocabulary, or an empty prompt, fails the call with InvalidArgumentError.
"""

import os

import numpy as np
import tensorflow as tf

from rnnstep import generator as generator_lib


class ServingModule(tf.Module):
  """The exported object: the model's variables, the vocabulary, the signatures.

  Args:
    model: an `rnnstep.Model`.
    jit_compile: False (the default: every TF runtime can run the plain
      graph), True (the generation body is one XLA program) or "elementwise"
      (a graph loop with XLA-compiled gate math; for bfloat16 at large
      batches). The last two need XLA where the model is served.
  """

  def __init__(self, model, jit_compile=False):
    super().__init__(name="rnnstep_serving")
    self.model = model
    self._generator = generator_lib.Generator(model, jit_compile=jit_compile)
    chars = [c if c != "[UNK]" else "" for c in model.vocab]
    keys = [c for c in chars if c]
    self.char_table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys), tf.constant([chars.index(c) for c in keys],
                                           tf.int32)),
        default_value=-1)
    self.id_to_char = tf.Variable(chars, trainable=False, name="vocab")
    self._no_stop = np.zeros([1, model.vocab_size], np.int32)

  def _text(self, prompts, num_steps, temperature, seed, top_k, top_p):
    chars = tf.strings.unicode_split(prompts, "UTF-8")
    ids = self.char_table.lookup(chars)
    lengths = tf.cast(ids.row_lengths(), tf.int32)
    checks = [
        tf.debugging.assert_non_negative(
            ids.flat_values, message="a prompt character is not in the "
            "vocabulary of the model"),
        tf.debugging.assert_positive(lengths, message="a prompt is empty"),
        tf.debugging.assert_non_negative(num_steps,
                                         message="num_steps must be >= 0"),
        tf.debugging.assert_non_negative(temperature,
                                         message="temperature must be >= 0"),
    ]
    with tf.control_dependencies(checks):
      prompt_ids = ids.to_tensor()
    batch = tf.shape(prompt_ids)[0]
    out = self._generator.generate_fn(
        prompt_ids, lengths, num_steps, tf.zeros([0], tf.bool),
        temperature, top_k, top_p, tf.fill([batch], seed),
        tf.range(batch), tf.constant(self._no_stop),
        tf.constant([False]))
    pieces = tf.gather(self.id_to_char, out["ids"])
    pieces = tf.RaggedTensor.from_tensor(pieces, lengths=out["lengths"])
    return {"text": tf.strings.reduce_join(pieces, axis=1)}

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name="prompts"),
      tf.TensorSpec([], tf.int32, name="num_steps"),
      tf.TensorSpec([], tf.float32, name="temperature"),
      tf.TensorSpec([], tf.int64, name="seed")])
  def serve(self, prompts, num_steps, temperature, seed):
    return self._text(prompts, num_steps, temperature, seed, tf.constant(0),
                      tf.constant(1.0))

  @tf.function(input_signature=[
      tf.TensorSpec([None], tf.string, name="prompts"),
      tf.TensorSpec([], tf.int32, name="num_steps"),
      tf.TensorSpec([], tf.float32, name="temperature"),
      tf.TensorSpec([], tf.int64, name="seed"),
      tf.TensorSpec([], tf.int32, name="top_k"),
      tf.TensorSpec([], tf.float32, name="top_p")])
  def serve_top_k_top_p(self, prompts, num_steps, temperature, seed, top_k, top_p):
    return self._text(prompts, num_steps, temperature, seed, top_k, top_p)


def export(model, export_dir, *, jit_compile=False) -> str:
  """Writes `model` as a SavedModel with string signatures (see module doc).

  Args:
    model: an `rnnstep.Model`.
    export_dir: the directory to create; it must not exist yet or be empty.
    jit_compile: False, True or "elementwise" (see `ServingModule`).

  Returns:
    The export directory.

  Raises:
    ValueError: export_dir exists and is not empty.
  """
  export_dir = os.fspath(export_dir)
  if os.path.exists(export_dir) and (not os.path.isdir(export_dir)
                                     or os.listdir(export_dir)):
    raise ValueError(f"{export_dir}: already exists and is not an empty "
                     "directory; choose a new --output")
  module = ServingModule(model, jit_compile=jit_compile)
  tf.saved_model.save(module, export_dir, signatures={
      "serving_default": module.serve,
      "generate_top_k_top_p": module.serve_top_k_top_p,
  })
  return export_dir
