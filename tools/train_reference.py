"""Train the reference character-level GRU model that rnnstep bundles by default.

The model is a plain Keras 3 stack

    Embedding(V, E) -> GRU(U, return_sequences=True, reset_after=True) -> Dense(V)

trained on tinyshakespeare with sparse categorical cross-entropy on logits.
The vocabulary is ``sorted(set(text))`` of the whole corpus (65 characters, no
[UNK] row); ids are indices into that list. The first 90% of the characters are
used for training, the last 10% are held out.

Held-out quality is the mean negative log-likelihood (nats/char) over the
held-out text split into consecutive, non-overlapping 256-character windows
(a trailing partial window is dropped). Every window is scored from a zero
initial state with teacher forcing, giving 255 predictions per window.

Training is seeded and resumable: after every epoch the full model (weights
and optimizer state) is saved to ``--workdir`` together with a small JSON file
holding the epoch number and the history so far. Re-running with the same
``--workdir`` continues after the last completed epoch.

Outputs in ``--workdir`` when training finishes:
    final.weights.h5   Keras 3 ``model.save_weights`` (layer weights only)
    final.keras        Keras 3 ``model.save`` (includes optimizer state)
    vocab.json         JSON list of the characters in id order
    train_log.json     command line, architecture, per-epoch timings, train
                       loss and held-out NLL, versions, seed, and two samples

Usage:
    python3 tools/train_reference.py --workdir=/work/train_out \\
        --embedding_dim=256 --units=768 --epochs=12 --max_minutes=50
"""

import json
import math
import os
import sys
import time
from pathlib import Path

from absl import app, flags

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare.txt"
EVAL_WINDOW = 256
SAMPLE_PROMPT = "ROMEO:"
SAMPLE_LENGTH = 300
SAMPLE_TEMPERATURE = 0.8
STATE_FILE = "state.json"

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "/work/train_out", "Directory for checkpoints and outputs.")
flags.DEFINE_string("corpus", str(DEFAULT_CORPUS), "Path of the training text.")
flags.DEFINE_integer("epochs", 12, "Total number of epochs to train.")
flags.DEFINE_integer("embedding_dim", 256, "Embedding size E.")
flags.DEFINE_integer("units", 768, "GRU units U.")
flags.DEFINE_integer("seq_length", 100, "Training sequence length (inputs per example).")
flags.DEFINE_integer("batch_size", 64, "Training batch size.")
flags.DEFINE_float("learning_rate", 2e-3, "Peak Adam learning rate (cosine-decayed).")
flags.DEFINE_integer("seed", 0, "Random seed.")
flags.DEFINE_float("max_minutes", 50.0,
                   "Stop after the epoch at which total training wall time exceeds this.")
flags.DEFINE_float("train_fraction", 1.0,
                   "Use only this leading fraction of the training split (for quick tests).")


def load_corpus(path):
    """Return (text, vocab, ids) where ids is an int32 array of the whole text."""
    import numpy as np

    text = Path(path).read_text(encoding="utf-8")
    vocab = sorted(set(text))
    char_to_id = {c: i for i, c in enumerate(vocab)}
    ids = np.fromiter((char_to_id[c] for c in text), dtype=np.int32, count=len(text))
    return text, vocab, ids


def build_model(vocab_size, embedding_dim, units):
    """Build the (uncompiled) Embedding -> GRU -> Dense logits model."""
    import keras

    return keras.Sequential(
        [
            keras.Input(shape=(None,), dtype="int32"),
            keras.layers.Embedding(vocab_size, embedding_dim, name="embedding"),
            keras.layers.GRU(units, return_sequences=True, reset_after=True, name="gru"),
            keras.layers.Dense(vocab_size, name="logits"),
        ],
        name="char_gru",
    )


def compile_model(model, learning_rate, total_steps):
    """Compile with Adam on a cosine-decayed learning rate and logits cross-entropy."""
    import keras

    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=learning_rate, decay_steps=total_steps, alpha=0.05)
    # Clipping guards against the occasional exploding-gradient step early in GRU training.
    optimizer = keras.optimizers.Adam(learning_rate=schedule, global_clipnorm=5.0)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )


def sequences_per_epoch(num_train_ids, seq_length, batch_size):
    """Number of training sequences used each epoch (a multiple of batch_size)."""
    n = (num_train_ids - 1 - seq_length) // seq_length
    return n - n % batch_size


def epoch_examples(train_ids, seq_length, batch_size, seed, epoch):
    """Return shuffled (x, y) arrays for one epoch.

    Windows are cut at a random offset each epoch so that sequence boundaries
    differ between epochs; offset and order depend only on (seed, epoch), which
    keeps resumed runs on the same data schedule as uninterrupted ones.
    """
    import numpy as np

    rng = np.random.default_rng([seed, epoch])
    n = sequences_per_epoch(len(train_ids), seq_length, batch_size)
    offset = int(rng.integers(seq_length))
    starts = offset + seq_length * rng.permutation(n)
    idx = starts[:, None] + np.arange(seq_length + 1)[None, :]
    windows = train_ids[idx]
    return windows[:, :-1], windows[:, 1:]


def heldout_windows(heldout_ids, window=EVAL_WINDOW):
    """Split held-out ids into consecutive non-overlapping full windows, shape (N, window)."""
    n = len(heldout_ids) // window
    return heldout_ids[: n * window].reshape(n, window)


def heldout_nll(model, windows, batch_size=64):
    """Mean NLL (nats/char) of next-char predictions within each window, zero initial state."""
    import numpy as np
    import tensorflow as tf

    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i : i + batch_size]
        logits = model(chunk[:, :-1], training=False)
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=chunk[:, 1:], logits=logits)
        total += float(np.sum(nll.numpy(), dtype=np.float64))
        count += nll.shape[0] * nll.shape[1]
    return total / count


def build_step_model(model, vocab_size, embedding_dim, units):
    """Return a model mapping (ids[1, T], state[1, U]) -> (logits, state) with the trained weights."""
    import keras

    tokens = keras.Input(shape=(None,), batch_size=1, dtype="int32")
    state_in = keras.Input(shape=(units,), batch_size=1)
    x = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding")(tokens)
    x, state_out = keras.layers.GRU(
        units, return_sequences=True, return_state=True, reset_after=True, name="gru"
    )(x, initial_state=state_in)
    logits = keras.layers.Dense(vocab_size, name="logits")(x)
    step_model = keras.Model([tokens, state_in], [logits, state_out])
    for name in ("embedding", "gru", "logits"):
        step_model.get_layer(name).set_weights(model.get_layer(name).get_weights())
    return step_model


def generate(step_model, vocab, prompt, length, units, temperature=None, seed=0):
    """Generate `length` chars after `prompt`; greedy if temperature is None, else sampled."""
    import numpy as np

    char_to_id = {c: i for i, c in enumerate(vocab)}
    rng = np.random.default_rng(seed)
    state = np.zeros((1, units), dtype=np.float32)
    inputs = np.array([[char_to_id[c] for c in prompt]], dtype=np.int32)
    out = []
    for _ in range(length):
        logits, state = step_model([inputs, state], training=False)
        state = state.numpy()
        last = logits.numpy()[0, -1].astype(np.float64)
        if temperature is None:
            next_id = int(np.argmax(last))
        else:
            scaled = last / temperature
            probs = np.exp(scaled - scaled.max())
            probs /= probs.sum()
            next_id = int(rng.choice(len(vocab), p=probs))
        out.append(vocab[next_id])
        inputs = np.array([[next_id]], dtype=np.int32)
    return prompt + "".join(out)


def write_json(path, obj):
    """Write JSON atomically so an interrupted run never leaves a truncated file."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def load_state(workdir):
    """Return the resume state dict, or None when starting fresh."""
    path = workdir / STATE_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def save_checkpoint(model, workdir, state):
    """Save the full model for the just-finished epoch, then point state.json at it."""
    epoch = state["epochs_completed"]
    ckpt = workdir / f"ckpt_epoch{epoch:03d}.keras"
    tmp = workdir / f"ckpt_epoch{epoch:03d}.tmp.keras"
    model.save(tmp)
    os.replace(tmp, ckpt)
    state["checkpoint"] = ckpt.name
    write_json(workdir / STATE_FILE, state)
    # Only after state.json names the new checkpoint is it safe to drop older ones.
    for old in workdir.glob("ckpt_epoch*.keras"):
        if old.name != ckpt.name:
            old.unlink()


def main(argv):
    del argv
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    import keras
    import numpy as np

    keras.utils.set_random_seed(FLAGS.seed)
    workdir = Path(FLAGS.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    text, vocab, ids = load_corpus(FLAGS.corpus)
    split = int(0.9 * len(text))
    train_ids = ids[:split]
    if FLAGS.train_fraction < 1.0:
        train_ids = train_ids[: int(FLAGS.train_fraction * len(train_ids))]
    eval_windows = heldout_windows(ids[split:])
    print(f"corpus {len(text)} chars, vocab {len(vocab)}, train {len(train_ids)}, "
          f"held-out windows {eval_windows.shape}", flush=True)
    write_json(workdir / "vocab.json", vocab)

    steps_per_epoch = sequences_per_epoch(len(train_ids), FLAGS.seq_length,
                                          FLAGS.batch_size) // FLAGS.batch_size
    config = {
        "vocab_size": len(vocab),
        "embedding_dim": FLAGS.embedding_dim,
        "units": FLAGS.units,
        "seq_length": FLAGS.seq_length,
        "batch_size": FLAGS.batch_size,
        "learning_rate": FLAGS.learning_rate,
        "epochs": FLAGS.epochs,
        "seed": FLAGS.seed,
        "train_chars": len(train_ids),
        "steps_per_epoch": steps_per_epoch,
    }

    state = load_state(workdir)
    if state is not None:
        if state["config"] != config:
            raise SystemExit(f"workdir {workdir} holds a run with a different config: "
                             f"{state['config']} != {config}")
        model = keras.models.load_model(workdir / state["checkpoint"])
        print(f"resumed from {state['checkpoint']} after epoch {state['epochs_completed']}",
              flush=True)
    else:
        model = build_model(len(vocab), FLAGS.embedding_dim, FLAGS.units)
        compile_model(model, FLAGS.learning_rate, FLAGS.epochs * steps_per_epoch)
        state = {"config": config, "epochs_completed": 0, "train_seconds": 0.0,
                 "history": [], "invocations": []}
    state["invocations"].append(" ".join([sys.executable] + sys.argv))
    params = int(model.count_params())
    print(f"model params {params} ({params * 4 / 2**20:.2f} MiB float32)", flush=True)

    while state["epochs_completed"] < FLAGS.epochs:
        if state["train_seconds"] > FLAGS.max_minutes * 60:
            print(f"wall-time budget of {FLAGS.max_minutes} min exhausted", flush=True)
            break
        epoch = state["epochs_completed"]
        x, y = epoch_examples(train_ids, FLAGS.seq_length, FLAGS.batch_size, FLAGS.seed, epoch)
        start = time.time()
        hist = model.fit(x, y, batch_size=FLAGS.batch_size, epochs=1, shuffle=False, verbose=2)
        fit_seconds = time.time() - start
        nll = heldout_nll(model, eval_windows)
        epoch_seconds = time.time() - start
        state["train_seconds"] += epoch_seconds
        state["epochs_completed"] = epoch + 1
        state["history"].append({
            "epoch": epoch + 1,
            "train_loss": float(hist.history["loss"][-1]),
            "heldout_nll": nll,
            "fit_seconds": round(fit_seconds, 1),
            "epoch_seconds": round(epoch_seconds, 1),
            "learning_rate_end": float(model.optimizer.learning_rate.numpy()),
        })
        save_checkpoint(model, workdir, state)
        print(f"epoch {epoch + 1}/{FLAGS.epochs} train_loss {hist.history['loss'][-1]:.4f} "
              f"heldout_nll {nll:.4f} epoch_time {epoch_seconds:.0f}s "
              f"total {state['train_seconds'] / 60:.1f} min", flush=True)

    final_nll = state["history"][-1]["heldout_nll"] if state["history"] else heldout_nll(
        model, eval_windows)
    # save_weights on a compiled model also stores the Adam slots (3x the size);
    # the bundled weights file should hold only the layer weights.
    inference_model = build_model(len(vocab), FLAGS.embedding_dim, FLAGS.units)
    inference_model.set_weights(model.get_weights())
    inference_model.save_weights(workdir / "final.weights.h5")
    model.save(workdir / "final.keras")

    step_model = build_step_model(model, len(vocab), FLAGS.embedding_dim, FLAGS.units)
    greedy = generate(step_model, vocab, SAMPLE_PROMPT, SAMPLE_LENGTH, FLAGS.units)
    sampled = generate(step_model, vocab, SAMPLE_PROMPT, SAMPLE_LENGTH, FLAGS.units,
                       temperature=SAMPLE_TEMPERATURE, seed=FLAGS.seed)
    print(f"--- greedy ---\n{greedy}\n--- temperature {SAMPLE_TEMPERATURE} ---\n{sampled}",
          flush=True)

    write_json(workdir / "train_log.json", {
        "command": state["invocations"][0],
        "invocations": state["invocations"],
        "architecture": {
            "layers": "Embedding -> GRU(return_sequences, reset_after, tanh/sigmoid) -> Dense",
            "vocab_size": len(vocab),
            "embedding_dim": FLAGS.embedding_dim,
            "units": FLAGS.units,
            "params": params,
            "float32_bytes": params * 4,
        },
        "training": {k: v for k, v in config.items()
                     if k not in ("vocab_size", "embedding_dim", "units")},
        "optimizer": "Adam, cosine decay to 0.05x over all epochs, global_clipnorm 5",
        "heldout_eval": f"last 10% of corpus, non-overlapping {EVAL_WINDOW}-char windows "
                        f"({len(eval_windows)}), zero initial state, "
                        f"{EVAL_WINDOW - 1} predictions per window",
        "epochs_run": state["epochs_completed"],
        "wall_seconds_per_epoch": [h["epoch_seconds"] for h in state["history"]],
        "wall_seconds_total": round(state["train_seconds"], 1),
        "history": state["history"],
        "final_heldout_nll": final_nll,
        "samples": {
            "prompt": SAMPLE_PROMPT,
            "length": SAMPLE_LENGTH,
            "greedy": greedy,
            f"temperature_{SAMPLE_TEMPERATURE}": sampled,
            "sample_seed": FLAGS.seed,
        },
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                     "numpy": np.__version__, "python": sys.version.split()[0]},
        "seed": FLAGS.seed,
    })
    print(f"final held-out NLL {final_nll:.4f}; outputs in {workdir}", flush=True)


if __name__ == "__main__":
    app.run(main)
