"""Timing: warm-up, interleaved rounds, medians, and the numbers' formats."""

import os
import statistics
import sys
import time


def log(*args):
  print(*args, file=sys.stderr, flush=True)


def timed(fn, *args):
  start = time.perf_counter()
  fn(*args)
  return time.perf_counter() - start


def run_rounds(jobs, rounds, label):
  """jobs: list of (key, fn, args). Warm-up each, then interleaved rounds.

  Returns: {key: [seconds per round]} and the warm-up seconds per key.
  """
  warmup = {}
  for key, fn, args in jobs:
    log(f"[{label}] warm-up {key} ...")
    warmup[key] = timed(fn, *args)
    timed(fn, *args)  # A second call: any lazy second trace (OneStep) is done.
  samples = {key: [] for key, _, _ in jobs}
  for r in range(rounds):
    shift = r % len(jobs)
    order = jobs[shift:] + jobs[:shift]
    log(f"[{label}] round {r + 1}/{rounds} (load {os.getloadavg()[0]:.2f})")
    for key, fn, args in order:
      samples[key].append(timed(fn, *args))
  return samples, warmup


def fmt_ms(seconds):
  return f"{seconds * 1e3:,.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def spread(values):
  med = statistics.median(values)
  return (max(values) - min(values)) / med * 100 if med > 0 else 0.0

