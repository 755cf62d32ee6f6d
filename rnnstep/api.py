"""The library API: load a model, score text, generate text.

    import rnnstep
    model = rnnstep.load()                      # the bundled Shakespeare model
    print(rnnstep.generate(model, "ROMEO:", 200, temperature=0.8, seed=1))

Every argument is checked here, with the caller's words, before anything is
compiled or allocated; the compiled work lives in `generator.py`.
"""

import functools
import importlib.resources
import math
import numbers
import os
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from rnnstep import generator as generator_lib
from rnnstep import model as model_lib
from rnnstep import model_file

BUNDLED_MODEL = "shakespeare.npz"

# The fastest path per compute dtype, as (largest batch size, path) bands, by
# measurement on a 2-core Sapphire Rapids (AMX) VM: `python tools/benchmark.py
# --sections=paths` prints the table these come from (BUILD_NOTES.md has it).
# XLA's CPU dot is slow for float32/float16 at 17-48 rows (up to 1.24x), and
# has no AMX path for bfloat16, where TF's oneDNN matmul is 2-3x faster.
_XLA, _ELEMENTWISE = generator_lib.XLA, generator_lib.ELEMENTWISE
_FASTEST_PATHS = {
    "float32": ((16, _XLA), (48, _ELEMENTWISE), (None, _XLA)),
    "float16": ((16, _XLA), (48, _ELEMENTWISE), (None, _XLA)),
    "bfloat16": ((8, _XLA), (None, _ELEMENTWISE)),
}
_PATH_VALUES = {_XLA: True, generator_lib.GRAPH: False, _ELEMENTWISE: _ELEMENTWISE}


def default_path(model: model_lib.Model, batch_size: int) -> str:
  """The path `jit_compile=None` takes: "xla", "graph" or "elementwise".

  The fastest measured for the model's compute dtype and the batch size (see
  `_FASTEST_PATHS`). For a float32 model every path is Keras-exact; sampled
  text can differ between paths only where rounding flips a draw (rare in
  float32; in bfloat16, expect texts to part after some dozens of characters),
  so pass `jit_compile` explicitly to reproduce a row across batch sizes that
  fall in different bands.
  """
  if _gpu_visible():
    # The bands are CPU measurements; on a GPU XLA's dots use the vendor
    # libraries (bf16 included) and the whole-XLA loop has the fewest launches.
    return _XLA
  for largest, path in _FASTEST_PATHS[model.compute_dtype.name]:
    if largest is None or batch_size <= largest:
      return path
  raise AssertionError("the last band has no upper bound")


@functools.lru_cache(maxsize=None)
def _gpu_visible() -> bool:
  return bool(tf.config.list_physical_devices("GPU"))


def default_jit_compile(model: model_lib.Model, batch_size: int = 1):
  """`default_path` as a `jit_compile` value (True, False or "elementwise")."""
  return _PATH_VALUES[default_path(model, batch_size)]


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


def generate(model: model_lib.Model, prompts: Prompts, num_steps: int, *,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             seed=None, stop: Union[None, str, Sequence[str]] = None,
             jit_compile: Union[None, bool, str] = None,
             strategy=None) -> Union[str, List[str]]:
  """Generates continuations of one prompt or a batch, in one device call.

  Args:
    model: the Model.
    prompts: a str, or a list of str (any lengths; generated as one batch).
    num_steps: characters to generate per prompt (0 gives empty strings).
    temperature: 0 is greedy argmax; otherwise logits are divided by it.
    top_k: keep the k most likely ids (0 = off).
    top_p: nucleus sampling mass in (0, 1] (1 = off).
    seed: None (fresh randomness), an int (row i uses (seed, i): same seed, same
      text), or one int per prompt (a row reproduces alone with its own seed).
    stop: a stop string or a list of them: a row ends once one has appeared in
      its continuation (which then ends with it); the loop ends when all have.
    jit_compile: None picks the fastest path measured for the model's dtype
      and the batch size (`default_path`); True runs the whole generation as
      one XLA program; False as a TF graph without XLA; "elementwise" as a TF
      graph whose gate math and sampling are XLA-compiled (for bfloat16 at
      large batches). Every path runs the whole generation in one call.
    strategy: a `tf.distribute.Strategy`: the batch is split evenly across its
      replicas, each running the same compiled loop; results come back in
      order and equal the single-device text. Load the model under
      `strategy.scope()` so each device holds its own copy of the weights.

  Returns:
    The continuations only: a str for a str prompt, else a list of str.

  Raises:
    ValueError: a bad argument, an unusable prompt (empty, unknown character),
      or an output too large for memory (refused before allocating).
  """
  single = isinstance(prompts, str)
  prompt_list, stops = _check_arguments(prompts, num_steps, temperature, top_k,
                                        top_p, seed, stop)
  generator = model.generator(_jit(model, jit_compile, len(prompt_list)))
  rows = generator.generate_ids(prompt_list, num_steps, temperature=temperature,
                                top_k=top_k, top_p=top_p, seed=seed, stop=stops,
                                strategy=strategy)
  texts = [model.decode(row) for row in rows]
  return texts[0] if single else texts


def stream(model: model_lib.Model, prompts: Prompts, num_steps: int, *,
           chunk_size: int = 64, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, seed=None,
           stop: Union[None, str, Sequence[str]] = None,
           jit_compile: Union[None, bool, str] = None
           ) -> Iterator[Union[str, List[str]]]:
  """Like `generate`, but yields text as it comes, every `chunk_size` steps.

  Each chunk is one device call; the recurrent state stays on device between
  chunks. Joined, the chunks equal `generate`'s text for the same arguments.

  Yields:
    For a str prompt, the next piece of text; for a list, a list of pieces
    (empty for rows that have already stopped).

  Raises:
    ValueError: as for `generate`, or a chunk_size below 1.
  """
  single = isinstance(prompts, str)
  prompt_list, stops = _check_arguments(prompts, num_steps, temperature, top_k,
                                        top_p, seed, stop)
  if not _is_int(chunk_size) or chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
  generator = model.generator(_jit(model, jit_compile, len(prompt_list)))
  for rows in generator.stream_ids(prompt_list, num_steps, chunk_size,
                                   temperature=temperature, top_k=top_k,
                                   top_p=top_p, seed=seed, stop=stops):
    texts = [model.decode(row) for row in rows]
    yield texts[0] if single else texts


def _jit(model, jit_compile, batch_size):
  if jit_compile is None:
    return default_jit_compile(model, batch_size)
  generator_lib.mode_name(jit_compile)  # Raises ValueError on a bad value.
  return jit_compile


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_arguments(prompts, num_steps, temperature, top_k, top_p, seed, stop):
  """Validates generation arguments; returns (prompt list, stop list)."""
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
  if (not isinstance(temperature, numbers.Real) or isinstance(temperature, bool)
      or not math.isfinite(temperature) or temperature < 0):
    raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), "
                     f"got {temperature!r}")
  if not _is_int(top_k) or top_k < 0 or top_k >= 2**31:
    raise ValueError(f"top_k must be a non-negative integer (0 = off), got "
                     f"{top_k!r}")
  if (not isinstance(top_p, numbers.Real) or isinstance(top_p, bool)
      or not 0 < top_p <= 1):
    raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
  _check_seed(seed, len(prompt_list))
  if stop is None:
    stops = []
  elif isinstance(stop, str):
    stops = [stop]
  elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
    stops = list(stop)
  else:
    raise ValueError(f"stop must be a str or a list of str, got {stop!r}")
  return prompt_list, stops


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
