"""rnnstep-generate's warm path (rnnstep/litert/warm.py) through the command.

A cold run generates on TensorFlow and leaves a detached child that exports
the model to the cache; a warm run of a request the artifact serves prints the
same bytes without importing TensorFlow. Every text is checked against
`rnnstep.generate` in this process, on one small model file. The subprocesses
that import TensorFlow (cold, --nocache, a fallback, a corrupt entry) are the
slow part: the first three run together, once. Which requests the artifact
serves is decided from the flags alone, without the interpreter; the cache
itself (its key, lookup, fill and trust) is tests/test_cache_trust.py's.
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.support import cli as cli_support
from tests.support import forkserver
import rnnstep
from rnnstep.litert import cache as compiled_cache
from rnnstep.cli import generate
from rnnstep.litert import warm as warm_path
from rnnstep import records

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = cli_support.VOCAB
PROMPTS = ["ROMEO:", "To be"]
BASE = ["--prompt=ROMEO:", "--prompt=To be", "--num_samples=2",
        "--num_steps=40", "--seed=7", "--temperature=0.8", "--top_k=20",
        "--verbose"]
TIMEOUT = 600
FILL_TIMEOUT = 300


def write_model(path):
  """The small GRU model file of tests/support/cli.py, weights seeded 3."""
  cli_support.write_model(path, seed=3)


def cli(cache_dir, args, importtime=False, switch="on", fork=False,
        **environ):
  """Runs rnnstep-generate (a fresh interpreter); returns the CompletedProcess.

  With `importtime`, `python -X importtime` lists every import on stderr,
  and RNNSTEP_DEBUG=1 keeps fd 2 open while the tool runs (it is otherwise
  pointed at /dev/null, which would hide the imports made in `main`). With
  `fork`, a run that takes the TensorFlow path anyway and is not about a
  fresh process (a refusal, --nocache, the switch) is forked from
  tests/support/forkserver.py's interpreter, skipping TensorFlow's import.
  """
  env = dict(os.environ, RNNSTEP_CACHE_DIR=str(cache_dir),
             RNNSTEP_COMPILED_CACHE=switch, TF_CPP_MIN_LOG_LEVEL="3",
             **environ)
  env.pop("RNNSTEP_DEBUG", None)
  # The TensorFlow path's lines say why the tool chose its path, as users
  # see them (the suite pins the default path: tests/conftest.py); a short
  # run takes the graph path either way, compiling nothing.
  env.pop("RNNSTEP_DEFAULT_PATH", None)
  if importtime:
    env["RNNSTEP_DEBUG"] = "1"
  env["PYTHONPATH"] = os.pathsep.join(
      [REPO] + [p for p in [env.get("PYTHONPATH")] if p])
  prefix = [sys.executable] + (["-X", "importtime"] if importtime else [])
  run = forkserver.run if fork and not importtime else subprocess.run
  return run(prefix + ["-m", "rnnstep.cli.generate", *args],
             capture_output=True, text=True, timeout=TIMEOUT, env=env,
             stdin=subprocess.DEVNULL, cwd=REPO)


# What --verbose adds for a short float32 run on a CPU where the library's
# default would be XLA (these tests' batches: at most 16 rows).
ONE_SHOT_GRAPH = ("graph path: 40 steps in float32, where compiling XLA would "
                  "cost this one run more than it saves; XLA where its disk "
                  "cache holds the program")


# --verbose's last line: what the compiled artifact leaves to TensorFlow.
TENSORFLOW_ONLY = ("rnnstep-generate: TensorFlow only: "
                   + ", ".join(generate.TENSORFLOW_ONLY)
                   + "; the compiled artifact serves the rest")


def verbose_line(result):
  """--verbose's line saying which path ran (its last says what takes
  TensorFlow)."""
  lines = [l for l in result.stderr.splitlines()
           if l.startswith("rnnstep-generate: ")]
  assert len(lines) == 2 and lines[1] == TENSORFLOW_ONLY, result.stderr[-3000:]
  return lines[0]


def render(texts, seed, prompts=PROMPTS, samples=2):
  """The documented text format for several samples."""
  out = []
  for p, prompt in enumerate(prompts):
    for s in range(samples):
      row = p * samples + s
      out.append(f"----- row {row}: prompt {p}, sample {s}, seed {seed} -----\n"
                 f"{prompt}{texts[row]}\n")
  return "".join(out)


def entry_files(cache_dir):
  directory = os.path.join(cache_dir, compiled_cache.SUBDIR)
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def wait_for_valid_entry(cache_dir, the_key, monkeypatch):
  """Polls until the detached child has written a valid entry."""
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(cache_dir))
  deadline = time.monotonic() + FILL_TIMEOUT
  while True:
    try:
      return compiled_cache.lookup(the_key)
    except compiled_cache.Miss as e:
      if time.monotonic() > deadline:
        raise AssertionError(f"no cache entry after {FILL_TIMEOUT} s: {e}")
      time.sleep(0.5)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """The model, the library's texts, and the cold runs (concurrently)."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  tmp = tmp_path_factory.mktemp("fast_path")
  weights = str(tmp / "model.npz")
  write_model(weights)
  model = rnnstep.load(weights)
  rows = [p for p in PROMPTS for _ in range(2)]
  want = rnnstep.generate(model, rows, 40, seed=7, temperature=0.8, top_k=20)
  the_key = compiled_cache.key(weights, compiled_cache.runtime_version())
  # The cold run is a fresh interpreter (what a user's first run is); the
  # others take the TensorFlow path for a reason the flags or the
  # environment give, which a forked interpreter shows as well.
  runs = {
      "cold": (tmp / "cache", BASE),
      "nocache": (tmp / "nocache", BASE + ["--nocache"]),
      # A request the artifact does not serve (it generates in one call).
      "stream": (tmp / "stream", BASE + ["--stream"]),
      # The environment's switch (what tests/conftest.py sets for the suite).
      "switch_off": (tmp / "switch_off", BASE),
      # A cache capped below the model's weights (an artifact of them
      # would be evicted at once).
      "over_cap": (tmp / "over_cap", BASE),
  }
  environ = {"over_cap": {compiled_cache.MAX_MB_ENV: "0.01"}}
  with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
    futures = {name: pool.submit(cli, cache, [f"--weights={weights}", *args],
                                 switch="off" if name == "switch_off" else "on",
                                 fork=name != "cold",
                                 **environ.get(name, {}))
               for name, (cache, args) in runs.items()}
    results = {name: f.result() for name, f in futures.items()}
  return dict(tmp=tmp, weights=weights, model=model, rows=rows, key=the_key,
              text=render(want, 7), results=results)


@pytest.fixture(scope="module")
def warm(env):
  """The cache directory once the cold run's child has filled it."""
  cache = env["tmp"] / "cache"
  with pytest.MonkeyPatch.context() as monkeypatch:
    wait_for_valid_entry(cache, env["key"], monkeypatch)
  return cache


def test_cold_run_is_the_library_s_text_and_schedules_the_artifact(env, warm):
  cold = env["results"]["cold"]
  assert cold.returncode == 0, cold.stderr[-3000:]
  assert cold.stdout == env["text"]
  line = verbose_line(cold)
  assert "TensorFlow path: no compiled artifact" in line
  assert "building the compiled artifact in the background" in line
  name = compiled_cache.entry_name(env["key"])
  # The child removed its lock when done.
  assert [f for f in entry_files(warm) if not f.startswith(".")
          and f != compiled_cache.DIGESTS_FILE] == [
              f"{name}.json", f"{name}.tflite"]
  # A GRU steps through a prompt on either path: no prompt crossover.
  with open(os.path.join(warm, compiled_cache.SUBDIR, f"{name}.json"),
            encoding="utf-8") as f:
    assert json.load(f)["primes_in_bulk"] is False


def test_warm_run_is_byte_identical_and_imports_no_tensorflow(env, warm):
  result = cli(warm, [f"--weights={env['weights']}", *BASE], importtime=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == env["text"]
  assert "fast path: compiled artifact" in verbose_line(result)
  imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:")]
  assert "ai_edge_litert.interpreter" in imported
  assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras")]


@pytest.mark.parametrize("args, kwargs", [
    (["--temperature=0", "--seed=7"], dict(temperature=0.0, seed=7)),
    (["--temperature=1.0", "--top_k=5", "--seed=-3"],
     dict(temperature=1.0, top_k=5, seed=-3)),
    (["--temperature=1.3", "--top_p=0.9", f"--seed={2**31 - 1}"],
     dict(temperature=1.3, top_p=0.9, seed=2**31 - 1)),
    # One value per row, all equal: one value for the batch.
    (["--temperature=0.7,0.7,0.7,0.7", "--top_k=8", "--top_p=0.8",
      "--seed=123456"], dict(temperature=0.7, top_k=8, top_p=0.8, seed=123456)),
])
def test_warm_text_equals_the_library_for_options_and_seeds(env, warm, args,
                                                             kwargs):
  result = cli(warm, [f"--weights={env['weights']}", "--prompt=ROMEO:",
                      "--prompt=To be", "--num_samples=2", "--num_steps=50",
                      "--verbose", *args])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "fast path" in verbose_line(result)
  want = rnnstep.generate(env["model"], env["rows"], 50, **kwargs)
  assert result.stdout == render(want, kwargs["seed"])


def test_warm_runs_every_option_without_tensorflow(env, warm):
  """--stop, --regex, the penalties (repetition with its window, frequency,
  presence), the n-gram ban, min-p, typical-p and per-row temperatures
  together, warm: the library's text, and no TensorFlow imported."""
  options = dict(regex="[A-Za-z ,.:]+", repetition_penalty=1.3,
                 repetition_window=16, no_repeat_ngram_size=3, min_p=0.05,
                 typical_p=0.95, temperature=[0.5, 0.9, 1.2, 0.7],
                 frequency_penalty=0.4, presence_penalty=[0.6, 0.0, -0.3, 1.0])
  # Two rows' own text halfway: they stop there.
  plain = rnnstep.generate(env["model"], env["rows"], 40, seed=5, **options)
  stops = [plain[0][20:22], plain[3][20:22]]
  args = [f"--{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
          for k, v in options.items()]
  result = cli(warm, [f"--weights={env['weights']}", "--prompt=ROMEO:",
                      "--prompt=To be", "--num_samples=2", "--num_steps=40",
                      "--seed=5", "--verbose", *(f"--stop={s}" for s in stops),
                      *args], importtime=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "fast path" in verbose_line(result)
  imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:")]
  assert not [m for m in imported if m.split(".")[0] in ("tensorflow", "keras")]
  want = rnnstep.generate(env["model"], env["rows"], 40, seed=5, stop=stops,
                          **options)
  assert any(text.endswith(tuple(stops)) for text in want)  # Stops in use.
  assert result.stdout == render(want, 5)


def test_warm_beam_search_is_the_library_s(env, warm):
  result = cli(warm, [f"--weights={env['weights']}", "--prompt=ROMEO:",
                      "--prompt=To be", "--num_beams=3",
                      "--num_return_sequences=2", "--num_steps=30",
                      "--seed=7", "--stop=e ", "--verbose"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "fast path" in verbose_line(result)
  want = rnnstep.generate(env["model"], PROMPTS, 30, num_beams=3,
                          num_return_sequences=2, stop="e ")
  assert result.stdout == render([t for texts in want for t in texts], 7)


def test_warm_single_sample_to_an_output_file(env, warm, tmp_path):
  target = tmp_path / "out.txt"
  result = cli(warm, [f"--weights={env['weights']}", "--prompt=KING",
                      "--num_steps=30", "--seed=5", f"--output={target}",
                      "--verbose"])
  assert result.returncode == 0 and result.stdout == "", result.stderr[-3000:]
  assert "fast path" in verbose_line(result)
  want = rnnstep.generate(env["model"], "KING", 30, seed=5)
  assert target.read_text(encoding="utf-8") == f"KING{want}\n"
  assert os.listdir(tmp_path) == ["out.txt"]


def test_an_artifact_over_the_cap_is_refused_before_converting(env):
  """Its size is known from the weights: no child converts it, the reason
  is said and recorded (the next run says it and builds nothing)."""
  result = env["results"]["over_cap"]
  assert result.returncode == 0, result.stderr[-3000:]
  assert verbose_line(result) == (
      "rnnstep-generate: TensorFlow path: no compiled artifact for this "
      "model yet; not building the compiled artifact: its float32 weights "
      "alone (0.044 MB) exceed the cache's cap (RNNSTEP_CACHE_MAX_MB=0.01) "
      f"({ONE_SHOT_GRAPH})")
  assert result.stdout == env["text"]
  names = entry_files(env["tmp"] / "over_cap")
  assert [os.path.splitext(n)[1] for n in names] == [".json"]
  with open(os.path.join(env["tmp"] / "over_cap", compiled_cache.SUBDIR,
                         names[0]), encoding="utf-8") as f:
    assert "exceed the cache's cap" in json.load(f)["unsupported"]


def test_a_request_the_artifact_does_not_serve_falls_back_with_the_reason(
    env):
  result = env["results"]["stream"]
  assert result.returncode == 0, result.stderr[-3000:]
  assert verbose_line(result) == (
      "rnnstep-generate: TensorFlow path: --stream: the compiled artifact "
      f"generates in one call ({ONE_SHOT_GRAPH})")
  assert result.stdout == env["text"]
  # Nothing to build for a request the artifact would not serve.
  assert entry_files(env["tmp"] / "stream") == []


def refusal(*args):
  """Why the compiled artifact does not serve a command line
  (`generate._flag_refusal`, then `warm.refusal` over the request), in this
  process: decided from the flags alone, before TensorFlow would load."""
  flag_values = generate.FLAGS
  flag_values.unparse_flags()
  flag_values(["rnnstep-generate", *args])
  try:
    prompts = generate._PROMPT.value
    samples = generate._NUM_SAMPLES.value
    rows = [(p, s, prompt) for p, prompt in enumerate(prompts)
            for s in range(samples)]
    decoding = {option.name: generate._option_value(option, len(prompts),
                                                    samples)
                for option in generate.options_lib.OPTIONS}
    seed = 7 if generate._SEED.value is None else generate._SEED.value
    return generate._flag_refusal() or warm_path.refusal(
        generate._NUM_STEPS.value, len(rows), seed, decoding)
  finally:
    flag_values.unparse_flags()


@pytest.mark.parametrize("args, reason", [
    ([], None),
    (["--temperature=0.3,0.3", "--top_p=0.5", "--top_k=3"], None),
    (["--num_steps=10000"], None),  # 4 rows: 40,000 char-rows.
    (["--format=jsonl"], "--format=jsonl"),
    # Every decoding option, stop strings and patterns are served.
    (["--stop=e", "--regex=[a-z]+", "--repetition_penalty=1.2",
      "--repetition_window=3", "--no_repeat_ngram_size=2", "--min_p=0.1",
      "--typical_p=0.9", "--temperature=0.5,1.0", "--top_k=3,0,5,9",
      "--frequency_penalty=0.5", "--presence_penalty=-0.5,1.0"], None),
    (["--num_beams=2", "--num_samples=1", "--length_penalty=0.5"], None),
    (["--window=0"], None),
    (["--stream"], "--stream"),
    (["--dtype=bfloat16"], "--dtype=bfloat16"),
    (["--weights_dtype=int8"], None),  # Its own artifact (keyed by it).
    (["--nojit_compile"], "--jit_compile"),
    (["--vocab=v.json"], "--corpus/--vocab"),
    (["--nocache"], "--nocache"),
    (["--window=4"], "--window: the compiled artifact steps the model "
     "statefully"),
    (["--num_steps=10001"], "10001 characters x 4 rows is past the "
     "compiled artifact's crossover"),
    ([f"--seed={2**31}"],
     "--seed=2147483648: the compiled artifact's seed is int32"),
    ([f"--seed={-2**31 - 1}"], "--seed=-2147483649"),
])
def test_requests_the_artifact_does_not_serve_name_the_reason(
    args, reason, monkeypatch):
  monkeypatch.setenv("RNNSTEP_COMPILED_CACHE", "on")  # conftest turns it off.
  # Decided without the interpreter: where it is missing, that is the reason
  # (the next test).
  monkeypatch.setattr(warm_path, "interpreter_installed", lambda: True)
  got = refusal("--prompt=A", "--prompt=B", "--num_samples=2", *args)
  if reason is None:
    assert got is None
  else:
    assert got is not None and got.startswith(reason), got


def test_without_the_interpreter_the_reason_says_so(monkeypatch):
  monkeypatch.setenv("RNNSTEP_COMPILED_CACHE", "on")
  real = warm_path.importlib.util.find_spec
  monkeypatch.setattr(warm_path.importlib.util, "find_spec",
                      lambda name, *a: None if name == "ai_edge_litert"
                      else real(name, *a))
  assert refusal().startswith("ai_edge_litert is not installed")


def test_nocache_reads_and_writes_nothing(env):
  result = env["results"]["nocache"]
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == env["text"]
  assert verbose_line(result) == (
      f"rnnstep-generate: TensorFlow path: --nocache ({ONE_SHOT_GRAPH})")
  assert not os.path.exists(env["tmp"] / "nocache" / compiled_cache.SUBDIR)


def test_the_environment_switch_off_reads_and_writes_nothing(env):
  result = env["results"]["switch_off"]
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == env["text"]
  assert verbose_line(result) == ("rnnstep-generate: TensorFlow path: "
                                  "RNNSTEP_COMPILED_CACHE is off "
                                  f"({ONE_SHOT_GRAPH})")
  assert not os.path.exists(env["tmp"] / "switch_off" / compiled_cache.SUBDIR)


@pytest.fixture
def own_warm_cache(warm, tmp_path):
  """A copy of the filled cache, for a test that damages its entry (the
  shared one stays valid for the others, whatever order they run in)."""
  copy = tmp_path / "cache"
  shutil.copytree(warm, copy)
  return copy


def test_a_corrupt_artifact_is_detected_rebuilt_and_never_used(
    env, own_warm_cache, monkeypatch):
  warm = own_warm_cache
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(warm))
  base = compiled_cache.entry_base(env["key"])
  _, manifest = compiled_cache.lookup(env["key"])
  with open(base + ".tflite", "r+b") as f:
    f.truncate(manifest["tflite_bytes"] // 2)
  with pytest.raises(compiled_cache.Miss, match="sha256"):
    compiled_cache.lookup(env["key"])
  result = cli(warm, [f"--weights={env['weights']}", *BASE])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == env["text"]
  line = verbose_line(result)
  assert "TensorFlow path: compiled artifact does not match" in line
  assert "building the compiled artifact in the background" in line
  flatbuffer, rebuilt = wait_for_valid_entry(warm, env["key"], monkeypatch)
  # The export is reproducible: the rebuilt artifact is the same file.
  assert rebuilt["tflite_sha256"] == manifest["tflite_sha256"]
  assert len(flatbuffer) == manifest["tflite_bytes"]
  result = cli(warm, [f"--weights={env['weights']}", *BASE])
  assert result.stdout == env["text"] and "fast path" in verbose_line(result)


def test_the_bundled_model_path_is_the_library_s():
  root = os.path.dirname(os.path.abspath(rnnstep.__file__))
  assert os.path.join(root, records.BUNDLED_MODEL) == os.path.abspath(
      rnnstep.bundled_model_path())
