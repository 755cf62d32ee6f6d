"""The .npz model file: round trip, validation of every field, hostile files."""

import io
import json
import os
import zipfile

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from rnnstep.model import model_file

V, D = 6, 4
VOCAB = ["\n", " ", "a", "b", "c", "d"]
CONFIG = model_file.ModelConfig(
    D, (model_file.LayerConfig("gru", 5, True), model_file.LayerConfig("lstm", 3),
        model_file.LayerConfig("simple_rnn", 2)))


def random_tensors(config=CONFIG, vocab_size=V, seed=0):
  rng = np.random.default_rng(seed)
  return {key: rng.normal(0, 1, shape).astype(np.float32)
          for key, shape in config.expected_shapes(vocab_size).items()}


def write_raw(path, **members):
  """Writes an npz with arbitrary members (no validation), as an attacker would."""
  with open(path, "wb") as f:
    np.savez(f, **members)


def valid_members():
  return dict(format_version=np.int64(1), config=np.array(CONFIG.to_json()),
              vocab=np.array(json.dumps(VOCAB)), **random_tensors())


class ModelFileTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.path = os.path.join(self.dir, "m.npz")

  def assertRefused(self, pattern, path=None):
    with self.assertRaisesRegex(ValueError, pattern) as ctx:
      model_file.read(path or self.path)
    self.assertIn(path or self.path, str(ctx.exception))
    self.assertNotIn("\n", str(ctx.exception))

  def test_round_trip(self):
    tensors = random_tensors()
    model_file.write(self.path, CONFIG, VOCAB, tensors)
    loaded = model_file.read(self.path)
    self.assertEqual(loaded.config, CONFIG)
    self.assertEqual(loaded.vocab, VOCAB)
    for key, value in tensors.items():
      np.testing.assert_array_equal(loaded.tensors[key], value)
    self.assertEqual(os.listdir(self.dir), ["m.npz"])

  def test_window_round_trip_and_absent_by_default(self):
    windowed = model_file.ModelConfig(D, CONFIG.layers, window=40)
    model_file.write(self.path, windowed, VOCAB, random_tensors())
    self.assertEqual(model_file.read(self.path).config.window, 40)
    self.assertEqual(json.loads(windowed.to_json())["window"], 40)
    self.assertNotIn("window", json.loads(CONFIG.to_json()))
    self.assertIsNone(CONFIG.window)

  def test_unk_vocab_and_unicode(self):
    vocab = ["[UNK]", "\n", " ", "é", "\u2014", "\x00"]
    model_file.write(self.path, CONFIG, vocab, random_tensors())
    self.assertEqual(model_file.read(self.path).vocab, vocab)

  def test_failed_write_leaves_nothing(self):
    tensors = random_tensors()
    tensors["dense_bias"] = np.zeros([V + 1], np.float32)
    with self.assertRaisesRegex(ValueError, "dense_bias"):
      model_file.write(self.path, CONFIG, VOCAB, tensors)
    self.assertEqual(os.listdir(self.dir), [])

  def test_write_replaces_atomically(self):
    model_file.write(self.path, CONFIG, VOCAB, random_tensors(seed=1))
    model_file.write(self.path, CONFIG, VOCAB, random_tensors(seed=2))
    np.testing.assert_array_equal(model_file.read(self.path).tensors["embedding"],
                                  random_tensors(seed=2)["embedding"])
    self.assertEqual(os.listdir(self.dir), ["m.npz"])

  def test_missing_file(self):
    with self.assertRaisesRegex(FileNotFoundError, "no such model file"):
      model_file.read(os.path.join(self.dir, "nope.npz"))

  def test_directory(self):
    with self.assertRaisesRegex(OSError, "directory"):
      model_file.read(self.dir)

  @parameterized.named_parameters(
      ("random_bytes", os.urandom(3000), "not a valid .npz"),
      ("empty", b"", "not a valid .npz"),
      ("text", b"hello world\n" * 50, "not a valid .npz"),
  )
  def test_garbage(self, content, pattern):
    with open(self.path, "wb") as f:
      f.write(content)
    self.assertRefused(pattern)

  def test_truncated(self):
    model_file.write(self.path, CONFIG, VOCAB, random_tensors())
    data = open(self.path, "rb").read()
    for cut in (len(data) // 3, len(data) - 30):
      with open(self.path, "wb") as f:
        f.write(data[:cut])
      with self.assertRaises(ValueError):
        model_file.read(self.path)

  def test_object_array_refused_without_unpickling(self):
    members = valid_members()
    members["embedding"] = np.array([{"x": 1}, None], dtype=object)
    write_raw(self.path, **members)
    self.assertRefused("object")

  @parameterized.named_parameters(
      ("missing_tensor", lambda m: m.pop("layer1_bias"), "missing tensors"),
      ("extra_tensor", lambda m: m.update(evil=np.zeros(3, np.float32)),
       "unexpected tensors"),
      ("wrong_shape", lambda m: m.update(layer0_kernel=np.zeros([D, 14],
                                                               np.float32)),
       r"layer0_kernel has shape \(4, 14\), expected \(4, 15\)"),
      ("nan", lambda m: m["dense_kernel"].__setitem__((0, 0), np.nan), "NaN"),
      ("inf", lambda m: m["embedding"].__setitem__((1, 1), np.inf), "NaN or Inf"),
      ("int_tensor", lambda m: m.update(dense_bias=np.zeros([V], np.int32)),
       "dtype int32"),
      ("no_version", lambda m: m.pop("format_version"), "no format_version"),
      ("future_version", lambda m: m.update(format_version=np.int64(99)),
       "format_version 99 is not supported"),
      ("bad_config_json", lambda m: m.update(config=np.array("{nope")),
       "config is not valid JSON"),
      ("unknown_kind", lambda m: m.update(config=np.array(json.dumps(
          {"embedding_dim": D, "layers": [{"kind": "lambda", "units": 5}]}))),
       "unknown kind 'lambda'"),
      ("negative_units", lambda m: m.update(config=np.array(json.dumps(
          {"embedding_dim": D, "layers": [{"kind": "gru", "units": -5}]}))),
       "units must be a positive integer"),
      ("vocab_not_chars", lambda m: m.update(vocab=np.array(json.dumps(
          ["\n", " ", "ab", "b", "c", "d"]))),
       "a token of 2 characters; rnnstep.s vocabularies are characters"),
      ("vocab_duplicate", lambda m: m.update(vocab=np.array(json.dumps(
          ["\n", " ", "a", "a", "c", "d"]))), "repeats"),
      ("vocab_size_mismatch", lambda m: m.update(vocab=np.array(json.dumps(
          VOCAB[:-1]))), "expected"),
      ("config_as_bytes", lambda m: m.update(config=np.frombuffer(b"{}", np.uint8)),
       "JSON text scalar"),
      *[(f"window_{name}", lambda m, w=window: m.update(config=np.array(
          json.dumps({**json.loads(CONFIG.to_json()), "window": w}))),
         "config window must be a positive integer up to 65536, got")
        for name, window in (("zero", 0), ("negative", -3), ("bool", True),
                             ("text", "40"), ("float", 40.0),
                             ("huge", 1 << 20))],
      ("vocab_token_dict", lambda m: m.update(vocab=np.array(json.dumps(
          {"<s>": 0, "a": 1}))), "vocab is a JSON object .token: index. with "
       "multi-character tokens such as '<s>', not a list; rnnstep's "
       "vocabularies are characters; give a JSON list"),
  )
  def test_invalid(self, mutate, pattern):
    members = valid_members()
    mutate(members)
    write_raw(self.path, **members)
    self.assertRefused(pattern)

  def test_shape_bomb_refused_before_allocating(self):
    # A member whose header declares 2**40 floats but stores none.
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (2**20, 2**20)})
    model_file.write(self.path, CONFIG, VOCAB, random_tensors())
    with zipfile.ZipFile(self.path, "a") as z:
      z.writestr("bomb.npy", header.getvalue())
    self.assertRefused("declares 4398046511104 bytes but holds")

  def test_unexpected_member_name(self):
    model_file.write(self.path, CONFIG, VOCAB, random_tensors())
    with zipfile.ZipFile(self.path, "a") as z:
      z.writestr("../../etc/evil.npy", b"x")
    self.assertRefused("unexpected member")


if __name__ == "__main__":
  tf.test.main()


# Property-based: whatever the bytes, reading either succeeds or refuses cleanly.
from hypothesis import given, settings, strategies as st  # pylint: disable=g-import-not-at-top,g-bad-import-order
import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order


def _valid_file_bytes():
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "m.npz")
    model_file.write(path, CONFIG, VOCAB, random_tensors())
    return open(path, "rb").read()


_VALID = _valid_file_bytes()


def _read_bytes(data):
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "m.npz")
    with open(path, "wb") as f:
      f.write(data)
    try:
      model_file.read(path)
    except (ValueError, OSError) as e:
      assert "\n" not in str(e)
      assert path in str(e)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)),
                min_size=1, max_size=8),
       st.integers(1, len(_VALID)))
def test_corrupted_bytes_are_refused_cleanly(flips, keep):
  data = bytearray(_VALID[:keep])
  for position, value in flips:
    if position < len(data):
      data[position] = value
  _read_bytes(bytes(data))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["embedding_dim", "layers", "kind",
                                       "units", "reset_after", "x"]), inner,
                      max_size=4),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_arbitrary_config_json_is_validated(data):
  try:
    config = model_file.parse_config(data, "f.npz")
  except ValueError as e:
    assert str(e).startswith("f.npz: ")
  else:
    assert config.layers and all(l.units > 0 for l in config.layers)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=3) | st.integers(), max_size=6))
def test_arbitrary_vocab_is_validated(vocab):
  try:
    model_file.validate_vocab(vocab)
  except ValueError:
    return
  assert all(len(t) == 1 or (t == "[UNK]" and i == 0) for i, t in enumerate(vocab))
