"""Model: a model file's raw tensors in a `tf.Module`, and the forward pass.

`Model` owns the weights as (non-trainable) variables, plus one derived table:
the first layer's input projection for every vocabulary entry,
`input_table[v] = embedding[v] @ K_0 + folded input bias`, so that embedding
lookup and the first input matmul become one gather per step.

`Network` is the forward pass over those weights, built inside a compiled
function (or eagerly) by `Model.network()`. It offers the two ways through the
stack that everything else uses:

  - `step(ids, state)`: one timestep through every layer (generation);
  - `unroll(ids, state, mask)`: layer by layer over a whole sequence, each
    layer's input projection batched over time (scoring and prompt priming);
    `unroll_states` keeps every layer's state at every position
    (`rnnstep.hidden_states`, compiled by `sequence_function`).

Both run the same cell code from `cells.py` (RWKV-7's from `rwkv7.py`),
built by `make_cell`.
"""

import collections
import contextlib
import dataclasses
import os
import weakref
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from rnnstep.model import cells as cells_lib
from rnnstep.model import graph_calls
from rnnstep.model import head as head_lib
from rnnstep.model import int8_arithmetic
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import reduced_weights
from rnnstep.model import rwkv7 as rwkv7_lib
from rnnstep.model import sixteen_bit
from rnnstep.model import vocabulary as vocabulary_lib

# A state is one tuple of tensors per layer: (h,) for GRU/SimpleRNN, (h, c) for LSTM.
StackState = Tuple[Tuple[tf.Tensor, ...], ...]

DTYPES = ("float32", "bfloat16", "float16")

# Output projections of at least this many weights (1 MiB of float32) are
# kept out of XLA's output fusion on the "xla" path (`Network.output_product`).
# Below it one thread reads the kernel in a few microseconds, about what
# handing half of it to another thread costs (the bundled model's 768 x 65
# ran no faster either way).
UNFUSED_PROJECTION_ELEMENTS = 1 << 18


def _swap_last_axes(array) -> tf.Tensor:
  """`[..., in, out]` <-> `[..., out, in]` (`Kind.held_transposed`);
  TensorFlow's transpose, 2.5x numpy's (0.1B: 0.08 s for 340 MB)."""
  return tf.linalg.matrix_transpose(array)


class Architecture(NamedTuple):
  """All a compiled program depends on besides the weights' values.

  Two models with equal architectures share their compiled programs
  (`shared_function`): the weights are the programs' arguments, never
  captured, so a reloaded or retrained model of one shape reuses what the
  first one traced and compiled (a notebook that loads a file again, the
  tests' many small models, a server holding two models of one shape).

  Attributes:
    config: the `model_file.ModelConfig`, without its recorded window (the
      window is a request's value, not part of any program).
    vocab_size: V.
    has_unk: whether id 0 is "[UNK]" (never chosen: see `Network.banned`).
    compute_dtype: the matmuls' dtype, by name.
    int8_products: whether the large matrices are int8 and multiply in
      `int8_arithmetic` (`weights_dtype="int8"`).
    held_16bit: "float16" or "bfloat16" where the `Kind.held_transposed`
      matrices and the head (then `[V, U]`) are held in it and widened in
      their products (`sixteen_bit`), else None; other float16 and bfloat16
      weights are float32 values of the float32 programs.
  """
  config: model_file.ModelConfig
  vocab_size: int
  has_unk: bool
  compute_dtype: str
  int8_products: bool = False
  held_16bit: Optional[str] = None


class BoundFunction:
  """A shared compiled function with one model's weights as its first argument.

  Calling it calls `function(weights(), *args)` (`function`'s first argument
  is `Model.network_weights()`'s structure), reading the weights at each
  call (so a model whose variables are assigned new values runs with them);
  with `graph` (a TensorFlow graph, no XLA program) without Grappler
  (`graph_calls`). It offers what callers of a `tf.function` use:
  `get_concrete_function()` and `experimental_get_tracing_count()`.
  """

  def __init__(self, function, weights: Callable[[], dict], *,
               graph: bool = True):
    self.function = function
    self._weights = weights
    self._graph = graph

  def _options(self):
    return (graph_calls.without_grappler() if self._graph
            else contextlib.nullcontext())

  def __call__(self, *args):
    with self._options():
      return self.function(self._weights(), *args)

  def call_concrete(self, concrete, *args):
    """Calls `concrete` (from `get_concrete_function`) with the weights."""
    with self._options():
      return concrete(self._weights(), *args)

  def get_concrete_function(self):
    return self.function.get_concrete_function()

  def experimental_get_tracing_count(self) -> int:
    return self.function.experimental_get_tracing_count()


# (architecture, name) -> tf.function, most recently used last. Bounded, so a
# process that loads many architectures keeps only the latest programs.
_SHARED_FUNCTIONS = collections.OrderedDict()
MAX_SHARED_FUNCTIONS = 64


def shared_function(architecture: Architecture, name: str,
                    build: Callable[[], Callable]):
  """The compiled function `name` (with its path, where it has one) of an
  architecture: the `tf.function` `build()` made at first use, shared by
  every model of the architecture."""
  key = (architecture, name)
  function = _SHARED_FUNCTIONS.get(key)
  if function is None:
    function = _SHARED_FUNCTIONS[key] = build()
    while len(_SHARED_FUNCTIONS) > MAX_SHARED_FUNCTIONS:
      _SHARED_FUNCTIONS.popitem(last=False)
  else:
    _SHARED_FUNCTIONS.move_to_end(key)
  return function


class Model(tf.Module):
  """A recurrent language model: Embedding -> recurrent layers -> Dense.

  Attributes:
    config: the `model_file.ModelConfig`.
    vocab: the characters (or token strings) in id order (id 0 may be
      "[UNK]").
    tokens: the `vocabulary.Tokens`: the vocabulary's kind and rules, which
      `encode` and `decode` follow.
    has_unk: whether id 0 is "[UNK]" (it is never sampled).
    compute_dtype: the dtype of the recurrent and output matmuls.
    weights_dtype: the dtype its large matrices are stored in
      (`reduced_weights`: float32, float16, bfloat16 or int8); the tensors
      are those values, exactly, in float32. With int8 each matrix
      (not the embedding, a gather) is an `int8_arithmetic.Int8Kernel`
      of variables, which multiplies in XNNPACK's int8 arithmetic.
    source: the file the model was read from, if any.
    chat_template: the `model_file.ChatTemplateData` found with it, or None.
  """

  chat_template: Optional[model_file.ChatTemplateData] = None

  def __init__(self, config: model_file.ModelConfig, vocab: Sequence[str],
               tensors, dtype: str = "float32", source: Optional[str] = None,
               name: Optional[str] = None,
               tokens: Optional[vocabulary_lib.Tokens] = None,
               weights_dtype: str = reduced_weights.FLOAT32):
    """Builds a model from validated tensors (see `model_file.validate`).

    Args:
      config: the architecture.
      vocab: characters (or token strings) in id order.
      tensors: float32 arrays keyed as in the model file.
      dtype: 'float32', or 'bfloat16'/'float16' for reduced-precision matmuls.
      source: where the weights came from, for messages.
      name: the tf.Module name.
      tokens: the vocabulary's kind and rules; None: characters.
      weights_dtype: one of `reduced_weights.WEIGHTS_DTYPES`: the large
        matrices are rounded to it (those already of it are kept exactly).

    Raises:
      ValueError: an unknown dtype or weights dtype, or tensors that do not
        fit the config.
    """
    super().__init__(name=name)
    if dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if tokens is not None and tokens.kind == "characters":
      tokens = None
    vocab = model_file.validate_vocab(list(vocab), source,
                                      tokens=tokens is not None)
    if tokens is not None and tuple(vocab) != tokens.vocab:
      raise ValueError("the vocab and the tokens' vocabulary differ")
    tensors = model_file.reduce_tensors(
        config, model_file.validate(config, vocab, tensors, source),
        weights_dtype)
    self.weights_dtype = weights_dtype
    self.config = config
    self.vocab = tuple(vocab)
    self.tokens = tokens or vocabulary_lib.characters(vocab)
    self.has_unk = vocab[0] == model_file.UNK_TOKEN
    self.compute_dtype = tf.as_dtype(dtype)
    self.source = source
    self._char_to_id = {c: i for i, c in enumerate(vocab)}

    int8_keys = ({key for key, axis in config.reduced_keys().items()
                  if axis == -2}
                 if weights_dtype == "int8" else set())

    # The kinds' `held_transposed` matrices, held `[..., out, in]`; with
    # 16-bit weights, in 16 bits, and the head with them (`sixteen_bit`).
    self._held_transposed = {
        key for i, layer in enumerate(config.layers)
        for name in kinds.get(layer.kind).held_transposed
        for key in (f"layer{i}_{name}",
                    f"layer{i}_{model_file.BACKWARD}{name}")
        if key in tensors and key not in int8_keys}
    self.held_16bit = (weights_dtype if self._held_transposed and
                       weights_dtype in sixteen_bit.WEIGHTS_DTYPES else None)
    if self.held_16bit:
      self._held_transposed.add("dense_kernel")

    def var(key):
      if key in int8_keys:
        return int8_arithmetic.variables(tensors[key], key)
      value = tensors[key]
      if key in self._held_transposed:
        if self.held_16bit:  # The values are 16-bit ones: exact.
          value = tf.cast(value, weights_dtype)
        value = _swap_last_axes(value)
      return tf.Variable(value, trainable=False, name=key)

    self.embedding = var("embedding")
    # One dict per layer of the tensors its kind declares (`kinds.py`).
    self.layer_weights = [
        {name: var(f"layer{i}_{name}")
         for name in kinds.get(layer.kind).tensor_names}
        for i, layer in enumerate(config.layers)]
    # A bidirectional layer's backward copy (`model_file.BACKWARD`), None
    # for a layer of one direction; the head's Dense layers.
    self.backward_weights = [
        {name: var(f"layer{i}_{model_file.BACKWARD}{name}")
         for name in kinds.get(layer.kind).tensor_names}
        if layer.bidirectional else None
        for i, layer in enumerate(config.layers)]
    self.attention_kernel = (var("attention_kernel") if config.attention
                             else None)
    self.head_weights = [{"kernel": var(f"head{j}_kernel"),
                          "bias": var(f"head{j}_bias")}
                         for j in range(len(config.head))]
    self.dense_kernel = var("dense_kernel")
    self.dense_bias = var("dense_bias")
    # The first layer's input projection for every id, computed in float32
    # whatever the compute dtype (it is only gathered, never multiplied
    # again; from an int8 kernel's float32 values: `int8_arithmetic`).
    first = make_cell(config.layers[0],
                      int8_arithmetic.decoded_layer(self.layer_weights[0]))
    self.input_table = tf.Variable(first.project_inputs(self.embedding),
                                   trainable=False, name="input_table")
    self.backward_input_table = None
    if self.backward_weights[0] is not None:  # The same for its backward copy.
      backward = make_cell(
          config.layers[0],
          int8_arithmetic.decoded_layer(self.backward_weights[0]))
      self.backward_input_table = tf.Variable(
          backward.project_inputs(self.embedding), trainable=False,
          name="backward_input_table")

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def num_parameters(self) -> int:
    return sum(int(np.prod(v.shape)) for v in self.tensors().values())

  @property
  def is_characters(self) -> bool:
    """Whether every token is one character (a format 1 model)."""
    return self.tokens.kind == "characters"

  def encode(self, text: str) -> np.ndarray:
    """Maps a string to int32 ids, by the vocabulary's rules.

    Raises:
      ValueError: naming the first character (or word) that is not in the
        vocabulary.
    """
    if not self.is_characters:
      return self.tokens.encode(text)
    try:
      return np.fromiter((self._char_to_id[c] for c in text), np.int32, len(text))
    except KeyError as e:
      char = e.args[0]
      raise ValueError(
          f"character {char!r} (U+{ord(char):04X}) at position {text.index(char)} "
          "is not in the model's vocabulary; remove or replace it") from None

  def decode(self, ids) -> str:
    """Maps ids back to a string (token models: their pieces as UTF-8)."""
    if not self.is_characters:
      return self.tokens.decode(ids)
    vocab = self.vocab
    return "".join(vocab[i] for i in np.asarray(ids).ravel().tolist())

  def tensors(self):
    """The weights as float32 numpy arrays, keyed and laid out as in the
    model file (an int8 kernel's float32 values)."""
    numpy = int8_arithmetic.numpy_values
    tensors = {"embedding": numpy(self.embedding),
               "dense_kernel": numpy(self.dense_kernel),
               "dense_bias": numpy(self.dense_bias)}
    for i, weights in enumerate(self.layer_weights):
      for name, weight in weights.items():
        tensors[f"layer{i}_{name}"] = numpy(weight)
      for name, weight in (self.backward_weights[i] or {}).items():
        tensors[f"layer{i}_{model_file.BACKWARD}{name}"] = numpy(weight)
    for j, weights in enumerate(self.head_weights):
      for name, weight in weights.items():
        tensors[f"head{j}_{name}"] = numpy(weight)
    for key in self._held_transposed:
      tensors[key] = _swap_last_axes(
          tf.cast(tensors[key], tf.float32)).numpy()
    if self.attention_kernel is not None:
      tensors["attention_kernel"] = self.attention_kernel.numpy()
    return tensors

  @property
  def architecture(self) -> Architecture:
    """What this model's compiled programs depend on (shared by equal ones)."""
    return Architecture(dataclasses.replace(self.config, window=None),
                        self.vocab_size, self.has_unk, self.compute_dtype.name,
                        self.weights_dtype == "int8", self.held_16bit)

  def network_weights(self) -> dict:
    """The variables a `Network` reads, as one structure (see `network_of`):
    layer 0's kernel left out (folded into `input_table`, its backward
    copy's into `backward_input_table`); `"backward"` (per layer, a dict,
    empty for a layer of one direction) and `"head"` only where a model has
    them, so other programs' signatures are as before."""
    def layer_weights(i, weights):
      return {name: weight for name, weight in weights.items()
              if not (i == 0 and name == "kernel")}

    weights = {"input_table": self.input_table,
               "dense_kernel": self.dense_kernel,
               "dense_bias": self.dense_bias,
               "layers": tuple(layer_weights(i, weights)
                               for i, weights in enumerate(self.layer_weights))}
    if self.backward_input_table is not None:
      weights["backward_input_table"] = self.backward_input_table
    if any(w is not None for w in self.backward_weights):
      weights["backward"] = tuple(layer_weights(i, weights or {})
                                  for i, weights
                                  in enumerate(self.backward_weights))
    if self.head_weights:
      weights["head"] = tuple(dict(layer) for layer in self.head_weights)
    if self.attention_kernel is not None:  # It reads the embedded window.
      weights["attention"] = {"kernel": self.attention_kernel,
                              "embedding": self.embedding}
    return weights

  def weights_spec(self) -> dict:
    """`tf.TensorSpec`s of `network_weights()`, equal for equal architectures."""
    return tf.nest.map_structure(
        lambda weight: tf.TensorSpec(weight.shape, weight.dtype,
                                     name=weight.name.split(":")[0]),
        self.network_weights())

  def network(self, compile_elementwise: bool = False) -> "Network":
    """Returns the forward pass over the current weights (read once, here).

    Args:
      compile_elementwise: compile each cell's gate math with XLA, leaving the
        matmuls to TensorFlow (see `cells.py`).
    """
    return network_of(self.architecture, self.network_weights(),
                      compile_elementwise)

  def score(self, ids):
    """Teacher-forced logits `[B, T, V]` from a zero state, for ids `[B, T]`.

    One compiled call, shared by every model of this architecture.
    """
    return score_function(self)(ids)


class Network:
  """The forward pass of a Model, over weight tensors read once.

  Args:
    cells: one `cells.Cell` per layer (layer 0's kernel is in `input_table`).
    input_table: `[V, G*U_0]`, layer 0's input projection per id.
    dense_kernel: `[U_last, V]` in the compute dtype (`[V, U_last]` in 16
      bits with `held_16bit`).
    dense_bias: `[V]`.
    has_unk: whether id 0 is "[UNK]".
    backward: a `Backward` for a model with bidirectional layers, else None.
    head: `(kernel, bias, activation)` per head Dense layer, kernels in the
      compute dtype.
    attention: `{"kernel": [W, 1], "embedding": [V, D]}` for a model with
      textgenrnn's attention (`window_logits`), else None.
    one_xla_program: the network is traced into one XLA program (the "xla"
      path), where a large output projection is kept out of XLA's output
      fusion (`output_product`).
    held_16bit: `Architecture.held_16bit`.
    compute_dtype: the dtype of the products (`Model.compute_dtype`).

  Attributes:
    banned: float32 `[V]`, -inf at "[UNK]" (id 0) and 0 elsewhere, which
      the option pipeline adds to every step's logits so that it is never
      chosen; None where the vocabulary has no "[UNK]".
  """

  def __init__(self, cells, input_table, dense_kernel, dense_bias, has_unk,
               backward=None, head=(), attention=None, one_xla_program=False,
               held_16bit=None, compute_dtype=tf.float32):
    self.cells = cells
    self.input_table = input_table
    self.dense_kernel = dense_kernel
    self.dense_bias = dense_bias
    self.backward = backward
    self.head = tuple(head)
    self.attention = attention
    self.vocab_size = int(dense_bias.shape[0])
    self.one_xla_program = one_xla_program
    self.held_16bit = held_16bit
    self.compute_dtype = compute_dtype
    self.unfused_projection = one_xla_program and (
        int8_arithmetic.shape(dense_kernel).num_elements()
        >= UNFUSED_PROJECTION_ELEMENTS)
    self.banned = None
    if has_unk:
      self.banned = tf.one_hot(0, self.vocab_size, on_value=-float("inf"),
                               off_value=0.0)

  def zero_state(self, batch_size) -> StackState:
    return tuple(cell.zero_state(batch_size) for cell in self.cells)

  def logits(self, outputs: tf.Tensor) -> tf.Tensor:
    """The Dense layer on top-layer outputs `[..., U]` -> logits `[..., V]`."""
    return self.logits_of_product(self.output_product(outputs))

  def output_product(self, outputs: tf.Tensor) -> tf.Tensor:
    """`outputs @ dense_kernel` in the compute dtype: the logits before bias
    (after the head's Dense layers, where the model has them)."""
    for kernel, bias, activation in self.head:
      outputs = head_lib.ACTIVATIONS[activation](
          cells_lib.matmul(outputs, kernel,
                           int8_arithmetic.product_dtype(kernel)) + bias)
    product = cells_lib.matmul(
        outputs, self.dense_kernel, self.compute_dtype, float32_result=False,
        transposed=bool(self.held_16bit), in_xla=self.one_xla_program)
    if self.unfused_projection:
      # XLA's CPU backend fuses a matrix-vector product (batch 1) with the
      # add that consumes it (the bias, `logits_of_product`) into one output
      # fusion, which it runs as a loop on a single thread; a plain dot runs
      # on Eigen over the whole intra-op pool. The barrier keeps this dot
      # plain (it compiles to nothing; the logits are unchanged), which made a
      # word model's batch-1 step markedly faster (a 2-vCPU EPYC Zen 4,
      # benchmarks/results/epyc-zen4-2026-12.md); batch > 1 is never
      # output-fused, so it is a no-op.
      (product,) = sixteen_bit.optimization_barrier(product)
    return product

  def window_logits(self, ids: tf.Tensor) -> tf.Tensor:
    """The logits after a whole window of ids `[B, k]`, from a zero state.

    Each layer runs over the k steps (a bidirectional layer's backward copy
    over them reversed, Keras `Bidirectional`); the last layer's output is
    its output after the last step (`return_sequences=False`): for a
    bidirectional one, `[forward after step k-1 | backward after step 0]`.
    Below it, a bidirectional layer's output at step t is `[forward_t |
    backward_t]`, the backward sequence reversed back into time order, as
    Keras merges `return_sequences=True` (merge_mode "concat").

    Returns:
      float32 `[B, V]`.
    """
    ids = tf.transpose(ids)  # Time-major [k, B].
    batch = tf.shape(ids)[1]
    reverse = lambda x: tf.reverse(x, [0])
    # With attention every layer returns its sequence, all of them read.
    last = -1 if self.attention else len(self.cells) - 1
    sequences = []
    for i, cell in enumerate(self.cells):
      forward_in = (cells_lib.TableRows(self.input_table, ids) if i == 0
                    else cell.project_inputs(outputs))
      (forward,), _ = _unroll_cell(cell, forward_in, cell.zero_state(batch),
                                    None)
      backward_cell = self.backward.cells[i] if self.backward else None
      if backward_cell is None:
        outputs = forward
        sequences.append(outputs)
        continue
      backward_in = (
          cells_lib.TableRows(self.backward.input_table, reverse(ids))
          if i == 0 else backward_cell.project_inputs(reverse(outputs)))
      (backward,), _ = _unroll_cell(backward_cell, backward_in,
                                    backward_cell.zero_state(batch), None)
      if i == last:
        return self.logits(tf.concat([forward[-1], backward[-1]], -1))
      outputs = tf.concat([forward, reverse(backward)], -1)
      sequences.append(outputs)
    if self.attention:
      embedded = tf.gather(self.attention["embedding"], ids)
      return self.logits(head_lib.attention_weighted_average(
          tf.concat([embedded, *sequences], -1), self.attention["kernel"]))
    return self.logits(outputs[-1])

  def logits_of_product(self, product: tf.Tensor) -> tf.Tensor:
    """Logits from `output_product`'s result (widened, plus the bias)."""
    return tf.cast(product, tf.float32) + self.dense_bias

  def first_projection(self, ids: tf.Tensor) -> tf.Tensor:
    """Layer 0's input projection for ids `[B]`: rows of `input_table`."""
    return tf.gather(self.input_table, ids)

  def advance(self, ids: tf.Tensor, state: StackState):
    """One timestep through every layer for ids `[B]`.

    Returns:
      `(top_output [B, U_last], new_state)`.
    """
    # Layer 0's rows are gathered inside its gate function (fused when compiled).
    return self.advance_projected(cells_lib.TableRows(self.input_table, ids),
                                  state)

  def advance_projected(self, x_proj, state: StackState):
    """`advance` from layer 0's input projection (`first_projection(ids)`).

    Args:
      x_proj: `[B, G*U_0]`, or a `cells.TableRows`.
      state: the stack's state.

    Returns:
      `(top_output [B, U_last], new_state)`.
    """
    output, first = self.cells[0].step(x_proj, state[0])
    return self.advance_above(output, (first,) + tuple(state[1:]))

  def advance_above(self, output: tf.Tensor, state: StackState):
    """The rest of a timestep once layer 0 has stepped.

    Args:
      output: layer 0's new output `[B, U_0]`.
      state: layer 0's new state, then the other layers' previous states.

    Returns:
      `(top_output [B, U_last], new_state)`.
    """
    new_state = [state[0]]
    for cell, layer_state in zip(self.cells[1:], state[1:]):
      output, layer_state = cell.step(cell.project_inputs(output), layer_state)
      new_state.append(layer_state)
    return output, tuple(new_state)

  def step(self, ids: tf.Tensor, state: StackState):
    """One timestep: ids `[B]` -> `(logits [B, V], new_state)`."""
    output, state = self.advance(ids, state)
    return self.logits(output), state

  def step_projected(self, x_proj, state: StackState):
    """`step` from layer 0's input projection (see `advance_projected`)."""
    output, state = self.advance_projected(x_proj, state)
    return self.logits(output), state

  def unroll(self, ids: tf.Tensor, state: StackState,
             mask: Optional[tf.Tensor] = None, steps=None):
    """Runs ids `[B, T]` through the stack, layer by layer.

    Args:
      ids: int32 `[B, T]`.
      state: the initial state.
      mask: optional bool `[B, T]`; where False the row's state is carried over
        unchanged (bit for bit), so padding never touches a row.
      steps: run only the first `steps` columns (default: all T); the mask
        must be False beyond them. Priming stops at the longest prompt rather
        than at the bucketed width.

    Returns:
      `(top_outputs [B, T, U_last], final_state)`; outputs past `steps` are 0.
    """
    sequences, final = self._unroll_layers(ids, state, mask, steps,
                                           record_states=False)
    return tf.transpose(sequences[-1][0], [1, 0, 2]), final

  def unroll_states(self, ids: tf.Tensor, state: StackState,
                    mask: Optional[tf.Tensor] = None):
    """Like `unroll`, but keeps every layer's state after every position.

    Args:
      ids: int32 `[B, T]`.
      state: the initial state.
      mask: optional bool `[B, T]`; where False the row's state is held from
        its previous position (so a right-padded row's padding columns repeat
        the state after its last real position, and column T-1 is always each
        row's final state).

    Returns:
      `(sequences, final_state)`: `sequences` has one tuple per layer, `(h,)`
      or `(h, c)` (LSTM), each `[B, T, U]` float32; `sequences[-1][0]` is
      `unroll`'s top outputs.
    """
    sequences, final = self._unroll_layers(ids, state, mask, None,
                                           record_states=True)
    return tuple(tuple(tf.transpose(s, [1, 0, 2]) for s in layer)
                 for layer in sequences), final

  def _unroll_layers(self, ids, state, mask, steps, record_states):
    """`unroll`'s loop over layers; time-major sequences per layer.

    Returns:
      `(sequences, final_state)`: per layer, the `[T, B, U]` tensors
      `_unroll_cell` recorded (`(h,)`, or the whole state with
      `record_states`), and the final state.
    """
    # Layer 0's rows are gathered step by step: a `[T, B, G*U]` gather of a
    # long prompt at a large batch costs a step's time and memory up front.
    x_proj = cells_lib.TableRows(self.input_table, tf.transpose(ids))
    mask_tm = None if mask is None else tf.transpose(mask)
    sequences, final = [], []
    for i, (cell, layer_state) in enumerate(zip(self.cells, state)):
      if i:
        x_proj = cell.project_inputs(outputs)  # [T, B, G*U], one matmul.
      recorded, layer_state = _unroll_cell(cell, x_proj, layer_state, mask_tm,
                                           steps, record_states)
      outputs = recorded[0]
      sequences.append(recorded)
      final.append(layer_state)
    return tuple(sequences), tuple(final)


def _unroll_cell(cell, x_proj, state, mask, steps=None, record_states=False):
  """Time-major loop of one cell: x_proj `[T, B, G*U]` -> outputs `[T, B, U]`.

  Args:
    cell: the layer's `cells.Cell`.
    x_proj: its input projection, time-major `[T, B, G*U]`, or a
      `cells.TableRows` whose ids are time-major `[T, B]`.
    state: the initial state.
    mask: optional time-major bool `[T, B]` (see `Network.unroll`).
    steps: run only the first `steps` columns (all T by default).
    record_states: record every state tensor at every step, not only h.

  Returns:
    `(recorded, final_state)`: `recorded` is `(outputs [T, B, U],)`, or with
    `record_states` the whole state per step, `(h, c)` for an LSTM (its h is
    the output).
  """
  if cell.unrolls_blockwise and not record_states:
    return cell.unroll(x_proj, state, mask, steps)
  if isinstance(x_proj, cells_lib.TableRows):
    size = tf.shape(x_proj.ids)[0]
    column = lambda t: tf.gather(x_proj.table, x_proj.ids[t])
  else:
    size = tf.shape(x_proj)[0]
    column = lambda t: x_proj[t]
  # At least one step: a TensorArray with nothing written cannot be stacked
  # in graph mode (the extra step of a 1-character prompt is masked out).
  steps = size if steps is None else tf.clip_by_value(steps, 1, size)
  outputs = tuple(
      tf.TensorArray(tf.float32, size=size, element_shape=[None, width])
      for width in (cell.state_size if record_states else (cell.units,)))

  def body(t, state, x_t, keep_t, outputs):
    # Step t+1's columns are sliced a step ahead into the loop state: sliced
    # inside the gate math, XLA's CPU backend leaves that fusion unvectorized.
    following = tf.minimum(t + 1, size - 1)
    output, new_state = cell.step(x_t, state)
    if mask is not None:
      keep = keep_t[:, None]
      new_state = tuple(tf.where(keep, new, old)
                        for new, old in zip(new_state, state))
      output = new_state[0]
      keep_t = mask[following]
    # A cell's output is its new state's h: recording the state records it.
    recorded = new_state if record_states else (output,)
    outputs = tuple(array.write(t, value)
                    for array, value in zip(outputs, recorded))
    return t + 1, new_state, column(following), keep_t, outputs

  first_keep = tf.zeros([0], tf.bool) if mask is None else mask[0]
  _, state, _, _, outputs = tf.while_loop(
      lambda t, *_: t < steps, body,
      (tf.constant(0), state, column(0), first_keep, outputs))
  return tuple(array.stack() for array in outputs), state


class Backward(NamedTuple):
  """A model's backward copies of its bidirectional layers.

  Attributes:
    cells: per layer, the backward `cells.Cell`, or None (one direction).
    input_table: layer 0's backward input projection per id, `[V, G*U_0]`
      (None when layer 0 runs one direction).
  """
  cells: Tuple[Optional[cells_lib.Cell], ...]
  input_table: Optional[tf.Tensor]


# The modules that hold the cell classes the kinds name
# (`kinds.Kind.cell_class`).
_CELL_MODULES = (cells_lib, rwkv7_lib)


def cell_class(kind: kinds.Kind) -> type:
  """The `cells.Cell` class that computes a kind (its `cell_class`)."""
  module = next(m for m in _CELL_MODULES if hasattr(m, kind.cell_class))
  return getattr(module, kind.cell_class)


def unrolls_blockwise(config) -> bool:
  """Whether a `model_file.ModelConfig` has a cell that unrolls a sequence
  block by block (`cells.Cell.unrolls_blockwise`: RWKV-7)."""
  return any(cell_class(kinds.get(layer.kind)).unrolls_blockwise
             for layer in config.layers)


def compiles_per_batch(config) -> bool:
  """Whether a `model_file.ModelConfig` has a cell that compiles small XLA
  programs per batch size outside one XLA program
  (`cells.Cell.compiles_per_batch`: RWKV-7)."""
  return any(cell_class(kinds.get(layer.kind)).compiles_per_batch
             for layer in config.layers)


def make_cell(layer_config, tensors, compute_dtype=tf.float32,
              compile_elementwise=False) -> cells_lib.Cell:
  """Builds the cell for a `model_file.LayerConfig` from its tensors.

  Args:
    layer_config: the layer's `model_file.LayerConfig`.
    tensors: {name: tensor} for each of the names its kind declares
      (`kinds.Kind.tensor_names`; the kernel may be None where it is folded
      into an input table).
    compute_dtype: the matmuls' dtype.
    compile_elementwise: compile the gate math with XLA.
  """
  kind = kinds.get(layer_config.kind)  # ValueError for an unknown kind.
  variant = ({"reset_after": layer_config.reset_after}
             if kind.has_reset_after else {})
  if kind.size_names:
    variant["sizes"] = layer_config.size
  return cell_class(kind)(
      **{name: tensors[name] for name in kind.tensor_names},
      compute_dtype=compute_dtype, compile_elementwise=compile_elementwise,
      activation=kind.activation, **variant)


def network_of(architecture: Architecture, weights: dict,
               compile_elementwise: bool = False,
               one_xla_program: bool = False) -> Network:
  """The forward pass of an architecture over weight tensors.

  Args:
    architecture: the models' `Architecture`.
    weights: tensors (or variables) structured as `Model.network_weights()`.
    compile_elementwise: compile each cell's gate math with XLA, leaving the
      matmuls to TensorFlow (see `cells.py`).
    one_xla_program: the caller traces the network into one XLA program (see
      `Network`).

  Returns:
    The `Network`.
  """
  dtype = tf.as_dtype(architecture.compute_dtype)
  cells = []
  for i, (layer, layer_weights) in enumerate(zip(architecture.config.layers,
                                                 weights["layers"])):
    if i == 0:  # Folded into input_table; never multiplied again.
      layer_weights = dict(layer_weights, kernel=None)
    cells.append(make_cell(layer, layer_weights, dtype, compile_elementwise))
    cells[-1].one_xla_program = one_xla_program
  backward = None
  if "backward" in weights:
    backward = Backward(
        tuple(make_cell(layer, dict(layer_weights, kernel=None)
                        if i == 0 else layer_weights, dtype,
                        compile_elementwise)
              if layer.bidirectional else None
              for i, (layer, layer_weights) in enumerate(zip(
                  architecture.config.layers, weights["backward"]))),
        (tf.convert_to_tensor(weights["backward_input_table"])
         if "backward_input_table" in weights else None))
  head = [(int8_arithmetic.cast(layer_weights["kernel"], dtype),
           tf.convert_to_tensor(layer_weights["bias"]), layer.activation)
          for layer, layer_weights in zip(architecture.config.head,
                                          weights.get("head", ()))]
  attention = None
  if "attention" in weights:
    attention = {name: tf.convert_to_tensor(weight)
                 for name, weight in weights["attention"].items()}
  return Network(cells, tf.convert_to_tensor(weights["input_table"]),
                 sixteen_bit.cast(weights["dense_kernel"], dtype),
                 tf.convert_to_tensor(weights["dense_bias"]),
                 architecture.has_unk, backward, head, attention,
                 one_xla_program, architecture.held_16bit, dtype)


def score_function(model: Model) -> BoundFunction:
  """The compiled `ids [B, T] -> logits [B, T, V]` (`Model.score`) for a model.

  Built once per architecture; the model's weights are passed at each call.
  """
  architecture = model.architecture

  def build():
    def score(weights, ids):
      network = network_of(architecture, weights)
      outputs, _ = network.unroll(ids, network.zero_state(tf.shape(ids)[0]))
      return network.logits(outputs)
    return tf.function(score, autograph=False, input_signature=[
        model.weights_spec(), tf.TensorSpec([None, None], tf.int32)])

  return BoundFunction(
      shared_function(architecture, "score", build),
      model.network_weights)


_REPLICATED = weakref.WeakKeyDictionary()


def replicated(model: Model, strategy) -> Model:
  """The model with its weights on every replica of a `tf.distribute` strategy.

  A model whose variables were made under `strategy.scope()` is returned as it
  is; any other is copied once under the scope (and the copy cached), so a
  compiled function on every replica reads weights on its own device.
  """
  if strategy.extended.variable_created_in_scope(model.embedding):
    return model
  per_strategy = _REPLICATED.setdefault(model, weakref.WeakKeyDictionary())
  copy = per_strategy.get(strategy)
  if copy is None:
    with strategy.scope():
      copy = Model(model.config, model.vocab, model.tensors(),
                   model.compute_dtype.name, model.source, name=model.name,
                   tokens=model.tokens, weights_dtype=model.weights_dtype)
    per_strategy[strategy] = copy
  return copy


def from_file(model_data: model_file.ModelFile, dtype: str = "float32",
              source: Optional[str] = None,
              weights_dtype: Optional[str] = None) -> Model:
  """Builds a Model from a read model file; `weights_dtype` None keeps the
  file's (another rounds its weights to that dtype)."""
  name = None
  if source:
    stem = os.path.splitext(os.path.basename(source))[0]
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or None
    if name and name[0].isdigit():
      name = "m_" + name
  model = Model(model_data.config, model_data.vocab, model_data.tensors,
                dtype, source, name=name, tokens=model_data.tokens,
                weights_dtype=weights_dtype or model_data.weights_dtype)
  model.chat_template = model_data.chat_template
  return model
