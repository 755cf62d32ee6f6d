"""Apache Beam RunInference model handlers: generation and scoring in pipelines.

    import apache_beam as beam
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    from rnnstep import pipelines

    handler = pipelines.CompletionsModelHandler(
        "model.npz", max_tokens=200, temperature=0.8, seed=7)
    with beam.Pipeline() as pipeline:
      (pipeline
       | beam.Create([("a", "ROMEO:"), ("b", {"prompt": "JULIET:", "seed": 3})])
       | RunInference(KeyedModelHandler(handler))
       | beam.Map(print))   # ("a", PredictionResult("ROMEO:", {"text": ...}))

Each worker process loads the model once (RunInference keeps it in Beam's
per-process `shared.Shared`, used by all the process's threads), and each
batch that Beam's `BatchElements` makes is one `rnnstep.generate` call (one
per group of records whose per-call settings differ, see
`CompletionsModelHandler`). A record's text is its one-row call's,
`rnnstep.generate(model, prompt, max_tokens, seed=seed, **options)`,
whatever batch, worker or runner it ran in (to float32 rounding: README
"Reproducibility").

Seeds: a record's own "seed", else `rnnstep.record_seed(seed, index)` of the
handler's `seed`, as the bulk jobs derive it, where a record's index, since
a pipeline has no order, is its prompt's hash (`prompt_index`). So a
pipeline run again with the same `seed` gives the same texts, and two
records of one prompt without seeds get one text: give each its own "seed"
to draw several samples of a prompt.

Apache Beam is an optional dependency (`pip install 'rnnstep[beam]'`):
`import rnnstep` never imports it. This module imports TensorFlow only when
a pipeline is built with the default batch size (to read it) and when a
worker loads the model.
"""

import contextlib
import hashlib
import secrets
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence
from typing import Tuple, Union

from rnnstep.decoding import options as options_lib
from rnnstep import errors
from rnnstep import records as records_lib

try:
  # pylint: disable-next=g-import-not-at-top
  from apache_beam.ml.inference import base
except ImportError as e:
  raise ImportError(
      f"rnnstep.pipelines needs Apache Beam ({e}); install it with "
      "pip install 'rnnstep[beam]'") from None

# Options that would give a record several texts: a record's result is one.
REFUSED = ("num_return_sequences",)
_RECORD_OPTIONS = tuple(option.name for option in options_lib.OPTIONS
                        if option.name not in REFUSED)
_RECORD_FIELDS = ("prompt", "seed", "max_tokens", "stop", "regex")
# The settings `generate` takes once per call: records that differ in any
# run in separate calls. (The per-row options, regex and the seed do not.)
_PER_CALL = ("max_tokens", "stop") + tuple(
    option.name for option in options_lib.SHARED if option.name not in REFUSED)
# A drawn base seed, as rnnstep-generate draws one.
_DRAWN_SEED_BITS = 31

Record = Union[str, Mapping[str, Any]]
Pair = Union[Tuple[str, str], Mapping[str, str]]


def prompt_index(prompt: str) -> int:
  """A record's index for `rnnstep.record_seed`, where a pipeline has none.

  The first 8 bytes of the BLAKE2b hash of the prompt's UTF-8, as an
  unsigned little-endian integer: the same in every process (unlike
  Python's `hash`), runner and batch.

  Args:
    prompt: the record's prompt.

  Returns:
    An int in [0, 2**64).
  """
  digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little")


def _describe(record) -> str:
  """A record for a message: its text's first characters."""
  if isinstance(record, Mapping):
    text = repr(record.get("prompt", record.get("text", record.get(
        "context"))))
  elif isinstance(record, (list, tuple)):
    text = repr(tuple(record))
  else:
    text = repr(record)
  return f"the record {text[:48]}{'...' if len(text) > 48 else ''}"


def _refuse(argument: str, where: str, message: str):
  return errors.ArgumentError(argument, f"{where}: {message}")


@contextlib.contextmanager
def _blamed(where: str):
  """The library's refusal of a value (`records.check`), saying where."""
  try:
    yield
  except errors.ArgumentError as e:
    raise _refuse(e.argument, where, str(e)) from None


def _checked(where: str, prompt: str, fields: Mapping[str, Any]
             ) -> records_lib.Record:
  """A record's (or the handler's) values through the library's one check.

  Raises:
    errors.ArgumentError: naming `where` and the field.
  """
  for name in fields:
    if name in REFUSED:
      raise _refuse(name, where, f"{name} is not available here: each record "
                    "gets one text; give records their own seeds for several "
                    "samples of one prompt")
  with _blamed(where):
    return records_lib.check(
        prompt, fields["max_tokens"], seed=fields.get("seed"),
        stop=fields.get("stop"), regex=fields.get("regex"),
        options={name: value for name, value in fields.items()
                 if name in options_lib.BY_NAME},
        one_row=True, steps_name="max_tokens")


class LoadedModel:
  """What a worker holds: the model, and the calls the handlers make on it.

  The handlers call only these methods, with plain values, so that with
  `large_model` (Beam's `share_model_across_processes`) they run in the one
  process that holds the model, through Beam's proxy.

  Args:
    path: as `rnnstep.load`'s.
    dtype: as `rnnstep.load`'s.
  """

  def __init__(self, path: Optional[str], dtype: str):
    # pylint: disable-next=g-import-not-at-top
    from rnnstep import api  # TensorFlow, on the workers only.
    if path is not None and "://" in path:
      self.model = _load_remote(path, dtype)
    else:
      self.model = api.load(path, dtype=dtype)

  def generate(self, rows: List[Dict[str, Any]],
               jit_compile) -> Tuple[List[str], List[float]]:
    """One `generate` call over rows that share their per-call settings.

    Args:
      rows: checked records (`CompletionsModelHandler`'s), each with every
        per-call setting equal.
      jit_compile: as for `generate`.

    Returns:
      `(texts, logprobs)`, one each per row.

    Raises:
      errors.ArgumentError: naming the record at fault.
    """
    # pylint: disable-next=g-import-not-at-top
    from rnnstep import api
    first = rows[0]
    per_row = {option.name: [row.get(option.name, option.default)
                             for row in rows]
               for option in options_lib.PER_ROW}
    per_call = {name: first[name] for name in _PER_CALL[2:] if name in first}
    regex = [row["regex"] for row in rows]
    try:
      return api.generate(
          self.model, [row["prompt"] for row in rows], first["max_tokens"],
          seed=[row["seed"] for row in rows], stop=list(first["stop"]) or None,
          regex=regex if any(r is not None for r in regex) else None,
          return_scores=True, jit_compile=jit_compile, **per_row, **per_call)
    except errors.ArgumentError as e:
      raise self._blame(rows, e) from None

  def _blame(self, rows, error) -> errors.ArgumentError:
    """The library's refusal of a call, naming the record at fault.

    Each record is checked alone with the library's own checks; if none
    fails, the refusal is of the settings the rows share.
    """
    # pylint: disable-next=g-import-not-at-top
    from rnnstep import api
    for row in rows:
      where = _describe(row)
      try:
        self.model.encode(row["prompt"])  # The checks below do not encode.
      except ValueError as e:
        return _refuse("prompt", where, f"prompt: {e}")
      try:
        api.check_request(
            self.model, row["prompt"], row["max_tokens"], seed=row["seed"],
            stop=list(row["stop"]) or None, regex=row["regex"],
            **{option.name: row[option.name]
               for option in options_lib.PER_ROW if option.name in row})
      except errors.ArgumentError as e:
        return _refuse(e.argument, where, str(e))
    return _refuse(error.argument, _describe(rows[0]), str(error))

  def score(self, rows: List[Union[Tuple[str, str], str]],
            jit_compile, window) -> List[Tuple[float, Optional[bool]]]:
    """Scores pairs (`loglikelihood`) and texts (`loglikelihood_rolling`).

    Args:
      rows: `(context, continuation)` tuples and whole texts (str), checked
        for their types; one call per kind.
      jit_compile: as for `loglikelihood`.
      window: as for `loglikelihood`.

    Returns:
      `(logprob, is_greedy)` per row (is_greedy None for a text), in order.

    Raises:
      errors.ArgumentError: naming the record at fault.
    """
    # pylint: disable-next=g-import-not-at-top
    from rnnstep import api
    for row in rows:  # Named here: the library names an index of the batch.
      texts = ({"text": row} if isinstance(row, str) else
               {"context": row[0], "context + continuation": row[0] + row[1]})
      for field, text in texts.items():
        try:
          ids = self.model.encode(text)
        except ValueError as e:
          raise _refuse(field.split()[0], _describe(row),
                        f"{field}: {e}") from None
        if not len(ids):
          raise _refuse(field, _describe(row), f"the {field} gives no tokens; "
                        "the model reads the first token from the zero state, "
                        "so give at least one")
    out = [None] * len(rows)
    pairs = [i for i, row in enumerate(rows) if not isinstance(row, str)]
    texts = [i for i, row in enumerate(rows) if isinstance(row, str)]
    if pairs:
      for i, score in zip(pairs, api.loglikelihood(
          self.model, [rows[i] for i in pairs], jit_compile=jit_compile,
          window=window)):
        out[i] = score
    if texts:
      for i, logprob in zip(texts, api.loglikelihood_rolling(
          self.model, [rows[i] for i in texts], jit_compile=jit_compile,
          window=window)):
        out[i] = (logprob, None)
    return out


def _load_remote(path: str, dtype: str):
  """Loads a model file from any filesystem Beam reads (gs://, s3://, ...).

  Copied to a local temporary file first (the model file's reader needs a
  seekable local file), removed once loaded.
  """
  # pylint: disable=g-import-not-at-top
  import os
  import shutil
  import tempfile
  from apache_beam.io import filesystems
  from rnnstep import api
  # pylint: enable=g-import-not-at-top
  suffix = os.path.splitext(path)[1]
  with tempfile.TemporaryDirectory(prefix="rnnstep_pipelines_") as folder:
    local = os.path.join(folder, "model" + suffix)
    with filesystems.FileSystems.open(
        path, compression_type="uncompressed") as source, open(
            local, "wb") as target:
      shutil.copyfileobj(source, target)
    return api.load(local, dtype=dtype)


class _Handler(base.ModelHandler):
  """What both handlers share: loading, batching and Beam's settings."""

  def __init__(self, model_path, dtype, jit_compile, min_batch_size,
               max_batch_size, max_batch_duration_secs, large_model,
               model_copies):
    # Beam's own keyword arguments of `ModelHandler.__init__` came in Beam
    # 2.6x: kept here and read by the methods below, for every Beam.
    super().__init__()
    self._model_path = model_path
    self._dtype = dtype
    self._jit_compile = jit_compile
    self._batching = {name: value for name, value in (
        ("min_batch_size", min_batch_size), ("max_batch_size", max_batch_size),
        ("max_batch_duration_secs", max_batch_duration_secs))
                      if value is not None}
    self._large_model = bool(large_model or model_copies)
    self._copies = model_copies

  def load_model(self) -> LoadedModel:
    """Loads the model (once per worker process: RunInference shares it)."""
    return LoadedModel(self._model_path, self._dtype)

  def batch_elements_kwargs(self) -> Mapping[str, Any]:
    if "min_batch_size" in self._batching or "max_batch_size" in self._batching:
      return dict(self._batching)
    # Neither given: the jsonl job's batch (`rnnstep-generate --input`), fixed.
    # (Beam's own default grows batches from 1, and each new size would
    # compile on the XLA path.)
    # pylint: disable-next=g-import-not-at-top
    from rnnstep.engine import paths
    return dict(self._batching, min_batch_size=paths.BULK_BATCH_SIZE,
                max_batch_size=paths.BULK_BATCH_SIZE)

  def share_model_across_processes(self) -> bool:
    return self._large_model

  def model_copies(self) -> int:
    return self._copies or 1

  def validate_inference_args(self, inference_args):
    if inference_args:
      raise errors.ArgumentError(
          "inference_args", f"{type(self).__name__} takes no inference_args; "
          "give the options to the handler (or, for generation, per record)")

  def get_metrics_namespace(self) -> str:
    return "RunInference-rnnstep"


class CompletionsModelHandler(_Handler):
  """Generates a continuation of each record's prompt, for RunInference.

  Input records: a prompt (str), or a dict `{"prompt": str, "seed"?: int,
  ...}` that may also set, for itself, `max_tokens`, `stop`, `regex` and any
  decoding option of `rnnstep.generate` (`temperature`, `top_k`, ...; not
  `num_return_sequences`); what it leaves out, the handler's arguments give.
  Records run in one call whatever their per-row options (temperature,
  top_k, top_p, min_p, typical_p, repetition_penalty, frequency_penalty,
  presence_penalty, regex: `generate` takes one value per prompt) and seeds; records that differ in a per-call
  setting (max_tokens, stop, the look-back, beam and window options) are
  grouped, one `generate` call per group of the batch.

  Output: `PredictionResult(record, inference={"text": the continuation,
  "logprob": its log-likelihood under the model (nats), "seed": the seed it
  ran with, "stopped": whether it ended on a stop string}, model_id=the
  model path)`, in the batch's order. For keys, wrap the handler in Beam's
  `KeyedModelHandler`.

  A bad record (an unknown character in its prompt, a bad option value)
  fails its batch with a one-line `rnnstep.errors.ArgumentError` naming the
  record and the field; `RunInference(...).with_exception_handling()` sends
  such batches to its failed output instead.
  """

  def __init__(self, model_path: Optional[str] = None, *, max_tokens: int,
               seed: Optional[int] = None, stop=None,
               regex: Optional[str] = None, dtype: str = "float32",
               jit_compile: Union[None, bool, str] = None,
               min_batch_size: Optional[int] = None,
               max_batch_size: Optional[int] = None,
               max_batch_duration_secs: Optional[int] = None,
               large_model: bool = False, model_copies: Optional[int] = None,
               **decoding_options):
    """Checks the arguments (in the process that builds the pipeline).

    Args:
      model_path: a model file (or another file `rnnstep.load` reads
        without a corpus or vocabulary), local to the workers or on any
        filesystem Beam reads (gs://, s3://, hdfs://: copied to a local
        temporary file to load); None: the bundled model.
      max_tokens: tokens to generate per record (`generate`'s `num_steps`).
      seed: the base of the seeds of records without one
        (`rnnstep.record_seed`); None draws one here, once for the whole
        pipeline (each result reports the seed it ran with). Give it for
        texts a rerun repeats.
      stop: a stop string or a list of them, as for `generate`.
      regex: a regular expression each continuation keeps to, or None.
      dtype: the compute dtype the workers load the model with.
      jit_compile: the path, as for `generate` (None: the fastest measured
        for the model and each call's batch size).
      min_batch_size: the fewest records `BatchElements` puts in a batch.
      max_batch_size: the most; Beam grows batches between the two as it
        times them. Neither given: batches of the jsonl job's default size
        (`rnnstep.engine.paths.BULK_BATCH_SIZE`), fixed.
      max_batch_duration_secs: in streaming pipelines, how long a batch may
        wait to fill.
      large_model: load one model per machine and share it across the
        worker processes (Beam's `share_model_across_processes`): one copy
        in memory (a large model on an accelerator), every call through the
        process that holds it.
      model_copies: with `large_model`, how many copies per machine.
      **decoding_options: `generate`'s decoding options, one value each.

    Raises:
      errors.ArgumentError: a bad argument, naming it.
      TypeError: an unknown keyword argument.
    """
    super().__init__(model_path, dtype, jit_compile, min_batch_size,
                     max_batch_size, max_batch_duration_secs, large_model,
                     model_copies)
    for name in decoding_options:
      if name not in options_lib.BY_NAME:
        raise TypeError(f"CompletionsModelHandler() got an unexpected keyword "
                        f"argument {name!r}")
    # The handler's settings are every record's defaults: checked as one.
    self._defaults = dict(decoding_options, max_tokens=max_tokens, stop=stop,
                          regex=regex)
    given = _checked("CompletionsModelHandler", "", dict(self._defaults,
                                                          seed=seed))
    self._seed = (secrets.randbelow(2**_DRAWN_SEED_BITS) if seed is None
                  else given.seed)

  @property
  def seed(self) -> int:
    """The base seed of records without one (given, or drawn once)."""
    return self._seed

  def record(self, record: Record) -> Dict[str, Any]:
    """A record's settings: its own, the handler's for the rest, its seed.

    Raises:
      errors.ArgumentError: naming the record and the field.
    """
    if isinstance(record, str):
      prompt, fields = record, {}
    elif isinstance(record, Mapping):
      prompt, fields = record.get("prompt"), record
      if not isinstance(prompt, str):
        raise _refuse("prompt", _describe(record), f"\"prompt\" must be a "
                      f"str, got {prompt!r}")
    else:
      raise errors.ArgumentError(
          "prompt", f"a record must be a prompt (str) or a dict with a "
          f"\"prompt\", got {type(record).__name__} {repr(record)[:40]}")
    where = _describe(record)
    if not prompt:
      raise _refuse("prompt", where, "the prompt is empty; give at least one "
                    "character (or token)")
    for name in fields:
      if name not in _RECORD_FIELDS and name not in options_lib.BY_NAME:
        raise _refuse(name, where, f"unknown field {name!r}; a record has "
                      f"{', '.join(_RECORD_FIELDS)} and the decoding options "
                      f"({', '.join(_RECORD_OPTIONS)})")
    given = dict(self._defaults, **{name: value for name, value
                                    in fields.items() if name != "prompt"})
    checked = _checked(where, prompt, given)
    row = dict(checked.options, prompt=prompt, max_tokens=checked.num_steps,
               stop=checked.stop,
               regex=checked.regex[0] if checked.regex else None)
    if checked.seed is not None:
      row["seed"] = checked.seed
    else:
      # pylint: disable-next=g-import-not-at-top
      from rnnstep.engine import host
      row["seed"] = host.record_seed(self._seed, prompt_index(prompt))
    return row

  def run_inference(self, batch: Sequence[Record], model: LoadedModel,
                    inference_args: Optional[Dict[str, Any]] = None
                    ) -> Iterable[base.PredictionResult]:
    """Generates a batch: one `generate` call per group of per-call settings.

    Args:
      batch: records, as described on the class.
      model: what `load_model` returned (or Beam's proxy of it).
      inference_args: refused when the pipeline is built.

    Returns:
      One `PredictionResult` per record, in order.

    Raises:
      errors.ArgumentError: a bad record, naming it and the field.
    """
    del inference_args  # validate_inference_args refuses any.
    rows = [self.record(record) for record in batch]  # All checked first.
    groups: Dict[tuple, List[int]] = {}
    for index, row in enumerate(rows):
      groups.setdefault(tuple(row.get(name) for name in _PER_CALL),
                        []).append(index)
    results = [None] * len(rows)
    for indices in groups.values():
      texts, scores = model.generate([rows[i] for i in indices],
                                     self._jit_compile)
      for index, text, score in zip(indices, texts, scores):
        row = rows[index]
        results[index] = base.PredictionResult(
            batch[index], {"text": text, "logprob": float(score),
                           "seed": row["seed"],
                           "stopped": records_lib.stopped(text,
                                                          row["stop"])},
            model_id=self._model_path)
    return results

  def get_num_bytes(self, batch: Sequence[Record]) -> int:
    return sum(len(str(r if isinstance(r, str) else r.get("prompt", "")))
               for r in batch)


class LoglikelihoodModelHandler(_Handler):
  """Scores given continuations, or whole texts, for RunInference.

  The meaning is lm-evaluation-harness's, as `rnnstep.loglikelihood`'s and
  `rnnstep.loglikelihood_rolling`'s. A record is a `(context,
  continuation)` pair (a tuple or list, or a dict `{"context",
  "continuation"}`), scored as `PredictionResult(record, inference=
  {"logprob": the continuation's log-likelihood after the context (nats),
  "is_greedy": whether greedy decoding from the context gives exactly
  it})`; or a text (a str, or a dict `{"text"}`), scored whole as
  `{"logprob"}`. A batch is one call per kind (each a few compiled calls,
  one per length bucket).
  """

  def __init__(self, model_path: Optional[str] = None, *,
               dtype: str = "float32",
               jit_compile: Union[None, bool, str] = None,
               window: Optional[int] = None,
               min_batch_size: Optional[int] = None,
               max_batch_size: Optional[int] = None,
               max_batch_duration_secs: Optional[int] = None,
               large_model: bool = False, model_copies: Optional[int] = None):
    """Checks the arguments (in the process that builds the pipeline).

    Args:
      model_path: as `CompletionsModelHandler`'s.
      dtype: the compute dtype the workers load the model with.
      jit_compile: the path, as for `loglikelihood`.
      window: as for `loglikelihood` (None: the model's recorded window).
      min_batch_size, max_batch_size, max_batch_duration_secs, large_model,
        model_copies: as `CompletionsModelHandler`'s.

    Raises:
      errors.ArgumentError: a bad argument, naming it.
    """
    super().__init__(model_path, dtype, jit_compile, min_batch_size,
                     max_batch_size, max_batch_duration_secs, large_model,
                     model_copies)
    with _blamed("LoglikelihoodModelHandler"):
      records_lib.one_value("window", window)
      self._window = options_lib.check("window", window)

  @staticmethod
  def record(record) -> Union[str, Tuple[str, str]]:
    """A record as a text (str) or a (context, continuation) tuple.

    Raises:
      errors.ArgumentError: naming the record and the field.
    """
    if isinstance(record, Mapping):
      names = sorted(record)
      fields = (("text",) if names == ["text"] else
                ("context", "continuation")
                if names == ["context", "continuation"] else None)
      values = None if fields is None else tuple(record[n] for n in fields)
    elif isinstance(record, (list, tuple)) and len(record) == 2:
      fields, values = ("context", "continuation"), tuple(record)
    else:
      fields, values = ("text",), (record,)
    if fields is None or not all(isinstance(v, str) for v in values):
      raise errors.ArgumentError(
          (fields or ("text",))[0], f"{_describe(record)}: a record must be "
          "a (context, continuation) pair of str (or a dict {\"context\", "
          "\"continuation\"}), or a text: a str (or a dict {\"text\"})")
    return values[0] if len(values) == 1 else values

  def run_inference(self, batch: Sequence[Union[str, Pair]],
                    model: LoadedModel,
                    inference_args: Optional[Dict[str, Any]] = None
                    ) -> Iterable[base.PredictionResult]:
    """Scores a batch: one call for its pairs, one for its texts.

    Args:
      batch: records, as described on the class.
      model: what `load_model` returned (or Beam's proxy of it).
      inference_args: refused when the pipeline is built.

    Returns:
      One `PredictionResult` per record, in order.

    Raises:
      errors.ArgumentError: a bad record, naming it and the field.
    """
    del inference_args  # validate_inference_args refuses any.
    rows = [self.record(record) for record in batch]
    scores = model.score(rows, self._jit_compile, self._window)
    return [base.PredictionResult(
        record, {"logprob": float(logprob)} if greedy is None else
        {"logprob": float(logprob), "is_greedy": bool(greedy)},
        model_id=self._model_path)
            for record, (logprob, greedy) in zip(batch, scores)]

  def get_num_bytes(self, batch) -> int:
    return sum(len(str(record)) for record in batch)
