"""What a model's neurons do over a text (the numbers and the page).

  analysis   `analyze(model, text)`: activations, selective neurons, guesses
  page       the self-contained HTML page `rnnstep-inspect` writes (no TF)

`rnnstep.inspect.analyze` and the other names of `analysis` are loaded on
first use, so that `rnnstep.inspect.page` is read without TensorFlow.
"""

import importlib


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  if name in ("analysis", "page"):
    return importlib.import_module(f"rnnstep.inspect.{name}")
  analysis = importlib.import_module("rnnstep.inspect.analysis")
  try:
    return getattr(analysis, name)
  except AttributeError:
    raise AttributeError(
        f"module 'rnnstep.inspect' has no attribute {name!r}") from None
