"""Multi-device generation with tf.distribute: two logical CPU devices, and two
worker processes on localhost.

Logical devices and a worker's cluster must be set before TensorFlow starts,
so each check runs in fresh interpreters. Every path runs with the model
loaded outside the strategy's scope (the ordinary way) and inside it; greedy
text is checked against a real Keras greedy loop, sampled text against the
single-device text.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from tests.support.cli import write_model

# Quick tier (-m "not slow") leaves this file out: two-replica strategies and
# worker processes.
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import rnnstep
    from tests.support import keras_reference as kr
    layers = [kr.layer("gru", 24), kr.layer("lstm", 16)]
    keras_model = kr.build(layers, seed=1)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    outside = kr.rnnstep_model(keras_model, layers)
    with strategy.scope():
      inside = kr.rnnstep_model(keras_model, layers)
    prompts = ["HELLO", "A", "BCD", "XYZW", "Q"]   # odd: the last replica is padded
    keras_greedy = [outside.decode(kr.greedy(keras_model, outside.encode(p), 40))
                    for p in prompts]
    runs = (dict(temperature=0.0), dict(seed=3, top_k=8, typical_p=0.9),
            dict(seed=3, stop=["E", "A"]))
    # One device's text, on the graph path: every path gives it (README
    # "Reproducibility"), so each path's two-replica run is compared with it
    # rather than with the same path on one device (a program less each).
    one_device = {}
    beams = dict(num_beams=3, num_return_sequences=2)
    penalties = dict(seed=3, min_p=0.05, repetition_penalty=1.3,
                     repetition_window=8, no_repeat_ngram_size=3,
                     return_scores=True)
    window = dict(seed=3, top_k=8, window=4)
    regex = dict(seed=3, regex=["[A-Z]+", None, "([A-Z]+ )+[.]", "[A-H]+[.]",
                                "[A-Z]+"])
    DECODING_RUNS = {False: (beams, penalties, regex),
                     True: (penalties, window, beams),
                     "elementwise": (window, regex)}
    INITIAL_STATE_RUNS = {False: (dict(seed=3),), True: (dict(num_beams=3),),
                          "elementwise": (dict(seed=3), dict(num_beams=3))}

    def alone(**kwargs):
      key = repr(sorted(kwargs.items()))
      if key not in one_device:
        one_device[key] = rnnstep.generate(outside, prompts, 40,
                                           jit_compile=False, **kwargs)
      return one_device[key]
    for name, model in (("outside", outside), ("inside", inside)):
      # Every concrete path; `jit_compile=None` only picks one of them (its
      # rule is tests/test_paths.py's, and the matrix runs the default path
      # under a strategy).
      for jit in (False, True, "elementwise"):
        # Mirrored variables (the model made in the scope) on every path
        # with one sampled run; every run with the model made outside.
        for kwargs in runs if name == "outside" else runs[1:2]:
          one = alone(**kwargs)
          two = rnnstep.generate(model, prompts, 40, jit_compile=jit,
                                 strategy=strategy, **kwargs)
          assert one == two, (name, jit, kwargs, one, two)
          if "stop" not in kwargs:
            assert [len(t) for t in two] == [40] * 5, (name, jit, two)
          if kwargs.get("temperature") == 0.0:
            assert two == keras_greedy, (name, jit, two, keras_greedy)
        if name == "outside":
          # The decoding strategies split over replicas too, each on two of
          # the paths in turn (each path's own decoding is tests/test_paths'
          # and the decoding tests'; the split is the same on every path).
          for kwargs in DECODING_RUNS[jit]:
            one = alone(**kwargs)
            two = rnnstep.generate(model, prompts, 40, jit_compile=jit,
                                   strategy=strategy, **kwargs)
            if kwargs.get("return_scores"):  # Scores to float32 rounding.
              (one, one_scores), (two, two_scores) = one, two
              assert all(abs(a - b) <= 1e-4 * max(1, abs(a))
                         for a, b in zip(one_scores, two_scores)), (
                             one_scores, two_scores)
            assert one == two, (jit, kwargs, one, two)
          # One state per row, split over the replicas with its row.
          state = [{k: v[:, -1] for k, v in layer.items()} for layer in
                   rnnstep.hidden_states(outside, ["AB", "C", "DEF", "G", "HI"])]
          for kwargs in INITIAL_STATE_RUNS[jit]:
            one = alone(initial_state=state, **kwargs)
            two = rnnstep.generate(model, prompts, 40, jit_compile=jit,
                                   strategy=strategy, initial_state=state,
                                   **kwargs)
            assert one == two, ("initial_state", jit, kwargs, one, two)
    # Models run over their whole window at each token (engine/recompute.py),
    # whose carried state is the window's ids: TensorFlow in Practice's
    # Bidirectional word model and textgenrnn's attention model, split over
    # the replicas (graph path; tests/test_recompute.py sweeps the paths).
    words = rnnstep.load("tests/data/tfip_words/bidi.h5",
                         vocab="tests/data/tfip_words/tokenizer.json")
    chars = rnnstep.load(
        "tests/data/textgenrnn/textgenrnn/textgenrnn_weights.hdf5")
    for model, prompts in ((words, ["thy", "but his", "from fairest", "we",
                                    "the rose"]),
                           (chars, ["th", "a", "i w", "", "so"])):
      for kwargs in (dict(temperature=0.0), dict(seed=5, top_k=8)):
        one = rnnstep.generate(model, prompts, 12, jit_compile=False, **kwargs)
        two = rnnstep.generate(model, prompts, 12, jit_compile=False,
                               strategy=strategy, **kwargs)
        assert one == two, ("recomputed", kwargs, one, two)
    print("replicas", strategy.num_replicas_in_sync, "ok")
""")


# One worker of a MultiWorkerMirroredStrategy (TF_CONFIG names its task); both
# run this. Collectives time out, so a worker whose peer died exits by itself.
WORKER = textwrap.dedent("""
    import json, os, sys
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=60))
    import rnnstep
    path = sys.argv[1]
    single = rnnstep.load(path)
    with strategy.scope():
      model = rnnstep.load(path)
    prompts = ["HELLO", "A", "BCD", "XYZW", "Q"]  # odd: a replica is padded
    runs = [(False, dict(temperature=0.0)), (False, dict(seed=3, top_k=8)),
            (False, dict(seed=3, stop=["E", "A"])),
            (True, dict(temperature=0.0)), (True, dict(seed=4, top_p=0.9)),
            ("elementwise", dict(seed=3, stop=["E", "A"]))]
    texts = []
    for jit, kwargs in runs:
      two = rnnstep.generate(model, prompts, 40, jit_compile=jit,
                             strategy=strategy, **kwargs)
      one = rnnstep.generate(single, prompts, 40, jit_compile=jit, **kwargs)
      assert one == two, (jit, kwargs, one, two)
      texts.append(two)
    # A model loaded outside the scope, on every path.
    for jit in (False, True, "elementwise"):
      unscoped = rnnstep.generate(single, prompts, 40, jit_compile=jit, seed=3,
                                  strategy=strategy)
      assert unscoped == rnnstep.generate(single, prompts, 40, jit_compile=jit,
                                          seed=3), (jit, unscoped)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(json.dumps({"replicas": strategy.num_replicas_in_sync, "task": task,
                      "texts": texts}))
""")


def free_ports(count):
  """`count` ports free on 127.0.0.1 now (bound then released)."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


@pytest.mark.exhaustive
class DistributeTest(tf.test.TestCase):

  def test_two_replicas_equal_one_device_on_every_path_and_scope(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True,
                            text=True, timeout=600, cwd=root,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("replicas 2 ok", result.stdout)

  def test_two_workers_each_get_every_row_equal_to_one_device(self):
    """MultiWorkerMirroredStrategy, two worker processes over loopback.

    Every path with the model loaded under strategy.scope() and outside it.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(self.create_tempdir().full_path, "model.npz")
    write_model(path)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    workers = []
    try:
      for index in range(2):
        config = {"cluster": cluster,
                  "task": {"type": "worker", "index": index}}
        workers.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, path], cwd=root, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "TF_CONFIG": json.dumps(config),
                 "TF_CPP_MIN_LOG_LEVEL": "3"}))
      deadline = time.monotonic() + 300
      outputs = [w.communicate(timeout=max(deadline - time.monotonic(), 1))
                 for w in workers]
    finally:
      for worker in workers:  # Only after a failure: they exit by themselves.
        if worker.poll() is None:
          worker.kill()
          worker.wait(30)
    results = []
    for worker, (stdout, stderr) in zip(workers, outputs):
      self.assertEqual(worker.returncode, 0, stderr[-3000:])
      results.append(json.loads(stdout.strip().splitlines()[-1]))
    self.assertEqual([r["task"] for r in results], [0, 1])
    self.assertEqual([r["replicas"] for r in results], [2, 2])
    self.assertEqual(results[0]["texts"], results[1]["texts"])
    for texts in results[0]["texts"]:
      self.assertLen(texts, 5)


if __name__ == "__main__":
  tf.test.main()
