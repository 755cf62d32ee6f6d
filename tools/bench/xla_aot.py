"""Would XLA's ahead-of-time compiler give the warm command 16-bit decode?

rnnstep-generate's warm path runs a LiteRT artifact, whose XNNPACK kernels
widen 16-bit weights to float32 when they load them (x86 without
AVX512-FP16), so a 16-bit model's warm command decodes at float32's rate
(issue 62). The library's XLA program reads them as 16 bits inside its
products (`rnnstep/model/sixteen_bit.py`), but a process must import
TensorFlow, load the model and trace and lower the program before its first
token. TensorFlow's `saved_model_cli aot_compile_cpu` (tfcompile) compiles
such a program into an object file that runs without TensorFlow. This probe
builds one and times it (the results are in
benchmarks/results/xla-aot-probe-epyc-zen5-2026-12.md):

    python tools/bench/xla_aot.py --model=m.npz --weights_dtype=float16 \
        --out=/tmp/xla_aot

  1. builds XLA's AOT runtime from `tensorflow/xla_aot_runtime_src` (cmake,
     ninja, g++; once per --out);
  2. saves a greedy decode loop of --steps steps of the model's own
     `Network.step` (one XLA program, `one_xla_program`) as a SavedModel,
     the state and every weight its arguments (16-bit ones as uint16,
     bitcast inside: tfcompile writes no C++ type for F16);
  3. compiles it for this CPU (`--target_cpu`, `--multithreading`) and
     links it with a small C shim into a shared library;
  4. runs it through ctypes on 1 and 2 threads, alternated over --rounds,
     beside the same function compiled by XLA's JIT in TensorFlow, and
     checks both continue `--prompt_id` with the same ids.
"""

import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import rnnstep
from rnnstep.model import network as network_lib

_MODEL = flags.DEFINE_string("model", None, "An RWKV-7 model file.",
                             required=True)
_WEIGHTS_DTYPE = flags.DEFINE_string("weights_dtype", "float16",
                                     "rnnstep.load's weights_dtype.")
_OUT = flags.DEFINE_string("out", "/tmp/xla_aot", "Working folder.")
_STEPS = flags.DEFINE_integer("steps", 128, "Greedy steps a call.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternated rounds.")
_TARGET_CPU = flags.DEFINE_string("target_cpu", "znver4",
                                  "LLVM's CPU name for the AOT compile.")
_PROMPT_ID = flags.DEFINE_integer("prompt_id", 1, "The first token.")

TF_DIR = os.path.dirname(tf.__file__)
SHIM = r"""
#define EIGEN_USE_THREADS
#include "unsupported/Eigen/CXX11/Tensor"
#include "decode/decode.h"
extern "C" {
struct Handle { Eigen::ThreadPool* pool; Eigen::ThreadPoolDevice* device;
                Decode* fn; };
void* handle_new(int threads) {
  Handle* h = new Handle;
  h->pool = new Eigen::ThreadPool(threads);
  h->device = new Eigen::ThreadPoolDevice(h->pool, threads);
  h->fn = new Decode(
      tensorflow::XlaCompiledCpuFunction::AllocMode::RESULTS_PROFILES_AND_TEMPS_ONLY);
  h->fn->set_thread_pool(h->device);
  return h;
}
void handle_set(void* h, int i, const void* data) {
  static_cast<Handle*>(h)->fn->set_arg_data(i, data);
}
int handle_run(void* h) { return static_cast<Handle*>(h)->fn->Run() ? 0 : 1; }
void* handle_result(void* h, int i) {
  return static_cast<Handle*>(h)->fn->result_data(i);
}
}
"""


def decode_function(model, steps):
  """The greedy loop, its argument specs and the weights' argument values."""
  weights = model.network_weights()
  flat = tf.nest.flatten(weights)
  state0 = network_lib.network_of(model.architecture, weights,
                                  one_xla_program=True).zero_state(1)
  flat_state = tf.nest.flatten(state0)
  wide = lambda w: tf.as_dtype(w.dtype) in (tf.float16, tf.bfloat16)
  specs = ([tf.TensorSpec([1], tf.int32)]
           + [tf.TensorSpec(s.shape, s.dtype) for s in flat_state]
           + [tf.TensorSpec(w.shape, tf.uint16 if wide(w) else w.dtype)
              for w in flat])

  def decode(ids, *args):
    state = tf.nest.pack_sequence_as(state0, list(args[:len(flat_state)]))
    tensors = [tf.bitcast(a, w.dtype) if wide(w) else a
               for a, w in zip(args[len(flat_state):], flat)]
    net = network_lib.network_of(
        model.architecture, tf.nest.pack_sequence_as(weights, tensors),
        one_xla_program=True)

    def body(t, token, state, out):
      logits, state = net.step(token, state)
      token = tf.argmax(logits, -1, output_type=tf.int32)
      return t + 1, token, state, out.write(t, token[0])

    out = tf.while_loop(lambda t, *_: t < steps, body,
                        (0, ids, state, tf.TensorArray(tf.int32, steps)))[3]
    return {"ids": out.stack()}

  values = [w.numpy().view(np.uint16) if wide(w) else w.numpy() for w in flat]
  states = [np.zeros(s.shape, np.float32) for s in flat_state]
  return decode, specs, states + values


def aligned(array, alignment=64):
  """A copy at a 64-byte boundary: the compiled code's AVX-512 loads of an
  argument assume it (numpy's large arrays sit 16 bytes past a page)."""
  raw = np.empty(array.nbytes + alignment, np.uint8)
  start = -raw.ctypes.data % alignment
  out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
  np.copyto(out, array)
  return out


def run(command, cwd=None):
  subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)


def build(decode, specs, out):
  """The shared library of the compiled loop, and seconds each stage took."""
  runtime = os.path.join(out, "runtime")
  seconds = {}
  if not os.path.exists(os.path.join(runtime, "libtf_xla_runtime.a")):
    start = time.perf_counter()
    os.makedirs(runtime, exist_ok=True)
    run(["cmake", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
         "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=1 -std=c++17 -O2",
         os.path.join(TF_DIR, "xla_aot_runtime_src")], cwd=runtime)
    run(["ninja"], cwd=runtime)
    seconds["runtime_build"] = time.perf_counter() - start
  start = time.perf_counter()
  module = tf.Module()
  module.decode = tf.function(decode, input_signature=specs, autograph=False)
  saved = os.path.join(out, "saved")
  tf.saved_model.save(module, saved, signatures={
      "serving_default": module.decode.get_concrete_function()})
  seconds["save"] = time.perf_counter() - start
  start = time.perf_counter()
  run(["saved_model_cli", "aot_compile_cpu", "--dir", saved,
       "--tag_set", "serve", "--signature_def_key", "serving_default",
       "--output_prefix", os.path.join(out, "decode", "decode"),
       "--cpp_class", "Decode", f"--target_cpu={_TARGET_CPU.value}",
       "--multithreading=True"])
  seconds["aot_compile"] = time.perf_counter() - start
  start = time.perf_counter()
  with open(os.path.join(out, "shim.cc"), "w") as f:
    f.write(SHIM)
  objects = [os.path.join(out, "decode", f"decode{suffix}.o")
             for suffix in ("", "_metadata", "_constants")]
  library = os.path.join(out, "libdecode.so")
  run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
       "-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{TF_DIR}/include", f"-I{out}",
       os.path.join(out, "shim.cc"), *objects,
       os.path.join(runtime, "libtf_xla_runtime.a"),
       # absl comes from TensorFlow's framework library.
       f"-L{TF_DIR}", "-l:libtensorflow_framework.so.2",
       f"-Wl,-rpath,{TF_DIR}", "-lpthread", "-o", library])
  seconds["link"] = time.perf_counter() - start
  return library, seconds


class Compiled:
  """The compiled loop, called through the shim."""

  def __init__(self, library, header, arguments, threads):
    lib = ctypes.CDLL(library)
    lib.handle_new.restype = ctypes.c_void_p
    lib.handle_new.argtypes = [ctypes.c_int]
    lib.handle_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.handle_run.argtypes = [ctypes.c_void_p]
    lib.handle_result.restype = ctypes.c_void_p
    lib.handle_result.argtypes = [ctypes.c_void_p, ctypes.c_int]
    with open(header) as f:
      text = f.read()
    # The header names each argument's index; an argument the program does
    # not read (the state's carried output) has none.
    index = {name: int(i) for name, i in re.findall(
        r"set_arg_feed_(\w+)_data\(const void\* data\) \{\s*"
        r"set_arg_data\((\d+), data\)", text)}
    self._result = int(re.search(
        r"result_fetch_ids_data\(\) \{\s*return static_cast<\w+\*>\(\s*"
        r"result_data\((\d+)\)", text).group(1))
    self._lib, self._handle = lib, lib.handle_new(threads)
    self._arguments = arguments  # Kept alive: the program reads them.
    for i, array in enumerate(arguments):
      name = "ids" if i == 0 else f"args_{i - 1}"
      if name in index:
        lib.handle_set(self._handle, index[name], array.ctypes.data)

  def __call__(self, steps):
    if self._lib.handle_run(self._handle):
      raise RuntimeError("the compiled program failed")
    pointer = ctypes.cast(self._lib.handle_result(self._handle, self._result),
                          ctypes.POINTER(ctypes.c_int32))
    return np.ctypeslib.as_array(pointer, (steps,)).tolist()


def timed(call):
  start = time.perf_counter()
  ids = call()
  return time.perf_counter() - start, ids


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  dtype = _WEIGHTS_DTYPE.value
  model = rnnstep.load(_MODEL.value,
                       weights_dtype=None if dtype == "float32" else dtype)
  steps = _STEPS.value
  decode, specs, values = decode_function(model, steps)
  library, seconds = build(decode, specs, _OUT.value)
  ids = np.array([_PROMPT_ID.value], np.int32)
  arguments = [aligned(a) for a in [ids, *values]]
  header = os.path.join(_OUT.value, "decode", "decode.h")
  compiled = {threads: Compiled(library, header, arguments, threads)
              for threads in (1, 2)}
  jit = tf.function(decode, input_signature=specs, autograph=False,
                    jit_compile=True)
  tensors = [tf.constant(a) for a in [ids, *values]]
  start = time.perf_counter()
  jit_ids = jit(*tensors)["ids"].numpy().tolist()
  seconds["jit_first_call"] = time.perf_counter() - start
  rates = {"aot_1_thread": [], "aot_2_threads": [], "jit": []}
  same = True
  for _ in range(_ROUNDS.value):
    for name, call in (("aot_1_thread", lambda: compiled[1](steps)),
                       ("aot_2_threads", lambda: compiled[2](steps)),
                       ("jit", lambda: jit(*tensors)["ids"].numpy().tolist())):
      elapsed, got = timed(call)
      same &= got == jit_ids
      rates[name].append(steps / elapsed)
  print(json.dumps({
      "machine": os.uname().machine, "weights_dtype": dtype, "steps": steps,
      "tokens_per_s": {k: round(statistics.median(v), 1)
                       for k, v in rates.items()},
      "ranges": {k: [round(min(v), 1), round(max(v), 1)]
                 for k, v in rates.items()},
      "same_ids": same, "seconds": {k: round(v, 1) for k, v in seconds.items()},
      "library_bytes": os.path.getsize(library)}))
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
