"""Runs a LiteRT export's `generate` without TensorFlow: rnnstep-generate's warm path.

`rnnstep.litert.export` writes the flatbuffer (with TensorFlow's converter); this
module calls it with the `ai_edge_litert` interpreter from a process that
imports no TensorFlow: numpy and rnnstep's TensorFlow-free modules (the
vocabulary, and `rnnstep.litert.inputs` with the stop and regex tables;
`interegular` for a pattern, a subword model's `tokenizers`). The
compiled-artifact cache (`rnnstep/litert/cache.py`) keeps one
flatbuffer per model and keys it on `EXPORT_OPTIONS`. The interpreter is
imported on first use.
"""

from rnnstep.litert import inputs as litert_inputs

# The export's options: what `rnnstep.litert.export.convert` is asked for and the
# signature `run_artifact` calls. A change to the export (its signature, its
# dtype) changes this, and so every key of the compiled-artifact cache.
EXPORT_OPTIONS = {"exporter": "litert", "signature": litert_inputs.SIGNATURE,
                  "dtype": "float32",
                  "inputs": [i.name for i in litert_inputs.INPUTS]}
# The decoding options the artifact takes (every one the SavedModel serves).
ARTIFACT_OPTIONS = tuple(o.name for o in litert_inputs.OPTIONS)
# Past this size an artifact runs on LiteRT's builtin kernels, not the
# XNNPACK delegate the interpreter applies by default: XNNPACK packs the
# weights of every loop that uses them (the prime, the decode loops, beams)
# into a copy of its own, on every run. The 0.1B RWKV-7's 766 MB artifact
# held 2.7 GB that way and 784 MB on the builtin kernels (which read the
# flatbuffer's weights in place); a 94 MB RWKV-7 primed 100 tokens and
# decoded 200 in 1.8-1.9 s on them against 2.3-3.0 s with XNNPACK, while
# the bundled GRU's 8 MB ran 1,500 steps 1.5x faster with XNNPACK.
BUILTIN_KERNELS_FROM_BYTES = 64 << 20


def run_artifact(flatbuffer: bytes, vocab, prompts, num_steps: int,
                 seed: int, tokens=None, stop=(), regex=None,
                 builtin_kernels=None, **values):
  """The continuations of `prompts` from the flatbuffer's `generate`.

  The inputs are built as `rnnstep.generate` builds its request
  (`litert_inputs.build`: the stop and regex tables with numpy), and the
  texts decoded as it decodes them (a token model's cut at its stop
  string's end).

  Args:
    flatbuffer, vocab, prompts, num_steps, seed: the artifact, its
      vocabulary and the request.
    tokens: a token model's `vocabulary.Tokens` (the cache's `tokens_of`);
      None for a character model.
    stop: stop strings.
    regex: None, a pattern, or one (or None) per prompt.
    builtin_kernels: run on LiteRT's builtin kernels rather than XNNPACK;
      None: past `BUILTIN_KERNELS_FROM_BYTES`.
    **values: decoding options by name (`ARTIFACT_OPTIONS`; per-row ones
      one value or a list with one per prompt).

  Returns:
    One text per row: per prompt, or with num_beams k > 1 each prompt's k
    hypotheses, best first (k rows per prompt).

  Raises:
    errors.ArgumentError: a value, stop string or pattern the library
      refuses too (naming it).
    ValueError: a prompt the vocabulary cannot encode (the caller checks
      first), or an artifact that returns other shapes.
    ImportError: no ai_edge_litert.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from ai_edge_litert import interpreter as interpreter_lib
  from rnnstep.model import vocabulary  # pylint: disable=g-import-not-at-top
  view = litert_inputs.Vocabulary(tokens or vocabulary.characters(vocab))
  encoded = [view.encode(prompt) for prompt in prompts]
  if not all(len(e) for e in encoded):
    raise ValueError("a prompt gives no tokens")
  inputs = litert_inputs.build(view, encoded, num_steps, seed, stop=stop,
                               regex=regex, **values)
  if builtin_kernels is None:
    builtin_kernels = len(flatbuffer) > BUILTIN_KERNELS_FROM_BYTES
  resolver = (interpreter_lib.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
              if builtin_kernels else interpreter_lib.OpResolverType.AUTO)
  runner = interpreter_lib.Interpreter(
      model_content=flatbuffer, experimental_op_resolver_type=resolver
  ).get_signature_runner(EXPORT_OPTIONS["signature"])
  out = runner(**inputs)
  per_prompt = max(int(inputs["num_beams"]), 1)
  rows = len(prompts) * per_prompt
  if (out["ids"].shape != (rows, num_steps)
      or out["lengths"].shape != (rows,)
      or not np.all((0 <= out["lengths"]) & (out["lengths"] <= num_steps))):
    raise ValueError(f"the artifact returned ids of shape {out['ids'].shape}")
  return litert_inputs.texts(view, out["ids"], out["lengths"], stop,
                             [p for p in prompts for _ in range(per_prompt)])
