"""The library API: load a model, score text, read its states, generate text.

    import rnnstep
    model = rnnstep.load()                      # the bundled Shakespeare model
    print(rnnstep.generate(model, "ROMEO:", 200, temperature=0.8, seed=1))

Every argument is checked here, with the caller's words, before anything is
compiled or allocated; the compiled work lives in `generator.py`.
"""

import collections.abc
import importlib.resources
import os
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from rnnstep.decoding import constraints
from rnnstep.decoding import options as options_lib
from rnnstep.engine import compiling
from rnnstep.engine import generator as generator_lib
from rnnstep.engine import host
from rnnstep.engine import paths
from rnnstep.engine import request
from rnnstep.engine import scoring
from rnnstep.engine import window as window_lib
from rnnstep.engine import xla_cache
from rnnstep import errors
from rnnstep import records
from rnnstep.model import cells
from rnnstep.model.check import check_model
from rnnstep.model import functions as functions_lib
from rnnstep.model import model_file
from rnnstep.model import network as model_lib
from rnnstep.model import reduced_weights
from rnnstep.model import vocabulary

# A str, token ids (a list of ints: one prompt), or a list of either.
Prompts = Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]]


def bundled_model_path() -> str:
  """The path of the model shipped inside the package."""
  return str(importlib.resources.files("rnnstep").joinpath(
      *records.BUNDLED_MODEL.split(os.sep)))


def load(path: Optional[Union[str, os.PathLike]] = None, *,
         dtype: str = "float32",
         corpus: Optional[Union[str, os.PathLike]] = None,
         vocab: Union[None, str, os.PathLike, Sequence[str]] = None,
         weights_dtype: Optional[str] = None) -> model_lib.Model:
  """Loads a model file, or converts Keras / PyTorch weights on the fly.

  Args:
    path: a `.npz` model file (its format: docs/guide/model-file.md), or
      any weights file `rnnstep-convert` reads (Keras `.keras` / `.h5` / TF
      checkpoint, PyTorch `.pt` / `.pth` / `.bin` / `.safetensors` state
      dict), read as data with the same checks; None loads the bundled model.
    dtype: 'float32', or 'bfloat16'/'float16' for reduced-precision matmuls.
    corpus: for weights files, which hold no vocabulary: the training text
      (UTF-8); the vocabulary is `sorted(set(text))`. A folder:
      word_language_model's corpus (its words, numbered as `data.Corpus`
      numbers them). (A char-rnn-tensorflow
      save directory holds its own, `chars_vocab.pkl`: give neither.)
    vocab: for weights files, instead of `corpus`: a vocabulary file (a JSON
      list of the characters or words in id order; a Keras `Tokenizer`'s
      `to_json()`, a Hugging Face `tokenizer.json`, `{"kind": "bytes"}`) or
      a list of characters or words (or textgenrnn's `{token: index}` dict,
      `textgen.vocab`). Neither for a
      Keras model with a TextVectorization layer, which holds its own.
    weights_dtype: 'float16', 'bfloat16' or 'int8' rounds the large
      matrices to that dtype (int8: per output channel, float32 scales),
      and they are the model's weights from then on, on every path; the
      arithmetic stays float32 (that is `dtype`). None keeps the file's
      (float32 unless it was written with one); 'float32' keeps the
      weights as they are. docs/guide/performance.md has what each costs in
      quality and speed.

  Returns:
    The Model.

  Raises:
    FileNotFoundError: no such file (or no bundled model in this install).
    ValueError: the file is not a valid model or weights file, a weights file
      without `corpus`/`vocab` (or a model file with one), a vocabulary that
      does not fit, or a bad path (not a str or os.PathLike), dtype or
      weights_dtype.
  """
  check_dtypes(dtype, weights_dtype)
  return build(read(path, corpus=corpus, vocab=vocab), path, dtype=dtype,
               weights_dtype=weights_dtype)


def check_dtypes(dtype: str, weights_dtype: Optional[str]) -> None:
  """`load`'s dtype and weights_dtype, checked.

  Raises:
    ValueError: either is not one `load` takes.
  """
  if dtype not in model_lib.DTYPES:
    raise errors.ArgumentError(
        "dtype", f"dtype must be one of {model_lib.DTYPES}, got {dtype!r}")
  if weights_dtype is not None and (
      weights_dtype not in reduced_weights.WEIGHTS_DTYPES):
    raise errors.ArgumentError(
        "weights_dtype", reduced_weights.choices_message(weights_dtype))


def read(path: Optional[Union[str, os.PathLike]] = None, *,
         corpus: Optional[Union[str, os.PathLike]] = None,
         vocab: Union[None, str, os.PathLike, Sequence[str]] = None
         ) -> model_file.ModelFile:
  """`load`'s first half: the file read and checked into host memory, as
  `load` reads it, TensorFlow not started (a front end that sizes
  TensorFlow's threads by the model reads it first); `build` makes the
  Model. Arguments and errors as `load`'s."""
  # pylint: disable-next=g-import-not-at-top
  from rnnstep import convert as convert_lib  # Only loaded when needed.
  if path is None:
    path = bundled_model_path()
    if not os.path.exists(path):
      raise FileNotFoundError(
          f"{path}: the bundled model is missing from this install; reinstall "
          "rnnstep or pass a model file path")
  path = errors.check_path(path, "path", "model or weights file")
  if corpus is not None:
    corpus = errors.check_path(corpus, "corpus",
                               "training text file or folder")
  if vocab is not None and (isinstance(vocab, (str, bytes, os.PathLike)) or
                            not isinstance(vocab, collections.abc.Iterable)):
    try:
      vocab = errors.check_path(vocab, "vocab", "vocabulary file")
    except errors.ArgumentError:
      raise errors.ArgumentError(
          "vocab", "vocab must be a vocabulary file's path or a list of the "
          "characters or words in id order, got "
          f"{errors.kind_of(vocab)}") from None
  return convert_lib.read_any(path, corpus=corpus, vocab=vocab)


def build(model_data: model_file.ModelFile,
          path: Optional[Union[str, os.PathLike]] = None, *,
          dtype: str = "float32",
          weights_dtype: Optional[str] = None) -> model_lib.Model:
  """`load`'s second half: the Model of what `read` read from `path`
  (None: the bundled model), as `load` builds it."""
  check_dtypes(dtype, weights_dtype)
  xla_cache.prune_once()  # Before TensorFlow loads a program from it.
  return model_lib.from_file(model_data, dtype=dtype,
                             source=(bundled_model_path() if path is None
                                     else os.fspath(path)),
                             weights_dtype=weights_dtype)


def logits(model: model_lib.Model, ids, initial_state=None, *,
           window=None) -> np.ndarray:
  """Teacher-forced logits, for scoring and perplexity.

  Args:
    model: the Model.
    ids: integer ids `[B, T]` (a 1-D sequence is taken as one row).
    initial_state: None (the zero state, as Keras), or the state to start
      each row from: one dict per recurrent layer of float32 `[B, U]` arrays,
      `{"h": ...}` (plus `"c"` for an LSTM), the form
      `[{k: v[:, -1] for k, v in layer.items()} for layer in
      hidden_states(model, ...)]` gives.
    window: as for `generate`: k > 0 gives at position t the logits after
      the last k ids up to t (fewer before k-1) from a zero state; 0 runs
      over the whole row; None (default) the model's recorded window, else 0.

  Returns:
    float32 `[B, T, V]`: position t holds the logits for the id after `ids[:, t]`.

  Raises:
    ValueError: ids not 1- or 2-D, empty, or outside `[0, V)`; an
      `initial_state` of the wrong structure, shape or dtype.
  """
  check_model(model)
  array = _check_ids(model, ids, "ids")
  window = window_lib.resolve(model, options_lib.check("window", window))
  if window:
    if initial_state is not None:
      raise errors.ArgumentError(
          "initial_state", f"initial_state with window={window}: every window "
          "starts from the zero state; pass window=0 to start from a state")
    return window_lib.score_function(model)(array, np.int32(window)).numpy()
  if initial_state is None:
    return model.score(array).numpy()
  state = check_initial_state(model, initial_state, array.shape[0])
  _, result = functions_lib.sequence_function(model)(
      array, np.ones(array.shape, bool), state)
  return result.numpy()


Pair = Tuple[str, str]


def loglikelihood(model: model_lib.Model, pairs: Sequence[Pair], *,
                  jit_compile: Union[None, bool, str] = None,
                  window=None) -> List[Tuple[float, bool]]:
  """Log-likelihoods of continuations given contexts (lm-evaluation-harness).

      rnnstep.loglikelihood(model, [("To be, or ", "not"),
                                    ("To be, or ", "the")])
      # The bundled model: [(-4.566, False), (-3.530, True)]

  For each `(context, continuation)`: the sum of the continuation's token
  log-probabilities (natural log of the softmax of the raw logits, as
  `generate`'s scores) after the context, from a zero state, and whether
  greedy decoding (`temperature=0`) from the context would produce exactly
  the continuation's tokens. The tokens are lm-evaluation-harness's split:
  the continuation's are those of `encode(context + continuation)` past the
  `len(encode(context))` tokens of the context (for a character model, its
  characters), scored after the context's own tokens. Every pair, of any
  lengths, in few compiled calls: one per length bucket and batch.

  Args:
    model: the Model.
    pairs: a list of `(context, continuation)` str pairs, or pairs of
      token-id lists (taken as they are: no re-tokenization of the two
      together). A context must give at least one token: the model reads its first token from the
      zero state and predicts from there (score a whole text with
      `loglikelihood_rolling`). An empty continuation scores `(0.0, True)`.
    jit_compile: the path, as for `generate` (None: the library's choice).
    window: as for `generate` and `logits`: k > 0 scores each token after
      the last k tokens from a zero state; None (default) the model's
      recorded window, else 0 (the whole text).

  Returns:
    One `(logprob, is_greedy)` per pair, in order: a float (nats) and a bool.

  Raises:
    errors.ArgumentError: naming `pairs[i]`: not a pair of str, a token the
      vocabulary lacks, an empty context; or a bad `jit_compile`/`window`;
      or a text too long for memory.
  """
  rows = check_pairs(model, pairs)
  scores = _score(model, rows, jit_compile, window, "pairs")
  return list(zip(scores.logprobs, scores.greedy))


def loglikelihood_rolling(model: model_lib.Model, texts: Sequence[str], *,
                          jit_compile: Union[None, bool, str] = None,
                          window=None) -> List[float]:
  """Log-likelihoods of whole texts (lm-evaluation-harness's rolling one).

      rnnstep.loglikelihood_rolling(model, ["To be, or not to be"])

  For each text, the sum of log p(token t | tokens before t) over its tokens
  after the first: the model reads the first from the zero state (as
  `logits` scores, and as the model was trained), so it has no probability
  of its own. (lm-evaluation-harness conditions the first token on an
  end-of-text token; these models have none.) The mean negative of it per
  scored token is the cross-entropy, `exp` of that the perplexity.

  Args:
    model: the Model.
    texts: a list of str or of token-id lists (any lengths, each at least
      one token; a single token scores 0.0).
    jit_compile: the path, as for `generate`.
    window: as for `loglikelihood`.

  Returns:
    One float (nats) per text, in order.

  Raises:
    errors.ArgumentError: naming `texts[i]`: not a str, empty, a token the
      vocabulary lacks; a bad `jit_compile`/`window`; a text too long for
      memory.
  """
  rows = check_rolling(model, texts)
  return _score(model, rows, jit_compile, window, "texts").logprobs


def check_pairs(model: model_lib.Model, pairs: Sequence[Pair]
                ) -> List[scoring.Row]:
  """`loglikelihood`'s checks of its pairs, for front ends that run them in
  pieces (a bulk job checks every record before it runs any).

  Returns:
    One `scoring.Row` per pair: the context's and continuation's ids, and
    where the continuation starts.

  Raises:
    errors.ArgumentError: as `loglikelihood`, naming `pairs[i]`.
  """
  check_model(model)
  if not isinstance(pairs, (list, tuple)) or not pairs:
    raise errors.ArgumentError(
        "pairs", "pairs must be a non-empty list of (context, continuation) "
        f"str pairs, got {errors.kind_of(pairs)}")
  rows = []
  for i, pair in enumerate(pairs):
    where = f"pairs[{i}]"
    texts = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
        isinstance(text, str) for text in pair)
    ids = (isinstance(pair, (list, tuple)) and len(pair) == 2
           and all(_is_ids(part) for part in pair))
    if not (texts or ids):
      raise errors.ArgumentError(
          "pairs", f"{where} must be a (context, continuation) pair of str, "
          f"or of token-id lists, got {errors.kind_of(pair)}")
    context, continuation = pair
    if texts:
      context_ids = _encode(model, context, f"{where} (the context)")
      whole = _encode(model, context + continuation, f"{where}")
    else:  # Ids are taken as they are.
      context_ids = host.check_ids(model, context, f"{where}[0]", "pairs")
      whole = np.concatenate([context_ids, host.check_ids(
          model, continuation, f"{where}[1]", "pairs")]).astype(np.int32)
    if not len(context_ids):
      raise errors.ArgumentError(
          "pairs", f"{where}: the context gives no tokens; the model reads "
          "its first token from the zero state and predicts from there, so "
          "give at least one (or score the whole text with "
          "loglikelihood_rolling)")
    ids = np.concatenate([context_ids, whole[len(context_ids):]])
    rows.append(scoring.Row(ids.astype(np.int32), len(context_ids)))
  return rows


def check_rolling(model: model_lib.Model, texts: Sequence[str]
                  ) -> List[scoring.Row]:
  """`loglikelihood_rolling`'s checks of its texts (as `check_pairs`).

  Returns:
    One `scoring.Row` per text, scored from its second token.

  Raises:
    errors.ArgumentError: as `loglikelihood_rolling`, naming `texts[i]`.
  """
  check_model(model)
  if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or (
      not texts):
    raise errors.ArgumentError(
        "texts", f"texts must be a non-empty list of str, got "
        f"{errors.kind_of(texts)}")
  rows = []
  for i, text in enumerate(texts):
    if _is_ids(text):
      ids = host.check_ids(model, text, f"texts[{i}]", "texts")
    elif isinstance(text, str):
      ids = _encode(model, text, f"texts[{i}]")
    else:
      raise errors.ArgumentError(
          "texts", f"texts[{i}] must be a str or a list of token ids, got "
          f"{errors.kind_of(text)}")
    if not len(ids):
      raise errors.ArgumentError(
          "texts", f"texts[{i}] gives no tokens; give at least one")
    rows.append(scoring.Row(ids.astype(np.int32), 1))
  return rows


def _is_ids(value) -> bool:
  """Whether a scoring argument's part is token ids: a list, tuple or 1-D
  array of integers (empty included: an empty continuation)."""
  if isinstance(value, np.ndarray):
    return value.ndim == 1 and (value.dtype.kind in "iu" or value.size == 0)
  return isinstance(value, (list, tuple)) and all(
      options_lib.is_int(v) for v in value)


def _encode(model, text: str, where: str) -> np.ndarray:
  """`model.encode(text)`, its refusal naming `where` (an argument's item)."""
  try:
    return model.encode(text)
  except ValueError as e:
    raise errors.ArgumentError(where.split("[")[0], f"{where}: {e}") from None


def _score(model, rows, jit_compile, window, name) -> scoring.Scores:
  """The checks both scoring functions share, then `scoring.score`."""
  window = window_lib.resolve(model, options_lib.check("window", window))
  scoring.check_fits(model, max(len(row.ids) for row in rows), name)
  path = paths.from_jit_compile(jit_compile)
  chosen = path == paths.AUTO
  if chosen:
    path = scoring.default_path(window)
  # Where the library chose the path, no call waits on its compile
  # (`scoring._caller`).
  return scoring.score(model, path, rows, window,
                       background=chosen and path != paths.GRAPH)


def _check_ids(model, ids, name: str) -> np.ndarray:
  """Integer ids `[B, T]` (or `[T]`: one row) as int32 `[B, T]`.

  Raises:
    ValueError: naming `name`: not 1- or 2-D, empty, or outside `[0, V)`.
  """
  array = np.asarray(ids)
  if array.ndim == 1:
    array = array[None, :]
  if array.ndim != 2 or array.size == 0:
    raise errors.ArgumentError(
        name, f"{name} must be a non-empty [batch, time] array, got shape "
        f"{array.shape}")
  if array.dtype.kind not in "iu":
    raise errors.ArgumentError(
        name, f"{name} must be integers, got dtype {array.dtype}")
  if array.min() < 0 or array.max() >= model.vocab_size:
    raise errors.ArgumentError(
        name, f"{name} must lie in [0, {model.vocab_size}), got values from "
        f"{array.min()} to {array.max()}")
  return array.astype(np.int32)


def check_initial_state(model, initial_state, batch_size: int,
                        argument: str = "initial_state"):
  """An `initial_state` argument as a `model.StackState` of numpy arrays.

  None is the zero state. Anything else must be exactly one dict per layer
  of float32 `[batch_size, U]` arrays named by
  `rnnstep.model.functions.STATE_NAMES`. Public for the callers above the API
  that take the same argument (`inspect.analyze`).

  Args:
    model: the `Model` the state is for.
    initial_state: the argument as given.
    batch_size: the rows it must hold.
    argument: the argument's name, for messages (`save_state`'s is
      `state`).

  Returns:
    One tuple of float32 `[batch_size, U]` arrays per layer.

  Raises:
    ValueError: one line naming `initial_state` (and the entry at fault), what
      was given and the form expected.
  """
  layers = model.config.layers
  sizes = [cells.state_sizes(layer) for layer in layers]
  state_names = [cells.state_names(layer) for layer in layers]
  if initial_state is None:
    return tuple(tuple(np.zeros([batch_size, size], np.float32)
                       for size in layer) for layer in sizes)
  form = "[" + ", ".join(
      "{" + ", ".join(f"'{name}': [{batch_size}, {size}]"
                      for name, size in zip(names, layer))
      + "}" for names, layer in zip(state_names, sizes)) + "] of float32 arrays"

  def bad(where, got):
    return errors.ArgumentError(
        argument, f"{argument}{where} {got}; {argument} must be "
        f"{form}, one dict per recurrent layer and one row per sequence (as "
        "hidden_states(...)'s [:, -1] gives)")

  if not isinstance(initial_state, (list, tuple)):
    raise bad("", f"is of type {type(initial_state).__name__}")
  if len(initial_state) != len(layers):
    raise bad("", f"has {len(initial_state)} entries for {len(layers)} layers")
  state = []
  for i, (layer, names) in enumerate(zip(initial_state, state_names)):
    if not isinstance(layer, dict):
      raise bad(f"[{i}]", f"is of type {type(layer).__name__}")
    if set(layer) != set(names):
      raise bad(f"[{i}]", f"has keys {sorted(layer, key=repr)}")
    tensors = []
    for name, size in zip(names, sizes[i]):
      where = f"[{i}][{name!r}]"
      try:
        value = np.asarray(layer[name])
      except ValueError:  # Ragged nested lists.
        raise bad(where, "is a ragged sequence") from None
      if value.dtype != np.float32 or value.shape != (batch_size, size):
        raise bad(where, f"is {value.dtype} {list(value.shape)}")
      if not np.isfinite(value).all():
        raise bad(where, "holds values that are not finite (nan or inf)")
      tensors.append(value)
    state.append(tuple(tensors))
  return tuple(state)


def _options_doc(streams: bool) -> str:
  """The decoding options' part of `generate`'s / `stream`'s docstring."""
  lines = []
  for option in options_lib.OPTIONS:
    if streams and not option.streams:
      continue
    kind = "one value or one per prompt" if option.per_row else "one value"
    lines.append(f"    {option.name}: {option.doc} Default {option.default!r}; "
                 f"{kind}.")
  return "\n".join(lines)


def generate(model: model_lib.Model, prompts: Prompts, num_steps: int, *,
             seed=None, stop: Union[None, str, Sequence[str]] = None,
             regex: Union[None, str, Sequence[Optional[str]]] = None,
             return_scores: bool = False, initial_state=None,
             jit_compile: Union[None, bool, str] = None, strategy=None,
             **decoding):
  """Generates continuations of one prompt or a batch, in one device call.

  Per step (as HF `generate`): `[UNK]` ban -> repetition penalty -> n-gram ban
  -> temperature -> top-k -> top-p -> min-p -> typical-p -> draw. The decoding
  options are keyword arguments declared in `rnnstep.decoding.options`
  (listed below).

  Args:
    model: the Model.
    prompts: a str, or a list of str (any lengths; generated as one batch).
      Token ids where text goes: a list of ints is one prompt of ids (taken
      as they are: the same text as the prompt whose `model.encode` they
      are), a list of such lists (or of str and id lists) a batch; an id
      outside the vocabulary is refused by its index (`prompts[1][3] = 70000
      is outside the vocabulary of 65536 ids`).
    num_steps: tokens to generate per prompt (characters for a character
      model; 0 gives empty strings).
    seed: None (fresh randomness), an int (row i uses (seed, i): same seed, same
      text), or one int per prompt (a row reproduces alone with its own seed).
    stop: a stop string or a list of them: a row ends once one has appeared in
      its continuation (which then ends with it); the loop ends when all have.
    regex: a regular expression (Python syntax), or one per prompt (None:
      none): each continuation (not the prompt) stays inside it. Each step
      masks the ids that would leave it, before the temperature and the
      filters; a row ends once it matches and cannot go on. A row cut off by
      `num_steps` or a stop string is a prefix of a match (README
      "Constrained generation").
    return_scores: also return each continuation's log-likelihood under the
      model (natural log; the sum of log-softmax of the raw logits at the
      chosen ids, whatever the sampling settings).
    initial_state: None (the zero state), or the state each row's prompt is
      primed from: one dict per recurrent layer of float32 `[B, U]` arrays,
      `{"h": ...}` (plus `"c"` for an LSTM), the form
      `[{k: v[:, -1] for k, v in layer.items()} for layer in
      hidden_states(model, texts)]` gives. From the state after p1, prompt
      p2 continues as prompt p1 + p2 does.
    jit_compile: None picks the fastest path measured for the model's dtype
      and the batch size (`paths.default_path`); True runs the whole generation as
      one XLA program; False as a TF graph without XLA; "elementwise" as a TF
      graph whose gate math and sampling are XLA-compiled (for bfloat16 at
      large batches). Every path runs the whole generation in one call.
    strategy: a `tf.distribute.Strategy`: the batch is split evenly across its
      replicas, each running the same compiled loop; results come back in
      order and equal the single-device text. A model loaded outside
      `strategy.scope()` is copied to every replica once (and the copy kept).
    **decoding: the decoding options:
{options}

  A row's text depends only on its own prompt, settings and seed (its logits
  to float32 rounding: the batch size chooses the matmul kernel; README
  "Reproducibility").

  Returns:
    The continuations only: a str for a str prompt (or one list of ids),
    else a list of str. With
    `num_return_sequences` r > 1, a list of r str (best first) per prompt
    instead of each str. With `return_scores`, `(texts, scores)`, the scores
    nested as the texts.

  Raises:
    errors.ArgumentError (a ValueError): a bad argument, naming it; an
      unusable prompt (empty, unknown character).
    ValueError: an output too large for memory (refused before allocating).
    TypeError: an unknown keyword argument.
  """
  single = _is_one_prompt(prompts)
  prompt_list, options = _check_arguments(model, prompts, num_steps, seed,
                                          stop, return_scores, initial_state,
                                          decoding, streams=False, regex=regex)
  rows_per_device = len(prompt_list)
  if strategy is not None:
    if not isinstance(strategy, tf.distribute.Strategy):
      raise errors.ArgumentError(
          "strategy", "strategy must be a tf.distribute.Strategy (such as "
          f"tf.distribute.MirroredStrategy()) or None, got "
          f"{errors.kind_of(strategy)}")
    model = model_lib.replicated(model, strategy)
    rows_per_device = -(-rows_per_device // strategy.num_replicas_in_sync)
  generator = _generator(model, jit_compile, rows_per_device,
                         options.window, strategy)
  out = generator.generate_ids(prompt_list, num_steps, options,
                               strategy=strategy)

  def shaped(per_prompt):
    if options.num_return_sequences == 1:
      per_prompt = [values[0] for values in per_prompt]
    return per_prompt[0] if single else per_prompt

  # A token model's text is cut at its stop string's end (a character
  # model's already ends there).
  # (textgenrnn's word-level text also starts from its prompt's words.)
  texts = shaped([[model.tokens.text(ids, options.stop,
                                     host.prompt_text(model, prompt))
                   for ids in seqs]
                  for prompt, seqs in zip(prompt_list, out.ids)])
  return (texts, shaped(out.scores)) if return_scores else texts


generate.__doc__ = generate.__doc__.replace("{options}", _options_doc(False))


def stream(model: model_lib.Model, prompts: Prompts, num_steps: int, *,
           chunk_size: int = 64, seed=None,
           stop: Union[None, str, Sequence[str]] = None,
           regex: Union[None, str, Sequence[Optional[str]]] = None,
           return_scores: bool = False, initial_state=None,
           jit_compile: Union[None, bool, str] = None,
           **decoding) -> Iterator:
  """Like `generate`, but yields text as it comes, every `chunk_size` steps.

  Each chunk is one device call; the recurrent state (and the history the
  repetition penalty and n-gram ban read) stays on device between chunks.
  Joined, the chunks equal `generate`'s text for the same arguments. Beam
  search does not stream (its best hypothesis is known only at the end).

  Args (as `generate`'s, and):
    chunk_size: steps per device call, >= 1.
    **decoding: the decoding options:
{options}

  Yields:
    For a str prompt (or one list of ids), the next piece of text; for a
    list, a list of pieces
    (empty for rows that have already stopped). With `return_scores`,
    `(pieces, scores)`: each row's log-likelihood of its text so far.

  Raises:
    errors.ArgumentError: as for `generate`, a chunk_size outside
      [1, 2**31), or num_beams > 1.
    TypeError: an unknown keyword argument.
  """
  single = _is_one_prompt(prompts)
  if (not options_lib.is_int(chunk_size) or chunk_size < 1
      or chunk_size >= records.STEPS_LIMIT):
    raise errors.ArgumentError(
        "chunk_size", f"chunk_size must be a positive integer below 2**31, "
        f"got {chunk_size!r}")
  beams = decoding.pop("num_beams", 1)
  if options_lib.is_int(beams) and beams > 1:
    raise errors.ArgumentError(
        "num_beams", f"num_beams={beams}: beam search does not stream (the "
        "best hypothesis is known only at the end); use rnnstep.generate, or "
        "num_beams=1")
  prompt_list, options = _check_arguments(model, prompts, num_steps, seed,
                                          stop, return_scores, initial_state,
                                          dict(decoding, num_beams=beams),
                                          streams=True, regex=regex)
  generator = _generator(model, jit_compile, len(prompt_list),
                         options.window)
  # One incremental decoder per row: a chunk never ends inside a character,
  # and a token model's text is cut at its stop string's end.
  rows = [model.tokens.stream(options.stop, host.prompt_text(model, prompt))
          for prompt in prompt_list]
  scores = [0.0] * len(prompt_list)

  def shaped(texts, scores):
    texts, scores = (texts[0], scores[0]) if single else (texts, scores)
    return (texts, scores) if return_scores else texts

  for out in generator.stream_ids(prompt_list, num_steps, chunk_size, options):
    scores = out.scores
    yield shaped([text.push(ids) for text, ids in zip(rows, out.ids)], scores)
  # A byte model cut off inside a character: what its bytes read as, once.
  rest = [text.finish() for text in rows]
  if any(rest):
    yield shaped(rest, scores)


stream.__doc__ = stream.__doc__.replace("{options}", _options_doc(True))


def check_request(model: model_lib.Model, prompts: Prompts, num_steps: int,
                  *, seed=None, stop=None, regex=None,
                  return_scores: bool = False, **decoding):
  """`stream`'s checks, for front ends that run the generation themselves.

  `records.check` then `check_record`, from `stream`'s arguments (the Beam
  handlers name the record a call refused with it; the server, which builds
  its `records.Record` once, calls `check_record`).

  Args:
    model, prompts, num_steps, seed, stop, regex, return_scores, **decoding:
      as for `stream`.

  Returns:
    `(prompt list, request.Options)`.

  Raises:
    errors.ArgumentError: naming the argument.
    TypeError: an unknown decoding option.
  """
  return _check_arguments(model, prompts, num_steps, seed, stop, return_scores,
                          None, decoding, streams=True, regex=regex)


def _is_one_prompt(prompts) -> bool:
  """Whether `prompts` is one prompt (a str, or a list of token ids), whose
  continuation is returned alone rather than in a list."""
  return isinstance(prompts, str) or records.is_id_sequence(prompts)


def _generator(model, jit_compile, batch_size, window, strategy=None):
  """The generator a call runs on. Where `jit_compile=None` picks XLA or
  the elementwise path, one whose calls run on the graph path while their
  XLA programs compile in the background (`compiling.Background`); an
  explicit path compiles (or not) in the foreground."""
  path = _path(model, jit_compile, batch_size, window)
  if (path in (paths.XLA, paths.ELEMENTWISE) and strategy is None
      and paths.from_jit_compile(jit_compile) == paths.AUTO):
    return compiling.background(model, path)
  return generator_lib.cached(model, path)


def _path(model, jit_compile, batch_size, window: int = 0) -> str:
  """The concrete path for a user's `jit_compile` value (auto resolved here)."""
  path = paths.from_jit_compile(jit_compile)
  if path == paths.AUTO and window and paths.pinned_path() is None:
    # The bands are for stateful steps; over windows XLA ran fastest at 1 and
    # 64 rows (measured on a Zen 3 with the recipe's LSTM 128).
    return paths.XLA
  return (paths.default_path(model, batch_size) if path == paths.AUTO
          else path)


def _check_arguments(model, prompts, num_steps, seed, stop, return_scores,
                     initial_state, decoding, *, streams, regex=None):
  """Validates the arguments of `generate` or `stream`.

  Args:
    model: the Model.
    prompts, num_steps, seed, stop, return_scores, initial_state: as given.
    decoding: the decoding options given, by name (`options.OPTIONS`).
    streams: for `stream` (which takes no beam options).
    regex: as given (compiled here, so a bad pattern fails before any call).

  Returns:
    `(prompt list, request.Options)`.

  Raises:
    errors.ArgumentError: naming the argument.
    TypeError: an unknown decoding option.
  """
  caller = "stream" if streams else "generate"
  for name in decoding:
    option = options_lib.BY_NAME.get(name)
    if option is None or (streams and not option.streams and name
                          != "num_beams"):
      raise TypeError(f"{caller}() got an unexpected keyword argument "
                      f"{name!r}")
  record = records.check(prompts, num_steps, seed=seed, stop=stop,
                         regex=regex, return_scores=return_scores,
                         options=decoding)
  return list(record.prompts), check_record(model, record, initial_state)


def check_record(model: model_lib.Model, record: records.Record,
                 initial_state=None) -> request.Options:
  """The checks of a checked record that depend on the model; its Options.

  For front ends that build the `records.Record` themselves (the server
  builds one per request, `serve/protocol.py`): what `generate` checks past
  `records.check` (beams against the vocabulary, the window, stop strings
  and patterns a recipe's vocabulary refuses, the pattern's compiling, the
  initial state).

  Raises:
    errors.ArgumentError: naming the argument.
  """
  check_model(model)
  values = dict(record.options)
  _check_beams(model, values["num_beams"], values["num_return_sequences"])
  values["window"] = window_lib.resolve(model, values["window"])
  window_lib.check_beams(values["window"], values["num_beams"],
                         model.config.window)
  recipe = model.tokens.rules.get("recipe")
  for name, given in (("stop", record.stop), ("regex", record.regex)):
    if recipe and given and any(given):
      raise errors.ArgumentError(name, vocabulary.recipe_refuses(name,
                                                                 recipe))
  if record.regex:
    constraints.combine(model, record.regex)  # Refuses a bad one (cached).
  params = options_lib.Params(**{o.name: values[o.name]
                                 for o in options_lib.PER_ROW})
  shared = {o.name: values[o.name] for o in options_lib.SHARED}
  if initial_state is not None:
    if values["window"]:
      raise errors.ArgumentError(
          "initial_state", f"initial_state with window={values['window']}: "
          "every window starts from the zero state; pass window=0 to start "
          "from a state")
    initial_state = check_initial_state(model, initial_state,
                                        len(record.prompts))
  return request.Options(
      sampling=params, seed=record.seed, stop=record.stop,
      return_scores=record.return_scores, initial_state=initial_state,
      regex=record.regex, **shared)


def _check_beams(model, beams, returned):
  """The beam settings' bounds that depend on the model and each other."""
  usable = model.vocab_size - int(model.has_unk)
  if beams > usable:
    raise errors.ArgumentError(
        "num_beams", f"num_beams must be an integer from 1 (no beam search) "
        f"to {usable} (the model's usable vocabulary), got {beams!r}")
  if returned > beams:
    raise errors.ArgumentError(
        "num_return_sequences", f"num_return_sequences must be an integer "
        f"from 1 to num_beams ({beams}), got {returned!r}")

