"""The web export in headless Chromium: chars/s at batch 1, vs TF.js and ml5.

USAGE (from the repo root):
  python tools/bench/web.py                      # 300 chars, 3 rounds
  python tools/bench/web.py --sections=speed --rounds=5 --tfjs_chars=300
                                                 # the guide's table
  python tools/bench/web.py --baselines=ml5      # without TF.js's loop
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
    one layer, then the same widths stacked two deep ("x2"), each also run
    as the `--baselines`, on each of `--backends` (TF.js's own CPU backend;
    webgl where the browser has one):
    - tfjs: a `tf.sequential` of Embedding -> stateful LSTM(s) -> Dense
      built in the page, `model.predict` on one id per character (the TF.js
      tutorial's loop, the only one TF.js offers a Keras model), the next id
      drawn in JS from `dataSync()`'s logits;
    - ml5: ml5.js 0.12.2's `charRNN` (the last ml5 with it; it bundles TF.js
      1.7.4), timing `await generate({seed: "ROMEO:", length, temperature:
      1})`. Its model is the same rnnstep LSTM written as the directory
      charRNN loads (`write_ml5_model`: manifest.json + one raw float32 file
      per TF1 char-rnn variable + vocab.json); the page first checks its
      probabilities after "ROMEO:" against `rnnstep.logits`. charRNN reads
      the second layer's state (`state.h[1]`) whatever the depth, so it
      fails on one layer (the error is the row); the x2 rows compare it.
      It loads by XHR and awaits every step, so its page is served over
      127.0.0.1 (`run_served`).

Both sides warm up (20 characters; 5 for the baselines), then time
`--num_chars` characters per round (`--tfjs_chars` for the baselines); the
table shows the median round. TF.js and ml5 come from npm (`@tensorflow/tfjs`
and `ml5`, installed into tools/bench/web_js/ and web_js/ml5/, git-ignored)
and are loaded by a classic <script src>; the rnnstep page needs nothing.
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
import http.server
import threading

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
                              "TF.js backends for the baselines (cpu, webgl).")
_BASELINES = flags.DEFINE_list("baselines", ["tfjs", "ml5"],
                               "Baselines for the LSTM rows (tfjs, ml5).")
_TFJS_CHARS = flags.DEFINE_integer(
    "tfjs_chars", 50,
    "Characters per round of the (slow) TF.js and ml5 baselines.")
_TFJS_VERSION = "4.22.0"
_ML5_VERSION = "0.12.2"
NODE_DIR = os.path.join(ROOT, "tools", "bench", "web_js")
TFJS = os.path.join(NODE_DIR, "node_modules", "@tensorflow", "tfjs", "dist",
                    "tf.min.js")
# Its own prefix: ml5 0.12.2 depends on @tensorflow/tfjs ^1.7 (its dist
# bundles 1.7.4), and npm would prune one --no-save install with the other.
ML5_DIR = os.path.join(NODE_DIR, "ml5")
ML5 = os.path.join(ML5_DIR, "node_modules", "ml5", "dist", "ml5.min.js")
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


def install_ml5():
  """npm-installs ml5 0.12.2 into tools/bench/web_js/ml5/ (once).

  Only its prebuilt dist/ml5.min.js is used, so no install scripts run.
  """
  if os.path.exists(ML5):
    return
  os.makedirs(ML5_DIR, exist_ok=True)
  subprocess.run(["npm", "install", "--no-save", "--no-audit", "--no-fund",
                  "--ignore-scripts", "--prefix", ML5_DIR,
                  f"ml5@{_ML5_VERSION}"], check=True)


def random_lstm(units, embedding_dim, seed=0, layers=1):
  """An rnnstep LSTM over the bundled model's characters, random weights."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  from rnnstep.model import network  # pylint: disable=g-import-not-at-top
  vocab = rnnstep.load().vocab
  config = model_file.ModelConfig(
      embedding_dim, (model_file.LayerConfig("lstm", units),) * layers)
  rng = np.random.default_rng(seed)
  tensors = {name: rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(
      np.float32) for name, shape in config.expected_shapes(len(vocab)).items()}
  return network.Model(config, vocab, tensors,
                       source=f"lstm{units}x{layers}.npz")


def write_ml5_model(model, directory):
  """Writes an rnnstep LSTM stack as the directory ml5's charRNN loads.

  ml5 0.12.2 (src/CharRNN, src/utils/checkpointLoader.js) fetches
  manifest.json, `{variable: {filename, shape}}`, each file raw little-endian
  float32, and vocab.json, `{character: id}`. It sorts variables by name:
  `cell_<k>` with `kernel` (any "w") is layer k's kernel, else its bias;
  `softmax` with a "w" the output kernel, else its bias; any other name is
  kept as is, and `embedding` is multiplied by the one-hot input. Layer k is
  `tf.basicLSTMCell` (TF1's BasicLSTMCell): kernel [inputs + U, 4U] over
  concat(x, h), gate blocks i, j (Keras c), f, o, and forget_bias 1 added
  to f, so Keras's kernels and bias are stacked, reordered and shifted.
  """
  tensors = model.tensors()
  variables = {"embedding": tensors["embedding"]}
  for k, layer in enumerate(model.config.layers):
    if layer.kind != "lstm":
      raise ValueError(f"ml5's charRNN runs LSTMs, not {layer.kind}")
    u = layer.units
    def tf1_order(x, u=u):  # Keras i, f, c, o -> TF1 i, j, f, o.
      return np.concatenate([x[..., :u], x[..., 2 * u:3 * u], x[..., u:2 * u],
                             x[..., 3 * u:]], axis=-1)
    bias = tf1_order(tensors[f"layer{k}_bias"])
    bias[2 * u:3 * u] -= 1.0
    cell = f"rnn/multi_rnn_cell/cell_{k}/basic_lstm_cell"
    variables[cell + "/kernel"] = tf1_order(np.concatenate(
        [tensors[f"layer{k}_kernel"], tensors[f"layer{k}_recurrent_kernel"]]))
    variables[cell + "/bias"] = bias
  variables["softmax/softmax_w"] = tensors["dense_kernel"]
  variables["softmax/softmax_b"] = tensors["dense_bias"]
  os.makedirs(directory)
  manifest = {}
  for name, value in variables.items():
    filename = name.replace("/", "_")
    np.ascontiguousarray(value, "<f4").tofile(os.path.join(directory,
                                                           filename))
    manifest[name] = {"filename": filename, "shape": list(value.shape)}
  with open(os.path.join(directory, "manifest.json"), "w",
            encoding="utf-8") as f:
    json.dump(manifest, f)
  with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump({c: i for i, c in enumerate(model.vocab)}, f)


def run_page(path):
  """Opens a page (a path or URL) in headless Chromium; its <pre id="bench"> JSON."""
  profile = tempfile.mkdtemp(prefix="rnnstep_bench_chromium_")
  try:
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--disable-background-networking",
         "--disable-component-update", f"--user-data-dir={profile}",
         "--allow-file-access-from-files", "--dump-dom",
         path if "://" in path else "file://" + path],
        capture_output=True, timeout=CHROMIUM_TIMEOUT, check=True).stdout
  finally:
    shutil.rmtree(profile, ignore_errors=True)
  found = re.search(r'<pre id="bench">(.*?)</pre>', dom.decode(), re.S)
  if not found:
    raise RuntimeError(f"{path}: no result; the page's DOM ends "
                       f"{dom.decode()[-500:]!r}")
  return json.loads(html.unescape(found.group(1)))


def run_served(directory, page):
  """run_page for an asynchronous page, DIRECTORY/PAGE over http://127.0.0.1.

  --dump-dom dumps the DOM at the load event, which a page that awaits its
  work would pass before it is done. So the page holds its load event with
  <img src="/hold">, which this server answers once the page has POSTed to
  /done (after writing its <pre id="bench">).
  """
  done = threading.Event()

  class Handler(http.server.SimpleHTTPRequestHandler):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, directory=directory, **kwargs)

    def log_message(self, *args):  # pylint: disable=arguments-differ
      pass

    def do_GET(self):
      if self.path == "/hold":
        done.wait(CHROMIUM_TIMEOUT)
        self.send_response(204)
        self.end_headers()
      else:
        super().do_GET()

    def do_POST(self):  # pylint: disable=invalid-name
      self.rfile.read(int(self.headers.get("Content-Length", 0)))
      self.send_response(204)
      self.end_headers()
      done.set()

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    return run_page(f"http://127.0.0.1:{server.server_port}/{page}")
  finally:
    done.set()
    server.shutdown()
    server.server_close()


# Every page ends by writing its result as JSON into <pre id="bench">, which
# `chromium --dump-dom` prints and `run_page` reads back.
REPORT_JS = """  var pre = document.createElement("pre");
  pre.id = "bench";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
"""


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
""" + REPORT_JS + """})();
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
    for (var layer = 0; layer < %(layers)d; layer++) {
      model.add(tf.layers.lstm({units: %(units)d, stateful: true,
                                returnSequences: layer < %(layers)d - 1,
                                recurrentInitializer: "glorotNormal"}));
    }
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
""" + REPORT_JS + """})();
</script></body></html>"""


ML5_PAGE = """<!DOCTYPE html><html><body>
<img src="/hold" alt="">
<script src="ml5.min.js"></script>
<script>
(async function () {
  var out = {};
  try {
    await ml5.tf.setBackend("%(backend)s");
    out.backend = ml5.tf.getBackend();
    var rnn = ml5.charRNN("model");
    await rnn.ready;
    // A fresh charRNN starts from the zero state: its distribution after the
    // prompt, to check the model directory against rnnstep's logits.
    await rnn.generate({seed: "ROMEO:", length: 1, temperature: 1});
    out.probabilities = Array.from(rnn.probabilities);
    await rnn.generate({seed: "ROMEO:", length: %(warm)d, temperature: 1});
    out.rounds = [];
    out.lengths = [];
    for (var r = 0; r < %(rounds)d; r++) {
      var t0 = performance.now();
      var got = await rnn.generate({seed: "ROMEO:", length: %(n)d,
                                    temperature: 1});
      out.rounds.push(got.sample.length / ((performance.now() - t0) / 1000));
      out.lengths.push(got.sample.length);
    }
  } catch (e) {
    out.error = String(e);
  }
""" + REPORT_JS + """  fetch("/done", {method: "POST", body: "done"});
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


def bench_tfjs(tmp, units, dim, vocab, backend, layers=1):
  """Median chars/s of the TF.js layers-model loop, or the error text."""
  path = os.path.join(tmp, f"tfjs_{units}x{layers}_{backend}.html")
  with open(path, "w", encoding="utf-8") as f:
    f.write(TFJS_PAGE % dict(tfjs="file://" + TFJS, backend=backend,
                             vocab=vocab, dim=dim, units=units, warm=5,
                             layers=layers, rounds=_ROUNDS.value,
                             n=_TFJS_CHARS.value))
  result = run_page(path)
  if "error" in result:
    return result["error"]
  if result.get("backend") != backend:
    return f"backend {result.get('backend')}, not {backend}"
  return statistics.median(result["rounds"])


def bench_ml5(tmp, model, name, backend):
  """(median chars/s, a note) of ml5's charRNN.generate on MODEL, or the error.

  The note: the model directory's size, and how far charRNN's probabilities
  after the prompt lie from `rnnstep.logits`' softmax.
  """
  import rnnstep  # pylint: disable=g-import-not-at-top
  served = os.path.join(tmp, f"ml5_{name}_{backend}")
  write_ml5_model(model, os.path.join(served, "model"))
  shutil.copy(ML5, served)
  with open(os.path.join(served, "index.html"), "w", encoding="utf-8") as f:
    f.write(ML5_PAGE % dict(backend=backend, warm=5, rounds=_ROUNDS.value,
                            n=_TFJS_CHARS.value))
  result = run_served(served, "index.html")
  if "error" in result:
    return result["error"]
  if result.get("backend") != backend:
    return f"backend {result.get('backend')}, not {backend}"
  logits = rnnstep.logits(model, model.encode("ROMEO:"))[0, -1]
  want = np.exp(logits - logits.max())
  want /= want.sum()
  off = np.abs(np.array(result["probabilities"]) - want).max()
  if off > 1e-4:
    return f"probabilities after the prompt off by {off:.2g}: wrong format"
  if min(result["lengths"]) != _TFJS_CHARS.value:
    return f"generated {result['lengths']} characters"
  size = sum(os.path.getsize(os.path.join(served, "model", f))
             for f in os.listdir(os.path.join(served, "model")))
  return statistics.median(result["rounds"]), (
      f"model dir {size / 1e6:.2f} MB; probabilities within {off:.1g} of "
      "rnnstep's")


def speed(tmp):
  """The speed table's rows."""
  import rnnstep  # pylint: disable=g-import-not-at-top
  if "tfjs" in _BASELINES.value:
    install_tfjs()
  if "ml5" in _BASELINES.value:
    install_ml5()
  rows = []
  for name, model, lstm in (
      ("bundled GRU 768", rnnstep.load(), (768, 256, 1)),
      ("LSTM 768", random_lstm(768, 256), (768, 256, 1)),
      ("LSTM 128", random_lstm(128, 64), (128, 64, 1)),
      ("LSTM 768 x2", random_lstm(768, 256, layers=2), (768, 256, 2)),
      ("LSTM 128 x2", random_lstm(128, 64, layers=2), (128, 64, 2))):
    chars_per_s, sizes = bench_rnnstep(model, tmp, name.replace(" ", "_"))
    rows.append((name, "rnnstep web", f"{chars_per_s:.0f}",
                 f"weights.bin {sizes['weights.bin'] / 1e6:.2f} MB, "
                 f"index.html {sizes['index.html'] / 1e6:.2f} MB, "
                 f"rnnstep.js {sizes['rnnstep.js'] / 1e3:.1f} kB"))
    if not name.startswith("LSTM"):
      continue
    for backend in _BACKENDS.value:
      if "tfjs" in _BASELINES.value:
        got = bench_tfjs(tmp, lstm[0], lstm[1], model.vocab_size, backend,
                         layers=lstm[2])
        rows.append((name, f"TF.js {_TFJS_VERSION} predict/char ({backend})",
                     f"{got:.0f}" if isinstance(got, float) else got, ""))
      if "ml5" in _BASELINES.value:
        got = bench_ml5(tmp, model, name.replace(" ", "_"), backend)
        rows.append((name, f"ml5 {_ML5_VERSION} charRNN.generate ({backend})")
                    + ((f"{got[0]:.0f}", got[1]) if isinstance(got, tuple)
                       else (got, "")))
  print(f"chars/s at batch 1, headless Chromium, median of {_ROUNDS.value} "
        f"rounds of {_NUM_CHARS.value} ({_TFJS_CHARS.value} for the "
        "baselines)")
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
""" + REPORT_JS + """})();
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
