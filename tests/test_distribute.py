"""Multi-device generation with tf.distribute, on two logical CPU devices.

Logical devices must be configured before TensorFlow starts, so the check runs
in a fresh interpreter. Every path runs with the model loaded outside the
strategy's scope (the ordinary way) and inside it; greedy text is checked
against a real Keras greedy loop, sampled text against the single-device text.
"""

import os
import subprocess
import sys
import textwrap

import tensorflow as tf

SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import rnnstep
    from tests import keras_reference as kr
    layers = [kr.layer("gru", 24), kr.layer("lstm", 16)]
    keras_model = kr.build(layers, seed=1)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    outside = kr.rnnstep_model(keras_model, layers)
    with strategy.scope():
      inside = kr.rnnstep_model(keras_model, layers)
    prompts = ["HELLO", "A", "BCD", "XYZW", "Q"]   # odd: the last replica is padded
    keras_greedy = [outside.decode(kr.greedy(keras_model, outside.encode(p), 40))
                    for p in prompts]
    for name, model in (("outside", outside), ("inside", inside)):
      for jit in (False, True, "elementwise", None):
        for kwargs in (dict(temperature=0.0), dict(seed=3, top_k=8),
                       dict(seed=3, stop=["E", "A"])):
          one = rnnstep.generate(outside, prompts, 40, jit_compile=jit, **kwargs)
          two = rnnstep.generate(model, prompts, 40, jit_compile=jit,
                                 strategy=strategy, **kwargs)
          assert one == two, (name, jit, kwargs, one, two)
          if "stop" not in kwargs:
            assert [len(t) for t in two] == [40] * 5, (name, jit, two)
          if kwargs.get("temperature") == 0.0:
            assert two == keras_greedy, (name, jit, two, keras_greedy)
    print("replicas", strategy.num_replicas_in_sync, "ok")
""")


class DistributeTest(tf.test.TestCase):

  def test_two_replicas_equal_one_device_on_every_path_and_scope(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True,
                            text=True, timeout=600, cwd=root,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("replicas 2 ok", result.stdout)


if __name__ == "__main__":
  tf.test.main()
