"""Small real Keras models saved in every format rnnstep-convert reads (tests only).

Each builder takes the Keras module to use: Keras 3 (`import keras`, in the test
process) or tf_keras 2.x (in a subprocess with TF_USE_LEGACY_KERAS=1, run as
`python -m tests.support.keras_models tf_keras OUT_DIR`). Every case saves its model in
one or more formats, plus a reference computed by the model that was saved:
Keras logits on fixed ids and Keras greedy text after PROMPT.

A case is a dict: {"files": {format: path}, "ref": path of an .npz with `ids`,
`logits`, `greedy`, "unk": whether id 0 is [UNK]}.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

# The 65 distinct characters of tinyshakespeare, sorted (the tutorial's vocab).
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
V = len(CHARS)          # 65
V_UNK = V + 1           # 66: StringLookup(mask_token=None) adds [UNK] at id 0
PROMPT = "ROMEO:"
GREEDY_STEPS = 100


def same_tensors(a, b) -> bool:
  """Whether two {name: array} dicts hold the same names and, bit for bit,
  the same arrays (a format converted to what a checked one gave is exact
  as that one is: tests/test_convert.py, tests/test_convert_recipes.py)."""
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def vocab(unk: bool):
  return (["[UNK]"] if unk else []) + list(CHARS)


# ------------------------------------------------------------------ building


def recurrent(keras, kind, units, **kwargs):
  cls = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM,
         "simple_rnn": keras.layers.SimpleRNN}[kind]
  return cls(units, return_sequences=True, **kwargs)


def sequential(keras, specs, vocab_size=V, dim=8, batch=None, stateful=False,
               input_layer=True):
  """Embedding -> recurrent specs [(kind, units, kwargs)] -> Dense, Sequential."""
  layers = []
  if input_layer and batch is None:
    layers.append(keras.Input((None,), dtype="int32"))
  if batch is not None:  # The 2019-20 tutorial: a fixed batch for stateful GRUs.
    layers.append(keras.layers.Embedding(vocab_size, dim,
                                         batch_input_shape=[batch, None]))
  else:
    layers.append(keras.layers.Embedding(vocab_size, dim))
  for kind, units, kwargs in specs:
    layers.append(recurrent(keras, kind, units, stateful=stateful, **kwargs))
  layers.append(keras.layers.Dense(vocab_size))
  model = keras.Sequential(layers)
  if not input_layer:
    model.build((batch, None))
  return model


def randomize(model, seed):
  """Random weights with enough spread that greedy decoding has no near-ties."""
  rng = np.random.default_rng(seed)
  weights = []
  for w in model.get_weights():
    if w.ndim == 2 and w.shape[0] > 2:
      weights.append(rng.normal(0, 1.5 / np.sqrt(w.shape[0]), w.shape))
    else:
      weights.append(rng.normal(0, 0.4, w.shape))
  model.set_weights([w.astype(np.float32) for w in weights])


def fit_briefly(keras, model, vocab_size, epochs=1, callbacks=(), batch=4):
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  rng = np.random.default_rng(7)
  x = rng.integers(0, vocab_size, (2 * batch, 12)).astype(np.int32)
  y = rng.integers(0, vocab_size, (2 * batch, 12)).astype(np.int32)
  model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0,
            callbacks=list(callbacks), shuffle=False)


# ---------------------------------------------------------------- reference


def forward_fn(model, output_index=None):
  def call(x):
    out = model(x, training=False)
    return out[output_index] if output_index is not None else out
  return tf.function(call, input_signature=[tf.TensorSpec([None, None], tf.int32)])


def greedy_rerun(forward, prompt_ids, steps, banned):
  """Keras greedy decoding by re-running the model on the whole sequence."""
  ids = list(prompt_ids)
  for _ in range(steps):
    logits = forward(np.array([ids], np.int32)).numpy()[0, -1]
    logits[list(banned)] = -np.inf
    ids.append(int(np.argmax(logits)))
  return ids[len(prompt_ids):]


def save_reference(path, forward, unk, greedy_ids=None, seed=0):
  """Writes ids, Keras logits and Keras greedy text for one saved model."""
  chars = vocab(unk)
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, len(chars), (2, 40)).astype(np.int32)
  logits = np.asarray(forward(ids))
  if greedy_ids is None:
    prompt = [chars.index(c) for c in PROMPT]
    greedy_ids = greedy_rerun(forward, prompt, GREEDY_STEPS, [0] if unk else [])
  text = "".join(chars[i] for i in greedy_ids)
  np.savez(path, ids=ids, logits=logits, greedy=np.array(text))
  return path


def case(files, ref, unk=False):
  return {"files": files, "ref": ref, "unk": unk}


# ----------------------------------------------------------- Keras 3 (in process)


def keras3_cases(keras, out):
  """Writes every Keras 3 case under `out`; returns {name: case}."""
  cases = {}

  def path(name):
    return os.path.join(out, name)

  def all_formats(model, name, checkpoint=True, legacy=True):
    files = {"keras": path(f"{name}.keras"),
             "weights_h5": path(f"{name}.weights.h5")}
    model.save(files["keras"])
    model.save_weights(files["weights_h5"])
    if legacy:
      files["legacy_h5"] = path(f"{name}.h5")
      model.save(files["legacy_h5"])
    if checkpoint:
      files["tf_checkpoint"] = path(f"{name}_ckpt/ckpt")
      tf.train.Checkpoint(model=model).write(files["tf_checkpoint"])
    return files

  # Sequential GRU, compiled and trained (optimizer state in every file).
  model = sequential(keras, [("gru", 16, {})])
  randomize(model, 1)
  fit_briefly(keras, model, V)
  files = all_formats(model, "k3_seq_gru")
  files["keras_dir"] = path("k3_seq_gru_unzipped")
  keras.saving.save_model(model, files["keras_dir"], zipped=False)
  cases["k3_seq_gru"] = case(files, save_reference(
      path("k3_seq_gru.ref.npz"), forward_fn(model), False))

  # Functional LSTM -> Dropout -> GRU(reset_after=False), Dense without bias,
  # two outputs (logits and the GRU state).
  inputs = keras.Input((None,), dtype="int32", name="ids")
  x = keras.layers.Embedding(V, 12)(inputs)
  x = keras.layers.LSTM(24, return_sequences=True)(x)
  x = keras.layers.Dropout(0.3)(x)
  x, state = keras.layers.GRU(16, return_sequences=True, return_state=True,
                              reset_after=False)(x)
  logits = keras.layers.Dense(V, use_bias=False)(x)
  model = keras.Model(inputs, [logits, state])
  randomize(model, 2)
  cases["k3_fun_lstm_gru"] = case(
      all_formats(model, "k3_fun_lstm_gru"),
      save_reference(path("k3_fun_lstm_gru.ref.npz"), forward_fn(model, 0), False))

  for name, specs, dim, seed in (
      ("k3_seq_lstm", [("lstm", 16, {})], 8, 3),
      ("k3_seq_simple_rnn", [("simple_rnn", 16, {})], 8, 4),
      ("k3_seq_simple_rnn_relu", [("simple_rnn", 16, {"activation": "relu"})],
       8, 4),
      ("k3_seq_gru2", [("gru", 16, {}), ("gru", 16, {})], 16, 5)):
    model = sequential(keras, specs, dim=dim)
    randomize(model, seed)
    files = {"keras": path(f"{name}.keras")}
    model.save(files["keras"])
    if name == "k3_seq_gru2":  # Same shapes: the order is in the paths' suffixes.
      files["weights_h5"] = path(f"{name}.weights.h5")
      model.save_weights(files["weights_h5"])
    cases[name] = case(files, save_reference(path(f"{name}.ref.npz"),
                                             forward_fn(model), False))

  # The current TF tutorial's subclassed model ([UNK] at id 0), trained.
  model = tutorial_model(keras, keras3=True)
  model(np.zeros((1, 4), np.int32))
  randomize(model, 6)
  fit_briefly(keras, model, V_UNK)
  cases["k3_sub_tutorial"] = case(
      all_formats(model, "k3_sub_tutorial", legacy=False),
      save_reference(path("k3_sub_tutorial.ref.npz"), forward_fn(model), True),
      unk=True)

  # Subclassed stack whose attribute names sort against the call order: only
  # the shapes tell that the LSTM comes first.
  model = subclassed_stack(keras)
  model(np.zeros((1, 4), np.int32))
  randomize(model, 8)
  files = {"keras": path("k3_sub_stack.keras")}
  model.save(files["keras"])
  cases["k3_sub_stack"] = case(files, save_reference(
      path("k3_sub_stack.ref.npz"), forward_fn(model), False))
  return cases


def tutorial_model(keras, keras3, **sizes):
  """The current TF text-generation tutorial's MyModel (66 = [UNK] + 65).

  `sizes` (vocab_size, embedding_dim, rnn_units) override the small defaults
  (tools/benchmark.py builds the tutorial's full size with them).
  """

  class MyModel(keras.Model):

    def __init__(self, vocab_size=V_UNK, embedding_dim=8, rnn_units=16, **kw):
      super().__init__(**kw)
      self.embedding = keras.layers.Embedding(vocab_size, embedding_dim)
      self.gru = keras.layers.GRU(rnn_units, return_sequences=True,
                                  return_state=True)
      self.dense = keras.layers.Dense(vocab_size)

    def call(self, inputs, states=None, return_state=False, training=False):
      x = self.embedding(inputs, training=training)
      if states is None and not keras3:
        states = self.gru.get_initial_state(x)
      x, states = self.gru(x, initial_state=states, training=training)
      x = self.dense(x, training=training)
      return (x, states) if return_state else x

    def get_config(self):
      return {}

  return MyModel(**sizes)


def subclassed_stack(keras):

  class Stack(keras.Model):

    def __init__(self, **kw):
      super().__init__(**kw)
      self.embedding = keras.layers.Embedding(V, 8)
      self.z_first = keras.layers.LSTM(24, return_sequences=True)
      self.a_second = keras.layers.GRU(16, return_sequences=True,
                                       reset_after=False)
      self.dense = keras.layers.Dense(V)

    def call(self, inputs):
      return self.dense(self.a_second(self.z_first(self.embedding(inputs))))

    def get_config(self):
      return {}

  return Stack()


# ------------------------------------------------------ tf_keras (a subprocess)


def tf_keras_cases(keras, out):
  """Writes every tf_keras 2.x case under `out`; returns {name: case}."""
  cases = {}

  def path(name):
    return os.path.join(out, name)

  for name, specs, dim, seed, formats in (
      ("k2_seq_gru", [("gru", 16, {})], 8, 11, ("w_h5", "m_h5", "keras")),
      ("k2_seq_lstm_gru", [("lstm", 24, {}), ("gru", 16, {"reset_after": False})],
       12, 12, ("m_h5", "w_h5")),
      ("k2_seq_gru2", [("gru", 16, {}), ("gru", 16, {})], 16, 13,
       ("m_h5", "w_h5")),
      ("k2_seq_lstm", [("lstm", 16, {"use_bias": False})], 8, 14, ("m_h5",)),
      ("k2_seq_simple_rnn", [("simple_rnn", 16, {})], 8, 15, ("m_h5",))):
    model = sequential(keras, specs, dim=dim, input_layer=False)
    randomize(model, seed)
    files = {}
    if "w_h5" in formats:
      files["w_h5"] = path(f"{name}.w.h5")
      model.save_weights(files["w_h5"])
    if "m_h5" in formats:
      files["m_h5"] = path(f"{name}.m.h5")
      model.save(files["m_h5"])
    if "keras" in formats:
      files["keras"] = path(f"{name}.keras")
      model.save(files["keras"])
    cases[name] = case(files, save_reference(path(f"{name}.ref.npz"),
                                             forward_fn(model), False))

  # Functional SimpleRNN -> GRU, full save.
  inputs = keras.Input((None,), dtype="int32")
  x = keras.layers.Embedding(V, 8)(inputs)
  x = keras.layers.SimpleRNN(12, return_sequences=True)(x)
  x = keras.layers.GRU(16, return_sequences=True)(x)
  model = keras.Model(inputs, keras.layers.Dense(V)(x))
  randomize(model, 16)
  files = {"m_h5": path("k2_fun_rnn_gru.m.h5")}
  model.save(files["m_h5"])
  cases["k2_fun_rnn_gru"] = case(files, save_reference(
      path("k2_fun_rnn_gru.ref.npz"), forward_fn(model), False))

  # The current tutorial: subclassed MyModel, ModelCheckpoint(ckpt_{epoch}).
  model = tutorial_model(keras, keras3=False)
  model(np.zeros((1, 4), np.int32))
  randomize(model, 17)
  checkpoint_dir = path("k2_tutorial_ckpts")
  callback = keras.callbacks.ModelCheckpoint(
      filepath=os.path.join(checkpoint_dir, "ckpt_{epoch}"),
      save_weights_only=True)
  fit_briefly(keras, model, V_UNK, epochs=2, callbacks=[callback])
  model.save_weights(path("k2_tutorial.w.h5"))
  forward = forward_fn(model)
  files = {"tf_checkpoint_dir": checkpoint_dir,
           "tf_checkpoint_prefix": os.path.join(checkpoint_dir, "ckpt_2"),
           "w_h5": path("k2_tutorial.w.h5")}
  cases["k2_tutorial"] = case(files, save_reference(
      path("k2_tutorial.ref.npz"), forward, True,
      greedy_ids=tutorial_greedy(model)), unk=True)

  # The 2019-20 tutorial: Sequential, stateful GRU at batch 4; generation
  # rebuilds it at batch 1 and loads the latest checkpoint.
  model = sequential(keras, [("gru", 16, {
      "recurrent_initializer": "glorot_uniform"})], batch=4, stateful=True)
  randomize(model, 18)
  checkpoint_dir = path("k2_stateful_ckpts")
  callback = keras.callbacks.ModelCheckpoint(
      filepath=os.path.join(checkpoint_dir, "ckpt_{epoch}"),
      save_weights_only=True)
  fit_briefly(keras, model, V, epochs=1, callbacks=[callback])
  one = sequential(keras, [("gru", 16, {})], batch=1, stateful=True)
  one.load_weights(tf.train.latest_checkpoint(checkpoint_dir)).expect_partial()
  one.build(tf.TensorShape([1, None]))

  def stateful_forward(ids):
    rows = []
    for row in np.asarray(ids):
      one.reset_states()
      rows.append(one(row[None, :], training=False).numpy()[0])
    return np.stack(rows)

  cases["k2_stateful"] = case({"tf_checkpoint_dir": checkpoint_dir},
                              save_reference(path("k2_stateful.ref.npz"),
                                             stateful_forward, False,
                                             greedy_ids=stateful_greedy(one)))
  return cases


def tutorial_greedy(model):
  """The tutorial's OneStep loop, greedy: one char per call, states carried."""
  chars = vocab(True)
  ids = np.array([[chars.index(c) for c in PROMPT]], np.int32)
  states = None
  out = []
  for _ in range(GREEDY_STEPS):
    logits, states = model(ids, states=states, return_state=True)
    logits = logits.numpy()[0, -1]
    logits[0] = -np.inf  # The tutorial masks [UNK].
    out.append(int(np.argmax(logits)))
    ids = np.array([[out[-1]]], np.int32)
  return out


def stateful_greedy(model):
  """The 2019-20 tutorial's loop: a stateful batch-1 model fed one char."""
  chars = vocab(False)
  model.reset_states()
  ids = np.array([[chars.index(c) for c in PROMPT]], np.int32)
  out = []
  for _ in range(GREEDY_STEPS):
    logits = model(ids, training=False).numpy()[0, -1]
    out.append(int(np.argmax(logits)))
    ids = np.array([[out[-1]]], np.int32)
  return out


def main(argv):
  which, out = argv[1], argv[2]
  os.makedirs(out, exist_ok=True)
  if which != "tf_keras":
    raise SystemExit(f"unknown builder {which!r}")
  import tf_keras  # pylint: disable=g-import-not-at-top
  cases = tf_keras_cases(tf_keras, out)
  with open(os.path.join(out, "cases.json"), "w") as f:
    json.dump(cases, f, indent=1)


if __name__ == "__main__":
  main(sys.argv)
