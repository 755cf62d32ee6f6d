"""The graph path's host calls skip Grappler (`rnnstep/model/graph_calls.py`);
the other paths, traced calls and other threads keep TensorFlow's options.
That the texts are the same either way is every graph-path test's check
(the suite pins the graph path) and tools/bench/grappler.py's."""

import threading

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

import rnnstep
from rnnstep.model import graph_calls
from tests.support import cli


def _meta_optimizer_off() -> bool:
  config = config_pb2.ConfigProto()
  config.ParseFromString(
      context.context().function_call_options.config_proto_serialized)
  return config.graph_options.rewrite_options.disable_meta_optimizer


def test_the_thread_s_eager_calls_skip_grappler_and_keep_the_rest():
  before = context.context().function_call_options
  kept = config_pb2.ConfigProto()
  kept.ParseFromString(before.config_proto_serialized)
  seen_elsewhere = []
  with graph_calls.without_grappler():
    assert _meta_optimizer_off()
    inside = config_pb2.ConfigProto()
    inside.ParseFromString(
        context.context().function_call_options.config_proto_serialized)
    kept.graph_options.rewrite_options.disable_meta_optimizer = True
    assert inside == kept  # The user's other settings stay.
    other = threading.Thread(
        target=lambda: seen_elsewhere.append(_meta_optimizer_off()))
    other.start()
    other.join()

    @tf.function(autograph=False)
    def traced():
      # While tracing (an export's graph), the options are the caller's.
      with graph_calls.without_grappler():
        seen_elsewhere.append(_meta_optimizer_off())
      return tf.constant(0)

    context.context().function_call_options = before
    traced.get_concrete_function()
  assert seen_elsewhere == [False, False]
  assert context.context().function_call_options is before


@pytest.mark.parametrize("jit_compile, skips", [
    (False, True), ("elementwise", False), (True, False)])
def test_only_the_graph_path_calls_skip_grappler(jit_compile, skips,
                                                 tmp_path, monkeypatch):
  weights = str(tmp_path / "tiny.npz")
  cli.write_model(weights)
  model = rnnstep.load(weights)
  entered = []
  real = graph_calls.without_grappler

  def counted():
    entered.append(True)
    return real()

  monkeypatch.setattr(graph_calls, "without_grappler", counted)
  rnnstep.generate(model, "AB", 3, seed=1, jit_compile=jit_compile)
  assert bool(entered) == skips
  entered.clear()
  rnnstep.loglikelihood(model, [("A", "B")], jit_compile=False)
  assert entered  # Scoring on the graph path too.
