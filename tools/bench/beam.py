"""Apache Beam (`python -m rnnstep.pipelines`) against the jsonl job.

    python tools/bench/beam.py --records=10000 --max_tokens=100 --rounds=3

Writes --records jsonl records (prompts of 8-64 characters cut from the
corpus, each with a seed and a key), then times, in interleaved rounds (the
order rotating), each variant generating --max_tokens characters for every
record:

  job        `rnnstep-generate --input=IN --output=OUT --num_steps=N`, a
             fresh process (its default batch size and path);
  beam_1     `python -m rnnstep.pipelines` on the DirectRunner in one process
             (`--direct_num_workers=1`), a fresh process;
  beam_2     the same in multi-processing mode with two worker processes
             (`--direct_num_workers=2 --direct_running_mode=multi_processing`);

and, once a round after the variants, in this process, `library`:
`rnnstep.generate` over the same records in batches of --batch_size with
one seed per row and their scores (as the job and Beam ask), warm (its
shapes compiled first, untimed): the bound. Beam's batches are fixed at
--batch_size (`--min_batch_size` = `--max_batch_size`); Beam runs the
library's default path for it, the job `rnnstep-generate`'s for all its
records (`paths.bulk_job_path`), its one-batch run included.

Each timed run is a whole job: the fresh process's start-up (imports,
loading, compiling) is in its time, as a user waits for it. With
--startup_records=K > 0 each variant also runs over the first K records in
each round, and the table adds "start-up aside" figures: (characters of the
whole run - of the small one) / (difference of their times).

Reports characters per second (median over rounds) and the ratio of each
Beam variant to the job, per round, median; with --check, every Beam
record's text against the job's (same seeds, so the same texts).
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, REPO)
CORPUS = os.path.join(REPO, "tests", "data",
                      "tinyshakespeare_heldout_excerpt.txt")

_MODEL = flags.DEFINE_string("model", None, "Model file (default: bundled).")
_RECORDS = flags.DEFINE_integer("records", 10000, "Records in the job.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 100,
                                   "Characters generated per record.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None, "Records per call for the library and Beam "
    "(default: the job's, paths.bulk_batch_size).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds (medians).")
_VARIANTS = flags.DEFINE_list("variants", ["job", "beam_1", "beam_2"],
                              "Which of job, beam_1, beam_2 to run.")
_STARTUP_RECORDS = flags.DEFINE_integer(
    "startup_records", 0, "Also run each variant over this many records per "
    "round, for the start-up-aside figures (0: not).")
_CHECK = flags.DEFINE_bool("check", True,
                           "Compare every Beam text with the job's.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Raw results as JSON.")
_SEED = flags.DEFINE_integer("seed", 0, "The records' seed.")
_JIT_COMPILE = flags.DEFINE_enum(
    "jit_compile", "auto", ["auto", "true", "false", "elementwise"],
    "The path of every variant and the library. auto: each its own default "
    "(the job: the path for a one-shot run of all its steps; Beam and the "
    "library: `generate`'s default for the batch); another value: that "
    "path for all, so the ratios measure the orchestration alone.")

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
           PYTHONPATH=os.pathsep.join(
               [REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def write_records(path: str, count: int, seed: int):
  """`count` records of 8-64-character prompts cut from the corpus."""
  rng = random.Random(seed)
  text = open(CORPUS, encoding="utf-8").read()
  with open(path, "w", encoding="utf-8") as f:
    for i in range(count):
      begin = rng.randrange(len(text) - 100)
      f.write(json.dumps({"key": i, "prompt": text[begin:begin + rng.randint(
          8, 64)], "seed": rng.randrange(2**31)}) + "\n")


def command(variant: str, source: str, out: str, batch: int,
            job_path_flag: Optional[List[str]] = None):
  """The command line of a variant's run over `source`.

  `job_path_flag`: the flag of the path the job over every record takes by
  default, for its one-batch run (where --jit_compile is auto).
  """
  model = [f"--model={_MODEL.value}"] if _MODEL.value else []
  if variant == "job":
    path_flag = _jit_flag("job") or job_path_flag or []
    return [sys.executable, "-m", "rnnstep.cli.generate", f"--input={source}",
            f"--output={out}.jsonl", f"--num_steps={_MAX_TOKENS.value}",
            "--overwrite"] + [f"--weights={_MODEL.value}"] * bool(
                _MODEL.value) + path_flag
  workers = {"beam_1": ["--direct_num_workers=1"],
             "beam_2": ["--direct_num_workers=2",
                        "--direct_running_mode=multi_processing"]}[variant]
  return [sys.executable, "-m", "rnnstep.pipelines", f"--input={source}",
          f"--output={out}", f"--max_tokens={_MAX_TOKENS.value}",
          f"--min_batch_size={batch}", f"--max_batch_size={batch}"
          ] + model + workers + _jit_flag("beam")


# --jit_compile's values as `jit_compile` arguments, and each as the job's flag.
_JIT_COMPILE_VALUES = {"auto": None, "true": True, "false": False,
                       "elementwise": "elementwise"}
_JOB_FLAGS = {None: [], True: ["--jit_compile"], False: ["--nojit_compile"],
              "elementwise": ["--jit_compile=elementwise"]}


def _jit_flag(kind: str):
  """--jit_compile as the job's flag or the pipeline's."""
  value = _JIT_COMPILE.value
  if kind == "beam":
    return [] if value == "auto" else [f"--jit_compile={value}"]
  return _JOB_FLAGS[_JIT_COMPILE_VALUES[value]]


def timed_run(variant, source, out, batch, job_path_flag=None) -> float:
  """Runs a variant; returns its wall seconds."""
  start = time.monotonic()
  proc = subprocess.run(command(variant, source, out, batch, job_path_flag),
                        env=ENV, capture_output=True, text=True, check=False)
  seconds = time.monotonic() - start
  if proc.returncode:
    raise SystemExit(f"{variant} failed ({proc.returncode}):\n"
                     f"{proc.stderr[-3000:]}")
  return seconds


def texts_of(variant: str, out: str) -> dict:
  """{key: text} of a variant's output."""
  folder, prefix = os.path.split(out)
  names = ([os.path.basename(out) + ".jsonl"] if variant == "job" else
           [n for n in os.listdir(folder)
            if n.startswith(prefix + "-") and n.endswith(".jsonl")])
  texts = {}
  for name in names:
    with open(os.path.join(folder, name), encoding="utf-8") as f:
      for line in f:
        record = json.loads(line)
        texts[record["key"]] = record["text"]
  return texts


def library_pass(model, source: str, batch: int):
  """A function that times the library over the records, warm.

  Batches of `batch`, one seed a row and `return_scores=True`, as the job
  and Beam's handler call it; each shape is compiled here, untimed.
  """
  import rnnstep  # pylint: disable=g-import-not-at-top
  with open(source, encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  calls = [records[i:i + batch] for i in range(0, len(records), batch)]
  jit_compile = _JIT_COMPILE_VALUES[_JIT_COMPILE.value]

  def generate(call):
    rnnstep.generate(model, [r["prompt"] for r in call], _MAX_TOKENS.value,
                     seed=[r["seed"] for r in call], return_scores=True,
                     jit_compile=jit_compile)

  for sizes in {len(calls[0]), len(calls[-1])}:  # Warm each shape once.
    generate(calls[0][:sizes])

  def timed() -> float:
    start = time.monotonic()
    for call in calls:
      generate(call)
    return time.monotonic() - start
  return timed


def main(argv):
  del argv
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  from tools.bench import machine  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(_MODEL.value)
  batch = _BATCH_SIZE.value or paths.bulk_batch_size(model)
  facts = machine.machine_facts(tf, None)
  print("# rnnstep.pipelines against the jsonl job")
  print(f"machine: {facts['cpu']} | {facts['cores']} cores "
        f"({facts['usable_cores']} usable) | kind {facts['cpu_kind']} | "
        f"TF {facts['tensorflow']}")
  import apache_beam  # pylint: disable=g-import-not-at-top
  print(f"apache-beam {apache_beam.__version__}; load average at start: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()))
  print(f"model: {_MODEL.value or 'bundled'} {model.config}")
  job_path = paths.bulk_job_path(model, _RECORDS.value, batch,
                                 _MAX_TOKENS.value)
  print(f"records: {_RECORDS.value} x {_MAX_TOKENS.value} characters, "
        f"batch {batch} (jit_compile {_JIT_COMPILE.value}; the library's "
        f"default path for it: {paths.default_path(model, batch)}; the "
        f"job's: {job_path}), {_ROUNDS.value} rounds\n")
  chars = _RECORDS.value * _MAX_TOKENS.value
  tmp = tempfile.mkdtemp(prefix="bench_beam_")
  source = os.path.join(tmp, "in.jsonl")
  write_records(source, _RECORDS.value, _SEED.value)
  small = os.path.join(tmp, "small.jsonl")
  if _STARTUP_RECORDS.value:
    with open(source, encoding="utf-8") as f, open(small, "w",
                                                   encoding="utf-8") as g:
      g.writelines(f.readlines()[:_STARTUP_RECORDS.value])
  variants = list(_VARIANTS.value)
  library_timed = library_pass(model, source, batch)
  library = []  # One pass a round, after its variants.
  seconds = {v: [] for v in variants}
  small_seconds = {v: [] for v in variants}
  outputs = {}
  for round_ in range(_ROUNDS.value):
    order = variants[round_ % len(variants):] + variants[:round_ %
                                                         len(variants)]
    for variant in order:
      out = os.path.join(tmp, f"{variant}_{round_}", "out")
      os.makedirs(os.path.dirname(out))
      seconds[variant].append(timed_run(variant, source, out, batch))
      outputs[variant] = out
      if _STARTUP_RECORDS.value:
        small_out = os.path.join(tmp, f"{variant}_{round_}_small", "out")
        os.makedirs(os.path.dirname(small_out))
        # The job's path over every record: the one-batch run alone would
        # take the graph path (few rows x steps), leaving XLA's compile in
        # the difference.
        small_seconds[variant].append(
            timed_run(variant, small, small_out, batch,
                      _JOB_FLAGS[paths.jit_compile_of(job_path)]))
      print(f"round {round_ + 1}: {variant} {seconds[variant][-1]:.1f} s "
            f"(load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    library.append(library_timed())
    print(f"round {round_ + 1}: library {library[-1]:.1f} s", file=sys.stderr,
          flush=True)

  print("| variant | s (median) | chars/s | x job (median of rounds) "
        + ("| start-up aside chars/s | x job |" if _STARTUP_RECORDS.value
           else "|"))
  print("|---|---|---|---|" + ("---|---|" if _STARTUP_RECORDS.value else ""))
  small_chars = _STARTUP_RECORDS.value * _MAX_TOKENS.value

  def aside(variant, i):
    return (chars - small_chars) / (seconds[variant][i]
                                    - small_seconds[variant][i])

  results = {"library_s": library, "batch": batch, "chars": chars,
             "seconds": seconds, "small_seconds": small_seconds}
  for variant in variants:
    row = [variant, f"{statistics.median(seconds[variant]):.1f}",
           f"{chars / statistics.median(seconds[variant]):,.0f}"]
    if "job" in seconds and variant != "job":
      ratio = statistics.median(
          j / s for j, s in zip(seconds["job"], seconds[variant]))
      row.append(f"{ratio:.2f}")
    else:
      row.append("")
    if _STARTUP_RECORDS.value:
      rates = [aside(variant, i) for i in range(_ROUNDS.value)]
      row.append(f"{statistics.median(rates):,.0f}")
      if "job" in seconds and variant != "job":
        ratio = statistics.median(
            r / aside("job", i) for i, r in enumerate(rates))
        row.append(f"{ratio:.2f}")
      else:
        row.append("")
    print("| " + " | ".join(row) + " |")
  library_s = statistics.median(library)
  print(f"| library (warm, this process, a pass a round) | {library_s:.1f} | "
        f"{chars / library_s:,.0f} | |" + (" | |" if _STARTUP_RECORDS.value
                                           else ""))
  if _STARTUP_RECORDS.value and "job" in seconds:
    ratio = statistics.median(aside("job", i) * library[i] / chars
                              for i in range(_ROUNDS.value))
    results["job_aside_vs_library"] = ratio
    print(f"\nthe job, start-up aside, against the library's pass of the "
          f"same round (median): {ratio:.2f}x")
  print(f"\nload average at end: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()))
  if _CHECK.value and "job" in outputs:
    job = texts_of("job", outputs["job"])
    for variant in variants:
      if variant != "job":
        texts = texts_of(variant, outputs[variant])
        same = sum(texts.get(key) == text for key, text in job.items())
        print(f"check: {variant}: {same} of {len(job)} texts equal the "
              f"job's ({len(texts)} records written)")
        results[f"check_{variant}"] = same
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
