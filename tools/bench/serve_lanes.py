"""One server's defaults (or the flags given) as a user meets them: one
request's decode rate, then N requests at once.

    python tools/bench/serve_lanes.py --model=m.npz --rounds=3 \\
        --one_request=1,257 --at_once=16 --at_once_tokens=64 \\
        -- --weights_dtype=float16 [--lanes=2 ...]

Starts `rnnstep-serve --model=M --api_key=k --port=FREE` plus the flags
after `--`, waits until `/health` answers and says `programs_compiling: 0`
(printing both times), then: one greedy completion of the short and the
long length in turn, --rounds times, its decode rate the tokens between
them over the difference of the times (median and range); and --at_once
clients each asking --at_once_tokens tokens from its own prompt, all at
once, total completion tokens over the wall time, --rounds times; then the
server's resident memory and its peak (`/proc/PID/status`). The
evidence for `rnnstep.serve.lanes.ONE_LANE_CELL_KINDS`
(benchmarks/results/serve-rwkv7-lanes-xeon-amx-2026-12.md). Run it under
`flock /tmp/bench.lock`, one server at a time, and pair the variants.
"""

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

KEY = "k"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def wait_compiled(url: str, proc, started: float, log) -> tuple:
  """(seconds to the first 200 of /health, seconds to programs_compiling 0)."""
  ready = None
  while True:
    try:
      answer = httpx.get(url + "/health", timeout=5)
      if answer.status_code == 200:
        ready = ready or time.monotonic() - started
        if answer.json().get("programs_compiling", 0) == 0:
          return ready, time.monotonic() - started
    except httpx.HTTPError:
      pass
    if proc.poll() is not None:
      log.seek(0)
      sys.exit("the server ended: " + log.read()[-2000:])
    time.sleep(1)


def resident_memory(pid: int) -> str:
  """The process's resident memory now and at its peak, in GB."""
  fields = {}
  with open(f"/proc/{pid}/status") as status:
    for line in status:
      name, _, value = line.partition(":")
      if name in ("VmRSS", "VmHWM"):
        fields[name] = int(value.split()[0]) * 1024 / 1e9
  return (f"resident {fields['VmRSS']:.2f} GB (peak "
          f"{fields['VmHWM']:.2f} GB)")


def complete(client, url: str, prompt: str, tokens: int) -> dict:
  answer = client.post(url + "/v1/completions", json={
      "prompt": prompt, "max_tokens": tokens, "temperature": 0})
  answer.raise_for_status()
  return answer.json()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", required=True)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--one_request", default="1,257",
                      help="the short and the long completion, in tokens")
  parser.add_argument("--at_once", type=int, default=16,
                      help="clients at once (0: none)")
  parser.add_argument("--at_once_tokens", type=int, default=64)
  args, server_flags = parser.parse_known_args()
  server_flags = [f for f in server_flags if f != "--"]
  short, long = (int(x) for x in args.one_request.split(","))
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  command = ["rnnstep-serve", f"--model={args.model}", f"--api_key={KEY}",
             f"--port={port}", *server_flags]
  with tempfile.TemporaryFile("w+") as log:
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    try:
      ready, compiled = wait_compiled(url, proc, started, log)
      print(f"flags {server_flags}: ready {ready:.1f} s, programs compiled "
            f"{compiled:.1f} s", flush=True)
      headers = {"Authorization": f"Bearer {KEY}"}
      with httpx.Client(timeout=600, headers=headers) as client:
        complete(client, url, "The ", long)  # The calls' first runs.
        complete(client, url, "The ", short)
        rates = []
        for _ in range(args.rounds):
          t0 = time.perf_counter()
          complete(client, url, "The ", short)
          t1 = time.perf_counter()
          complete(client, url, "The ", long)
          t2 = time.perf_counter()
          rates.append((long - short) / ((t2 - t1) - (t1 - t0)))
      print(f"one request: {statistics.median(rates):.1f} tokens/s "
            f"({min(rates):.1f}-{max(rates):.1f})", flush=True)
      for _ in range(args.rounds if args.at_once else 0):
        tokens = [0] * args.at_once

        def one(i):
          with httpx.Client(timeout=600, headers=headers) as own:
            tokens[i] = complete(own, url, f"Row {i} ", args.at_once_tokens
                                 )["usage"]["completion_tokens"]

        threads = [threading.Thread(target=one, args=(i,))
                   for i in range(args.at_once)]
        t0 = time.perf_counter()
        for thread in threads:
          thread.start()
        for thread in threads:
          thread.join()
        seconds = time.perf_counter() - t0
        print(f"{args.at_once} at once x {args.at_once_tokens}: "
              f"{sum(tokens) / seconds:.1f} tokens/s ({seconds:.1f} s)",
              flush=True)
      print(resident_memory(proc.pid), flush=True)
    finally:
      proc.terminate()
      proc.wait(60)


if __name__ == "__main__":
  main()
