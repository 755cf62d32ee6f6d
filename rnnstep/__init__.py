"""rnnstep: Keras-exact text generation from recurrent LMs, one device call.

The models: GRU, LSTM and SimpleRNN stacks over characters, words, bytes or
subword tokens, and RWKV-7.

Public API:
  load(path=None, dtype='float32') -> Model     read a model file (None: bundled)
  logits(model, ids, initial_state=None)        teacher-forced scoring [B, T, V]
  loglikelihood(model, [(context, continuation)])  (logprob, is_greedy) per pair
  loglikelihood_rolling(model, texts)           each whole text's log-likelihood
  record_seed(base_seed, index)                 a bulk job's seed for record i
  hidden_states(model, texts_or_ids)            every layer's state at every position
  prompt_state(model, texts_or_ids)             the state after each prompt
  save_state(path, model, state)                a state file (.safetensors, .pth, .st)
  load_state(path, model)                       a state file as an initial_state
  generate(model, prompts, num_steps, ...)      continuations, one compiled call
  stream(model, prompts, num_steps, ...)        the same, chunk by chunk
  export(model, export_dir)                     a strings-in, strings-out SavedModel
  export(model, export_dir, format="web")       a page + ES module generating in the browser
  tune(model, batch_sizes=...)                  measure the fastest path here, cache it
  export_litert(model, export_dir)              model.tflite + vocab.json (LiteRT)
  Model, Generator                              the lower-level objects
  inspect.analyze(model, text)                  neuron activations and top-5 guesses
                                                (rnnstep-inspect draws them as a page)

Names are imported on first use (PEP 562), so `import rnnstep` does not import
TensorFlow: the command-line tools answer --help and flag errors at once, and
can quiet TensorFlow's logging before it loads.
"""

import importlib

from rnnstep.version import __version__

_EXPORTS = {
    "Generator": "rnnstep.engine.generator",
    "Model": "rnnstep.model.network",
    "bundled_model_path": "rnnstep.api",
    "export": "rnnstep.exporters",
    "export_litert": "rnnstep.litert.export",
    "generate": "rnnstep.api",
    "hidden_states": "rnnstep.states",
    "load": "rnnstep.api",
    "logits": "rnnstep.api",
    "loglikelihood": "rnnstep.api",
    "loglikelihood_rolling": "rnnstep.api",
    "load_state": "rnnstep.states",
    "prompt_state": "rnnstep.states",
    "save_state": "rnnstep.states",
    "record_seed": "rnnstep.engine.host",
    "stream": "rnnstep.api",
    "tune": "rnnstep.tuning",
}
# Submodules that are part of the API, imported on first use as well.
_SUBMODULES = ("inspect",)
__all__ = sorted(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  if name in _SUBMODULES:
    return importlib.import_module(f"rnnstep.{name}")  # Binds it here too.
  raise AttributeError(f"module 'rnnstep' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
