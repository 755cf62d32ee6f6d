"""rnnstep-serve: an OpenAI-compatible completions server with continuous batching.

    rnnstep-serve --model=model.npz --port=8000
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \
      -d '{"prompt": "ROMEO:", "max_tokens": 100, "temperature": 0.8, "seed": 1}'

Every choice's text equals rnnstep.generate(model, prompt, max_tokens,
seed=seed, **options) for the same request (choice k of a list of prompts, or
of n > 1, is row k of generate over the prompts each repeated n times), under
any load; a chat request's, generate's on its messages rendered by the
model's chat template (--chat_template), cut at the end of the turn.
Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
POST /tokenize and /detokenize, GET /health (503 until warm), GET /metrics
(Prometheus), GET /openapi.json. With --api_key (or --api_key_file, or
RNNSTEP_API_KEY) every route but /health, /metrics and /openapi.json needs
`Authorization: Bearer KEY`. SIGTERM stops admitting (503), finishes the requests in flight (up to
--drain_timeout s) and exits 0; a failed warm-up exits 1, saying why.
"""

import ipaddress
import os
import pathlib
import re
import signal
import sys
import threading

from absl import flags

from rnnstep.cli import common
from rnnstep.engine import cpu

PROGRAM = "rnnstep-serve"
FLAGS = flags.FlagValues()

_MODEL, _DTYPE = common.define_model_flags(
    FLAGS, "Model file (.npz). Default: the bundled Shakespeare model.")
_WEIGHTS_DTYPE = common.define_weights_dtype_flag(FLAGS)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.",
                            flag_values=FLAGS)
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.",
                             lower_bound=0, upper_bound=65535,
                             flag_values=FLAGS)
_MAX_BATCH = flags.DEFINE_integer(
    "max_batch", 64, "Slots: rows (choices) decoded together at most.",
    lower_bound=1, upper_bound=4096, flag_values=FLAGS)
_CHUNK_STEPS = flags.DEFINE_integer(
    "chunk_steps", 128, "Steps per device call; rows join and leave between "
    "calls. Each call costs a fixed few ms besides its steps (measured 7-15 "
    "ms, tutorial GRU on a 2-core Zen 4), so smaller chunks stream sooner "
    "and finer at some cost in throughput.", lower_bound=1, upper_bound=4096,
    flag_values=FLAGS)
_MAX_QUEUE = flags.DEFINE_integer(
    "max_queue", 256, "Rows waiting for a slot at most (beyond the free "
    "slots); more get 429.",
    lower_bound=0, flag_values=FLAGS)
_MAX_TOKENS_LIMIT = flags.DEFINE_integer(
    "max_tokens_limit", 2048, "The largest max_tokens a request may ask.",
    lower_bound=1, upper_bound=1 << 20, flag_values=FLAGS)
_MAX_PROMPT_TOKENS = flags.DEFINE_integer(
    "max_prompt_tokens", 1024, "The longest prompt served, in the model's "
    "ids (a character model's characters; a byte model's bytes): every "
    "buffer is sized from it, and a longer prompt gets 400. A prompt longer "
    "than a chunk is primed a chunk's worth of ids a call.", lower_bound=1,
    upper_bound=1 << 20, flag_values=FLAGS)
flags.DEFINE_alias("max_prompt_chars", "max_prompt_tokens", flag_values=FLAGS)
_MAX_BODY_BYTES = flags.DEFINE_integer(
    "max_body_bytes", 1 << 20, "The largest request body read (larger: "
    "413, refused before it is parsed).", lower_bound=1 << 10,
    upper_bound=256 << 20, flag_values=FLAGS)
_BODY_TIMEOUT = flags.DEFINE_float(
    "body_timeout", 30.0, "Seconds a client has to send its request body "
    "(later: 408).", lower_bound=0.1, flag_values=FLAGS)
_CHECK_TIMEOUT = flags.DEFINE_float(
    "check_timeout", 10.0, "Seconds a request's checks may take (compiling "
    "its regex, its stop strings): past them, 400 naming the field.",
    lower_bound=0.1, flag_values=FLAGS)
_SERVED_MODEL_NAME = flags.DEFINE_string(
    "served_model_name", None, "The model's name in /v1/models and in "
    "responses; a request naming another gets 404 (model_not_found). "
    "Default: the model file's stem (shakespeare for the bundled model).",
    flag_values=FLAGS)
_API_KEY = flags.DEFINE_multi_string(
    "api_key", [], "A key clients must send as `Authorization: Bearer KEY` "
    "(repeatable; also RNNSTEP_API_KEY and --api_key_file). Without any, "
    "anyone who reaches the port may use the server.", flag_values=FLAGS)
_API_KEY_FILE = flags.DEFINE_string(
    "api_key_file", None, "A file of API keys, one a line (blank lines and "
    "lines starting with # are skipped).", flag_values=FLAGS)
_ALLOWED_ORIGINS = flags.DEFINE_list(
    "allowed_origins", [], "Origins whose web pages may read the server's "
    "answers (CORS; e.g. https://app.example.com, or * for any). Default: "
    "none.", flag_values=FLAGS)
_ALLOWED_HOSTS = flags.DEFINE_list(
    "allowed_hosts", None, "Host headers answered (others: 400), against DNS "
    "rebinding; * for any. Default: localhost and 127.0.0.1 when --host is "
    "a loopback address, else any.", flag_values=FLAGS)
_JIT_COMPILE = flags.DEFINE_enum(
    "jit_compile", "auto", ["auto", "true", "false", "elementwise"],
    "Execution path, as generate's jit_compile (auto: the fastest for the "
    "rows one lane runs on its threads, paths.lane_path).", flag_values=FLAGS)
_BACKGROUND_COMPILE = flags.DEFINE_bool(
    "background_compile", True, "On the XLA path, answer from the start: "
    "a call whose shape's XLA program (one per batch bucket and prompt "
    "width) is not compiled yet runs on the graph path, the same text, "
    "while a thread compiles it (the bundled model's 14 programs took about "
    "2 CPU-minutes on a 2-core Zen 3); /health's programs_compiling counts "
    "those left. --nobackground_compile: compile them all before /health "
    "says ready.", flag_values=FLAGS)
_STRATEGY = flags.DEFINE_enum(
    "strategy", "none", ["none", "mirrored"],
    "mirrored: spread the slots over --devices (tf.distribute."
    "MirroredStrategy, the library's strategy=): each chunk's rows are split "
    "evenly over them, every row's text unchanged.", flag_values=FLAGS)
_DEVICES = flags.DEFINE_list(
    "devices", None, "With --strategy=mirrored, the devices (default: every "
    "GPU, else the CPU). More CPUs than the machine has (/cpu:0,/cpu:1) "
    "split its CPU into logical devices, for trying the strategy on a "
    "CPU-only machine.", flag_values=FLAGS)
_LANES = flags.DEFINE_integer(
    "lanes", None, "Schedulers, each running its share of the slots in "
    "compiled calls of its own, on one thread (rnnstep/serve/lanes.py). "
    "Default: on a CPU, one a core this process may use (at most "
    "--max_batch), but 1 for an RWKV-7 model or on an AVX2-only CPU "
    "(lanes.runs_one_lane); with a GPU or --strategy, 1.", lower_bound=1,
    flag_values=FLAGS)
_INTRA_OP_THREADS = flags.DEFINE_integer(
    "intra_op_threads", None, "TensorFlow's threads within one op (a "
    "matmul's). Default: 1 with several --lanes (each lane's call on a "
    "thread of its own); with one, one fewer than the CPUs this process may "
    "use, at least 1, so the event loop, which formats and sends every "
    "response, keeps a core beside the compiled calls (TensorFlow's own "
    "with --strategy, and where one lane is the default: "
    "lanes.runs_one_lane); 0: TensorFlow's own.", lower_bound=0,
    flag_values=FLAGS)
_INTER_OP_THREADS = flags.DEFINE_integer(
    "inter_op_threads", None, "TensorFlow's threads running independent "
    "ops at once. Default: --lanes with several, else as "
    "--intra_op_threads; 0: TensorFlow's own.", lower_bound=0,
    flag_values=FLAGS)
_PREFIX_CACHE_MB = flags.DEFINE_float(
    "prefix_cache_mb", 256.0, "MiB of recurrent states the prefix cache "
    "holds (rnnstep/serve/prefix_cache.py; least recently used out first; "
    "shared by the lanes): a request whose prompt starts with a cached "
    "prefix primes only the rest, with the same text. The default holds "
    "about 100 states of the 0.1B RWKV-7 shape (2.4 MB each: the pieces of "
    "a dozen 1,000-token prompts) and tens of thousands of a char GRU's; "
    "0 turns it off.", lower_bound=0.0, flag_values=FLAGS)
_STATE = flags.DEFINE_string(
    "state", None, "A state file (`rnnstep.load_state`'s: an RWKV state "
    "tuning .pth, .safetensors or .st, or `rnnstep.save_state`'s) every "
    "request starts from unless it names another (`state`, with --states).",
    flag_values=FLAGS)
_STATES = flags.DEFINE_string(
    "states", None, "A folder of state files a request picks by name with "
    "its `state` field (the file's name without its suffix; an unknown "
    "name gets 404 naming `state`).", flag_values=FLAGS)
_CHAT_TEMPLATE = flags.DEFINE_string(
    "chat_template", None, "The chat template /v1/chat/completions renders "
    "messages with: a Jinja file (rendered in Jinja's sandbox, as Hugging "
    "Face renders one), or a Hugging Face tokenizer_config.json (its "
    "chat_template, bos_token and eos_token). Default: the model's own (a "
    "tokenizer_config.json's that rnnstep-convert found with it), else "
    "RWKV's convention for a model with RWKV's world vocabulary; else chat "
    "requests get 400.",
    flag_values=FLAGS)
_CHAT_END_OF_TURN = flags.DEFINE_multi_string(
    "chat_end_of_turn", None, "A stop string that ends a chat reply "
    "(repeatable; \\n is a line end, \\t a tab, \\\\ a backslash). "
    "Default: the template's own (its eos_token; RWKV's: a blank line).",
    flag_values=FLAGS)
_DRAIN_TIMEOUT = flags.DEFINE_float(
    "drain_timeout", 30.0, "On SIGTERM, seconds to finish the requests in "
    "flight.", lower_bound=0.0, flag_values=FLAGS)


def _path(model, replicas: int) -> str:
  """--jit_compile's path; auto: the path for what one lane runs.

  Args:
    model: the served `rnnstep.Model`.
    replicas: the schedulers' devices together: the lanes, or the
      strategy's replicas (with --strategy there is one lane).

  Returns:
    One of `paths.CONCRETE`.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from rnnstep.engine import paths
  # pylint: enable=g-import-not-at-top
  jit_compile = {"auto": None, "true": True, "false": False,
                 "elementwise": paths.ELEMENTWISE}[_JIT_COMPILE.value]
  path = paths.from_jit_compile(jit_compile)
  if path != paths.AUTO:
    return path
  # A lane's rows, on the intra-op threads `_threads` set (0: TensorFlow's
  # own, one a core), beside the other lanes' calls: one thread a lane ranks
  # the paths otherwise than the library's one call on every core.
  rows = -(-_MAX_BATCH.value // replicas)
  threads = (tf.config.threading.get_intra_op_parallelism_threads()
             or cpu.usable_cores())
  lanes = replicas if _STRATEGY.value == "none" else 1
  return paths.lane_path(model, rows, lanes, threads)


def _lanes(cell_kinds) -> int:
  """--lanes, or its default: on a CPU the kind's and the model's
  (`lanes.default_lanes`; `cell_kinds`: its layers'), else one."""
  from rnnstep.serve import lanes as lanes_lib  # pylint: disable=g-import-not-at-top
  if _LANES.value is not None:
    return min(_LANES.value, _MAX_BATCH.value)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if _STRATEGY.value != "none" or tf.config.list_physical_devices("GPU"):
    return 1
  return lanes_lib.default_lanes(cpu.kind(), cpu.usable_cores(),
                                 _MAX_BATCH.value, cell_kinds)


def _intra_op_threads(lanes: int, cell_kinds) -> int:
  """--intra_op_threads, or its default for `lanes` (see `_threads`; 0:
  TensorFlow's own, one a core)."""
  from rnnstep.serve import lanes as lanes_lib  # pylint: disable=g-import-not-at-top
  if _INTRA_OP_THREADS.value is not None:
    return _INTRA_OP_THREADS.value
  if lanes > 1:
    return 1
  if (_STRATEGY.value != "none"
      or lanes_lib.runs_one_lane(cpu.kind(), cell_kinds)):
    return 0
  return max(cpu.usable_cores() - 1, 1)


def _threads(lanes: int, cell_kinds) -> None:
  """Sets TensorFlow's thread pools (--intra_op_threads, --inter_op_threads).

  With several lanes each lane's call runs on one thread of its own (one
  intra-op thread: an op runs on the thread that runs it; an inter-op thread
  a lane, so that the lanes' calls run side by side). With one lane on a
  CPU kind or for a model that runs one lane by default
  (`lanes.runs_one_lane`), or under --strategy, TensorFlow's own pools
  (every core: what was measured there).
  Otherwise, with one lane, on a 2-core machine the graph's own two pools
  contend with the event loop for the cores; one fewer thread runs a chunk
  in less CPU time (no hand-offs between threads) and leaves a core to the
  HTTP side. Called before TensorFlow runs anything (the pools are fixed
  then).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  intra = _intra_op_threads(lanes, cell_kinds)
  inter = _INTER_OP_THREADS.value
  if inter is None:
    inter = lanes if lanes > 1 else intra
  tf.config.threading.set_intra_op_parallelism_threads(intra)
  tf.config.threading.set_inter_op_parallelism_threads(inter)


def _strategy():
  """The `tf.distribute.Strategy` of --strategy and --devices, or None.

  Called before anything touches a device: splitting the CPU into logical
  devices must come before TensorFlow initializes it.

  Raises:
    common.Failure: --devices names devices this machine lacks.
  """
  if _STRATEGY.value == "none":
    if _DEVICES.value:
      raise common.Failure("--devices: needs --strategy=mirrored",
                           common.EXIT_USAGE)
    return None
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  devices = _DEVICES.value or None
  try:
    cpus = [d for d in devices or () if tf.DeviceSpec.from_string(
        d).device_type in ("CPU", "cpu")]
    physical = tf.config.list_physical_devices("CPU")
    if len(cpus) > len(physical):
      tf.config.set_logical_device_configuration(
          physical[0], [tf.config.LogicalDeviceConfiguration()] * (
              len(cpus) - len(physical) + 1))
    # MirroredStrategy takes any name; a device that is not there would
    # only fail (or hang) at the first call.
    present = {(d.device_type, tf.DeviceSpec.from_string(d.name).device_index)
               for d in tf.config.list_logical_devices()}
    for name in devices or ():
      spec = tf.DeviceSpec.from_string(name)
      if ((spec.device_type or "").upper(), spec.device_index) not in present:
        raise ValueError(f"no device {name} here (there are "
                         f"{', '.join(sorted(f'/{t}:{i}' for t, i in present))})")
    return tf.distribute.MirroredStrategy(devices)
  except (ValueError, RuntimeError) as e:
    raise common.Failure(f"--devices: {e}".splitlines()[0],
                         common.EXIT_USAGE) from None


def _api_keys():
  """The keys of --api_key, --api_key_file and RNNSTEP_API_KEY.

  Raises:
    common.Failure: --api_key_file cannot be read, or a key is unusable.
  """
  keys = list(_API_KEY.value)
  if os.environ.get("RNNSTEP_API_KEY"):
    keys.append(os.environ["RNNSTEP_API_KEY"])
  if _API_KEY_FILE.value:
    try:
      with open(_API_KEY_FILE.value, encoding="utf-8") as f:
        text = f.read(1 << 20)
    except (OSError, UnicodeDecodeError) as e:
      raise common.Failure(f"--api_key_file: cannot read "
                           f"{_API_KEY_FILE.value}: {e}", common.EXIT_USAGE)
    keys += [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith("#")]
    if not keys:
      raise common.Failure(f"--api_key_file: {_API_KEY_FILE.value} holds no "
                           "key", common.EXIT_USAGE)
  for key in keys:
    if not key.strip() or not key.isprintable() or not key.isascii() or (
        len(key.split()) != 1):
      raise common.Failure("--api_key: a key must be printable ASCII "
                           "without spaces", common.EXIT_USAGE)
  return [key.strip() for key in keys]


def _allowed_hosts():
  """--allowed_hosts, or its default: loopback names on a loopback address."""
  if _ALLOWED_HOSTS.value is not None:
    return _ALLOWED_HOSTS.value or ["*"]
  try:
    loopback = ipaddress.ip_address(_HOST.value).is_loopback
  except ValueError:
    loopback = _HOST.value == "localhost"
  return ["localhost", "127.0.0.1"] if loopback else ["*"]


def _states(model):
  """The named initial states of --state and --states, and the default's
  name (--state's: its file's stem; None without it).

  Returns:
    `({name: one row's state, per layer a tuple of [U] arrays}, default)`.

  Raises:
    common.Failure: a file that cannot be read as a state of this model, a
      folder that is none or holds no state file, two files of one name.
  """
  if not _STATE.value and not _STATES.value:
    return {}, None
  # pylint: disable=g-import-not-at-top
  import rnnstep
  from rnnstep import api
  from rnnstep.convert import state_file
  # pylint: enable=g-import-not-at-top

  def load(path, flag):
    try:
      state = api.check_initial_state(model, rnnstep.load_state(path, model),
                                      1)
    except (OSError, ValueError) as e:
      raise common.Failure(f"--{flag}: {path}: {e}".splitlines()[0],
                           common.EXIT_USAGE) from None
    return tuple(tuple(x[0] for x in layer) for layer in state)

  states, default = {}, None
  if _STATES.value:
    folder = pathlib.Path(_STATES.value)
    if not folder.is_dir():
      raise common.Failure(f"--states: {folder} is not a folder",
                           common.EXIT_USAGE)
    for path in sorted(folder.iterdir()):
      if (not path.name.lower().endswith(state_file.SUFFIXES)
          or not path.is_file()):
        continue
      if path.stem in states:
        raise common.Failure(f"--states: two files are named {path.stem} "
                             f"in {folder}", common.EXIT_USAGE)
      states[path.stem] = load(str(path), "states")
    if not states:
      raise common.Failure(f"--states: {folder} holds no state file "
                           f"({', '.join(state_file.SUFFIXES)})",
                           common.EXIT_USAGE)
  if _STATE.value:
    default = pathlib.Path(_STATE.value).stem
    if default in states:
      raise common.Failure(f"--state: {default} is also a state of --states",
                           common.EXIT_USAGE)
    states[default] = load(_STATE.value, "state")
  return states, default


def _unescape(text: str) -> str:
  """A flag's text with \\n, \\t and \\\\ read as a line end, a tab and a
  backslash."""
  return re.sub(r"\\([nt\\])",
                lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)],
                text)


def _chat_template(model):
  """The model's chat template (`chat_template.find`), or None.

  Raises:
    common.Failure: --chat_template cannot be used, naming it.
  """
  from rnnstep.model import chat_template  # pylint: disable=g-import-not-at-top
  end_of_turn = None
  if _CHAT_END_OF_TURN.value:
    end_of_turn = [_unescape(s) for s in _CHAT_END_OF_TURN.value]
    if not all(end_of_turn):
      raise common.Failure("--chat_end_of_turn: a stop string is empty",
                           common.EXIT_USAGE)
  try:
    return chat_template.find(model.chat_template, model.tokens.kind,
                              _CHAT_TEMPLATE.value, end_of_turn)
  except chat_template.TemplateError as e:
    flag = "--chat_template" if _CHAT_TEMPLATE.value else "--model"
    raise common.Failure(f"{flag}: {e}", common.EXIT_USAGE) from None


def _model_name() -> str:
  if _SERVED_MODEL_NAME.value:
    return _SERVED_MODEL_NAME.value
  return pathlib.Path(_MODEL.value).stem if _MODEL.value else "shakespeare"


def main(argv) -> int:
  common.reject_arguments(argv)
  api_keys = _api_keys()  # Before the model loads: a bad key file is quick.
  # pylint: disable=g-import-not-at-top
  import uvicorn
  from rnnstep.serve import app as app_lib
  from rnnstep.serve import lanes as lanes_lib
  from rnnstep.serve import prefix_cache as prefix_cache_lib
  from rnnstep.serve import scheduler as scheduler_lib
  # pylint: enable=g-import-not-at-top
  # Read before TensorFlow starts: its thread pools follow the model.
  model_data = common.read_model(_MODEL.value, flag=_MODEL.name)
  cell_kinds = tuple(layer.kind for layer in model_data.config.layers)
  lanes = _lanes(cell_kinds)
  _threads(lanes, cell_kinds)
  strategy = _strategy()
  model = common.load_model(_MODEL.value, _DTYPE.value, flag=_MODEL.name,
                            weights_dtype=_WEIGHTS_DTYPE.value,
                            model_data=model_data)
  del model_data  # The model holds its tensors now.
  if model.config.window:
    raise common.Failure(f"--model: the model reads windows of "
                         f"{model.config.window} characters; rnnstep-serve "
                         "serves stateful models only", common.EXIT_USAGE)
  chat_template = _chat_template(model)
  # The library's choice for the rows one lane's device runs.
  path = _path(model, (strategy.num_replicas_in_sync if strategy else 1)
               * lanes)
  states, default_state = _states(model)
  # One cache for every lane: a prefix one lane primed serves them all.
  prefix_cache = (prefix_cache_lib.PrefixCache(
      prefix_cache_lib.megabytes_to_bytes(_PREFIX_CACHE_MB.value))
                  if _PREFIX_CACHE_MB.value > 0 else None)
  schedulers = [scheduler_lib.Scheduler(
      model, path=path, max_batch=slots, chunk_steps=_CHUNK_STEPS.value,
      max_queue=lanes_lib.lane_queue(_MAX_QUEUE.value, _MAX_BATCH.value,
                                     slots),
      max_tokens_limit=_MAX_TOKENS_LIMIT.value,
      max_prompt_tokens=_MAX_PROMPT_TOKENS.value, strategy=strategy,
      compile_in_background=_BACKGROUND_COMPILE.value,
      prefix_cache=prefix_cache, states=states, default_state=default_state)
                for slots in lanes_lib.split_slots(_MAX_BATCH.value, lanes)]
  scheduler = (schedulers[0] if lanes == 1
               else lanes_lib.Lanes(schedulers, _MAX_QUEUE.value))
  server = app_lib.Server(
      model, scheduler, model_id=_model_name(),
      max_body_bytes=_MAX_BODY_BYTES.value, api_keys=api_keys,
      allowed_origins=_ALLOWED_ORIGINS.value,
      allowed_hosts=_allowed_hosts(), body_seconds=_BODY_TIMEOUT.value,
      check_seconds=_CHECK_TIMEOUT.value, max_queue=_MAX_QUEUE.value,
      chat_template=chat_template)
  failed = []  # Why the warm-up failed.

  class Uvicorn(uvicorn.Server):
    """Answers 503 from the first SIGTERM on, while uvicorn drains."""

    def handle_exit(self, sig, frame):
      server.shutdown()
      super().handle_exit(sig, frame)

  # The drain lets streams finish (uvicorn cancels what is left after
  # --drain_timeout).
  http = Uvicorn(uvicorn.Config(
      server.app, host=_HOST.value, port=_PORT.value, log_level="warning",
      timeout_graceful_shutdown=_DRAIN_TIMEOUT.value, lifespan="off"))

  def warm():
    try:
      scheduler.warm_up()
      scheduler.start()
    except BaseException as e:  # pylint: disable=broad-except
      failed.append(f"{type(e).__name__}: {e}".splitlines()[0][:500])
      http.should_exit = True
      return
    server.ready = True
    out = common.stderr()
    out.write(f"{PROGRAM}: ready on http://{_HOST.value}:{_PORT.value}\n")
    if not api_keys:
      out.write(f"{PROGRAM}: no API key (--api_key): anyone who reaches "
                f"port {_PORT.value} may use this server\n")
    out.flush()

  threading.Thread(target=warm, name="rnnstep-warm-up", daemon=True).start()
  # uvicorn handles SIGTERM while it runs (drain, then return) and re-raises
  # it afterwards: ignored then, so a drained server exits 0.
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  http.run()
  if failed:
    raise common.Failure(f"warm-up failed: {failed[0]}")
  scheduler.close(timeout=_DRAIN_TIMEOUT.value)
  if scheduler.compiling:
    # A program still compiling (--background_compile) on its daemon
    # thread, inside XLA: the interpreter's exit would abort the process
    # (measured: SIGABRT, "terminate called"). Nothing is left to do.
    sys.stdout.flush()
    common.stderr().flush()
    os._exit(0)  # pylint: disable=protected-access
  return 0


run = common.entry_point(PROGRAM, __doc__, FLAGS, main)

if __name__ == "__main__":
  run()
