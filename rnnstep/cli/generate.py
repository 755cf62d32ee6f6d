r"""rnnstep-generate: text from a recurrent language model, in one device loop.

USAGE: rnnstep-generate [flags]

  rnnstep-generate                        # 1000 characters after "ROMEO:" (bundled model)
  rnnstep-generate --prompt=JULIET: --prompt=HAMLET: --num_samples=3 --seed=7
  rnnstep-generate --model=model.npz --temperature=0.8 --stop=. --format=jsonl
  rnnstep-generate --stream --chunk_size=32
  rnnstep-generate --num_samples=3 --temperature=0.2,0.6,1.0   # a sweep, one run
  rnnstep-generate --repetition_penalty=1.3 --repetition_window=32 --no_repeat_ngram_size=4
  rnnstep-generate --num_beams=8 --num_return_sequences=3 --stop=.
  rnnstep-generate --typical_p=0.9 --temperature=0.8
  rnnstep-generate --prompt='ROMEO:' --regex=' [A-Z][a-z]+(, [a-z]+)*\.' --num_steps=60
  rnnstep-generate --model=char_rnn.pt --vocab=vocab.json   # PyTorch, converted on the fly

--model (alias --weights) takes an rnnstep .npz model file or any weights file
rnnstep-convert reads (Keras .keras/.h5/TF checkpoint, PyTorch .pt/.pth/.bin/
.safetensors), which is converted in memory; those hold no vocabulary, so give
--corpus (the training text) or --vocab (a JSON list of the characters or
words in id order, or a tokenizer file).

All prompts x samples are generated together as one batch; row R (counted from 0)
is sample S of prompt P, R = P * num_samples + S, and uses the seed pair (seed, R).
Without --seed a fresh seed is drawn; it is reported in the output (jsonl, or the
text headers when there are several samples), so passing it back with the same
flags reproduces the run.

Output, --format=text: each sample is its prompt, its continuation and a newline.
A single sample prints just that; with several, each sample is preceded by a line
  ----- row R: prompt P, sample S, seed N -----
--format=jsonl: one JSON object per sample, in row order:
  {"index": R, "prompt_index": P, "sample": S, "seed": N, "prompt": "...",
   "text": "<the continuation>", "stopped": <true if it ended on a --stop string>,
   "logprob": <the model's log-likelihood of "text" after the prompt, in nats>}

Every per-row sampling option (--temperature, --top_k, --top_p, --min_p,
--typical_p, --repetition_penalty) takes one value, one per --prompt, or one
per row (prompts x --num_samples, in row order): --num_samples=3
--temperature=0.2,0.6,1.0 sweeps three temperatures in one batch. The flags are
the library's decoding options, declared once in rnnstep/decoding/options.py.

With --num_beams=K > 1 the continuation is a beam search of width K
(deterministic: --temperature, --top_k, --top_p, --min_p and --seed do not
apply); --num_return_sequences=N <= K prints the N best hypotheses of each
prompt, best first, as samples 0..N-1 (--num_samples must then be 1, and
--stream is not available).

Warm runs need no TensorFlow: the first run on a model file generates with
TensorFlow and then, in a detached background process, exports the model's
generation loop to a LiteRT flatbuffer kept in the cache directory
($RNNSTEP_CACHE_DIR, else ~/.cache/rnnstep); later runs whose request it
serves (every decoding option, --stop, --regex and beams, per-row values
included; not --format=jsonl, --stream, --window, other dtypes than float32,
more than 40,000 characters x rows, or an RWKV-7 prompt long enough that
TensorFlow primes it sooner) run it with the ai_edge_litert interpreter
instead, in a fraction of a second and with the same text. --verbose says
which path ran and why, and what still takes TensorFlow; --nocache turns
the cache off. The cache is keyed on every file
the model is read from, the TensorFlow, rnnstep and ai_edge_litert versions
and the CPU, holds at most
$RNNSTEP_CACHE_MAX_MB MB (default: 512, or twice the largest artifact),
least recently used entries removed
first; --cache_info lists it, --cache_clear empties it.

Bulk jobs: --input=IN.jsonl --output=OUT.jsonl reads one record a line,
  {"prompt": "...", "seed": <int, optional>, "key": <anything, optional>,
   "temperature" (or another per-row option): <optional, this record's>},
and appends {"index", "key", "prompt", "seed", "text", "logprob", "stopped"}
per record to OUT ("index": its line in IN, from 0), in batches (--batch_size;
default: the fastest rnnstep-tune measured, else 256), each appended whole
and flushed to disk. A record's text is the one-row library call's,
rnnstep.generate(model, prompt, num_steps, seed=seed, ...); a record without
a seed uses rnnstep.record_seed(--seed, index) (without --seed the job draws
one and keeps it in OUT.job.json). Run the same command again after a crash
or a kill and it continues: OUT ends with every record once. A changed IN,
model or option is refused (--overwrite starts again). Every line is checked
before anything runs: a bad line is an error naming it (--skip_bad_lines:
reported and skipped). --score scores instead: records {"context",
"continuation"} (rnnstep.loglikelihood: "logprob", "is_greedy") or {"text"}
(rnnstep.loglikelihood_rolling: "logprob"). A bar on stderr (a terminal)
shows progress; a summary line ends the job.

Errors are reported as one line on stderr naming the flag. Exit status: 0 success,
1 failure (model file, output file, generation), 2 bad command line, 130 Ctrl-C,
143 SIGTERM.
TensorFlow's own log lines are hidden; set RNNSTEP_DEBUG=1 to see them and
tracebacks.
"""

import contextlib
import json
import math
import os
import sys

from absl import flags

from rnnstep.cli import common  # pylint: disable=g-bad-import-order
from rnnstep.decoding import options as options_lib
from rnnstep.litert import cache as artifact_cache
from rnnstep.litert import fill as artifact_fill
from rnnstep.litert import warm
from rnnstep import records
import rnnstep  # pylint: disable=g-bad-import-order

PROGRAM = "rnnstep-generate"
DEFAULT_PROMPT = "ROMEO:"
MAX_INT32 = 2**31 - 1

# Private flags: see common.py.
FLAGS = flags.FlagValues()
_MODEL, _DTYPE = common.define_model_flags(FLAGS)
_WEIGHTS_DTYPE = common.define_weights_dtype_flag(FLAGS)
_CORPUS, _VOCAB = common.define_vocab_flags(FLAGS)
_PROMPT = flags.DEFINE_multi_string(
    "prompt", [DEFAULT_PROMPT],
    f"Text to continue. Repeat the flag for several prompts (one batch). "
    f"Default: {DEFAULT_PROMPT!r}, as in the TensorFlow text-generation tutorial",
    flag_values=FLAGS)
_NUM_STEPS = flags.DEFINE_integer(
    "num_steps", 1000,
    "Tokens to generate per sample (a character model's characters; a word "
    "model's words), >= 0 (fewer when a --stop string ends the sample).",
    flag_values=FLAGS)
# One flag per decoding option, from its declaration
# (`rnnstep.decoding.options`): per-row options take one value, one per
# --prompt, or one per row (comma-separated); per-request ones one value.
def _define_option_flag(option):
  parse = int if option.dtype.startswith("int") else float
  meaning = option.doc.replace("`", "")
  if option.per_row:
    holder = flags.DEFINE_list(
        option.name, [str(option.default)],
        f"{meaning} One value, one per --prompt, or one per row "
        "(comma-separated).", flag_values=FLAGS)

    def valid(values):
      try:
        return bool(values) and all(option.valid.holds(parse(v))
                                    for v in values)
      except ValueError:
        return False
    must_be = f"{option.valid.words}, comma-separated"
  else:
    define = flags.DEFINE_integer if parse is int else flags.DEFINE_float
    holder = define(option.name, option.default, meaning, flag_values=FLAGS)
    must_be = option.valid.words

    def valid(value):  # A default of None: the model decides (`window`).
      return (value is None and option.default is None
              or option.valid.holds(value))
  flags.register_validator(option.name, valid, f"must be {must_be}",
                           flag_values=FLAGS)
  return holder


_DECODING = {option.name: _define_option_flag(option)
             for option in options_lib.OPTIONS}
_SEED = flags.DEFINE_integer(
    "seed", None,
    "Random seed (64-bit): the same seed and flags give the same text; row R "
    "uses (seed, R). Default: a fresh seed in [0, 2**31), reported in the "
    "output.", flag_values=FLAGS)
_NUM_SAMPLES = flags.DEFINE_integer(
    "num_samples", 1,
    "Samples per prompt, >= 1; all prompts x samples rows are generated as one "
    "batch.", flag_values=FLAGS)
_STOP = flags.DEFINE_multi_string(
    "stop", None,
    "Stop string (repeatable): a sample ends as soon as its continuation "
    "contains one (ending with it); generation ends when every sample has "
    "ended.",
    flag_values=FLAGS)
_REGEX = flags.DEFINE_multi_string(
    "regex", None,
    "A regular expression (Python syntax) each continuation stays inside: one "
    "for every row, one per --prompt, or one per row (repeat the flag); a row "
    "ends once it matches and cannot go on, and a row cut off by --num_steps "
    "or a --stop string is a prefix of a match.", flag_values=FLAGS)
_JIT_COMPILE = flags.DEFINE_boolean(
    "jit_compile", None,
    "Run the whole generation as one XLA program (--jit_compile) or as a "
    "TensorFlow graph without XLA (--nojit_compile). Default: the library's "
    "choice, the fastest path measured for the dtype and batch size (on this "
    "machine once rnnstep-tune has measured it; nothing is measured here), "
    "except that a float32 run of at most 2000 steps takes the graph path: "
    "XLA's compile would cost this one run more than it saves.",
    flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string(
    "output", None,
    "Write the output to this file instead of stdout ('-' is stdout). The file "
    "appears only when the run succeeds, whole: never a partial file.",
    flag_values=FLAGS)
_FORMAT = flags.DEFINE_enum(
    "format", "text", ["text", "jsonl"],
    "text: prompt + continuation per sample, with a header line per sample "
    "when there are several; jsonl: one JSON object per sample (fields in "
    "--help).", flag_values=FLAGS)
_STREAM = flags.DEFINE_boolean(
    "stream", False,
    "Generate --chunk_size steps per device call (state kept on device) and "
    "print text as it comes, flushing. The output is byte for byte what the "
    "same run prints without --stream: samples print in order, so the first "
    "sample streams live and each later one streams once every sample before "
    "it has ended (stop string or --num_steps); in jsonl each object is "
    "printed as soon as its sample and all before it have ended.",
    flag_values=FLAGS)
_CHUNK_SIZE = flags.DEFINE_integer(
    "chunk_size", 64, "Steps per device call with --stream, >= 1.",
    flag_values=FLAGS)
_CACHE = flags.DEFINE_boolean(
    "cache", True,
    "Use the compiled-artifact cache: a request it serves runs a cached "
    "LiteRT export of the model without importing TensorFlow (same text), and "
    "a run that finds none builds it in the background for the next run. "
    "--nocache neither reads nor writes it.", flag_values=FLAGS)
_CACHE_INFO = flags.DEFINE_boolean(
    "cache_info", False,
    "List the compiled-artifact cache's entries (size, last use, what each "
    "holds, the model it was built from), its folder and its cap "
    "($RNNSTEP_CACHE_MAX_MB), then exit.", flag_values=FLAGS)
_CACHE_CLEAR = flags.DEFINE_boolean(
    "cache_clear", False,
    "Remove every entry of the compiled-artifact cache (recorded failures "
    "included, so they are tried again), then exit.", flag_values=FLAGS)
_INPUT = flags.DEFINE_string(
    "input", None,
    "A bulk job: read records from this jsonl file, one JSON object a line "
    '({"prompt": ..., "seed"?: ..., "key"?: ..., per-row options?}; with '
    '--score {"context": ..., "continuation": ...} or {"text": ...}), and '
    "append one result line per record to --output, a batch at a time. Run "
    "the same command again after a crash and it continues (see Bulk jobs "
    "above).", flag_values=FLAGS)
_OVERWRITE = flags.DEFINE_boolean(
    "overwrite", False,
    "With --input: start the job again, replacing --output, even when it "
    "holds another job's results.", flag_values=FLAGS)
_SKIP_BAD_LINES = flags.DEFINE_boolean(
    "skip_bad_lines", False,
    "With --input: report each bad line (not JSON, a missing or bad field, "
    "a token the model lacks, a bad option value) on stderr and skip it, "
    "instead of refusing the job.", flag_values=FLAGS)
_SCORE = flags.DEFINE_boolean(
    "score", False,
    "With --input: score the records instead of generating "
    "(rnnstep.loglikelihood for context/continuation pairs, "
    "rnnstep.loglikelihood_rolling for texts).", flag_values=FLAGS)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None,
    "With --input: records per batch (each batch is one library call, then "
    "appended). Default: the batch size rnnstep-tune measured fastest here, "
    "else 256 (generation) or 1024 (--score).", lower_bound=1,
    flag_values=FLAGS)
_STATE = common.define_state_flag(
    FLAGS, "Every row starts from it; a --state run takes the TensorFlow path "
    "(the compiled artifact starts from the zero state).")
_VERBOSE = flags.DEFINE_boolean(
    "verbose", False,
    "Say on stderr which path generated the text (the cached compiled "
    "artifact, or TensorFlow and why).", flag_values=FLAGS)



def _validate(name, predicate, message):
  """A check run after all flags are parsed: every bad value is reported."""
  flags.register_validator(name, predicate, message, flag_values=FLAGS)


_validate("num_steps", lambda n: 0 <= n <= MAX_INT32,
          f"must be an integer in [0, {MAX_INT32}]")
_validate("seed", lambda s: s is None or -2**63 <= s < 2**63,
          "must be a 64-bit integer")
_validate("num_samples", lambda n: 1 <= n <= MAX_INT32,
          f"must be an integer in [1, {MAX_INT32}]")
_validate("chunk_size", lambda n: 1 <= n <= MAX_INT32,
          f"must be an integer in [1, {MAX_INT32}]")
_validate("prompt", all, "a prompt is empty; give at least one character")
_validate("stop", lambda stops: not stops or all(stops),
          "a stop string is empty; give at least one character")


def main(argv):
  common.reject_arguments(argv, "give prompts with --prompt (see --help)")
  if _CACHE_INFO.value or _CACHE_CLEAR.value:
    from rnnstep.cli import cache_commands  # pylint: disable=g-import-not-at-top
    return cache_commands.run(_CACHE_INFO.value, _CACHE_CLEAR.value)
  if _INPUT.value is not None:
    return _run_job()
  for name in _JOB_FLAGS:
    if FLAGS[name].present:
      raise common.Failure(f"--{name} applies to a job: give --input too",
                           common.EXIT_USAGE)
  _check_beam_flags()
  seed = _fresh_seed() if _SEED.value is None else _SEED.value
  beams = _DECODING["num_beams"].value
  per_prompt = (_DECODING["num_return_sequences"].value if beams > 1
                else _NUM_SAMPLES.value)
  rows = [(p, s, prompt) for p, prompt in enumerate(_PROMPT.value)
          for s in range(per_prompt)]
  decoding = {option.name: _option_value(option, len(_PROMPT.value),
                                         per_prompt)
              for option in options_lib.OPTIONS}
  fill_key = None  # The cache entry to build after this run, if any.
  why_tensorflow = "TensorFlow path"
  try:
    if _generate_fast(rows, seed, decoding):
      _say_tensorflow_only()
      return 0
  except warm.NotServed as e:
    fill_key = e.fill_key
    why_tensorflow = f"TensorFlow path: {e}"
  with _open_output(_OUTPUT.value) as out:
    model = common.load_model(_MODEL.value, _DTYPE.value, _CORPUS.value,
                              _VOCAB.value, flag=_MODEL.name,
                              weights_dtype=_WEIGHTS_DTYPE.value)
    if fill_key is not None:
      refusal = _artifact_size_refusal(model, fill_key)
      if refusal:
        fill_key = None
        why_tensorflow += f"; not building the compiled artifact: {refusal}"
      else:
        why_tensorflow += ("; building the compiled artifact in the "
                           "background for the next run")
    from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
    note = paths.slower_dtype_note(_DTYPE.value)
    if note:  # The library logs it, but a tool's logging is quiet.
      print(f"{PROGRAM}: note: --dtype={_DTYPE.value}: {note}",
            file=common.stderr())
    state = (None if _STATE.value is None
             else common.load_state(_STATE.value, model))
    printer = Printer(out, rows, seed, _STOP.value or [], _FORMAT.value,
                      flush=_STREAM.value)
    # Imported here: a warm run, served above, needs none of it.
    from rnnstep.cli import tensorflow_path  # pylint: disable=g-import-not-at-top
    tensorflow_path.generate(
        model, _PROMPT.value, per_prompt, _NUM_STEPS.value, printer,
        seed=seed, decoding=decoding, stop=_STOP.value or [],
        regex=_regex_rows(len(_PROMPT.value), per_prompt),
        jit_compile=_JIT_COMPILE.value, stream=_STREAM.value,
        chunk_size=_CHUNK_SIZE.value, initial_state=state,
        flag_values=FLAGS, program=PROGRAM,
        announce=lambda which: _say(f"{why_tensorflow} ({which})"))
  _say_tensorflow_only()
  if fill_key is not None:  # After the text is out: the user never waits.
    _flush_outputs()
    artifact_fill.spawn_fill(_model_path(), fill_key)
  return 0


def _artifact_size_refusal(model, fill_key: dict):
  """Why the compiled artifact of `model` is not built (its size or the
  memory converting it needs: `cache.size_refusal`), or None. A size over
  the cache's cap is recorded in the entry, as a refused export is."""
  from rnnstep.engine import host  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  weight_bytes = 4 * sum(math.prod(w.shape) for w in
                         tf.nest.flatten(model.network_weights()))
  refusal, record = artifact_cache.size_refusal(
      weight_bytes, host.available_memory_bytes())
  if record:
    with contextlib.suppress(OSError):
      artifact_cache.ensure_directory()
      artifact_cache.write_entry(fill_key, unsupported=refusal,
                                 model_path=_model_path())
  return refusal


def _fresh_seed() -> int:
  """A seed uniform in [0, 2**31) from the OS's randomness (as
  `secrets.randbelow(2**31)`, without importing `secrets`, `random` and
  `hmac`: a warm run's start-up is most of its time)."""
  return int.from_bytes(os.urandom(4), "big") >> 1


# Flags that only a --input job reads.
_JOB_FLAGS = ("overwrite", "skip_bad_lines", "score", "batch_size")
# Flags a job cannot honour: one line per record, records hold the prompts.
_NOT_IN_JOBS = {
    "prompt": "records hold the prompts",
    "num_samples": "a record is one sample (repeat a record for more)",
    "num_return_sequences": "a record gets one text",
    "stream": "a job appends whole batches",
    "format": "a job writes jsonl",
    "state": "a record starts from the zero state (give prompts with --prompt)",
}


def _run_job() -> int:
  """`--input`: a resumable jsonl job (`jobs.py`)."""
  from rnnstep.cli import jobs  # pylint: disable=g-import-not-at-top
  for name, why in _NOT_IN_JOBS.items():
    if FLAGS[name].present and not (name == "format"
                                    and _FORMAT.value == "jsonl"):
      raise common.Failure(f"--{name} with --input: {why}", common.EXIT_USAGE)
  jobs.check_output_flag(_OUTPUT.value)
  if len(_REGEX.value or []) > 1:
    raise common.Failure("--regex with --input: give one pattern for every "
                         "record", common.EXIT_USAGE)
  scoring = _SCORE.value
  options = {}
  for option in options_lib.OPTIONS:
    holder = _DECODING[option.name]
    if option.per_row:
      if len(holder.value) > 1:
        raise common.Failure(
            f"--{option.name} with --input: give one value (a record may "
            f'carry its own "{option.name}")', common.EXIT_USAGE)
      parse = int if option.dtype.startswith("int") else float
      options[option.name] = parse(holder.value[0])
    else:
      options[option.name] = holder.value
  if scoring:  # Only the window decides a score.
    fingerprint = {"window": options["window"], "dtype": _DTYPE.value}
  else:
    fingerprint = dict(options, num_steps=_NUM_STEPS.value,
                       stop=_STOP.value or [], regex=_REGEX.value or [],
                       dtype=_DTYPE.value, seed=_SEED.value)
  if _WEIGHTS_DTYPE.value is not None:  # Older jobs' fingerprints stay.
    fingerprint["weights_dtype"] = _WEIGHTS_DTYPE.value
  lines = jobs.read_lines(_INPUT.value)
  try:
    model_hash = jobs.sha256_of([_model_path(), _CORPUS.value, _VOCAB.value])
  except OSError as e:
    raise common.Failure(f"{_MODEL.name}: {common.reason(e)}") from None
  job = jobs.Job(
      kind="score" if scoring else "generate", input_path=_INPUT.value,
      output_path=_OUTPUT.value,
      input_sha256=jobs.sha256_of([_INPUT.value]), model_sha256=model_hash,
      options=fingerprint,
      base_seed=None if scoring else (
          _fresh_seed() if _SEED.value is None else _SEED.value))
  output = jobs.Output(job, _OVERWRITE.value)
  output.check()
  model = common.load_model(_MODEL.value, _DTYPE.value, _CORPUS.value,
                            _VOCAB.value, flag=_MODEL.name,
                            weights_dtype=_WEIGHTS_DTYPE.value)
  say = lambda line: print(f"{PROGRAM}: {line}", file=common.stderr(),
                           flush=True)
  check = (jobs.scoring_check(model) if scoring
           else jobs.generation_check(model, _NUM_STEPS.value))
  checked = jobs.check_records(lines, check, _INPUT.value,
                               _SKIP_BAD_LINES.value, say)
  skipped = len(lines) - len(checked)
  if scoring:
    run_batch = jobs.scoring_batch(model, _JIT_COMPILE.value,
                                   options["window"])
    batch_size = _BATCH_SIZE.value or jobs.SCORE_BATCH
  else:
    from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
    batch_size = _BATCH_SIZE.value or paths.bulk_batch_size(model)
    jit_compile = _JIT_COMPILE.value
    if jit_compile is None:
      jit_compile = paths.jit_compile_of(paths.bulk_job_path(
          model, len(checked), batch_size, _NUM_STEPS.value))
    run_batch = jobs.generation_batch(
        model, job, _NUM_STEPS.value, options, _STOP.value,
        (_REGEX.value or [None])[0], jit_compile, batch_size)
  # The process generates once: its programs are traced for the loop its
  # records take (`generator.one_tail`).
  from rnnstep.engine import generator  # pylint: disable=g-import-not-at-top
  with jobs.blamed(FLAGS), generator.one_tail():
    say(jobs.run(job, checked, output, run_batch, batch_size, skipped))
  return 0


def _say(message: str):
  if _VERBOSE.value:
    print(f"{PROGRAM}: {message}", file=common.stderr(), flush=True)


def _say_tensorflow_only():
  """--verbose's second line: what the compiled artifact does not serve."""
  _say(f"TensorFlow only: {', '.join(TENSORFLOW_ONLY)}; the compiled "
       "artifact serves the rest")


def _flush_outputs():
  for stream in (sys.stdout, common.stderr()):
    with contextlib.suppress(OSError, ValueError):
      stream.flush()


def _model_path() -> str:
  """The model file's absolute path (--model, else the bundled model)."""
  if _MODEL.value:
    return os.path.abspath(_MODEL.value)
  return os.path.join(os.path.dirname(os.path.abspath(rnnstep.__file__)),
                      records.BUNDLED_MODEL)


# What still runs on TensorFlow, for --verbose: the requests `_flag_refusal`
# and `warm.refusal` send there (the compiled artifact serves every other
# decoding option).
TENSORFLOW_ONLY = ("--format=jsonl (its logprob)", "--state",
                   "--stream", "--dtype other than float32",
                   "--jit_compile/--nojit_compile", "--corpus/--vocab",
                   "--window > 0 or a model recording a window",
                   "a --seed outside int32",
                   f"over {warm.MAX_CHAR_ROWS:,} characters x rows",
                   "an RWKV-7 prompt past the artifact's crossover")


def _flag_refusal():
  """Why the flags alone send this run to TensorFlow, or None: they ask for
  what the compiled artifact does not give (scores, chunks, another dtype
  or path) or turn the cache off."""
  if not _CACHE.value:
    return "--nocache"
  if _CORPUS.value is not None or _VOCAB.value is not None:
    return "--corpus/--vocab: weights converted in memory are not cached"
  if _DTYPE.value != "float32":
    return f"--dtype={_DTYPE.value}: the compiled artifact is float32"
  if _JIT_COMPILE.value is not None:
    return "--jit_compile/--nojit_compile choose a TensorFlow path"
  if _FORMAT.value != "text":
    return ("--format=jsonl reports each row's logprob, which the compiled "
            "artifact does not compute")
  if _STREAM.value:
    return "--stream: the compiled artifact generates in one call"
  if _STATE.value is not None:
    return "--state: the compiled artifact starts from the zero state"
  return None


def _generate_fast(rows, seed, decoding) -> bool:
  """Generates and prints with the cached compiled artifact, if it serves.

  Returns:
    True when the text is written.

  Raises:
    warm.NotServed: the TensorFlow path must run (a missing or invalid entry
      names the key to build after it).
  """
  refusal = _flag_refusal()
  if refusal:
    raise warm.NotServed(refusal)
  per_prompt = len(rows) // len(_PROMPT.value)
  served = warm.generate(
      _model_path(), _PROMPT.value, per_prompt, _NUM_STEPS.value, seed=seed,
      decoding=decoding, stop=_STOP.value or [],
      regex=_regex_rows(len(_PROMPT.value), per_prompt),
      weights_dtype=_WEIGHTS_DTYPE.value)
  _say(f"fast path: compiled artifact {served.artifact} (no TensorFlow)")
  with _open_output(_OUTPUT.value) as out:
    printer = Printer(out, rows, seed, _STOP.value or [], "text")
    printer.add(served.texts)
    printer.finish()
  return True


def _check_beam_flags():
  """Flag combinations that beam search cannot honour, as usage errors."""
  beams = _DECODING["num_beams"].value
  returned = _DECODING["num_return_sequences"].value
  if returned > beams:
    raise common.Failure(
        f"--num_return_sequences={returned} is more than "
        f"--num_beams={beams}; give at most --num_beams", common.EXIT_USAGE)
  if beams > 1 and _NUM_SAMPLES.value > 1:
    raise common.Failure(
        f"--num_samples={_NUM_SAMPLES.value} with --num_beams={beams}: beam "
        "search is deterministic; use --num_return_sequences for several "
        "hypotheses", common.EXIT_USAGE)
  if beams > 1 and _STREAM.value:
    raise common.Failure(
        f"--stream with --num_beams={beams}: beam search knows its best "
        "hypothesis only at the end; drop --stream", common.EXIT_USAGE)


def _option_value(option, num_prompts, per_prompt):
  """A decoding flag's value: one, or (per-row options) one per row."""
  holder = _DECODING[option.name]
  if not option.per_row:
    return holder.value
  parse = int if option.dtype.startswith("int") else float
  values = [parse(v) for v in holder.value]
  if len(values) == 1:
    return values[0]
  if len(values) == num_prompts:
    return [v for v in values for _ in range(per_prompt)]
  if len(values) == num_prompts * per_prompt:
    return values
  raise common.Failure(
      f"--{option.name} lists {len(values)} values for {num_prompts} prompts "
      f"x {per_prompt} samples; give one value, one per --prompt, or one per "
      "row", common.EXIT_USAGE)


def _regex_rows(num_prompts, per_prompt):
  """--regex as the library's `regex`: None, one pattern, or one per row."""
  patterns = _REGEX.value or []
  if len(patterns) <= 1:
    return patterns[0] if patterns else None
  if len(patterns) == num_prompts:
    return [p for p in patterns for _ in range(per_prompt)]
  if len(patterns) == num_prompts * per_prompt:
    return list(patterns)
  raise common.Failure(
      f"--regex is given {len(patterns)} times for {num_prompts} prompts x "
      f"{per_prompt} samples; give one, one per --prompt, or one per row",
      common.EXIT_USAGE)


class Printer:
  """Prints samples in row order, each as soon as the rows before it are out.

  Fed all text at once (`add(texts)`) or chunk by chunk (`add(pieces)` per
  stream chunk), it prints the same bytes; only the timing differs. Nothing is
  printed before the library's first result, so a rejected argument never
  leaves a partial output behind.

  Args:
    out: a text stream.
    rows: (prompt index, sample index, prompt) per row.
    seed: the run's int seed (row R uses (seed, R)).
    stops: the stop strings: a row whose text ends with one has ended.
    fmt: 'text' or 'jsonl'.
    flush: flush after every chunk (streaming).
  """

  def __init__(self, out, rows, seed, stops, fmt, flush=False):
    self._out = out
    self._rows = rows
    self._seed = seed
    self._stops = tuple(stops)
    self._tail_length = max(map(len, stops), default=0)
    self._fmt = fmt
    self._flush = flush
    self._pending = [[] for _ in rows]  # Text not printed yet, per row.
    self._tails = [""] * len(rows)  # The last characters, to spot stops.
    self._current = 0  # The first row not completely printed.
    self._started = False  # Whether the current row's head is printed.
    self._scores = [None] * len(rows)  # Each row's log-likelihood so far.

  @property
  def prints_scores(self) -> bool:
    """Whether its output holds the rows' scores (jsonl's "logprob")."""
    return self._fmt == "jsonl"

  def add(self, pieces, scores=None):
    """Takes the next text of every row (a list, one str per row).

    Args:
      pieces: the rows' new text.
      scores: the rows' log-likelihoods so far, if known.
    """
    if scores is not None:
      self._scores = list(scores)
    for row, piece in enumerate(pieces):
      if piece:
        self._pending[row].append(piece)
        if self._tail_length:
          self._tails[row] = (self._tails[row] + piece)[-self._tail_length:]
    self._advance(final=False)

  def finish(self):
    """Prints everything left: every row has ended."""
    self._advance(final=True)

  def _ended(self, row) -> bool:
    return records.stopped(self._tails[row], self._stops)

  def _advance(self, final: bool):
    out = self._out
    while self._current < len(self._rows):
      row = self._current
      prompt_index, sample, prompt = self._rows[row]
      if self._fmt == "text":
        if not self._started:
          if len(self._rows) > 1:
            out.write(f"----- row {row}: prompt {prompt_index}, sample {sample}, "
                      f"seed {self._seed} -----\n")
          out.write(prompt)
          self._started = True
        out.write("".join(self._pending[row]))
        self._pending[row].clear()
      if not (final or self._ended(row)):
        break
      if self._fmt == "text":
        out.write("\n")
      else:
        out.write(json.dumps({
            "index": row, "prompt_index": prompt_index, "sample": sample,
            "seed": self._seed, "prompt": prompt,
            "text": "".join(self._pending[row]), "stopped": self._ended(row),
            "logprob": self._scores[row],
        }, ensure_ascii=False) + "\n")
        self._pending[row].clear()
      self._current += 1
      self._started = False
    if self._flush:
      out.flush()


def _open_output(path):
  """stdout, or a file that appears at `path` only if the run succeeds."""
  if not path or path == "-":
    return contextlib.nullcontext(sys.stdout)
  return common.atomic_output(path)


def run(argv=None):
  """The console-script entry point.

  Run as a program (argv None), a process that loaded TensorFlow leaves with
  os._exit once its output is flushed: TensorFlow's interpreter teardown
  (module and thread finalisation) costs about a second after the text is
  out, and there is nothing left to clean up (the output file is renamed into
  place, the background child is detached).
  """
  try:
    # Without absl.app (and the absl.logging, pdb and socket it imports):
    # ~25 ms of a warm run's ~0.25 s, and this tool uses neither.
    common.run(PROGRAM, __doc__, FLAGS, main, argv, absl_app=False)
  except SystemExit as e:
    if argv is None and "tensorflow" in sys.modules:
      status = e.code if isinstance(e.code, int) else (0 if e.code is None
                                                       else 1)
      _flush_outputs()
      with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
      os._exit(status)  # pylint: disable=protected-access
    raise

if __name__ == "__main__":
  run()
