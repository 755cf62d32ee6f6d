"""The web export in headless Chromium: characters/s at batch 1, against TF.js.

USAGE (from the repo root):
  python tools/bench/web.py                      # 300 chars, 3 rounds
  python tools/bench/web.py --num_chars=500 --rounds=5 --backends=cpu,webgl
  python tools/bench/web.py --sections=agreement,dtype   # the text checks

Sections (--sections, default all three):
  speed      characters/s, as below;
  agreement  the page's texts against `rnnstep.generate`'s (each alone, graph
             path) over `--cases` (prompt, options, seed) cases of
             --num_chars characters on the bundled model: how many are
             identical, and where the others part (a near-tie);
  dtype      whether weights stored as float16 would keep the text: the
             library's texts with every tensor rounded through float16
             against float32's (10 prompts, greedy and seeded).

For each model it exports the page (`rnnstep.export(..., format="web")`),
appends a timing script to the exported index.html and reads the figures
back through `chromium --dump-dom` (the test's way):

  - the bundled model (GRU 768 over 65 characters);
  - random LSTMs of 768 and 128 units (embedding 256 / 64, 65 characters),
    each also run as the TF.js baseline: a `tf.sequential` of Embedding ->
    stateful LSTM -> Dense built in the page, `model.predict` on one id per
    character (the TF.js tutorial's loop, the only one TF.js offers a Keras
    model), the next id drawn in JS from `dataSync()`'s logits, on each of
    `--backends` (TF.js's own CPU backend; webgl where the browser has one).

Both sides warm up (20 characters), then time `--num_chars` characters per
round; the table shows the median round. TF.js comes from npm
(`@tensorflow/tfjs`, installed into tools/bench/web_js/, git-ignored) and is
loaded by a classic <script src> from disk; the rnnstep page needs nothing.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import html

from absl import app
from absl import flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, ROOT)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

_NUM_CHARS = flags.DEFINE_integer("num_chars", 300, "Characters per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds (median shown).")
_SECTIONS = flags.DEFINE_list("sections", ["speed", "agreement", "dtype"],
                              "What to measure (see the docstring).")
_CASES = flags.DEFINE_integer("cases", 40, "Agreement cases.")
_BACKENDS = flags.DEFINE_list("backends", ["cpu"],
                              "TF.js backends for the baseline (cpu, webgl).")
_TFJS_CHARS = flags.DEFINE_integer(
    "tfjs_chars", 50, "Characters per round of the (slow) TF.js baseline.")
_TFJS_VERSION = "4.22.0"
NODE_DIR = os.path.join(ROOT, "tools", "bench", "web_js")
TFJS = os.path.join(NODE_DIR, "node_modules", "@tensorflow", "tfjs", "dist",
                    "tf.min.js")
WARM_UP = 20
CHROMIUM_TIMEOUT = 1800


def install_tfjs():
  """npm-installs @tensorflow/tfjs into tools/bench/web_js/ (once)."""
  if os.path.exists(TFJS):
    return
  os.makedirs(NODE_DIR, exist_ok=True)
  subprocess.run(["npm", "install", "--no-save", "--no-audit", "--no-fund",
                  "--prefix", NODE_DIR, f"@tensorflow/tfjs@{_TFJS_VERSION}"],
                 check=True)


def random_lstm(units, embedding_dim, seed=0):
  """An rnnstep LSTM over the bundled model's characters, random weights."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  from rnnstep.model import network  # pylint: disable=g-import-not-at-top
  vocab = rnnstep.load().vocab
  config = model_file.ModelConfig(embedding_dim,
                                  (model_file.LayerConfig("lstm", units),))
  rng = np.random.default_rng(seed)
  tensors = {name: rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(
      np.float32) for name, shape in config.expected_shapes(len(vocab)).items()}
  return network.Model(config, vocab, tensors, source=f"lstm{units}.npz")


def run_page(path):
  """Opens a page in headless Chromium; returns its <pre id="bench"> JSON."""
  profile = tempfile.mkdtemp(prefix="rnnstep_bench_chromium_")
  try:
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--disable-background-networking",
         "--disable-component-update", f"--user-data-dir={profile}",
         "--allow-file-access-from-files", "--dump-dom", "file://" + path],
        capture_output=True, timeout=CHROMIUM_TIMEOUT, check=True).stdout
  finally:
    shutil.rmtree(profile, ignore_errors=True)
  found = re.search(r'<pre id="bench">(.*?)</pre>', dom.decode(), re.S)
  if not found:
    raise RuntimeError(f"{path}: no result; the page's DOM ends "
                       f"{dom.decode()[-500:]!r}")
  return json.loads(html.unescape(found.group(1)))


RNNSTEP_PROBE = """<script>
(function () {
  var model = window.rnnstepPage.model, out = {rounds: []};
  document.getElementById("rnnstep-weights").remove();  // A short dump.
  model.generate("ROMEO:", %(warm)d, {temperature: 1, seed: 1});
  for (var r = 0; r < %(rounds)d; r++) {
    var t0 = performance.now();
    var text = model.generate("ROMEO:", %(n)d, {temperature: 1, seed: r});
    out.rounds.push(text.length / ((performance.now() - t0) / 1000));
  }
  var pre = document.createElement("pre");
  pre.id = "bench";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

TFJS_PAGE = """<!DOCTYPE html><html><body>
<script src="%(tfjs)s"></script>
<script>
(function () {
  var out = {};
  try {
    // tf.setBackend is async and the page must finish before --dump-dom:
    // drop the other backends so the first op initializes this one
    // synchronously (else TF.js picks WebGL, SwiftShader without a GPU).
    tf.engine().backendNames().forEach(function (name) {
      if (name !== "%(backend)s") tf.engine().removeBackend(name);
    });
    tf.backend();  // Initializes the one left, synchronously.
    out.backend = tf.getBackend();
    var model = tf.sequential();
    model.add(tf.layers.embedding({inputDim: %(vocab)d, outputDim: %(dim)d,
                                   batchInputShape: [1, 1]}));
    // Glorot, not Keras's orthogonal recurrent default: TF.js computes that
    // by a QR decomposition in JS, minutes for 768 units (speed is the same).
    model.add(tf.layers.lstm({units: %(units)d, stateful: true,
                              returnSequences: false,
                              recurrentInitializer: "glorotNormal"}));
    model.add(tf.layers.dense({units: %(vocab)d}));
    var id = 0;
    function next() {
      var logits = tf.tidy(function () {
        return model.predict(tf.tensor2d([[id]], [1, 1], "int32"));
      });
      var values = logits.dataSync();
      logits.dispose();
      var best = 0, top = -Infinity;
      for (var v = 0; v < values.length; v++) {
        var s = values[v] - Math.log(-Math.log(Math.random()));
        if (s > top) { top = s; best = v; }
      }
      id = best;
    }
    for (var i = 0; i < %(warm)d; i++) next();
    out.rounds = [];
    for (var r = 0; r < %(rounds)d; r++) {
      var t0 = performance.now();
      for (var j = 0; j < %(n)d; j++) next();
      out.rounds.push(%(n)d / ((performance.now() - t0) / 1000));
    }
  } catch (e) {
    out.error = String(e);
  }
  var pre = document.createElement("pre");
  pre.id = "bench";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body></html>"""


def bench_rnnstep(model, tmp, name):
  """(median chars/s, export bytes by file) of the model's exported page."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  export = os.path.join(tmp, name)
  rnnstep.export(model, export, format="web")
  sizes = {f: os.path.getsize(os.path.join(export, f))
           for f in sorted(os.listdir(export))}
  page = open(os.path.join(export, "index.html"), encoding="utf-8").read()
  head, tail = page.rsplit("</body>", 1)
  probe = RNNSTEP_PROBE % dict(warm=WARM_UP, rounds=_ROUNDS.value,
                               n=_NUM_CHARS.value)
  probed = os.path.join(export, "bench.html")
  with open(probed, "w", encoding="utf-8") as f:
    f.write(head + probe + "</body>" + tail)
  result = run_page(probed)
  return statistics.median(result["rounds"]), sizes


def bench_tfjs(tmp, units, dim, vocab, backend):
  """Median chars/s of the TF.js layers-model loop, or the error text."""
  path = os.path.join(tmp, f"tfjs_{units}_{backend}.html")
  with open(path, "w", encoding="utf-8") as f:
    f.write(TFJS_PAGE % dict(tfjs="file://" + TFJS, backend=backend,
                             vocab=vocab, dim=dim, units=units, warm=5,
                             rounds=_ROUNDS.value, n=_TFJS_CHARS.value))
  result = run_page(path)
  if "error" in result:
    return result["error"]
  if result.get("backend") != backend:
    return f"backend {result.get('backend')}, not {backend}"
  return statistics.median(result["rounds"])


def speed(tmp):
  """The speed table's rows."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  install_tfjs()
  rows = []
  for name, model, lstm in (
      ("bundled GRU 768", rnnstep.load(), (768, 256)),
      ("LSTM 768", random_lstm(768, 256), (768, 256)),
      ("LSTM 128", random_lstm(128, 64), (128, 64))):
    chars_per_s, sizes = bench_rnnstep(model, tmp, name.replace(" ", "_"))
    rows.append((name, "rnnstep web", f"{chars_per_s:.0f}",
                 f"weights.bin {sizes['weights.bin'] / 1e6:.2f} MB, "
                 f"index.html {sizes['index.html'] / 1e6:.2f} MB, "
                 f"rnnstep.js {sizes['rnnstep.js'] / 1e3:.1f} kB"))
    if name.startswith("LSTM"):
      for backend in _BACKENDS.value:
        got = bench_tfjs(tmp, lstm[0], lstm[1], model.vocab_size, backend)
        rows.append((name, f"TF.js {_TFJS_VERSION} predict/char ({backend})",
                     f"{got:.0f}" if isinstance(got, float) else got, ""))
  print(f"chars/s at batch 1, headless Chromium, median of {_ROUNDS.value} "
        f"rounds of {_NUM_CHARS.value}")
  print("| model | runtime | chars/s | export |")
  print("|---|---|---|---|")
  for row in rows:
    print("| " + " | ".join(row) + " |")


AGREEMENT_PROBE = """<script>
(function () {
  var model = window.rnnstepPage.model;
  document.getElementById("rnnstep-weights").remove();
  var cases = %(cases)s, out = [];
  cases.forEach(function (c) { out.push(model.generate(c[0], %(n)d, c[1])); });
  var pre = document.createElement("pre");
  pre.id = "bench";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

PROMPTS = ("ROMEO:", "First Citizen:\n", "KING HENRY", "O, ", "JULIET:\n",
           "What", "My lord", "Be", "The ", "Sir")
OPTIONS = ({"temperature": 0}, {"temperature": 1.0}, {"temperature": 0.8},
           {"temperature": 1.0, "top_k": 10}, {"temperature": 1.0,
                                              "top_p": 0.9},
           {"temperature": 1.0, "min_p": 0.05},
           {"temperature": 1.0, "typical_p": 0.9},
           {"temperature": 1.0, "repetition_penalty": 1.2},
           {"temperature": 0, "repetition_penalty": 1.3})


def agreement(tmp):
  """How many of the page's texts equal the library's, and where others part."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  model = rnnstep.load()
  cases = [(PROMPTS[i % len(PROMPTS)], dict(OPTIONS[i % len(OPTIONS)],
                                           seed=1000 + i))
           for i in range(_CASES.value)]
  export = os.path.join(tmp, "agreement")
  rnnstep.export(model, export, format="web")
  page = open(os.path.join(export, "index.html"), encoding="utf-8").read()
  head, tail = page.rsplit("</body>", 1)
  probed = os.path.join(export, "agreement.html")
  with open(probed, "w", encoding="utf-8") as f:
    f.write(head + AGREEMENT_PROBE % dict(cases=json.dumps(cases),
                                          n=_NUM_CHARS.value)
            + "</body>" + tail)
  got = run_page(probed)
  parted = []
  for (prompt, options), text in zip(cases, got):
    want = rnnstep.generate(model, prompt, _NUM_CHARS.value,
                            jit_compile=False, **options)
    if text != want:
      parted.append((prompt, options, next(i for i, (a, b) in enumerate(
          zip(text + "\0", want + "\1")) if a != b)))
  total = len(cases) * _NUM_CHARS.value
  print(f"agreement: {len(cases) - len(parted)} of {len(cases)} texts "
        f"identical ({total} characters; greedy and seeded, "
        f"{len(OPTIONS)} option sets)")
  for prompt, options, at in parted:
    print(f"  parted at character {at}: {prompt!r} {options}")


def dtype():
  """Whether float16-stored weights keep the library's text."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.model import network  # pylint: disable=g-import-not-at-top
  model = rnnstep.load()
  half = network.Model(model.config, model.vocab, {
      k: v.astype(np.float16).astype(np.float32)
      for k, v in model.tensors().items()})
  prompts = list(PROMPTS)
  for name, kwargs in (("greedy", dict(temperature=0)),
                       ("seeded", dict(temperature=1.0,
                                       seed=list(range(len(prompts)))))):
    want = rnnstep.generate(model, prompts, _NUM_CHARS.value,
                            jit_compile=False, **kwargs)
    got = rnnstep.generate(half, prompts, _NUM_CHARS.value,
                           jit_compile=False, **kwargs)
    parts = sorted(next((i for i, (a, b) in enumerate(zip(g, w)) if a != b),
                        _NUM_CHARS.value) for g, w in zip(got, want))
    same = sum(p == _NUM_CHARS.value for p in parts)
    print(f"float16 weights, {name}: {same} of {len(prompts)} texts of "
          f"{_NUM_CHARS.value} identical to float32's; first differences at "
          f"{[p for p in parts if p < _NUM_CHARS.value]}")


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(prefix="rnnstep_bench_web_") as tmp:
    if "speed" in _SECTIONS.value:
      speed(tmp)
    if "agreement" in _SECTIONS.value:
      agreement(tmp)
    if "dtype" in _SECTIONS.value:
      dtype()


if __name__ == "__main__":
  app.run(main)
