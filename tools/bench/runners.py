"""What the sections time: rnnstep.generate on a path, and the matmul floor."""


class Rnnstep:
  """rnnstep.generate on one path, or the default (decoded text, as users get it)."""

  def __init__(self, model, settings, jit_compile):
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.generate = rnnstep.generate
    self.model = model
    self.settings = settings
    self.jit_compile = jit_compile

  def __call__(self, prompt_texts, seed):
    return self.generate(self.model, list(prompt_texts), self.settings.num_chars,
                         temperature=self.settings.temperature, seed=seed,
                         jit_compile=self.jit_compile)


class Floor:
  """Only the per-step matmuls, in while_loops (XLA or graph).

  Decoding steps do h@R [U, 3U] and h@W_out [U, V] with h = tanh(first U
  columns of h@R), so steps stay sequential: what no generation loop can beat.
  `priming_steps` first runs that many steps of h@R alone: a generation from a
  prompt of P characters must run P - 1 recurrent steps before its first
  draw, and a floor without them charges rnnstep for work the floor skipped.
  In a reduced `dtype` the weights and h are held in it throughout (no casts:
  rnnstep pays those, the floor does not).
  """

  def __init__(self, weights, settings, jit_compile, dtype="float32",
               priming_steps=0):
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.tf = tf
    units = weights.units
    self.dtype = tf.as_dtype(dtype)
    self.recurrent = tf.cast(weights.tensors["layer0_recurrent_kernel"],
                             self.dtype)
    self.dense = tf.cast(weights.tensors["dense_kernel"], self.dtype)
    self.num_steps = np.int32(settings.num_chars)
    self.priming_steps = np.int32(priming_steps)
    self.units = units
    self.rng = np.random.default_rng(0)
    recurrent, dense = self.recurrent, self.dense

    def next_h(h):
      h_proj = tf.matmul(h, recurrent)            # [B, 3U], no fused add
      return tf.tanh(h_proj[:, :units])

    def loop(h, priming_steps, num_steps):
      _, h = tf.while_loop(lambda t, _: t < priming_steps,
                           lambda t, h: (t + 1, next_h(h)), (tf.constant(0), h))

      def body(t, h, ids):
        logits = tf.matmul(h, dense)              # [B, V]
        ids = tf.argmax(logits, -1, output_type=tf.int32)
        return t + 1, next_h(h), ids
      _, h, ids = tf.while_loop(
          lambda t, *_: t < num_steps, body,
          (tf.constant(0), h, tf.zeros([tf.shape(h)[0]], tf.int32)))
      return h, ids

    self.fn = tf.function(loop, jit_compile=jit_compile, input_signature=[
        tf.TensorSpec([None, units], self.dtype), tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.int32)])

  def __call__(self, batch, seed):
    del seed
    h = self.rng.normal(0, 0.5, (batch, self.units)).astype("float32")
    h, ids = self.fn(self.tf.cast(h, self.dtype), self.priming_steps,
                     self.num_steps)
    return ids.numpy()
