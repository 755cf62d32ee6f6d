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

import os

from rnnstep.engine import cpu
from rnnstep.litert import inputs as litert_inputs

# The export's options: what `rnnstep.litert.export.convert` is asked for and the
# signature `run_artifact` calls. A change to the export (its signature, its
# dtype) changes this, and so every key of the compiled-artifact cache.
EXPORT_OPTIONS = {"exporter": "litert", "signature": litert_inputs.SIGNATURE,
                  "dtype": "float32",
                  "inputs": [i.name for i in litert_inputs.INPUTS]}
# The decoding options the artifact takes (every one the SavedModel serves).
ARTIFACT_OPTIONS = tuple(o.name for o in litert_inputs.OPTIONS)
# Past this size an artifact does not run on the XNNPACK delegate that
# LiteRT's interpreter applies by default: that delegate packs the weights
# of every loop that uses them (the prime, the decode loops, beams) into a
# copy of its own, on every run. The 0.1B RWKV-7's 766 MB artifact held 2.7
# GB that way and 784 MB on the builtin kernels (which read the
# flatbuffer's weights in place); a 94 MB RWKV-7 primed 100 tokens and
# decoded 200 in 1.8-1.9 s on them against 2.3-3.0 s with XNNPACK, while
# the bundled GRU's 8 MB ran 1,500 steps 1.5x faster with XNNPACK. The
# cache packs such an artifact's weights once, into a file of its own
# (`pack_weights`), which each run maps: XNNPACK's speed without the copies.
BUILTIN_KERNELS_FROM_BYTES = 64 << 20
# TensorFlow's own setting of its intra-op threads, which the artifact's
# runtime takes too (`default_threads`).
THREADS_ENV = "TF_NUM_INTRAOP_THREADS"


def default_threads() -> int:
  """The threads the artifact's runtime runs on unless told: as many as the
  TensorFlow path's products would (`THREADS_ENV` where it holds a positive
  integer, else every core this process may use), so that the two paths
  are compared, and chosen between, on the same cores. (On a 2-vCPU Zen 5
  two threads ran the 0.1B RWKV-7's artifact 1.14x as fast as one in
  decode and 1.3-1.5x in priming, and the bundled GRU's no slower:
  benchmarks/results/litert-threads-epyc-zen5-2026-12.md.) Never more than
  those cores: more threads only wait for them, and LiteRT's thread pool
  crashed the process when asked for 100,000. LiteRT's builtin kernels run
  on one thread whatever the number."""
  cores = cpu.usable_cores()
  value = os.environ.get(THREADS_ENV, "").strip()
  if value.isdigit() and int(value) > 0:  # TensorFlow ignores others too.
    return min(int(value), cores)
  return cores


def run_artifact(flatbuffer, vocab, prompts, num_steps: int,
                 seed: int, tokens=None, stop=(), regex=None,
                 builtin_kernels=None, weight_cache=None, num_threads=None,
                 **values):
  """The continuations of `prompts` from the flatbuffer's `generate`.

  The inputs are built as `rnnstep.generate` builds its request
  (`litert_inputs.build`: the stop and regex tables with numpy), and the
  texts decoded as it decodes them (a token model's cut at its stop
  string's end).

  Args:
    flatbuffer: the artifact: its bytes, or its file's path.
    vocab, prompts, num_steps, seed: its vocabulary and the request.
    tokens: a token model's `vocabulary.Tokens` (the cache's `tokens_of`);
      None for a character model.
    stop: stop strings.
    regex: None, a pattern, or one (or None) per prompt.
    builtin_kernels: run on LiteRT's builtin kernels rather than XNNPACK;
      None: past `BUILTIN_KERNELS_FROM_BYTES`.
    weight_cache: the path of XNNPACK's packed weights for the artifact
      (`pack_weights`' file, for the same flatbuffer): the artifact, given
      by its path, runs on XNNPACK through LiteRT's `CompiledModel`, its
      weights mapped from that file (`builtin_kernels` is not used).
    num_threads: the runtime's threads; None: `default_threads()`.
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
  per_prompt = max(int(inputs["num_beams"]), 1)
  rows = len(prompts) * per_prompt
  if weight_cache is not None:
    out = _run_compiled(flatbuffer, weight_cache, inputs, rows, num_steps,
                        num_threads)
  else:
    in_memory = isinstance(flatbuffer, bytes)
    if builtin_kernels is None:
      size = len(flatbuffer) if in_memory else os.path.getsize(flatbuffer)
      builtin_kernels = size > BUILTIN_KERNELS_FROM_BYTES
    resolver = (
        interpreter_lib.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        if builtin_kernels else interpreter_lib.OpResolverType.AUTO)
    out = interpreter_lib.Interpreter(
        **({"model_content": flatbuffer} if in_memory
           else {"model_path": flatbuffer}),
        experimental_op_resolver_type=resolver,
        num_threads=num_threads or default_threads()
    ).get_signature_runner(EXPORT_OPTIONS["signature"])(**inputs)
  if (out["ids"].shape != (rows, num_steps)
      or out["lengths"].shape != (rows,)
      or not np.all((0 <= out["lengths"]) & (out["lengths"] <= num_steps))):
    raise ValueError(f"the artifact returned ids of shape {out['ids'].shape}")
  return litert_inputs.texts(view, out["ids"], out["lengths"], stop,
                             [p for p in prompts for _ in range(per_prompt)])


def pack_weights(path: str, weight_cache: str):
  """Packs the weights of the artifact at `path` for XNNPACK into the file
  `weight_cache` (which `run_artifact(path, ..., weight_cache=...)` then
  maps instead of packing them again).

  Raises:
    RuntimeError: the runtime wrote no packed weights.
    ImportError: no ai_edge_litert.
  """
  _compiled_model(path, weight_cache, None).close()
  if not os.path.isfile(weight_cache) or not os.path.getsize(weight_cache):
    raise RuntimeError("LiteRT wrote no XNNPACK weight cache")


def _compiled_model(path: str, weight_cache: str, num_threads):
  """The artifact at `path` compiled for the CPU (XNNPACK), with its packed
  weights in the file `weight_cache` (made there when it holds none)."""
  # pylint: disable-next=g-import-not-at-top
  from ai_edge_litert import compiled_model as compiled_lib
  options = compiled_lib.Options(
      hardware_accelerators=compiled_lib.HardwareAccelerator.CPU,
      cpu_options=compiled_lib.CpuOptions(
          num_threads=num_threads or default_threads(),
          xnnpack_weight_cache_path=weight_cache))
  return compiled_lib.CompiledModel.from_file(path, options=options)


def _run_compiled(path: str, weight_cache: str, inputs: dict, rows: int,
                  num_steps: int, num_threads) -> dict:
  """`generate`'s outputs from the compiled artifact at `path`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from ai_edge_litert import compiled_model as compiled_lib
  signature = EXPORT_OPTIONS["signature"]
  model = _compiled_model(path, weight_cache, num_threads)
  try:
    buffers = {}
    for name, value in inputs.items():
      value = np.asarray(value)
      if value.ndim:  # The signature's scalars have their shape already.
        model.resize_input_tensor_by_name(signature, name, value.shape)
      buffers[name] = model.create_input_buffer_by_name(signature, name)
      buffers[name].write(value.reshape(-1))
    # The ids' shape follows the num_steps input, which the runtime cannot
    # know before it runs: it writes the outputs into arrays of the known
    # shapes (one column at least: a buffer may not be empty).
    ids = _aligned_zeros((rows, max(num_steps, 1)))
    lengths = _aligned_zeros((rows,))
    outputs = {"ids": compiled_lib.TensorBuffer.create_from_host_memory(ids),
               "lengths": compiled_lib.TensorBuffer.create_from_host_memory(
                   lengths)}
    model.run_by_name(signature, buffers, outputs)
  finally:
    model.close()
  return {"ids": ids[:, :num_steps], "lengths": lengths}



def _aligned_zeros(shape):
  """int32 zeros at a 64-byte boundary: LiteRT's host buffers need it, and
  it would write into a copy of an array that is not aligned."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  count = int(np.prod(shape))
  raw = np.zeros(count + 16, np.int32)
  start = (-raw.ctypes.data % 64) // 4
  return raw[start:start + count].reshape(shape)
