"""rnnstep-generate's warm path: a generation from the cached LiteRT artifact.

`generate` takes a generation's arguments as plain values (the model file,
the prompts, num_steps, the seed, every decoding option, stop strings and
patterns) and returns the texts the cached flatbuffer
(`rnnstep.litert.cache`) gives for them, which are the library's texts for
the same arguments; or it raises `NotServed` saying why it cannot (`refusal`:
a request the artifact does not serve; else a cache miss, with the key to
build in the background when building would help). The caller prints the
texts, or generates with TensorFlow.

This module imports no TensorFlow, nor numpy or the interpreter at module
level: a warm `rnnstep-generate` imports it before it knows whether
TensorFlow will be needed.
"""

import importlib.util
from typing import List, NamedTuple, Optional

from rnnstep import errors
from rnnstep.litert import cache
from rnnstep.litert import runner

# Past this many characters x rows (num_steps x prompts x samples) the
# TensorFlow path's fixed start-up is paid back and it beats the cached LiteRT
# artifact (measured on a 2-vCPU EPYC Zen 3 with the bundled GRU 768).
MAX_CHAR_ROWS = 40_000

# A prompt of a model whose cell unrolls block by block (RWKV-7): the
# artifact primes it in chunks of `request.STEPWISE_PRIME_CHUNK` tokens,
# TensorFlow with each block's products over the whole prompt at once,
# after a start-up (import, load, trace) that grows with the weights; both
# cost about the layers' weights (`prime_bytes`) a token, on the same
# threads (`runner.default_threads`). Whole commands on a 2-vCPU EPYC Zen 5
# (benchmarks/results/litert-chunked-priming-epyc-zen5-2026-12.md,
# litert-threads-epyc-zen5-2026-12.md): the 0.1B RWKV-7 (362 MB of layer
# weights, 563 MB packed with its head) primed at 1.88 ms a token on the
# artifact's one thread, 1.5x as fast on its two (in one process: 2,000
# tokens in 4.05 s and 2.70 s), and 0.88 ms on TensorFlow, whose start took
# 5.08 s longer than the artifact's; the bundled GRU's (8 MB) 2.0 s. So the
# 0.1B shape's crossover is about 13,600 tokens there. An int8 model's is
# set too low: TensorFlow holds its weights as float32 values, so its cost
# follows their count, not `prime_bytes`.
ARTIFACT_PRIME_BYTES_PER_S = 288e9
TENSORFLOW_PRIME_BYTES_PER_S = 411e9
TENSORFLOW_START_S = 2.0
TENSORFLOW_START_S_PER_BYTE = 5.55e-9  # Of the artifact's packed weights.


class NotServed(Exception):
  """The warm path does not serve this generation: the message says why.

  Attributes:
    fill_key: the cache key to build in the background (the request would
      be served once the entry exists), or None.
  """

  def __init__(self, reason: str, fill_key=None):
    super().__init__(reason)
    self.fill_key = fill_key


class Served(NamedTuple):
  """The warm path's texts, one per row, and the artifact that made them."""
  texts: List[str]
  artifact: str


def interpreter_installed() -> bool:
  """Whether `ai_edge_litert` can be imported (found without importing it)."""
  return importlib.util.find_spec("ai_edge_litert") is not None


def refusal(num_steps: int, num_rows: int, seed: int,
            decoding: dict) -> Optional[str]:
  """Why the compiled artifact cannot serve this request, or None.

  The artifact (`rnnstep.litert.export`) takes prompts, num_steps, an int32
  seed, every decoding option (per-row ones one value per row, beams
  included), stop strings and patterns, and returns ids: no windows, and
  not worth its fixed cost past `MAX_CHAR_ROWS`.

  Args:
    num_steps, seed: the generation's.
    num_rows: the rows it generates (prompts x samples).
    decoding: every decoding option by name.
  """
  if not cache.enabled():
    return "RNNSTEP_COMPILED_CACHE is off"
  if decoding["window"]:
    return "--window: the compiled artifact steps the model statefully"
  if not -2**31 <= seed < 2**31:
    return f"--seed={seed}: the compiled artifact's seed is int32"
  if num_steps * num_rows > MAX_CHAR_ROWS:
    return (f"{num_steps} characters x {num_rows} rows is past the "
            f"compiled artifact's crossover ({MAX_CHAR_ROWS:,} "
            "char-rows), where TensorFlow is faster")
  if not interpreter_installed():
    return "ai_edge_litert is not installed (pip install ai-edge-litert)"
  return None


def prompt_crossover(manifest: dict) -> Optional[int]:
  """The prompt length (tokens) past which TensorFlow's run, start-up
  included, primes a prompt sooner than the entry's artifact (the constants
  above), or None: never, where TensorFlow too primes token by token (a
  recurrent cell's steps: `primes_in_bulk` false) or the artifact is the
  faster.

  Args:
    manifest: the entry's (`cache.write_entry`: `primes_in_bulk`,
      `prime_bytes`, and the artifact's packed or flatbuffer bytes).
  """
  prime_bytes = manifest.get("prime_bytes", 0)
  if not manifest.get("primes_in_bulk", False) or prime_bytes <= 0:
    return None
  saved_a_token = prime_bytes * (1 / ARTIFACT_PRIME_BYTES_PER_S
                                 - 1 / TENSORFLOW_PRIME_BYTES_PER_S)
  if saved_a_token <= 0:
    return None
  start = TENSORFLOW_START_S + TENSORFLOW_START_S_PER_BYTE * manifest.get(
      "xnnpack_bytes", manifest["tflite_bytes"])
  return int(start / saved_a_token) + 1


def generate(model_path: str, prompts, per_prompt: int, num_steps: int, *,
             seed: int, decoding: dict, stop=(), regex=None,
             weights_dtype: Optional[str] = None) -> Served:
  """The texts of the model at `model_path` from its cached artifact.

  Args:
    model_path: the model file's absolute path (what the cache keys on).
    prompts: the distinct prompts.
    per_prompt: rows per prompt: samples, or with num_beams > 1 the
      hypotheses returned (num_return_sequences).
    num_steps, seed: the generation's.
    decoding: every decoding option by name, per-row ones one value or one
      per row (prompts x per_prompt, in row order).
    stop: stop strings.
    regex: None, a pattern, or one per row.
    weights_dtype: the model loaded with it (`rnnstep.load`'s), which the
      artifact is built from and keyed by; None: the file's own.

  Returns:
    `Served`: one text per row, in row order (prompt p's rows p * per_prompt
    on), and the artifact's path.

  Raises:
    NotServed: the TensorFlow path must run (a missing or invalid entry
      names the key to build after it).
  """
  prompts = list(prompts)
  reason = refusal(num_steps, len(prompts) * per_prompt, seed, decoding)
  if reason:
    raise NotServed(reason)
  runtime = cache.runtime_version()
  if runtime is None:
    raise NotServed("ai_edge_litert's version is unknown")
  try:
    key = cache.key(model_path, runtime, weights_dtype)
  except OSError as e:
    where = f": {e.filename}" if e.strerror and e.filename else ""
    raise NotServed(f"cannot read the model file ({e.strerror or e}{where})"
                    ) from None
  except ValueError as e:  # A folder too large to hash on every run.
    raise NotServed(str(e)) from None
  try:
    artifact = cache.open_entry(key)
  except cache.Miss as e:
    raise NotServed(str(e), fill_key=key if e.rebuild else None) from None
  with artifact:
    texts = _run(artifact, prompts, per_prompt, num_steps, seed, decoding,
                 stop, regex)
  beams, returned = decoding["num_beams"], decoding["num_return_sequences"]
  if beams > 1:  # Each prompt's best `returned` of its `beams` rows.
    texts = [text for p in range(len(prompts))
             for text in texts[p * beams:p * beams + returned]]
  return Served(texts, f"{cache.entry_base(key)}.tflite")


def _run(artifact, prompts, per_prompt, num_steps, seed, decoding, stop,
         regex):
  """`generate`'s texts from the open `artifact`, one per row (a beam
  search's every hypothesis); raises NotServed."""
  vocab = artifact.manifest["vocab"]
  try:
    tokens = cache.tokens_of(artifact.manifest)
  except cache.Miss as e:
    raise NotServed(str(e)) from None
  longest = _check_prompts(prompts, vocab, tokens)
  crossover = prompt_crossover(artifact.manifest)
  if crossover is not None and longest >= crossover:
    raise NotServed(f"a prompt of {longest:,} tokens is past the compiled "
                    f"artifact's crossover for this model ({crossover:,}), "
                    "where TensorFlow primes it faster")
  # The artifact's inputs: every decoding option it has.
  values = {name: value for name, value in decoding.items()
            if name in runner.ARTIFACT_OPTIONS}
  beams, returned = decoding["num_beams"], decoding["num_return_sequences"]
  if beams > 1:  # As the library: one search per prompt, its rows its best.
    values = {name: (value[::returned] if isinstance(value, list) else value)
              for name, value in values.items()}
    regex = regex[::returned] if isinstance(regex, list) else regex
  else:
    prompts = [prompt for prompt in prompts for _ in range(per_prompt)]
  try:
    return runner.run_artifact(artifact.path, vocab, prompts, num_steps,
                               seed=seed, tokens=tokens, stop=list(stop),
                               regex=regex,
                               weight_cache=artifact.weight_cache, **values)
  except errors.ArgumentError as e:  # The library refuses it too: its words.
    raise NotServed(f"--{e.argument}: {e}") from None
  except (ImportError, ValueError, RuntimeError) as e:
    raise NotServed(f"the compiled artifact failed ({type(e).__name__}: "
                    f"{e})") from None


def _check_prompts(prompts, vocab, tokens) -> int:
  """The longest prompt's length in tokens; raises NotServed unless the
  model's vocabulary encodes every prompt (a token model's by the library's
  encoding, whose refusals are the TensorFlow path's)."""
  if tokens is None:
    known = set(vocab)
    if any(c not in known for prompt in prompts for c in prompt):
      raise NotServed("a --prompt character is not in the model's "
                      "vocabulary")
    return max(len(prompt) for prompt in prompts)
  try:
    lengths = [len(tokens.encode(prompt)) for prompt in prompts]
    if not all(lengths):
      raise ValueError("gives no tokens")
  except ValueError:
    raise NotServed("a --prompt the model's vocabulary cannot encode"
                    ) from None
  return max(lengths)
