"""The server's prefix-state cache: time to first token of concurrent
requests sharing a long system prompt, with the cache and without (issue 61).

    python tools/bench/prefix_cache.py                  # the 0.1B RWKV-7 shape
    python tools/bench/prefix_cache.py --requests=8 --system_tokens=300
    python tools/bench/prefix_cache.py --route=chat     # once the route exists
    python tools/bench/prefix_cache.py --route=points   # in process, below

The model is the 0.1B RWKV-7 shape with seeded random weights and the world
vocabulary's size (tools/bench_rwkv7.py `random_model`'s), written to a
model file (--model: another file). Each prompt is one system text of
--system_tokens ids (lowercase letters: one id each) and a user text of
--user_tokens ids of its own; on the chat route they are a system and a user
message (the template's boundary between them is a cache point).

--route=points runs the scheduler in this process instead of a server (one
lane, the graph path), each request a `Completion` whose cache point is
the system text's end: what the chat route gives its message boundaries.

Two `rnnstep-serve` processes run in turn, one with --prefix_cache_mb=0 and
one with the default cache, each over two scenarios:
  (a) warm: one request first (it primes the system text, the cache keeps
      its states), then --requests at once;
  (b) cold: --requests at once over another system text (no state of it
      cached: the requests arrive together).
Each request streams --max_tokens tokens with its own seed; the time to its
first token is from its send to the first event that carries text. Prints
the machine's load, each scenario's median with and without the cache and
their ratio, the cache's counters (/metrics), and whether every text was the
same with and without it.
"""

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def write_model(path: str) -> None:
  """The 0.1B-shaped random RWKV-7 (tools/bench_rwkv7.py's) as a model file."""
  sys.path.insert(0, str(ROOT / "tools"))
  import bench_rwkv7  # pylint: disable=g-import-not-at-top
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  config, vocab, tensors, tokens = bench_rwkv7._random_parts()  # pylint: disable=protected-access
  model_file.write(path, config, vocab, tensors, tokens)


def letters(rng, count: int) -> str:
  return bytes(rng.integers(97, 123, count).astype(np.uint8)).decode()


class Server:
  """An `rnnstep-serve` process on a free port, healthy and compiled."""

  def __init__(self, args, flags):
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    self.process = subprocess.Popen(
        [sys.executable, "-m", "rnnstep.serve.main", f"--model={args.model}",
         f"--port={self.port}", f"--max_batch={args.max_batch}",
         f"--max_prompt_tokens={args.system_tokens + args.user_tokens + 64}",
         f"--max_tokens_limit={max(args.max_tokens, 16)}",
         f"--jit_compile={args.jit_compile}", *flags, *args.serve_args],
        cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    import httpx  # pylint: disable=g-import-not-at-top
    started = time.monotonic()
    while True:
      if self.process.poll() is not None:
        raise RuntimeError(f"rnnstep-serve {flags} exited "
                           f"{self.process.returncode}")
      try:
        reply = httpx.get(self.url + "/health", timeout=2)
        if reply.status_code == 200 and not reply.json().get(
            "programs_compiling"):
          break
      except httpx.HTTPError:
        pass
      time.sleep(0.5)
    print(f"  server {' '.join(flags) or '(defaults)'}: ready after "
          f"{time.monotonic() - started:.0f} s", flush=True)

  def metrics(self) -> dict:
    import httpx  # pylint: disable=g-import-not-at-top
    values = {}
    for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
      if line.startswith("rnnstep_prefix_cache_"):
        name, value = line.split()
        values[name[len("rnnstep_prefix_cache_"):]] = float(value)
    return values

  def close(self) -> None:
    self.process.terminate()
    try:
      self.process.wait(60)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()


def body(route: str, system: str, user: str, seed: int, max_tokens: int
         ) -> dict:
  common = dict(max_tokens=max_tokens, seed=seed, temperature=0.8,
                stream=True)
  if route == "chat":
    return dict(common, messages=[dict(role="system", content=system),
                                  dict(role="user", content=user)])
  return dict(common, prompt=system + user)  # "points" splits it again.


async def one(client, url: str, route: str, request: dict):
  """(seconds to the first event carrying text, the whole text)."""
  path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
  sent, first, text = time.monotonic(), None, []
  async with client.stream("POST", url + path, json=request) as reply:
    if reply.status_code != 200:
      raise RuntimeError(f"{path}: {reply.status_code} "
                         f"{(await reply.aread())[:300]!r}")
    async for line in reply.aiter_lines():
      if not line.startswith("data: {"):
        continue
      for choice in json.loads(line[6:])["choices"]:
        piece = (choice.get("delta", {}).get("content") if route == "chat"
                 else choice.get("text")) or ""
        if piece and first is None:
          first = time.monotonic() - sent
        text.append(piece)
  return first, "".join(text)


async def burst(url: str, route: str, requests):
  import httpx  # pylint: disable=g-import-not-at-top
  limits = httpx.Limits(max_connections=len(requests) + 4)
  async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
    return await asyncio.gather(*(one(client, url, route, r)
                                  for r in requests))


def scenarios(args):
  """[(name, warm-up requests, the burst)] over two system texts."""
  rng = np.random.default_rng(0)
  systems = [letters(rng, args.system_tokens) for _ in range(2)]
  users = [letters(rng, args.user_tokens) for _ in range(args.requests + 1)]
  make = lambda system, i: body(args.route, system, users[i], i,
                                args.max_tokens)
  return [("warm", [make(systems[0], args.requests)],
           [make(systems[0], i) for i in range(args.requests)]),
          ("cold", [], [make(systems[1], i) for i in range(args.requests)])]


def run_server(args, flags):
  """{scenario: (first-token seconds, texts)}, and the cache's counters."""
  server = Server(args, flags)
  out = {}
  try:
    for name, warm_up, requests in scenarios(args):
      for request in warm_up:
        asyncio.run(burst(server.url, args.route, [request]))
      results = asyncio.run(burst(server.url, args.route, requests))
      out[name] = ([r[0] for r in results], [r[1] for r in results])
      print(f"    {name}: median first token "
            f"{statistics.median(out[name][0]):.2f} s "
            f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return out, server.metrics()
  finally:
    server.close()


def run_in_process(args, cache_mb: float):
  """`run_server`'s results from a `Scheduler` in this process, each request
  a completion with a cache point at the system text's end."""
  import threading  # pylint: disable=g-import-not-at-top
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.decoding import options as options_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import completion as completion_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import prefix_cache as prefix_cache_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import scheduler as scheduler_lib  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(args.model)
  cache = (prefix_cache_lib.PrefixCache(
      prefix_cache_lib.megabytes_to_bytes(cache_mb)) if cache_mb else None)
  scheduler = scheduler_lib.Scheduler(
      model, path="graph" if args.jit_compile == "false" else "xla",
      max_batch=args.max_batch, chunk_steps=128, max_queue=256,
      max_tokens_limit=max(args.max_tokens, 16),
      max_prompt_tokens=args.system_tokens + args.user_tokens + 64,
      prefix_cache=cache)
  scheduler.warm_up()
  scheduler.start()

  def submit(request):
    """(an event set at the first token, the times, the text pieces)."""
    system, user = request["prompt"][:args.system_tokens], request[
        "prompt"][args.system_tokens:]
    first, pieces, done = [], [], threading.Event()
    sent = time.monotonic()

    def sink(update):
      if update.text and not first:
        first.append(time.monotonic() - sent)
      pieces.append(update.text)
      if update.finish_reason:
        done.set()

    params = options_lib.Params(**{
        o.name: request.get(o.name, o.default) for o in options_lib.PER_ROW})
    scheduler.submit(completion_lib.Completion(
        [model.encode(system + user)], [params], seed=request["seed"],
        max_tokens=request["max_tokens"], shared=completion_lib.Shared(),
        want_scores=False, sink=sink,
        cache_points=[len(model.encode(system))]))
    return done, first, pieces

  out = {}
  try:
    for name, warm_up, requests in scenarios(args):
      for request in warm_up:
        submit(request)[0].wait()
      runs = [submit(r) for r in requests]
      for done, _, _ in runs:
        done.wait()
      out[name] = ([r[1][0] for r in runs], ["".join(r[2]) for r in runs])
      print(f"    {name}: median first token "
            f"{statistics.median(out[name][0]):.2f} s "
            f"(load {os.getloadavg()[0]:.1f})", flush=True)
  finally:
    scheduler.close(timeout=60)
  counters = {} if cache is None else {
      k: getattr(cache, k) for k in ("hits", "misses", "tokens_saved",
                                     "bytes_held", "evictions")}
  return out, counters


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default=None,
                      help="model file (default: the 0.1B RWKV-7 shape, "
                      "random, written to a temporary folder)")
  parser.add_argument("--route", choices=("completions", "chat", "points"),
                      default="completions")
  parser.add_argument("--requests", type=int, default=32)
  parser.add_argument("--system_tokens", type=int, default=1000)
  parser.add_argument("--user_tokens", type=int, default=20)
  parser.add_argument("--max_tokens", type=int, default=8)
  parser.add_argument("--max_batch", type=int, default=64)
  # The graph path by default: XLA's programs of the 0.1B shape (a batch
  # bucket and prompt width each) take long to compile on a small machine,
  # and the server is measured once they are.
  parser.add_argument("--jit_compile", default="false",
                      help="rnnstep-serve's --jit_compile")
  parser.add_argument("--serve_args", action="extend", nargs="*", default=[],
                      help="more rnnstep-serve flags, for both servers, "
                      "each as --serve_args=--flag=value (repeatable)")
  args = parser.parse_args()
  tmp = None
  if args.model is None:
    tmp = tempfile.TemporaryDirectory(prefix="bench_prefix_cache_")
    args.model = os.path.join(tmp.name, "rwkv7-0.1b-random.npz")
    write_model(args.model)
  print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
        f"{args.requests} requests, system {args.system_tokens} + user "
        f"{args.user_tokens} ids, {args.max_tokens} tokens each, route "
        f"{args.route}, --jit_compile={args.jit_compile}", flush=True)
  try:
    if args.route == "points":
      without, _ = run_in_process(args, 0)
      cached, counters = run_in_process(args, 256)
    else:
      without, _ = run_server(args, ["--prefix_cache_mb=0"])
      cached, counters = run_server(args, [])
  finally:
    if tmp is not None:
      tmp.cleanup()
  print(f"load after: {os.getloadavg()[0]:.1f}; cache: "
        + ", ".join(f"{k} {v:.0f}" for k, v in sorted(counters.items())))
  print("| scenario | median first token, no cache | with cache | ratio | "
        "texts |")
  print("|---|---|---|---|---|")
  for name in without:
    plain, fast = (statistics.median(r[name][0]) for r in (without, cached))
    same = without[name][1] == cached[name][1]
    print(f"| {name} | {plain:.2f} s | {fast:.2f} s | {plain / fast:.1f}x | "
          f"{'identical' if same else 'DIFFER'} |")


if __name__ == "__main__":
  main()
