"""rnnstep-export --format=web: the page generates rnnstep.generate's text.

One headless Chromium run (the distribution's package, as
tests/test_inspect_page.py uses it) loads the bundled model's exported
index.html from disk with a probe script appended, which drives the page's
own runtime in the page and writes what it got into an element that
--dump-dom prints:

  - 20 (prompt, options, seed) cases on the bundled model, each compared
    with `rnnstep.generate`'s text;
  - a grid on a small random stack holding every cell kind (LSTM -> GRU
    reset_after=False -> SimpleRNN -> GRU reset_after=True, with "[UNK]"),
    statefully and over windows (the one it records, and `window=`), its
    export inlined into the probe;
  - its logits after a prompt (`step`) against `rnnstep.logits`;
  - the noise bits against `sampling.uniform_noise`;
  - bad options and an out-of-vocabulary character: one-line errors, from
    the API and in the page's error line;
  - no network: a fetch is refused by the page's CSP and no resource entry
    exists.
Without Chromium only the checks that need no browser run.
"""

import base64
import html
import json
import pathlib
import re

import numpy as np
import pytest

from tests.support import chromium

import rnnstep
from rnnstep.exporters import web
from rnnstep.model import model_file
from rnnstep.model import network as model_lib

# The quick tier (-m "not slow") leaves this file out: it starts a browser.
pytestmark = pytest.mark.slow

NUM_CHARS = 40

# (prompt, options) on the bundled model, each with its seed (None: greedy).
BUNDLED_CASES = [
    ("ROMEO:", {"temperature": 0}, None),
    ("First Citizen:\n", {"temperature": 0}, None),
    ("a", {"temperature": 0, "repetition_penalty": 1.5}, None),
    ("KING", {"temperature": 0, "no_repeat_ngram_size": 3}, None),
    ("ROMEO:", {"temperature": 1.0}, 0),
    ("ROMEO:", {"temperature": 1.0}, 1),
    ("JULIET:\n", {"temperature": 0.8}, -7),
    ("O, ", {"temperature": 1.2}, 2**40 + 3),
    ("What", {"temperature": 1.0}, "-9223372036854775808"),
    ("Be", {"temperature": 0.7, "top_k": 5}, 11),
    ("Be", {"temperature": 1.0, "top_k": 1}, 12),
    ("The ", {"temperature": 1.0, "top_p": 0.9}, 13),
    ("The ", {"temperature": 0.9, "min_p": 0.1}, 14),
    ("The ", {"temperature": 1.0, "typical_p": 0.8}, 15),
    ("My lord", {"temperature": 1.0, "repetition_penalty": 1.3}, 16),
    ("My lord", {"temperature": 1.0, "repetition_penalty": 1.3,
                 "repetition_window": 8}, 17),
    ("Sir", {"temperature": 0.8, "top_k": 20, "top_p": 0.95, "min_p": 0.02,
             "typical_p": 0.95, "repetition_penalty": 1.1}, 18),
    ("ROMEO:", {"temperature": 1.0, "stop": "\n"}, 19),
    ("ROMEO:", {"temperature": 0, "stop": ["court", "xyz"]}, None),
    ("\n", {"temperature": 1.5, "no_repeat_ngram_size": 2}, 20),
    ("a", {"temperature": 0, "frequency_penalty": 0.9}, None),
    ("My lord", {"temperature": 1.0, "presence_penalty": 1.5,
                 "frequency_penalty": -0.4, "repetition_penalty": 1.2}, 21),
]

# The small stack: every kind, "[UNK]" at id 0 (never drawn).
SMALL_LAYERS = (model_file.LayerConfig("lstm", 20),
                model_file.LayerConfig("gru", 18, False),
                model_file.LayerConfig("simple_rnn", 16),
                model_file.LayerConfig("gru", 24, True))
SMALL_VOCAB = ["[UNK]"] + list("abcdefgh ijklmnop.,\n")
SMALL_WINDOW = 6  # The small model records a window: its default reading.
SMALL_CASES = [
    ("ab", {"temperature": 0, "window": 0}, None),
    ("h.j", {"temperature": 1.0, "window": 0}, 3),
    ("ab", {"temperature": 0.7, "top_k": 4, "repetition_penalty": 1.4,
            "window": 0}, 4),
    ("ponm", {"temperature": 1.0, "top_p": 0.8, "min_p": 0.05,
              "window": 0}, 5),
    ("ponm", {"temperature": 1.0, "typical_p": 0.7, "window": 0}, 6),
    ("ab", {"temperature": 0.8, "frequency_penalty": 1.3,
            "presence_penalty": 0.6, "window": 0}, 8),
    ("abcdefghij", {"temperature": 0}, None),  # Over its recorded window.
    ("a", {"temperature": 1.0, "window": 3}, 7),
]
LOGIT_PROMPTS = ["a", "hello hello.", "pin\nkin, ok"]
NOISE_KEYS = [0, 1, -1, 2**31, 2**62 + 5]


def small_model():
  """A random rnnstep model of `SMALL_LAYERS`, scaled so its text is lively.

  Built from numpy tensors, not through Keras: the library's own text is the
  reference here, and importing Keras would cost seconds of the CI budget.
  """
  config = model_file.ModelConfig(embedding_dim=12, layers=SMALL_LAYERS,
                                  window=SMALL_WINDOW)
  rng = np.random.default_rng(3)
  tensors = {}
  for name, shape in config.expected_shapes(len(SMALL_VOCAB)).items():
    if name == "embedding":
      scale = 1.5
    elif name.endswith("bias"):
      scale = 0.3
    else:  # Kernels: large enough that the state, not a bias, decides.
      scale = (3.0 if name.startswith("dense") else 2.5) / np.sqrt(shape[0])
    tensors[name] = rng.normal(0, scale, shape).astype(np.float32)
  return model_lib.Model(config, SMALL_VOCAB, tensors, source="small.npz")


def int8_of(model):
  """`model` with weights_dtype int8 (its products the int8 arithmetic)."""
  return model_lib.Model(model.config, model.vocab, model.tensors(),
                         source="small_int8.npz", weights_dtype="int8")


def js_options(options, seed):
  out = dict(options)
  if seed is not None:
    out["seed"] = seed
  return out


def library_text(model, prompt, options, seed):
  kwargs = {k: v for k, v in options.items()}
  if isinstance(seed, str):
    seed = int(seed)
  return rnnstep.generate(model, prompt, NUM_CHARS, seed=seed,
                          jit_compile=False, **kwargs)


PROBE = """<script>
(function () {
  var input = JSON.parse(document.getElementById("probe-input").textContent);
  var out = {bundled: [], small: [], logits: [], noise: [], errors: {},
             page_errors: {}};
  function attempt(fn) {
    try { return {value: fn()}; }
    catch (e) { return {error: e.message, argument: e.argument || null,
                        name: e.name}; }
  }
  var page = window.rnnstepPage, bundled = page.model;
  input.bundled.forEach(function (c) {
    out.bundled.push(attempt(function () {
      return bundled.generate(c[0], input.num_chars, c[1]);
    }));
  });
  var small = rnnstep.fromData(input.small_meta, input.small_weights);
  input.small.forEach(function (c) {
    out.small.push(attempt(function () {
      return small.generate(c[0], input.num_chars, c[1]);
    }));
  });
  var int8 = rnnstep.fromData(input.int8_meta, input.int8_weights);
  out.int8 = input.small.map(function (c) {
    return attempt(function () {
      return int8.generate(c[0], input.num_chars, c[1]);
    });
  });
  out.int8_logits = input.logit_prompts.map(function (p) {
    return Array.from(int8.step(p).logits);
  });
  input.logit_prompts.forEach(function (p) {
    out.logits.push(Array.from(small.step(p).logits));
  });
  // The state in and out: two steps from the state give one step's logits.
  var half = small.step("hello "), whole = small.step("hello hello.");
  out.state_chain = Array.from(small.step("hello.", half.state).logits)
      .every(function (v, i) { return v === whole.logits[i]; });
  out.state_unchanged = Array.from(half.state[0].h).join() ===
      Array.from(small.step("hello ").state[0].h).join();
  input.noise_keys.forEach(function (seed) {
    var key = rnnstep.noise.rowKey(BigInt(seed), 0);
    var bits = rnnstep.noise.noiseBits(key, 17, 21, new Uint32Array(21));
    out.noise.push({key: key,
                    uniform: Array.from(bits, rnnstep.noise.uniformOf)});
  });
  // Bad arguments: one-line errors naming them.
  var bad = {
    temperature: ["ROMEO:", 5, {temperature: -1}],
    top_p: ["ROMEO:", 5, {top_p: 2}],
    top_k: ["ROMEO:", 5, {top_k: 1.5}],
    text: ["ROMEO:", 5, {temperature: "hot"}],
    unknown: ["ROMEO:", 5, {temprature: 1}],
    beams: ["ROMEO:", 5, {num_beams: 2}],
    seed: ["ROMEO:", 5, {seed: 1.5}],
    prompt: ["ROMEO\\u20ac", 5, {}],
    empty: ["", 5, {}],
    stop: ["ROMEO:", 5, {stop: "\\u00e9"}],
    steps: ["ROMEO:", -1, {}]
  };
  Object.keys(bad).forEach(function (name) {
    var a = bad[name];
    out.errors[name] = attempt(function () {
      return bundled.generate(a[0], a[1], a[2]);
    });
  });
  // The same through the page's form: the error line.
  function form(values) {
    Object.keys(values).forEach(function (id) {
      document.getElementById(id).value = values[id];
    });
    page.run();  // Checks synchronously, before its first await.
    return document.getElementById("error").textContent;
  }
  out.page_errors.option = form({temperature: "hot"});
  out.page_errors.vocab = form({temperature: "1", prompt: "ROMEO\\u20ac"});
  out.page_errors.top_p = form({prompt: "ROMEO:", top_p: "1.5"});
  form({top_p: "", prompt: "ROMEO:", numChars: "10", seed: "0"});
  out.page_errors.none = document.getElementById("error").textContent;
  // No network: nothing was loaded, and the page may not load anything.
  out.resources = performance.getEntriesByType("resource").map(function (e) {
    return e.name;
  });
  // Dump a short DOM: the weights and the input are read already.
  document.getElementById("rnnstep-weights").remove();
  document.getElementById("probe-input").remove();
  var pre = document.createElement("pre");
  pre.id = "probe";
  fetch("model.json").then(function () { out.fetched = true; },
                           function (e) { out.fetched = String(e); })
    .then(function () {
      pre.textContent = JSON.stringify(out);
      document.body.appendChild(pre);
    });
})();
</script>
"""


@pytest.fixture(scope="module")
def bundled():
  return rnnstep.load()


@pytest.fixture(scope="module")
def small():
  return small_model()


@pytest.fixture(scope="module")
def export_dir(bundled, tmp_path_factory):
  return pathlib.Path(
      web.export_web(bundled, tmp_path_factory.mktemp("web") / "bundled"))


@pytest.fixture(scope="module")
def probe(export_dir, bundled, small):
  """The probe's dict, from one Chromium run over the exported page."""
  binary, why_not = chromium.chromium_binary()
  if binary is None:
    pytest.skip(why_not)
  meta, weights = web.export_data(small)
  int8_meta, int8_weights = web.export_data(int8_of(small))
  probe_input = {
      "num_chars": NUM_CHARS,
      "bundled": [[p, js_options(o, s)] for p, o, s in BUNDLED_CASES],
      "small": [[p, js_options(o, s)] for p, o, s in SMALL_CASES],
      "small_meta": meta,
      "small_weights": base64.b64encode(weights).decode("ascii"),
      "int8_meta": int8_meta,
      "int8_weights": base64.b64encode(int8_weights).decode("ascii"),
      "logit_prompts": LOGIT_PROMPTS,
      "noise_keys": [str(k) for k in NOISE_KEYS]}
  data = ('<script type="application/json" id="probe-input">'
          + json.dumps(probe_input).replace("</", "<\\/") + "</script>")
  page = export_dir / web.PAGE_FILE
  text = page.read_text(encoding="utf-8")
  head, tail = text.rsplit("</body>", 1)
  probed = page.with_name("probed.html")
  probed.write_text(head + data + PROBE + "</body>" + tail, encoding="utf-8")
  dom = chromium.run_chromium(binary, probed.as_uri(), "--dump-dom",
                              "--virtual-time-budget=5000").stdout.decode()
  library = {
      "bundled": [library_text(bundled, *case) for case in BUNDLED_CASES],
      "small": [library_text(small, *case) for case in SMALL_CASES],
      "int8": [library_text(int8_of(small), *case) for case in SMALL_CASES],
      "int8_logits": [rnnstep.logits(int8_of(small), small.encode(p)[None],
                                     window=0)[0, -1]
                      for p in LOGIT_PROMPTS],
      # Statefully, as `step` runs (the model records a window).
      "logits": [rnnstep.logits(small, small.encode(p)[None],
                                window=0)[0, -1] for p in LOGIT_PROMPTS]}
  found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
  assert found, dom[-2000:]
  got = json.loads(html.unescape(found.group(1)))
  got["library"] = library
  return got


def test_export_writes_the_files(export_dir, bundled):
  names = sorted(p.name for p in export_dir.iterdir())
  assert names == ["index.html", "model.json", "rnnstep.js", "weights.bin"]
  meta = json.loads((export_dir / "model.json").read_text(encoding="utf-8"))
  assert meta["vocab"] == list(bundled.vocab)
  size = sum(int(np.prod(t["shape"])) for t in meta["tensors"].values())
  assert (export_dir / "weights.bin").stat().st_size == 4 * size
  module = (export_dir / "rnnstep.js").read_text(encoding="utf-8")
  assert "export function load(" in module


def test_page_is_self_contained(export_dir):
  page = (export_dir / "index.html").read_text(encoding="utf-8")
  assert ("Content-Security-Policy\" content=\"default-src 'none'; "
          "script-src 'unsafe-inline'; style-src 'unsafe-inline'") in page
  # The weights' base64 aside (it is no markup), nothing names a resource.
  page = re.sub(r'(id="rnnstep-weights">)[A-Za-z0-9+/=]*', r"\1", page)
  external = re.findall(r"(?i)<script[^>]*\bsrc\s*=|<link|<img|<iframe|"
                        r"\bhref\s*=|@import|https?://", page)
  external += re.findall(r"(?<![\w.])url\(", page)  # CSS, not JS's new URL(.
  assert not external, external


def test_refusals_are_one_line(bundled, tmp_path):
  half = rnnstep.load(dtype="bfloat16")
  with pytest.raises(ValueError, match=r"^the web export is float32 only .*"
                     r"load it with dtype='float32'$") as e:
    rnnstep.export(half, tmp_path / "out", format="web")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "out").exists()
  with pytest.raises(ValueError, match="format must be one of"):
    rnnstep.export(bundled, tmp_path / "out", format="webgl")


def test_bundled_texts_are_the_librarys(probe):
  got = probe["bundled"]
  assert len(got) == len(BUNDLED_CASES) == 22
  for case, result, want in zip(BUNDLED_CASES, got,
                                probe["library"]["bundled"]):
    assert "error" not in result, result
    assert result["value"] == want, case


def test_every_cell_kind_and_windows(probe):
  for case, result, want in zip(SMALL_CASES, probe["small"],
                                probe["library"]["small"]):
    assert "error" not in result, result
    assert result["value"] == want, case
  # Lively: the texts differ from each other.
  assert len({r["value"] for r in probe["small"]}) == len(SMALL_CASES)


def test_int8_texts_and_logits_are_the_librarys(probe):
  """An int8 model's page multiplies in the library's int8 arithmetic
  (`int8Product`): every cell kind's text, and its logits to float32
  rounding."""
  for case, result, want in zip(SMALL_CASES, probe["int8"],
                                probe["library"]["int8"]):
    assert "error" not in result, result
    assert result["value"] == want, case
  assert probe["int8"] != probe["small"]  # Not float32's arithmetic.
  for got, want in zip(probe["int8_logits"], probe["library"]["int8_logits"]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_logits_and_state(probe):
  for got, want in zip(probe["logits"], probe["library"]["logits"]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert probe["state_chain"] and probe["state_unchanged"]


def test_noise_is_bit_for_bit(probe):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from rnnstep.decoding import sampling  # pylint: disable=g-import-not-at-top
  keys = sampling.row_keys(tf.constant(NOISE_KEYS, tf.int64),
                           tf.zeros([len(NOISE_KEYS)], tf.int32))
  uniform = sampling.uniform_noise(keys, tf.constant(17), 21).numpy()
  assert [n["key"] for n in probe["noise"]] == keys.numpy().tolist()
  got = np.array([n["uniform"] for n in probe["noise"]], np.float32)
  assert got.tobytes() == uniform.tobytes()


def test_bad_input_is_a_one_line_error(probe):
  errors = probe["errors"]
  for name, result in errors.items():
    assert "error" in result and "\n" not in result["error"], (name, result)
  assert errors["temperature"]["error"] == (
      "temperature must be a finite number >= 0 (0 = greedy), got -1")
  assert errors["top_p"]["argument"] == "top_p"
  assert errors["text"]["error"].endswith('got "hot"')
  assert errors["unknown"]["error"].startswith('unknown option "temprature"')
  assert "beam search is not in the web export" in errors["beams"]["error"]
  assert errors["seed"]["argument"] == "seed"
  assert errors["prompt"]["error"] == (
      "prompt: character \"\u20ac\" (U+20AC) at position 5 is not in the "
      "model's vocabulary; remove or replace it")
  assert errors["empty"]["argument"] == "prompt"
  assert "can never be generated" in errors["stop"]["error"]
  assert errors["steps"]["argument"] == "numChars"
  page = probe["page_errors"]
  assert page["option"].startswith("temperature must be a finite number")
  assert page["vocab"].startswith("prompt: character \"\u20ac\"")
  assert page["top_p"] == "top_p must be in (0, 1] (1 = off), got 1.5"
  assert page["none"] == ""


def test_no_network(probe):
  assert probe["resources"] == []
  # The CSP refused the probe's fetch: a rejection, never a response.
  assert isinstance(probe["fetched"], str), probe["fetched"]
  assert "Failed to fetch" in probe["fetched"]
