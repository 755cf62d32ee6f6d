"""`rnnstep-export --format=tflite --dynamic_range_int8` (issue #62): its
artifact's greedy text is XNNPACK int8 arithmetic's, checked against an
independent numpy RWKV-7 in that arithmetic.

The reference is `tests/support/rwkv7_reference.py`'s equations in float32
with each int8-weight product computed as XNNPACK's dynamic-range
fully-connected kernel computes it (`int8_products.xnnpack_dynamic_int8`,
itself pinned bit for bit against LiteRT in
tests/test_weights_dtype_int8_arithmetic.py), on the int8 weights and scales
the converter stored in the artifact, and the prompt's rows from the
artifact's int8 input table (`tools/bench/int8_litert.py`'s
`numpy_greedy`). The export's text is not the float32 text, so the float32
reference is no reference for it.
"""

import pathlib

import pytest

import rnnstep
from tests.support import forkserver
from tests.support.cli import ENV, TIMEOUT, Result, command, ok

pytestmark = pytest.mark.slow  # A LiteRT conversion and a numpy reference.

COMMAND = command("rnnstep-export", "rnnstep.cli.export")
PRESET = str(pathlib.Path(__file__).parent / "data" / "rwkv7" / "preset")
PROMPT = "The quick brown fox"
STEPS = 40


def test_exported_int8_text_is_xnnpack_int8_arithmetic_s(tmp_path):
  interpreter_lib = pytest.importorskip(
      "ai_edge_litert.interpreter", reason="ai_edge_litert is not installed")
  from rnnstep.litert import inputs as litert_inputs  # pylint: disable=g-import-not-at-top
  from tools.bench import int8_litert  # pylint: disable=g-import-not-at-top
  output = tmp_path / "int8"
  done = forkserver.run(
      COMMAND + [f"--model={PRESET}", "--format=tflite",
                 "--dynamic_range_int8", f"--output={output}"],
      env=ENV, capture_output=True, text=True, timeout=TIMEOUT, check=False)
  report = ok(Result(done.returncode, done.stdout, done.stderr))
  assert "dynamic-range int8" in report.splitlines()[0]
  flatbuffer = (output / "model.tflite").read_bytes()

  model = rnnstep.load(PRESET)
  prompt = model.encode(PROMPT).tolist()
  runner = interpreter_lib.Interpreter(
      model_path=str(output / "model.tflite")).get_signature_runner(
          litert_inputs.SIGNATURE)
  out = runner(**litert_inputs.build(model, [prompt], STEPS, seed=1,
                                     temperature=0.0))
  got = out["ids"][0][:out["lengths"][0]].tolist()

  int8 = int8_litert.int8_constants(flatbuffer)
  table = int8_litert.primed_table(int8)
  assert table is not None  # The priming loop's table is int8 too.
  want, products = int8_litert.numpy_greedy(model, int8, prompt, STEPS, table)
  assert any(kind == "int8" for kind, *_ in products), products
  assert got == want
  assert len(got) == STEPS
