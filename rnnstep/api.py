"""The library API: load a model, score text, generate text.

    import rnnstep
    model = rnnstep.load()                      # the bundled Shakespeare model
    print(rnnstep.generate(model, "ROMEO:", 200, temperature=0.8, seed=1))

Every argument is checked here, with the caller's words, before anything is
compiled or allocated; the compiled work lives in `generator.py`.
"""

import importlib.resources
import math
import numbers
import os
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from rnnstep import generator as generator_lib
from rnnstep import model as model_lib
from rnnstep import paths
from rnnstep import request as request_lib
from rnnstep import sampling

BUNDLED_MODEL = "shakespeare.npz"

Prompts = Union[str, Sequence[str]]


def bundled_model_path() -> str:
  """The path of the model shipped inside the package."""
  return str(importlib.resources.files("rnnstep") / "data" / BUNDLED_MODEL)


def load(path: Optional[Union[str, os.PathLike]] = None, *,
         dtype: str = "float32",
         corpus: Optional[Union[str, os.PathLike]] = None,
         vocab: Union[None, str, os.PathLike, Sequence[str]] = None
         ) -> model_lib.Model:
  """Loads a model file, or converts Keras / PyTorch weights on the fly.

  Args:
    path: a `.npz` model file (see BUILD_NOTES.md for the format), or any
      weights file `rnnstep-convert` reads (Keras `.keras` / `.h5` / TF
      checkpoint, PyTorch `.pt` / `.pth` / `.bin` / `.safetensors` state
      dict), read as data with the same checks; None loads the bundled model.
    dtype: 'float32', or 'bfloat16'/'float16' for reduced-precision matmuls.
    corpus: for weights files, which hold no vocabulary: the training text
      (UTF-8); the vocabulary is `sorted(set(text))`.
    vocab: for weights files, instead of `corpus`: a vocabulary file (a JSON
      list of characters in id order) or a list of characters.

  Returns:
    The Model.

  Raises:
    FileNotFoundError: no such file (or no bundled model in this install).
    ValueError: the file is not a valid model or weights file, a weights file
      without `corpus`/`vocab` (or a model file with one), a vocabulary that
      does not fit, or a bad dtype.
  """
  # pylint: disable-next=g-import-not-at-top
  from rnnstep import convert as convert_lib  # Only loaded when needed.
  if path is None:
    path = bundled_model_path()
    if not os.path.exists(path):
      raise FileNotFoundError(
          f"{path}: the bundled model is missing from this install; reinstall "
          "rnnstep or pass a model file path")
  path = os.fspath(path)
  if dtype not in model_lib.DTYPES:
    raise ValueError(f"dtype must be one of {model_lib.DTYPES}, got {dtype!r}")
  return model_lib.from_file(
      convert_lib.read_any(path, corpus=corpus, vocab=vocab), dtype=dtype,
      source=path)


def logits(model: model_lib.Model, ids) -> np.ndarray:
  """Teacher-forced logits from a zero state, for scoring and perplexity.

  Args:
    model: the Model.
    ids: integer ids `[B, T]` (a 1-D sequence is taken as one row).

  Returns:
    float32 `[B, T, V]`: position t holds the logits for the id after `ids[:, t]`.

  Raises:
    ValueError: ids not 1- or 2-D, empty, or outside `[0, V)`.
  """
  array = np.asarray(ids)
  if array.ndim == 1:
    array = array[None, :]
  if array.ndim != 2 or array.size == 0:
    raise ValueError(f"ids must be a non-empty [batch, time] array, got shape "
                     f"{array.shape}")
  if array.dtype.kind not in "iu":
    raise ValueError(f"ids must be integers, got dtype {array.dtype}")
  if array.min() < 0 or array.max() >= model.vocab_size:
    raise ValueError(f"ids must lie in [0, {model.vocab_size}), got values from "
                     f"{array.min()} to {array.max()}")
  return model.score(array.astype(np.int32)).numpy()


PerRow = Union[float, Sequence[float]]


def generate(model: model_lib.Model, prompts: Prompts, num_steps: int, *,
             temperature: PerRow = 1.0, top_k: PerRow = 0, top_p: PerRow = 1.0,
             min_p: PerRow = 0.0, repetition_penalty: PerRow = 1.0,
             repetition_window: int = 0, no_repeat_ngram_size: int = 0,
             num_beams: int = 1, length_penalty: float = 1.0,
             num_return_sequences: int = 1, seed=None,
             stop: Union[None, str, Sequence[str]] = None,
             return_scores: bool = False,
             jit_compile: Union[None, bool, str] = None, strategy=None):
  """Generates continuations of one prompt or a batch, in one device call.

  Per step (as HF `generate`): `[UNK]` ban -> repetition penalty -> n-gram ban
  -> temperature -> top-k -> top-p -> min-p -> draw.

  Args:
    model: the Model.
    prompts: a str, or a list of str (any lengths; generated as one batch).
    num_steps: characters to generate per prompt (0 gives empty strings).
    temperature: 0 is greedy argmax; otherwise logits are divided by it.
    top_k: keep the k most likely ids (0 = off).
    top_p: nucleus sampling mass in (0, 1] (1 = off).
    min_p: keep ids whose probability (after temperature) is at least min_p
      times the largest, in [0, 1] (0 = off).
    repetition_penalty: θ > 0 (1 = off): for each distinct id among the last
      `repetition_window` ids of prompt + continuation, its logit is divided
      by θ if positive, else multiplied by θ (the CTRL/HF rule).
    repetition_window: how many ids the penalty looks back over (0 = all).
    no_repeat_ngram_size: n > 0 bans any id that would complete an n-gram
      already in prompt + continuation (0 = off).
    num_beams: k > 1 runs beam search of width k (deterministic: temperature,
      top_k, top_p, min_p and seed do not apply).
    length_penalty: with beams and stop strings, finished hypotheses rank by
      score / length**length_penalty.
    num_return_sequences: with beams, return the r <= k best per prompt.
    seed: None (fresh randomness), an int (row i uses (seed, i): same seed, same
      text), or one int per prompt (a row reproduces alone with its own seed).
    stop: a stop string or a list of them: a row ends once one has appeared in
      its continuation (which then ends with it); the loop ends when all have.
    return_scores: also return each continuation's log-likelihood under the
      model (natural log; the sum of log-softmax of the raw logits at the
      chosen ids, whatever the sampling settings).
    jit_compile: None picks the fastest path measured for the model's dtype
      and the batch size (`paths.default_path`); True runs the whole generation as
      one XLA program; False as a TF graph without XLA; "elementwise" as a TF
      graph whose gate math and sampling are XLA-compiled (for bfloat16 at
      large batches). Every path runs the whole generation in one call.
    strategy: a `tf.distribute.Strategy`: the batch is split evenly across its
      replicas, each running the same compiled loop; results come back in
      order and equal the single-device text. A model loaded outside
      `strategy.scope()` is copied to every replica once (and the copy kept).

  `temperature`, `top_k`, `top_p`, `min_p` and `repetition_penalty` each take
  one value, or a list with one value per prompt. A row's text depends only on
  its own prompt, settings and seed.

  Returns:
    The continuations only: a str for a str prompt, else a list of str. With
    `num_return_sequences` r > 1, a list of r str (best first) per prompt
    instead of each str. With `return_scores`, `(texts, scores)`, the scores
    nested as the texts.

  Raises:
    ValueError: a bad argument, an unusable prompt (empty, unknown character),
      or an output too large for memory (refused before allocating).
  """
  # Every keyword argument but the last two describes the generation itself.
  arguments = dict(locals())
  del arguments["jit_compile"], arguments["strategy"]
  single = isinstance(prompts, str)
  prompt_list, options = _check_arguments(**arguments)
  rows_per_device = len(prompt_list)
  if strategy is not None:
    model = model_lib.replicated(model, strategy)
    rows_per_device = -(-rows_per_device // strategy.num_replicas_in_sync)
  generator = generator_lib.cached(
      model, _path(model, jit_compile, rows_per_device))
  out = generator.generate_ids(prompt_list, num_steps, options,
                               strategy=strategy)

  def shaped(per_prompt):
    if num_return_sequences == 1:
      per_prompt = [values[0] for values in per_prompt]
    return per_prompt[0] if single else per_prompt

  texts = shaped([[model.decode(ids) for ids in seqs] for seqs in out.ids])
  return (texts, shaped(out.scores)) if return_scores else texts


def stream(model: model_lib.Model, prompts: Prompts, num_steps: int, *,
           chunk_size: int = 64, temperature: PerRow = 1.0, top_k: PerRow = 0,
           top_p: PerRow = 1.0, min_p: PerRow = 0.0,
           repetition_penalty: PerRow = 1.0, repetition_window: int = 0,
           no_repeat_ngram_size: int = 0, num_beams: int = 1, seed=None,
           stop: Union[None, str, Sequence[str]] = None,
           return_scores: bool = False,
           jit_compile: Union[None, bool, str] = None) -> Iterator:
  """Like `generate`, but yields text as it comes, every `chunk_size` steps.

  Each chunk is one device call; the recurrent state (and the history the
  repetition penalty and n-gram ban read) stays on device between chunks.
  Joined, the chunks equal `generate`'s text for the same arguments. Beam
  search does not stream (its best hypothesis is known only at the end).

  Yields:
    For a str prompt, the next piece of text; for a list, a list of pieces
    (empty for rows that have already stopped). With `return_scores`,
    `(pieces, scores)`: each row's log-likelihood of its text so far.

  Raises:
    ValueError: as for `generate`, a chunk_size below 1, or num_beams > 1.
  """
  # Every keyword argument but these describes the generation itself.
  arguments = dict(locals())
  del arguments["jit_compile"], arguments["chunk_size"]
  single = isinstance(prompts, str)
  if not _is_int(chunk_size) or chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
  if _is_int(num_beams) and num_beams > 1:
    raise ValueError(f"num_beams={num_beams}: beam search does not stream (the "
                     "best hypothesis is known only at the end); use "
                     "rnnstep.generate, or num_beams=1")
  prompt_list, options = _check_arguments(**arguments)
  generator = generator_lib.cached(
      model, _path(model, jit_compile, len(prompt_list)))
  for out in generator.stream_ids(prompt_list, num_steps, chunk_size, options):
    texts = [model.decode(row) for row in out.ids]
    texts, scores = (texts[0], out.scores[0]) if single else (texts, out.scores)
    yield (texts, scores) if return_scores else texts


def _path(model, jit_compile, batch_size) -> str:
  """The concrete path for a user's `jit_compile` value (auto resolved here)."""
  path = paths.from_jit_compile(jit_compile)
  return (paths.default_path(model, batch_size) if path == paths.AUTO
          else path)


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))


# Each per-row sampling setting: (check of one value, what it must be).
_SETTING_CHECKS = {
    "temperature": (lambda v: _is_real(v) and v >= 0,
                    "a finite number >= 0 (0 = greedy)"),
    "top_k": (lambda v: _is_int(v) and 0 <= v < 2**31,
              "a non-negative integer (0 = off)"),
    "top_p": (lambda v: _is_real(v) and 0 < v <= 1, "in (0, 1] (1 = off)"),
    "min_p": (lambda v: _is_real(v) and 0 <= v <= 1, "in [0, 1] (0 = off)"),
    "repetition_penalty": (lambda v: _is_real(v) and v > 0,
                           "a finite number > 0 (1 = off)"),
}


def _check_setting(name, value, batch_size):
  """Checks a scalar-or-per-row setting; returns it (a list as a tuple)."""
  check, must_be = _SETTING_CHECKS[name]
  if isinstance(value, (list, tuple, np.ndarray)):
    values = list(value)
    if len(values) != batch_size:
      raise ValueError(f"{name} lists {len(values)} values for {batch_size} "
                       "prompts; give one value, or one per prompt")
    for i, v in enumerate(values):
      if not check(v):
        raise ValueError(f"{name}[{i}] must be {must_be}, got {v!r}")
    return tuple(values)
  if not check(value):
    raise ValueError(f"{name} must be {must_be}, got {value!r}")
  return value


def _check_arguments(model, prompts, num_steps, seed, stop, **decoding):
  """Validates the arguments of `generate` or `stream`.

  Args:
    model: the Model.
    prompts: as given.
    num_steps: as given.
    seed: as given.
    stop: as given.
    **decoding: every `sampling.Params` setting and `request.Options` field,
      by name.

  Returns:
    `(prompt list, request.Options)`.
  """
  if isinstance(prompts, str):
    prompt_list = [prompts]
  elif isinstance(prompts, (list, tuple)):
    prompt_list = list(prompts)
    if not prompt_list:
      raise ValueError("prompts is an empty list; give at least one prompt")
  else:
    raise ValueError(f"prompts must be a str or a list of str, got "
                     f"{type(prompts).__name__}")
  if not _is_int(num_steps) or num_steps < 0:
    raise ValueError(f"num_steps must be a non-negative integer, got {num_steps!r}")
  if num_steps >= 2**31:
    raise ValueError(f"num_steps must be below 2**31, got {num_steps}")
  params = sampling.Params(**{
      name: _check_setting(name, decoding.pop(name), len(prompt_list))
      for name in sampling.Params._fields})
  _check_seed(seed, len(prompt_list))
  if stop is None:
    stops = ()
  elif isinstance(stop, str):
    stops = (stop,)
  elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
    stops = tuple(stop)
  else:
    raise ValueError(f"stop must be a str or a list of str, got {stop!r}")
  options = request_lib.Options(sampling=params, seed=seed, stop=stops,
                                **decoding)
  _check_decoding(model, options)
  return prompt_list, options


def _check_decoding(model, options: request_lib.Options):
  """Checks the look-back and beam settings of `options`."""
  def non_negative(name, value, below=2**31):
    if not _is_int(value) or not 0 <= value < below:
      raise ValueError(f"{name} must be a non-negative integer (0 = off), got "
                       f"{value!r}")
  non_negative("repetition_window", options.repetition_window)
  non_negative("no_repeat_ngram_size", options.no_repeat_ngram_size)
  usable = model.vocab_size - int(model.has_unk)
  beams = options.num_beams
  if not _is_int(beams) or not 1 <= beams <= usable:
    raise ValueError(f"num_beams must be an integer from 1 (no beam search) to "
                     f"{usable} (the model's usable vocabulary), got {beams!r}")
  returned = options.num_return_sequences
  if not _is_int(returned) or not 1 <= returned <= beams:
    raise ValueError(f"num_return_sequences must be an integer from 1 to "
                     f"num_beams ({beams}), got {returned!r}")
  if not _is_real(options.length_penalty):
    raise ValueError(f"length_penalty must be a finite number, got "
                     f"{options.length_penalty!r}")
  if not isinstance(options.return_scores, (bool, np.bool_)):
    raise ValueError(f"return_scores must be True or False, got "
                     f"{options.return_scores!r}")


def _check_seed(seed, batch_size):
  def check_one(value):
    if not _is_int(value) or not -2**63 <= value < 2**63:
      raise ValueError(f"seed must be None, a 64-bit integer or a list of them "
                       f"(one per prompt), got {value!r}")
  if seed is None:
    return
  if isinstance(seed, (list, tuple, np.ndarray)):
    if len(seed) != batch_size:
      raise ValueError(f"seed lists {len(seed)} seeds for {batch_size} prompts; "
                       "give one int, or one per prompt")
    for value in seed:
      check_one(value)
  else:
    check_one(seed)
