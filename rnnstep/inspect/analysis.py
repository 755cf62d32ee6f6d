"""What a model's neurons do over a text: the numbers behind rnnstep-inspect.

    import rnnstep
    analysis = rnnstep.inspect.analyze(model, "ROMEO:\\nBut, soft! what light...")
    best = analysis.offered[0]              # the most selective neuron
    analysis.activation(best.neuron)        # [T] values in [-1, 1]
    analysis.top_chars(4)                   # the 5 likeliest characters
    analysis.top_probs[4]                   #   after text[:5], their odds

A neuron is one unit of one layer's state: its h (the layer's output, in
[-1, 1] for every kind), or for an LSTM its cell state c, read as tanh(c) so
that it shares the scale (Karpathy, Johnson and Fei-Fei 2015 colour LSTM cells
the same way).

Which neurons are worth looking at (`rank`): a neuron is *selective* for a
property of the text when its activation correlates with it over the text
(Pearson r, per position). The properties (`FEATURES`) are the ones char-RNN
neurons are known to track: newlines, spaces, capitals, punctuation, vowels,
the position in the line and in the word, being inside quotes or brackets,
and lines in capitals (speaker names in a play). For each property that
varies in the text, the neuron most correlated with it (|r| >= 0.3) is
offered, strongest first; the rest of the offer is the neurons whose
activation varies most over the text (standard deviation), which catches
neurons that track something the list does not name.

Everything is computed in one compiled call (`model.functions.sequence_function`):
the states after every character and the logits there.
"""

import string
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from rnnstep import api
from rnnstep import states as states_lib
from rnnstep.decoding import options
from rnnstep.model import kinds
from rnnstep.model import functions as functions_lib
from rnnstep.model import network as model_lib

TOP_K = 5
DEFAULT_NUM_NEURONS = 12
# Below this |r| a neuron is not called selective for a property.
MIN_CORRELATION = 0.3


class Neuron(NamedTuple):
  """One unit of one layer's state.

  Attributes:
    layer: the recurrent layer, counted from 0.
    unit: the unit in that layer, counted from 0.
    state: "h" (the layer's output), or "c" (an LSTM's cell state).
  """
  layer: int
  unit: int
  state: str = "h"

  def __str__(self):
    """The `--neuron` spelling: LAYER:UNIT, or LAYER:UNIT:c."""
    suffix = "" if self.state == "h" else f":{self.state}"
    return f"{self.layer}:{self.unit}{suffix}"


def parse_neuron(spec: str, layers) -> Neuron:
  """Reads LAYER:UNIT (h) or LAYER:UNIT:c (an LSTM's cell state).

  Args:
    spec: the text, e.g. "0:117" or "1:5:c".
    layers: the model's `model_file.LayerConfig`s.

  Raises:
    ValueError: malformed, or no such layer, unit or state (the message does
      not repeat `spec`: callers name it their way).
  """
  parts = spec.split(":") if isinstance(spec, str) else []
  if (len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2])
      or (len(parts) == 3 and parts[2] not in functions_lib.STATE_NAMES)):
    raise ValueError("expected LAYER:UNIT (e.g. 0:117), or LAYER:UNIT:c for an "
                     "LSTM's cell state")
  neuron = Neuron(int(parts[0]), int(parts[1]), *parts[2:])
  if neuron.layer >= len(layers):
    raise ValueError(f"the model has {len(layers)} recurrent layer(s), "
                     "numbered from 0")
  layer = layers[neuron.layer]
  if neuron.unit >= layer.units:
    raise ValueError(f"layer {neuron.layer} has {layer.units} units, numbered "
                     "from 0")
  if neuron.state != "h" and layer.kind != "lstm":
    raise ValueError(f"only an LSTM layer has a cell state c; layer "
                     f"{neuron.layer} is a {kinds.get(layer.kind).display}")
  return neuron


def _since(text: str, resets: Callable[[str], bool]) -> np.ndarray:
  """Per position, how many characters since the last one that `resets`."""
  out, count = np.zeros(len(text)), 0
  for t, char in enumerate(text):
    count = 0 if resets(char) else count + 1
    out[t] = count
  return out


def _inside(text: str) -> np.ndarray:
  """1 inside double quotes or (), [], {} (the delimiters count as inside)."""
  out, depth, quoted = np.zeros(len(text)), 0, False
  for t, char in enumerate(text):
    depth += char in "([{"
    quoted ^= char == '"'
    out[t] = float(quoted or depth > 0 or char in ')]}"')
    depth = max(0, depth - (char in ")]}"))
  return out


def _capital_lines(text: str) -> np.ndarray:
  """1 where the line so far has letters and all are capitals ("ROMEO:")."""
  out, letters, lower = np.zeros(len(text)), 0, False
  for t, char in enumerate(text):
    if char == "\n":
      letters, lower = 0, False
    elif char.isalpha():
      letters += 1
      lower = lower or not char.isupper()
    out[t] = float(letters > 0 and not lower)
  return out


# The properties of the text at each position that neurons are ranked by:
# name -> text -> float [T]. Each is a fact about text[:t+1], what the state
# after position t has seen.
FEATURES: Dict[str, Callable[[str], np.ndarray]] = {
    "newline": lambda text: np.array([c == "\n" for c in text], float),
    "space": lambda text: np.array([c == " " for c in text], float),
    "capital letter": lambda text: np.array([c.isupper() for c in text], float),
    "punctuation": lambda text: np.array([c in string.punctuation
                                          for c in text], float),
    "vowel": lambda text: np.array([c in "aeiouAEIOU" for c in text], float),
    "position in line": lambda text: _since(text, lambda c: c == "\n"),
    "position in word": lambda text: _since(text, lambda c: not c.isalpha()),
    "inside quotes or brackets": _inside,
    "line in capitals": _capital_lines,
}


class Offered(NamedTuple):
  """A neuron the page offers, and why.

  Attributes:
    neuron: the Neuron.
    reason: "chosen", "selective" or "variable".
    feature: for a selective neuron the property it was picked for, else
      the one it correlates with most (None if no property varies).
    correlation: Pearson r with that property over the text.
    std: the standard deviation of its activation over the text.
  """
  neuron: Neuron
  reason: str
  feature: Optional[str]
  correlation: float
  std: float


class Analysis(NamedTuple):
  """The numbers of `analyze`.

  Attributes:
    text: the text analysed, T characters; for a token model, its T tokens'
      texts (a tuple of str).
    vocab: the model's characters in id order (a token model's: each
      token's text).
    layers: the model's `model_file.LayerConfig`s.
    states: one dict per layer, `{"h": [T, U]}` (+ `"c"` for an LSTM),
      float32: the state after each character (`rnnstep.hidden_states`).
    top_ids: int32 `[T, TOP_K]`: after character t, the likeliest next ids,
      likeliest first ("[UNK]" excluded, as generation never draws it).
    top_probs: float32 `[T, TOP_K]`: their probabilities (softmax at
      temperature 1, "[UNK]" excluded).
    next_probs: float32 `[T]`: the probability of the character that does
      come next (text[t+1]); NaN at the last position.
    features: `FEATURES` evaluated on the text, name -> float `[T]`.
    offered: the `Offered` neurons, chosen ones first, then ranked (`rank`).
  """
  text: str
  vocab: Tuple[str, ...]
  layers: tuple
  states: List[Dict[str, np.ndarray]]
  top_ids: np.ndarray
  top_probs: np.ndarray
  next_probs: np.ndarray
  features: Dict[str, np.ndarray]
  offered: Tuple[Offered, ...]

  def activation(self, neuron: Neuron) -> np.ndarray:
    """A neuron's value after each character, float32 `[T]` in [-1, 1]."""
    return _activation(self.states, neuron)

  def top_chars(self, t: int) -> List[str]:
    """The likeliest next characters after position t, likeliest first."""
    return [self.vocab[i] for i in self.top_ids[t]]


def _activation(states, neuron: Neuron) -> np.ndarray:
  values = states[neuron.layer][neuron.state][:, neuron.unit]
  return np.tanh(values) if neuron.state == "c" else values


def analyze(model: model_lib.Model, text: str,
            neurons: Sequence[Neuron] = (),
            num_neurons: int = DEFAULT_NUM_NEURONS,
            initial_state=None) -> Analysis:
  """Runs the model over `text` once and ranks its neurons.

  Args:
    model: the Model.
    text: a non-empty str in the model's vocabulary.
    neurons: neurons to offer first, whatever their rank: `Neuron`s, or
      "LAYER:UNIT[:c]" strings (`parse_neuron`).
    num_neurons: how many ranked neurons to offer after them (>= 0).
    initial_state: the state before the first character, as for
      `rnnstep.hidden_states` (one row); None is the zero state.

  Returns:
    The `Analysis`.

  Raises:
    ValueError: an empty text or unknown character (naming its position), a
      bad neuron, num_neurons or initial_state.
  """
  if not isinstance(text, str) or not text:
    raise ValueError("text must be a non-empty str")
  if not options.is_int(num_neurons) or num_neurons < 0:
    raise ValueError(f"num_neurons must be a non-negative integer, got "
                     f"{num_neurons!r}")
  layers = model.config.layers
  chosen = []
  for i, neuron in enumerate(neurons):
    spec = neuron if isinstance(neuron, str) else str(Neuron(*neuron))
    try:
      chosen.append(parse_neuron(spec, layers))
    except ValueError as e:
      raise ValueError(f"neurons[{i}]={spec!r}: {e}") from None
  ids = model.encode(text)[None]
  vocab = model.vocab
  if not model.is_characters:
    # A token model's positions are its tokens: each shown as the text it
    # adds, the features read at its last character.
    vocab = tuple(model.tokens.decode([i]) for i in range(model.vocab_size))
    text = tuple(vocab[i] for i in ids[0])
    if not ids.shape[1]:
      raise ValueError("text gives no tokens")
  states_lib.check_states_fit(model, 1, len(text), "text")
  state = api.check_initial_state(model, initial_state, 1)
  sequences, logits = functions_lib.sequence_function(model)(
      ids, np.ones(ids.shape, bool), state)
  states = [dict(zip(functions_lib.STATE_NAMES, (s.numpy()[0] for s in layer)))
            for layer in sequences]
  probs = _probabilities(logits.numpy()[0], model.has_unk)
  top_ids = np.argsort(-probs, axis=-1, kind="stable")[:, :TOP_K]
  next_probs = np.full(len(text), np.nan, np.float32)
  next_probs[:-1] = probs[np.arange(len(text) - 1), ids[0, 1:]]
  if model.is_characters:
    features = {name: feature(text) for name, feature in FEATURES.items()}
  else:
    joined = "".join(text)
    ends = np.maximum(np.cumsum([len(t) for t in text]) - 1, 0)
    features = ({name: feature(joined)[ends]
                 for name, feature in FEATURES.items()} if joined else
                {name: np.zeros(len(text)) for name in FEATURES})
  chosen = [_describe(states, features, n, "chosen") for n in chosen]
  ranked = rank(states, features, num_neurons,
                exclude={o.neuron for o in chosen})
  return Analysis(text, vocab, layers, states,
                  top_ids.astype(np.int32),
                  np.take_along_axis(probs, top_ids, -1).astype(np.float32),
                  next_probs, features, tuple(chosen) + tuple(ranked))


def _probabilities(logits: np.ndarray, has_unk: bool) -> np.ndarray:
  """Softmax over the last axis in float64, with "[UNK]" (id 0) excluded."""
  logits = logits.astype(np.float64)
  if has_unk:
    logits[..., 0] = -np.inf
  logits -= logits.max(-1, keepdims=True)
  exp = np.exp(logits)
  return exp / exp.sum(-1, keepdims=True)


def _all_neurons(states):
  """Every neuron, and their activations as one float64 matrix `[T, N]`."""
  neurons, columns = [], []
  for layer, layer_states in enumerate(states):
    for name, values in layer_states.items():
      neurons += [Neuron(layer, unit, name) for unit in range(values.shape[1])]
      columns.append(np.tanh(values) if name == "c" else values)
  return neurons, np.concatenate(columns, 1).astype(np.float64)


def _correlations(activations: np.ndarray, features: Dict[str, np.ndarray]):
  """Pearson r `[N, K]` of each neuron with each feature that varies.

  Returns:
    `(names of the K varying features, r)`; r is 0 for a constant neuron.
  """
  names = [name for name, values in features.items() if values.std() > 0]
  if not names:
    return names, np.zeros([activations.shape[1], 0])
  f = np.stack([features[name] for name in names], 1)
  f = (f - f.mean(0)) / f.std(0)
  a = activations - activations.mean(0)
  scale = activations.std(0)
  a = np.divide(a, scale, out=np.zeros_like(a), where=scale > 1e-7)
  return names, a.T @ f / len(f)


def _describe(states, features, neuron: Neuron, reason: str) -> Offered:
  """One neuron's `Offered` entry, however it was picked."""
  values = _activation(states, neuron).astype(np.float64)[:, None]
  names, r = _correlations(values, features)
  return _offered(neuron, reason, names, r[0], float(values.std()))


def _offered(neuron, reason, names, r_row, std, feature=None) -> Offered:
  """An `Offered` naming feature index `feature` (default: the one of
  largest |r| in `r_row`, over `names`)."""
  if not names:
    return Offered(neuron, reason, None, 0.0, std)
  if feature is None:
    feature = int(np.argmax(np.abs(r_row)))
  return Offered(neuron, reason, names[feature], float(r_row[feature]), std)


def rank(states, features: Dict[str, np.ndarray], num_neurons: int,
         exclude=frozenset()) -> List[Offered]:
  """The `num_neurons` most interesting neurons (see the module docstring).

  Args:
    states: per layer `{"h": [T, U], ...}` over one text.
    features: name -> float `[T]`, the properties to correlate with.
    num_neurons: how many to return.
    exclude: neurons not to return (offered already).

  Returns:
    First, for each varying feature, the neuron most correlated with it
    (|r| >= MIN_CORRELATION; strongest feature first, each neuron once);
    then the neurons of largest standard deviation. Ties go to the lower
    layer, state and unit.
  """
  neurons, activations = _all_neurons(states)
  names, r = _correlations(activations, features)
  std = activations.std(0)
  taken = set(exclude)
  offered = []

  def offer(index, reason, feature=None):
    offered.append(_offered(neurons[index], reason, names, r[index],
                            float(std[index]), feature))
    taken.add(neurons[index])

  strength = np.abs(r)  # [N, K]
  for k in np.argsort(-strength.max(0), kind="stable") if names else ():
    for index in np.argsort(-strength[:, k], kind="stable"):
      if strength[index, k] < MIN_CORRELATION or len(offered) >= num_neurons:
        break
      if neurons[index] not in taken:
        offer(index, "selective", int(k))
        break
  for index in np.argsort(-std, kind="stable"):
    if len(offered) >= num_neurons:
      break
    if neurons[index] not in taken:
      offer(index, "variable")
  return offered
