"""Host calls of rnnstep's TensorFlow graph functions, made without Grappler.

The first time a process calls a function, TensorFlow optimizes its graph
with Grappler, its graph optimizer. rnnstep's graph functions are
hand-written loops whose matmuls TensorFlow hands to oneDNN without
Grappler's help. On a CPU (one Zen 4, `tools/bench/grappler.py`;
benchmarks/results/grappler-epyc-zen4-2026-12.md) their first call was a
fifth to a quarter shorter without it (the 0.1B RWKV-7's 6.9 s -> 5.1 s,
the bundled GRU's 1.04 -> 0.84 s), while their steps ran no slower (0.92-1.01x
at 1 to 64 rows) and gave the same text.

So a call on the graph path (`Programs.call`, a `BoundFunction` of a graph
function) runs under `without_grappler()`. The other paths keep TensorFlow's
default: XLA optimizes its own programs, and the elementwise path's one-row
steps ran 8% slower without Grappler. So does a call made while tracing
(an export's graph keeps TensorFlow's call options) and a process that sees
a GPU (not measured there).
"""

import contextlib
import functools

import tensorflow as tf
# The per-thread options of function calls (TensorFlow's own
# `function_executor_type` sets them the same way); no public spelling.
from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

# False: every call keeps TensorFlow's default (tools/bench/grappler.py
# measures against it).
ENABLED = True


@functools.lru_cache(maxsize=8)
def _without_meta_optimizer(executor_type, config_serialized: bytes):
  config = config_pb2.ConfigProto()
  config.ParseFromString(config_serialized)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return context.FunctionCallOptions(executor_type=executor_type,
                                     config_proto=config)


@functools.lru_cache(maxsize=1)
def _sees_a_gpu() -> bool:
  return bool(tf.config.list_logical_devices("GPU"))


@contextlib.contextmanager
def without_grappler():
  """This thread's eager function calls in the body skip Grappler; the rest
  of the thread's call options (the user's config) are kept."""
  if not ENABLED or not tf.executing_eagerly() or _sees_a_gpu():
    yield
    return
  ctx = context.context()
  saved = ctx.function_call_options
  ctx.function_call_options = _without_meta_optimizer(
      saved.executor_type, saved.config_proto_serialized)
  try:
    yield
  finally:
    ctx.function_call_options = saved
