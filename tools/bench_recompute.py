"""Times recomputed windows (rnnstep/engine/recompute.py) at TensorFlow in
Practice's sizes against the recipe's own `model.predict` loop (needs tf_keras).

    python tools/bench_recompute.py [--windows=10,20] [--tokens=100]

The recipe's models at their own sizes, random weights, built and saved by
tf_keras (`model.save("m.h5")`), with a Tokenizer of V-1 words:

  bidi     Embedding(V, 100, input_length=k) -> Bidirectional(LSTM(150)) ->
           Dense(V, softmax)   (the poetry and Irish-lyrics labs)
  sonnets  Embedding(V, 100, input_length=k) -> Bidirectional(LSTM(150,
           return_sequences=True)) -> Dropout -> LSTM(100) -> Dense(V // 2,
           relu) -> Dense(V, softmax)   (the sonnets exercise)

For each model and window k, at batch 1: rnnstep.generate's greedy words on
the graph and XLA paths (one call of `--tokens` words, after a warm-up call;
the median of `--repeats` calls, per word), and the recipe's loop (re-tokenize,
pad_sequences, model.predict, argmax; `--predict_tokens` words, per word).
Prints one line per measurement and the load average.
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def build(kind, window, vocab_size, tmpdir):
  """Saves the recipe's model with random weights; returns (tf_keras model,
  its .h5 path)."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  layers = tf_keras.layers
  tf_keras.utils.set_random_seed(0)
  stack = [layers.Embedding(vocab_size, 100, input_length=window)]
  if kind == "bidi":
    stack += [layers.Bidirectional(layers.LSTM(150))]
  else:
    stack += [layers.Bidirectional(layers.LSTM(150, return_sequences=True)),
              layers.Dropout(0.2), layers.LSTM(100),
              layers.Dense(vocab_size // 2, activation="relu")]
  model = tf_keras.Sequential(
      stack + [layers.Dense(vocab_size, activation="softmax")])
  model.build((None, window))
  path = os.path.join(tmpdir, f"{kind}{window}.h5")
  model.save(path, include_optimizer=False)
  return model, path


def median_seconds(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--windows", default="10,20")
  parser.add_argument("--vocab_size", type=int, default=3000)
  parser.add_argument("--tokens", type=int, default=100)
  parser.add_argument("--predict_tokens", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  import rnnstep  # pylint: disable=g-import-not-at-top
  from tf_keras.preprocessing.sequence import pad_sequences  # pylint: disable=g-import-not-at-top
  from tf_keras.preprocessing.text import Tokenizer  # pylint: disable=g-import-not-at-top
  words = [f"w{i}" for i in range(1, args.vocab_size)]
  tokenizer = Tokenizer()
  tokenizer.fit_on_texts([" ".join(words)])
  seed = "w1 w2 w3"
  with tempfile.TemporaryDirectory() as tmpdir:
    vocab = os.path.join(tmpdir, "tokenizer.json")
    with open(vocab, "w") as f:
      f.write(tokenizer.to_json())
    for kind in ("bidi", "sonnets"):
      for window in map(int, args.windows.split(",")):
        keras_model, path = build(kind, window, args.vocab_size, tmpdir)
        model = rnnstep.load(path, vocab=vocab)
        for name, path_flag in (("graph", False), ("xla", True)):
          run = lambda: rnnstep.generate(model, seed, args.tokens,
                                         temperature=0, jit_compile=path_flag)
          run()  # Trace and compile.
          ms = 1e3 * median_seconds(run, args.repeats) / args.tokens
          print(f"{kind} k={window} rnnstep {name}: {ms:.2f} ms/word")

        def recipe():
          text = seed
          for _ in range(args.predict_tokens):
            ids = pad_sequences(tokenizer.texts_to_sequences([text]),
                                maxlen=window, padding="pre")
            predicted = int(np.argmax(keras_model.predict(ids, verbose=0)))
            text += " " + tokenizer.index_word.get(predicted, "")
        recipe()  # Its first predict builds the predict function.
        ms = 1e3 * median_seconds(recipe, args.repeats) / args.predict_tokens
        print(f"{kind} k={window} recipe model.predict loop: {ms:.2f} ms/word")
  print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
  main()
