"""rnnstep/inspect_page.py: the page, rendered in a real browser.

Headless Chromium (`tests/support/chromium.py`) draws
the page twice: once to a screenshot, whose pixels must hold the colours the
analysis gives the characters, and once with a probe script appended that
reads the laid-out DOM (each character's cell, its computed colours and size;
the neuron menu and hover at work) into an element that --dump-dom prints.
Without Chromium only the checks that need no browser run.
"""

import html
import json
import os
import re
import shutil

import pytest
import tensorflow as tf

from tests.support import chromium
from tests.support import keras_reference as kr

from rnnstep.inspect import analysis as inspect
from rnnstep.inspect import page as inspect_page

# Quick tier (-m "not slow") leaves this file out: the page in headless
# Chromium.
pytestmark = pytest.mark.slow

LAYERS = [kr.layer("gru", 16)]
VOCAB = ["\n"] + [chr(32 + i) for i in range(64)]  # Has <, >, &, " and '.
TEXT = ('FIRST CITIZEN:\nBEFORE WE PROCEED ANY FURTHER, HEAR ME SPEAK.\n\n'
        'ALL:\nSPEAK, SPEAK. "QUOTED" </SCRIPT> & <B>BOLD?</B>\n'
        'FIRST CITIZEN:\nYOU ARE ALL RESOLVED RATHER TO DIE THAN TO FAMISH?\n')
WIDTH, HEIGHT = 1000, 900


@pytest.fixture(scope="module")
def analysis():
  keras_model = kr.lively(kr.build(LAYERS, seed=6))
  model = kr.rnnstep_model(keras_model, LAYERS, VOCAB)
  return inspect.analyze(model, TEXT, num_neurons=4)


@pytest.fixture(scope="module")
def page(analysis):
  return inspect_page.render(analysis, "test <model>", notice="a notice & more")


def expected_backgrounds(analysis, k):
  """The rgb() strings the k-th offered neuron gives each character."""
  values = analysis.activation(analysis.offered[k].neuron)
  return [css_rgb(inspect_page.activation_colours(
      inspect_page.page_value(v))[0]) for v in values]


def css_rgb(hex_colour):
  r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
  return f"rgb({r}, {g}, {b})"


def test_palettes():
  assert inspect_page.activation_colours(-1) == ["#2166ac", "#fff"]
  assert inspect_page.activation_colours(0) == ["#ffffff", "#111"]
  assert inspect_page.activation_colours(1) == ["#b2182b", "#fff"]
  assert (inspect_page.activation_colours(7)
          == inspect_page.activation_colours(1))
  assert inspect_page.probability_colours(0)[0] == "#ffffff"
  assert inspect_page.probability_colours(1) == ["#006d2c", "#fff"]


def test_page_is_self_contained_and_escaped(page, analysis):
  # Nothing to fetch: no URL, link, import, font file or external script.
  external = re.findall(r"(?i)\b(?:src|href)\s*=|url\(|@import|@font-face|"
                        r"<link|https?:|//[a-z]", page)
  assert not external, external
  # The text's markup-like characters are text, never markup: "<B>" and
  # "</SCRIPT>" are escaped, each character in its own cell.
  assert "<B>" not in page and "&lt;" in page
  assert len(re.findall(r"(?i)</script", page)) == 2  # The page's own two.
  data = json.loads(re.search(r'<script type="application/json" id="data">'
                              r"(.*?)</script>", page, re.S).group(1))
  assert data["text"] == TEXT
  assert len(data["neurons"]) == len(analysis.offered) == 4
  assert all(len(n["values"]) == len(TEXT) for n in data["neurons"])
  assert "&lt;model&gt;" in page and "a notice &amp; more" in page
  assert page.count('class="g') == inspect.TOP_K * len(TEXT)


def test_glyphs():
  assert [inspect_page.glyph(c) for c in "a \n\t\x07"] == [
      "a", " ", "\u21b5", "\u21e5", "\u00b7"]
  assert inspect_page.glyph("[UNK]") == "\u2370"
  assert inspect_page.guess_glyph(" ") == "\u2423"


# What the probe reads: per character cell [index, text, computed background,
# computed colour, width, height, visibility]; then the same backgrounds after
# the menu switches to the second neuron; the hover line.
PROBE = """<script>
(function () {
  var out = {cells: [], switched: [], guesses: []};
  var chs = document.querySelectorAll("#text .ch");
  chs.forEach(function (ch) {
    var a = ch.querySelector(".a"), box = a.getBoundingClientRect(),
        style = getComputedStyle(a);
    out.cells.push([+ch.dataset.i, a.textContent, style.backgroundColor,
                    style.color, box.width, box.height, style.visibility]);
    out.guesses.push(ch.querySelectorAll(".g").length);
  });
  var select = document.getElementById("neuron");
  select.value = "1";
  select.dispatchEvent(new Event("change"));
  chs.forEach(function (ch) {
    out.switched.push(getComputedStyle(ch.querySelector(".a")).backgroundColor);
  });
  out.why = document.getElementById("why").textContent;
  chs[3].dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
  out.info = document.getElementById("info").textContent;
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def run_chromium(binary, url, *args):
  return chromium.run_chromium(binary, url, *args, width=WIDTH, height=HEIGHT)


@pytest.fixture(scope="module")
def browser(page, tmp_path_factory):
  """Renders the page: (screenshot as uint8 [H, W, C], the probe's dict)."""
  binary, why_not = chromium.chromium_binary()
  if binary is None:
    pytest.skip(why_not)
  tmp = tmp_path_factory.mktemp("inspect_page")
  page_path, probed_path = tmp / "page.html", tmp / "probed.html"
  page_path.write_text(page, encoding="utf-8")
  probed_path.write_text(page.replace("</body>", PROBE + "</body>"),
                         encoding="utf-8")
  shot = tmp / "page.png"
  run_chromium(binary, page_path.as_uri(), f"--screenshot={shot}")
  if os.environ.get("RNNSTEP_KEEP_SCREENSHOT"):  # To look at it yourself.
    shutil.copy(shot, os.environ["RNNSTEP_KEEP_SCREENSHOT"])
  dom = run_chromium(binary, probed_path.as_uri(), "--dump-dom").stdout.decode()
  found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
  assert found, dom[-2000:]
  pixels = tf.io.decode_png(shot.read_bytes(), channels=3).numpy()
  return pixels, json.loads(html.unescape(found.group(1)))


def test_every_character_is_drawn_coloured(browser, analysis):
  _, probe = browser
  cells = probe["cells"]
  assert [c[0] for c in cells] == list(range(len(TEXT)))
  assert [c[1] for c in cells] == [inspect_page.glyph(c) for c in TEXT]
  assert [c[2] for c in cells] == expected_backgrounds(analysis, 0)
  for index, _, _, _, width, height, visibility in cells:
    assert width > 5 and height > 5 and visibility == "visible", index
  # Both signs are on show (the model is lively enough), so the colours mean
  # something: not all white.
  assert len(set(c[2] for c in cells)) > 20
  assert probe["guesses"] == [inspect.TOP_K] * len(TEXT)


def test_menu_and_hover_work(browser, analysis):
  _, probe = browser
  assert probe["switched"] == expected_backgrounds(analysis, 1)
  assert probe["switched"] != expected_backgrounds(analysis, 0)
  assert probe["why"] == inspect_page.explanation(analysis.offered[1],
                                                  analysis.layers)
  assert probe["info"].startswith('position 3: "S"   activation ')


def test_screenshot_shows_the_colours(browser, analysis):
  pixels, _ = browser
  assert pixels.shape == (HEIGHT, WIDTH, 3)
  flat = pixels.reshape(-1, 3)
  colours = {tuple(p) for p in flat[::7]}
  assert len(colours) > 100, "a blank or nearly blank page"
  # The backgrounds of the text's first lines, exactly as computed, are there.
  wanted = {tuple(int(x) for x in re.findall(r"\d+", rgb))
            for rgb in expected_backgrounds(analysis, 0)[:60]}
  present = {tuple(p) for p in flat}
  assert len(wanted & present) >= 0.9 * len(wanted), sorted(wanted - present)
  # Strong blue and strong red cells (the two ends of the scale) and the
  # guesses' green.
  r, g, b = (flat[:, i].astype(int) for i in range(3))
  assert ((b > 140) & (r < 120) & (g < 160)).sum() > 200
  assert ((r > 140) & (g < 110) & (b < 110)).sum() > 200
  assert ((g > r + 25) & (g > b + 15)).sum() > 200
