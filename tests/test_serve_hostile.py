"""Misbehaving clients under load, small: `tools/bench/serve_hostile.py`'s run.

A real `rnnstep-serve` (with an API key and a served model name) on the tiny
GRU of `cli.write_model`, on the graph path: a clean run of random valid
requests, then the same requests at the same times with a fifth of the
arrivals hostile (every case of `serve_hostile.HOSTILE` at least once: the
issue's bodies, wrong and missing keys, slow uploads, disconnects
mid-stream). Every valid response equals `rnnstep.generate`, every hostile
one gets its status and OpenAI's error body, nothing gets a 5xx, the
server's memory stays within its bound and no row is left running. The
latency ratio is the benchmark's to report (`python
tools/bench/serve_hostile.py`), not asserted here: a two-core machine shared
with other tests times nothing reliably.
"""

import pytest

from tests.support import cli
from tests.support import serve_process
from tools.bench import serve_hostile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not serve_process.stack_installed(),
                       reason="the serving stack is not installed")]


def test_hostile_clients_get_their_4xx_and_valid_ones_generate_s_text(
    tmp_path):
  path = str(tmp_path / "tiny.npz")
  cli.write_model(path)
  cases = len(serve_hostile.HOSTILE)
  report = serve_hostile.run(serve_hostile.Settings(
      model=path, num_requests=5 * cases, max_tokens=40, max_batch=8,
      chunk_steps=8, saturation_requests=16, slow_pieces=3, slow_pause=0.1,
      timeout=120),
                             log=lambda line: None)
  assert report.failures(timing=False) == [], report.summary()
  mixed = [o.planned.kind for o in report.runs[1].outcomes]
  assert set(mixed) == {"valid", *serve_hostile.HOSTILE}
  assert mixed.count("valid") == 4 * cases
