"""Runs a LiteRT export's `generate` without TensorFlow: rnnstep-generate's warm path.

`exporters.litert` writes the flatbuffer (with TensorFlow's converter); this
module calls it with the `ai_edge_litert` interpreter from a process that
imports only numpy (and, for a token model, `rnnstep.model.vocabulary`,
which imports no TensorFlow; a subword model's `tokenizers`). The
compiled-artifact cache (`rnnstep/cli/compiled_cache.py`) keeps one
flatbuffer per model and keys it on `EXPORT_OPTIONS`.

Nothing here is imported at module level beyond the standard library.
"""

# The export's options: what `exporters.litert.convert` is asked for and the
# signature `run_artifact` calls. A change to the export (its signature, its
# dtype) changes this, and so every key of the compiled-artifact cache.
EXPORT_OPTIONS = {"exporter": "litert", "signature": "generate",
                  "dtype": "float32", "inputs": ["prompt_ids", "prompt_lengths",
                                                 "num_steps", "temperature",
                                                 "top_k", "top_p", "seed"]}


def run_artifact(flatbuffer: bytes, vocab, prompts, num_steps: int,
                 temperature: float, top_k: int, top_p: float, seed: int,
                 tokens=None):
  """The continuations of `prompts` from the flatbuffer's `generate`.

  Args:
    flatbuffer, vocab, prompts, num_steps, temperature, top_k, top_p, seed:
      the artifact, its vocabulary and the request.
    tokens: a token model's `vocabulary.Tokens` (the cache's `tokens_of`),
      which encodes the prompts and decodes the ids as the library does;
      None for a character model.

  Raises:
    KeyError: a prompt character outside `vocab` (the caller checks first).
    ValueError: a prompt a token model cannot encode.
    ImportError: no ai_edge_litert.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from ai_edge_litert import interpreter as interpreter_lib
  if tokens is not None:
    encoded = [tokens.encode(prompt).tolist() for prompt in prompts]
    if not all(encoded):
      raise ValueError("a prompt gives no tokens")
  else:
    char_to_id = {c: i for i, c in enumerate(vocab)}
    encoded = [[char_to_id[c] for c in prompt] for prompt in prompts]
  ids = np.zeros([len(prompts), max(map(len, encoded))], np.int32)
  for row, prompt_ids in enumerate(encoded):
    ids[row, :len(prompt_ids)] = prompt_ids
  runner = interpreter_lib.Interpreter(
      model_content=flatbuffer).get_signature_runner(EXPORT_OPTIONS["signature"])
  out = runner(prompt_ids=ids,
               prompt_lengths=np.array([len(e) for e in encoded], np.int32),
               num_steps=np.int32(num_steps),
               temperature=np.float32(temperature), top_k=np.int32(top_k),
               top_p=np.float32(top_p), seed=np.int32(seed))["ids"]
  if out.shape != (len(prompts), num_steps):
    raise ValueError(f"the artifact returned ids of shape {out.shape}")
  if tokens is not None:
    return [tokens.text(row) for row in out]
  return ["".join(vocab[i] for i in row) for row in out.tolist()]
