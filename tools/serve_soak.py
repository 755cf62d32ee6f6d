"""A long mixed run against a real rnnstep-serve: every response checked, memory sampled.

    python tools/serve_soak.py --num_requests=500                # a tiny random model
    python tools/serve_soak.py --model=bundled --max_tokens=300  # the bundled model

Sends `--num_requests` random requests (prompts, lists, n, stop strings,
penalties, filters, seeds: `serve_process.random_body`) from
`--concurrency` clients, half of the single-choice ones streamed, retrying
after a 429; compares every choice's text and finish reason with
`rnnstep.generate` for the same request (on the server's path), and reads
the server's resident memory (VmRSS) every `--every` responses.
"""

import concurrent.futures
import json
import os
import pathlib
import random
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# pylint: disable=g-import-not-at-top,wrong-import-position
import httpx
import rnnstep
from rnnstep import api
from tests.support import cli
from tests.support import serve_process

_MODEL = flags.DEFINE_string("model", None, "Model file; 'bundled' for the "
                             "bundled model; default: a tiny random GRU.")
_NUM_REQUESTS = flags.DEFINE_integer("num_requests", 500, "Requests.")
_CONCURRENCY = flags.DEFINE_integer("concurrency", 16, "Clients.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 200, "Longest max_tokens.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 16, "--max_batch.")
_CHUNK_STEPS = flags.DEFINE_integer("chunk_steps", 16, "--chunk_steps.")
_JIT_COMPILE = flags.DEFINE_enum("jit_compile", "false",
                                 ["true", "false", "elementwise"],
                                 "The server's path (and the reference's).")
_EVERY = flags.DEFINE_integer("every", 50, "Responses between memory reads.")
_SEED = flags.DEFINE_integer("seed", 0, "The request mix's seed.")

PROMPTS = ["ROMEO:", "To be", "a", "First Citizen:\nBefore we proceed",
           "KING RICHARD III:\nNow is the winter"]


def send(server, body, streamed):
  """(seed, {index: text}, {index: finish_reason}), retrying after a 429."""
  while True:
    if streamed:
      texts, reasons, seed = {}, {}, None
      with httpx.stream("POST", server.url("/v1/completions"),
                        json=dict(body, stream=True), timeout=600) as reply:
        if reply.status_code == 429:
          time.sleep(0.2)
          continue
        for line in reply.iter_lines():
          if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            seed = chunk["seed"]
            for choice in chunk["choices"]:
              texts[choice["index"]] = texts.get(choice["index"], "") + (
                  choice["text"])
              if choice["finish_reason"]:
                reasons[choice["index"]] = choice["finish_reason"]
      return seed, texts, reasons
    reply = httpx.post(server.url("/v1/completions"), json=body, timeout=600)
    if reply.status_code == 429:
      time.sleep(0.2)
      continue
    reply.raise_for_status()
    reply = reply.json()
    return (reply["seed"], {c["index"]: c["text"] for c in reply["choices"]},
            {c["index"]: c["finish_reason"] for c in reply["choices"]})


def main(argv):
  del argv
  path = _MODEL.value
  if path is None:
    path = os.path.join(tempfile.mkdtemp(), "tiny.npz")
    cli.write_model(path)
  elif path == "bundled":
    path = api.bundled_model_path()
  model = rnnstep.load(path)
  jit = {"true": True, "false": False,
         "elementwise": "elementwise"}[_JIT_COMPILE.value]
  rng = random.Random(_SEED.value)
  bodies = [serve_process.random_body(rng, PROMPTS, _MAX_TOKENS.value)
            for _ in range(_NUM_REQUESTS.value)]
  streamed = [b.get("n", 1) == 1 and rng.random() < 0.5 for b in bodies]
  started = time.monotonic()
  with serve_process.RemoteServer([
      f"--model={path}", f"--max_batch={_MAX_BATCH.value}",
      f"--chunk_steps={_CHUNK_STEPS.value}",
      f"--max_tokens_limit={_MAX_TOKENS.value}", "--max_queue=64",
      f"--jit_compile={_JIT_COMPILE.value}"]) as server:
    pid = server.process.pid
    print(f"ready after {time.monotonic() - started:.1f} s; "
          f"RSS {serve_process.rss_mib(pid):.0f} MiB", flush=True)
    lock, done, samples = threading.Lock(), [0], []

    def one(i):
      got = send(server, bodies[i], streamed[i])
      with lock:
        done[0] += 1
        if done[0] % _EVERY.value == 0:
          samples.append((done[0], serve_process.rss_mib(pid)))
          print(f"{done[0]} responses, RSS {samples[-1][1]:.0f} MiB",
                flush=True)
      return got

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(_CONCURRENCY.value) as pool:
      results = list(pool.map(one, range(len(bodies))))
    seconds = time.monotonic() - t0
    server.terminate()
  wrong = 0
  for body, (seed, texts, reasons) in zip(bodies, results):
    want, want_reasons = serve_process.expected(model, body, seed, jit)
    if ([texts.get(k) for k in range(len(want))] != want
        or [reasons.get(k) for k in range(len(want))] != want_reasons):
      wrong += 1
      print("differs:", body, flush=True)
  chars = sum(len(t) for _, texts, _ in results for t in texts.values())
  print(f"{len(bodies) - wrong}/{len(bodies)} responses equal generate; "
        f"{len(bodies) / seconds:.1f} requests/s, {chars / seconds:.0f} "
        f"characters/s; RSS by responses: {samples}")


if __name__ == "__main__":
  app.run(main)
