"""The model: a model file's tensors, the recurrent cells, the network.

The first layer of the pipeline (weights file -> model -> cell step ->
generation loop -> decoding -> front ends). It imports no decoding and no
engine; `model_file` and `kinds` import no TensorFlow, so that the converters
and the command lines can read a file before TensorFlow loads.

  kinds        the cell kinds' tables: gate layouts, tensor names and shapes
  cells        one step of each kind (the gate math, as Keras computes it)
  rwkv7        RWKV-7's stack of blocks as one cell (its WKV math)
  network      `Model`: the raw tensors and the step of the whole stack;
               `make_cell`, a layer's cell by its kind
  head         the head's Dense activations and textgenrnn's attention
  check        `check_model`: a `model` argument is a `Model`, or an error
               saying how to make one of what was given
  functions    a model's compiled whole-sequence functions: scores, every
               position's states, the final state
  graph_calls  host calls of the graph functions, made without Grappler
  model_file   the .npz model file: its format, reader and writer
  chat_template  a model's chat format: messages to a prompt, the end of a
               reply (TensorFlow-free; `jinja2` for a Jinja template)
  reduced_weights  weights stored in fewer bits (`weights_dtype`: float16,
               bfloat16, int8): their rounding and storage (numpy only)
  sixteen_bit  RWKV-7's 16-bit matrices, read as 16 bits: widened inside
               each product, fenced against XLA's hoisting and fusion
"""
