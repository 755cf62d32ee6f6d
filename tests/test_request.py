"""The request type and its builder: buckets, padding, and XLA compile counts."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from rnnstep.decoding import sampling
from rnnstep.decoding import stopping
from rnnstep.engine import request as request_lib


def _build(batch, width, num_steps, bucket_shapes, **settings):
  ids = np.arange(batch * width, dtype=np.int32).reshape(batch, width) % 7
  lengths = np.full([batch], width, np.int32)
  options = request_lib.Options(
      sampling=sampling.DEFAULTS._replace(**settings))
  return request_lib.build(
      request_lib.Prompts(ids, lengths), num_steps, options,
      seeds=request_lib.Seeds(np.arange(batch, dtype=np.int64),
                              np.zeros([batch], np.int32)),
      stops=stopping.stop_automaton([[1, 2]], 7),
      bucket_shapes=bucket_shapes, state_sizes=[(8,), (4, 4)])


class BucketTest(tf.test.TestCase):

  def test_bucket(self):
    for n in [1, 15, 16, 17, 100, 1000, 1001, 200000]:
      b = request_lib.bucket(n)
      self.assertGreaterEqual(b, n)
      self.assertLessEqual(b, max(16, n * 1.25 + 1))

  def test_batch_bucket_has_seven_values_up_to_64(self):
    buckets = {request_lib.batch_bucket(n) for n in range(1, 65)}
    self.assertEqual(buckets, {1, 2, 4, 8, 16, 32, 64})
    for n in range(1, 1000):
      b = request_lib.batch_bucket(n)
      self.assertGreaterEqual(b, n)
      self.assertLessEqual(b, max(2 * n, n * 1.25 + 1) if n <= 64 else n * 1.25 + 1)

  def test_tensor_buckets_equal_python_buckets(self):
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100, 1000, 1001, 2**20 + 3]:
      self.assertEqual(int(request_lib._bucket_tensor(n, 16)),  # pylint: disable=protected-access
                       request_lib.bucket(n, 16), n)
      self.assertEqual(int(request_lib._bucket_tensor(n, 8)),  # pylint: disable=protected-access
                       request_lib.bucket(n, 8), n)
      if n:
        self.assertEqual(int(request_lib._batch_bucket_tensor(n)),  # pylint: disable=protected-access
                         request_lib.batch_bucket(n), n)

  def test_chunked_width_is_a_power_of_two_and_a_multiple_of_the_chunk(self):
    for n in [0, 1, 15, 16, 17, 33, 63, 64, 65, 300, 512, 513, 1500, 70000]:
      width = request_lib.chunked_width(n)
      self.assertGreaterEqual(width, max(n, request_lib.MIN_WIDTH))
      self.assertLess(width, max(2 * n, request_lib.MIN_WIDTH + 1))
      self.assertEqual(width & (width - 1), 0, n)
      if width >= request_lib.PRIME_CHUNK:
        self.assertEqual(width % request_lib.PRIME_CHUNK, 0, n)
      self.assertEqual(int(request_lib._chunked_width_tensor(n)),  # pylint: disable=protected-access
                       width, n)
    # One width (one XLA program) for every prompt from 257 to 512 columns.
    self.assertEqual({request_lib.chunked_width(n) for n in range(257, 513)},
                     {512})

  def test_chunked_prompts_pad_the_width_to_chunked_width(self):
    for chunked, width in ((False, request_lib.bucket(300)),
                           (True, request_lib.chunked_width(300))):
      ids = np.ones([1, 300], np.int32)
      request = request_lib.build(
          request_lib.Prompts(ids, np.array([300], np.int32)), 4,
          request_lib.Options(), seeds=request_lib.Seeds(
              np.zeros([1], np.int64), np.zeros([1], np.int32)),
          stops=stopping.stop_automaton([[1, 2]], 7), bucket_shapes=True,
          state_sizes=[(8,)], chunked_prompts=chunked)
      self.assertEqual(request.prompts.ids.shape, (1, width))


class BuildTest(tf.test.TestCase):

  def test_shapes_and_padding(self):
    request = _build(3, 5, 20, bucket_shapes=True, temperature=0.5)
    self.assertEqual(request.prompts.ids.shape, (4, request_lib.MIN_WIDTH))
    # At least MIN_CAPACITY: short requests share one XLA program.
    self.assertEqual(int(request.capacity), request_lib.MIN_CAPACITY)
    self.assertEqual(int(_build(3, 5, 100, bucket_shapes=True).capacity),
                     request_lib.bucket(100))
    # The stop automaton's states padded to a bucket by unreachable states
    # that never accept.
    stops = stopping.stop_automaton([[1, 2]], 7)
    states = len(stops.accept)
    self.assertEqual(request.stops.table.shape, (request_lib.bucket(states, 16), 7))
    self.assertAllEqual(request.stops.table[:states], stops.table)
    self.assertAllEqual(request.stops.accept[:states], stops.accept)
    self.assertFalse(np.any(request.stops.accept[states:]))
    self.assertLess(int(np.max(stops.table)), states)  # Nothing leads there.
    self.assertEqual(
        _build(3, 5, 20, bucket_shapes=False).stops.table.shape[0], states)
    self.assertEqual(int(request.num_steps), 20)
    # The padding row is a copy of row 0, in every per-row field.
    for tensor in tf.nest.flatten((request.prompts, request.sampling,
                                   request.seeds)):
      self.assertAllEqual(tensor[3], tensor[0])
    self.assertAllEqual(request.sampling.temperature, [0.5] * 4)
    self.assertAllEqual(request.prompts.ids[:, 5:],
                        np.zeros([4, request_lib.MIN_WIDTH - 5]))
    unpadded = _build(3, 5, 20, bucket_shapes=False)
    self.assertEqual(unpadded.prompts.ids.shape, (3, 5))
    self.assertEqual(int(unpadded.capacity), int(request.capacity))

  def test_in_graph_equals_eager(self):
    eager = _build(5, 3, 40, bucket_shapes=True, top_k=3)

    @tf.function(autograph=False)
    def traced(ids, lengths, num_steps):
      return request_lib.build(
          request_lib.Prompts(ids, lengths), num_steps, request_lib.Options(
              sampling=sampling.DEFAULTS._replace(top_k=3)),
          seeds=request_lib.Seeds(tf.range(5, dtype=tf.int64),
                                  tf.zeros([5], tf.int32)),
          stops=stopping.stop_automaton([[1, 2]], 7), bucket_shapes=True,
          state_sizes=[(8,), (4, 4)])

    graph = traced(eager.prompts.ids[:5, :3], eager.prompts.lengths[:5],
                   tf.constant(40))
    for a, b in zip(tf.nest.flatten(eager), tf.nest.flatten(graph)):
      self.assertAllEqual(a, b)

  def test_per_row_settings_are_kept(self):
    request = _build(3, 2, 4, bucket_shapes=False, top_p=[0.5, 0.9, 1.0])
    self.assertAllClose(request.sampling.top_p, [0.5, 0.9, 1.0])


# Counts the XLA compilations of the generation function while sweeping batch
# sizes, from XLA's own module dumps (one module per compilation).
COMPILE_SCRIPT = textwrap.dedent("""
    import glob, json, os, sys
    dump = sys.argv[1]
    import rnnstep
    from tests.support import keras_reference as kr
    layers = [kr.layer("gru", 16)]
    model = kr.rnnstep_model(kr.build(layers, seed=1), layers)

    def compiled():
      names = glob.glob(os.path.join(dump, "*generate_impl*"))
      return len({os.path.basename(n).split(".")[0] for n in names})

    counts = {}
    for batch in list(range(1, 65)) + [40, 37, 35, 12, 11, 10]:
      rnnstep.generate(model, ["AB"] * batch, 4, seed=1, jit_compile=True)
      counts[batch] = compiled()
    print(json.dumps(counts))
""")


# Every batch size 1-64 under XLA, in a fresh interpreter: a sweep, so in
# the exhaustive tier. By default BucketTest checks the seven buckets and
# tests/test_jobs.py's short last batch that XLA reuses a bucket's program.
@pytest.mark.slow
@pytest.mark.exhaustive
class CompileCountTest(tf.test.TestCase):

  def test_xla_batch_sweep_compiles_at_most_seven_programs(self):
    dump = self.create_tempdir().full_path
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT, dump], capture_output=True,
        text=True, timeout=600, cwd=root,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
             "XLA_FLAGS": f"--xla_dump_to={dump} "
                          "--xla_dump_hlo_module_re=.*generate_impl.*"})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    counts = {int(k): v for k, v in
              json.loads(result.stdout.strip().splitlines()[-1]).items()}
    self.assertLessEqual(counts[64], 7)
    self.assertGreaterEqual(counts[1], 1)  # The dump does count compilations.
    # Batch sizes within an already compiled bucket compile nothing new.
    self.assertEqual(counts[10], counts[64])
    for low, high in ((33, 64), (17, 32), (9, 16), (5, 8)):
      self.assertEqual(counts[high], counts[low], (low, high))


if __name__ == "__main__":
  tf.test.main()
