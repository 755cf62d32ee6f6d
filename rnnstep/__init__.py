"""rnnstep: Keras-exact text generation from recurrent char models, one device call.

Public API:
  load(path=None, dtype='float32') -> Model     read a model file (None: bundled)
  logits(model, ids) -> np.ndarray [B, T, V]    teacher-forced scoring
  generate(model, prompts, num_steps, ...)      continuations, one compiled call
  stream(model, prompts, num_steps, ...)        the same, chunk by chunk
  export(model, export_dir)                     a strings-in, strings-out SavedModel
  Model, Generator                              the lower-level objects
"""

from rnnstep.api import bundled_model_path
from rnnstep.api import generate
from rnnstep.api import load
from rnnstep.api import logits
from rnnstep.api import stream
from rnnstep.generator import Generator
from rnnstep.model import Model
from rnnstep.saved_model import export

__all__ = ["Generator", "Model", "bundled_model_path", "export", "generate",
           "load", "logits", "stream"]
__version__ = "0.1.0"
