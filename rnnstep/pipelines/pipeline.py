"""`python -m rnnstep.pipelines`: files of records in, jsonl lines out.

Reads records (a JSON object or a prompt a line) from any files Beam reads,
runs them through `handlers.CompletionsModelHandler` (or, with --score,
`handlers.LoglikelihoodModelHandler`) under `RunInference`, and writes one
jsonl line per record, as the jsonl job (`rnnstep-generate --input`) writes
them. Beam's own flags (--runner=..., and that runner's) pass through.
"""

from typing import Mapping

from rnnstep.decoding import options as options_lib
from rnnstep import errors
from rnnstep.pipelines import handlers

PROGRAM = "python -m rnnstep.pipelines"


def _arguments(argv):
  """(rnnstep's arguments, Beam's pipeline arguments) of the command line."""
  # pylint: disable-next=g-import-not-at-top
  import argparse
  parser = argparse.ArgumentParser(
      prog=PROGRAM, description=_PIPELINE_DOC,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--input", required=True,
                      help="Files of records, one a line (a glob; any path "
                      "the runner reads: gs://, s3://, hdfs://).")
  parser.add_argument("--output", required=True,
                      help="Output prefix: files PREFIX-SSSSS-of-NNNNN.jsonl.")
  parser.add_argument("--model", default=None,
                      help="Model or weights file (default: the bundled "
                      "model); a path the workers can read.")
  parser.add_argument("--format", choices=("jsonl", "text"), default="jsonl",
                      help="jsonl: a JSON record a line; text: a prompt a "
                      "line.")
  parser.add_argument("--score", action="store_true",
                      help="Score records instead of generating "
                      "(LoglikelihoodModelHandler): {\"context\", "
                      "\"continuation\"} lines, or {\"text\"}.")
  parser.add_argument("--max_tokens", type=int, default=200,
                      help="Tokens to generate per record.")
  parser.add_argument("--seed", type=int, default=None,
                      help="Base seed of records without one (default: "
                      "drawn once, reported per record).")
  parser.add_argument("--stop", action="append", default=None,
                      help="A stop string (repeatable).")
  parser.add_argument("--regex", default=None)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--jit_compile", default="auto",
                      choices=("auto", "true", "false", "elementwise"))
  parser.add_argument("--min_batch_size", type=int, default=None)
  parser.add_argument("--max_batch_size", type=int, default=None)
  parser.add_argument("--large_model", action="store_true",
                      help="One model per machine, shared by its processes.")
  for option in options_lib.OPTIONS:
    if option.name not in handlers.REFUSED:
      parser.add_argument(f"--{option.name}", default=None,
                          type=float if option.dtype == "float32" else int,
                          help=option.doc.replace("%", "%%"))
  return parser.parse_known_args(argv)


_PIPELINE_DOC = """\
Generates (or scores) the records of files with rnnstep.pipelines' handlers, as
an Apache Beam pipeline: on the DirectRunner here, or on Dataflow, Flink or
Spark with Beam's own flags (--runner=..., and that runner's flags), which
pass through unchanged. Output lines: {"key", "prompt", "seed", "text",
"logprob", "stopped"} (a record's "key" as given, else null); with --score,
the record's fields and "logprob" (and "is_greedy").
"""


def _keyed(record):
  """A parsed jsonl record as (key, the handler's record)."""
  if isinstance(record, dict) and "key" in record:
    record = dict(record)
    return record.pop("key"), record
  return None, record


def _line(keyed) -> str:
  """(key, PredictionResult) as one output line, as the jsonl job writes it
  (less its "index": a pipeline has no order)."""
  # pylint: disable-next=g-import-not-at-top
  import json
  key, result = keyed
  record = result.example
  if isinstance(record, Mapping):
    fields = {name: record[name] for name in _ECHOED if name in record}
  elif isinstance(record, str):
    fields = {"prompt" if "text" in result.inference else "text": record}
  else:
    fields = dict(zip(("context", "continuation"), record))
  inference = dict(result.inference)
  if "seed" in inference:  # The job's order: prompt, seed, text, ...
    fields["seed"] = inference.pop("seed")
  return json.dumps({"key": key, **fields, **inference}, ensure_ascii=False)


# A record's fields an output line repeats (as the jsonl job's lines do).
_ECHOED = ("prompt", "context", "continuation", "text")


def run(argv=None, save_main_session=False):
  """Builds and runs the pipeline of `python -m rnnstep.pipelines` (its --help).

  Args:
    argv: the command line (None: sys.argv[1:]); what rnnstep does not
      know goes to Beam's `PipelineOptions`.
    save_main_session: as Beam's option (not needed: the steps live here).

  Returns:
    The finished `PipelineResult` (its metrics: RunInference's).
  """
  # pylint: disable=g-import-not-at-top
  import json
  import apache_beam as beam
  from apache_beam.ml.inference import base
  from apache_beam.options import pipeline_options
  # pylint: enable=g-import-not-at-top
  known, beam_args = _arguments(argv)
  options = pipeline_options.PipelineOptions(beam_args)
  options.view_as(pipeline_options.SetupOptions).save_main_session = (
      save_main_session)
  jit_compile = {"auto": None, "true": True, "false": False,
                 "elementwise": "elementwise"}[known.jit_compile]
  common = dict(dtype=known.dtype, jit_compile=jit_compile,
                min_batch_size=known.min_batch_size,
                max_batch_size=known.max_batch_size,
                large_model=known.large_model)
  if known.score:
    handler = handlers.LoglikelihoodModelHandler(
        known.model, window=known.window, **common)
  else:
    decoding = {option.name: getattr(known, option.name)
                for option in options_lib.OPTIONS
                if option.name not in handlers.REFUSED
                and getattr(known, option.name) is not None}
    handler = handlers.CompletionsModelHandler(
        known.model, max_tokens=known.max_tokens, seed=known.seed,
        stop=known.stop, regex=known.regex, **common, **decoding)
  parse = json.loads if known.format == "jsonl" else str
  pipeline = beam.Pipeline(options=options)
  _ = (pipeline
       | "Read" >> beam.io.ReadFromText(known.input)
       | "Parse" >> beam.Map(lambda line: _keyed(parse(line)))
       | "RunInference" >> base.RunInference(base.KeyedModelHandler(handler))
       | "Format" >> beam.Map(_line)
       | "Write" >> beam.io.WriteToText(known.output,
                                        file_name_suffix=".jsonl"))
  result = pipeline.run()
  result.wait_until_finish()
  return result


def main(argv=None) -> int:
  """`run`, with a bad argument said in one line (exit status 2)."""
  # pylint: disable-next=g-import-not-at-top
  import sys
  try:
    run(argv)
  except errors.ArgumentError as e:
    print(f"{PROGRAM}: --{e.argument}: {e}", file=sys.stderr)
    return 2
  return 0

