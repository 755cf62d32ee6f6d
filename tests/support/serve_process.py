"""A real `rnnstep-serve` process on a free port, as vLLM's `RemoteOpenAIServer`.

    with RemoteServer(["--model", path, "--max_batch=8"]) as server:
      client = server.openai_client()
      http.get(server.url("/health"))
"""

import importlib.util
import signal
import socket
import subprocess
import time

import httpx

import rnnstep
from rnnstep.decoding import options as options_lib
from rnnstep import records
from rnnstep.serve import protocol
from tests.support import cli
from tests.support import forkserver
from tests.support import http


def free_port() -> int:
  """A port nothing listens on now (the OS's choice)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class RemoteServer:
  """Starts `rnnstep-serve` with `args` and waits until /health says 200.

  Args:
    args: its flags (--host and --port are added).
    startup_timeout: seconds to wait for /health.
    wait: wait for /health here; else the caller calls `wait_until_healthy`
      (and can meanwhile start another server, or compute references).
  """

  def __init__(self, args, startup_timeout: float = 120.0, wait: bool = True):
    self.port = free_port()
    # Forked from an interpreter that imported TensorFlow (the console
    # script's own function in a process of its own: tests/support/
    # forkserver.py), which saves each server TensorFlow's import.
    self.process = forkserver.popen(
        cli.command("rnnstep-serve", "rnnstep.serve.main")
        + list(args) + ["--host=127.0.0.1", f"--port={self.port}"],
        cwd=cli.REPO, env=cli.ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    self.started = time.monotonic()
    if wait:
      self.wait_until_healthy(startup_timeout)

  def wait_until_healthy(self, startup_timeout: float = 120.0) -> None:
    """Waits until /health answers 200, `startup_timeout` s from the start.

    Raises:
      RuntimeError: the process exited.
      TimeoutError: it did not become healthy in time.
    """
    deadline = self.started + startup_timeout
    while True:
      if self.process.poll() is not None:
        raise RuntimeError(f"rnnstep-serve exited {self.process.returncode}: "
                           f"{self.process.stderr.read()}")
      try:
        if http.get(self.url("/health"), timeout=2).status_code == 200:
          return
      except httpx.HTTPError:
        pass
      if time.monotonic() > deadline:
        self.close()
        raise TimeoutError("rnnstep-serve did not become healthy")
      time.sleep(0.2)

  def url(self, path: str = "") -> str:
    return f"http://127.0.0.1:{self.port}{path}"

  def openai_client(self, **kwargs):
    import openai  # pylint: disable=g-import-not-at-top
    kwargs.setdefault("api_key", "unused")  # A server without keys.
    return openai.OpenAI(base_url=self.url("/v1"), max_retries=0, **kwargs)

  def terminate(self, timeout: float = 60.0) -> int:
    """SIGTERM; returns the exit status."""
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGTERM)
    return self.process.wait(timeout)

  def close(self) -> None:
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait()
    for stream in (self.process.stdout, self.process.stderr):
      stream.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def rss_mib(pid: int) -> float:
  """A process's resident memory (VmRSS), MiB (nan where /proc lacks it)."""
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def stack_installed() -> bool:
  """Whether the serving stack and its test clients are installed."""
  return all(importlib.util.find_spec(name) is not None for name in (
      "openai", "prometheus_client", "starlette", "uvicorn"))


def expected(model, body, seed, jit_compile=False):
  """(texts, finish reasons) of a request, from `rnnstep.generate`.

  Args:
    model: the served model.
    body: the request's JSON body (a dict).
    seed: the seed it ran with (the response's `seed`).
    jit_compile: the server's path, as `generate`'s argument.
  """
  prompts = body["prompt"] if isinstance(body["prompt"], list) else [
      body["prompt"]]
  n = body.get("n", 1)
  rows = [p for p in prompts for _ in range(n)]
  decoding = {name: body[name] for name in body
              if name in options_lib.BY_NAME}
  texts = rnnstep.generate(model, rows, body["max_tokens"], seed=seed,
                           stop=body.get("stop"), regex=body.get("regex"),
                           jit_compile=jit_compile, **decoding)
  stops = records.check_stop(body.get("stop"))
  # The library ends a row early only at a stop string or the regex's end,
  # which the server calls "stop" alike.
  reasons = ["stop" if stops and protocol.trim_stop(t, stops) != t
             or body.get("regex") and len(t) < body["max_tokens"]
             else "length" for t in texts]
  if not body.get("include_stop_str_in_output"):
    texts = [protocol.trim_stop(t, stops) if r == "stop" else t
             for t, r in zip(texts, reasons)]
  return texts, reasons


def random_body(rng, prompts, max_tokens: int):
  """A random completions request: prompt(s), n, options, stop strings."""
  body = dict(prompt=rng.choice(prompts), max_tokens=rng.randint(1, max_tokens),
              seed=rng.randrange(2**40))
  if rng.random() < 0.3:
    body["prompt"] = rng.sample(prompts, rng.randint(1, 2))
    body["n"] = rng.randint(1, 3)
  for name, draw in [("temperature", lambda: rng.choice([0.0, 0.5, 1.3])),
                     ("top_k", lambda: rng.randint(0, 20)),
                     ("top_p", lambda: rng.choice([0.5, 0.9])),
                     ("min_p", lambda: 0.05),
                     ("typical_p", lambda: 0.8),
                     ("repetition_penalty", lambda: 1.2),
                     ("frequency_penalty", lambda: 0.5),
                     ("presence_penalty", lambda: rng.choice([-0.5, 1.0])),
                     ("stop", lambda: rng.choice(["e", ["\n", "th"]])),
                     ("no_repeat_ngram_size", lambda: 3)]:
    if rng.random() < 0.25:
      body[name] = draw()
  return body
