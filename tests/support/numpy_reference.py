"""An independent float64 numpy forward of a recurrent char model (tests only).

Written from the Keras equations (see docs/dev/cell-kinds.md), over
the model-file tensor dict (`keras_reference.weights_of`, `model_file.read`):
Embedding -> GRU (reset_after True/False) / LSTM / SimpleRNN (tanh or relu)
stack -> Dense.
It shares no code with rnnstep and computes in float64, so it is the reference
for rnnstep's reduced-precision paths (bfloat16, float16), where bit-identity
with Keras' float32 is not expected: tests measure how often rnnstep's choices
agree with it and bound that, rather than assuming identity.
tests/test_numpy_reference.py checks it against real Keras to float32 rounding.
"""

import numpy as np


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


class Reference:
  """The float64 forward pass of one model.

  Args:
    tensors: the model-file tensor dict ("embedding", "layer{i}_kernel",
      "layer{i}_recurrent_kernel", "layer{i}_bias", "dense_kernel",
      "dense_bias").
    layers: the `model_file.LayerConfig`s, in order.
    banned: ids never chosen by `greedy` (an "[UNK]" at id 0).
    product: `product(x, key)` computes `x @ tensors[key]` for the keys it
      takes (`int8_products`: an int8 model's products), None for the
      others; layer 0's kernel is always `x @ k` (an int8 model's input
      table is computed so).
  """

  def __init__(self, tensors, layers, banned=(), product=None):
    self.t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    self.layers = list(layers)
    self.banned = list(banned)
    self.product = product

  def _mm(self, x, key):
    """`x @ tensors[key]`, by `product` where it takes the key."""
    got = None if self.product is None else self.product(x, key)
    return x @ self.t[key] if got is None else got

  def zero_state(self):
    """One list of `[U]` arrays per layer: [h] or [h, c] (LSTM)."""
    return [[np.zeros(l.units)] * (2 if l.kind == "lstm" else 1)
            for l in self.layers]

  def _cell(self, i, spec, x, state):
    xk = (x @ self.t["layer0_kernel"] if i == 0
          else self._mm(x, f"layer{i}_kernel"))
    hr = lambda h: self._mm(h, f"layer{i}_recurrent_kernel")
    b = self.t[f"layer{i}_bias"]
    u = spec.units
    if spec.kind == "gru":
      (h,) = state
      if spec.reset_after:
        xp, hp = xk + b[0], hr(h) + b[1]
        z = _sigmoid(xp[..., :u] + hp[..., :u])
        rr = _sigmoid(xp[..., u:2 * u] + hp[..., u:2 * u])
        n = np.tanh(xp[..., 2 * u:] + rr * hp[..., 2 * u:])
      else:
        xp = xk + b
        hp = hr(h)
        z = _sigmoid(xp[..., :u] + hp[..., :u])
        rr = _sigmoid(xp[..., u:2 * u] + hp[..., u:2 * u])
        n = np.tanh(xp[..., 2 * u:] + hr(rr * h)[..., 2 * u:])
      h = z * h + (1 - z) * n
      return h, [h]
    if spec.kind == "lstm":
      h, c = state
      g = xk + hr(h) + b
      i_, f, cc, o = (g[..., j * u:(j + 1) * u] for j in range(4))
      c = _sigmoid(f) * c + _sigmoid(i_) * np.tanh(cc)
      h = _sigmoid(o) * np.tanh(c)
      return h, [h, c]
    if spec.kind in ("simple_rnn", "simple_rnn_relu"):
      (h,) = state
      h = xk + hr(h) + b
      h = np.maximum(h, 0.0) if spec.kind == "simple_rnn_relu" else np.tanh(h)
      return h, [h]
    raise ValueError(spec.kind)

  def step(self, token, state):
    """One id (or ids `[B]`) through the stack: `(logits [(B,) V], new_state)`.

    A zero state of shape `[U]` broadcasts over a batch of ids.
    """
    x = self.t["embedding"][token]
    new_state = []
    for i, (spec, layer_state) in enumerate(zip(self.layers, state)):
      x, layer_state = self._cell(i, spec, x, layer_state)
      new_state.append(layer_state)
    return self._mm(x, "dense_kernel") + self.t["dense_bias"], new_state

  def logits(self, ids):
    """Teacher-forced logits from a zero state: ids `[T]` -> `[T, V]`, or
    `[B, T]` -> `[B, T, V]`."""
    ids = np.asarray(ids)
    state, out = self.zero_state(), []
    for t in range(ids.shape[-1]):
      logits, state = self.step(ids[..., t], state)
      out.append(logits)
    return np.stack(out, -2)

  def _choose(self, logits):
    logits = logits.copy()
    logits[self.banned] = -np.inf
    return int(np.argmax(logits))

  def greedy(self, prompt_ids, num_steps):
    """Greedy continuation ids of `prompt_ids`, `num_steps` long."""
    state = self.zero_state()
    for token in prompt_ids[:-1]:
      _, state = self.step(int(token), state)
    token, out = int(prompt_ids[-1]), []
    for _ in range(num_steps):
      logits, state = self.step(token, state)
      token = self._choose(logits)
      out.append(token)
    return out

  def log_likelihood(self, ids):
    """Sum of log p(ids[t+1] | ids[:t+1]) over the sequence, in nats."""
    logits = self.logits(ids[:-1])
    peak = logits.max(-1, keepdims=True)
    log_norm = np.log(np.exp(logits - peak).sum(-1)) + peak[:, 0]
    return float((logits[np.arange(len(ids) - 1), ids[1:]] - log_norm).sum())

  def greedy_agreement(self, prompt_ids, generated_ids):
    """How well a greedy continuation (or a batch of them) agrees with this
    float64 model.

    Teacher-forced along the generated text itself: at each step the
    reference sees the same history the generator saw, so one early flip does
    not make every later step count as a disagreement (as comparing two
    free-running texts would).

    Returns:
      `(agreement, worst_gap, first_divergence)`: the fraction of steps whose
      generated id is the reference's argmax; the largest reference logit gap
      `max - logit[chosen]` over the steps (0 where they agree: a small gap
      means a near-tie that rounding may flip); the first step that differs
      (len(generated) when none). For a batch (prompts `[B, P]`, texts
      `[B, N]`, equal lengths), over all rows; the first divergence is the
      earliest of any row.
    """
    prompt_ids = np.atleast_2d(prompt_ids)
    chosen = np.atleast_2d(generated_ids)
    ids = np.concatenate([prompt_ids, chosen], 1)
    logits = self.logits(ids[:, :-1])[:, prompt_ids.shape[1] - 1:]
    logits[..., self.banned] = -np.inf
    best = logits.argmax(-1)
    gaps = logits.max(-1) - np.take_along_axis(logits, chosen[..., None], -1)[..., 0]
    agree = (best == chosen).all(0)
    first = int(np.argmin(agree)) if not agree.all() else chosen.shape[1]
    return float((best == chosen).mean()), float(gaps.max()), first


def tensors_of_file(model_data):
  """The tensor dict and layer list of a `model_file.read` result."""
  return dict(model_data.tensors), list(model_data.config.layers)
