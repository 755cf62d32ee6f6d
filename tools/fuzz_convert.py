"""Mutation fuzzer for the converter's readers (a developer tool, not part of CI).

Takes real Keras and PyTorch files as seeds, mutates them (byte flips and overwrites,
truncation, spliced or repeated chunks) and feeds each mutant to
`rnnstep.convert.describe` and `read_weights`. A clean refusal is a ValueError
or OSError with a one-line message; anything else (another exception, a
multi-line message, a crash or a hang of the worker) is a finding, saved with
its input under --findings.

  python tools/fuzz_convert.py --minutes=10
  python tools/fuzz_convert.py --seeds=DIR --iterations=5000

Without --seeds, seed files are made first by `tests/support/keras_models.py` (tf_keras
in a subprocess, TF_USE_LEGACY_KERAS=1): Keras 2 .h5 (weights and full), .keras
and TF checkpoints (--nokeras skips them). The PyTorch fixtures in
tests/data/torch (torch.save zip and legacy, .safetensors, whole pickled
modules) are added unless --notorch, and the char-rnn-tensorflow save
directories in tests/data/charrnn_tf (a TF1 checkpoint with config.pkl and
chars_vocab.pkl; each mutant is a whole directory with one file mutated)
unless --nocharrnn. Pickles (a zip's data.pkl, a legacy file, char-rnn-tensorflow's .pkl files)
are also mutated by renaming a GLOBAL to something that would run code
(os.system, eval, getattr, ...): such a mutant must be refused, and the worker
runs in an empty directory that must stay empty (a call that ran would leave a
file there; anything left is a finding).

  python tools/fuzz_convert.py --nokeras --minutes=5     # PyTorch readers only
"""

import glob
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from absl import app
from absl import flags

_SEEDS = flags.DEFINE_string("seeds", None, "Directory of seed files (default: "
                             "build them with tests/support/keras_models.py).")
_FINDINGS = flags.DEFINE_string("findings", "/tmp/rnnstep_fuzz_findings",
                                "Where failing inputs are saved.")
_MINUTES = flags.DEFINE_float("minutes", 5.0, "Time budget.")
_ITERATIONS = flags.DEFINE_integer("iterations", 0, "Stop after this many "
                                   "mutants (0: only the time budget).")
_SEED = flags.DEFINE_integer("seed", 0, "Random seed of the mutator.")
_KERAS = flags.DEFINE_bool("keras", True, "Without --seeds: build Keras seeds.")
_TORCH = flags.DEFINE_bool("torch", True, "Add the PyTorch fixtures of "
                           "tests/data/torch as seeds.")
_CHARRNN = flags.DEFINE_bool("charrnn", True, "Add the char-rnn-tensorflow "
                             "save directories of tests/data/charrnn_tf as "
                             "seeds.")
_PER_WORKER = 200  # Mutants per worker process (a crash loses at most one).

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_SEEDS = os.path.join(REPO, "tests", "data", "torch")
CHARRNN_SEEDS = os.path.join(REPO, "tests", "data", "charrnn_tf")
CHARRNN_FILES = ("checkpoint", "config.pkl", "chars_vocab.pkl")
SEED_SUFFIXES = (".h5", ".keras", ".pt", ".pth", ".bin", ".safetensors")

WORKER = r"""
import os, sys, traceback
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
for name in ("keras", "tf_keras"):
  sys.modules[name] = None
from rnnstep import convert
status_path = sys.argv[1]
for line in sys.stdin:
  path = line.strip()
  with open(status_path, "w") as f:
    f.write(path)
  for fn in (convert.describe, convert.read_weights):
    try:
      fn(path)
      verdict = "ok"
    except (ValueError, OSError) as e:
      verdict = "refused" if "\n" not in str(e) else "multiline: " + repr(str(e))
    except Exception:
      verdict = "BUG: " + traceback.format_exc().replace("\n", " | ")
    print(verdict, flush=True)
"""


def make_seeds(directory):
  env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
  subprocess.run([sys.executable, "-m", "tests.support.keras_models", "tf_keras",
                  directory], cwd=REPO, env=env, check=True)


def seed_files(directory):
  """Single-file inputs (checkpoints as their .index/.data pair prefix)."""
  files = []
  for path in glob.glob(os.path.join(directory, "**", "*"), recursive=True):
    if path.endswith(SEED_SUFFIXES) and os.path.isfile(path):
      files.append([path])
    elif path.endswith(".index"):
      prefix = path[:-len(".index")]
      files.append([path] + glob.glob(prefix + ".data-*"))
  return files


def charrnn_seeds(directory):
  """Save directories, each as its files with the `checkpoint` file first
  (which marks a seed that is a directory; its reference.npz is left out)."""
  seeds = []
  for config in sorted(glob.glob(os.path.join(directory, "*", "config.pkl"))):
    save_dir = os.path.dirname(config)
    seeds.append([os.path.join(save_dir, name) for name in CHARRNN_FILES]
                 + sorted(glob.glob(os.path.join(save_dir, "*.index")))
                 + sorted(glob.glob(os.path.join(save_dir, "*.data-*"))))
  return seeds


def mutate(data: bytes, rng: random.Random) -> bytes:
  data = bytearray(data)
  for _ in range(rng.randint(1, 4)):
    choice = rng.random()
    if not data:
      break
    position = rng.randrange(len(data))
    if choice < 0.4:
      data[position] ^= 1 << rng.randrange(8)
    elif choice < 0.6:
      data[position:position + 4] = rng.randbytes(4)
    elif choice < 0.7:
      del data[position:]
    elif choice < 0.85:
      size = rng.randint(1, 64)
      data[position:position] = data[rng.randrange(len(data)):][:size]
    else:
      data[position:position + 8] = rng.choice(
          [b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff"])
  return bytes(data)


# Callables a hostile pickle might name (GLOBAL "module\nname\n"); the
# arguments are whatever the renamed call had (a marker file is created only
# if the call really ran, e.g. os.system('touch ...') from a string argument).
HOSTILE_GLOBALS = [b"posix\nsystem\n", b"builtins\neval\n", b"builtins\nexec\n",
                   b"builtins\ngetattr\n", b"subprocess\nPopen\n",
                   b"builtins\nopen\n", b"copyreg\n_reconstructor\n",
                   b"torch\nload\n", b"__builtin__\nset\n"]
_GLOBAL = re.compile(rb"c[A-Za-z_][\w.]*\n[A-Za-z_][\w.]*\n")


def mutate_globals(data: bytes, rng: random.Random) -> bytes:
  """Renames one GLOBAL of a pickle to a hostile callable (or a byte mutant
  when there is none)."""
  found = list(_GLOBAL.finditer(data))
  if not found:
    return mutate(data, rng)
  match = rng.choice(found)
  return (data[:match.start() + 1] + rng.choice(HOSTILE_GLOBALS)
          + data[match.end():])


def mutate_pickle(data: bytes, rng: random.Random) -> bytes:
  return (mutate_globals(data, rng) if rng.random() < 0.3
          else mutate(data, rng))


def mutate_zip_member(data: bytes, rng: random.Random) -> bytes:
  """Mutates one member of a torch.save zip and rewrites the archive, so the
  mutant passes the zip CRC checks and reaches the unpickler and tensor
  checks (byte flips of the archive itself mostly fail the CRC)."""
  try:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
      members = [(info, archive.read(info)) for info in archive.infolist()]
  except (zipfile.BadZipFile, OSError, ValueError):
    return mutate(data, rng)
  pickles = [i for i, (info, _) in enumerate(members)
             if info.filename.endswith("data.pkl")]
  target = (rng.choice(pickles) if pickles and rng.random() < 0.7
            else rng.randrange(len(members)))
  out = io.BytesIO()
  with zipfile.ZipFile(out, "w") as archive:
    for i, (info, content) in enumerate(members):
      if i == target:
        content = (mutate_pickle(content, rng) if
                   info.filename.endswith("data.pkl") else mutate(content, rng))
      archive.writestr(info.filename, content)
  return out.getvalue()


def main(argv):
  del argv
  rng = random.Random(_SEED.value)
  work = tempfile.mkdtemp(prefix="rnnstep_fuzz_")
  seeds_dir = _SEEDS.value or os.path.join(work, "seeds")
  if not _SEEDS.value and _KERAS.value:
    make_seeds(seeds_dir)
  seeds = seed_files(seeds_dir) if os.path.isdir(seeds_dir) else []
  if _TORCH.value:
    seeds += seed_files(TORCH_SEEDS)
  if _CHARRNN.value:
    seeds += charrnn_seeds(CHARRNN_SEEDS)
  if not seeds:
    raise app.UsageError("no seed files")
  print(f"{len(seeds)} seed inputs from {seeds_dir}"
        f"{' and ' + TORCH_SEEDS if _TORCH.value else ''}"
        f"{' and ' + CHARRNN_SEEDS if _CHARRNN.value else ''}")
  os.makedirs(_FINDINGS.value, exist_ok=True)
  deadline = time.time() + 60 * _MINUTES.value
  counts = {"ok": 0, "refused": 0, "findings": 0}
  done = 0
  while time.time() < deadline and (not _ITERATIONS.value
                                     or done < _ITERATIONS.value):
    batch = []
    for i in range(_PER_WORKER):
      files = rng.choice(seeds)
      target = rng.randrange(len(files))
      case_dir = os.path.join(work, f"case{done + i}")
      # A char-rnn-tensorflow seed is a directory: copied as case_dir/save.
      save_dir = (os.path.join(case_dir, "save")
                  if os.path.basename(files[0]) == "checkpoint" else None)
      into = save_dir or case_dir
      os.makedirs(into)
      for j, path in enumerate(files):
        data = open(path, "rb").read()
        with open(os.path.join(into, os.path.basename(path)), "wb") as f:
          if j != target:
            f.write(data)
          elif path.endswith((".pt", ".pth", ".bin")) and data[:2] == b"PK" and (
              rng.random() < 0.5):
            f.write(mutate_zip_member(data, rng))
          elif path.endswith((".pt", ".pth", ".bin")) and data[:1] == b"\x80":
            f.write(mutate_pickle(data, rng))  # The legacy format.
          elif path.endswith(".pkl"):
            f.write(mutate_pickle(data, rng))
          else:
            f.write(mutate(data, rng))
      main_file = save_dir or os.path.join(case_dir,
                                           os.path.basename(files[0]))
      if main_file.endswith(".index"):
        main_file = main_file[:-len(".index")]
      batch.append(main_file)
    status = os.path.join(work, "status")
    sandbox = os.path.join(work, "sandbox")  # The worker's cwd: stays empty.
    os.makedirs(sandbox, exist_ok=True)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, status],
                              cwd=sandbox, env=dict(os.environ, PYTHONPATH=REPO),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
      out, _ = worker.communicate("\n".join(batch) + "\n", timeout=600)
    except subprocess.TimeoutExpired:
      worker.kill()
      out, _ = worker.communicate()
    verdicts = out.splitlines()
    left = os.listdir(sandbox)
    if left:  # Something a file asked for ran.
      counts["findings"] += 1
      print(f"FINDING: the worker left {left} in its directory (batch "
            f"{batch[0]} ...)", flush=True)
      shutil.rmtree(sandbox)
    for index, path in enumerate(batch):
      pair = verdicts[2 * index:2 * index + 2]
      if len(pair) < 2:  # The worker died or hung on this one.
        reason = f"worker exit {worker.returncode}"
        _save(path, reason)
        counts["findings"] += 1
        break
      for verdict in pair:
        if verdict in ("ok", "refused"):
          counts[verdict] += 1
        else:
          _save(path, verdict)
          counts["findings"] += 1
    done += len(batch)
    for path in batch:
      shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    print(f"{done} mutants: {counts}", flush=True)
  shutil.rmtree(work, ignore_errors=True)
  print(f"done: {done} mutants, {counts}; findings in {_FINDINGS.value}")


def _save(path, reason):
  name = f"finding{len(os.listdir(_FINDINGS.value)):04d}"
  target = os.path.join(_FINDINGS.value, name)
  shutil.copytree(os.path.dirname(path), target)
  with open(os.path.join(target, "REASON.txt"), "w") as f:
    f.write(f"{os.path.basename(path)}\n{reason}\n")
  print(f"FINDING {name}: {reason[:300]}", flush=True)


if __name__ == "__main__":
  app.run(main)
