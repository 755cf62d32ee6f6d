"""LiteRT: the whole generation as a flatbuffer, and rnnstep-generate's warm path.

  export   `rnnstep.export_litert`: model.tflite (builtin ops) + vocab.json
           (imports TensorFlow: its converter writes the flatbuffer)
  inputs   the export's inputs, declared once and built with numpy
  runner   runs a flatbuffer with the ai_edge_litert interpreter
  cache    the compiled-artifact cache: one flatbuffer per model, keyed
  fill     the cache's background child, which builds an entry
  warm     the warm path: a generation's arguments to texts from the cached
           flatbuffer, or the reason it cannot serve them

Only `export` imports TensorFlow: a warm `rnnstep-generate` imports `warm`,
`cache`, `runner` and `inputs` from a process that never loads it. This
file imports nothing.
"""
