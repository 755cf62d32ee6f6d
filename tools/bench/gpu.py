"""The GPU check: rnnstep on one accelerator, ready to run in a few minutes.

USAGE:
  python tools/bench/gpu.py                          # tutorial size, < 5 min
  python tools/bench/gpu.py --json_out=/tmp/gpu.json
  python tools/bench/gpu.py --units=32 --embedding_dim=16 --batch_sizes=1,4 \
      --num_steps=20 --rounds=1 --bandwidth_mb=8 --keras_steps=5   # smoke run

It runs on whatever TensorFlow places work on first: GPU:0 when one is
visible (memory growth on, so it shares the card), else the CPU, and says
which. Every line it prints starts with a fixed word (BUILD_NOTES.md "The GPU
check" says what each means):

  device:   the accelerator (name, compute capability) or the CPU (model,
            kind, AMX / AVX-512 / AVX2 features, cores), and TF's version;
  model:    the model's shape and the bytes of weights one step reads;
  path:     chars/s of `rnnstep.generate` on each path (xla, graph,
            elementwise) and the default at each batch size (median of
            --rounds timed calls after a warm-up call);
  calls:    per generation, from a TF profiler trace taken at two step counts:
            functions executed, host->device and device->host copies, and
            device kernels; counts that do not grow with the step count
            prove that a generation is one device call with no per-step
            synchronisation (kernels do grow: the loop runs on the device);
  bound:    the device's read bandwidth (a --bandwidth_mb tensor read), the
            B=1 weight-read bound (weight bytes per step / that bandwidth), and
            the per-iteration cost of an XLA while loop that does almost
            nothing;
  step:     rnnstep's B=1 step time on the XLA path (the marginal cost: two
            step counts, subtracted) against both bounds;
  keras:    the tutorial's eager Keras loop and its OneStep, same device,
            weights and batch 1, and rnnstep's default over each;
  done:     total seconds.
"""

import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags

# The checkout's rnnstep and tests first (the code under check, whatever is
# installed), then tools/ for the bench package.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.dirname(os.path.dirname(_HERE))):
  if _path in sys.path:
    sys.path.remove(_path)
  sys.path.insert(0, _path)

_UNITS = flags.DEFINE_integer("units", 1024, "GRU units.", lower_bound=1)
_EMBEDDING = flags.DEFINE_integer("embedding_dim", 256, "Embedding width.",
                                  lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 65, "Vocabulary size.",
                              lower_bound=2)
_DTYPE = flags.DEFINE_enum("dtype", "float32",
                           ["float32", "bfloat16", "float16"],
                           "rnnstep's compute dtype.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "64", "1024"],
                                 "Batch sizes of the path lines.")
_PATHS = flags.DEFINE_list("paths", ["xla", "graph", "elementwise", "default"],
                           "Paths timed ('default': jit_compile=None).")
_NUM_STEPS = flags.DEFINE_integer("num_steps", 500,
                                  "Characters generated per row per call.",
                                  lower_bound=2)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed calls per case (median).",
                               lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 10, "Prompt length.",
                                   lower_bound=1)
_BANDWIDTH_MB = flags.DEFINE_integer("bandwidth_mb", 512,
                                "Megabytes copied to measure bandwidth.",
                                lower_bound=1)
_KERAS_STEPS = flags.DEFINE_integer(
    "keras_steps", 100, "Steps of the eager Keras loop and OneStep (0: skip).",
    lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 1234, "Seed of weights and prompts.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write results here.")

_PATH_JIT = {"xla": True, "graph": False, "elementwise": "elementwise",
             "default": None}


def say(line):
  print(line, flush=True)


def setup_device(tf):
  """Memory growth on every GPU (before any op runs); the device to use."""
  gpus = tf.config.list_physical_devices("GPU")
  for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
  return ("/GPU:0", gpus[0]) if gpus else ("/CPU:0", None)


def describe_device(tf, gpu):
  if gpu is not None:
    details = tf.config.experimental.get_device_details(gpu)
    capability = details.get("compute_capability")
    capability = ".".join(map(str, capability)) if capability else "?"
    gpus = len(tf.config.list_physical_devices("GPU"))
    return (f"device: GPU:0 {details.get('device_name', gpu.name)} (compute "
            f"capability {capability}; {gpus} visible) | TF {tf.__version__}")
  from rnnstep.engine import cpu  # pylint: disable=g-import-not-at-top
  this = cpu.info()
  have = set(this.features)
  marks = " ".join(f"{name} {'yes' if flag in have else 'no'}" for name, flag
                   in (("AMX", "amx_tile"), ("AVX512-BF16", "avx512_bf16"),
                       ("AVX-512", "avx512f"), ("AVX2", "avx2")))
  return (f"device: CPU {this.name} (kind {cpu.kind()}; {marks}; "
          f"{this.cores} cores) | TF {tf.__version__} | no GPU visible")


class Setting:
  """What bench.weights and bench.keras_loops read from the benchmark's."""

  def __init__(self):
    self.weights_path = None
    self.vocab_size = _VOCAB.value
    self.embedding_dim = _EMBEDDING.value
    self.units = _UNITS.value
    self.seed = _SEED.value
    self.temperature = 1.0
    self.eager_steps = self.onestep_steps = _KERAS_STEPS.value


def timed(fn, rounds):
  """fn() once to warm up, then `rounds` timed calls: the median seconds."""
  fn()
  seconds = []
  for _ in range(rounds):
    start = time.perf_counter()
    fn()
    seconds.append(time.perf_counter() - start)
  return statistics.median(seconds)


# Lines of a device plane that the profiler derives from the stream lines
# (counting them would count each kernel twice or more).
_DERIVED_LINES = ("XLA Ops", "XLA Modules", "TensorFlow Ops",
                  "TensorFlow Name Scope", "Framework Name Scope", "Steps",
                  "Source code", "Launch Stats", "XLA TraceMe")


def trace_counts(tf, fn):
  """Runs fn() under the TF profiler; counts what one call did.

  Returns:
    {"functions": top-level tf.function executions, "host_to_device" and
    "device_to_host": memcpy events on a GPU plane, "kernels": other events
    on the GPU planes, "device_traced": whether any GPU plane was recorded,
    "xla_programs": XLA executable runs seen on the host}.
  """
  with tempfile.TemporaryDirectory(prefix="rnnstep_gpu_trace_") as logdir:
    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=1)
    tf.profiler.experimental.start(logdir, options=options)
    try:
      fn()
    finally:
      tf.profiler.experimental.stop()
    return _counts(logdir)


def _counts(logdir):
  """`trace_counts`' counts from the profile written under `logdir`."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  counts = collections.Counter()
  for path in glob.glob(os.path.join(logdir, "plugins", "profile", "*",
                                     "*.xplane.pb")):
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
      space.ParseFromString(f.read())
    for plane in space.planes:
      on_gpu = plane.name.startswith("/device:GPU")
      counts["device_traced"] |= on_gpu
      for line in plane.lines:
        if on_gpu and line.name in _DERIVED_LINES:
          continue  # The same kernels again, grouped by op or module.
        for event in line.events:
          name = plane.event_metadata[event.metadata_id].name
          low = name.lower().replace(" ", "")
          if on_gpu:
            if "memcpy" in low and ("htod" in low or "h2d" in low):
              counts["host_to_device"] += 1
            elif "memcpy" in low and ("dtoh" in low or "d2h" in low):
              counts["device_to_host"] += 1
            elif "memcpy" not in low and "memset" not in low:
              counts["kernels"] += 1
          elif name.startswith("EagerLocalExecute: __inference_"):
            counts["functions"] += 1
          elif name in ("CpuExecutable::ExecuteAsyncOnStream",
                        "GpuExecutable::ExecuteAsyncOnStream",
                        "GpuExecutable::ExecuteThunks"):
            counts["xla_programs"] += 1
  return {key: int(counts[key]) for key in
          ("functions", "host_to_device", "device_to_host", "kernels",
           "device_traced", "xla_programs")}


def read_bandwidth(tf, device):
  """Bytes per second the device reads: a --bandwidth_mb tensor summed (XLA).

  The sum of x + 1 reads every byte once and writes one scalar (no copy back
  to the host but 4 bytes), which is what a step does to its weights.
  """
  count = _BANDWIDTH_MB.value * (1 << 20) // 4
  with tf.device(device):
    x = tf.zeros([count], tf.float32)
    read = tf.function(lambda x: tf.reduce_sum(x + 1.0), jit_compile=True)
    seconds = timed(lambda: read(x).numpy(), max(_ROUNDS.value, 3))
  return 4.0 * count / seconds


def while_loop_cost(tf, device, steps=(1000, 11000)):
  """Seconds per iteration of an XLA while loop with one scalar op a step."""
  with tf.device(device):

    @tf.function(jit_compile=True)
    def loop(n):
      return tf.while_loop(lambda t, x: t < n,
                           lambda t, x: (t + 1, x * 0.5 + 1.0),
                           (tf.constant(0), tf.constant([1.0])))[1]

    times = [timed(lambda n=n: loop(tf.constant(n)).numpy(),
                   max(_ROUNDS.value, 3)) for n in steps]
  return (times[1] - times[0]) / (steps[1] - steps[0])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  started = time.time()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  device, gpu = setup_device(tf)
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.engine import paths  # pylint: disable=g-import-not-at-top
  from bench import weights as weights_lib  # pylint: disable=g-import-not-at-top
  results = {"device": describe_device(tf, gpu)}
  say(results["device"])

  setting = Setting()
  weights = weights_lib.Weights(setting)
  with tf.device(device):
    model = weights.rnnstep_model(_DTYPE.value)
  units, vocab = weights.units, weights.vocab_size
  itemsize = tf.as_dtype(_DTYPE.value).size
  # One step reads the recurrent kernel, the output kernel and bias, one
  # [3U] row of the input table and the recurrent bias.
  step_bytes = itemsize * (units * 3 * units + units * vocab + vocab
                           + 3 * units) + 4 * 3 * units
  results["weight_bytes_per_step"] = step_bytes
  say(f"model: vocab {vocab}, embedding {weights.embedding_dim}, GRU {units} "
      f"(reset_after), {_DTYPE.value}; {step_bytes / 1e6:.2f} MB of weights "
      "read per step")

  steps = _NUM_STEPS.value
  batch_sizes = [int(b) for b in _BATCH_SIZES.value]
  results["paths"] = []
  for batch in batch_sizes:
    _, prompts = weights_lib.make_prompts(weights, batch, _PROMPT_LEN.value,
                                          _SEED.value)
    for name in _PATHS.value:
      jit = _PATH_JIT[name]

      def run(prompts=prompts, jit=jit, n=steps):
        with tf.device(device):
          return rnnstep.generate(model, prompts, n, seed=1, jit_compile=jit)

      seconds = timed(run, _ROUNDS.value)
      took = (paths.default_path(model, batch) if jit is None else name)
      label = f"default ({took})" if jit is None else name
      chars = batch * steps / seconds
      results["paths"].append({"path": name, "took": took, "batch": batch,
                               "chars_per_second": chars,
                               "seconds": seconds, "num_steps": steps})
      say(f"path {label} B={batch}: {chars:,.0f} chars/s ({seconds * 1e3:,.1f}"
          f" ms for {steps} steps, median of {_ROUNDS.value})")

  # One device call per generation: what a call does at two step counts.
  few, many = max(2, steps // 5), steps
  _, prompts = weights_lib.make_prompts(weights, 1, _PROMPT_LEN.value,
                                        _SEED.value)
  results["calls"] = {}
  for name in [p for p in _PATHS.value if p != "default"]:
    counts = {}
    for n in (few, many):

      def once(n=n, jit=_PATH_JIT[name]):
        with tf.device(device):
          rnnstep.generate(model, prompts, n, seed=1, jit_compile=jit)

      once()  # Compiled for this step count's capacity before tracing.
      counts[n] = trace_counts(tf, once)
    results["calls"][name] = counts
    a, b = counts[few], counts[many]
    grows = [k for k in ("functions", "host_to_device", "device_to_host")
             if b[k] != a[k]]
    per_step = (b["kernels"] - a["kernels"]) / (many - few)
    traced = ("" if a["device_traced"] else
              "; no device trace (CUPTI not loaded, or no GPU): host counts")
    say(f"calls {name} B=1: {a['functions']} / {b['functions']} function "
        f"executions at {few} / {many} steps; host->device copies "
        f"{a['host_to_device']} / {b['host_to_device']}, device->host "
        f"{a['device_to_host']} / {b['device_to_host']}; device kernels "
        f"{a['kernels']} / {b['kernels']} ({per_step:.1f} per step); "
        + ("one call, no per-step sync" if not grows and a["functions"] == 1
           else "GROWS with steps: " + ", ".join(grows or ["functions"]))
        + traced)

  bandwidth = read_bandwidth(tf, device)
  weight_bound = step_bytes / bandwidth
  loop_cost = while_loop_cost(tf, device)
  results.update(bandwidth_bytes_per_second=bandwidth,
                 weight_read_bound_seconds=weight_bound,
                 while_iteration_seconds=loop_cost)
  say(f"bound bandwidth: {bandwidth / 1e9:,.1f} GB/s (a "
      f"{_BANDWIDTH_MB.value} MB device read)")
  say(f"bound weights: {step_bytes / 1e6:.2f} MB per step / "
      f"{bandwidth / 1e9:,.1f} GB/s = {weight_bound * 1e6:.2f} us per step")
  say(f"bound while: {loop_cost * 1e6:.2f} us per iteration (XLA while loop, "
      "a counter and one scalar op)")

  def xla_call(n):
    with tf.device(device):
      return rnnstep.generate(model, prompts, n, seed=1, jit_compile=True)

  short, long = timed(lambda: xla_call(few), _ROUNDS.value), timed(
      lambda: xla_call(many), _ROUNDS.value)
  step = (long - short) / (many - few)
  results["step_seconds_b1_xla"] = step

  def times(bound):  # A noisy machine can make a difference of medians <= 0.
    return f"{step / bound:.2f}x" if step > 0 and bound > 0 else "n/a (noise)"

  say(f"step B=1 xla: {step * 1e6:.2f} us per step (marginal, {many} vs {few} "
      f"steps) = {times(weight_bound)} the weight-read bound, "
      f"{times(loop_cost)} the while-loop bound")

  if _KERAS_STEPS.value:
    from bench import keras_loops  # pylint: disable=g-import-not-at-top
    ids, prompts = weights_lib.make_prompts(weights, 1, _PROMPT_LEN.value,
                                            _SEED.value)
    with tf.device(device):
      keras_model = keras_loops.build_keras_model(weights)
      eager = keras_loops.EagerKeras(keras_model, weights, setting)
      onestep = keras_loops.OneStepKeras(keras_model, weights, setting)
    keras_steps = _KERAS_STEPS.value

    def on_device(fn):
      def call():
        with tf.device(device):
          fn(ids, _SEED.value)
      return call

    onestep(ids, _SEED.value)  # OneStep traces twice (states=None first).
    eager_chars = keras_steps / timed(on_device(eager), _ROUNDS.value)
    onestep_chars = keras_steps / timed(on_device(onestep), _ROUNDS.value)
    default = paths.default_path(model, 1)

    def ours_call():
      with tf.device(device):
        rnnstep.generate(model, prompts, steps, seed=1)

    ours = steps / timed(ours_call, _ROUNDS.value)
    results["keras"] = {"eager_chars_per_second": eager_chars,
                        "onestep_chars_per_second": onestep_chars,
                        "rnnstep_chars_per_second": ours,
                        "rnnstep_path": default}
    say(f"keras B=1: eager loop {eager_chars:,.0f} chars/s, OneStep "
        f"{onestep_chars:,.0f} chars/s; rnnstep default ({default}) "
        f"{ours:,.0f} chars/s = {ours / onestep_chars:.1f}x OneStep, "
        f"{ours / eager_chars:.1f}x the eager loop")

  results["seconds"] = time.time() - started
  say(f"done: {results['seconds']:.0f} s")
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      json.dump(results, f, indent=1, default=float)
  return 0


if __name__ == "__main__":
  app.run(main)
