"""`rnnstep-generate --input=IN.jsonl --output=OUT.jsonl`: resumable bulk jobs.

A job reads records, one JSON object a line, and appends one result line
per record to OUT, a batch at a time: each batch's lines are written with
one `write` and flushed to disk (`fsync`) before the next batch starts. Run
the same command again after a crash or a kill and it continues where OUT
ends: a last line cut short (no line end) is cut off and never counted, and
every record already in OUT is skipped, so OUT ends with every record once.

Beside OUT, `OUT.job.json` records what the job is (`Job.fingerprint`: the
input's SHA-256, the model file's, every option that decides the text, and
the base seed drawn when no --seed was given). A rerun whose input or
options differ is refused in one line naming what changed; --overwrite
starts again.

Generation (the default): a record is `{"prompt": str, "seed"?: int,
"key"?: any, <per-row option>?: value}` (the per-row decoding options,
`options.PER_ROW`, override the flags for that record). Its text is the
one-row `rnnstep.generate(model, prompt, num_steps, seed=seed, ...)`'s,
whatever batch it ran in: the batch passes one seed per row, and row i of
a seed list is (seeds[i], 0), as a one-row call with seeds[i] is. A record
without a seed gets `rnnstep.record_seed(base seed, index)`. Output:
`{"index", "key", "prompt", "seed", "text", "logprob", "stopped"}`.

Scoring (--score): a record is `{"context": str, "continuation": str}`
(`rnnstep.loglikelihood`; output adds "logprob" and "is_greedy") or
`{"text": str}` (`rnnstep.loglikelihood_rolling`; output adds "logprob"),
with an optional "key".

A record's "index" is its line in IN counted from 0 (blank lines count and
are skipped). Every line is checked (JSON, fields, the model's vocabulary,
option values) before anything runs: the first bad one is a one-line error
naming its line, or with --skip_bad_lines each is reported and skipped.
"""

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import signal
import time
from typing import Any, Dict, List, Optional

from rnnstep.cli import common
from rnnstep.decoding import options as options_lib
from rnnstep import errors
from rnnstep import records as records_lib

JOB_SUFFIX = ".job.json"
JOB_FORMAT = "rnnstep-job"
JOB_VERSION = 1
# Records a scoring batch appends at once (the scoring functions cut it into
# their own calls by length).
SCORE_BATCH = 1024
# The per-record decoding options a generation record may carry.
RECORD_OPTIONS = tuple(option.name for option in options_lib.PER_ROW)
GENERATE_FIELDS = ("prompt", "seed", "key") + RECORD_OPTIONS
# Test-only (tests/test_jobs.py): RNNSTEP_TEST_JOB_CRASH=N:BYTES makes a job
# write BYTES bytes of its batch N+1 (after N whole ones) and SIGKILL
# itself: a crash in the middle of a write, at a chosen byte.
CRASH_VARIABLE = "RNNSTEP_TEST_JOB_CRASH"


class BadLine(ValueError):
  """A record the job cannot run; the message names the problem."""


@dataclasses.dataclass
class Record:
  """One input line: its index (line number - 1) and its checked fields."""
  index: int
  fields: Dict[str, Any]


@dataclasses.dataclass
class Job:
  """What a job is: the `fingerprint` that `OUT.job.json` keeps.

  Attributes:
    kind: "generate" or "score".
    input_path: IN.
    output_path: OUT.
    input_sha256: IN's SHA-256.
    model_sha256: the model file's (and a vocabulary source's) SHA-256.
    options: every option that decides the results, by flag name.
    base_seed: the seed records without one derive theirs from (generation).
  """
  kind: str
  input_path: str
  output_path: str
  input_sha256: str
  model_sha256: str
  options: Dict[str, Any]
  base_seed: Optional[int] = None

  def fingerprint(self) -> dict:
    return {"format": JOB_FORMAT, "version": JOB_VERSION, "kind": self.kind,
            "input_sha256": self.input_sha256,
            "model_sha256": self.model_sha256, "options": self.options,
            "base_seed": self.base_seed}


def sha256_of(paths) -> str:
  """The SHA-256 of the files' contents, in order (a missing one: its name)."""
  digest = hashlib.sha256()
  for path in paths:
    if path is None:
      digest.update(b"\0none")
      continue
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    digest.update(b"\0")
  return digest.hexdigest()


def read_lines(path: str) -> List[tuple]:
  """IN's lines as `(index, decoded JSON or a BadLine)`, blank lines left out.

  Raises:
    common.Failure: IN cannot be read.
  """
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise common.Failure(f"--input={path}: {common.reason(e)}") from None
  out = []
  for index, raw in enumerate(data.split(b"\n")):
    if not raw.strip():
      continue
    try:
      value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
      value = BadLine("not UTF-8")
    except ValueError as e:
      value = BadLine(f"not JSON ({e})")
    if not isinstance(value, (dict, BadLine)):
      value = BadLine(f"a JSON {type(value).__name__}, not an object")
    out.append((index, value))
  return out


def check_records(lines, check_one, input_path: str, skip_bad: bool,
                  say) -> List[Record]:
  """Checks every line with `check_one(fields) -> fields`, before any run.

  Raises:
    common.Failure: the first bad line (one line naming it), unless
      `skip_bad`, which reports each through `say` and leaves it out.
  """
  records = []
  for index, value in lines:
    try:
      if isinstance(value, BadLine):
        raise value
      records.append(Record(index, check_one(value)))
    except (BadLine, ValueError) as e:
      where = f"--input={input_path}: line {index + 1}"
      if not skip_bad:
        raise common.Failure(f"{where}: {e} (--skip_bad_lines skips such "
                             "lines)") from None
      say(f"{where}: skipped: {e}")
  return records


def generation_check(model, num_steps: int):
  """A `check_one` for generation records (see the module docstring): the
  fields a record may hold, its prompt's tokens, then its values through
  `records.check`, the library's one check in its words."""
  def check(fields):
    unknown = sorted(set(fields) - set(GENERATE_FIELDS))
    if unknown:
      raise BadLine(f"unknown field {unknown[0]!r} (a record has "
                    f"{', '.join(GENERATE_FIELDS)})")
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt:
      raise BadLine('"prompt" must be a non-empty string, got '
                    f"{json.dumps(prompt)[:60]}")
    try:
      if not len(model.encode(prompt)):
        raise BadLine('"prompt" gives no tokens')
    except BadLine:
      raise
    except ValueError as e:
      raise BadLine(f'"prompt": {e}') from None
    records_lib.check(prompt, num_steps, seed=fields.get("seed"),
                      options={name: fields[name] for name in RECORD_OPTIONS
                               if name in fields}, one_row=True)
    return fields
  return check


def scoring_check(model):
  """A `check_one` for scoring records: a pair, or a whole text."""
  def check(fields):
    names = set(fields) - {"key"}
    if names == {"context", "continuation"}:
      texts = [("context", fields["context"]),
               ("continuation", fields["continuation"])]
    elif names == {"text"}:
      texts = [("text", fields["text"])]
    else:
      raise BadLine(f"fields {sorted(fields)}: a scoring record has "
                    '"context" and "continuation", or "text" (and "key")')
    for name, text in texts:
      if not isinstance(text, str):
        raise BadLine(f'"{name}" must be a string, got '
                      f"{json.dumps(text)[:60]}")
    from rnnstep import api  # pylint: disable=g-import-not-at-top
    try:  # The scoring functions' own checks, on this one record.
      if "text" in fields:
        api.check_rolling(model, [fields["text"]])
      else:
        api.check_pairs(model, [(fields["context"], fields["continuation"])])
    except errors.ArgumentError as e:
      raise BadLine(str(e).replace("pairs[0]", "the pair").replace(
          "texts[0]", '"text"')) from None
    return fields
  return check


# ------------------------------------------------------------------ OUT


class Output:
  """OUT, locked for this job, with its finished records read back.

  Args:
    job: the `Job`.
    overwrite: start again whatever OUT holds.
  """

  def __init__(self, job: Job, overwrite: bool):
    self.job = job
    self.path = job.output_path
    self.job_path = self.path + JOB_SUFFIX
    self._fd = None
    self._overwrite = overwrite
    self._appended = 0
    self._crash = tuple(int(part) for part in os.environ.get(
        CRASH_VARIABLE, "").split(":") if part) or None

  def check(self):
    """Checks, reading only, that OUT is new or this job's (before the model
    loads: a refused rerun answers at once).

    Raises:
      common.Failure: OUT is a directory, another job's, or not a job's
        output.
    """
    flag = f"--output={self.path}"
    if os.path.isdir(self.path):
      raise common.Failure(f"{flag}: is a directory")
    if os.path.exists(self.path) and not self._overwrite:
      self._check_same_job(flag)

  def open(self, known_indices) -> Dict[int, int]:
    """Opens OUT for appending; returns {index: 1} of the records it holds.

    Raises:
      common.Failure: as `check`, or another process is writing OUT, or it
        holds a line that is not one of this job's records.
    """
    flag = f"--output={self.path}"
    self.check()
    exists = os.path.exists(self.path)
    try:
      self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND,
                         0o666)
    except OSError as e:
      raise common.Failure(f"{flag}: {common.reason(e)}") from None
    try:
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EAGAIN, errno.EACCES):
        raise common.Failure(f"{flag}: another job is writing it") from None
      raise
    if self._overwrite or not exists:
      os.ftruncate(self._fd, 0)
      self._write_job_file(flag)
      return {}
    return self._read_done(flag, known_indices)

  def _check_same_job(self, flag):
    try:
      with open(self.job_path, "rb") as f:
        recorded = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
      raise common.Failure(
          f"{flag}: exists and is not a job's output ({self.job_path} is "
          "missing); pass --overwrite to replace it") from None
    except (OSError, ValueError) as e:
      raise common.Failure(f"{flag}: cannot read {self.job_path} "
                           f"({common.reason(e)}); pass --overwrite to start "
                           "again") from None
    if not isinstance(recorded, dict):
      recorded = {}
    if self.job.base_seed is None or (
        self.job.options.get("seed") is None and self.job.kind == "generate"):
      # No --seed: the job's drawn base seed carries on.
      self.job.base_seed = recorded.get("base_seed")
    want = self.job.fingerprint()
    changed = [name for name in ("kind", "input_sha256", "model_sha256")
               if recorded.get(name) != want[name]]
    old_options = recorded.get("options") or {}
    changed += [f"--{name}" for name in sorted(set(want["options"])
                                               | set(old_options))
                if old_options.get(name) != want["options"].get(name)]
    if recorded.get("format") != JOB_FORMAT or recorded.get(
        "version") != JOB_VERSION:
      changed = ["the job file's format"]
    if changed:
      what = ", ".join({"kind": "--score", "input_sha256": "--input's "
                        "contents", "model_sha256": "the model"}.get(c, c)
                       for c in changed)
      raise common.Failure(
          f"{flag}: exists from another job ({what} changed since it was "
          "started); rerun with the same --input and flags to continue it, or "
          "pass --overwrite to start again")

  def _write_job_file(self, flag):
    with common.staged_path(self.job_path, flag) as tmp:
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump(self.job.fingerprint(), f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())

  def _read_done(self, flag, known_indices) -> Dict[int, int]:
    with open(self.path, "rb") as f:
      data = f.read()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # A line cut by a crash: never counted.
      os.ftruncate(self._fd, end)
    done = {}
    for number, raw in enumerate(data[:end].split(b"\n")[:-1], 1):
      try:
        index = json.loads(raw.decode("utf-8"))["index"]
      except (ValueError, KeyError, TypeError):
        index = None
      if index not in known_indices or index in done:
        raise common.Failure(
            f"{flag}: line {number} is not a record of this job (or one "
            "already written); pass --overwrite to start again")
      done[index] = 1
    return done

  def append(self, lines: List[dict]):
    """Appends the lines with one write, then flushes them to disk."""
    data = "".join(json.dumps(line, ensure_ascii=False) + "\n"
                   for line in lines).encode("utf-8")
    self._appended += 1
    if self._crash and self._appended == self._crash[0] + 1:
      # Test-only: a crash partway through this batch's write.
      os.write(self._fd, data[:self._crash[1]])
      os.fsync(self._fd)
      os.kill(os.getpid(), signal.SIGKILL)
    view = memoryview(data)
    while view:
      view = view[os.write(self._fd, view):]
    os.fsync(self._fd)

  def close(self):
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


# ------------------------------------------------------------- progress


class Progress:
  """A tqdm bar on stderr when it is a terminal (records, rate, time left)."""

  def __init__(self, total: int):
    self._bar = None
    self._chars = 0
    self._start = time.monotonic()
    stream = common.stderr()
    try:
      tty = stream.isatty()
    except (AttributeError, ValueError):
      tty = False
    if tty and total:
      import tqdm  # pylint: disable=g-import-not-at-top
      # The width is read once: tqdm's dynamic_ncols prints nothing where a
      # terminal reports 0 columns (a pty no one sized).
      self._bar = tqdm.tqdm(total=total, unit="rec", file=stream,
                            leave=False)

  def update(self, records: int, chars: int):
    self._chars += chars
    if self._bar is not None:
      rate = self._chars / max(time.monotonic() - self._start, 1e-9)
      self._bar.set_postfix_str(f"{rate:,.0f} chars/s", refresh=False)
      self._bar.update(records)

  def close(self):
    if self._bar is not None:
      self._bar.close()


# ------------------------------------------------------------------ runs


def run(job: Job, records: List[Record], output: Output, run_batch,
        batch_size: int, skipped: int) -> str:
  """Runs the records OUT lacks, a batch at a time; returns the summary.

  Args:
    job: the `Job`.
    records: the checked records, in IN's order.
    output: the opened `Output`.
    run_batch: `records -> (result lines, characters)`.
    batch_size: records per batch.
    skipped: bad lines skipped.
  """
  done = output.open({record.index for record in records})
  pending = [record for record in records if record.index not in done]
  start = time.monotonic()
  progress = Progress(len(pending))
  chars = 0
  try:
    for begin in range(0, len(pending), batch_size):
      batch = pending[begin:begin + batch_size]
      lines, batch_chars = run_batch(batch)
      output.append(lines)
      chars += batch_chars
      progress.update(len(batch), batch_chars)
  finally:
    progress.close()
    output.close()
  seconds = time.monotonic() - start
  rate = f", {chars / seconds:,.0f} characters/s" if pending and seconds else ""
  return (f"{len(pending)} records written to {job.output_path} in "
          f"{seconds:.1f} s{rate} ({len(done)} already there, {skipped} bad "
          f"lines skipped, batches of {batch_size})")


def generation_batch(model, job: Job, num_steps: int, flag_options: dict,
                     stop, regex, jit_compile, batch_size: int):
  """The `run_batch` of a generation job: one `rnnstep.generate` a batch."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import request  # pylint: disable=g-import-not-at-top
  stops = tuple(stop or ())
  seconds = []  # Each call's wall time in this process.

  def padded(batch: List[Record]) -> List[Record]:
    """The batch, or a short last one padded to `batch_size` under XLA.

    Under XLA a short batch is a new shape (`request.batch_bucket`), so a
    new compile. Padded with copies of its last record (their results are
    dropped) it reuses the full batches' program instead, which pays where
    a full batch runs in less time than a compile takes: the first call's
    seconds less a compiled call's. (Each row's text is its one-row call's
    in any batch: README "Reproducibility".)
    """
    if (jit_compile is not True or len(seconds) < 2 or
        request.batch_bucket(len(batch)) == request.batch_bucket(batch_size)
        or seconds[-1] >= seconds[0] - seconds[-1]):
      return batch
    return batch + [batch[-1]] * (batch_size - len(batch))

  def run_batch(batch: List[Record]):
    rows = padded(batch)
    prompts = [record.fields["prompt"] for record in rows]
    seeds = [record.fields.get("seed") for record in rows]
    seeds = [rnnstep.record_seed(job.base_seed, record.index)
             if seed is None else seed for seed, record in zip(seeds, rows)]
    options = dict(flag_options)
    for name in RECORD_OPTIONS:
      if any(name in record.fields for record in rows):
        options[name] = [record.fields.get(name, flag_options[name])
                         for record in rows]
    start = time.monotonic()
    texts, scores = rnnstep.generate(
        model, prompts, num_steps, seed=seeds, stop=list(stops) or None,
        regex=regex, return_scores=True, jit_compile=jit_compile, **options)
    seconds.append(time.monotonic() - start)
    lines = [{"index": record.index, "key": record.fields.get("key"),
              "prompt": prompt, "seed": seed, "text": text,
              "logprob": float(score),
              "stopped": records_lib.stopped(text, stops)}
             for record, prompt, seed, text, score in zip(
                 batch, prompts, seeds, texts, scores)]
    return lines, sum(len(text) for text in texts[:len(batch)])
  return run_batch


def scoring_batch(model, jit_compile, window):
  """The `run_batch` of a scoring job: one scoring call per kind a batch."""
  import rnnstep  # pylint: disable=g-import-not-at-top

  def run_batch(batch: List[Record]):
    pairs = [r for r in batch if "context" in r.fields]
    texts = [r for r in batch if "text" in r.fields]
    results = {}
    if pairs:
      for record, (logprob, greedy) in zip(pairs, rnnstep.loglikelihood(
          model, [(r.fields["context"], r.fields["continuation"])
                  for r in pairs], jit_compile=jit_compile, window=window)):
        results[record.index] = {
            "index": record.index, "key": record.fields.get("key"),
            "context": record.fields["context"],
            "continuation": record.fields["continuation"],
            "logprob": logprob, "is_greedy": greedy}
    if texts:
      for record, logprob in zip(texts, rnnstep.loglikelihood_rolling(
          model, [r.fields["text"] for r in texts], jit_compile=jit_compile,
          window=window)):
        results[record.index] = {
            "index": record.index, "key": record.fields.get("key"),
            "text": record.fields["text"], "logprob": logprob}
    chars = sum(len(r.fields.get("text", "")) + len(r.fields.get(
        "context", "")) + len(r.fields.get("continuation", ""))
                for r in batch)
    return [results[record.index] for record in batch], chars
  return run_batch


@contextlib.contextmanager
def blamed(flag_names):
  """Library argument errors raised mid-job as Failures naming the flag."""
  try:
    yield
  except errors.ArgumentError as e:
    argument = getattr(e, "argument", None)
    flag = f"--{argument}: " if argument in flag_names else ""
    raise common.Failure(f"{flag}{e}", common.EXIT_USAGE) from None


def check_output_flag(path: str) -> None:
  """OUT must be a file path (resuming needs one): not stdout."""
  if not path or path == "-":
    raise common.Failure("--input needs --output=FILE (a job appends to it "
                         "and resumes from it), not stdout",
                         common.EXIT_USAGE)
