"""rnnstep-generate's TensorFlow path: the library's call for a run the warm
path (`rnnstep.litert.warm`) does not serve.

`generate` takes the run as plain values, picks the path for a process that
generates once (`paths.one_shot_path`, unless --[no]jit_compile chose one),
calls `rnnstep.generate` (one beam search per prompt with num_beams > 1) or
`rnnstep.stream`, and hands the texts and scores to the command's printer;
a ValueError from the library becomes one line naming the flag behind it.
While a call runs, `Progress` shows a spinner on a terminal.
"""

import threading
import time

import numpy as np

from rnnstep.cli import common
from rnnstep.decoding import options as options_lib
from rnnstep import errors
import rnnstep


def generate(model, prompts, per_prompt: int, num_steps: int, printer, *,
             seed: int, decoding: dict, stop, regex, jit_compile, stream: bool,
             chunk_size: int, flag_values, program: str, announce,
             initial_state=None):
  """Calls the library (one batch) and prints through `printer`.

  Args:
    model: the loaded model.
    prompts: the distinct prompts (--prompt).
    per_prompt: rows per prompt: samples, or with num_beams > 1 the
      hypotheses returned.
    num_steps, seed: the run's.
    printer: the command's printer (`add(texts, scores)`, `finish()`).
    decoding: every decoding option by name, per-row ones one value or one
      per row.
    stop: the stop strings (a list).
    regex: None, a pattern, or one per row.
    jit_compile: --[no]jit_compile, or None.
    stream, chunk_size: --stream and --chunk_size.
    initial_state: None, or the one-row state every row starts from
      (--state; `rnnstep.load_state`).
    flag_values: the command's flags (a library argument error names one).
    program: the command's name, for the spinner.
    announce: called with the phrase saying which path runs and why (for
      --verbose), before the call.

  Raises:
    common.Failure: the library refused a value (naming the flag).
  """
  unique = list(prompts)
  prompts = [prompt for prompt in unique for _ in range(per_prompt)]
  beams = decoding["num_beams"]
  # Beam search runs num_beams rows per prompt.
  batch = len(prompts) if beams == 1 else len(unique) * beams
  jit_compile, which = _jit_compile(model, jit_compile, batch, num_steps,
                                    len(unique) if beams > 1 else len(prompts))
  announce(which)
  # Scores only where the output prints them: without, a generation takes
  # the loop with no scoring in it (`pipeline.takes_plain_tail`).
  scored = printer.prints_scores
  common_args = dict(seed=seed, stop=stop or None, return_scores=True,
                     jit_compile=jit_compile, regex=regex)
  as_printed = dict(common_args, return_scores=scored)
  with_scores = lambda result: result if scored else (result, None)
  state_of = lambda rows: None if initial_state is None else [
      {name: np.repeat(value, rows, axis=0) for name, value in layer.items()}
      for layer in initial_state]
  sampling = {name: value for name, value in decoding.items()
              if options_lib.BY_NAME[name].streams}
  # This process generates once: its programs are traced for the loop
  # its requests take (`generator.one_tail`).
  from rnnstep.engine import generator  # pylint: disable=g-import-not-at-top
  try:
    with generator.one_tail():
      if stream:
        for result in rnnstep.stream(model, prompts, num_steps,
                                     chunk_size=chunk_size,
                                     initial_state=state_of(len(prompts)),
                                     **sampling, **as_printed):
          printer.add(*with_scores(result))
      elif beams > 1:
        # One beam search per prompt; its hypotheses are the prompt's rows.
        returned = decoding["num_return_sequences"]
        # Per-row values belong to rows; beams run one row per prompt.
        per_prompt = {name: (value[::returned] if isinstance(value, list)
                             else value) for name, value in decoding.items()}
        if isinstance(common_args["regex"], list):
          common_args["regex"] = common_args["regex"][::returned]
        with Progress(program, f"beam search, {beams} beams x "
                      f"{len(unique)} prompts x {num_steps} characters"):
          texts, scores = rnnstep.generate(
              model, unique, num_steps, initial_state=state_of(len(unique)),
              **per_prompt, **common_args)
        if returned == 1:
          texts, scores = [[t] for t in texts], [[s] for s in scores]
        printer.add([t for per in texts for t in per],
                    [s for per in scores for s in per])
      else:
        with Progress(program,
                      f"generating {len(prompts)} x {num_steps} characters"):
          printer.add(*with_scores(rnnstep.generate(
              model, prompts, num_steps,
              initial_state=state_of(len(prompts)), **decoding,
              **as_printed)))
      printer.finish()
  except ValueError as e:
    raise _blame(model, prompts, stop, e, num_steps, flag_values) from None


def _jit_compile(model, given, batch: int, num_steps: int, calls_rows: int):
  """The `jit_compile` to run, and a phrase saying which path and why.

  --jit_compile/--nojit_compile (`given`) when given, else the path for a
  process that generates once (`paths.one_shot_path`) over `batch` rows.
  Where that is the graph path only because XLA's compile would cost more
  than it saves, None: the library's XLA where the call's program is in
  XLA's disk cache, else the graph path, compiling nothing
  (`compiling.generate_once`; `calls_rows`, the rows `rnnstep.generate`
  is given, must pick XLA there too); not for RWKV-7 (see below).
  """
  from rnnstep.engine import compiling  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  from rnnstep.model import network  # pylint: disable=g-import-not-at-top
  if given is not None:
    return given, (
        f"{paths.from_jit_compile(given)} path, as "
        f"--{'' if given else 'no'}jit_compile says")
  path = paths.one_shot_path(model, batch, num_steps)
  default = paths.default_path(model, batch)
  if path == paths.GRAPH and default != path:
    which = (f"graph path: {num_steps} steps in float32, where compiling "
             f"{'XLA' if default == paths.XLA else 'the elementwise path'} "
             "would cost this one run more than it saves")
    # A model that unrolls block by block (RWKV-7) lowers to so large an
    # HLO that finding its program on disk (a trace and the lowering)
    # costs a short run more than XLA saves it.
    if (paths.default_path(model, calls_rows) == paths.XLA
        and not network.unrolls_blockwise(model.config)):
      compiling.generate_once()
      return None, f"{which}; XLA where its disk cache holds the program"
  else:
    which = f"{path} path"
  return paths.jit_compile_of(path), which


def _blame(model, prompts, stops, error, num_steps,
           flag_values) -> common.Failure:
  """Names the flag behind a ValueError from the library."""
  # A token model's stop strings are matched over its text, not encoded.
  checked = (("--prompt", prompts), ("--stop", stops if model.is_characters
                                     else ()))
  for flag, texts in checked:
    for text in texts:
      try:
        model.encode(text)
      except ValueError as e:
        return common.Failure(f"{flag}={text!r}: {e}", common.EXIT_USAGE)
  # The library's argument errors name their argument; its flag has the name.
  argument = getattr(error, "argument", None)
  if isinstance(error, errors.ArgumentError) and argument in flag_values:
    return common.Failure(f"--{argument}: {error}", common.EXIT_USAGE)
  return common.Failure(f"--num_steps={num_steps} for {len(prompts)} "
                        f"rows (prompts x --num_samples): {error}")


class Progress:
  """A spinner and elapsed time on stderr while a device call runs (TTY only)."""

  def __init__(self, program: str, label: str, stream=None,
               interval: float = 0.2):
    self._program = program
    self._label = label
    self._stream = stream or common.stderr()
    self._interval = interval
    self._done = threading.Event()
    self._thread = None

  def __enter__(self):
    try:
      tty = self._stream.isatty()
    except (AttributeError, ValueError):
      tty = False
    if tty:
      self._thread = threading.Thread(target=self._spin, daemon=True)
      self._thread.start()
    return self

  def _spin(self):
    start = time.monotonic()
    frames = "|/-\\"
    tick = 0
    while True:
      self._stream.write(f"\r{frames[tick % len(frames)]} {self._program}: "
                         f"{self._label}, {time.monotonic() - start:.1f} s")
      self._stream.flush()
      tick += 1
      if self._done.wait(self._interval):
        return

  def __exit__(self, *exc_info):
    if self._thread is not None:
      self._done.set()
      self._thread.join()
      self._stream.write("\r\033[K")  # Erase the line.
      self._stream.flush()
    return False
