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
"""
