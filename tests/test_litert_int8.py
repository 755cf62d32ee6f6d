"""An int8 model's LiteRT export (issue #62): its products are XNNPACK's
int8 kernel's, in the library's int8 arithmetic, so its greedy text is
`rnnstep.load(..., weights_dtype="int8")`'s, checked against an independent
numpy RWKV-7 in that arithmetic.

The reference is `tests/support/rwkv7_reference.py`'s equations with each
int8-weight product computed as XNNPACK's dynamic-range fully-connected
kernel computes it (`tests/support/int8_reference.py`, on
`int8_products.xnnpack_dynamic_int8`, itself pinned bit for bit against
LiteRT in tests/test_weights_dtype_int8_arithmetic.py). The artifact's
int8 constants are the library's q and scales, and nothing else in it is
int8.
"""

import pathlib

import numpy as np
import pytest

import rnnstep
from tests.support import forkserver
from tests.support import int8_reference
from tests.support import rwkv7_reference
from tests.support.cli import ENV, TIMEOUT, Result, command, ok

pytestmark = pytest.mark.slow  # A LiteRT conversion and a numpy reference.

COMMAND = command("rnnstep-export", "rnnstep.cli.export")
PRESET = str(pathlib.Path(__file__).parent / "data" / "rwkv7" / "preset")
PROMPT = "The quick brown fox"
STEPS = 40


def test_exported_int8_text_is_the_library_s_int8_text(tmp_path):
  interpreter_lib = pytest.importorskip(
      "ai_edge_litert.interpreter", reason="ai_edge_litert is not installed")
  from rnnstep.litert import inputs as litert_inputs  # pylint: disable=g-import-not-at-top
  from tools.bench import int8_litert  # pylint: disable=g-import-not-at-top
  output = tmp_path / "int8"
  done = forkserver.run(
      COMMAND + [f"--model={PRESET}", "--format=tflite",
                 "--dynamic_range_int8", f"--output={output}"],
      env=ENV, capture_output=True, text=True, timeout=TIMEOUT, check=False)
  ok(Result(done.returncode, done.stdout, done.stderr))
  flatbuffer = (output / "model.tflite").read_bytes()

  model = rnnstep.load(PRESET, weights_dtype="int8")
  prompt = model.encode(PROMPT).tolist()
  runner = interpreter_lib.Interpreter(
      model_path=str(output / "model.tflite")).get_signature_runner(
          litert_inputs.SIGNATURE)
  out = runner(**litert_inputs.build(model, [prompt], STEPS, seed=1,
                                     temperature=0.0))
  got = out["ids"][0][:out["lengths"][0]].tolist()
  assert len(got) == STEPS

  # The artifact's int8 matrices are the int8 model's (R, K, V, O, the
  # feed-forward's two, the head), as q `[out, in]` and its scales.
  tensors = model.tensors()
  int8 = int8_litert.int8_constants(flatbuffer)
  names = ("receptance", "key", "value", "output", "ffn_key", "ffn_value")
  want = [tensors["dense_kernel"]] + [
      block for name in names for block in tensors[f"layer0_{name}"]]
  assert len(int8) == len(want)
  for matrix in want:
    q, scale = int8_reference.int8_of(matrix)
    assert any(np.array_equal(found, q.T) and np.allclose(
        found_scale, scale, rtol=1e-6) and not zero_point.any()
               for found, found_scale, zero_point in int8)

  # Greedy along the numpy reference in the int8 arithmetic: its logits are
  # teacher-forced (a row depends on the ids before it only), so one pass
  # over the prompt and the artifact's ids gives each step's argmax.
  head_size = model.config.layers[0].size["head_size"]
  logits = rwkv7_reference.logits(tensors, head_size, prompt + got[:-1],
                                  product=int8_reference.by_values,
                                  dtype=np.float32)
  assert got == np.argmax(logits[len(prompt) - 1:], axis=-1).tolist()
  assert model.decode(got) == rnnstep.generate(model, PROMPT, STEPS, seed=1,
                                               temperature=0.0)
