"""The check of a `model` argument, for every public function taking one.

What a caller passes for a model is often something else a model comes
from: a path, a Keras model (the TF tutorial's subclassed one), a PyTorch
module. Each is refused in one line that says how to make an
`rnnstep.Model` of it, before anything reads an attribute of it.
"""

import os

from rnnstep import errors
from rnnstep.model import network


def check_model(model, argument: str = "model") -> network.Model:
  """`model` if it is an `rnnstep.Model`; otherwise an error saying how to
  make one from what was given (a path, a Keras or PyTorch model).

  Raises:
    errors.ArgumentError: naming `argument`.
  """
  if isinstance(model, network.Model):
    return model
  kind = type(model)
  # A subclassed model (the TF tutorial's) is defined in the user's module.
  frameworks = {c.__module__.split(".")[0] for c in kind.__mro__}
  if isinstance(model, (str, os.PathLike)):
    how = f"load the file first: rnnstep.load({os.fspath(model)!r})"
  elif frameworks & {"keras", "tf_keras"} or any(
      ".keras" in c.__module__ for c in kind.__mro__):
    how = ("save its weights (model.save_weights('model.weights.h5')) and "
           "pass rnnstep.load('model.weights.h5', corpus='train.txt')")
  elif "torch" in frameworks:
    how = ("save its weights (torch.save(model.state_dict(), 'model.pt')) "
           "and pass rnnstep.load('model.pt', vocab='vocab.json')")
  else:
    how = "rnnstep.load(path) makes one from a model file"
  name = ("None" if model is None else kind.__qualname__
          if kind.__module__ == "builtins"
          else f"{kind.__module__}.{kind.__qualname__}")
  raise errors.ArgumentError(
      argument, f"{argument} must be an rnnstep.Model, got {name}: {how}")
