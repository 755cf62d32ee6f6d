"""RWKV-7 "Goose" (x070) as one rnnstep cell: the whole stack of blocks.

The kind `rwkv7` (`kinds.KINDS`, docs/dev/cell-kinds.md): a stack of L
blocks run as one cell (`RWKV7Cell`), as KerasHub's `RWKV7Backbone` and
RWKV-LM's RNN-mode code run them token by token. Each block is a time mix
(the WKV state update, below) and a channel mix (a squared-ReLU
feed-forward), each over a token shift: the block's input mixed with the
previous token's by learned per-channel weights.

The state update per head (N = head size, S `[N, N]`, rows value, columns
key), with the decay w, the normalized key kk, the in-context learning rate
a, k, v and r all `[N]` for the token:

    S = S diag(w) + (S (-kk)) (kk * a)^T + v k^T
    y = S r

so the state forgets per key channel (w in (0, 1)), removes what it held
along kk (the delta rule, scaled by a) and adds the new v k^T. The class
docstring has every equation of a block; `kinds.rwkv7_shapes` the tensors'
layout. The readers of the files (KerasHub presets, `.weights.h5`, official
`.pth`) are `rnnstep.convert.rwkv7`.
"""

import functools
from typing import NamedTuple, Tuple

import tensorflow as tf

from rnnstep.model import int8_arithmetic
from rnnstep.model import kinds
from rnnstep.model import sixteen_bit
from rnnstep.model.cells import Cell
from rnnstep.model.cells import as_float32
from rnnstep.model.cells import gather_rows
from rnnstep.model.cells import matmul

# RWKV-7's epsilons: its LayerNorms' (Keras's and torch's default 1e-5 as
# both codes set it), the per-head GroupNorm's (64e-5), and the key
# normalization's (KerasHub's `normalize`: x * rsqrt(sum(x^2) + 1e-12)).
RWKV7_LAYER_NORM_EPSILON = 1e-5
RWKV7_GROUP_NORM_EPSILON = 64e-5
RWKV7_NORMALIZE_EPSILON = 1e-12

# Tokens of the state update one small XLA program runs when a prompt is
# primed outside one XLA program (`_wkv_chunk_program`). Op by op the
# update is ~20 ops a token a block: at one row their dispatch, at 16 rows
# six passes over the 3 MB state, was 24-38% of a prompt's priming (the
# 0.1B shape, one thread, a quiet Zen 4); fused, 8 tokens a program ran the
# update 3.9-4.5x faster than op by op and compiled in 0.8 s a power of two
# of rows (16 tokens: no faster, 1.1 s).
WKV_CHUNK_TOKENS = 8


def layer_norm(x, gamma_beta, epsilon=RWKV7_LAYER_NORM_EPSILON):
  """LayerNorm over the last axis, `gamma_beta` = [gamma; beta] ([2, C])."""
  mean, variance = tf.nn.moments(x, [-1], keepdims=True)
  return ((x - mean) * tf.math.rsqrt(variance + epsilon) * gamma_beta[0]
          + gamma_beta[1])


class _Block(NamedTuple):
  """One RWKV-7 block's tensors, each vector and matrix a tensor of its own
  (split once, outside the loops: a slice in a loop's body is an op a step).
  """
  ln: Tuple[tf.Tensor, ...]  # LN1 gamma, beta, LN2 gamma, beta.
  mix: Tuple[tf.Tensor, ...]  # kinds.RWKV7_MIX.
  vectors: Tuple[tf.Tensor, ...]  # w0, a0, v0, k_k, k_a, r_k.
  ln_x: Tuple[tf.Tensor, ...]  # The GroupNorm's gamma, beta.
  loras: Tuple[tf.Tensor, ...]  # w1, w2, a1, a2, v1, v2, g1, g2.
  r: tf.Tensor
  k: tf.Tensor
  v: tf.Tensor
  o: tf.Tensor
  fk: tf.Tensor
  fv: tf.Tensor


class RWKV7Cell(Cell):
  """RWKV-7 "Goose" (x070): the whole stack of L blocks as one cell.

  Per token, from x = LayerNorm_0(embedding[id]) (the input table), each
  block i (KerasHub's rwkv7_layer.py in RNN mode; RWKV-LM's
  RWKV-v7/rwkv_v7_demo_rnn.py; docs/dev/cell-kinds.md):

    xx = LN1(x);  d = prev_att - xx;  prev_att = xx
    x_j = xx + d * mix_j                      j in r, w, k, v, a, g
    r, k, v = x_r @ R, x_k @ K, x_v @ V
    decay = exp(-exp(-softplus(-(w0 + tanh(x_w @ w1) @ w2)) - 0.5))
    a = sigmoid(a0 + x_a @ a1 @ a2);  g = sigmoid(x_g @ g1) @ g2
    kk = normalize_per_head(k * k_k);  k = k * (1 + (a - 1) * k_a)
    v_first = v (block 0), else v += (v_first - v) * sigmoid(v0 + x_v @ v1 @ v2)
    S = S * decay[col] + (S @ -kk) (kk * a)^T + v k^T     per head, [N, N]
    y = GroupNorm_heads(S @ r) + sum_head(r * k * r_k) * v
    x = x + (y * g) @ O
    xx = LN2(x);  d = prev_ffn - xx;  prev_ffn = xx
    x = x + relu((xx + d * mix_ffn) @ FK)^2 @ FV

  and the output is h = LN_out(x), which the Dense (the head, no bias)
  maps to logits. The state is h, then per block (prev_att, S flattened
  [H*N*N], prev_ffn); h is carried only so that a masked step keeps the
  output it had, as every cell's state[0] is its output.

  Matrices are stored `[in, out]` and stacked per block (`kinds.rwkv7_shapes`);
  a `Model` holds the big ones `[out, in]` (`Kind.held_transposed`).
  The big products (R, K, V, O, FK, FV) are TensorFlow matmuls in the
  compute dtype; the rest, LoRAs included, are elementwise functions
  (`_elementwise`: XLA-compiled on the elementwise path). A prompt runs
  block by block (`unroll`), each block's products once over all its rows.

  Outside one XLA program (`one_xla_program`), a block is a graph function
  of its tensors, traced once (block 0, which sets v_first, once more) and
  called L times, not inlined: the 0.1B shape's generation traced its 12
  blocks' ops in each of the decode loops and the priming (~25,000 nodes)
  and grappler optimized them all, over a minute before the first token.
  On the graph path a decode step's block is moreover one small XLA program
  (`_block_function`): the loops, the priming and the sampling stay graph
  ops, and nothing compiles for minutes.

  The LiteRT export sets `for_litert_converter`: the step slices each
  block's tensors where it runs (`blocks_sliced_in_step`), and `unroll`
  takes a static number of columns (a prompt chunk's), with builtin ops
  only: the blocks inlined, the state update unrolled
  (`_scan_tokens_unrolled`), the masks' running maximum without a scan.
  """

  fusable = False
  unrolls_blockwise = True
  compiles_per_batch = True

  def __init__(self, kernel, ln, mix, vectors, ln_x, w1, w2, a1, a2, v1, v2,
               g1, g2, receptance, key, value, output, ffn_key, ffn_value,
               output_norm, sizes, compute_dtype=tf.float32,
               compile_elementwise=False, activation="tanh"):
    del activation  # The kind's activations are fixed.
    self.compute_dtype = tf.as_dtype(compute_dtype)
    self.compile_elementwise = compile_elementwise
    self.input_norm = None if kernel is None else tf.convert_to_tensor(kernel)
    self.blocks = sizes["blocks"]
    self.head_size = sizes["head_size"]
    self.units = int(output_norm.shape[-1])
    self.heads = self.units // self.head_size
    self.state_size = kinds.rwkv7_state_sizes(self.units, sizes)
    # Each block's tensors are sliced here, once, outside the loops: a
    # slice inside a graph loop's body is an op a step (a copy of each
    # matrix, every token, measured 2-3x the weight-reading floor).
    self._stacked = (ln, mix, vectors, ln_x, w1, w2, a1, a2, v1, v2, g1, g2,
                     receptance, key, value, output, ffn_key, ffn_value)
    self.block_tensors = _blocks_of(tf.unstack, self._cast(self._stacked))
    # Set by the LiteRT export: see `blocks_sliced_in_step` and `unroll`.
    self.for_litert_converter = False
    self.output_norm = tuple(tf.unstack(
        tf.convert_to_tensor(output_norm, tf.float32)))
    self._shift_in = self._elementwise(self._time_inputs)
    self._wkv = self._elementwise(self._time_mix)
    self._ffn_in = self._elementwise(self._channel_inputs)
    self._square = self._elementwise(_squared_relu)
    self._out = self._elementwise(self._output)
    self._functions = {}

  def _block_function(self, fn, compile_on_graph_path=False):
    """`fn` as a function called per block (see the class docstring), or
    `fn` itself inside one XLA program (XLA inlines calls anyway).

    With `compile_on_graph_path`, on the graph path (neither one XLA program
    nor XLA-compiled elementwise functions) the function is a small XLA
    program of its own: a decode step's block is ~130 small ops, whose
    dispatch by TensorFlow's executor cost ~1 ms a block a token at batch 1
    (the 0.1B shape's decode at 1.37x the weight-reading floor on a quiet
    Zen 3, against 1.17x as one program a block). It compiles in about a
    second (two programs, block 0 and the rest, once per batch size) where
    the whole generation as one XLA program takes minutes. Only in float32:
    XLA's CPU dots in bfloat16 ran the 0.1B shape's decode 7.1x slower than
    float32 on a Zen 3 (no bf16 arithmetic), TensorFlow's graph ops 2.9x."""
    if self.one_xla_program:
      return fn
    if fn.__name__ not in self._functions:
      if compile_on_graph_path and self._compiles_steps_on_graph_path():
        function = tf.function(fn, autograph=False, jit_compile=True)
      else:
        function = tf.function(fn, autograph=False,
                               experimental_attributes={"_noinline": True})
      self._functions[fn.__name__] = function
    return self._functions[fn.__name__]

  def project_inputs(self, inputs):
    """The input LayerNorm (block 0's ln0): `Model.input_table`'s rows."""
    return layer_norm(tf.convert_to_tensor(inputs, tf.float32),
                      self.input_norm)

  def _compiles_steps_on_graph_path(self) -> bool:
    """Whether the graph path's step block is an XLA program
    (`_block_function`)."""
    return not self.compile_elementwise and self.compute_dtype == tf.float32

  def _mm(self, a, w, in_xla):
    """a @ W of a big matrix, held `[out, in]` (`Kind.held_transposed`);
    `in_xla`: traced inside an XLA program (`sixteen_bit`)."""
    return matmul(a, w, self.compute_dtype, float32_result=False,
                  transposed=True, in_xla=in_xla)

  def blocks_sliced_in_step(self):
    """Each block's tensors sliced from the stacked ones where the step runs
    (`for_litert_converter`, set by the LiteRT export), else those sliced
    once at construction.

    TensorFlow's LiteRT converter (2.21) passes every tensor a loop uses
    into each conditional's branch as an argument, and its
    ReduceWhileOperandsPass marks a while loop's operands in a bit vector
    sized by that loop's own operand count, indexed by the numbers of the
    enclosing function's arguments it reaches: past ~190 arguments (33 a
    block: 5 or more blocks) it writes outside the vector and corrupts the
    heap, and the process aborts. Stacked, the step's tensors are 18 at any
    depth. The slices are the same values, so the step's math is unchanged.
    """
    if not self.for_litert_converter:
      return self.block_tensors
    return _blocks_of(lambda t: [t[i] for i in range(self.blocks)],
                      self._cast(self._stacked))

  def _cast(self, stacked):
    """The stacked tensors (`_blocks_of`'s order) in their dtypes: the
    vectors and LoRAs float32, the big matrices the compute dtype."""
    return (*(tf.cast(t, tf.float32) for t in stacked[:12]),
            *(sixteen_bit.cast(t, self.compute_dtype)
              for t in stacked[12:]))

  def step(self, x_proj, state):
    x = gather_rows(x_proj)
    new_state, v_first, ffn_out = [None], None, None
    step_block = self._block_function(self._step_block,
                                      compile_on_graph_path=True)
    for i, b in enumerate(self.blocks_sliced_in_step()):
      x, ffn_out, v_first, block_state = step_block(
          b, x, ffn_out, tuple(state[1 + 3 * i:4 + 3 * i]), v_first)
      new_state += block_state
    h = self._out(x, ffn_out)
    new_state[0] = h
    return h, tuple(new_state)

  def _step_block(self, b, x, ffn_out, block_state, v_first):
    """One block's step: x and ffn_out (the block below's channel mix, added
    in here, fused), v_first (None in block 0) and the block's state."""
    prev_att, wkv, prev_ffn = block_state
    # The elementwise functions take the block's vectors and LoRAs only (an
    # XLA-compiled one would take the big matrices as arguments too).
    small = b._replace(r=None, k=None, v=None, o=None, fk=None, fv=None)
    mm = functools.partial(self._mm, in_xla=(
        self.one_xla_program or self._compiles_steps_on_graph_path()))
    x, xx, xr, xk, xv = self._shift_in(small, x, ffn_out, prev_att)
    r, k, v = mm(xr, b.r), mm(xk, b.k), mm(xv, b.v)
    y, wkv, v_first = self._wkv(small, xx, prev_att, r, k, v, wkv, v_first)
    x, xf, ffn_x = self._ffn_in(small, x, mm(y, b.o), prev_ffn)
    ffn_out = mm(self._square(mm(ffn_x, b.fk)), b.fv)
    return x, ffn_out, v_first, (xx, wkv, xf)

  def unroll(self, x_proj, state, mask=None, steps=None):
    """Runs a whole sequence through the stack, block by block.

    Only the state update S (a few elementwise ops and two 64-wide matvecs
    per head) depends on the previous token; everything else in a block
    depends on its inputs and the token shift alone. So each block runs its
    products (R, K, V, the LoRAs, O, the feed-forward's) once over all T*B
    rows, reading each matrix once a sequence instead of once a token (a
    100-token prompt on the 0.1B shape: the weights read once, not 100
    times), and only the state update loops over time. The equations and
    their order are the step's (`step`, the same functions).

    Args:
      x_proj: time-major `[T, B, C]`, or `TableRows` of time-major ids.
      state: the initial state.
      mask: optional time-major bool `[T, B]`; where False the row's state
        is held unchanged (bit for bit) and its output is the held h.
      steps: run only the first `steps` columns (the mask is False beyond
        them); outputs past them are 0.

    Returns:
      `((outputs [T, B, U],), final_state)`, as `network._unroll_cell`.
    """
    x = gather_rows(x_proj)
    size, batch = tf.shape(x)[0], tf.shape(x)[1]
    if steps is not None:
      steps = tf.clip_by_value(steps, 1, size)
      x = x[:steps]
      mask = None if mask is None else mask[:steps]
    length = tf.shape(x)[0]
    static_length = x.shape[0]  # None where T is not static.
    if mask is None:
      last = None
    else:
      # last[t, b]: the last kept position <= t (-1: none), whose values a
      # masked position holds.
      marks = tf.where(mask, tf.range(length)[:, None], -1)
      last = (_running_max(marks) if self.for_litert_converter
              else tf.scan(tf.maximum, marks))
    x = tf.reshape(x, [length * batch, -1])
    new_state, v_first = [None], None
    # The converter takes a function called, not inlined, as a custom op.
    # A chunk's static width lets the state update run without a loop
    # (`_scan_tokens_unrolled`).
    unroll_block = (functools.partial(self._unroll_block,
                                      static_length=static_length)
                    if self.for_litert_converter
                    else self._block_function(self._unroll_block))
    for i, b in enumerate(self.blocks_sliced_in_step()):
      x, v_first, block_state = unroll_block(
          b, x, tuple(state[1 + 3 * i:4 + 3 * i]), v_first, mask, last)
      new_state += block_state
    h = layer_norm(x, self.output_norm)
    if last is not None:
      whole = tf.concat([state[0][None], tf.reshape(h, [length, batch, -1])],
                        0)
      h = tf.reshape(_held(whole, last), [length * batch, -1])
    outputs = tf.reshape(h, [length, batch, self.units])
    new_state[0] = outputs[-1]
    if steps is not None:
      outputs = tf.pad(outputs, [[0, size - length], [0, 0], [0, 0]])
    return (outputs,), tuple(new_state)

  def _unroll_block(self, b, x, block_state, v_first, mask, last,
                    static_length=None):
    """One block over all rows x `[T*B, C]` (`unroll`): the new x, v_first
    and the block's final state. mask, last: as in `unroll` (or None);
    static_length: T where it is static (`for_litert_converter`)."""
    prev_att, wkv, prev_ffn = block_state
    batch = tf.shape(prev_att)[0]
    length = tf.shape(x)[0] // batch
    xx = layer_norm(x, b.ln[:2])
    prev = _shifted(xx, prev_att, length, batch, last)
    mm = functools.partial(self._mm, in_xla=self.one_xla_program)
    x, xx, xr, xk, xv = self._time_inputs(b, x, None, prev)
    r, k, v = mm(xr, b.r), mm(xk, b.k), mm(xv, b.v)
    decay, kk, a, k, v, r, g, v_first = self._wkv_inputs(
        b, xx, prev, r, k, v, v_first)
    s, y = self._wkv_scan(wkv, mask, static_length or length, batch,
                          (decay, kk, a, k, v, r))
    x = x + as_float32(mm(self._wkv_output(b, y, r, k, v, g), b.o))
    xf = layer_norm(x, b.ln[2:])
    ffn_x = xf + (_shifted(xf, prev_ffn, length, batch, last) - xf) * b.mix[6]
    ffn_out = self._halves(
        lambda rows: mm(_squared_relu(mm(rows, b.fk)), b.fv),
        ffn_x)
    x = x + as_float32(ffn_out)
    return x, v_first, (_final(xx, prev_att, length, batch, last), s,
                        _final(xf, prev_ffn, length, batch, last))

  def _halves(self, fn, rows):
    """fn over the first and the second half of `rows` as two independent
    ops (outside one XLA program), which TensorFlow's inter-op threads run
    side by side (LiteRT runs them one after the other, each reading the
    weights)."""
    if self.one_xla_program or self.for_litert_converter:
      return fn(rows)
    half = tf.shape(rows)[0] // 2
    return tf.concat([fn(rows[:half]), fn(rows[half:])], 0)

  def _wkv_scan(self, wkv, mask, length, batch, inputs):
    """The state update over time: the final state `[B, H*N*N]` and S @ r
    of every row `[T*B, H, N]`; a masked row holds its state. `length`:
    T, a Python int where it is static for LiteRT's converter."""
    heads, size = self.heads, self.head_size
    inputs = tuple(tf.reshape(t, [length, batch, -1]) for t in inputs)
    s = tf.reshape(wkv, [batch, heads, size, size])
    if self.one_xla_program:  # XLA fuses the loop's body as it is.
      s, ys = self._scan_tokens(s, mask, length, inputs)
    elif isinstance(length, int):
      s, ys = self._scan_tokens_unrolled(s, mask, length, inputs)
    else:
      s, ys = self._scan_chunks(s, mask, length, batch, inputs)
    return (tf.reshape(s, [batch, heads * size * size]),
            tf.reshape(ys, [length * batch, heads, size]))

  def _scan_tokens(self, s, mask, length, inputs):
    """`_wkv_scan`'s loop a token at a time: (the state, S @ r `[T, B, H,
    N]`)."""
    ys = tf.TensorArray(tf.float32, size=length,
                        element_shape=[None, self.heads, self.head_size])

    def body(t, s, ys):
      decay, kk, a, k, v, r = (x[t] for x in inputs)
      new, y = self._wkv_update(s, decay, self._heads(kk), a, k, v, r)
      if mask is not None:
        new = tf.where(mask[t][:, None, None, None], new, s)
      return t + 1, new, ys.write(t, y)

    _, s, ys = tf.while_loop(lambda t, *_: t < length, body,
                             (tf.constant(0), s, ys))
    return s, ys.stack()

  def _scan_tokens_unrolled(self, s, mask, length, inputs):
    """`_scan_tokens` with LiteRT's builtin ops, over a static number of
    tokens (`length`, a prompt chunk's): the factors of every token made at
    once, then the update unrolled, a few ops a token (a TensorArray's ops
    are not builtins, and a loop nested in the chunks' loop got wrong text
    from the converter at 9 blocks or more, builtin kernels only)."""
    decay, kk, a, k, v, r = inputs
    factors = wkv_factors(decay, tf.reshape(kk, [length, -1, self.heads,
                                                 self.head_size]),
                          a, k, v, r, self.heads, self.head_size)
    tokens = zip(*(tf.unstack(f, num=length) for f in factors))
    keep = (tf.unstack(tf.reshape(mask, [length, -1, 1, 1, 1]), num=length)
            if mask is not None else [None] * length)
    ys = []
    for held, token in zip(keep, tokens):
      new, y = wkv_apply(s, WkvFactors(*token))
      s = new if held is None else tf.where(held, new, s)
      ys.append(y)
    return s, tf.stack(ys)

  def _scan_chunks(self, s, mask, length, batch, inputs):
    """`_wkv_scan`'s loop `WKV_CHUNK_TOKENS` tokens at a time, each chunk
    one small XLA program (`_wkv_chunk_program`). The prompt is padded to
    whole chunks and the rows to a power of two (a program per power: a
    server runs any number of rows), each padding row and column holding
    its state. The same equations as `_scan_tokens`, in XLA's
    arithmetic."""
    chunk = WKV_CHUNK_TOKENS
    chunks = (length + chunk - 1) // chunk
    padding = chunks * chunk - length
    powers = tf.constant([1 << i for i in range(31)])
    rows = tf.reduce_min(tf.where(powers >= batch, powers, powers[-1]))
    keep = tf.range(chunks * chunk) < length
    keep = tf.broadcast_to(keep[:, None], [chunks * chunk, batch])
    if mask is not None:
      keep = tf.logical_and(keep, tf.pad(mask, [[0, padding], [0, 0]]))
    keep = tf.pad(keep, [[0, 0], [0, rows - batch]])
    inputs = tuple(tf.pad(t, [[0, padding], [0, rows - batch], [0, 0]])
                   for t in inputs)
    s = tf.pad(s, [[0, rows - batch], [0, 0], [0, 0], [0, 0]])
    update = _wkv_chunk_program(self.heads, self.head_size)
    ys = tf.TensorArray(tf.float32, size=chunks, element_shape=[
        chunk, None, self.heads, self.head_size])

    def body(i, s, ys):
      window = slice(i * chunk, (i + 1) * chunk)
      s, y = update(s, keep[window], *(t[window] for t in inputs))
      return i + 1, s, ys.write(i, y)

    _, s, ys = tf.while_loop(lambda i, *_: i < chunks, body,
                             (tf.constant(0), s, ys))
    return s[:batch], ys.concat()[:length, :batch]

  # The elementwise parts (see the class docstring for the equations); `b`
  # is the block's `_Block`.

  def _time_inputs(self, b, x, ffn_out, prev):
    if ffn_out is not None:
      x = x + as_float32(ffn_out)
    xx = layer_norm(x, b.ln[:2])
    d = prev - xx
    mix = b.mix
    return x, xx, xx + d * mix[0], xx + d * mix[2], xx + d * mix[3]

  def _time_mix(self, b, xx, prev, r, k, v, wkv, v_first):
    decay, kk, a, k, v, r, g, v_first = self._wkv_inputs(b, xx, prev, r, k, v,
                                                         v_first)
    s = tf.reshape(wkv, [-1, self.heads, self.head_size, self.head_size])
    s, y = self._wkv_update(s, decay, kk, a, k, v, r)
    return (self._wkv_output(b, y, r, k, v, g),
            tf.reshape(s, [-1, self.heads * self.head_size ** 2]), v_first)

  def _wkv_inputs(self, b, xx, prev, r, k, v, v_first):
    """What the state update takes, from rows (tokens) alone: the decay,
    kk, a, the modified k and v, r and the gate, all float32 `[rows, C]`;
    v_first is None in block 0, which sets it."""
    w1, w2, a1, a2, v1, v2, g1, g2 = b.loras
    w0, a0, v0, k_k, k_a, _ = b.vectors
    d = prev - xx
    x_w, x_v, x_a, x_g = (xx + d * b.mix[j] for j in (1, 3, 4, 5))
    r, k, v = as_float32(r), as_float32(k), as_float32(v)
    w = w0 + tf.matmul(tf.tanh(tf.matmul(x_w, w1)), w2)
    decay = tf.exp(-tf.exp(-tf.nn.softplus(-w) - 0.5))
    a = tf.sigmoid(a0 + tf.matmul(tf.matmul(x_a, a1), a2))
    g = tf.matmul(tf.sigmoid(tf.matmul(x_g, g1)), g2)
    kk = self._heads(k * k_k)
    kk = kk * tf.math.rsqrt(tf.reduce_sum(tf.square(kk), -1, keepdims=True)
                            + RWKV7_NORMALIZE_EPSILON)
    k = k * (1 + (a - 1) * k_a)
    if v_first is None:
      v_first = v
    else:
      v = v + (v_first - v) * tf.sigmoid(
          v0 + tf.matmul(tf.matmul(x_v, v1), v2))
    return decay, kk, a, k, v, r, g, v_first

  def _heads(self, t):
    return tf.reshape(t, [-1, self.heads, self.head_size])

  def _wkv_update(self, s, decay, kk, a, k, v, r):
    return wkv_update(s, decay, kk, a, k, v, r, self.heads, self.head_size)

  def _wkv_output(self, b, y, r, k, v, g):
    """The block's attention output before O, from S @ r `[rows, H, N]`."""
    heads_of = self._heads
    rh, kh, vh = heads_of(r), heads_of(k), heads_of(v)
    mean, variance = tf.nn.moments(y, [-1], keepdims=True)
    y = (y - mean) * tf.math.rsqrt(variance + RWKV7_GROUP_NORM_EPSILON)
    gamma, beta = b.ln_x
    y = tf.reshape(y, [-1, self.units]) * gamma + beta
    r_k = b.vectors[5]
    y = y + tf.reshape(tf.reduce_sum(rh * kh * tf.reshape(
        r_k, [self.heads, self.head_size]), -1, keepdims=True) * vh,
                       [-1, self.units])
    return tf.cast(y * g, self.compute_dtype)

  def _channel_inputs(self, b, x, att_out, prev):
    x = x + as_float32(att_out)
    xx = layer_norm(x, b.ln[2:])
    return x, xx, xx + (prev - xx) * b.mix[6]

  def _output(self, x, ffn_out):
    return layer_norm(x + as_float32(ffn_out), self.output_norm)


class WkvFactors(NamedTuple):
  """One token's (or, with leading dims, many tokens') factors of the state
  update (`wkv_update`), shaped as they multiply S `[..., H, N, N]`
  ([value, key] per head): `decay` and `kk_a` (kk * a) along the keys
  `[..., H, 1, N]`; `minus_kk`, `v` and `r` along the values `[..., H, N,
  1]`; `k` along the keys."""
  decay: tf.Tensor
  minus_kk: tf.Tensor
  kk_a: tf.Tensor
  v: tf.Tensor
  k: tf.Tensor
  r: tf.Tensor


def wkv_factors(decay, kk, a, k, v, r, heads: int, head_size: int
                ) -> WkvFactors:
  """The update's factors of kk `[..., H, N]` and the rest `[..., C]`."""
  def heads_of(t):
    if t.shape.rank == 2:
      return tf.reshape(t, [-1, heads, head_size])
    return tf.reshape(t, tf.concat([tf.shape(t)[:-1], [heads, head_size]],
                                   0))
  # expand_dims, not t[..., None]: the converter takes no ellipsis slice.
  along_keys = lambda t: tf.expand_dims(t, -2)
  along_values = lambda t: tf.expand_dims(t, -1)
  return WkvFactors(
      decay=along_keys(heads_of(decay)), minus_kk=along_values(-kk),
      kk_a=along_keys(kk * heads_of(a)), v=along_values(heads_of(v)),
      k=along_keys(heads_of(k)), r=along_values(heads_of(r)))


def wkv_apply(s, f: WkvFactors):
  """S' = S diag(decay) + (S (-kk)) (kk * a)^T + v k^T, and S' r: the new
  state and `[..., H, N]` (`tf.linalg.matvec` is this matmul, squeezed)."""
  s = s * f.decay + tf.matmul(s, f.minus_kk) * f.kk_a + f.v * f.k
  return s, tf.squeeze(tf.matmul(s, f.r), -1)


def wkv_update(s, decay, kk, a, k, v, r, heads: int, head_size: int):
  """One token's state update, `s` `[B, H, N, N]` ([value, key] per head),
  kk `[B, H, N]`, the rest `[B, C]`: the new state and S @ r."""
  return wkv_apply(s, wkv_factors(decay, kk, a, k, v, r, heads, head_size))


@functools.lru_cache(maxsize=None)
def _wkv_chunk_program(heads: int, head_size: int):
  """`WKV_CHUNK_TOKENS` tokens' state updates as one XLA program, shared by
  every cell of this head layout in the process (compiled once per power of
  two of rows, not once per model loaded).

  The program takes the state `s` `[B, H, N, N]`, keep `[chunk, B]` (where
  False the row holds its state) and the inputs `[chunk, B, C]`, and gives
  (the state, S @ r `[chunk, B, H, N]`)."""

  def chunk(s, keep, decay, kk, a, k, v, r):
    ys = []
    for t in range(WKV_CHUNK_TOKENS):
      new, y = wkv_update(s, decay[t], tf.reshape(kk[t], [-1, heads,
                                                          head_size]),
                          a[t], k[t], v[t], r[t], heads, head_size)
      s = tf.where(keep[t][:, None, None, None], new, s)
      ys.append(y)
    return s, tf.stack(ys)

  return tf.function(chunk, autograph=False, jit_compile=True)


def _blocks_of(split, stacked):
  """Per block, a `_Block` of its tensors: `split(t)` gives a stacked
  tensor's per-block parts; stacked: ln, mix, vectors, ln_x, the eight
  LoRA matrices, then R, K, V, O, FK, FV (each `[blocks, ...]`)."""
  ln, mix, vectors, ln_x = stacked[:4]
  loras, matrices = stacked[4:12], stacked[12:]
  rows = lambda t: [tuple(tf.unstack(b)) for b in split(t)]
  return [_Block(*parts) for parts in zip(
      rows(ln), rows(mix), rows(vectors), rows(ln_x),
      zip(*map(split, loras)),
      *(int8_arithmetic.split(split, m) for m in matrices))]


def _shifted(seq, initial, length, batch, last):
  """Per row (t, b) of seq `[T*B, C]`, seq's row at the last kept position
  before t (`initial` `[B, C]` where none); last: as in `RWKV7Cell.unroll`,
  None where every position is kept."""
  seq = tf.reshape(seq, [length, batch, -1])
  whole = tf.concat([initial[None], seq], 0)
  if last is None:
    return tf.reshape(whole[:-1], [length * batch, -1])
  before = tf.concat([-tf.ones([1, batch], tf.int32), last[:-1]], 0)
  return tf.reshape(_held(whole, before), [length * batch, -1])


def _final(seq, initial, length, batch, last):
  """seq's row `[B, C]` at each b's last kept position (initial where
  none); as `_shifted`."""
  seq = tf.reshape(seq, [length, batch, -1])
  if last is None:
    return seq[-1]
  whole = tf.concat([initial[None], seq], 0)
  return _held(whole, last[-1:])[0]


def _running_max(marks):
  """`tf.scan(tf.maximum, marks)` over a short time axis (`[T, B]`), with
  LiteRT's builtin ops: each position's maximum over the positions up to
  it, T x T x B values (a prompt chunk's)."""
  length = tf.shape(marks)[0]
  positions = tf.range(length)
  upto = positions[None, :] <= positions[:, None]  # [t, t']: t' <= t.
  return tf.reduce_max(tf.where(upto[:, :, None], marks[None], -1), 1)


def _held(whole, index):
  """`whole[index[t, b] + 1, b]` for each (t, b): whole `[T+1, B, ...]`
  (row 0 the initial value), index int32 `[T', B]` (-1: the initial)."""
  batch = tf.shape(index)[1]
  columns = tf.broadcast_to(tf.range(batch)[None], tf.shape(index))
  return tf.gather_nd(whole, tf.stack([index + 1, columns], -1))


def _squared_relu(x):
  """relu(x)^2, bit for bit, without a Relu op: TensorFlow's LiteRT
  converter fuses a Relu into the product before it, and where the weights
  are not constants (a while loop's body takes them as arguments) that
  product is a BATCH_MATMUL, which has no fused activation: the Relu was
  dropped and the channel mix squared the negative values too."""
  x = as_float32(x)
  return tf.where(x > 0, tf.square(x), tf.zeros_like(x))
