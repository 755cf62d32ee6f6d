"""Runs a LiteRT export's `generate` signature in the ai_edge_litert interpreter
(tests/test_litert.py, and the matrix's LiteRT caller)."""

import numpy as np
import pytest

from rnnstep.litert import inputs as litert_inputs


def run(flatbuffer, model, prompts, num_steps, temperature=0.0, seed=0,
        stop=(), regex=None, **options):
  """Runs the `generate` signature; returns the texts.

  The inputs are `litert_inputs.build`'s (every option off but those given),
  the texts `litert_inputs.texts`' (cut at a stop string as the library
  cuts them).
  """
  interpreter_lib = pytest.importorskip(
      "ai_edge_litert.interpreter",
      reason="ai_edge_litert is not installed (pip install ai-edge-litert)")
  interpreter = interpreter_lib.Interpreter(model_content=flatbuffer)
  runner = interpreter.get_signature_runner(litert_inputs.SIGNATURE)
  inputs = litert_inputs.build(model, [model.encode(p) for p in prompts],
                               num_steps, seed, stop=stop, regex=regex,
                               temperature=temperature, **options)
  out = runner(**inputs)
  ids, lengths = out["ids"], out["lengths"]
  assert ids.dtype == np.int32 and ids.shape == (len(prompts), num_steps)
  assert lengths.dtype == np.int32 and lengths.shape == (len(prompts),)
  return litert_inputs.texts(model, ids, lengths, stop, prompts)
