"""The engine: a request, planned and run as one compiled device loop.

Above the model and the decoding layers, below the front ends (`rnnstep.api`,
the exporters, inspect, the command lines).

  request       `Request`: one generation's tensors, checked once
  loop          the `tf.while_loop` that primes, steps and decodes
  window        generation over windows for models recorded with one
  beams         beam search's loop
  generator     `Generator`: a model's compiled programs, one per path
  host          the host side of a call: batching, buckets, texts out
  paths         which path (graph, xla, elementwise) runs a request
  cpu           the CPU's features (no TensorFlow)
  tuning_cache  measured defaults kept per machine (no TensorFlow)
  compiling     XLA programs compiled while the graph path runs
  xla_cache     XLA's programs kept on disk (no TensorFlow)
"""

from rnnstep.engine import xla_cache as _xla_cache

# TensorFlow reads its XLA flags once, at its first function or device
# query: the disk cache's folder must be in them before (xla_cache.py).
_xla_cache.enable()
