"""Serving benchmark, in the style of vLLM's benchmark_serving: three servers, one run.

    python tools/bench/serve.py --rates=1,4,16 --num_requests=60

For each request rate (Poisson arrivals), it sends the same requests (prompts
cut from the corpus, max_tokens drawn from [--min_tokens, --max_tokens]) to
three servers on the same model, started here one after the other on free
ports:

  (a) `lock`: one request at a time behind a lock (llama-cpp-python's model):
      each request is `rnnstep.generate` at batch 1;
  (b) `batch`: whole-request batching as TF Serving's `BatchingSession` does
      it: requests collected for at most --batch_timeout_ms (or --max_batch
      of them), then one `generate` over them all, run to the longest
      `max_tokens` (each row truncated to its own);
  (c) `rnnstep-serve`: continuous batching (streamed, so time to first
      character is measured where it happens).

It reports, per server and rate: time to first character (TTFC), inter-chunk
latency (ITL, streamed responses only), end-to-end latency (p50, p99),
requests per second and characters per second; and, once, the library's own
`generate` at --max_batch rows (the bound at saturation). With --check,
every (c) response is compared with `rnnstep.generate` for its request.
With --mixed, each request also draws its own stop strings, n-gram size,
repetition window and regex from a small menu (clients of different
settings; the baselines take none, so run it with --servers=serve).

The baselines (a) and (b) run in this file (`--serve_baseline=lock|batch`,
a child process), on the same ASGI stack as (c). (c) runs on its own path
(what a user who starts it gets: `auto`, the path for one of its lanes)
unless --jit_compile names one, measured once its XLA programs are compiled
(it answers before, on the graph path: rnnstep-serve's
--background_compile); the baselines run the graph path unless it does.

    python tools/bench/serve.py --targets [--also_serve=--jit_compile=false]

measures issue 47's two targets instead, side by side in interleaved rounds:
`rnnstep-serve --max_batch=64` (no other flag) at saturation (128 requests
of 600 characters from 64 clients) against the library's fastest path for
64 rows of 600 characters (target: within 1.25x), and a burst of 64 requests
of 200 characters sent at once against that path's one call of 64 x 200
(target: within 2x); medians over --rounds, with the server's CPU seconds
per 1,000 characters (see --targets).
"""

import asyncio
import json
import logging
import os
import random
import socket
import ssl
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, REPO)
# pylint: disable=g-import-not-at-top,wrong-import-position
from rnnstep.serve import main as serve_main  # Its flags' defaults.
# pylint: enable=g-import-not-at-top,wrong-import-position

_MODEL = flags.DEFINE_string("model", None, "Model file (default: bundled).")
_RATES = flags.DEFINE_list("rates", ["1", "4"], "Requests per second.")
_NUM_REQUESTS = flags.DEFINE_integer("num_requests", 40, "Requests per rate.")
_MIN_TOKENS = flags.DEFINE_integer("min_tokens", 20, "Shortest max_tokens.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 2000, "Longest max_tokens.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 64, "Slots / batch size.")
_CHUNK_STEPS = flags.DEFINE_integer(
    "chunk_steps", serve_main.FLAGS["chunk_steps"].default,
    "rnnstep-serve chunk (default: rnnstep-serve's).")
_BATCH_TIMEOUT_MS = flags.DEFINE_float("batch_timeout_ms", 50.0,
                                       "(b)'s batch_timeout_micros / 1000.")
_JIT_COMPILE = flags.DEFINE_enum(
    "jit_compile", None, ["auto", "true", "false", "elementwise"],
    "Path, for all three and the bound. Default: rnnstep-serve's own (no "
    "--jit_compile passed: what a user who starts it gets), the bound's "
    "the library's default at --max_batch rows, and the graph path for the "
    "baselines, which compiles nothing per shape (under XLA they would "
    "compile once per length bucket, and batch, as requests arrive, and pay "
    "it in the measurement).")
_SERVERS = flags.DEFINE_list("servers", ["lock", "batch", "serve"],
                             "Which servers to run.")
_CHECK = flags.DEFINE_bool("check", False,
                           "Compare every (c) response with generate.")
_SEED = flags.DEFINE_integer("seed", 0, "The request mix's seed.")
_MIXED = flags.DEFINE_bool(
    "mixed", False, "Each request draws its own stop strings, n-gram size, "
    "repetition window and regex (rnnstep-serve only: --servers=serve).")

# --mixed's menus: settings a client might send, chosen to leave most texts
# their full length (the stop strings rarely appear; the pattern only bars
# digits), so that runs with and without them compare.
MIXED_MENU = dict(
    stop=[None, None, ["\n\n\n"], ["KING HENRY"], ["Exeunt", "zz"],
          ["ROMEO:", "JULIET:"]],
    no_repeat_ngram_size=[0, 0, 8, 12],
    repetition=[None, None, (1.1, 32), (1.05, 0)],
    regex=[None, None, None, "[^0-9]+"])


def mixed_options(rng) -> dict:
  """One request's --mixed settings (a JSON body's fields, generate's
  arguments): the stop string kept in the text, so that `generate`'s text
  is the response's."""
  options = dict(include_stop_str_in_output=True)
  for name in ("stop", "no_repeat_ngram_size", "regex"):
    value = rng.choice(MIXED_MENU[name])
    if value:
      options[name] = value
  repetition = rng.choice(MIXED_MENU["repetition"])
  if repetition:
    options.update(repetition_penalty=repetition[0],
                   repetition_window=repetition[1])
  return options
_REPEATS = flags.DEFINE_integer(
    "repeats", 1, "Runs of the bound and of each (server, rate), "
    "alternating the bound with (c)'s runs; medians are reported.")
_STREAM = flags.DEFINE_bool(
    "stream", True, "(c) streams its responses (time to first character "
    "measured where it happens); --nostream asks for whole responses, "
    "which costs the client one JSON per request instead of one per chunk.")
_SERVE_ARGS = flags.DEFINE_list(
    "serve_args", [], "More rnnstep-serve flags for (c), e.g. "
    "--serve_args=--intra_op_threads=0 (TensorFlow's own thread pools).")
_TARGETS = flags.DEFINE_bool(
    "targets", False, "Instead of the rate sweep, issue 47's two targets "
    "side by side: rnnstep-serve started with no flag but --max_batch (and "
    "--jit_compile, --serve_args where given) at saturation (--saturation_requests requests of "
    "--saturation_chars characters from --clients clients, each sending its "
    "next request when the last ends) against the library's fastest path "
    "for --max_batch rows of that length (each path timed, the fastest "
    "median taken), and a burst of --burst_requests requests of "
    "--burst_chars characters sent at once against that path's one call; "
    "--rounds rounds, the library and the servers interleaved, medians.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "--targets: rounds (medians).",
                               lower_bound=1)
_SATURATION_REQUESTS = flags.DEFINE_integer(
    "saturation_requests", 128, "--targets: saturation requests.")
_SATURATION_CHARS = flags.DEFINE_integer(
    "saturation_chars", 600, "--targets: characters a saturation request.")
_CLIENTS = flags.DEFINE_integer("clients", 64,
                                "--targets: concurrent saturation clients.")
_BURST_REQUESTS = flags.DEFINE_integer(
    "burst_requests", 64, "--targets: requests of the burst.")
_BURST_CHARS = flags.DEFINE_integer(
    "burst_chars", 200, "--targets: characters a burst request.")
_ALSO_SERVE = flags.DEFINE_multi_string(
    "also_serve", [], "--targets: another rnnstep-serve measured in the same "
    "rounds, its flags beside --max_batch joined by spaces (e.g. "
    "--also_serve=--jit_compile=false); NAME=VALUE words set its "
    "environment (e.g. --also_serve=PYTHONPATH=/other/checkout: another "
    "version of rnnstep, run from there and compared in the same rounds); "
    "repeatable.")
_RAW_CLIENT = flags.DEFINE_bool(
    "raw_client", True, "--targets: clients on asyncio's streams "
    "(`Connection`: keep-alive, a fraction of httpx's CPU a request, which "
    "the server's cores pay for); --noraw_client: httpx, a client a "
    "request.")
_SERVE_BASELINE = flags.DEFINE_enum("serve_baseline", None, ["lock", "batch"],
                                    "(internal) run baseline server (a)/(b).")
_PORT = flags.DEFINE_integer("port", 0, "(internal) the baseline's port.")

CORPUS = os.path.join(REPO, "tests", "data",
                      "tinyshakespeare_heldout_excerpt.txt")


def _jit(value: str):
  return {"auto": None, "true": True, "false": False,
          "elementwise": "elementwise"}[value]


def _baseline_jit():
  """The baselines' path: --jit_compile, else the graph path (see its help)."""
  return False if _JIT_COMPILE.value is None else _jit(_JIT_COMPILE.value)


def _path_flag() -> list:
  """rnnstep-serve's --jit_compile, only when one was asked for."""
  return ([] if _JIT_COMPILE.value is None
          else [f"--jit_compile={_JIT_COMPILE.value}"])


def served_path(url: str):
  """(path, lanes) of a running rnnstep-serve (`auto` resolved), as its
  /metrics say (`rnnstep_engine_info`); (None, None) where they do not (an
  older version's)."""
  import httpx  # pylint: disable=g-import-not-at-top
  for line in httpx.get(url + "/metrics").text.splitlines():
    if line.startswith("rnnstep_engine_info{"):
      labels = dict(part.split("=", 1) for part in
                    line[line.index("{") + 1:line.index("}")].split(","))
      return labels["path"].strip('"'), int(labels["lanes"].strip('"'))
  return None, None


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# -- the baselines, (a) and (b) -----------------------------------------------


def serve_baseline(kind: str, port: int) -> None:
  """Runs server (a) or (b): `POST /v1/completions`, non-streamed."""
  # pylint: disable=g-import-not-at-top
  import uvicorn
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route
  import rnnstep
  # pylint: enable=g-import-not-at-top
  model = rnnstep.load(_MODEL.value)
  jit = _baseline_jit()
  lock = threading.Lock()
  pending = []  # (prompt, max_tokens, seed, future, loop)
  arrived = threading.Condition()

  def run_one(prompt, max_tokens, seed):
    with lock:
      return rnnstep.generate(model, prompt, max_tokens, seed=seed,
                              jit_compile=jit)

  def batcher():
    while True:
      with arrived:
        while not pending:
          arrived.wait()
        deadline = time.monotonic() + _BATCH_TIMEOUT_MS.value / 1000
        while len(pending) < _MAX_BATCH.value:
          left = deadline - time.monotonic()
          if left <= 0:
            break
          arrived.wait(left)
        batch = pending[:_MAX_BATCH.value]
        del pending[:len(batch)]
      texts = rnnstep.generate(
          model, [b[0] for b in batch], max(b[1] for b in batch),
          seed=[b[2] for b in batch], jit_compile=jit)
      for (_, max_tokens, _, future, loop), text in zip(batch, texts):
        loop.call_soon_threadsafe(future.set_result, text[:max_tokens])

  async def completions(request):
    body = await request.json()
    prompt, max_tokens, seed = body["prompt"], body["max_tokens"], body["seed"]
    if kind == "lock":
      text = await asyncio.to_thread(run_one, prompt, max_tokens, seed)
    else:
      loop = asyncio.get_running_loop()
      future = loop.create_future()
      with arrived:
        pending.append((prompt, max_tokens, seed, future, loop))
        arrived.notify()
      text = await future
    return JSONResponse({"choices": [{"index": 0, "text": text,
                                      "finish_reason": "length"}]})

  async def health(request):
    del request
    return JSONResponse({"status": "ok"})

  rnnstep.generate(model, "a", 2, jit_compile=jit)  # Warm.
  if kind == "batch":
    threading.Thread(target=batcher, daemon=True).start()
  uvicorn.run(Starlette(routes=[
      Route("/v1/completions", completions, methods=["POST"]),
      Route("/health", health)]), host="127.0.0.1", port=port,
              log_level="warning")


# -- the client ---------------------------------------------------------------


def serve_flags() -> list:
  """rnnstep-serve's flags for (c) in the rate sweep (but --model, --port)."""
  return [f"--max_batch={_MAX_BATCH.value}",
          f"--chunk_steps={_CHUNK_STEPS.value}",
          f"--max_tokens_limit={_MAX_TOKENS.value}",
          f"--max_queue={10 * _NUM_REQUESTS.value}",
          *_path_flag(), *_SERVE_ARGS.value]


def start(kind: str, serve_args=None):
  """Starts server `kind`; returns (process, base url) once healthy and
  done compiling (an rnnstep-serve that answers while its XLA programs
  compile, `--background_compile`, is measured once they are: what it
  serves for good), saying after how long each came.

  `serve_args`: rnnstep-serve's flags (default: `serve_flags()`), where
  NAME=VALUE words set its environment."""
  env, cwd = dict(os.environ), REPO
  if serve_args is not None:
    given = dict(arg.split("=", 1) for arg in serve_args
                 if not arg.startswith("-"))
    env.update(given)
    if "PYTHONPATH" in given:  # `-m` imports from the working directory.
      cwd = given["PYTHONPATH"].split(os.pathsep)[0]
    serve_args = [arg for arg in serve_args if arg.startswith("-")]
  import httpx  # pylint: disable=g-import-not-at-top
  port = free_port()
  model = [f"--model={_MODEL.value}"] if _MODEL.value else []
  if kind == "serve":
    cmd = [sys.executable, "-m", "rnnstep.serve.main", *model,
           f"--port={port}",
           *(serve_flags() if serve_args is None else serve_args)]
  else:
    cmd = [sys.executable, os.path.abspath(__file__), *model,
           f"--serve_baseline={kind}", f"--port={port}",
           f"--max_batch={_MAX_BATCH.value}",
           f"--batch_timeout_ms={_BATCH_TIMEOUT_MS.value}",
           f"--jit_compile={_JIT_COMPILE.value or 'false'}"]
  process = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)
  url = f"http://127.0.0.1:{port}"
  started, healthy = time.monotonic(), None
  while True:
    if process.poll() is not None:
      raise RuntimeError(f"{kind} server exited {process.returncode}")
    try:
      reply = httpx.get(url + "/health", timeout=2)
      if reply.status_code == 200:
        healthy = healthy or time.monotonic() - started
        if not reply.json().get("programs_compiling"):
          print(f"{kind} server: /health 200 after {healthy:.1f} s, "
                f"compiled after {time.monotonic() - started:.1f} s",
                flush=True)
          return process, url
    except httpx.HTTPError:
      pass
    time.sleep(0.3)


def workload(rate: float):
  """[(send time, prompt, max_tokens, seed, options)]: Poisson arrivals at
  `rate`; options are {} unless --mixed."""
  rng = random.Random(_SEED.value)
  text = open(CORPUS, encoding="utf-8").read()
  at, requests = 0.0, []
  for _ in range(_NUM_REQUESTS.value):
    at += rng.expovariate(rate)
    begin = rng.randrange(len(text) - 200)
    requests.append((at, text[begin:begin + rng.randint(8, 64)],
                     rng.randint(_MIN_TOKENS.value, _MAX_TOKENS.value),
                     rng.randrange(2**31), {}))
  if _MIXED.value:  # Drawn after: the same prompts, lengths and seeds.
    mix = random.Random(_SEED.value + 1)
    requests = [r[:4] + (mixed_options(mix),) for r in requests]
  return requests


async def one(url, kind, send_at, t0, prompt, max_tokens, seed, options,
              ssl_context):
  """Sends one request; returns its timings and text.

  A client (one connection) per request: httpx's pool over a few hundred
  connections scans them all at each request's start and end, which cost
  this process more CPU than the server's whole HTTP side; the TLS context
  is made once (httpx makes one per client otherwise, even for http://).
  A stream is read raw and split into events here (no line decoding).
  """
  import httpx  # pylint: disable=g-import-not-at-top
  await asyncio.sleep(max(0.0, t0 + send_at - time.monotonic()))
  sent = time.monotonic()
  body = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed,
          **options}
  async with httpx.AsyncClient(timeout=3600, verify=ssl_context) as client:
    if kind != "serve" or not _STREAM.value:
      reply = await client.post(url + "/v1/completions", json=body)
      end = time.monotonic()
      text = reply.json()["choices"][0]["text"]
      return dict(ttfc=end - sent, e2e=end - sent, gaps=[], text=text)
    async with client.stream("POST", url + "/v1/completions",
                             json=dict(body, stream=True)) as reply:
      return await timed_stream(reply.aiter_raw(), sent)


async def timed_stream(chunks, sent: float) -> dict:
  """A completion stream's timings and text: `chunks`, its raw bytes, split
  into server-sent events here (no line decoding); `sent`, when the request
  went (time.monotonic)."""
  times, pieces, buffer = [], [], b""
  async for data in chunks:
    buffer += data
    *events, buffer = buffer.split(b"\r\n\r\n")
    for event in events:
      if event.startswith(b"data: {"):
        piece = json.loads(event[6:])["choices"][0]["text"]
        if piece:
          times.append(time.monotonic())
          pieces.append(piece)
  end = time.monotonic()
  return dict(ttfc=(times[0] if times else end) - sent, e2e=end - sent,
              gaps=[b - a for a, b in zip(times, times[1:])],
              text="".join(pieces))


class Connection:
  """One keep-alive HTTP/1.1 connection on asyncio's streams: --targets'
  client (--raw_client).

  The server under test shares the machine's cores with its clients, so a
  client's CPU a request is taken from the server: httpx spends about 3-4
  ms of it a streamed request (its client, pool and h11 parser in Python),
  this one a fraction of that (a request's bytes written at once; the
  response's headers read in one call, then its chunked body's chunks),
  as a load generator's client does (vLLM's benchmark_serving uses aiohttp,
  wrk C). A client keeps its connection from one request to the next, as
  an OpenAI client does.

  Args:
    url: the server's base URL (http://host:port).
  """

  def __init__(self, url: str):
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    self.host, self.port = host, int(port)
    self.streams = None

  async def post_stream(self, path: str, body: dict):
    """POSTs `body` as JSON; yields the response's body as it arrives.

    Raises:
      RuntimeError: the answer was not 200.
    """
    if self.streams is None:
      self.streams = await asyncio.open_connection(self.host, self.port)
    reader, writer = self.streams
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                 "Content-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {}
    for line in head.split(b"\r\n")[1:]:
      name, _, value = line.partition(b":")
      headers[name.strip().lower()] = value.strip().lower()
    if b"content-length" in headers:
      chunk = await reader.readexactly(int(headers[b"content-length"]))
      if status != 200:
        raise RuntimeError(f"{status}: {chunk[:200]!r}")
      yield chunk
    else:  # Chunked.
      while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        chunk = (await reader.readexactly(size + 2))[:-2]
        if not size:
          break
        yield chunk
    if headers.get(b"connection") == b"close" or status != 200:
      self.close()

  def close(self) -> None:
    if self.streams is not None:
      self.streams[1].close()
      self.streams = None


async def one_raw(connection: Connection, prompt, max_tokens, seed):
  """`one`'s streamed request on a `Connection`; the same results."""
  sent = time.monotonic()
  return await timed_stream(connection.post_stream("/v1/completions", dict(
      prompt=prompt, max_tokens=max_tokens, seed=seed, stream=True)), sent)


async def drive(url, kind, requests, ssl_context):
  t0 = time.monotonic()
  results = await asyncio.gather(*[
      one(url, kind, at, t0, p, m, s, o, ssl_context)
      for at, p, m, s, o in requests])
  return results, time.monotonic() - t0


def chunk_counts(url) -> str:
  """rnnstep-serve's chunks run and, where it counts them, mixed ones."""
  import httpx  # pylint: disable=g-import-not-at-top
  page = httpx.get(url + "/metrics").text
  counts = [line for line in page.splitlines()
            if line.startswith(("rnnstep_chunks ",
                                "rnnstep_mixed_settings_chunks "))]
  return ", ".join(counts)


def percentile(values, q):
  if not values:
    return float("nan")
  values = sorted(values)
  return values[min(len(values) - 1, int(q / 100 * len(values)))]


def report(kind, rate, results, seconds):
  chars = sum(len(r["text"]) for r in results)
  gaps = [g for r in results for g in r["gaps"]]
  ttfc = [r["ttfc"] for r in results]
  e2e = [r["e2e"] for r in results]
  line = (f"{kind:6s} rate={rate:<5g} req/s={len(results) / seconds:6.2f} "
          f"chars/s={chars / seconds:8.0f} "
          f"TTFC p50={percentile(ttfc, 50):6.2f}s p99={percentile(ttfc, 99):6.2f}s "
          f"ITL p50={percentile(gaps, 50) * 1000:6.1f}ms "
          f"p99={percentile(gaps, 99) * 1000:6.1f}ms "
          f"E2E p50={percentile(e2e, 50):6.2f}s p99={percentile(e2e, 99):6.2f}s")
  print(line, flush=True)


def bound(model, jit, seed: int = 2):
  """The library's own chars/s at --max_batch rows (one generate call), and
  its CPU seconds per 1,000 characters."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  steps = min(_MAX_TOKENS.value, 500)
  prompts = ["ROMEO:"] * _MAX_BATCH.value
  rnnstep.generate(model, prompts, steps, seed=1, jit_compile=jit)
  started, cpu = time.monotonic(), time.process_time()
  rnnstep.generate(model, prompts, steps, seed=seed, jit_compile=jit)
  chars = _MAX_BATCH.value * steps
  return (chars / (time.monotonic() - started),
          1000 * (time.process_time() - cpu) / chars)


def load() -> str:
  return "load %.2f" % os.getloadavg()[0]


def cpu_seconds(pid: int) -> float:
  """A process's user + system CPU seconds so far (Linux /proc)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(values):
  values = sorted(values)
  return values[len(values) // 2]


# -- --targets ----------------------------------------------------------------


def target_prompts(count: int, seed: int):
  """`count` prompts of 8-64 characters cut from the corpus, and seeds."""
  rng = random.Random(seed)
  text = open(CORPUS, encoding="utf-8").read()
  prompts = []
  for _ in range(count):
    begin = rng.randrange(len(text) - 200)
    prompts.append(text[begin:begin + rng.randint(8, 64)])
  return prompts, [rng.randrange(2**31) for _ in range(count)]


async def closed_loop(url, requests, clients, ssl_context):
  """`clients` clients, each sending its share of `requests` one after
  another; returns the results and the seconds from start to last end."""
  results = []

  async def client(i):
    connection = Connection(url)
    try:
      for prompt, max_tokens, seed in requests[i::clients]:
        if _RAW_CLIENT.value:
          results.append(await one_raw(connection, prompt, max_tokens, seed))
        else:
          results.append(await one(url, "serve", 0.0, time.monotonic(),
                                   prompt, max_tokens, seed, {}, ssl_context))
    finally:
      connection.close()

  t0 = time.monotonic()
  await asyncio.gather(*[client(i) for i in range(clients)])
  return results, time.monotonic() - t0


def run_targets(model) -> None:
  """--targets: see its help. Prints each round, then the medians."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  rows = _MAX_BATCH.value
  ssl_context = ssl.create_default_context()
  sizes = {"saturation": _SATURATION_CHARS.value, "burst": _BURST_CHARS.value}
  prompts, seeds = target_prompts(
      max(_SATURATION_REQUESTS.value, _BURST_REQUESTS.value, rows),
      _SEED.value)
  library_jobs = [(path, scenario) for scenario in sizes
                  for path in paths.CONCRETE]

  library_cpu = {}  # (path, scenario): [CPU s per 1k chars], warm-ups too.

  def library(path, scenario):
    started, cpu = time.monotonic(), time.process_time()
    rnnstep.generate(model, prompts[:rows], sizes[scenario],
                     seed=seeds[:rows], jit_compile=paths.JIT_COMPILE[path])
    library_cpu.setdefault((path, scenario), []).append(
        1e3 * (time.process_time() - cpu) / (rows * sizes[scenario]))
    return time.monotonic() - started

  for job in library_jobs:  # Compile and warm every path and length.
    library(*job)
  configs = {"default": [f"--max_batch={rows}", *_path_flag(),
                         *_SERVE_ARGS.value]}
  for extra in _ALSO_SERVE.value:
    configs[extra] = configs["default"] + extra.split()
  servers = {}
  try:
    for name, args in configs.items():
      servers[name] = start("serve", args)
      path, lanes = served_path(servers[name][1])
      print(f"server {name}: rnnstep-serve {' '.join(args)} (path {path}, "
            f"lanes {lanes})", flush=True)
    saturation = [(prompts[i % len(prompts)], sizes["saturation"],
                   seeds[i % len(seeds)])
                  for i in range(_SATURATION_REQUESTS.value)]
    burst = [(prompts[i], sizes["burst"], seeds[i])
             for i in range(_BURST_REQUESTS.value)]
    library_seconds = {job: [] for job in library_jobs}
    served = {(name, scenario): [] for name in servers for scenario in sizes}
    served_cpu = {key: [] for key in served}
    loads = []

    def serve_round():
      for name, (process, url) in servers.items():
        for scenario in sizes:
          cpu = cpu_seconds(process.pid)
          if scenario == "saturation":
            results, seconds = asyncio.run(closed_loop(
                url, saturation, _CLIENTS.value, ssl_context))
          else:
            # Each request of the burst on a connection of its own.
            results, seconds = asyncio.run(closed_loop(
                url, burst, len(burst), ssl_context))
          chars = sum(len(r["text"]) for r in results)
          served[(name, scenario)].append(chars / seconds)
          served_cpu[(name, scenario)].append(
              1000 * (cpu_seconds(process.pid) - cpu) / max(chars, 1))

    for r in range(_ROUNDS.value):
      loads.append(os.getloadavg()[0])
      # Which side goes first alternates from round to round.
      for side in ((0, 1) if r % 2 == 0 else (1, 0)):
        if side == 0:
          for job in library_jobs:
            library_seconds[job].append(library(*job))
        else:
          serve_round()
      line = ", ".join(
          f"{name} {scenario} {served[(name, scenario)][-1]:.0f}"
          for name, scenario in served)
      lib = ", ".join(
          f"{path} {scenario} "
          f"{rows * sizes[scenario] / library_seconds[(path, scenario)][-1]:.0f}"
          for path, scenario in library_jobs)
      print(f"round {r + 1}/{_ROUNDS.value} (load {loads[-1]:.2f}): chars/s "
            f"served: {line}; library: {lib}", flush=True)
    loads.append(os.getloadavg()[0])
  finally:
    for process, _ in servers.values():
      process.terminate()
      process.wait()

  print(f"\n## targets: medians of {_ROUNDS.value} rounds, {rows} rows "
        f"(load average {min(loads):.2f}-{max(loads):.2f})")
  print(f"{'what':<58} {'chars/s':>9} {'x':>6} {'target':>7} "
        f"{'cpu s/1k':>9}")
  for scenario, target in (("saturation", 1.25), ("burst", 2.0)):
    rates = {path: rows * sizes[scenario] / median(
        library_seconds[(path, scenario)]) for path in paths.CONCRETE}
    fastest = max(rates, key=rates.get)
    what = (f"{_SATURATION_REQUESTS.value} x {sizes[scenario]} from "
            f"{_CLIENTS.value} clients" if scenario == "saturation" else
            f"burst of {_BURST_REQUESTS.value} x {sizes[scenario]}")
    for path in paths.CONCRETE:
      mark = " (fastest)" if path == fastest else ""
      print(f"{f'library {path}, {rows} x {sizes[scenario]}{mark}':<58} "
            f"{rates[path]:>9.0f} {'':>6} {'':>7} "
            f"{median(library_cpu[(path, scenario)][1:]):>9.4f}")
    for name in servers:
      rate = median(served[(name, scenario)])
      print(f"{f'server {name}: {what}':<58} {rate:>9.0f} "
            f"{rates[fastest] / rate:>5.2f}x {target:>6.2f}x "
            f"{median(served_cpu[(name, scenario)]):>9.4f}")


def main(argv):
  del argv
  logging.getLogger("httpx").setLevel(logging.WARNING)
  if _SERVE_BASELINE.value:
    serve_baseline(_SERVE_BASELINE.value, _PORT.value)
    return
  if _TARGETS.value:
    import rnnstep  # pylint: disable=g-import-not-at-top
    run_targets(rnnstep.load(_MODEL.value))
    return
  import rnnstep  # pylint: disable=g-import-not-at-top
  model = rnnstep.load(_MODEL.value)
  jit = None if _JIT_COMPILE.value is None else _jit(_JIT_COMPILE.value)
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  ssl_context = ssl.create_default_context()
  rate, cpu = bound(model, jit)
  bounds = [rate]
  print(f"library generate at batch {_MAX_BATCH.value}: {rate:.0f} chars/s, "
        f"{cpu:.4f} CPU s per 1k chars ({load()})", flush=True)
  for kind in _SERVERS.value:
    process, url = start(kind)
    try:
      if kind == "serve":  # The path it runs (its auto: a lane's), asked.
        served_jit = paths.JIT_COMPILE[served_path(url)[0]]
      for rate in map(float, _RATES.value):
        requests = workload(rate)
        rates = []
        for repeat in range(_REPEATS.value):
          if repeat and kind == "serve":  # The bound under the same load.
            bound_rate, cpu = bound(model, jit, seed=2 + repeat)
            bounds.append(bound_rate)
            print(f"library generate at batch {_MAX_BATCH.value}: "
                  f"{bound_rate:.0f} chars/s, {cpu:.4f} CPU s per 1k chars "
                  f"({load()})", flush=True)
          client, server = time.process_time(), cpu_seconds(process.pid)
          results, seconds = asyncio.run(drive(url, kind, requests,
                                               ssl_context))
          report(kind, rate, results, seconds)
          chars = sum(len(r["text"]) for r in results)
          rates.append(chars / seconds)
          # Where the two cores went: the server and this client; CPU
          # seconds are robust to other work on the machine, wall-clock
          # is not.
          server = cpu_seconds(process.pid) - server
          client = time.process_time() - client
          print(f"  cpu: server {server:.1f} s "
                f"({1000 * server / max(chars, 1):.4f} s per 1k chars), "
                f"client {client:.1f} s, in {seconds:.1f} s ({load()})",
                flush=True)
          if kind == "serve":
            print(f"  chunks so far: {chunk_counts(url)}", flush=True)
        if _REPEATS.value > 1:
          line = (f"{kind:6s} rate={rate:<5g} median of {_REPEATS.value}: "
                  f"{median(rates):.0f} chars/s")
          if kind == "serve":
            line += (f"; generate's median {median(bounds):.0f} "
                     f"({median(bounds) / median(rates):.2f}x (c))")
          print(line, flush=True)
        if _CHECK.value and kind == "serve":
          wrong = sum(
              r["text"] != rnnstep.generate(
                  model, p, m, seed=s, jit_compile=served_jit, **{
                      k: v for k, v in o.items()
                      if k != "include_stop_str_in_output"})
              for r, (_, p, m, s, o) in zip(results, requests))
          print(f"  check: {len(results) - wrong}/{len(results)} equal "
                "generate", flush=True)
    finally:
      process.terminate()
      process.wait()


if __name__ == "__main__":
  app.run(main)
