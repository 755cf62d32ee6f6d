"""Runs the tests' Python subprocesses by forking an interpreter that has
already imported TensorFlow, instead of starting a fresh one each time.

Why: about 45% of the suite's CPU went to fresh interpreters (CLI runs,
serving scripts), and in each the `import tensorflow` alone costs 3-5 s of
CPU on a 2-core machine, more than most of those runs spend on their own work.
A child forked from a process that has only imported TensorFlow (and
rnnstep-serve's web stack: fastapi, pydantic, prometheus_client, uvicorn) is
still a separate process running the real entry point (the console script's
function, `python -m module`, `python -c script`) with its own argv,
environment, working directory, stdin/stdout/stderr and exit status; what it
skips is the interpreter's start and those imports. Forking after `import tensorflow`
is safe because importing starts no TensorFlow runtime: no context, device or
thread pool exists until the child makes one.

What a fork cannot reproduce falls back to a real exec (`subprocess`):
anything but this Python (`bash -c`, another interpreter), an environment that
differs in what an interpreter or TensorFlow reads while importing (`TF_*`
but TF_CONFIG, `PYTHON*` but PYTHONPATH, `LD_*`, ...). `run` stands for
`subprocess.run`, `popen` for `subprocess.Popen` (the servers the tests
drive: a long-running child with pipes, signals and an exit status). Tests
that are about a fresh process itself (what
importing `rnnstep` imports, the CLI's start-up and its TensorFlow noise, the
fast path's cold run, the benchmark's start-up phases, another process's hash
seed) call `subprocess` directly and never come here. `RNNSTEP_TEST_FORK=off`
sends every call to a real exec.

The server is one process per test process (each xdist worker has its own),
started on first use; it exits when its parent closes its stdin (the parent
exiting included). Each call is one connection on a Unix SEQPACKET socket: the
request (JSON) with its three file descriptors (SCM_RIGHTS), then the child's
pid, then its wait status.
"""

import atexit
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

_ENABLED = os.environ.get("RNNSTEP_TEST_FORK", "on") != "off"
# Variables an interpreter or TensorFlow reads while starting or importing:
# a child whose value differs from the server's cannot be forked from it.
_IMPORT_TIME_PREFIXES = ("TF_", "PYTHON", "LD_", "MALLOC", "OMP_", "KMP_",
                         "CUDA_", "XLA_", "GRPC_")
# Read later than the import, so a child may have its own: TF_CONFIG and
# PYTHONPATH, and TF_XLA_FLAGS, which TensorFlow reads at XLA's first use in
# a process (tests/test_forkserver.py checks it).
_PER_CHILD = ("TF_CONFIG", "PYTHONPATH", "TF_XLA_FLAGS")

# The server's own code: it imports TensorFlow as a CLI tool does (without
# TensorFlow's eager Keras import, rnnstep/cli/common.py), then serves.
_SERVER = r'''
import json, os, select, signal, socket, sys, traceback
sys.modules["keras.src.optimizers"] = None
import tensorflow
del sys.modules["keras.src.optimizers"]
import absl.flags, numpy  # pylint: disable=unused-import
# rnnstep-serve's web stack, imported once here rather than in each server
# child (a third of a second of CPU each); nothing it starts (threads, event
# loops) exists before a child runs its program.
try:
  import fastapi, prometheus_client, pydantic, uvicorn  # pylint: disable=unused-import
except ImportError:  # Not installed: a child imports what it can.
  pass

listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(sys.argv[1])
listener.listen(64)
base_path = [p for p in sys.path[1:]
             if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
sys.stdout.write("ready\n")
sys.stdout.flush()
running = {}  # pid -> connection
old = []  # The server's stdout and stderr objects (flushed at a child's exit).


def _stdio(encoding, errors):
  import io
  def text(fd, mode, line_buffering, errors):
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors,
                            line_buffering=line_buffering)
  old.extend([sys.stdout, sys.stderr])
  sys.stdin = sys.__stdin__ = text(0, "r", False, errors)
  sys.stdout = sys.__stdout__ = text(1, "w", os.isatty(1), errors)
  sys.stderr = sys.__stderr__ = text(2, "w", True, "backslashreplace")


def child(request, fds):
  """Becomes the requested program; never returns."""
  code = 1
  try:
    listener.close()
    for conn in running.values():
      conn.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
      os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    encoding = os.environ.get("PYTHONIOENCODING", "utf-8").split(":")[0]
    _stdio(encoding or "utf-8", "strict")
    extra = [os.path.abspath(p) for p in
             request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    kind, what, args = request["kind"], request["what"], request["args"]
    import runpy, types
    # A fresh __main__: the server's own globals stay this function's.
    sys.modules["__main__"] = types.ModuleType("__main__")
    if kind == "entry_point":
      import importlib
      module, _, attr = what[1].partition(":")
      sys.path[:] = [os.path.dirname(what[0])] + extra + base_path
      sys.argv = [what[0]] + args
      function = importlib.import_module(module)
      for name in attr.split("."):
        function = getattr(function, name)
      result = function()
    elif kind == "module":
      sys.path[:] = [os.getcwd()] + extra + base_path
      sys.argv = ["-m"] + args
      result = runpy._run_module_as_main(what)  # pylint: disable=protected-access
    else:  # kind == "script": `python -c what args...`
      sys.path[:] = [""] + extra + base_path
      sys.argv = ["-c"] + args
      exec(compile(what, "<string>", "exec"),  # pylint: disable=exec-used
           sys.modules["__main__"].__dict__)
      result = None
    raise SystemExit(result)
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  try:
    import atexit
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    for stream in [sys.stdout, sys.stderr] + old:
      stream.flush()
  except BaseException:  # pylint: disable=broad-except
    pass
  os._exit(code)


while True:
  readable, _, _ = select.select([sys.stdin, listener], [], [], 0.05)
  if sys.stdin in readable and not sys.stdin.readline():
    break  # The parent is gone.
  if listener in readable:
    conn, _ = listener.accept()
    try:
      message, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
      request = json.loads(message)
    except (OSError, ValueError):  # A client that went away: the next one.
      conn.close()
      continue
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
      child(request, fds)
    for fd in fds:
      os.close(fd)
    running[pid] = conn
    try:
      conn.send(str(pid).encode())
    except OSError:  # Its client went away; the child is reaped below.
      pass
  while running:
    pid, status, usage = os.wait4(-1, os.WNOHANG)
    if not pid:
      break
    conn = running.pop(pid, None)
    if conn is not None:
      try:
        # The exit status, then the child's CPU seconds (its own and its
        # reaped children's: `children_cpu`).
        conn.send(f"{os.waitstatus_to_exitcode(status)} "
                  f"{usage.ru_utime + usage.ru_stime:.6f}".encode())
      except OSError:
        pass
      conn.close()
'''

_lock = threading.Lock()
_server = None
_children_cpu = 0.0  # CPU seconds of the forked children reaped so far.


def _exit_status(message: bytes) -> int:
  """The exit status in the server's report on a child ("status cpu"),
  whose CPU seconds are added to `children_cpu`'s."""
  global _children_cpu
  code, _, cpu = message.decode().partition(" ")
  with _lock:
    _children_cpu += float(cpu or 0)
  return int(code)


def children_cpu() -> float:
  """The CPU seconds (user + system) of every child this process's fork
  server has reaped and reported so far, their own children's included: the
  forks' share of a test's cost, which `resource.RUSAGE_CHILDREN` does not
  see (the server, not this process, reaps them). `tests/support/
  tf_audit.py` reads it around each test."""
  with _lock:
    return _children_cpu


class _Server:
  """The forking server of this process (started on first use)."""

  def __init__(self, env):
    self.dir = tempfile.mkdtemp(prefix="rnnstep_fork_")
    self.path = os.path.join(self.dir, "socket")
    self.env = dict(env)
    self.process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, self.path], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
        cwd="/", text=True)
    if self.process.stdout.readline().strip() != "ready":
      raise RuntimeError("the fork server did not start")
    atexit.register(self.close)

  def close(self):
    if self.process.poll() is None:
      self.process.stdin.close()
      try:
        self.process.wait(10)
      except subprocess.TimeoutExpired:
        self.process.kill()
    shutil.rmtree(self.dir, ignore_errors=True)

  def forkable(self, env):
    """Whether a child with `env` can be forked from this server."""
    keys = {k for k in set(env) | set(self.env)
            if k.startswith(_IMPORT_TIME_PREFIXES) and k not in _PER_CHILD}
    return all(env.get(k) == self.env.get(k) for k in keys)


def _server_for(env):
  global _server
  with _lock:
    if _server is None:
      from tests.support import cli  # pylint: disable=g-import-not-at-top
      _server = _Server(cli.ENV)
    return _server if _server.forkable(env) else None


def _plan(cmd):
  """(kind, what, args) for a command a fork can run, or None."""
  if not cmd:
    return None
  program = str(cmd[0])
  if program == sys.executable and len(cmd) >= 3 and cmd[1] in ("-c", "-m"):
    return ("script" if cmd[1] == "-c" else "module", str(cmd[2]),
            [str(a) for a in cmd[3:]])
  name = os.path.basename(program)
  found = shutil.which(name)
  resolved = shutil.which(program) if os.sep not in program else program
  if found and resolved and os.path.samefile(found, resolved):
    for entry in importlib.metadata.entry_points(group="console_scripts",
                                                 name=name):
      if entry.value.split(".")[0] == "rnnstep":
        # The script itself, where a shim (pyenv's) is what PATH finds.
        script = os.path.join(os.path.dirname(sys.executable), name)
        if not os.path.exists(script):
          script = found
        return "entry_point", [script, entry.value], [str(a) for a in cmd[1:]]
  return None


def _start(server, plan, cmd, env, cwd, stdin_spec, input_data, stdout,
           stderr):
  """Sends the fork request: (connection, pid, readers, stdin writer).

  `readers` maps "stdout"/"stderr" to the read end of a pipe made for a
  `subprocess.PIPE` (else None); the stdin writer is the pipe's write end
  when `input_data` is given.
  """
  opened, readers = [], {}

  def target(spec, mode):
    if spec == subprocess.PIPE:
      read, write = os.pipe()
      opened.append(write)
      return write, read
    if spec == subprocess.DEVNULL or spec is None:
      # A fork inherits nothing from the test process: None means what a
      # child of pytest would get (its stdin/stdout/stderr), which for a
      # captured test is not a terminal either.
      fd = os.open(os.devnull, mode)
      opened.append(fd)
      return fd, None
    if spec == subprocess.STDOUT:
      return None, None
    fd = spec if isinstance(spec, int) else spec.fileno()
    return fd, None

  stdin_fd, stdin_write = None, None
  if input_data is not None:
    read, stdin_write = os.pipe()
    opened.append(read)
    stdin_fd = read
  else:
    stdin_fd, _ = target(stdin_spec if stdin_spec is not None
                         else subprocess.DEVNULL, os.O_RDONLY)
  out_fd, readers["stdout"] = target(stdout, os.O_WRONLY)
  err_fd, readers["stderr"] = target(stderr, os.O_WRONLY)
  if err_fd is None:
    err_fd = out_fd
  request = {"kind": plan[0], "what": plan[1], "args": plan[2], "env": env,
             "cwd": os.path.abspath(cwd) if cwd else os.getcwd()}
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  try:
    conn.connect(server.path)
    socket.send_fds(conn, [json.dumps(request).encode()],
                    [stdin_fd, out_fd, err_fd])
    for fd in opened:
      os.close(fd)
    opened.clear()
    pid = int(conn.recv(64))
  except BaseException:
    for fd in opened + [fd for fd in readers.values() if fd is not None] + (
        [stdin_write] if stdin_write is not None else []):
      os.close(fd)
    conn.close()
    raise
  return conn, pid, readers, stdin_write


class Process:
  """A child forked by the server, as much of `subprocess.Popen` as the
  tests use: `pid`, `stdout`/`stderr` (pipes' read ends), `returncode`,
  `poll`, `wait`, `communicate`, `send_signal`, `terminate`, `kill`. The
  exit status comes from the fork server, which reaps the child."""

  def __init__(self, cmd, conn, pid, readers, text):
    self.args, self.pid, self.returncode = cmd, pid, None
    self._conn = conn
    mode = "r" if text else "rb"
    self.stdout, self.stderr = (
        os.fdopen(readers[name], mode) if readers.get(name) is not None
        else None for name in ("stdout", "stderr"))

  def _status(self, timeout):
    """The exit status, waiting up to `timeout` s (None: for ever, 0: not
    at all); None while it runs."""
    if self.returncode is None:
      self._conn.settimeout(timeout)
      try:
        status = self._conn.recv(64)
      except (socket.timeout, BlockingIOError):
        return None
      self.returncode = _exit_status(status)
      self._conn.close()
    return self.returncode

  def poll(self):
    return self._status(0)

  def wait(self, timeout=None):
    if self._status(timeout) is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, timeout=None):
    """(stdout, stderr) read to their ends, then the exit status waited
    for (stdin is /dev/null)."""
    outputs = {}

    def drain(name, stream):
      outputs[name] = stream.read()
      stream.close()

    threads = [threading.Thread(target=drain, args=(name, stream),
                                daemon=True)
               for name, stream in (("stdout", self.stdout),
                                    ("stderr", self.stderr)) if stream]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(timeout)
      if thread.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(timeout)
    return outputs.get("stdout"), outputs.get("stderr")

  def send_signal(self, sig):
    if self.poll() is None:  # Not reaped: the pid is still the child's.
      os.kill(self.pid, sig)

  def terminate(self):
    self.send_signal(signal.SIGTERM)

  def kill(self):
    self.send_signal(signal.SIGKILL)


def popen(cmd, *, env=None, cwd=None, stdout=None, stderr=None, text=False):
  """`subprocess.Popen(cmd, ...)` (stdin /dev/null), through the fork
  server where a fork can run `cmd`: a `Process`, else a real `Popen`."""
  env = dict(os.environ if env is None else env)
  plan = _plan(list(cmd)) if _ENABLED else None
  server = _server_for(env) if plan else None
  if server is None:
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, text=text)
  conn, pid, readers, _ = _start(server, plan, cmd, env, cwd, None, None,
                                 stdout, stderr)
  return Process(cmd, conn, pid, readers, text)


def run(cmd, *, env=None, cwd=None, stdin=None, input=None,  # pylint: disable=redefined-builtin
        capture_output=False, stdout=None, stderr=None, text=False,
        timeout=None, check=False):
  """`subprocess.run`, through the fork server where a fork can run `cmd`.

  Takes the `subprocess.run` arguments the tests use; stdout and stderr are
  captured (`capture_output`, or `subprocess.PIPE`), or given as a file
  descriptor or file object.

  Returns:
    A `subprocess.CompletedProcess`.

  Raises:
    subprocess.TimeoutExpired: as `subprocess.run` does (the child killed).
    subprocess.CalledProcessError: with `check`, as `subprocess.run` does.
  """
  env = dict(os.environ if env is None else env)
  plan = _plan(list(cmd)) if _ENABLED else None
  server = _server_for(env) if plan else None
  if server is None:
    return subprocess.run(cmd, env=env, cwd=cwd, stdin=stdin, input=input,
                          capture_output=capture_output, stdout=stdout,
                          stderr=stderr, text=text, timeout=timeout,
                          check=check)
  if capture_output:
    stdout = stderr = subprocess.PIPE
  conn, pid, readers, stdin_write = _start(server, plan, cmd, env, cwd, stdin,
                                           input, stdout, stderr)
  try:
    outputs = {}

    def drain(name, fd):
      with os.fdopen(fd, "rb") as f:
        outputs[name] = f.read()

    threads = [threading.Thread(target=drain, args=(name, fd), daemon=True)
               for name, fd in readers.items() if fd is not None]
    if stdin_write is not None:
      data = input.encode() if isinstance(input, str) else input

      def feed():
        with os.fdopen(stdin_write, "wb") as f:
          try:
            f.write(data)
          except BrokenPipeError:
            pass

      threads.append(threading.Thread(target=feed, daemon=True))
    for thread in threads:
      thread.start()
    conn.settimeout(timeout)
    try:
      status = conn.recv(64)
    except socket.timeout:
      os.kill(pid, signal.SIGKILL)
      conn.settimeout(None)
      _exit_status(conn.recv(64))
      for thread in threads:
        thread.join()
      raise subprocess.TimeoutExpired(cmd, timeout)  # pylint: disable=raise-missing-from
    for thread in threads:
      thread.join()
  finally:
    conn.close()
  returncode = _exit_status(status)

  def decoded(name):
    data = outputs.get(name)
    if not text or data is None:
      return data
    # As subprocess's text mode reads: universal newlines.
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")

  result = subprocess.CompletedProcess(cmd, returncode, decoded("stdout"),
                                       decoded("stderr"))
  if check:
    result.check_returncode()
  return result

