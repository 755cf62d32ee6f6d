"""RWKV-7 at the 0.1B shape: rnnstep against its weight-reading floor and
KerasHub's own generate, paired, in one run (issue #50).

    python tools/bench_rwkv7.py --keras_hub_python=/work/venv-rwkv/bin/python
    python tools/bench_rwkv7.py --variants=rnnstep,floor --batches=1 --rounds=5
    python tools/bench_rwkv7.py --variants= --processes=rnnstep,keras_hub

The model is the 0.1B shape (12 blocks, 768 wide, 12 heads of 64,
feed-forward 3,072, LoRAs 64/64/32/128, 65,536 ids) with seeded random
weights; each call primes a 100-token prompt and generates 200 tokens
greedily (no stop token: every call runs all 200 steps).

In-process variants (--variants), each warmed up by one call a batch size
(its first call, which traces or compiles, is reported apart):
  - rnnstep: `rnnstep.generate` on the default path (rnnstep:graph,
    rnnstep:xla, rnnstep:elementwise pick a path);
  - rnnstep_prime: the same call generating 1 token (the prefill), so
    that rnnstep - rnnstep_prime is the decode steps' cost alone (the
    table's "decode" column);
  - either with "@int8" (or @float16, @bfloat16): the same model loaded
    with that weights_dtype (`rnnstep.load(..., weights_dtype=)`);
  - floor: a graph `tf.while_loop` that does only one token's products of
    the same weights a step (per block R, K, V, O, the four LoRAs' eight,
    the feed-forward's two, then the head): the bytes a token must read;
    floor_xla: the same loop compiled by XLA (minutes to compile);
  - floor with fewer bytes a weight (issue #62: which runtime multiplies by
    int8 or 16-bit weights converting them in registers?), the same
    products of the same matrices:
    floor_int8_xla: int8 per output channel, `x @ cast(w, f32) * scale`
      under XLA; floor_int8_reduce_xla: the same product written as
      multiply-and-reduce (`sum(x * cast(w), axis)`, which XLA fuses, so
      it reads int8); floor_bf16_xla: bfloat16 weights, bf16 x bf16 products
      under XLA; floor_bf16: the same in a graph (oneDNN's bf16 matmul);
    floor_litert, floor_litert_int8, floor_litert_f16: one token's
      products as a LiteRT flatbuffer (the weights its constants), invoked
      once a step, with float32 weights, dynamic-range int8 weights
      (`Optimize.DEFAULT`) and float16 weights (`supported_types`), run by
      XNNPACK; the interpreter's resident memory after its first call is
      printed (float16 weights kept as float16 add half of float32's);
    int8 x int8 products (the activations rounded per row to int8 too,
      exact int32 sums, then scaled): floor_int8_matmul
      (`tf.linalg.matmul(int8, int8, output_type=tf.int32)`, graph),
      floor_int8_matmul_xla (the same under XLA), floor_int8_onednn
      (oneDNN's `QuantizedMatMulWithBias`, u8 x s8, the weights constants
      of the loop's body) and its baseline floor_const (float32, the
      weights constants of the body too); floor_int8_xnnpack_onednn: the
      same oneDNN sums in LiteRT/XNNPACK's dynamic-range arithmetic
      (activations asymmetric per row), which gives XNNPACK's results bit
      for bit;
  - keras_hub, keras_hub_jit: `RWKV7CausalLM.generate` (greedy sampler,
    no stop token) as it runs by default and with jit_compile=True, whole
    call including the prefill, each in a worker process of the keras-hub
    venv (--keras_hub_python) that keeps its model between rounds.

Whole processes (--processes), timed from outside, each round one fresh
process: rnnstep (`rnnstep-generate` on a model file of the same weights,
--nocache) and keras_hub (a fresh script: build the model, generate once).

Rounds are interleaved (A B C A B C ..., the order rotated each round, so
every variant meets the same load), and each figure is the median over
--rounds in ms per generated step (the prefill included, divided over the
steps); the ratios are taken within the run. Prints the machine and the
load before and after, and a Markdown table (--markdown=FILE writes it).

llama.cpp as a peer (issue #62), instead of the runs above:

    python tools/bench_rwkv7.py --llama_cpp_dir=/work/llama_src/llama.cpp \
        --convert_python=/work/llama_src/venv/bin/python --rounds=7
    python tools/bench_rwkv7.py --llama_cpp_dir=... --convert_python=... \
        --gguf_types=F32,F16,Q8_0,Q4_0 \
        --rnnstep_weights_dtypes=float32,float16,int8
    python tools/bench_rwkv7.py --llama_cpp_dir=... --convert_python=... \
        --gguf_dir=/tmp/ggufs --rounds=0   # only build, check and keep them
                                           # (tools/bench/int8_litert.py
                                           # bench --gguf pairs them with
                                           # the LiteRT exports)

--llama_cpp_dir is a llama.cpp tree built apart (nothing of it is part of
rnnstep), e.g. the llama-cpp-python source package's `vendor/llama.cpp`:

    pip download llama-cpp-python --no-deps --no-binary :all: -d SRC
    (unpack; if vendor/llama.cpp holds a `.git` file pointing outside the
    package, move it away, or CMake re-runs forever)
    cmake -S vendor/llama.cpp -B vendor/llama.cpp/build -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    ninja -C vendor/llama.cpp/build llama-bench llama-quantize llama-simple \
        llama-debug

(On a 2-vCPU Intel Xeon VM with AMX, `-DGGML_NATIVE=ON` compiled llama.cpp's
AMX kernels and its Q8_0 prefill died of SIGILL; `-DGGML_NATIVE=OFF
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
-DGGML_AVX512_BF16=ON` ran: benchmarks/results/serve-rwkv7-lanes-xeon-amx-2026-12.md.)

--convert_python is a Python with torch, transformers, numpy and the `rwkv`
package (llama.cpp's `convert_hf_to_gguf.py` and the official reference run
there). The same seeded weights go rnnstep -> an official `.pth` -> fla's
Hugging Face layout -> GGUF (`tools/bench/llama_cpp.py`); F32 is first
checked against the official reference (the `rwkv` package's RWKV_x070 on
the `.pth`, --check_steps greedy tokens: llama.cpp's greedy text and its
logits after the prompt; rnnstep's greedy ids and logits on the same
`.pth`), and nothing is timed if they disagree. Then --rounds rounds, the
order rotated each round, each run `llama-bench -t 2 -p 512 -n 128
-r 3` on each --gguf_types GGUF (kept in --gguf_dir where given) and,
for each --rnnstep_weights_dtypes (`rnnstep.load(...,
weights_dtype=...)`; a dtype the installed rnnstep
refuses is skipped, with the reason), rnnstep's default path after a
warm-up call of each shape: decode (tg128's equivalent) is a 128-token
greedy call less the 1-token call of the same 16-token prompt, over 127
steps; prefill (pp512's) a 512-token prompt's 1-token call. The table
gives bytes read a token, tokens/s medians with their range over the
rounds (a llama.cpp round's figure: the median of llama-bench's 3
repetitions), and each one's ratio to rnnstep float32's, paired by round.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAPE = dict(units=768, blocks=12, head_size=64, ffn=3072, decay_lora=64,
             a_lora=64, v_lora=32, gate_lora=128, vocab=65536)
PROMPT, STEPS = 100, 200
VARIANTS = ("rnnstep", "rnnstep_prime", "floor", "keras_hub", "keras_hub_jit")
PROCESSES = ("rnnstep", "keras_hub")


def machine_line() -> str:
  """The CPU's name, its count, the load and the time: each table's first
  line."""
  with open("/proc/cpuinfo") as f:
    cpu = next((l.split(":", 1)[1].strip() for l in f
                if l.startswith("model name")), "?")
  return (f"machine: {cpu}, {os.cpu_count()} CPUs; load at start "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def random_model(dtype="float32", weights_dtype="float32"):
  """The 0.1B-shaped rnnstep model, seeded random weights (rounded to
  `weights_dtype`)."""
  from rnnstep.model import network
  config, vocab, tensors, tokens = _random_parts()
  return network.Model(config, vocab, tensors, dtype, tokens=tokens,
                       weights_dtype=weights_dtype)


_PARTS = []


def _random_parts():
  """(config, vocab, tensors, tokens) of the random model (made once)."""
  if _PARTS:
    return _PARTS[0]
  from rnnstep.model import kinds, model_file, vocabulary
  sizes = {k: SHAPE[k] for k in kinds.RWKV7_SIZES}
  layer = model_file.LayerConfig("rwkv7", SHAPE["units"],
                                 sizes=tuple(sizes.items()))
  config = model_file.ModelConfig(SHAPE["units"], (layer,))
  rng = np.random.default_rng(0)
  tensors = {}
  for key, shape in config.expected_shapes(SHAPE["vocab"]).items():
    scale = 1 / np.sqrt(shape[-2]) if len(shape) >= 2 else 0.5
    tensors[key] = (rng.standard_normal(shape, np.float32) * scale)
  layer0 = tensors["layer0_ln"]
  layer0[:, 0] = layer0[:, 2] = 1  # LayerNorm gammas.
  # RWKV-7 has no head bias: the official checkpoint the llama.cpp peer is
  # converted from could not hold one.
  tensors["dense_bias"][:] = 0
  vocab = [vocabulary.world_entry(bytes([i]) if i < 256 else
                                  f"t{i}".encode(), i)
           for i in range(SHAPE["vocab"])]
  tokens = vocabulary.Tokens("world", vocab)
  _PARTS.append((config, vocab, tensors, tokens))
  return _PARTS[0]


def prompts(model, batch):
  """`batch` prompts of PROMPT tokens each (one letter a token)."""
  rng = np.random.default_rng(1)
  texts = [bytes(rng.integers(97, 123, PROMPT).astype(np.uint8)).decode()
           for _ in range(batch)]
  assert all(len(model.encode(p)) == PROMPT for p in texts)
  return texts


FLOOR_NAMES = ("receptance", "key", "value", "output", "w1", "w2", "a1",
               "a2", "v1", "v2", "g1", "g2", "ffn_key", "ffn_value")
# The floor's variants of fewer bytes a weight (the module docstring):
# name -> (runtime, weights).
FLOOR_VARIANTS = {
    "floor": ("graph", "float32"), "floor_xla": ("xla", "float32"),
    "floor_int8_xla": ("xla", "int8"),
    "floor_int8_reduce_xla": ("xla", "int8_reduce"),
    "floor_bf16_xla": ("xla", "bfloat16"),
    "floor_bf16": ("graph", "bfloat16"),
    "floor_litert": ("litert", "float32"),
    "floor_litert_int8": ("litert", "int8"),
    "floor_litert_f16": ("litert", "float16"),
    "floor_const": ("graph", "float32_const"),
    "floor_int8_matmul": ("graph", "int8_matmul"),
    "floor_int8_matmul_xla": ("xla", "int8_matmul"),
    "floor_int8_onednn": ("graph", "int8_onednn"),
    "floor_int8_xnnpack_onednn": ("graph", "int8_xnnpack_onednn")}


def _floor_token(model, weights):
  """One token's products (`Floor`) as a function of x `[B, C]`, with the
  big matrices (not the LoRAs) stored in `weights`: float32, int8 (per
  output channel, float32 scales; int8_reduce: as multiply-and-reduce),
  bfloat16 (bf16 x bf16, float32 out); float32_const: float32 as constants
  of the loop's body (not captured tensors), the baseline of int8_onednn;
  int8 x int8 (`tools/bench/int8_products.py`: the activations per row to
  int8 too, exact int32 sums, then scaled): int8_matmul as
  `tf.linalg.matmul(..., output_type=tf.int32)`, int8_onednn as oneDNN's
  `QuantizedMatMulWithBias` (u8 x s8), the weights constants of the body,
  which oneDNN needs to reorder them once."""
  import tensorflow as tf
  from tools.bench import int8_products
  # The file's [in, out] layout (the model holds the big six [out, in]:
  # `Kind.held_transposed`), as every floor figure before 0.22.0 read it.
  tensors = model.tensors()
  w = {name: tensors[f"layer0_{name}"] for name in FLOOR_NAMES}
  big = {"receptance", "key", "value", "output", "ffn_key", "ffn_value"}

  def product(array, large):
    """(x -> x @ array) for one matrix, the weights stored as `weights`."""
    array = np.asarray(array, np.float32)
    if large and weights == "int8_matmul":
      return int8_products.int8_product(array, "s8s8")
    if large and weights == "int8_onednn":
      return int8_products.int8_product(array, "onednn_u8s8",
                                        const_in_body=True)
    if large and weights == "int8_xnnpack_onednn":
      return int8_products.xnnpack_int8_product(array)
    if weights == "float32_const":
      return lambda x: tf.matmul(x, tf.constant(array))
    if not large or weights in ("float32", "float16"):
      # float16: LiteRT's converter stores the constants as float16.
      kernel = tf.constant(array)
      return lambda x: tf.matmul(x, kernel)
    if weights.startswith("int8"):
      scale = np.abs(array).max(0) / 127
      q = np.round(array / scale).astype(np.int8)
      scale = tf.constant(scale.astype(np.float32))
      if weights == "int8_reduce":  # [out, in]: the reduction's axis minor.
        kernel = tf.constant(q.T.copy())
        return lambda x: tf.reduce_sum(
            x[:, None, :] * tf.cast(kernel, tf.float32), -1) * scale
      kernel = tf.constant(q)
      return lambda x: tf.matmul(x, tf.cast(kernel, tf.float32)) * scale
    kernel = tf.constant(array, tf.bfloat16)
    return lambda x: tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), kernel),
                             tf.float32)

  # Per block, sliced once outside the loop (as rnnstep's cell does).
  mats = [[product(m, n in big) for m in w[n]] for n in FLOOR_NAMES]
  head = product(model.dense_kernel.numpy(), True)
  c = SHAPE["units"]

  def token(x):
    acc = x
    for i in range(SHAPE["blocks"]):
      r, k, v, o, w1, w2, a1, a2, v1, v2, g1, g2, fk, fv = (
          m[i] for m in mats)
      y = (r(acc) + k(acc) + v(acc) + w2(w1(acc)) + a2(a1(acc))
           + v2(v1(acc)) + g2(g1(acc)))
      acc = o(y * 1e-3)
      acc = fv(fk(acc) * 1e-3)
    return x + head(acc)[:, :c] * 1e-9
  return token


class Floor:
  """The matmul-only loop (see the module docstring), graph or XLA, with
  float32, int8 or bfloat16 weights (`FLOOR_VARIANTS`)."""

  def __init__(self, model, xla, weights="float32"):
    import tensorflow as tf
    token = _floor_token(model, weights)

    def loop(x):
      return tf.while_loop(lambda t, x: t < STEPS,
                           lambda t, x: (t + 1, token(x)), (0, x))[1]

    self.fn = tf.function(loop, jit_compile=xla, autograph=False)
    self.tf = tf

  def run(self, batch):
    self.fn(self.tf.ones([batch, SHAPE["units"]]) * 0.1).numpy()


class FloorLiteRT:
  """The floor's token as a LiteRT flatbuffer (weights constants), one
  interpreter call a step; `weights`: float32, int8 (dynamic range) or
  float16, as the converter stores them."""

  def __init__(self, model, weights):
    import tensorflow as tf
    from ai_edge_litert import interpreter as litert
    token = tf.function(
        _floor_token(model, "float32"), autograph=False,
        input_signature=[tf.TensorSpec([None, SHAPE["units"]], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [token.get_concrete_function()], token)
    if weights != "float32":
      converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if weights == "float16":
      converter.target_spec.supported_types = [tf.float16]
    flatbuffer = converter.convert()
    before = _resident_bytes()
    self.interpreter = litert.Interpreter(model_content=flatbuffer,
                                          num_threads=os.cpu_count())
    self.batch = None
    self.run(1)
    print(f"  LiteRT {weights}: flatbuffer {len(flatbuffer) / 1e6:.0f} MB, "
          f"interpreter +{(_resident_bytes() - before) / 1e6:.0f} MB resident "
          "after its first call", flush=True)

  def run(self, batch):
    it = self.interpreter
    inp, out = (it.get_input_details()[0]["index"],
                it.get_output_details()[0]["index"])
    if batch != self.batch:
      it.resize_tensor_input(inp, [batch, SHAPE["units"]])
      it.allocate_tensors()
      self.batch = batch
    x = np.full([batch, SHAPE["units"]], 0.1, np.float32)
    for _ in range(STEPS):
      it.set_tensor(inp, x)
      it.invoke()
      x = it.get_tensor(out)


def _resident_bytes():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Rnnstep:
  """`rnnstep.generate` on a path (None: the default); `steps` 1: the
  priming and one step alone (the `rnnstep_prime` variant)."""

  def __init__(self, model, path, steps=None):
    self.model, self.path, self.steps = model, path, steps

  def run(self, batch):
    import rnnstep
    rnnstep.generate(self.model, prompts(self.model, batch),
                     self.steps or STEPS, seed=1, temperature=0.0,
                     jit_compile=self.path)


KERAS_HUB_SCRIPT = textwrap.dedent("""
  import json, os, sys, time
  os.environ["KERAS_BACKEND"] = "tensorflow"
  import numpy as np, keras, keras_hub
  shape, jit, prompt, steps, once = json.loads(sys.argv[1])
  backbone = keras_hub.models.RWKV7Backbone(
      hidden_size=shape["units"], head_size=shape["head_size"],
      num_layers=shape["blocks"], vocabulary_size=shape["vocab"],
      intermediate_dim=shape["ffn"], gate_lora=shape["gate_lora"],
      mv_lora=shape["v_lora"], aaa_lora=shape["a_lora"],
      decay_lora=shape["decay_lora"])
  lm = keras_hub.models.RWKV7CausalLM(backbone, None)
  lm.compile(sampler="greedy", jit_compile=jit)

  def run(batch):
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 256, (batch, prompt)).astype("int32")
    inputs = {"token_ids": ids[:, :-1],
              "input_padding_mask": np.ones_like(ids[:, :-1], bool),
              "predict_token_ids": np.concatenate(
                  [ids[:, -1:], np.zeros((batch, steps), "int32")], 1),
              "padding_mask": np.concatenate(
                  [np.ones((batch, 1), bool),
                   np.zeros((batch, steps), bool)], 1)}
    start = time.perf_counter()
    lm.generate(inputs, stop_token_ids=None)
    return time.perf_counter() - start

  if once:
    run(once)
  else:
    print("ready", flush=True)
    for line in sys.stdin:
      print(json.dumps(run(int(line))), flush=True)
""")


class KerasHub:
  """A worker process of the keras-hub venv holding one RWKV7CausalLM."""

  def __init__(self, python, jit):
    self.proc = subprocess.Popen(
        [python, "-c", KERAS_HUB_SCRIPT,
         json.dumps([SHAPE, jit, PROMPT, STEPS, 0])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if self.proc.stdout.readline().strip() != "ready":
      raise RuntimeError(f"the KerasHub worker (jit_compile={jit}) failed")

  def run(self, batch):
    self.proc.stdin.write(f"{batch}\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError("the KerasHub worker died")
    return json.loads(line)

  def close(self):
    self.proc.stdin.close()
    self.proc.wait()


def timed(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def process_commands(args, model, model_path, batch):
  """{name: argv} of the fresh processes."""
  commands = {
      "rnnstep": [sys.executable, "-m", "rnnstep.cli.generate",
                  f"--weights={model_path}", f"--num_steps={STEPS}",
                  "--seed=1", "--temperature=0", "--nocache"]
                 + [f"--prompt={p}" for p in prompts(model, batch)],
      "keras_hub": [args.keras_hub_python, "-c", KERAS_HUB_SCRIPT,
                    json.dumps([SHAPE, "auto", PROMPT, STEPS, batch])]}
  return commands


def load():
  return os.getloadavg()[0]


# The llama.cpp comparison (see the module docstring).
DECODE_PROMPT, DECODE_STEPS, PREFILL_PROMPT = 16, 128, 512


class ConversionMismatch(Exception):
  """llama.cpp's or rnnstep's F32 does not match the official reference."""


def letters(count, seed):
  """A prompt of `count` lowercase letters (a token each in the random
  model's vocabulary)."""
  rng = np.random.default_rng(seed)
  return bytes(rng.integers(97, 123, count).astype(np.uint8)).decode()


class RnnstepPeer:
  """rnnstep's default path on the random model's file, loaded with a
  `weights_dtype` (float32: the plain load): tg128's and pp512's
  equivalents (see the module docstring)."""

  def __init__(self, path, weights_dtype):
    import rnnstep
    self.rnnstep = rnnstep
    if weights_dtype == "float32":
      self.model = rnnstep.load(path)
    else:
      self.model = rnnstep.load(path, weights_dtype=weights_dtype)
    self.decode_prompt = [letters(DECODE_PROMPT, 1)]
    self.prefill_prompt = [letters(PREFILL_PROMPT, 2)]

  def bytes_a_token(self):
    """Every weight's bytes but the embedding's and the input table's (the
    embedding with layer 0's input side folded in), of which a step reads
    one row."""
    size = lambda v: v.shape.num_elements() * v.dtype.size
    tables = [self.model.embedding, self.model.input_table]
    return (sum(size(v) for v in self.model.variables)
            - sum(size(t) for t in tables)
            + size(tables[-1]) // tables[-1].shape[0])

  def call(self, prompts, steps):
    return timed(lambda: self.rnnstep.generate(
        self.model, prompts, steps, seed=1, temperature=0.0))

  def run(self):
    """{"tg": decode tokens/s, "pp": prefill tokens/s} of one round."""
    many = self.call(self.decode_prompt, DECODE_STEPS)
    one = self.call(self.decode_prompt, 1)
    prefill = self.call(self.prefill_prompt, 1)
    return {"tg": (DECODE_STEPS - 1) / max(many - one, 1e-9),
            "pp": PREFILL_PROMPT / prefill}


def compare_llama_cpp(args):
  """llama.cpp's llama-bench against rnnstep on the same weights."""
  from rnnstep.model import model_file
  from tests.support import torch_files
  from tools.bench import llama_cpp
  llama = llama_cpp.LlamaCpp(args.llama_cpp_dir, args.convert_python)
  lines = []
  say = lambda text: (print(text, flush=True), lines.append(text))
  say(machine_line())
  vocab_path = args.world_vocab or subprocess.run(
      [args.convert_python, "-c", "import os, rwkv; print(os.path.join("
       "os.path.dirname(rwkv.__file__), 'rwkv_vocab_v20230424.txt'))"],
      check=True, capture_output=True, text=True).stdout.strip()
  if not os.path.isfile(vocab_path):
    raise FileNotFoundError(f"--world_vocab: no such file {vocab_path}")
  gguf_kinds = [k for k in args.gguf_types.split(",") if k]
  tmp = tempfile.mkdtemp(prefix="bench_rwkv7_llama_")
  try:
    config, vocab, tensors, tokens = _random_parts()
    model_path = os.path.join(tmp, "rwkv7-0.1b-random.npz")
    model_file.write(model_path, config, vocab, tensors, tokens)
    official = llama_cpp.official_state_dict(config, tensors)
    pth = os.path.join(tmp, "rwkv7-0.1b-random.pth")
    torch_files.write_state_dict(pth, official)
    hf = os.path.join(tmp, "hf")
    llama_cpp.write_hf_folder(hf, official, vocab_path)
    start = time.perf_counter()
    # --gguf_dir keeps them (for tools/bench/int8_litert.py bench --gguf).
    ggufs = llama.build_ggufs(hf, gguf_kinds, args.gguf_dir or tmp)
    say(f"GGUFs {', '.join(gguf_kinds)} built in "
        f"{time.perf_counter() - start:.0f} s (load {load():.1f})")

    say(f"check against the official reference ({args.check_steps} greedy "
        "tokens):")
    prompt = "The quick brown fox jumps over the lazy dog. In a hole"
    reference = llama_cpp.official_reference(
        args.convert_python, pth, vocab_path, prompt, args.check_steps)
    ok = llama_cpp.check_conversion(llama, ggufs["F32"], reference, prompt,
                                    say)
    import rnnstep
    ok &= llama_cpp.check_rnnstep(rnnstep.load(pth, vocab=vocab_path),
                                  reference, say)
    if not ok:
      raise ConversionMismatch("the conversion does not match the official "
                               "reference (above); nothing timed")

    vocab_size = SHAPE["vocab"]
    runners, sizes = {}, {}
    for kind in gguf_kinds:
      name = f"llama.cpp {kind}"
      runners[name] = (lambda path: lambda: llama.bench(
          path, args.threads, PREFILL_PROMPT, DECODE_STEPS, 3))(ggufs[kind])
      sizes[name] = llama_cpp.bytes_a_token(llama.tensor_bytes(ggufs[kind]),
                                            vocab_size)
    for dtype in (d for d in args.rnnstep_weights_dtypes.split(",") if d):
      name = f"rnnstep {dtype}"
      try:
        peer = RnnstepPeer(model_path, dtype)
      except (TypeError, ValueError) as e:  # rnnstep's ArgumentError too.
        say(f"  {name}: skipped, the installed rnnstep refuses it ({e})")
        continue
      first = peer.run()  # Traces or compiles each shape.
      # The calls ran on the graph path while XLA compiled in the
      # background; the rounds time the default path itself.
      from rnnstep.engine import compiling  # pylint: disable=g-import-not-at-top
      compiling.wait_idle(timeout=None)
      say(f"  {name}: warm-up round {first['tg']:.1f} tokens/s decode "
          f"(load {load():.1f})")
      runners[name], sizes[name] = peer.run, peer.bytes_a_token()

    names = list(runners)
    results = {name: [] for name in names}  # [{"tg": t/s, "pp": t/s}]
    loads = []
    try:
      for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
          got = runners[name]()
          # llama-bench's median of its 3 repetitions (rnnstep's one figure).
          got = {k: statistics.median(v) if isinstance(v, list) else v
                 for k, v in got.items()}
          results[name].append(got)
          loads.append(load())
          say(f"  round {r} {name}: decode {got['tg']:.1f}, prefill "
              f"{got['pp']:.0f} tokens/s (load {load():.1f})")
    except KeyboardInterrupt:  # A long run cut short keeps its rounds.
      say(f"  stopped in round {r}: the table holds the rounds done")
  finally:
    shutil.rmtree(tmp, ignore_errors=True)

  say(f"load at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
      f"during the rounds {min(loads, default=0):.1f}-"
      f"{max(loads, default=0):.1f}")
  say("")
  say(f"| engine, weights | bytes read a token | decode (tg{DECODE_STEPS}), "
      f"tokens/s | prefill (pp{PREFILL_PROMPT}), tokens/s | decode vs "
      "rnnstep float32 | prefill vs rnnstep float32 |")
  say("|---|---|---|---|---|---|")
  base = results.get("rnnstep float32")
  for name in (n for n in names if results[n]):
    cells = []
    for key in ("tg", "pp"):
      values = [round_[key] for round_ in results[name]]
      cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-"
                   f"{max(values):.1f})")
    for key in ("tg", "pp"):
      # Paired: each round's ratio to rnnstep float32's in the same round.
      ratios = [a[key] / b[key] for a, b in zip(results[name], base or [])]
      cells.append(f"{statistics.median(ratios):.2f}x" if ratios else "")
    say(f"| {name} | {sizes[name] / 1e6:.0f} MB | " + " | ".join(cells) + " |")
  if args.markdown:
    pathlib.Path(args.markdown).write_text("\n".join(lines) + "\n")


def main():
  global STEPS
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default=",".join(VARIANTS),
                      help="comma list of in-process variants: rnnstep "
                      "(or rnnstep:graph, rnnstep:xla, rnnstep:elementwise), "
                      "rnnstep_prime, each of them @int8 (@float16, "
                      "@bfloat16: the model with that weights_dtype), "
                      "floor, floor_xla, floor_int8_xla, "
                      "floor_int8_reduce_xla, floor_bf16_xla, "
                      "floor_bf16, floor_litert, floor_litert_int8, "
                      "floor_litert_f16, floor_const, floor_int8_matmul, "
                      "floor_int8_matmul_xla, floor_int8_onednn, "
                      "floor_int8_xnnpack_onednn, keras_hub, keras_hub_jit")
  parser.add_argument("--processes", default=",".join(PROCESSES),
                      help="comma list of whole-process variants: rnnstep, "
                      "keras_hub (empty: none)")
  parser.add_argument("--batches", default="1,16")
  parser.add_argument("--process_batches", default="1",
                      help="batch sizes of the whole-process runs")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--process_rounds", type=int, default=1)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--keras_hub_python", default="",
                      help="python of a venv with keras-hub >= 0.26 "
                      "(needed by the keras_hub variants)")
  parser.add_argument("--steps", type=int, default=200,
                      help="tokens generated a call")
  parser.add_argument("--markdown", default="",
                      help="also write the table to this file")
  parser.add_argument("--llama_cpp_dir", default="",
                      help="a llama.cpp tree built apart: run the llama.cpp "
                      "comparison instead (see the docstring)")
  parser.add_argument("--convert_python", default="",
                      help="a Python with torch, transformers and the rwkv "
                      "package (llama.cpp's converter, the reference)")
  parser.add_argument("--world_vocab", default="",
                      help="rwkv_vocab_v20230424.txt (default: the rwkv "
                      "package's, found by --convert_python)")
  parser.add_argument("--gguf_dir", default="",
                      help="keep the GGUFs (checked, before the rounds) in "
                      "this existing folder (--rounds=0: only build and "
                      "check them)")
  parser.add_argument("--gguf_types", default="F32,F16,Q8_0",
                      help="F32, F16 (converted) and llama-quantize types")
  parser.add_argument("--rnnstep_weights_dtypes", default="float32",
                      help="rnnstep.load's weights_dtype of each rnnstep "
                      "variant (float32: the default load)")
  parser.add_argument("--check_steps", type=int, default=40,
                      help="greedy tokens the conversion check compares")
  parser.add_argument("--threads", type=int, default=2,
                      help="llama-bench's -t")
  args = parser.parse_args()
  STEPS = args.steps
  sys.path.insert(0, str(ROOT))
  if args.llama_cpp_dir:
    if not args.convert_python:
      parser.error("--llama_cpp_dir needs --convert_python (a Python with "
                   "torch, transformers and the rwkv package)")
    try:
      compare_llama_cpp(args)
    except (FileNotFoundError, ConversionMismatch, RuntimeError) as e:
      sys.exit(f"bench_rwkv7: {e}")  # llama_cpp.CommandFailed included.
    return
  variants = [v for v in args.variants.split(",") if v]
  processes = [p for p in args.processes.split(",") if p]
  if any(v.startswith("keras_hub") for v in variants + processes) and (
      not args.keras_hub_python):
    parser.error("--keras_hub_python is needed for the keras_hub variants")
  batches = [int(b) for b in args.batches.split(",") if b]
  lines = []
  say = lambda text: (print(text, flush=True), lines.append(text))
  say(machine_line())
  model = random_model(args.dtype)
  say(f"model: 0.1B shape, {model.num_parameters:,} parameters, "
      f"{args.dtype}; prompt {PROMPT} tokens, {STEPS} generated")

  runners = {}
  reduced = {}  # weights dtype -> the model rounded to it.
  for name in variants:
    base, _, weights_dtype = name.partition("@")
    if weights_dtype:
      if weights_dtype not in reduced:
        reduced[weights_dtype] = random_model(args.dtype, weights_dtype)
      on = reduced[weights_dtype]
    else:
      on = model
    if base == "rnnstep_prime":
      runners[name] = Rnnstep(on, None, steps=1)
    elif base.startswith("rnnstep"):
      path = {"rnnstep": None, "rnnstep:graph": False, "rnnstep:xla": True,
              "rnnstep:elementwise": "elementwise"}[base]
      runners[name] = Rnnstep(on, path)
    elif name in FLOOR_VARIANTS:
      runtime, weights = FLOOR_VARIANTS[name]
      runners[name] = (FloorLiteRT(model, weights) if runtime == "litert"
                       else Floor(model, runtime == "xla", weights))
    elif name in ("keras_hub", "keras_hub_jit"):
      runners[name] = KerasHub(args.keras_hub_python,
                               True if name == "keras_hub_jit" else "auto")
    else:
      parser.error(f"--variants: unknown variant {name!r}")

  def run(name, batch):
    runner = runners[name]
    if isinstance(runner, KerasHub):
      return runner.run(batch)
    return timed(lambda: runner.run(batch))

  results = {}  # (batch, name) -> (first s, [s per round], loads)
  try:
    for batch in batches:
      for name in variants:
        first = run(name, batch)
        say(f"  batch {batch} {name}: first call {first:.1f} s "
            f"(load {load():.1f})")
        results[batch, name] = (first, [], [])
      for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name in order:
          seconds = run(name, batch)
          results[batch, name][1].append(seconds)
          results[batch, name][2].append(load())
          say(f"  batch {batch} round {r} {name}: "
              f"{seconds / STEPS * 1e3:.1f} ms/step (load {load():.1f})")
  finally:
    for runner in runners.values():
      if isinstance(runner, KerasHub):
        runner.close()

  process_results = {}
  if processes:
    tmp = tempfile.mkdtemp(prefix="bench_rwkv7_")
    try:
      from rnnstep.model import model_file
      model_path = os.path.join(tmp, "rwkv7-0.1b-random.npz")
      config, vocab, tensors, tokens = _random_parts()
      model_file.write(model_path, config, vocab, tensors, tokens)
      env = dict(os.environ, PYTHONPATH=str(ROOT))
      for batch in (int(b) for b in args.process_batches.split(",") if b):
        commands = process_commands(args, model, model_path, batch)
        for r in range(args.process_rounds):
          order = processes[r % len(processes):] + processes[
              :r % len(processes)]
          for name in order:
            seconds = timed(lambda: subprocess.run(
                commands[name], env=env, check=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            process_results.setdefault((batch, name), []).append(
                (seconds, load()))
            say(f"  process batch {batch} round {r} {name}: {seconds:.1f} s"
                f" (load {load():.1f})")
    finally:
      shutil.rmtree(tmp, ignore_errors=True)

  say(f"load at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
  say("")
  say("| batch | variant | ms/step (median) | rounds | x floor | "
      "rnnstep faster by | tokens/s | first call s | load (rounds) |")
  say("|---|---|---|---|---|---|---|---|---|")
  for batch in batches:
    medians = {name: statistics.median(results[batch, name][1]) / STEPS * 1e3
               for name in variants if results[batch, name][1]}
    # The float32 floor: what the other variants' "x floor" is against.
    floor = min((medians[n] for n in ("floor", "floor_xla") if n in medians),
                default=None)
    ours = medians.get("rnnstep")
    for name in variants:
      first, times, loads = results[batch, name]
      ms = medians.get(name)
      if ms is None:
        continue
      rounds = " ".join(f"{t / STEPS * 1e3:.0f}" for t in times)
      vs_floor = f"{ms / floor:.2f}" if floor else ""
      faster = (f"{ms / ours:.2f}x" if ours and name.startswith("keras_hub")
                else "")
      say(f"| {batch} | {name} | {ms:.1f} | {rounds} | {vs_floor} | "
          f"{faster} | {batch * 1e3 / ms:.1f} | {first:.1f} | "
          f"{min(loads):.1f}-{max(loads):.1f} |")
    for suffix in [""] + [f"@{d}" for d in reduced]:
      whole, prime = "rnnstep" + suffix, "rnnstep_prime" + suffix
      if whole not in medians or prime not in medians:
        continue
      # Per round (paired): the decode steps alone, the prefill taken out.
      decode = [(a - b) / (STEPS - 1) * 1e3 for a, b in zip(
          results[batch, whole][1], results[batch, prime][1])]
      ms = statistics.median(decode)
      vs_floor = f"{ms / floor:.2f}" if floor else ""
      say(f"| {batch} | {whole} decode ({whole} - {prime}) | {ms:.1f}"
          f" | {' '.join(f'{d:.0f}' for d in decode)} | {vs_floor} | | "
          f"{batch * 1e3 / ms:.1f} | | |")
  if process_results:
    say("")
    say("| batch | whole process | s (median) | rounds | load |")
    say("|---|---|---|---|---|")
    for (batch, name), runs in process_results.items():
      seconds = [s for s, _ in runs]
      say(f"| {batch} | {name} | {statistics.median(seconds):.1f} | "
          f"{' '.join(f'{s:.0f}' for s in seconds)} | "
          f"{min(l for _, l in runs):.1f}-{max(l for _, l in runs):.1f} |")
  if args.markdown:
    pathlib.Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
