"""Writes the char-rnn-tensorflow fixtures of tests/test_convert_charrnn_tf.py.

    TF_USE_LEGACY_KERAS=1 python tools/make_charrnn_tf_fixtures.py
    TF_USE_LEGACY_KERAS=1 python tools/make_charrnn_tf_fixtures.py --out=/tmp/x

(The tool sets TF_USE_LEGACY_KERAS=1 itself before TensorFlow loads: TF 2.21
keeps TF1's cells, moved verbatim into tf_keras's `legacy_cells`, under
`tf.compat.v1.nn.rnn_cell` only with the legacy Keras; tf_keras must be
installed.)

sherjilozair/char-rnn-tensorflow (HEAD 4bff62d), with its own code: `Model`
below is the recipe's `model.py`, `TextLoader` its `utils.py` (the parts
that read `input.txt`), and `train` / `sample` the parts of `train.py` and
`sample.py` that write and read a save directory. They are ported to
`tf.compat.v1` only where TF 2.21 has no `tf.contrib`; the changed lines:

  model.py
    - `import tensorflow as tf`  ->  `import tensorflow.compat.v1 as tf`
      (with `tf.disable_v2_behavior()`: graphs, sessions, placeholders as in
      TF1);
    - `from tensorflow.contrib import rnn`  ->  `rnn = tf.nn.rnn_cell`
      (`tf.contrib.rnn.LSTMCell` etc. were aliases of these classes);
    - `from tensorflow.contrib import legacy_seq2seq`  ->  the two functions
      the model uses, `rnn_decoder` and `sequence_loss_by_example`, copied
      from TF 1.15's contrib/legacy_seq2seq/python/ops/seq2seq.py below
      (`legacy_seq2seq` names the copy);
    - the cell choice is a parameter, `cell_fns`: HEAD's table (`LSTMCell`,
      `GRUCell`, and `rnn.RNNCell` for 'rnn', which is the abstract base
      class and cannot be built, so no checkpoint of HEAD's 'rnn' exists),
      or the table before commit 507a4af (May 2018: `BasicLSTMCell`,
      `BasicRNNCell`); `NASCell` has no TF 2 home and is not made.
  train.py
    - the Namespace holds train.py's argparse defaults except the tiny sizes
      (`--rnn_size=16 --num_layers=1|2 --batch_size=16 --seq_length=25
      --num_epochs=12 --learning_rate=0.01`), what those flags would give;
    - the state is fed as `feed[model.initial_state] = state` (a nested
      feed, as `Model.sample` feeds it) in place of HEAD's loop over `(c,
      h)` pairs, which works for LSTM states only;
    - no TensorBoard writer; the Saver is `Saver(tf.global_variables(),
      max_to_keep=1)` and writes no `.meta` graph (`write_meta_graph=False`),
      so that only the last checkpoint (the `checkpoint` file, `.index`,
      `.data-*`, with Adam slots, `beta1_power` / `beta2_power` and the
      learning-rate `Variable`) is committed;
    - `input.txt` (the first CORPUS_CHARS characters of tinyshakespeare)
      is written to a temporary data directory, and `save_dir` is the
      recipe's default, the relative 'save'. TF 2.21's Saver writes the
      `checkpoint` file's path relative to it (`model.ckpt-N`); TF1's wrote
      the path it was given or an absolute one, which no longer resolves
      once the directory is copied elsewhere: the tests rewrite the file so
      (tests/test_convert_charrnn_tf.py).
  sample.py
    - `Model.sample(..., sampling_type=0)` (the `--sample=0` argmax loop),
      unchanged, gives the greedy text.

Fixtures (tests/data/charrnn_tf/<name>/, rnn_size 16):

  lstm        HEAD `LSTMCell`, num_layers 2 (`cell_k/lstm_cell/{kernel,bias}`);
  basic_lstm  pre-507a4af `BasicLSTMCell`, num_layers 2 (`basic_lstm_cell/...`);
              its pickles written with protocol 0, as Python 2's cPickle did;
  gru         `GRUCell`, num_layers 2 (`gru_cell/{gates,candidate}/...`);
  rnn         pre-507a4af `BasicRNNCell`, 1 layer (`basic_rnn_cell/...`).

Each holds `reference.npz`: the recipe model's per-step logits
(`training=False`, the sampling graph, fed one character at a time with its
state, as `Model.sample` feeds it) for `LOGITS_TEXT`, and the text of
`Model.sample(sess, chars, vocab, GREEDY_STEPS, PRIME, sampling_type=0)`,
prime included.
"""

import argparse
import collections
import codecs
import os
import pickle
import shutil
import sys
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

import fixture_dir  # tools/: the --out flag the fixture scripts share

tf.disable_v2_behavior()

CORPUS = "/work/shared/data/tinyshakespeare.txt"
CORPUS_CHARS = 20_000
PRIME = "First Citizen:\n"
GREEDY_STEPS = 200
LOGITS_TEXT = "Before we proceed any further, hear me speak."
rnn = tf.nn.rnn_cell

HEAD_CELLS = {"rnn": rnn.RNNCell, "gru": rnn.GRUCell, "lstm": rnn.LSTMCell}
BEFORE_507A4AF_CELLS = {"rnn": rnn.BasicRNNCell, "gru": rnn.GRUCell,
                        "lstm": rnn.BasicLSTMCell}

# name: (args.model, cell table, num_layers, pickle protocol, epochs)
FIXTURES = {
    "lstm": ("lstm", HEAD_CELLS, 2, pickle.DEFAULT_PROTOCOL, 12),
    "basic_lstm": ("lstm", BEFORE_507A4AF_CELLS, 2, 0, 12),
    "gru": ("gru", HEAD_CELLS, 2, pickle.DEFAULT_PROTOCOL, 12),
    "rnn": ("rnn", BEFORE_507A4AF_CELLS, 1, pickle.DEFAULT_PROTOCOL, 12),
}


# ------------------------------------- TF 1.15 contrib/legacy_seq2seq (copy)
class legacy_seq2seq:  # pylint: disable=invalid-name
  """The two functions of `tf.contrib.legacy_seq2seq` that model.py uses."""

  @staticmethod
  def rnn_decoder(decoder_inputs, initial_state, cell, loop_function=None,
                  scope=None):
    with tf.variable_scope(scope or "rnn_decoder"):
      state = initial_state
      outputs = []
      prev = None
      for i, inp in enumerate(decoder_inputs):
        if loop_function is not None and prev is not None:
          with tf.variable_scope("loop_function", reuse=True):
            inp = loop_function(prev, i)
        if i > 0:
          tf.get_variable_scope().reuse_variables()
        output, state = cell(inp, state)
        outputs.append(output)
        if loop_function is not None:
          prev = output
    return outputs, state

  @staticmethod
  def sequence_loss_by_example(logits, targets, weights,
                               average_across_timesteps=True,
                               softmax_loss_function=None, name=None):
    with tf.name_scope(name, "sequence_loss_by_example",
                       logits + targets + weights):
      log_perp_list = []
      for logit, target, weight in zip(logits, targets, weights):
        if softmax_loss_function is None:
          target = tf.reshape(target, [-1])
          crossent = tf.nn.sparse_softmax_cross_entropy_with_logits(
              labels=target, logits=logit)
        else:
          crossent = softmax_loss_function(labels=target, logits=logit)
        log_perp_list.append(crossent * weight)
      log_perps = tf.add_n(log_perp_list)
      if average_across_timesteps:
        total_size = tf.add_n(weights)
        total_size += 1e-12
        log_perps /= total_size
    return log_perps


# ------------------------------------------------------ model.py (HEAD 4bff62d)
class Model():
    def __init__(self, args, training=True, cell_fns=HEAD_CELLS):
        self.args = args
        if not training:
            args.batch_size = 1
            args.seq_length = 1

        # choose different rnn cell
        if args.model in cell_fns:  # (ported: the table is a parameter)
            cell_fn = cell_fns[args.model]
        else:
            raise Exception("model type not supported: {}".format(args.model))

        # warp multi layered rnn cell into one cell with dropout
        cells = []
        for _ in range(args.num_layers):
            cell = cell_fn(args.rnn_size)
            if training and (args.output_keep_prob < 1.0 or args.input_keep_prob < 1.0):
                cell = rnn.DropoutWrapper(cell,
                                          input_keep_prob=args.input_keep_prob,
                                          output_keep_prob=args.output_keep_prob)
            cells.append(cell)
        self.cell = cell = rnn.MultiRNNCell(cells, state_is_tuple=True)

        # input/target data (int32 since input is char-level)
        self.input_data = tf.placeholder(
            tf.int32, [args.batch_size, args.seq_length])
        self.targets = tf.placeholder(
            tf.int32, [args.batch_size, args.seq_length])
        self.initial_state = cell.zero_state(args.batch_size, tf.float32)

        # softmax output layer, use softmax to classify
        with tf.variable_scope('rnnlm'):
            softmax_w = tf.get_variable("softmax_w",
                                        [args.rnn_size, args.vocab_size])
            softmax_b = tf.get_variable("softmax_b", [args.vocab_size])

        # transform input to embedding
        embedding = tf.get_variable("embedding", [args.vocab_size, args.rnn_size])
        inputs = tf.nn.embedding_lookup(embedding, self.input_data)

        # dropout beta testing: double check which one should affect next line
        if training and args.output_keep_prob:
            inputs = tf.nn.dropout(inputs, args.output_keep_prob)

        # unstack the input to fits in rnn model
        inputs = tf.split(inputs, args.seq_length, 1)
        inputs = [tf.squeeze(input_, [1]) for input_ in inputs]

        # loop function for rnn_decoder, which take the previous i-th cell's output and generate the (i+1)-th cell's input
        def loop(prev, _):
            prev = tf.matmul(prev, softmax_w) + softmax_b
            prev_symbol = tf.stop_gradient(tf.argmax(prev, 1))
            return tf.nn.embedding_lookup(embedding, prev_symbol)

        # rnn_decoder to generate the ouputs and final state. When we are not training the model, we use the loop function.
        outputs, last_state = legacy_seq2seq.rnn_decoder(inputs, self.initial_state, cell, loop_function=loop if not training else None, scope='rnnlm')
        output = tf.reshape(tf.concat(outputs, 1), [-1, args.rnn_size])

        # output layer
        self.logits = tf.matmul(output, softmax_w) + softmax_b
        self.probs = tf.nn.softmax(self.logits)

        # loss is calculate by the log loss and taking the average.
        loss = legacy_seq2seq.sequence_loss_by_example(
                [self.logits],
                [tf.reshape(self.targets, [-1])],
                [tf.ones([args.batch_size * args.seq_length])])
        with tf.name_scope('cost'):
            self.cost = tf.reduce_sum(loss) / args.batch_size / args.seq_length
        self.final_state = last_state
        self.lr = tf.Variable(0.0, trainable=False)
        tvars = tf.trainable_variables()

        # calculate gradients
        grads, _ = tf.clip_by_global_norm(tf.gradients(self.cost, tvars),
                args.grad_clip)
        with tf.name_scope('optimizer'):
            optimizer = tf.train.AdamOptimizer(self.lr)

        # apply gradient change to the all the trainable variable.
        self.train_op = optimizer.apply_gradients(zip(grads, tvars))

        # instrument tensorboard
        tf.summary.histogram('logits', self.logits)
        tf.summary.histogram('loss', loss)
        tf.summary.scalar('train_loss', self.cost)

    def sample(self, sess, chars, vocab, num=200, prime='The ', sampling_type=1):
        state = sess.run(self.cell.zero_state(1, tf.float32))
        for char in prime[:-1]:
            x = np.zeros((1, 1))
            x[0, 0] = vocab[char]
            feed = {self.input_data: x, self.initial_state: state}
            [state] = sess.run([self.final_state], feed)

        def weighted_pick(weights):
            t = np.cumsum(weights)
            s = np.sum(weights)
            return(int(np.searchsorted(t, np.random.rand(1)*s)))

        ret = prime
        char = prime[-1]
        for _ in range(num):
            x = np.zeros((1, 1))
            x[0, 0] = vocab[char]
            feed = {self.input_data: x, self.initial_state: state}
            [probs, state] = sess.run([self.probs, self.final_state], feed)
            p = probs[0]

            if sampling_type == 0:
                sample = np.argmax(p)
            elif sampling_type == 2:
                if char == ' ':
                    sample = weighted_pick(p)
                else:
                    sample = np.argmax(p)
            else:  # sampling_type == 1 default:
                sample = weighted_pick(p)

            pred = chars[sample]
            ret += pred
            char = pred
        return ret


# ---------------------------------------------- utils.py (HEAD, the reading part)
class TextLoader():
    def __init__(self, data_dir, batch_size, seq_length, encoding='utf-8'):
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.encoding = encoding
        input_file = os.path.join(data_dir, "input.txt")
        with codecs.open(input_file, "r", encoding=self.encoding) as f:
            data = f.read()
        counter = collections.Counter(data)
        count_pairs = sorted(counter.items(), key=lambda x: -x[1])
        self.chars, _ = zip(*count_pairs)
        self.vocab_size = len(self.chars)
        self.vocab = dict(zip(self.chars, range(len(self.chars))))
        self.tensor = np.array(list(map(self.vocab.get, data)))
        self.create_batches()
        self.reset_batch_pointer()

    def create_batches(self):
        self.num_batches = int(self.tensor.size / (self.batch_size *
                                                   self.seq_length))
        self.tensor = self.tensor[:self.num_batches * self.batch_size * self.seq_length]
        xdata = self.tensor
        ydata = np.copy(self.tensor)
        ydata[:-1] = xdata[1:]
        ydata[-1] = xdata[0]
        self.x_batches = np.split(xdata.reshape(self.batch_size, -1),
                                  self.num_batches, 1)
        self.y_batches = np.split(ydata.reshape(self.batch_size, -1),
                                  self.num_batches, 1)

    def next_batch(self):
        x, y = self.x_batches[self.pointer], self.y_batches[self.pointer]
        self.pointer += 1
        return x, y

    def reset_batch_pointer(self):
        self.pointer = 0


# --------------------------------------------------------------- train.py
def recipe_args(model, num_layers, epochs):
  """train.py's parser defaults, then the tiny sizes of the fixtures."""
  return argparse.Namespace(
      data_dir="data/tinyshakespeare", save_dir="save", log_dir="logs",
      save_every=1000, init_from=None, model=model, rnn_size=16,
      num_layers=num_layers, seq_length=25, batch_size=16, num_epochs=epochs,
      grad_clip=5., learning_rate=0.01, decay_rate=0.97,
      output_keep_prob=1.0, input_keep_prob=1.0)


def train(args, cell_fns, protocol):
  data_loader = TextLoader(args.data_dir, args.batch_size, args.seq_length)
  args.vocab_size = data_loader.vocab_size
  if not os.path.isdir(args.save_dir):
    os.makedirs(args.save_dir)
  with open(os.path.join(args.save_dir, 'config.pkl'), 'wb') as f:
    pickle.dump(args, f, protocol)
  with open(os.path.join(args.save_dir, 'chars_vocab.pkl'), 'wb') as f:
    pickle.dump((data_loader.chars, data_loader.vocab), f, protocol)
  graph = tf.Graph()
  with graph.as_default(), tf.Session() as sess:
    tf.set_random_seed(0)
    model = Model(args, cell_fns=cell_fns)
    sess.run(tf.global_variables_initializer())
    saver = tf.train.Saver(tf.global_variables(), max_to_keep=1)
    for e in range(args.num_epochs):
      sess.run(tf.assign(model.lr, args.learning_rate * (args.decay_rate ** e)))
      data_loader.reset_batch_pointer()
      state = sess.run(model.initial_state)
      for b in range(data_loader.num_batches):
        x, y = data_loader.next_batch()
        feed = {model.input_data: x, model.targets: y,
                model.initial_state: state}
        train_loss, state, _ = sess.run(
            [model.cost, model.final_state, model.train_op], feed)
      print(f"  epoch {e}: train_loss = {train_loss:.3f}")
    step = args.num_epochs * data_loader.num_batches - 1
    saver.save(sess, os.path.join(args.save_dir, 'model.ckpt'),
               global_step=step, write_meta_graph=False)


# --------------------------------------------------------------- sample.py
def reference(save_dir, cell_fns):
  """The recipe's logits for LOGITS_TEXT and its greedy (--sample=0) text."""
  with open(os.path.join(save_dir, 'config.pkl'), 'rb') as f:
    saved_args = pickle.load(f)
  with open(os.path.join(save_dir, 'chars_vocab.pkl'), 'rb') as f:
    chars, vocab = pickle.load(f)
  graph = tf.Graph()
  with graph.as_default(), tf.Session() as sess:
    model = Model(saved_args, training=False, cell_fns=cell_fns)
    tf.global_variables_initializer().run()
    saver = tf.train.Saver(tf.global_variables())
    saver.restore(sess, tf.train.latest_checkpoint(save_dir))
    state = sess.run(model.cell.zero_state(1, tf.float32))
    logits = []
    for char in LOGITS_TEXT:
      feed = {model.input_data: [[vocab[char]]], model.initial_state: state}
      step_logits, state = sess.run([model.logits, model.final_state], feed)
      logits.append(step_logits[0])
    greedy = model.sample(sess, chars, vocab, GREEDY_STEPS, PRIME, 0)
  return {"logits_text": np.asarray(LOGITS_TEXT),
          "logits": np.asarray(logits, np.float32),
          "prime": np.asarray(PRIME), "num": np.asarray(GREEDY_STEPS),
          "greedy": np.asarray(greedy)}


def main():
  out = fixture_dir.output_dir(__doc__, "charrnn_tf")
  with open(CORPUS, encoding="utf-8") as f:
    text = f.read()[:CORPUS_CHARS]
  os.makedirs(out, exist_ok=True)
  np.random.seed(0)
  for name, (model, cell_fns, layers, protocol, epochs) in FIXTURES.items():
    print(name)
    work = tempfile.mkdtemp(prefix="charrnn_tf_")
    try:
      cwd = os.getcwd()
      os.chdir(work)
      try:
        args = recipe_args(model, layers, epochs)
        os.makedirs(args.data_dir)
        with open(os.path.join(args.data_dir, "input.txt"), "w",
                  encoding="utf-8") as f:
          f.write(text)
        train(args, cell_fns, protocol)
        ref = reference(args.save_dir, cell_fns)
      finally:
        os.chdir(cwd)
      target = os.path.join(out, name)
      if os.path.isdir(target):
        shutil.rmtree(target)
      shutil.copytree(os.path.join(work, "save"), target)
    finally:
      shutil.rmtree(work)
    np.savez(os.path.join(target, "reference.npz"), **ref)
    print(f"  greedy: {str(ref['greedy'])!r}")


if __name__ == "__main__":
  sys.exit(main())
