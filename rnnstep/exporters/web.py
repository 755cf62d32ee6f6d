"""Web export: generation in the browser, with the library's text.

`export_web(model, export_dir)` writes

  export_dir/weights.bin   the weights, float32 little-endian, laid out for the
                           runtime (see `tensors`)
  export_dir/model.json    the architecture, vocabulary, tensor offsets and
                           the decoding options' declarations
  export_dir/rnnstep.js    an ES module: `load(url)` (default: this export),
                           `generate`, `stream`, `step`, `fromData`
  export_dir/index.html    a demo page holding all of the above inline: it
                           works from file:// (where Chromium refuses module
                           scripts and fetch) and loads nothing from anywhere
                           (its Content-Security-Policy forbids it)

The runtime (`web_runtime.js`) is a small hand-written kernel, not TF.js:
the counter-hash noise needs exact uint32 products (`Math.imul`), float32
rounding is `Math.fround`, and at batch 1 the step is a few matrix-vector
products, where a TF.js `predict` per character pays its per-call overhead
many times over (docs/guide/web.md has the measurements). It runs the loop
of `rnnstep.generate` for one prompt: priming, the `[UNK]` ban, repetition
penalty, n-gram ban, temperature, top-k, top-p, min-p, typical-p, the
Gumbel-max draw over `sampling.uniform_noise`, stop strings, windows; the
seed s gives the row key (s, 0), as `rnnstep.generate(prompt, ..., seed=s)`.

What the runtime does not run is refused here, in one line: reduced-precision
models (the page computes in float32, so its text would not be theirs) and
cell kinds it has no code for. Beam search and `regex=` are refused by the
page itself when asked for.
"""

import base64
import json
import os
from typing import Dict, Tuple

import numpy as np

from rnnstep.decoding import options as options_lib
from rnnstep.model import kinds
from rnnstep import staging

WEIGHTS_FILE = "weights.bin"
META_FILE = "model.json"
MODULE_FILE = "rnnstep.js"
PAGE_FILE = "index.html"
RUNTIME = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "web_runtime.js")

# The cell kinds `web_runtime.js` has a step for (its `Layer.step`).
RUNS_KINDS = ("gru", "lstm", "simple_rnn")

# Options of rnnstep.generate the page does not run, and what to do instead.
REFUSED_OPTIONS = {
    "num_beams": "beam search is not in the web export; use rnnstep.generate",
    "length_penalty": "beam search is not in the web export; use "
                      "rnnstep.generate",
    "num_return_sequences": "beam search is not in the web export; use "
                            "rnnstep.generate",
    "regex": "regex= is not in the web export; use rnnstep.generate",
    "return_scores": "scores are not in the web export; use rnnstep.generate",
}


def check_exportable(model) -> None:
  """Refuses, in one line, a model the web runtime would not give the text of.

  Raises:
    ValueError: the model is not float32, is a token model (the page splits
      a prompt one character per id), has a cell kind the runtime does not
      run, or layers it does not (bidirectional, a head of Dense layers).
  """
  name = model.source or "the model"
  if not model.is_characters:
    raise ValueError(
        f"{name}: a {model.tokens.kind} model has no web export yet (the page "
        "maps one character per id); use rnnstep.generate or the LiteRT "
        "export, which works on ids")
  if model.compute_dtype.name != "float32":
    raise ValueError(
        f"the web export is float32 only (the page computes in float32, so "
        f"its text would not be {model.compute_dtype.name}'s), but {name} "
        "was loaded as "
        f"{model.compute_dtype.name}; load it with dtype='float32'")
  if model.config.recomputes or model.config.head:
    raise ValueError(
        f"{name}: a model with a bidirectional layer, pre-padded windows or "
        "Dense layers before its output has no web export (the page steps "
        "recurrent layers and one Dense); export a SavedModel "
        "(--format=saved_model) instead")
  for i, layer in enumerate(model.config.layers):
    if layer.kind not in RUNS_KINDS:
      raise ValueError(
          f"{name}: layer {i} is {kinds.get(layer.kind).display}, which the "
          f"web export does not run (it runs {', '.join(RUNS_KINDS)}); "
          "export a SavedModel (--format=saved_model) instead")


def tensors(model) -> Dict[str, np.ndarray]:
  """The runtime's tensors, float32, by name (model.json's order).

  Layer 0's input is the model's own `input_table` (embedding x kernel +
  folded bias, as the library gathers it); kernels are transposed to
  `[G*U, D]` so each output is one contiguous dot product; biases are the
  cells' own folded ones (`network.make_cell`), so no sum is regrouped here.
  An int8 model's kernel is its int8 q (as float32) with `{name}_scale`,
  a scale per output, which the page multiplies in the library's int8
  arithmetic (`int8_arithmetic`, `int8Product` in the runtime).

  Raises:
    ValueError: as `check_exportable`.
  """
  check_exportable(model)
  # pylint: disable=g-import-not-at-top
  from rnnstep.model import network
  from rnnstep.model import int8_arithmetic
  out = {"input_table": model.input_table.numpy()}

  def kernel(name, weights):
    if int8_arithmetic.is_int8(weights):
      out[f"{name}_t"] = weights.values.numpy().T
      out[f"{name}_t_scale"] = weights.scales.numpy()[0]
    else:
      out[f"{name}_t"] = weights.numpy().T

  for i, (layer, weights) in enumerate(zip(model.config.layers,
                                           model.layer_weights)):
    cell = network.make_cell(layer, weights)
    kernel(f"layer{i}_recurrent_kernel", weights["recurrent_kernel"])
    if i:
      kernel(f"layer{i}_kernel", weights["kernel"])
      out[f"layer{i}_input_bias"] = cell.input_bias.numpy()
    if layer.kind == "gru" and layer.reset_after:
      out[f"layer{i}_candidate_bias"] = cell.candidate_bias.numpy()
  kernel("dense_kernel", model.dense_kernel)
  out["dense_bias"] = model.dense_bias.numpy()
  return {name: np.ascontiguousarray(value, "<f4")
          for name, value in out.items()}


def _option_table():
  """The page's option checks, from the declarations (same bounds, words)."""
  table = []
  for option in options_lib.OPTIONS:
    if option.name in REFUSED_OPTIONS:
      continue
    valid = option.valid
    high = valid.high if valid.high is None or valid.high < 2**53 else None
    table.append({"name": option.name, "dtype": option.dtype,
                  "default": option.default, "low": valid.low, "high": high,
                  "low_open": valid.low_open, "high_open": valid.high_open,
                  "integer": valid.integer, "words": valid.words})
  return table


def export_data(model) -> Tuple[dict, bytes]:
  """model.json's object and weights.bin's bytes.

  Raises:
    ValueError: as `check_exportable`.
  """
  arrays = tensors(model)
  meta_tensors, chunks, offset = {}, [], 0
  for name, array in arrays.items():
    meta_tensors[name] = {"offset": offset, "shape": list(array.shape)}
    chunks.append(array.tobytes())
    offset += array.nbytes
  inputs = model.config.embedding_dim
  layers = []
  for layer in model.config.layers:
    layers.append({"kind": layer.kind, "units": layer.units,
                   "reset_after": bool(layer.reset_after), "inputs": inputs})
    inputs = layer.units
  meta = {"format": "rnnstep-web", "version": 1,
          "source": os.path.basename(model.source or ""),
          "vocab": list(model.vocab), "has_unk": bool(model.has_unk),
          "window": int(model.config.window or 0), "layers": layers,
          "weights": WEIGHTS_FILE, "dtype": "float32",
          "tensors": meta_tensors, "options": _option_table(),
          "refused_options": REFUSED_OPTIONS}
  return meta, b"".join(chunks)


def runtime_source() -> str:
  """The runtime's JavaScript (a classic script defining `rnnstep`)."""
  with open(RUNTIME, encoding="utf-8") as f:
    return f.read()


def module_source(runtime: str) -> str:
  """rnnstep.js: the runtime as an ES module; `load()` loads its own export."""
  return (runtime + "\n"
          "const here = new URL('./', import.meta.url).href;\n"
          "/** Loads an export (default: the one beside this module). */\n"
          "export function load(url = here) { return rnnstep.load(url); }\n"
          "export const {fromData, generate, stream, step, Model, "
          "RnnstepError, noise} = rnnstep;\n"
          "export default rnnstep;\n")


def _script_safe(text: str) -> str:
  """Text that cannot end an inline <script> early."""
  return text.replace("</", "<\\/")


def page_source(meta: dict, weights: bytes, runtime: str) -> str:
  """index.html: the demo page, everything inline.

  Args:
    meta: model.json's object.
    weights: weights.bin's bytes.
    runtime: the runtime's source.
  """
  with open(os.path.join(os.path.dirname(RUNTIME), "web_page.html"),
            encoding="utf-8") as f:
    template = f.read()
  meta_json = _script_safe(json.dumps(meta, ensure_ascii=True))
  return (template
          .replace("{{TITLE}}", _html(meta["source"] or "rnnstep model"))
          .replace("{{RUNTIME}}", _script_safe(runtime))
          .replace("{{META}}", meta_json)
          .replace("{{WEIGHTS}}", base64.b64encode(weights).decode("ascii")))


def _html(text: str) -> str:
  return (text.replace("&", "&amp;").replace("<", "&lt;")
          .replace(">", "&gt;").replace('"', "&quot;"))


def export_web(model, export_dir) -> str:
  """Writes the web export (see the module docstring) into a new export_dir.

  Written into a temp directory beside `export_dir` and renamed onto it when
  complete, so a failed export leaves nothing behind.

  Args:
    model: a float32 `rnnstep.Model`.
    export_dir: the directory to create; it must not exist yet or be empty.

  Returns:
    The export directory.

  Raises:
    ValueError: export_dir exists and is not empty, or the model cannot be
      exported (see `check_exportable`).
  """
  export_dir = staging.require_new_directory(export_dir)
  meta, weights = export_data(model)
  runtime = runtime_source()
  with staging.staged_path(export_dir, directory=True) as tmp:
    with open(os.path.join(tmp, WEIGHTS_FILE), "wb") as f:
      f.write(weights)
    with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as f:
      json.dump(meta, f, ensure_ascii=False)
    with open(os.path.join(tmp, MODULE_FILE), "w", encoding="utf-8") as f:
      f.write(module_source(runtime))
    with open(os.path.join(tmp, PAGE_FILE), "w", encoding="utf-8") as f:
      f.write(page_source(meta, weights, runtime))
  return export_dir
