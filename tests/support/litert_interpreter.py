"""Runs a LiteRT export's `generate` signature in the ai_edge_litert interpreter
(tests/test_litert.py, and the matrix's LiteRT caller)."""

import numpy as np
import pytest

from rnnstep.exporters import litert


def run(flatbuffer, model, prompts, num_steps, temperature=0.0, top_k=0,
        top_p=1.0, seed=0):
  """Runs the `generate` signature; returns the texts."""
  interpreter_lib = pytest.importorskip(
      "ai_edge_litert.interpreter",
      reason="ai_edge_litert is not installed (pip install ai-edge-litert)")
  interpreter = interpreter_lib.Interpreter(model_content=flatbuffer)
  runner = interpreter.get_signature_runner(litert.SIGNATURE)
  encoded = [model.encode(p) for p in prompts]
  ids = np.zeros([len(prompts), max(map(len, encoded))], np.int32)
  for row, e in enumerate(encoded):
    ids[row, :len(e)] = e
  out = runner(prompt_ids=ids,
               prompt_lengths=np.array([len(e) for e in encoded], np.int32),
               num_steps=np.int32(num_steps),
               temperature=np.float32(temperature), top_k=np.int32(top_k),
               top_p=np.float32(top_p), seed=np.int32(seed))["ids"]
  assert out.dtype == np.int32 and out.shape == (len(prompts), num_steps)
  return [model.decode(row) for row in out]
