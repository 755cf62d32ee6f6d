"""Misbehaving clients under load: rnnstep-serve with a hostile fifth.

    python tools/bench/serve_hostile.py                    # 1,000 requests
    python tools/bench/serve_hostile.py --model=bundled --max_batch=64 \
        --max_tokens=300
    python tools/bench/serve_hostile.py --api_key= --served_model_name= \
        --cases=not_json,long_prompt,oversized_body,slow_upload,\
disconnect_mid_stream                             # a server without keys

Starts a real `rnnstep-serve` (with `--api_key` and `--served_model_name`;
default model: a tiny random GRU), measures its saturation (requests per
second it completes while `2 x --max_batch` clients send
`--saturation_requests` random requests back to back, after as many as a
warm-up; or takes `--rate`), then sends `--num_requests` requests at
`--load` times that rate (Poisson arrivals, one connection per request, as
many open at once as the backlog makes), in two runs on the same server,
`--repeats` times each:

  clean: only the valid requests (`serve_process.random_body`: prompts,
    lists, n, stop strings, penalties, filters, seeds; half of the
    single-choice ones streamed; a 429 is retried);
  mixed: the same valid requests at the same times, and in a
    `--hostile_fraction` of the arrivals a hostile one, the cases of
    `HOSTILE` in turn: the issue's bodies (a lone surrogate, 100,000 nested
    arrays, 2,000 nested regex groups, a regex whose automaton explodes), a
    text/plain POST, another model, wrong and missing keys, a prompt over
    the limit, a body over the limit, slow uploads (a valid body in
    `--slow_pieces` pieces `--slow_pause` s apart) and disconnects
    mid-stream (one event read, then closed).

Checks (a failed one makes the exit status 1): every valid response (and
every hostile one answered 200) equals `rnnstep.generate` for its request
and seed (`serve_process.expected`, on the server's path); every hostile one
gets `HOSTILE`'s status, and every error OpenAI's error body with
`HOSTILE`'s `param` and `code`; nothing gets a 5xx or no answer; the
server's resident memory (VmRSS, sampled every 0.1 s) never passes the
first clean run's peak by more than `--rss_slack_mib`; the server is idle
after each run (no row left running: the disconnected ones retired); and
the valid requests' p99 latency (from each one's scheduled arrival to its
last byte) in the mixed run is within `--p99_bound` of the clean run's
(the median over `--repeats` pairs). It also reports each run's CPU
seconds, the server's and its own: on a shared machine the p99 moves with
other work (at twice saturation it is the backlog), CPU seconds much less.
A server without keys or names: `--api_key= --served_model_name=` drop the
cases that need them (`NEEDS`); `--cases` picks cases.

`tests/test_serve_hostile.py` runs a small version (`run` with small
`Settings`) in the slow tier, with every check but the latency ratio.
"""

import asyncio
import collections
import dataclasses
import json
import logging
import os
import pathlib
import random
import ssl
import statistics
import sys
import tempfile
import threading
import time
from typing import (Any, Callable, Dict, List, NamedTuple, Optional,
                    Sequence)

from absl import app
from absl import flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
# pylint: disable=g-import-not-at-top,wrong-import-position
import httpx
import rnnstep
from rnnstep import api
from rnnstep.engine import cpu
from tests.support import cli
from tests.support import serve_process
# pylint: enable=g-import-not-at-top,wrong-import-position


class Expect(NamedTuple):
  """What a hostile request must get: its HTTP status, and an error's
  `param` and `code` (None: not checked)."""
  status: int
  param: Optional[str] = None
  code: Optional[str] = None


# Every hostile case and the answer it must get: the one table to adjust.
# A 200 case's text is checked against `generate` too (`_check_hostile`).
HOSTILE = {
    # Issue 47's table.
    "lone_surrogate_stop": Expect(400, "stop"),  # "\ud800", valid JSON.
    "nested_arrays": Expect(400, "body"),  # 100,000 "[" then "]".
    "nested_regex": Expect(400, "regex"),  # 2,000 nested groups.
    "exploding_regex": Expect(400, "regex"),  # [ab]*a[ab]{20}: 2^21 states.
    "text_plain": Expect(415),  # A valid body sent as text/plain.
    "other_model": Expect(404, code="model_not_found"),
    "logprobs": Expect(200),  # OpenAI's shape, {tokens, token_logprobs,...}.
    "echo": Expect(200),  # The prompt in front of the text.
    # Credentials (--api_key).
    "wrong_key": Expect(401),
    "missing_key": Expect(401),
    # Limits and bodies that are not JSON.
    "long_prompt": Expect(400, "prompt"),  # 20,000 characters (ids).
    "oversized_body": Expect(413),  # 4 MiB, declared in Content-Length.
    "not_json": Expect(400, "body"),
    # Connections.
    "slow_upload": Expect(200),  # A valid body, in pieces with pauses.
    "disconnect_mid_stream": Expect(200),  # One event read, then closed.
}

# Cases that need a server flag the tool may be told not to pass
# (`--api_key=`, `--served_model_name=`): left out without it.
NEEDS = {"wrong_key": "api_key", "missing_key": "api_key",
         "other_model": "served_model_name"}

PROMPTS = ["ROMEO:", "To be", "a", "First Citizen:\nBefore we proceed",
           "KING RICHARD III:\nNow is the winter"]
DISCONNECT_TOKENS = 2000  # The disconnected stream's max_tokens.
OVERSIZED_BYTES = 4 << 20
LONG_PROMPT_CHARS = 20000


@dataclasses.dataclass
class Settings:
  """A run's sizes (the command line's flags, of the same names)."""
  model: Optional[str] = None  # None: a tiny random GRU; "bundled".
  num_requests: int = 1000
  hostile_fraction: float = 0.2
  load: float = 2.0
  rate: float = 0.0  # Arrivals per second; 0: --load x saturation.
  saturation_requests: int = 128
  max_tokens: int = 200
  max_batch: int = 16
  chunk_steps: int = 16
  max_queue: int = 4096
  jit_compile: str = "false"
  api_key: str = "hostile-bench-key"
  served_model_name: str = "hostile-bench"
  cases: Sequence[str] = tuple(HOSTILE)
  slow_pieces: int = 8
  slow_pause: float = 0.25
  hostile_timeout: float = 60.0
  timeout: float = 600.0  # A valid request's wait for its answer.
  repeats: int = 1
  rss_slack_mib: float = 64.0
  p99_bound: float = 1.25
  seed: int = 0
  serve_args: Sequence[str] = ()


@dataclasses.dataclass
class Planned:
  """One arrival of a run's schedule."""
  index: int
  at: float  # Seconds after the run's start.
  kind: str  # "valid" or a `HOSTILE` case.
  body: Optional[Dict[str, Any]] = None  # What its text is checked against.
  streamed: bool = False


@dataclasses.dataclass
class Outcome:
  """What one request got."""
  planned: Planned
  status: Optional[int] = None  # None: no HTTP answer.
  reply: Any = None  # The JSON answer (an error's body), or the stream's.
  seed: Optional[int] = None
  texts: Dict[int, str] = dataclasses.field(default_factory=dict)
  reasons: Dict[int, str] = dataclasses.field(default_factory=dict)
  problem: str = ""  # A transport failure, or what a check found.
  seconds: float = 0.0  # From its scheduled arrival to its last byte.
  retries: int = 0  # 429s retried.


@dataclasses.dataclass
class Run:
  """One run's outcomes and memory."""
  name: str  # "clean" or "mixed".
  outcomes: List[Outcome]
  seconds: float
  rss: List[float]  # MiB, every 0.1 s.
  server_cpu: float  # The server's CPU seconds in the run.
  client_cpu: float  # This process's.
  left_running: float = 0.0  # Rows still running well after the run.

  def valid_seconds(self) -> List[float]:
    return [o.seconds for o in self.outcomes if o.planned.kind == "valid"]


def percentile(values, q: float) -> float:
  if not values:
    return float("nan")
  values = sorted(values)
  return values[min(len(values) - 1, int(q / 100 * len(values)))]


def cpu_seconds(pid: int) -> float:
  """A process's user + system CPU seconds so far (Linux /proc)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def enabled_cases(settings: Settings) -> List[str]:
  """`settings.cases`, less those whose server flag is not passed.

  Raises:
    ValueError: a case `HOSTILE` does not name.
  """
  unknown = sorted(set(settings.cases) - set(HOSTILE))
  if unknown:
    raise ValueError(f"unknown cases {unknown}; there are {list(HOSTILE)}")
  return [c for c in settings.cases
          if c not in NEEDS or getattr(settings, NEEDS[c])]


# -- the schedule -------------------------------------------------------------


def valid_body(rng, settings: Settings) -> Dict[str, Any]:
  body = serve_process.random_body(rng, PROMPTS, settings.max_tokens)
  if settings.served_model_name:
    body["model"] = settings.served_model_name
  return body


def valid_bodies(rng, settings: Settings, count: int) -> List[Planned]:
  """`count` valid requests, unscheduled (for the saturation burst)."""
  return [Planned(-1 - i, 0.0, "valid", valid_body(rng, settings))
          for i in range(count)]


def hostile_body(case: str, seed: int,
                 settings: Settings) -> Optional[Dict[str, Any]]:
  """The JSON body of a case that has one (None for raw ones)."""
  body = dict(prompt="ROMEO:", max_tokens=20, seed=seed)
  if settings.served_model_name:
    body["model"] = settings.served_model_name
  extra = {
      "lone_surrogate_stop": dict(stop="\ud800"),
      "nested_regex": dict(regex="(" * 2000 + "a" + ")" * 2000),
      "exploding_regex": dict(regex="[ab]*a[ab]{20}"),
      "other_model": dict(model="other"),
      "logprobs": dict(logprobs=2),
      "echo": dict(echo=True),
      "long_prompt": dict(prompt="a" * LONG_PROMPT_CHARS),
      "disconnect_mid_stream": dict(max_tokens=DISCONNECT_TOKENS,
                                    stream=True),
  }
  if case in ("nested_arrays", "oversized_body", "not_json"):
    return None
  return dict(body, **extra.get(case, {}))


def schedule(settings: Settings, rate: float) -> List[Planned]:
  """The mixed run's arrivals (the clean run sends its valid ones).

  Poisson arrivals at `rate`; the hostile ones are a random
  `hostile_fraction` of them, the enabled cases in turn (shuffled).
  """
  rng = random.Random(settings.seed)
  cases = enabled_cases(settings)
  count = settings.num_requests
  hostile = set(rng.sample(range(count), round(
      count * settings.hostile_fraction))) if cases else set()
  order = []
  at, planned = 0.0, []
  for i in range(count):
    at += rng.expovariate(rate)
    if i in hostile:
      if not order:
        order = rng.sample(cases, len(cases))
      case = order.pop()
      planned.append(Planned(i, at, case, hostile_body(
          case, rng.randrange(2**40), settings)))
    else:
      body = valid_body(rng, settings)
      planned.append(Planned(i, at, "valid", body, streamed=(
          body.get("n", 1) == 1 and rng.random() < 0.5)))
  return planned


# -- the clients --------------------------------------------------------------


class Client:
  """Sends requests to one server (one connection per request)."""

  def __init__(self, url: str, settings: Settings):
    self.url = url
    self.settings = settings
    # One TLS context for all (httpx makes one per client otherwise, even
    # for http://, at a cost this process would pay per request).
    self.ssl_context = ssl.create_default_context()

  def headers(self, key: Optional[str] = "",
              content_type: str = "application/json") -> Dict[str, str]:
    """Headers with `key` (default: the server's; None: no key)."""
    headers = {"content-type": content_type}
    key = self.settings.api_key if key == "" else key
    if key:
      headers["authorization"] = f"Bearer {key}"
    return headers

  def http(self, timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout, verify=self.ssl_context)

  async def post(self, outcome: Outcome, content, headers,
                 timeout: float) -> None:
    """POSTs `content`; the status and the parsed answer into `outcome`."""
    async with self.http(timeout) as http:
      reply = await http.post(self.url + "/v1/completions", content=content,
                              headers=headers)
      outcome.status = reply.status_code
      try:
        outcome.reply = reply.json()
      except ValueError:
        outcome.reply = reply.text[:200]

  async def stream(self, outcome: Outcome, content, headers, timeout: float,
                   first_only: bool = False) -> None:
    """POSTs a streamed request; the status, seed, texts and reasons into
    `outcome` (`first_only`: closes after the first event)."""
    async with self.http(timeout) as http:
      async with http.stream("POST", self.url + "/v1/completions",
                             content=content, headers=headers) as reply:
        outcome.status = reply.status_code
        if reply.status_code != 200:
          body = await reply.aread()
          try:
            outcome.reply = json.loads(body)
          except ValueError:
            outcome.reply = body[:200]
          return
        buffer = b""
        async for data in reply.aiter_raw():
          *events, buffer = (buffer + data).replace(b"\r\n", b"\n").split(
              b"\n\n")
          for event in events:
            if not event.startswith(b"data: {"):
              continue
            chunk = json.loads(event[len(b"data: "):])
            if "error" in chunk:
              outcome.problem = f"an error event: {chunk}"
              return
            outcome.seed = chunk["seed"]
            for choice in chunk["choices"]:
              k = choice["index"]
              outcome.texts[k] = outcome.texts.get(k, "") + choice["text"]
              if choice["finish_reason"]:
                outcome.reasons[k] = choice["finish_reason"]
            if first_only:
              outcome.reply = chunk
              return  # Leaves: the connection closes mid-stream.

  async def valid(self, outcome: Outcome) -> None:
    """A valid request, retried after a 429."""
    body = json.dumps(outcome.planned.body).encode()
    while True:
      outcome.texts, outcome.reasons = {}, {}
      if outcome.planned.streamed:
        await self.stream(outcome, json.dumps(dict(
            outcome.planned.body, stream=True)).encode(), self.headers(),
                          self.settings.timeout)
      else:
        await self.post(outcome, body, self.headers(), self.settings.timeout)
        if outcome.status == 200:
          answer = outcome.reply
          outcome.seed = answer["seed"]
          outcome.texts = {c["index"]: c["text"] for c in answer["choices"]}
          outcome.reasons = {c["index"]: c["finish_reason"]
                             for c in answer["choices"]}
      if outcome.status != 429:
        return
      outcome.retries += 1
      await asyncio.sleep(0.2)

  async def hostile(self, outcome: Outcome) -> None:
    """A hostile request, as its case sends it."""
    case, body = outcome.planned.kind, outcome.planned.body
    timeout = self.settings.hostile_timeout
    # Encoded here, with ASCII escapes: "\ud800" stays valid JSON (httpx's
    # json= writes UTF-8, which a lone surrogate cannot be).
    raw = json.dumps(body).encode() if body is not None else None
    headers = self.headers()
    if case == "nested_arrays":
      raw = b"[" * 100000 + b"]" * 100000
    elif case == "oversized_body":
      raw = b'{"prompt": "' + b"a" * OVERSIZED_BYTES + b'"}'
    elif case == "not_json":
      raw = b'{"prompt": "ROMEO:", "max_tokens": 5'
    elif case == "text_plain":
      headers = self.headers(content_type="text/plain")
    elif case == "wrong_key":
      headers = self.headers(key="wrong-" + self.settings.api_key)
    elif case == "missing_key":
      headers = self.headers(key=None)
    if case == "disconnect_mid_stream":
      await self.stream(outcome, raw, headers, timeout, first_only=True)
    elif case == "slow_upload":
      await self.post(outcome, self.slowly(raw), headers, timeout)
    else:
      await self.post(outcome, raw, headers, timeout)

  async def slowly(self, raw: bytes):
    """`raw` in `slow_pieces` pieces, `slow_pause` s apart (chunked)."""
    pieces = self.settings.slow_pieces
    size = -(-len(raw) // pieces)
    for k in range(pieces):
      if k:
        await asyncio.sleep(self.settings.slow_pause)
      yield raw[k * size:(k + 1) * size]

  async def one(self, planned: Planned, t0: float) -> Outcome:
    """Sends `planned` at its time; what it got, and how long it took."""
    outcome = Outcome(planned)
    await asyncio.sleep(max(0.0, t0 + planned.at - time.monotonic()))
    try:
      if planned.kind == "valid":
        await self.valid(outcome)
      else:
        await self.hostile(outcome)
    except httpx.TimeoutException:
      outcome.problem = "no answer in time"
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
      outcome.problem = f"{type(e).__name__}: {e}"[:200]
    # From its scheduled arrival: a late send counts against the server.
    outcome.seconds = time.monotonic() - (t0 + planned.at)
    return outcome

  async def saturation(self, planned: Sequence[Planned]) -> float:
    """Requests per second the server completes when it is never idle.

    `2 x max_batch` clients send `planned` back to back; the rate is counted
    between the `clients`-th completion and the `clients`-th from the end,
    while every client still waited (not the first requests' ramp, nor the
    tail when fewer remain than slots).

    Raises:
      RuntimeError: a request was not answered 200.
    """
    clients = 2 * self.settings.max_batch
    queue, done = list(reversed(planned)), []

    async def worker():
      while queue:
        outcome = await self.one(queue.pop(), time.monotonic())
        if outcome.status != 200 or outcome.problem:
          raise RuntimeError(f"the saturation burst got {outcome}")
        done.append(time.monotonic())

    t0 = time.monotonic()
    await asyncio.gather(*[worker() for _ in range(clients)])
    if len(done) > 2 * clients:
      return (len(done) - 2 * clients) / (done[-clients - 1]
                                          - done[clients - 1])
    return len(done) / (done[-1] - t0)

  async def drive(self, planned: Sequence[Planned], pid: int):
    """Sends every request of `planned`; (outcomes, seconds, RSS samples)."""
    samples, stop = [], asyncio.Event()

    async def sample():
      while not stop.is_set():
        samples.append(serve_process.rss_mib(pid))
        try:
          await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
          pass

    sampler = asyncio.create_task(sample())
    t0 = time.monotonic() + 0.05
    outcomes = await asyncio.gather(*[self.one(p, t0) for p in planned])
    seconds = time.monotonic() - t0
    stop.set()
    await sampler
    return list(outcomes), seconds, samples


def running_rows(url: str, wait: float = 30.0) -> float:
  """The rows still running or waiting once they stop, or after `wait` s."""
  deadline = time.monotonic() + wait
  while True:
    page = httpx.get(url + "/metrics", timeout=10).text
    rows = sum(float(line.split()[1]) for line in page.splitlines()
               if line.startswith(("rnnstep_requests_running ",
                                   "rnnstep_requests_waiting ")))
    if rows == 0 or time.monotonic() > deadline:
      return rows
    time.sleep(0.1)


class Drain:
  """Reads a process's output (a full pipe would stop the server), keeping
  its last lines and counting them (TensorFlow's start-up noise and the
  ready line aside)."""

  def __init__(self, *streams):
    self.lines = collections.deque(maxlen=5)
    self.count = 0
    for stream in streams:
      threading.Thread(target=self._read, args=(stream,), daemon=True).start()

  def _read(self, stream):
    try:
      for line in stream:
        line = line.strip()
        if line and not cli.TF_NOISE.fullmatch(line) and (
            " ready on http" not in line):
          self.lines.append(line[:200])
          self.count += 1
    except (ValueError, OSError):  # Closed with the server.
      pass


# -- the checks ---------------------------------------------------------------


def _error_body_problem(reply, expect: Expect) -> str:
  """What is wrong with an error answer ('' if nothing)."""
  error = reply.get("error") if isinstance(reply, dict) else None
  if not isinstance(error, dict) or not {
      "message", "type", "param", "code"} <= set(error):
    return f"not OpenAI's error body: {str(reply)[:200]}"
  if not isinstance(error["message"], str) or not error["message"]:
    return f"no message: {error}"
  if expect.param is not None and error["param"] != expect.param:
    return f"param {error['param']!r}, want {expect.param!r}: {error}"
  if expect.code is not None and error["code"] != expect.code:
    return f"code {error['code']!r}, want {expect.code!r}: {error}"
  return ""


def _logprobs_problem(choice, text: str, k: int) -> str:
  """What is wrong with a choice's OpenAI `logprobs` ('' if nothing)."""
  logprobs = choice.get("logprobs")
  if not isinstance(logprobs, dict) or not {
      "tokens", "token_logprobs", "top_logprobs", "text_offset"} <= set(
          logprobs):
    return f"logprobs not OpenAI's shape: {str(logprobs)[:200]}"
  tokens = logprobs["tokens"]
  sizes = {len(logprobs[name]) for name in (
      "token_logprobs", "top_logprobs", "text_offset")}
  if sizes != {len(tokens)} or "".join(tokens) != text:
    return f"logprobs' lists do not cover the text {text!r}: {logprobs}"
  if not all(isinstance(x, float) and x <= 0
             for x in logprobs["token_logprobs"]):
    return f"token_logprobs not log-probabilities: {logprobs}"
  if not all(isinstance(top, dict) and 1 <= len(top) <= k + 1
             for top in logprobs["top_logprobs"]):
    return f"top_logprobs not {k} alternatives: {logprobs}"
  offsets = logprobs["text_offset"]
  if [b - a for a, b in zip(offsets, offsets[1:])] != [
      len(t) for t in tokens[:-1]]:
    return f"text_offset does not follow the tokens: {logprobs}"
  return ""


class Checker:
  """Checks outcomes against `generate` (each request's text computed
  once, for all runs)."""

  def __init__(self, model, jit):
    self.model = model
    self.jit = jit
    self.cache = {}

  def expected(self, planned: Planned, seed: int):
    key = (planned.index, seed)
    if key not in self.cache:
      body = {k: v for k, v in planned.body.items()
              if k not in ("echo", "logprobs", "stream", "model")}
      self.cache[key] = serve_process.expected(self.model, body, seed,
                                               self.jit)
    return self.cache[key]

  def check(self, outcome: Outcome) -> str:
    """What is wrong with `outcome` ('' if nothing)."""
    planned = outcome.planned
    if outcome.problem:
      return outcome.problem
    if outcome.status is None:
      return "no answer"
    if planned.kind == "valid":
      if outcome.status != 200:
        return f"status {outcome.status}: {str(outcome.reply)[:200]}"
      want, reasons = self.expected(planned, outcome.seed)
      got = [outcome.texts.get(k) for k in range(len(want))]
      if got != want or [outcome.reasons.get(k)
                         for k in range(len(want))] != reasons:
        return f"differs from generate: got {got} {outcome.reasons}, want " \
               f"{want} {reasons}"
      return ""
    expect = HOSTILE[planned.kind]
    if outcome.status != expect.status:
      return (f"status {outcome.status}, want {expect.status}: "
              f"{str(outcome.reply)[:200]}")
    if outcome.status != 200:
      return _error_body_problem(outcome.reply, expect)
    try:
      return self._check_hostile(outcome)
    except (KeyError, IndexError, TypeError, ValueError) as e:
      return (f"not a completion ({type(e).__name__}: {e}): "
              f"{str(outcome.reply)[:200]}")

  def _check_hostile(self, outcome: Outcome) -> str:
    """A hostile case answered 200: its text (and shape) as it should be."""
    planned, reply = outcome.planned, outcome.reply
    if planned.kind == "disconnect_mid_stream":
      return "" if reply and reply.get("choices") else (
          f"no first event: {reply}")
    choice = reply["choices"][0]
    (want,), _ = self.expected(planned, reply["seed"])
    if planned.kind == "echo":
      want = planned.body["prompt"] + want
    if choice["text"] != want:
      return f"text {choice['text']!r}, want {want!r}"
    if planned.kind == "logprobs":
      return _logprobs_problem(choice, want, planned.body["logprobs"])
    return ""


# -- the runs -----------------------------------------------------------------


@dataclasses.dataclass
class Report:
  """A whole run's results and its checks."""
  settings: Settings
  saturation: float  # Requests/s measured (nan when --rate was given).
  rate: float  # Arrivals per second sent.
  runs: List[Run]
  problems: Dict[str, List[str]]  # Run name -> what its checks found.
  logged: int  # Lines the server wrote once ready.
  server_tail: List[str]  # The last of them.

  def pairs(self):
    clean = [r for r in self.runs if r.name == "clean"]
    mixed = [r for r in self.runs if r.name == "mixed"]
    return list(zip(clean, mixed))

  def p99_ratio(self) -> float:
    return statistics.median(
        percentile(m.valid_seconds(), 99) / percentile(c.valid_seconds(), 99)
        for c, m in self.pairs())

  def rss_bound(self) -> float:
    return max(self.runs[0].rss) + self.settings.rss_slack_mib

  def failures(self, timing: bool = True) -> List[str]:
    """Every failed check, a line each (`timing`: the p99 ratio's too)."""
    out = []
    for name, found in self.problems.items():
      out += [f"{name}: {line}" for line in found[:20]]
      if len(found) > 20:
        out.append(f"{name}: and {len(found) - 20} more")
    peak = max(max(r.rss) for r in self.runs)
    if peak > self.rss_bound():
      out.append(f"RSS peaked at {peak:.0f} MiB, over the first clean run's "
                 f"{max(self.runs[0].rss):.0f} + "
                 f"{self.settings.rss_slack_mib:.0f}")
    for run in self.runs:
      if run.left_running:
        out.append(f"{run.name}: {run.left_running:.0f} rows still running "
                   "30 s after the run")
    if timing and self.p99_ratio() > self.settings.p99_bound:
      out.append(f"valid p99 mixed/clean {self.p99_ratio():.2f} > "
                 f"{self.settings.p99_bound}")
    return out

  def summary(self) -> str:
    s = self.settings
    lines = [
        f"machine: {cpu.info().name} | {os.cpu_count()} cores | load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"server: --max_batch={s.max_batch} --chunk_steps={s.chunk_steps} "
        f"--jit_compile={s.jit_compile} --max_queue={s.max_queue}"
        + (f" {' '.join(s.serve_args)}" if s.serve_args else ""),
        f"saturation {self.saturation:.1f} requests/s; sent at "
        f"{self.rate:.1f}/s; {s.num_requests} arrivals, "
        f"{s.hostile_fraction:.0%} hostile in the mixed run"]
    for run in self.runs:
      valid = run.valid_seconds()
      retries = sum(o.retries for o in run.outcomes)
      lines.append(
          f"{run.name:5s}: {len(valid)} valid + "
          f"{len(run.outcomes) - len(valid)} hostile in {run.seconds:.1f} s; "
          f"valid latency p50 {percentile(valid, 50):.2f} s, p99 "
          f"{percentile(valid, 99):.2f} s; 429s retried {retries}; RSS "
          f"{min(run.rss):.0f}-{max(run.rss):.0f} MiB; CPU s: server "
          f"{run.server_cpu:.1f}, client {run.client_cpu:.1f}")
    if self.pairs():
      lines.append(f"valid p99 mixed/clean: {self.p99_ratio():.2f} (median "
                   f"of {len(self.pairs())}; bound {s.p99_bound}); server "
                   "CPU seconds mixed/clean: " + ", ".join(
                       f"{m.server_cpu / c.server_cpu:.2f}"
                       for c, m in self.pairs()))
    lines.append("hostile case: statuses, slowest answer")
    by_case = collections.defaultdict(list)
    for run in self.runs:
      for o in run.outcomes:
        if o.planned.kind != "valid":
          by_case[o.planned.kind].append(o)
    for case, outcomes in by_case.items():
      statuses = collections.Counter(o.status for o in outcomes)
      lines.append(
          f"  {case:22s} {dict(statuses)} (want {HOSTILE[case].status}), "
          f"{max(o.seconds for o in outcomes):.2f} s")
    lines.append(f"RSS bound {self.rss_bound():.0f} MiB (the first clean "
                 f"run's peak + {s.rss_slack_mib:.0f}); the server wrote "
                 f"{self.logged} lines once ready"
                 + ", the last:" * bool(self.server_tail))
    lines += [f"  {line}" for line in self.server_tail]
    failures = self.failures()
    lines.append("checks: " + ("all passed" if not failures else
                               f"{len(failures)} FAILED"))
    lines += [f"  {line}" for line in failures]
    return "\n".join(lines)


def run(settings: Settings, log: Callable[[str], None] = print) -> Report:
  """Starts the server, runs the clean and mixed runs, checks them.

  Args:
    settings: the sizes.
    log: where progress lines go.

  Returns:
    The `Report`.
  """
  logging.getLogger("httpx").setLevel(logging.WARNING)  # A line a request.
  path = settings.model
  if path is None:
    path = os.path.join(tempfile.mkdtemp(), "tiny.npz")
    cli.write_model(path)
  elif path == "bundled":
    path = api.bundled_model_path()
  jit = {"true": True, "false": False,
         "elementwise": "elementwise"}[settings.jit_compile]
  args = [f"--model={path}", f"--max_batch={settings.max_batch}",
          f"--chunk_steps={settings.chunk_steps}",
          f"--max_tokens_limit={max(settings.max_tokens, DISCONNECT_TOKENS)}",
          f"--max_queue={settings.max_queue}",
          f"--jit_compile={settings.jit_compile}"]
  if settings.api_key:
    args.append(f"--api_key={settings.api_key}")
  if settings.served_model_name:
    args.append(f"--served_model_name={settings.served_model_name}")
  started = time.monotonic()
  with serve_process.RemoteServer(args + list(settings.serve_args),
                                  wait=False) as server:
    checker = Checker(rnnstep.load(path), jit)
    server.wait_until_healthy()
    drain = Drain(server.process.stdout, server.process.stderr)
    pid = server.process.pid
    client = Client(server.url(), settings)
    log(f"ready after {time.monotonic() - started:.1f} s; RSS "
        f"{serve_process.rss_mib(pid):.0f} MiB")
    rate = settings.rate
    if not rate:
      # Twice: the first requests after the start run slower (the first
      # call of each program, the first arrivals of each option), so the
      # first burst is a warm-up.
      rng = random.Random(settings.seed + 1)
      for _ in range(2):
        saturation = asyncio.run(client.saturation(valid_bodies(
            rng, settings, settings.saturation_requests)))
      rate = settings.load * saturation
      log(f"saturation: {saturation:.1f} requests/s; sending at "
          f"{rate:.1f}/s")
    else:
      saturation = float("nan")
    planned = schedule(settings, rate)
    runs, problems = [], {}
    for repeat in range(settings.repeats):
      for name in ("clean", "mixed"):
        sent = [p for p in planned if name == "mixed" or p.kind == "valid"]
        cpu_before = cpu_seconds(pid), time.process_time()
        outcomes, seconds, samples = asyncio.run(client.drive(sent, pid))
        runs.append(Run(name, outcomes, seconds, samples,
                        cpu_seconds(pid) - cpu_before[0],
                        time.process_time() - cpu_before[1],
                        running_rows(server.url())))
        log(f"{name} {repeat + 1}: {len(sent)} requests in {seconds:.1f} s, "
            f"valid p99 {percentile(runs[-1].valid_seconds(), 99):.2f} s, "
            f"RSS up to {max(samples):.0f} MiB")
    logged, tail = drain.count, list(drain.lines)
  # Checked after the server has gone: the references' generate calls
  # would share the cores with it.
  for number, one in enumerate(runs):
    found = []
    for outcome in one.outcomes:
      problem = checker.check(outcome)
      if problem:
        found.append(f"{outcome.planned.kind} #{outcome.planned.index}: "
                     f"{problem}")
    if found:
      problems[f"{one.name} {number // 2 + 1}"] = found
  return Report(settings, saturation, rate, runs, problems, logged, tail)


# -- the command line ---------------------------------------------------------


def define_flags() -> None:
  """The command line's flags, one a `Settings` field (defined only when run
  as a program: tests/test_serve_hostile.py imports this module)."""
  d = Settings()
  flags.DEFINE_string("model", d.model, "Model file; 'bundled' for the "
                      "bundled model; default: a tiny random GRU.")
  flags.DEFINE_integer("num_requests", d.num_requests,
                       "Arrivals in the mixed run.")
  flags.DEFINE_float("hostile_fraction", d.hostile_fraction,
                     "Of them hostile.")
  flags.DEFINE_float("load", d.load, "Arrival rate, times saturation.")
  flags.DEFINE_float("rate", d.rate, "Arrivals per second (0: --load x the "
                     "saturation measured).")
  flags.DEFINE_integer("saturation_requests", d.saturation_requests,
                       "Requests sent back to back to measure saturation.")
  flags.DEFINE_integer("max_tokens", d.max_tokens, "Longest max_tokens of "
                       "a valid request.")
  flags.DEFINE_integer("max_batch", d.max_batch, "--max_batch.")
  flags.DEFINE_integer("chunk_steps", d.chunk_steps, "--chunk_steps.")
  flags.DEFINE_integer("max_queue", d.max_queue, "--max_queue (a 429 is "
                       "retried after 0.2 s and counted).")
  flags.DEFINE_enum("jit_compile", d.jit_compile,
                    ["true", "false", "elementwise"],
                    "The server's path (and the references').")
  flags.DEFINE_string("api_key", d.api_key, "--api_key ('': none, and no "
                      "key cases).")
  flags.DEFINE_string("served_model_name", d.served_model_name,
                      "--served_model_name ('': none, and no other_model).")
  flags.DEFINE_list("cases", list(d.cases), "The hostile cases sent.")
  flags.DEFINE_integer("slow_pieces", d.slow_pieces,
                       "A slow upload's pieces.")
  flags.DEFINE_float("slow_pause", d.slow_pause,
                     "Seconds between a slow upload's pieces.")
  flags.DEFINE_float("hostile_timeout", d.hostile_timeout,
                     "Seconds a hostile request waits for its answer.")
  flags.DEFINE_float("timeout", d.timeout,
                     "Seconds a valid request waits for its answer.")
  flags.DEFINE_integer("repeats", d.repeats, "Clean and mixed runs each.")
  flags.DEFINE_float("rss_slack_mib", d.rss_slack_mib,
                     "MiB the server's RSS may pass the first clean run's "
                     "peak by.")
  flags.DEFINE_float("p99_bound", d.p99_bound,
                     "Largest valid p99 mixed/clean.")
  flags.DEFINE_integer("seed", d.seed, "The schedule's seed.")
  flags.DEFINE_list("serve_args", list(d.serve_args),
                    "More rnnstep-serve flags.")


def main(argv):
  del argv
  values = flags.FLAGS
  report = run(Settings(**{
      field.name: values[field.name].value
      for field in dataclasses.fields(Settings)}))
  print(report.summary(), flush=True)
  return 1 if report.failures() else 0


if __name__ == "__main__":
  define_flags()
  app.run(main)
