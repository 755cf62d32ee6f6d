"""Execution paths: the ways one generation can run, by name.

  - "xla": the whole generation is one XLA program (fewest dispatches per
    step; XLA's float32 dots are as fast as TF's on most CPUs).
  - "graph": a plain TensorFlow graph, no XLA anywhere.
  - "elementwise": a TensorFlow graph loop whose matmuls are TF (oneDNN) ops,
    with the rest of a step (sampling, stopping, layer 0's gate math; each
    further layer's gate math) compiled by XLA as small programs (oneDNN runs
    bfloat16 matmuls on AMX; XLA's CPU backend does not).
  - "auto": the library picks one of the three for the model's dtype and the
    batch size (`rnnstep.api.default_path`).

Users name a path with the `jit_compile` argument (True, False, "elementwise"
or None); inside the library only these names travel.
"""

import numpy as np

from rnnstep import errors

XLA = "xla"
GRAPH = "graph"
ELEMENTWISE = "elementwise"
AUTO = "auto"

# The paths a Generator can run (AUTO is resolved before one is built).
CONCRETE = (XLA, GRAPH, ELEMENTWISE)


def from_jit_compile(jit_compile) -> str:
  """Maps a user's `jit_compile` value to a path name.

  Args:
    jit_compile: True (xla), False (graph), "elementwise", or None (auto).

  Returns:
    One of XLA, GRAPH, ELEMENTWISE, AUTO.

  Raises:
    errors.ArgumentError: any other value.
  """
  if jit_compile is None:
    return AUTO
  if isinstance(jit_compile, (bool, np.bool_)):
    return XLA if jit_compile else GRAPH
  if isinstance(jit_compile, str) and jit_compile == ELEMENTWISE:
    return ELEMENTWISE
  raise errors.ArgumentError(
      "jit_compile", f"jit_compile must be True, False, {ELEMENTWISE!r} or "
      f"None, got {jit_compile!r}")


def check_concrete(path: str) -> str:
  """Returns `path` if a Generator can run it.

  Raises:
    ValueError: not one of CONCRETE.
  """
  if path not in CONCRETE:
    raise ValueError(f"path must be one of {CONCRETE}, got {path!r}")
  return path


def jit_compile_of(path: str):
  """The `jit_compile` value that names a concrete path (the inverse mapping)."""
  return {XLA: True, GRAPH: False, ELEMENTWISE: ELEMENTWISE}[check_concrete(path)]
