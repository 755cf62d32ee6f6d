"""The benchmarked model's weights and prompts, shared by every section."""

from absl import app


def random_tensors(vocab_size, embedding_dim, units, seed):
  """Seeded weights from Keras' own initializers (GRU reset_after=True).

  The model is built by the tests' reference builder (tests/support/keras_reference.py:
  Keras 3 Embedding -> GRU -> Dense, biases random), so the benchmark's weights
  are real Keras initializations, not a re-implementation of them.
  """
  from tests.support import keras_reference  # pylint: disable=g-import-not-at-top
  layers = [keras_reference.layer("gru", units, True)]
  model = keras_reference.build(layers, vocab_size=vocab_size,
                                embedding_dim=embedding_dim, seed=seed,
                                bias_scale=0.1)
  tensors = keras_reference.weights_of(model, layers)
  # Somewhat larger than Glorot so that the logits have a realistic spread
  # (a trained char model is fairly confident) and greedy text is not flat.
  tensors["dense_kernel"] = 4.0 * tensors["dense_kernel"]
  return tensors


# The tutorial's tinyshakespeare vocabulary (65 characters), in id order.
SHAKESPEARE_VOCAB = ("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "abcdefghijklmnopqrstuvwxyz")


def default_vocab(vocab_size):
  extra = [chr(0x100 + i) for i in range(max(vocab_size - 65, 0))]
  return (list(SHAKESPEARE_VOCAB) + extra)[:vocab_size]


def probe_prompt(vocab, length=10):
  """A prompt of `length` characters of `vocab` (never "[UNK]")."""
  usable = [c for c in vocab if len(c) == 1 and c != "\n"] or [vocab[-1]]
  return "".join(usable[(i * 7) % len(usable)] for i in range(length))


class Weights:
  """The model's tensors, vocab and config, shared by every variant."""

  def __init__(self, settings):
    from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
    if settings.weights_path:
      data = model_file.read(settings.weights_path)
      layers = data.config.layers
      if len(layers) != 1 or layers[0].kind != "gru" or not layers[0].reset_after:
        raise app.UsageError("--weights: the Keras/PyTorch variants need one GRU "
                             "layer with reset_after=True")
      self.config, self.vocab, self.tensors = data.config, list(data.vocab), dict(
          data.tensors)
      self.source = settings.weights_path
    else:
      self.config = model_file.ModelConfig(
          settings.embedding_dim,
          (model_file.LayerConfig("gru", settings.units, True),))
      self.vocab = default_vocab(settings.vocab_size)
      self.tensors = random_tensors(settings.vocab_size, settings.embedding_dim,
                                    settings.units, settings.seed)
      self.source = f"random Keras-initialized weights, seed {settings.seed}"
    self.vocab_size = len(self.vocab)
    self.embedding_dim = self.config.embedding_dim
    self.units = self.config.layers[0].units
    # Never sample "[UNK]" (id 0 of a tutorial vocab) in the baselines either.
    self.has_unk = self.vocab[0] == model_file.UNK_TOKEN
    self._models = {}

  def describe(self):
    params = sum(t.size for t in self.tensors.values())
    return (f"Embedding({self.vocab_size}, {self.embedding_dim}) -> "
            f"GRU({self.units}, reset_after) -> Dense({self.vocab_size}); "
            f"{params / 1e6:.2f} M params; {self.source}")

  def rnnstep_model(self, dtype="float32"):
    """The rnnstep Model in `dtype`, one per dtype shared by every section
    (each path compiles once per model and shape, not once per section)."""
    if dtype not in self._models:
      from rnnstep.model import network as model_lib  # pylint: disable=g-import-not-at-top
      self._models[dtype] = model_lib.Model(self.config, self.vocab,
                                            self.tensors, dtype=dtype)
    return self._models[dtype]

  def write(self, path):
    from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
    model_file.write(path, self.config, self.vocab, self.tensors)


def make_prompts(weights, batch, length, seed):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed + 7)
  low = 1 if weights.has_unk else 0
  ids = rng.integers(low, weights.vocab_size, (batch, length)).astype(np.int32)
  texts = ["".join(weights.vocab[i] for i in row) for row in ids]
  return ids, texts


def banned_mask(weights):
  import numpy as np  # pylint: disable=g-import-not-at-top
  mask = np.zeros([weights.vocab_size], np.float32)
  if weights.has_unk:
    mask[0] = -np.inf
  return mask
