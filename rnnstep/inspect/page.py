"""The rnnstep-inspect page: one self-contained HTML file from an Analysis.

As in Karpathy's "The Unreasonable Effectiveness of Recurrent Neural Networks"
and Karpathy, Johnson and Fei-Fei (2015): the text, each character's
background coloured by one neuron's activation after it (blue -1, white 0,
red +1), and under each character the model's 5 likeliest next characters,
shaded by probability (white 0 to green 1; the one that does come next is
outlined). A <select> switches between the offered neurons, a checkbox hides
the guesses, and hovering a character shows its numbers.

The page loads nothing: its CSS, script and data are inline and it names only
local fonts. Every colour is computed here, once (the script only looks them
up in the palettes embedded with the data), so the page shows its first
neuron even with scripts off.
"""

import html
import json
import math
from typing import List, Optional, Tuple

import numpy as np

from rnnstep.model import kinds

# ColorBrewer RdBu's ends: negative activations blue, positive red.
_NEGATIVE = (33, 102, 172)
_POSITIVE = (178, 24, 43)
_PROBABLE = (0, 109, 44)  # Guesses: white (p = 0) to this green (p = 1).
# Palette steps: an activation v in [-1, 1] has colour _ACTIVATION[round((v +
# 1) * _STEPS)], a probability p has _PROBABILITY[round(p * _STEPS)].
_STEPS = 100
# Above this lightness-weighted darkness the text on a cell turns white.
_DARK = 0.55


def _mix(rgb, amount: float) -> Tuple[int, int, int]:
  """White mixed with `rgb`: amount 0 is white, 1 is `rgb`."""
  return tuple(round(255 + (c - 255) * amount) for c in rgb)


def _cell(rgb, amount: float) -> List[str]:
  """`[background, text colour]` as CSS hex for a cell shaded by `amount`."""
  background = _mix(rgb, amount)
  luma = (0.299 * background[0] + 0.587 * background[1]
          + 0.114 * background[2]) / 255
  return ["#%02x%02x%02x" % background, "#fff" if 1 - luma > _DARK else "#111"]


ACTIVATION_PALETTE = [
    _cell(_NEGATIVE if i < _STEPS else _POSITIVE, abs(i - _STEPS) / _STEPS)
    for i in range(2 * _STEPS + 1)]
PROBABILITY_PALETTE = [_cell(_PROBABLE, i / _STEPS) for i in range(_STEPS + 1)]


def activation_colours(value: float) -> List[str]:
  """`[background, text colour]` of an activation (clipped to [-1, 1]).

  The page's script computes the same (`Math.round` is floor(x + 0.5), not
  Python's round-half-even), from the same values (`page_value`).
  """
  value = min(1.0, max(-1.0, float(value)))
  return ACTIVATION_PALETTE[math.floor((value + 1) * _STEPS + 0.5)]


def page_value(value) -> float:
  """A number as the page holds it: 3 decimals."""
  return round(float(value), 3)


def probability_colours(p: float) -> List[str]:
  """`[background, text colour]` of a probability in [0, 1]."""
  p = min(1.0, max(0.0, float(p)))
  return PROBABILITY_PALETTE[math.floor(p * _STEPS + 0.5)]


def glyph(char: str) -> str:
  """How a text character is drawn: a newline as ↵, a tab as ⇥, other
  unprintable characters as ·, "[UNK]" as ⍰; the rest as themselves (a space
  is a blank, coloured cell)."""
  if char == "\n":
    return "\u21b5"
  if char == "\t":
    return "\u21e5"
  if len(char) != 1:
    return "\u2370"
  return char if char.isprintable() else "\u00b7"


def guess_glyph(char: str) -> str:
  """How a guessed character is drawn: as `glyph`, but a space as ␣."""
  return "\u2423" if char == " " else glyph(char)


def describe_layers(layers) -> str:
  return " \u2192 ".join(f"{kinds.get(l.kind).display} {l.units}"
                         for l in layers)


def option_label(offered) -> str:
  """The <select> entry of an `inspect.Offered`."""
  if offered.reason == "variable":
    return f"{offered.neuron}  varies most (std {offered.std:.2f})"
  if offered.reason == "selective":
    return f"{offered.neuron}  {offered.feature} (r={offered.correlation:+.2f})"
  return f"{offered.neuron}  chosen"


def explanation(offered, layers) -> str:
  """A sentence about an offered neuron, shown beside the <select>."""
  neuron = offered.neuron
  layer = layers[neuron.layer]
  which = ("the cell state c, shown as tanh(c)" if neuron.state == "c"
           else "h, the layer's output")
  text = (f"Layer {neuron.layer} ({kinds.get(layer.kind).display}, "
          f"{layer.units} units), unit {neuron.unit}: {which}. ")
  correlation = (f"\u201c{offered.feature}\u201d (r = "
                 f"{offered.correlation:+.2f})")
  if offered.reason == "selective":
    text += f"Picked as the neuron most correlated with {correlation}"
  else:
    text += ("Picked as one of the most variable" if offered.reason == "variable"
             else "Chosen (--neuron)")
    if offered.feature is not None:
      text += f"; it correlates most with {correlation}"
  return text + f"; std {offered.std:.2f} over the text."


_STYLE = """
body { margin: 0; font: 14px system-ui, -apple-system, "Segoe UI", "DejaVu Sans",
  sans-serif; color: #111; background: #fff; }
header { position: sticky; top: 0; z-index: 1; background: #f4f4f4;
  border-bottom: 1px solid #ccc; padding: 8px 14px; }
h1 { font-size: 16px; margin: 0 0 4px; }
.about, .notice { margin: 2px 0; color: #444; }
.notice { color: #8a4b00; }
.controls { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center;
  margin: 6px 0 2px; }
select { font: 13px ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
#why { color: #333; }
.legend { white-space: nowrap; color: #444; }
.bar { display: inline-block; width: 120px; height: 12px; vertical-align: middle;
  border: 1px solid #999; margin: 0 4px;
  background: linear-gradient(to right, #2166ac, #fff, #b2182b); }
.pbar { background: linear-gradient(to right, #fff, #006d2c); width: 60px; }
#info { font: 13px ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  color: #222; min-height: 1.3em; margin-top: 4px; white-space: pre; }
#text { font: 15px ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  padding: 12px 14px; line-height: 1; }
.ch { display: inline-block; vertical-align: top; margin: 0 0 7px; cursor: default; }
.ch > span { display: block; width: 1.15em; height: 1.3em; line-height: 1.3em;
  text-align: center; white-space: pre; }
.ch > .g { font-size: 10px; height: 1.25em; line-height: 1.25em; }
.g.hit { outline: 1px solid #000; outline-offset: -1px; font-weight: bold; }
.ch > .a { margin-bottom: 2px; }
.ch:hover > .a { outline: 2px solid #000; outline-offset: -2px; }
#text.plain .g { display: none; }
#text.plain .ch { margin-bottom: 2px; }
"""

_SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById("data").textContent);
  var select = document.getElementById("neuron");
  var why = document.getElementById("why");
  var info = document.getElementById("info");
  var text = document.getElementById("text");
  var cells = text.querySelectorAll(".ch > .a");
  var steps = data.steps;
  function colours(v) {
    v = Math.max(-1, Math.min(1, v));
    return data.palette[Math.round((v + 1) * steps)];
  }
  function show(k) {
    var values = data.neurons[k].values;
    for (var i = 0; i < cells.length; i++) {
      var c = colours(values[i]);
      cells[i].style.backgroundColor = c[0];
      cells[i].style.color = c[1];
    }
    why.textContent = data.neurons[k].why;
  }
  select.addEventListener("change", function () { show(+select.value); });
  document.getElementById("guesses").addEventListener("change", function (e) {
    text.classList.toggle("plain", !e.target.checked);
  });
  function quote(ch) { return JSON.stringify(ch); }
  text.addEventListener("mouseover", function (e) {
    var ch = e.target.closest(".ch");
    if (!ch) return;
    var i = +ch.dataset.i, k = +select.value;
    var line = "position " + i + ": " + quote(data.text[i]) +
        "   activation " + data.neurons[k].values[i].toFixed(3) + "   next: ";
    var guesses = data.guesses[i];
    for (var j = 0; j < guesses.length; j++) {
      line += quote(guesses[j][0]) + " " + guesses[j][1].toFixed(3) + "  ";
    }
    if (i + 1 < data.text.length) {
      line += "  actual " + quote(data.text[i + 1]) + " " +
          data.next[i].toFixed(3);
    }
    info.textContent = line;
  });
  show(+select.value);
})();
"""


def render(analysis, title: str, notice: Optional[str] = None) -> str:
  """The page for an `inspect.Analysis`, as one HTML string.

  Args:
    analysis: what `inspect.analyze` returned (at least one neuron offered).
    title: what the page is about (e.g. the model file's name).
    notice: a line to show under the title (e.g. that the text was cut).

  Returns:
    The HTML (UTF-8 text; no external resources).

  Raises:
    ValueError: no neuron is offered.
  """
  if not analysis.offered:
    raise ValueError("no neuron to show: give neurons or num_neurons >= 1")
  text = analysis.text
  values = [[page_value(v) for v in analysis.activation(o.neuron)]
            for o in analysis.offered]
  parts = []
  for t, char in enumerate(text):
    background, colour = activation_colours(values[0][t])
    newline = char == "\n"
    cells = [f'<span class="{"ch nl" if newline else "ch"}" data-i="{t}">'
             f'<span class="a" style="background-color:{background};'
             f'color:{colour}">{html.escape(glyph(char))}</span>']
    actual = text[t + 1] if t + 1 < len(text) else None
    for guess, p in zip(analysis.top_chars(t), analysis.top_probs[t]):
      background, colour = probability_colours(p)
      hit = " hit" if guess == actual else ""
      cells.append(f'<span class="g{hit}" style="background-color:{background};'
                   f'color:{colour}">{html.escape(guess_glyph(guess))}</span>')
    parts.append("".join(cells) + "</span>" + ("<br>" if newline else ""))

  data = {
      "steps": _STEPS,
      "palette": ACTIVATION_PALETTE,
      "text": text,
      "neurons": [{"label": option_label(o),
                   "why": explanation(o, analysis.layers),
                   "values": neuron_values}
                  for o, neuron_values in zip(analysis.offered, values)],
      "guesses": [[[g, page_value(p)] for g, p in
                   zip(analysis.top_chars(t), analysis.top_probs[t])]
                  for t in range(len(text))],
      "next": [None if np.isnan(v) else page_value(v)
               for v in analysis.next_probs],
  }
  # Inside <script>, "</" could end the element: JSON may spell "<" as \\u003c.
  data_json = json.dumps(data, ensure_ascii=False,
                         separators=(",", ":")).replace("<", "\\u003c")
  options = "".join(
      f'<option value="{k}">{html.escape(option_label(o))}</option>'
      for k, o in enumerate(analysis.offered))
  notice_html = (f'<p class="notice">{html.escape(notice)}</p>' if notice
                 else "")
  about = (f"{describe_layers(analysis.layers)} \u00b7 {len(text)} characters "
           "\u00b7 colour: the neuron's value after each character \u00b7 "
           "under it: the 5 likeliest next characters (the one that comes "
           "next is outlined)")
  return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rnnstep-inspect: {html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<header>
<h1>rnnstep-inspect: {html.escape(title)}</h1>
<p class="about">{html.escape(about)}</p>
{notice_html}
<div class="controls">
<label>Neuron <select id="neuron">{options}</select></label>
<span class="legend">-1<span class="bar"></span>+1</span>
<span class="legend">p 0<span class="bar pbar"></span>1</span>
<label><input type="checkbox" id="guesses" checked> top-5 guesses</label>
</div>
<div id="why">{html.escape(explanation(analysis.offered[0],
                                       analysis.layers))}</div>
<div id="info">Hover a character for its numbers.</div>
</header>
<main id="text">{"".join(parts)}</main>
<script type="application/json" id="data">{data_json}</script>
<script>{_SCRIPT}</script>
</body>
</html>
"""
