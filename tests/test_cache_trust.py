"""The compiled-artifact cache can be trusted: keyed on every byte it depends
on, bounded, and isolated (rnnstep/litert/cache.py, issue 48).

Most checks run in this process on entries written without TensorFlow
(`compiled_cache.write_entry` with made-up flatbuffer bytes: nothing here runs
them), and none needs the LiteRT interpreter (`ai_edge_litert`): the keys are
made with its version where it is installed, else with none. The background
child runs for real in three slow tests: two at once on one entry, one beside
a planted `numpy.py`, and `--cache_info`. The warm path that reads the cache
through the command is tests/test_fast_path.py's.
"""

import concurrent.futures
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from tests.support import cli as cli_support
from tests.support import forkserver
import rnnstep
from rnnstep.cli import cache_commands
from rnnstep.litert import cache as compiled_cache
from rnnstep.litert import fill as compiled_fill
from rnnstep.engine import cpu
from rnnstep.engine import tuning_cache
from rnnstep.decoding import options as options_lib
from rnnstep.litert import warm
from rnnstep import version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHARRNN = os.path.join(REPO, "tests", "data", "charrnn_tf", "gru")
FILL_TIMEOUT = 300
# The runtime the keys name: the one `fill` keys with (its version, or ""
# where it is not installed).
RUNTIME = compiled_cache.runtime_version() or ""


@pytest.fixture
def cache(tmp_path, monkeypatch):
  directory = tmp_path / "cache"
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(directory))
  monkeypatch.delenv("RNNSTEP_CACHE_MAX_MB", raising=False)
  return directory


@pytest.fixture
def weights(tmp_path):
  path = str(tmp_path / "model.npz")
  cli_support.write_model(path, seed=3)
  return path


def flip_a_byte(path, offset=0):
  with open(path, "r+b") as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 1]))


def plant(the_key, size=1000, vocab=("a", "b"), packed=0):
  """A valid-looking entry for `the_key` (its flatbuffer bytes never run),
  written as `fill` writes one, then pruned to the cap as `fill` does;
  with `packed` bytes of packed weights (`runner.pack_weights`' file)."""
  flatbuffer = os.urandom(size)
  base = compiled_cache.entry_base(the_key)
  os.makedirs(os.path.dirname(base), mode=0o700, exist_ok=True)
  with open(base + ".tflite", "wb") as f:
    f.write(flatbuffer)
  manifest = {"format": compiled_cache.FORMAT,
              "version": compiled_cache.VERSION, "key": the_key,
              "tflite_sha256": hashlib.sha256(flatbuffer).hexdigest(),
              "tflite_bytes": size, "vocab": list(vocab), "tokens": None}
  suffixes = [".json", ".tflite"]
  if packed:
    weights = os.urandom(packed)
    with open(base + compiled_cache.PACKED_SUFFIX, "wb") as f:
      f.write(weights)
    manifest.update(xnnpack_sha256=hashlib.sha256(weights).hexdigest(),
                    xnnpack_bytes=packed)
    suffixes.append(compiled_cache.PACKED_SUFFIX)
  with open(base + ".json", "w", encoding="utf-8") as f:
    json.dump(manifest, f)
  for suffix in suffixes:
    os.chmod(base + suffix, 0o600)
  if hasattr(compiled_cache, "prune"):
    compiled_cache.prune()
  return base


def fake_key(n):
  return {"format": compiled_cache.FORMAT, "test": n}


# ------------------------------------------------------------------ the key


def test_one_changed_byte_of_the_model_file_misses(weights):
  before = compiled_cache.entry_name(compiled_cache.key(weights, RUNTIME))
  flip_a_byte(weights, os.path.getsize(weights) // 2)
  assert compiled_cache.entry_name(compiled_cache.key(weights, RUNTIME)) != (
      before)


@pytest.mark.parametrize("member", ["config.pkl", "chars_vocab.pkl",
                                    "checkpoint", "model.ckpt-599.index",
                                    "model.ckpt-599.data-00000-of-00001"])
@pytest.mark.parametrize("given", ["folder", "prefix"])
def test_every_file_of_a_char_rnn_folder_is_keyed(tmp_path, member, given):
  """A folder is cached, and its vocabulary, config, `checkpoint` and
  weights are all in the key: a changed vocabulary beside unchanged weights
  is another entry (it served the old artifact before)."""
  folder = tmp_path / "save"
  shutil.copytree(CHARRNN, folder)
  path = str(folder if given == "folder" else folder / "model.ckpt-599")
  before = compiled_cache.key(path, RUNTIME)
  assert compiled_cache.key(path, RUNTIME) == before
  flip_a_byte(folder / member, 1)
  assert compiled_cache.entry_name(compiled_cache.key(path, RUNTIME)) != (
      compiled_cache.entry_name(before))


def test_a_copy_keys_as_the_original(tmp_path, weights):
  """A model file's or folder's copy elsewhere is the same entry; its bytes
  written again are too."""
  copy = tmp_path / "copy"
  shutil.copytree(CHARRNN, copy)
  assert compiled_cache.key(str(copy), RUNTIME) == compiled_cache.key(
      CHARRNN, RUNTIME)
  copied_file = tmp_path / "copy.npz"
  shutil.copyfile(weights, copied_file)
  assert compiled_cache.key(str(copied_file), RUNTIME) == compiled_cache.key(
      weights, RUNTIME)
  cli_support.write_model(str(copied_file), seed=3)
  assert compiled_cache.key(str(copied_file), RUNTIME) == compiled_cache.key(
      weights, RUNTIME)


def test_the_weights_dtype_asked_for_is_keyed(weights):
  """rnnstep-generate --weights_dtype=int8 has an entry of its own (the
  model loaded so); without the flag the key is the one of before."""
  plain = compiled_cache.key(weights, RUNTIME)
  assert "weights_dtype" not in plain
  int8 = compiled_cache.key(weights, RUNTIME, "int8")
  assert int8 == dict(plain, weights_dtype="int8")
  assert compiled_cache.entry_name(int8) != compiled_cache.entry_name(plain)


def test_a_textgenrnn_vocabulary_beside_the_weights_is_keyed(tmp_path):
  weights = tmp_path / "textgen_weights.hdf5"
  weights.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
  vocab = tmp_path / "textgen_vocab.json"
  vocab.write_text('{"a": 1}')
  before = compiled_cache.key(str(weights), RUNTIME)
  flip_a_byte(vocab, 2)
  assert compiled_cache.key(str(weights), RUNTIME) != before


def test_the_key_finds_the_files_the_converter_reads(tmp_path):
  """The cache lists a model's files by name, without importing the
  converters (which import TensorFlow); it finds what they read."""
  from rnnstep.convert import textgenrnn  # pylint: disable=g-import-not-at-top
  weights = tmp_path / "x_weights.hdf5"
  weights.write_bytes(b"weights")
  (tmp_path / "x_vocab.json").write_text("{}")
  (tmp_path / "unrelated.txt").write_text("not read")
  assert [path for _, path in compiled_cache.model_files(str(weights))] == [
      str(weights), textgenrnn.vocab_beside(str(weights))]


def test_the_tensorflow_version_is_keyed(weights, monkeypatch):
  """TensorFlow's converter writes the artifact's bytes."""
  before = compiled_cache.key(weights, RUNTIME)
  assert before["tensorflow"] == tuning_cache.installed_tensorflow_version()
  monkeypatch.setattr(tuning_cache, "installed_tensorflow_version",
                      lambda: "0.0.test", raising=False)
  assert compiled_cache.key(weights, RUNTIME) != before


def test_the_runtime_cpu_and_rnnstep_are_keyed(weights, monkeypatch):
  before = compiled_cache.key(weights, RUNTIME)
  assert compiled_cache.key(weights, RUNTIME + ".1") != before
  real = cpu.info()
  monkeypatch.setattr(cpu, "info", lambda: real._replace(name="Another CPU"))
  assert compiled_cache.key(weights, RUNTIME) != before
  monkeypatch.setattr(cpu, "info", lambda: real._replace(
      features=tuple(real.features)[:-1]))
  assert compiled_cache.key(weights, RUNTIME) != before
  monkeypatch.undo()
  monkeypatch.setattr(version, "__version__", "9.9.9")
  assert compiled_cache.key(weights, RUNTIME) != before


def test_one_changed_byte_of_rnnstep_s_sources_misses(tmp_path):
  root = tmp_path / "rnnstep"
  shutil.copytree(os.path.dirname(rnnstep.__file__), root,
                  ignore=shutil.ignore_patterns("__pycache__", "data"))
  before = compiled_cache.sources_digest(str(root))
  assert before == compiled_cache.sources_digest()
  flip_a_byte(root / "decoding" / "sampling.py", 100)
  assert compiled_cache.sources_digest(str(root)) != before


def test_a_remembered_digest_still_sees_one_changed_byte(cache, weights,
                                                        monkeypatch):
  """Digests are remembered by the file's stat (a warm run does not re-hash
  unchanged files); a write changes the ctime, which `touch -r` cannot set
  back, so a changed byte with its old mtime restored still misses."""
  compiled_cache.ensure_directory()
  # The file was just written (and its ctime cannot be set back): remember
  # it all the same, as if the racy window were over.
  monkeypatch.setattr(compiled_cache, "_RACY_SECONDS", -1.0)
  before = compiled_cache.key(weights, RUNTIME)
  with open(os.path.join(compiled_cache.directory(),
                         compiled_cache.DIGESTS_FILE), encoding="utf-8") as f:
    assert os.path.abspath(weights) in json.load(f)
  old = os.stat(weights)
  flip_a_byte(weights, os.path.getsize(weights) // 3)
  os.utime(weights, ns=(old.st_atime_ns, old.st_mtime_ns))
  assert compiled_cache.key(weights, RUNTIME) != before


@pytest.mark.parametrize("suffix", [".tflite", ".xnnpack"])
def test_a_remembered_entry_digest_still_sees_one_changed_byte(
    cache, suffix, monkeypatch):
  """A warm run does not hash an entry's files again while their stat is
  the one their digest was taken with; a changed byte (its mtime restored)
  is still a miss."""
  monkeypatch.setattr(compiled_cache, "_RACY_SECONDS", -1.0)  # As above.
  base = plant(fake_key(1), packed=100)
  compiled_cache.open_entry(fake_key(1)).close()
  with open(os.path.join(compiled_cache.directory(),
                         compiled_cache.DIGESTS_FILE), encoding="utf-8") as f:
    assert base + suffix in json.load(f)
  hashed = []
  with monkeypatch.context() as patch:
    patch.setattr(compiled_cache, "_stream_sha256",
                  lambda f: hashed.append(f.name) or "0" * 64)
    compiled_cache.open_entry(fake_key(1)).close()  # Remembered: no hash.
  assert hashed == []
  old = os.stat(base + suffix)
  flip_a_byte(base + suffix, 50)
  os.utime(base + suffix, ns=(old.st_atime_ns, old.st_mtime_ns))
  with pytest.raises(compiled_cache.Miss, match="sha256"):
    compiled_cache.open_entry(fake_key(1))


def test_a_digests_file_others_can_write_is_ignored(cache, weights):
  folder = compiled_cache.ensure_directory()
  st = os.stat(weights)
  stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
  path = os.path.join(folder, compiled_cache.DIGESTS_FILE)
  with open(path, "w", encoding="utf-8") as f:
    json.dump({os.path.abspath(weights): [stamp, "0" * 64]}, f)
  os.chmod(path, 0o600)
  assert compiled_cache.model_digest(weights, compiled_cache._Digests()) == [  # pylint: disable=protected-access
      ["", "0" * 64]]  # Trusted, so used: the check below means something.
  os.chmod(path, 0o666)
  assert compiled_cache.model_digest(weights, compiled_cache._Digests()) == [  # pylint: disable=protected-access
      ["", compiled_cache.file_sha256(weights)]]


# ------------------------------------------------------- bounded and clean


def test_the_cap_evicts_the_least_recently_used_first(cache, monkeypatch):
  keys = [fake_key(n) for n in range(4)]
  for n, the_key in enumerate(keys[:3]):
    base = plant(the_key, size=400_000)
    os.utime(base + ".json", (1000 + n, 1000 + n))  # Used in order 0, 1, 2.
  compiled_cache.lookup(keys[0])  # Now 0 is the most recently used.
  monkeypatch.setenv("RNNSTEP_CACHE_MAX_MB", "1")  # Room for two.
  plant(keys[3], size=400_000)
  kept = [n for n, the_key in enumerate(keys)
          if os.path.exists(compiled_cache.entry_base(the_key) + ".json")]
  assert kept == [0, 3]
  assert not os.path.exists(compiled_cache.entry_base(keys[1]) + ".tflite")
  total = sum(e.bytes for e in compiled_cache.entries())
  assert total <= 1 << 20


def test_the_default_cap_is_a_few_hundred_megabytes(monkeypatch):
  monkeypatch.delenv("RNNSTEP_CACHE_MAX_MB", raising=False)
  assert 200 << 20 <= compiled_cache.max_bytes() <= 1 << 30
  monkeypatch.setenv("RNNSTEP_CACHE_MAX_MB", "64")
  assert compiled_cache.max_bytes() == 64 << 20


def test_the_default_cap_keeps_twice_the_largest_artifact(cache):
  """Unset, the cap follows the models run: the 0.1B RWKV-7 (729 MB of
  float32 weights) is admitted, and a kept artifact of 400 MB keeps the
  cache at 800 MB; set, $RNNSTEP_CACHE_MAX_MB is the cap."""
  default = tuning_cache.DEFAULT_MAX_MB << 20
  assert compiled_cache.max_bytes() == default
  assert compiled_cache.max_bytes(729 << 20) == 2 * (729 << 20)
  assert compiled_cache.size_refusal(729 << 20, None) == (None, False)
  folder = compiled_cache.ensure_directory()
  with open(os.path.join(folder, "ab" * 20 + ".tflite"), "wb") as f:
    f.truncate(400 << 20)  # Sparse: no disk written.
  assert compiled_cache.max_bytes() == 800 << 20
  assert compiled_cache.max_bytes(100 << 20) == 800 << 20


def test_the_default_cap_keeps_two_entries_of_the_largest_size(cache):
  """Two entries as large as the largest (a model's float32 and 16-bit
  artifacts, the same bytes) both stay, their manifests counted: a manifest
  holds the vocabulary (645 kB for the world vocabulary's), and a cap of
  twice the flatbuffers and packed weights alone evicted the older of the
  0.1B RWKV-7's two, so that each run of the other rebuilt its own."""
  compiled_cache.ensure_directory()
  for n in (1, 2):
    compiled_cache.write_entry(fake_key(n), flatbuffer=b"flatbuffer",
                               vocab=[f"token {i}" for i in range(20_000)])
    with open(compiled_cache.entry_base(fake_key(n)) + ".tflite", "r+b") as f:
      f.truncate(300 << 20)  # Sparse: no disk written.
  assert compiled_cache.prune() == []
  assert len(compiled_cache.entries()) == 2
  assert compiled_cache.max_bytes() == 2 * compiled_cache.entries()[0].bytes


# The packing child (`compiled_fill._PACK_CHILD`'s argv: the
# flatbuffer, then the file to write), made up: 600 kB of packed weights, or
# half a file and a failure.
PACKS = {"made": "import sys; open(sys.argv[3], 'wb').write(bytes(600_000))",
         "failed": ("import sys; open(sys.argv[3], 'wb').write(b'half'); "
                    "sys.exit(1)")}


@pytest.mark.light_process  # Its packer: a `python -I -c` writing bytes.
@pytest.mark.parametrize("pack, cap_mb, kept", [
    ("made", None, True), ("made", "2", True), ("made", "1", False),
    ("failed", None, False)])
def test_packed_weights_are_kept_whole_and_under_the_cap(cache, monkeypatch,
                                                         pack, cap_mb, kept):
  """A large artifact's weights packed for XNNPACK are kept (0600, in the
  manifest, run) only where the child made them and the entry stays under
  an explicit cap (1 MB holds the 600 kB flatbuffer, not both; the default
  cap grows to twice the entry); otherwise the entry is its flatbuffer
  alone, valid, and no file of the packing is left."""
  monkeypatch.setattr(compiled_cache.runner, "BUILTIN_KERNELS_FROM_BYTES", 0)
  monkeypatch.setattr(compiled_fill, "_PACK_CHILD", PACKS[pack])
  if cap_mb:
    monkeypatch.setenv(compiled_cache.MAX_MB_ENV, cap_mb)
  compiled_cache.ensure_directory()
  compiled_cache.write_entry(fake_key(1), flatbuffer=os.urandom(600_000),
                             vocab=["a", "b"],
                             pack=compiled_fill.packed_weights)
  base = compiled_cache.entry_base(fake_key(1))
  with compiled_cache.open_entry(fake_key(1)) as artifact:
    assert (artifact.weight_cache is not None) == kept
    assert ("xnnpack_sha256" in artifact.manifest) == kept
  assert os.path.exists(base + compiled_cache.PACKED_SUFFIX) == kept
  assert not [name for name in os.listdir(os.path.dirname(base))
              if name.endswith(".tmp")]
  if kept:
    packed = os.stat(base + compiled_cache.PACKED_SUFFIX)
    assert stat.S_IMODE(packed.st_mode) == 0o600
    if not cap_mb:  # The default cap counts the packed weights (sparse).
      os.truncate(base + compiled_cache.PACKED_SUFFIX, 300 << 20)
      assert compiled_cache.max_bytes() == 2 * (
          600_000 + (300 << 20) + os.path.getsize(base + ".json"))


def test_a_fill_leaves_no_lock_and_stale_locks_are_removed(cache, weights,
                                                          monkeypatch):
  the_key = compiled_cache.key(weights, RUNTIME)
  base = compiled_cache.entry_base(the_key)
  os.makedirs(os.path.dirname(base), mode=0o700)
  with open(base + ".lock", "w"):
    pass  # An old run's lock, not held.
  monkeypatch.setattr(compiled_fill, "_export",
                      lambda path, *_: (b"flatbuffer", ["a"], None, False, 0),
                      raising=False)
  assert compiled_fill.fill(weights, the_key) == "built"
  assert sorted(set(os.listdir(os.path.dirname(base))) - {
      compiled_cache.DIGESTS_FILE}) == [
      os.path.basename(base) + ".json", os.path.basename(base) + ".tflite"]
  stale = compiled_cache.entry_base(fake_key(9)) + ".lock"
  with open(stale, "w"):
    pass
  compiled_cache.prune()
  assert not os.path.exists(stale)


def test_a_failed_export_is_recorded_and_not_retried(cache, weights,
                                                     monkeypatch):
  """Any exception, not only ValueError: recorded with its reason (what
  --verbose shows), and the miss asks for no rebuild."""
  the_key = compiled_cache.key(weights, RUNTIME)
  os.makedirs(os.path.dirname(compiled_cache.entry_base(the_key)), mode=0o700)

  def broken(path, *_):
    raise RuntimeError("converter crashed")
  monkeypatch.setattr(compiled_fill, "_export", broken, raising=False)
  from rnnstep.litert import export as litert  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(litert, "convert", broken)
  assert compiled_fill.fill(weights, the_key) == "failed"
  with pytest.raises(compiled_cache.Miss,
                     match="RuntimeError: converter crashed") as miss:
    compiled_cache.lookup(the_key)
  assert not miss.value.rebuild


@pytest.mark.slow  # The fill's export child: a fresh interpreter.
def test_a_model_the_export_refuses_is_recorded_and_not_rebuilt(
    cache, tmp_path):
  """The child's work, in this process: a windowed model gets a manifest
  that says why, a miss that asks for no rebuild, and no flatbuffer."""
  weights = str(tmp_path / "windowed.npz")
  cli_support.write_model(weights, seed=3, window=8)
  the_key = compiled_cache.key(weights, RUNTIME)
  base = compiled_cache.entry_base(the_key)
  assert compiled_fill.fill(weights, the_key) == "no cache directory"
  os.makedirs(os.path.dirname(base))
  assert compiled_fill.fill(weights, the_key) == "unsupported"
  with pytest.raises(compiled_cache.Miss, match="window=8") as miss:
    compiled_cache.lookup(the_key)
  assert not miss.value.rebuild
  assert not os.path.exists(base + ".tflite")


def test_the_warm_path_names_a_recorded_failure_and_rebuilds_nothing(
    cache, weights, monkeypatch):
  """What rnnstep-generate's warm path does with a recorded failure, decided
  before TensorFlow would load: the reason, and no key to build."""
  monkeypatch.setenv("RNNSTEP_COMPILED_CACHE", "on")
  # Decided before the interpreter would run: none is needed.
  monkeypatch.setattr(warm, "interpreter_installed", lambda: True)
  monkeypatch.setattr(compiled_cache, "runtime_version", lambda: "0.test")
  the_key = compiled_cache.key(weights, "0.test")
  compiled_cache.ensure_directory()
  compiled_cache.write_entry(the_key, failed="RuntimeError: converter crashed")
  decoding = {option.name: option.default for option in options_lib.OPTIONS}
  with pytest.raises(warm.NotServed) as why:
    warm.generate(os.path.abspath(weights), ["ROMEO:"], 1, 5, seed=1,
                  decoding=decoding)
  assert "export failed (RuntimeError: converter crashed)" in str(why.value)
  assert why.value.fill_key is None


def test_cache_info_lists_and_clear_removes(cache):
  plant(fake_key(1), size=3000)
  plant(fake_key(2), size=5000)
  listed = compiled_cache.entries()
  assert sorted(e.bytes > 4000 for e in listed) == [False, True]
  assert {e.name for e in listed} == {
      compiled_cache.entry_name(fake_key(n)) for n in (1, 2)}
  assert compiled_cache.clear() == (2, sum(e.bytes for e in listed))
  assert compiled_cache.entries() == []


def test_cache_info_names_an_entry_s_weights_dtype(cache):
  """A model's float32 and 16-bit entries have the same model path; the
  listing says which holds which weights."""
  compiled_cache.ensure_directory()
  for n, weights_dtype in ((1, None), (2, "float16")):
    the_key = dict(fake_key(n), **({"weights_dtype": weights_dtype}
                                   if weights_dtype else {}))
    compiled_cache.write_entry(the_key, flatbuffer=b"flatbuffer",
                               vocab=["a"], model_path="m.npz")
  assert sorted(map(str, (e.weights_dtype for e in compiled_cache.entries()))
                ) == ["None", "float16"]
  out = io.StringIO()
  assert cache_commands.run(info=True, clear=False, out=out) == 0
  lines = [line for line in out.getvalue().splitlines() if "m.npz" in line]
  assert sorted(line.endswith("m.npz --weights_dtype=float16")
                for line in lines) == [False, True]


@pytest.mark.slow  # Two fresh interpreters, no TensorFlow.
def test_the_cache_info_and_cache_clear_flags(cache):
  plant(fake_key(1), size=3000)
  env = dict(os.environ, PYTHONPATH=REPO, RNNSTEP_COMPILED_CACHE="on")
  run = lambda *args: subprocess.run(
      [sys.executable, "-m", "rnnstep.cli.generate", *args],
      capture_output=True, text=True, env=env, timeout=120, check=False)
  info = run("--cache_info")
  assert info.returncode == 0, info.stderr
  assert compiled_cache.entry_name(fake_key(1)) in info.stdout
  assert "1 entry" in info.stdout and str(cache) in info.stdout
  assert "(twice the largest entry, at least 512 MB;" in info.stdout
  set_cap = subprocess.run(
      [sys.executable, "-m", "rnnstep.cli.generate", "--cache_info"],
      capture_output=True, text=True, timeout=120, check=False,
      env=dict(env, RNNSTEP_CACHE_MAX_MB="64"))
  assert "cap 64.0 MB ($RNNSTEP_CACHE_MAX_MB)" in set_cap.stdout
  cleared = run("--cache_clear")
  assert cleared.returncode == 0, cleared.stderr
  assert "removed 1 entry" in cleared.stdout
  assert compiled_cache.entries() == []


def test_an_entry_for_another_key_is_not_used(cache):
  """Each field of the key names another entry; even under this key's name,
  a manifest written for another key misses."""
  the_key = {"format": compiled_cache.FORMAT, "model": [["", "1" * 64]],
             "rnnstep": "1.0", "cpu": "This CPU", "runtime": "ai-edge-litert 1",
             "tensorflow": "2.0"}
  plant(the_key)
  for field, other in (("rnnstep", "0.0.0"), ("cpu", "Another CPU"),
                       ("runtime", "ai-edge-litert 0.0"),
                       ("model", [["", "0" * 64]]),
                       ("tensorflow", "0.0")):
    changed = dict(the_key, **{field: other})
    assert compiled_cache.entry_name(changed) != compiled_cache.entry_name(
        the_key)
    with pytest.raises(compiled_cache.Miss, match="no compiled artifact"):
      compiled_cache.lookup(changed)
    base = compiled_cache.entry_base(changed)
    flatbuffer, manifest = compiled_cache.lookup(the_key)
    with open(base + ".tflite", "wb") as f:
      f.write(flatbuffer)
    with open(base + ".json", "w", encoding="utf-8") as f:
      json.dump(manifest, f)
    with pytest.raises(compiled_cache.Miss, match="another key"):
      compiled_cache.lookup(changed)
    os.unlink(base + ".tflite")
    os.unlink(base + ".json")


@pytest.mark.parametrize("field, value", [
    ("tflite_bytes", "1000"), ("vocab", []), ("vocab", ["a", 1]),
    ("tokens", 3), ("primes_in_bulk", "yes"), ("primes_in_bulk", 1),
    ("prime_bytes", "1"), ("prime_bytes", -1), ("prime_bytes", True),
    ("prime_bytes", 1.5), ("xnnpack_bytes", None)])
def test_a_manifest_field_of_another_type_misses_as_corrupt(cache, field,
                                                            value):
  """What a warm run reads of a manifest is checked before it is used (the
  prompt crossover's `primes_in_bulk` a bool, `prime_bytes` an int >= 0;
  missing: false, 0)."""
  base = plant(fake_key(1), packed=100)
  _, manifest = compiled_cache.lookup(fake_key(1))
  assert "primes_in_bulk" not in manifest  # Neither written by `plant`.
  with open(base + ".json", "w", encoding="utf-8") as f:
    json.dump(dict(manifest, **{field: value}), f)
  with pytest.raises(compiled_cache.Miss, match="cache manifest corrupt"):
    compiled_cache.lookup(fake_key(1))


# ------------------------------------------------------------------ isolated


def test_cache_folders_are_private(cache):
  directory = compiled_cache.ensure_directory()
  assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
  base = plant(fake_key(1))
  for suffix in (".json", ".tflite"):
    assert stat.S_IMODE(os.stat(base + suffix).st_mode) & 0o077 == 0


@pytest.mark.parametrize("target", [".json", ".tflite", ".xnnpack", "folder"])
def test_an_entry_others_can_write_is_ignored(cache, target):
  base = plant(fake_key(1), packed=100)
  compiled_cache.lookup(fake_key(1))
  path = os.path.dirname(base) if target == "folder" else base + target
  os.chmod(path, os.stat(path).st_mode | 0o022)
  with pytest.raises(compiled_cache.Miss, match="writable by others"):
    compiled_cache.lookup(fake_key(1))


@pytest.mark.parametrize("suffix", [".tflite", ".xnnpack"])
def test_an_entry_s_files_are_checked_through_the_files_it_runs(cache,
                                                                suffix):
  """`open_entry` checks the flatbuffer and its packed weights (size and
  sha256) and hands the runtime paths to the files it checked (Linux:
  /proc/self/fd/N), so a file put in their place afterwards is not run."""
  base = plant(fake_key(1), packed=100)
  with open(base + suffix, "rb") as f:
    checked = f.read()
  with compiled_cache.open_entry(fake_key(1)) as artifact:
    path = {".tflite": artifact.path,
            ".xnnpack": artifact.weight_cache}[suffix]
    os.replace(plant(fake_key(2), packed=100) + suffix, base + suffix)
    with open(path, "rb") as f:
      assert f.read() == checked or os.name != "posix"
  plant(fake_key(1), packed=100)
  compiled_cache.open_entry(fake_key(1)).close()
  flip_a_byte(base + suffix, 50)
  with pytest.raises(compiled_cache.Miss, match="sha256"):
    compiled_cache.open_entry(fake_key(1))
  with open(base + suffix, "r+b") as f:
    f.truncate(99)
  with pytest.raises(compiled_cache.Miss, match="sha256"):
    compiled_cache.open_entry(fake_key(1))


def test_an_entry_another_user_owns_is_ignored(cache, monkeypatch):
  """Ownership is checked against the user running (`_user`): the test
  pretends to be another user; `os.chown` needs root (the next test)."""
  base = plant(fake_key(1))
  compiled_cache.lookup(fake_key(1))
  owner = os.stat(base + ".json").st_uid
  monkeypatch.setattr(compiled_cache, "_user", lambda: owner + 1,
                      raising=False)
  with pytest.raises(compiled_cache.Miss, match="owned by another user"):
    compiled_cache.lookup(fake_key(1))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0,
                    reason="os.chown to another user needs root")
@pytest.mark.parametrize("target", [".json", ".tflite", ".xnnpack"])
def test_an_entry_chowned_to_another_user_is_ignored(cache, target):
  base = plant(fake_key(1), packed=100)
  os.chown(base + target, 12345, -1)
  with pytest.raises(compiled_cache.Miss, match="owned by another user"):
    compiled_cache.lookup(fake_key(1))


def _wait(predicate, what):
  deadline = time.monotonic() + FILL_TIMEOUT
  while not predicate():
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.5)


@pytest.mark.slow  # A background fill (TensorFlow) in a fresh interpreter.
def test_the_child_runs_isolated_from_the_working_directory(
    cache, tmp_path, monkeypatch):
  """A `numpy.py` in the directory a cold run starts in is not imported by
  the background child (it was: `python -m` put the directory first). The
  child runs to its end: it imports TensorFlow and reads the model with
  numpy, and records that the export refuses a windowed model (the end
  that needs no conversion)."""
  weights = str(tmp_path / "windowed.npz")
  cli_support.write_model(weights, seed=3, window=8)
  work = tmp_path / "work"
  work.mkdir()
  marker = tmp_path / "planted_numpy_ran"
  (work / "numpy.py").write_text(
      f"open({str(marker)!r}, 'w').close()\n"
      "raise ImportError('planted numpy.py imported')\n")
  monkeypatch.chdir(work)
  monkeypatch.setenv("PYTHONPATH", REPO)
  the_key = compiled_cache.key(weights, RUNTIME)

  def ended():
    try:
      compiled_cache.lookup(the_key)
      return True
    except compiled_cache.Miss as miss:
      return "window=8" in str(miss) or marker.exists()
  compiled_fill.spawn_fill(weights, the_key)
  _wait(ended, "the background child")
  assert not marker.exists()
  with pytest.raises(compiled_cache.Miss, match="window=8") as miss:
    compiled_cache.lookup(the_key)
  assert not miss.value.rebuild


def test_a_second_filler_leaves_while_the_first_holds_the_lock(cache,
                                                               weights):
  import fcntl  # pylint: disable=g-import-not-at-top
  the_key = compiled_cache.key(weights, RUNTIME)
  base = compiled_cache.entry_base(the_key)
  os.makedirs(os.path.dirname(base))
  with open(base + ".lock", "a+b") as lock:
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    assert compiled_fill.fill(weights, the_key) == (
        "another process is building this entry")
  assert sorted(os.listdir(os.path.dirname(base))) == [
      os.path.basename(base) + ".lock"]


@pytest.mark.slow  # Two background exports at once.
def test_two_children_filling_one_entry_leave_one_good_entry(cache, weights):
  the_key = compiled_cache.key(weights, RUNTIME)
  compiled_cache.ensure_directory()
  # Two processes of their own, forked from an interpreter that has imported
  # TensorFlow (tests/support/forkserver.py): the lock between them is the
  # point here, not a fresh interpreter's start (the isolated child's test
  # above starts one as `spawn_fill` does).
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  command = [sys.executable, "-m", "rnnstep.litert.fill", weights,
             json.dumps(the_key, sort_keys=True)]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = list(pool.map(lambda _: forkserver.run(
        command, capture_output=True, text=True, env=env, timeout=600,
        check=False), range(2)))
  said = sorted(r.stdout.strip() for r in results)
  assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
  assert said[0] in ("already valid", "another process is building this "
                     "entry", "built"), said
  assert "built" in said
  flatbuffer, manifest = compiled_cache.lookup(the_key)
  assert len(flatbuffer) == manifest["tflite_bytes"]
  name = compiled_cache.entry_name(the_key)
  assert sorted(set(os.listdir(os.path.dirname(
      compiled_cache.entry_base(the_key)))) - {compiled_cache.DIGESTS_FILE}
                ) == [f"{name}.json", f"{name}.tflite"]


def test_an_artifact_over_the_cap_or_memory_is_refused_before_converting(
    monkeypatch):
  """The flatbuffer holds every weight at least once: weights over the cap
  are refused (and recorded), a conversion needing more memory than is
  available is not started (and not recorded: memory frees up)."""
  monkeypatch.setenv(compiled_cache.MAX_MB_ENV, "512")
  weights = 644 << 20  # An 8-block, 768-wide RWKV-7 (an 886 MB artifact).
  assert compiled_cache.size_refusal(weights, None) == (
      "its float32 weights alone (644 MB) exceed the cache's cap "
      "(RNNSTEP_CACHE_MAX_MB=512)", True)
  assert compiled_cache.size_refusal(10 << 20, 64 << 30) == (None, False)
  reason, record = compiled_cache.size_refusal(100 << 20, 1 << 30)
  assert reason == "converting needs about 1.2 GB, 1.0 GB is available"
  assert not record
  monkeypatch.setenv(compiled_cache.MAX_MB_ENV, "0.05")
  assert compiled_cache.size_refusal(60 << 10, None)[0] == (
      "its float32 weights alone (0.059 MB) exceed the cache's cap "
      "(RNNSTEP_CACHE_MAX_MB=0.05)")
