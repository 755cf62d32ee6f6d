"""RWKV-7 (#50): KerasHub presets and official `.pth` checkpoints, exact.

References are KerasHub's own code and the official equations, never
rnnstep's numbers: tools/make_rwkv7_fixtures.py (run with keras-hub 0.32.0
in a venv of its own) stored a small RWKV7CausalLM's preset, the same
weights as an official RWKV-LM state dict, KerasHub's `call_with_cache`
logits and `generate` greedy ids, the logits of a torch transcription of
the official RNN-mode equations, and `RWKVTokenizer`'s ids for some texts.
The front ends (stream, the serving engine, the SavedModel) are compared
with `rnnstep.generate`.

Every test shares the two module-scoped models (one architecture: their
compiled programs are shared too).
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import rnnstep
from rnnstep import convert
from rnnstep.convert import rwkv7 as rwkv7_reader
from rnnstep.convert import torch_state_dict
from rnnstep.convert import torch_zip
from rnnstep.engine import loop
from rnnstep.engine import request as request_lib
from rnnstep.model import kinds
from rnnstep.model import model_file
from rnnstep.model import network as network_lib
from rnnstep.model import rwkv7
from tests.support import cli
from tests.support import torch_files
from tests.support.tiers import quick_params

DATA = pathlib.Path(__file__).parent / "data" / "rwkv7"
PRESET = str(DATA / "preset")
PTH = str(DATA / "rwkv7.pth")
WEIGHTS = str(DATA / "preset" / "model.weights.h5")
VOCAB = str(DATA / "preset" / "assets" / "tokenizer" / "vocabulary.txt")
PATHS = (False, True, "elementwise")
# The graph path stays in the quick tier; the others compile (XLA) for long.
PATH_CASES = quick_params(PATHS, False)
# The XLA path compiles a program per batch bucket and per option set
# (minutes here): the greedy test covers it; the sweeps below run the graph
# path (quick) and the elementwise one.
SWEEP_CASES = quick_params((False, "elementwise"), False)


@pytest.fixture(scope="module")
def reference():
  return dict(np.load(DATA / "reference.npz"))


@pytest.fixture(scope="module")
def cases():
  with open(DATA / "tokenizer.json", encoding="utf-8") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def preset_model():
  return rnnstep.load(PRESET)


@pytest.fixture(scope="module")
def pth_file(tmp_path_factory):
  """The official three-block `.pth`, converted."""
  path = tmp_path_factory.mktemp("rwkv7") / "official.npz"
  convert.convert(PTH, path, vocab=VOCAB)
  return str(path)


@pytest.fixture(scope="module")
def pth_model(pth_file):
  return rnnstep.load(pth_file)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ---------------------------------------------------------------- tokenizer


def test_world_tokenizer_is_keras_hub_s(preset_model, cases):
  tokens = preset_model.tokens
  assert tokens.kind == "world"
  for text, ids in zip(cases["texts"], cases["ids"], strict=True):
    assert tokens.encode(text).tolist() == ids, text
    assert tokens.decode(ids) == text
  # "\n\n" is one token, which KerasHub's RWKVTokenizer names its end token
  # (its chat convention; the vocabulary's end-of-text token is id 0).
  assert tokens.encode("\n\n").tolist() == [cases["end_token_id"]]


def test_world_stream_holds_back_an_incomplete_character(preset_model):
  """A token of two bytes of a three-byte character: nothing until the
  byte that completes it; what never completes reads as U+FFFD."""
  tokens = preset_model.tokens
  partial = tokens.encode("中").tolist()
  two = [i for i, p in enumerate(tokens.pieces) if p == "中".encode()[:2]]
  last = [tokens.pieces.index("中".encode()[2:])]
  stream = tokens.stream()
  assert stream.push(two) == ""
  assert stream.push(last) == "中"
  assert partial != two + last  # The longest match is the whole character.
  stream = tokens.stream()
  assert stream.push(two) == ""
  assert stream.finish() == "\ufffd"
  assert tokens.decode(two + two + last) == "\ufffd中"
  # Ids without a token (id 0, the end-of-text token; ids past the last)
  # add nothing.
  assert tokens.decode([0, len(tokens.vocab) - 1]) == ""


def test_world_vocabulary_file_is_read_as_data(tmp_path):
  bad = tmp_path / "v.txt"
  for line, message in (("1 __import__('os') 1", "not a str or bytes"),
                        ("1 'ab' 3", "has 2 bytes, the line says 3"),
                        ("999 'a' 1", "outside the model's ids"),
                        ("1 'a' 1\n2 'a' 1", "repeats")):
    bad.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
      rwkv7_reader.read_world_vocabulary(bad.read_bytes(), 16, str(bad))


# A text of what a tokenizer can get wrong: CJK, accents (composed and
# combining), emoji with a modifier, CRLF, tabs, control characters, and
# the line ends universal newlines do not split at.
MIXED_TEXT = ("Hello, 世界! Ça va? naïve cafe\u0301 — 日本語とカタカナ 😀👍🏽\r\n"
              "\tUser: hi\r\n\nAssistant:  x\x00\x01\x1b\x7f\x0b\x0c\x85"
              "\u2028 end\n\n")


def _pth_arrays() -> dict:
  """The official `.pth` fixture's tensors, by name (read as rnnstep's
  converter reads a `.pth`: no unpickling)."""
  obj, _, close = torch_zip.read_zip(PTH)
  try:
    return {name: tensor.read(PTH, name) for name, tensor in
            torch_state_dict.find_state_dict(obj, PTH).tensors.items()}
  finally:
    close()


def test_the_real_world_vocabulary_converts_and_tokenizes_as_rwkv_s(
    tmp_path):
  """`rwkv_vocab_v20230424.txt` as RWKV-LM and the `rwkv` package ship it
  (65,529 lines ending in CRLF) converts an official-layout `.pth` of 65,536
  ids, and the model's tokenizer gives the ids of the `rwkv` package's own
  tokenizer (`TRIE_TOKENIZER`) and decodes them back."""
  import rwkv  # pylint: disable=g-import-not-at-top
  from rwkv.rwkv_tokenizer import TRIE_TOKENIZER  # pylint: disable=g-import-not-at-top
  vocab = pathlib.Path(rwkv.__file__).parent / "rwkv_vocab_v20230424.txt"
  assert vocab.read_bytes()[:14] == b"1 '\\x00' 1\r\n2 "
  # The test model's weights with the real vocabulary's 65,536 rows.
  arrays = _pth_arrays()
  rng = np.random.default_rng(0)
  for name in ("emb.weight", "head.weight"):
    arrays[name] = rng.normal(0, 0.1, (65536, arrays[name].shape[1]))
  pth = tmp_path / "rwkv7-world.pth"
  torch_files.write_state_dict(pth, arrays)
  convert.convert(pth, tmp_path / "m.npz", vocab=vocab)
  tokens = convert.read_any(str(tmp_path / "m.npz")).tokens
  reference = TRIE_TOKENIZER(str(vocab))
  ids = reference.encode(MIXED_TEXT)
  assert tokens.encode(MIXED_TEXT).tolist() == ids
  assert tokens.decode(ids) == reference.decode(ids) == MIXED_TEXT
  # Id 0 (the end-of-text token) and the ids past the file's last have no
  # token: never encoded, and they add no text.
  assert 0 not in ids
  assert tokens.decode([0] + ids + [0, 65535]) == MIXED_TEXT


# ---------------------------------------------------------------- the math


@pytest.mark.parametrize("which", ["preset", "pth"])
def test_logits_match_keras_hub_and_the_official_equations(
    which, preset_model, pth_model, reference):
  model = preset_model if which == "preset" else pth_model
  ids = np.concatenate([reference["prompt_ids"], reference["keras_greedy"]])
  got = rnnstep.logits(model, ids)[0]
  for name in ("keras_logits", "official_logits"):
    np.testing.assert_allclose(got, reference[name], rtol=1e-5, atol=1e-5,
                               err_msg=name)


def test_the_big_matrices_are_held_transposed_and_given_back_as_filed(
    pth_model):
  """A model holds R, K, V, O and the feed-forward's two `[out, in]`
  (`Kind.held_transposed`: XLA's matrix-vector product reads that layout
  faster), and `Model.tensors` gives the file's `[in, out]` back, bit for
  bit; an int8 model's kernels keep their own layout."""
  filed = model_file.read(pth_model.source).tensors
  for key, value in pth_model.tensors().items():
    np.testing.assert_array_equal(value, filed[key], err_msg=key)
  held = kinds.get("rwkv7").held_transposed
  assert set(held) == {"receptance", "key", "value", "output", "ffn_key",
                       "ffn_value"}
  for name, weight in pth_model.layer_weights[0].items():
    want = filed[f"layer0_{name}"]
    np.testing.assert_array_equal(
        weight.numpy(), np.swapaxes(want, -1, -2) if name in held else want,
        err_msg=name)
  int8 = rnnstep.load(pth_model.source, weights_dtype="int8")
  assert ({name: int8.layer_weights[0][name].values.shape for name in held}
          == {name: filed[f"layer0_{name}"].shape for name in held})


@pytest.mark.parametrize("path", PATH_CASES)
def test_every_path_generates_keras_hub_s_greedy_ids(path, preset_model,
                                                     pth_model, reference,
                                                     cases):
  """Greedy text is the decoded greedy ids of `RWKV7CausalLM.generate` (and
  of the official equations), and its score is their log-likelihood under
  KerasHub's logits."""
  greedy = reference["keras_greedy"]
  np.testing.assert_array_equal(greedy, reference["official_greedy"])
  want = preset_model.tokens.decode(greedy)
  start = len(reference["prompt_ids"]) - 1
  logp = _log_softmax(reference["keras_logits"])
  want_score = sum(logp[start + t, i] for t, i in enumerate(greedy))
  for model in (preset_model, pth_model):
    texts, scores = rnnstep.generate(
        model, [cases["prompt"]], len(greedy), temperature=0.0,
        return_scores=True, jit_compile=path)
    assert texts == [want]
    np.testing.assert_allclose(scores[0], want_score, rtol=1e-5)


@pytest.mark.parametrize("path", PATH_CASES)
def test_loglikelihood_is_keras_hub_s(path, preset_model, reference, cases):
  """`loglikelihood` and `loglikelihood_rolling` are sums of KerasHub's
  log-softmax logits over the prompt's tokens (the greedy ids that follow
  are bytes of no text), and `is_greedy` is their argmax."""
  ids = reference["prompt_ids"]
  text = cases["prompt"]
  assert preset_model.encode(text).tolist() == ids.tolist()
  context = preset_model.tokens.decode(ids[:2])
  assert preset_model.encode(context).tolist() == ids[:2].tolist()
  logp = _log_softmax(reference["keras_logits"].astype(np.float64))
  step = lambda t: logp[t - 1, ids[t]]
  ((score, is_greedy),) = rnnstep.loglikelihood(
      preset_model, [(context, text[len(context):])], jit_compile=path)
  np.testing.assert_allclose(score, step(2) + step(3), rtol=1e-5)
  assert is_greedy == all(logp[t - 1].argmax() == ids[t] for t in (2, 3))
  (rolling,) = rnnstep.loglikelihood_rolling(preset_model, [text],
                                             jit_compile=path)
  np.testing.assert_allclose(rolling, sum(map(step, range(1, len(ids)))),
                             rtol=1e-5)


@pytest.mark.exhaustive  # XLA programs (minutes); the sweeps cover the rest.
def test_xla_path_streams_with_stop_regex_and_penalties(preset_model):
  """The XLA path (left out of the sweeps below: each option set compiles
  for long) with every kind of option in one call: streamed text equals
  the graph path's `generate`."""
  prompts = ["the", "中"]
  kwargs = dict(seed=3, temperature=1.0, stop=["he", "an"],
                regex="[a-z ]+", repetition_penalty=1.3,
                no_repeat_ngram_size=2, top_k=20)
  want = rnnstep.generate(preset_model, prompts, 20, jit_compile=False,
                          **kwargs)
  chunks = list(rnnstep.stream(preset_model, prompts, 20, jit_compile=True,
                               **kwargs))
  assert ["".join(c[i] for c in chunks) for i in range(2)] == want
  assert all(set(t) <= set("abcdefghijklmnopqrstuvwxyz ") for t in want)


@pytest.mark.slow  # Six rows primed eagerly (seconds of CPU).
def test_chunked_priming_holds_each_row_at_its_own_length(preset_model):
  """XLA's priming in chunks (`loop.primes_in_chunks`) of a batch padded to
  a chunked width: each row's state is the one its own prompt, unpadded and
  unbucketed, primes to on the graph path (rows of 1, 3, one chunk less
  one, one chunk and more, and the whole width). Run as a TF graph here:
  the XLA path's text is `test_xla_bucketed_prompt_lengths_share_a_program`."""
  architecture = preset_model.architecture
  weights = preset_model.network_weights()
  chunked = network_lib.network_of(architecture, weights,
                                   one_xla_program=True)
  graph = network_lib.network_of(architecture, weights)
  assert loop.primes_in_chunks(chunked) and not loop.primes_in_chunks(graph)
  chunk = request_lib.PRIME_CHUNK
  lengths = [1, 3, chunk, chunk + 1, 2 * chunk + 5, 4 * chunk]
  width = request_lib.chunked_width(max(lengths))
  rng = np.random.default_rng(2)
  ids = rng.integers(1, preset_model.vocab_size, [len(lengths), width],
                     dtype=np.int32)
  batched = loop.prime(chunked, request_lib.Prompts(
      tf.constant(ids), tf.constant(lengths)), unconsumed=1)
  for row, length in enumerate(lengths):
    alone = loop.prime(graph, request_lib.Prompts(
        tf.constant(ids[row:row + 1, :length]), tf.constant([length])),
                       unconsumed=1)
    # Float32 rounding of up to 4 chunks' sums against one unroll's: states
    # of order 1 differ by a few units in their last place.
    for got, want in zip(tf.nest.flatten(batched), tf.nest.flatten(alone)):
      np.testing.assert_allclose(got[row], want[0], rtol=2e-5, atol=5e-6,
                                 err_msg=f"length {length}")


# Generates at prompt lengths of one chunked width on the XLA path, greedy
# and seeded, against the graph path, counting the generation's XLA
# compilations from XLA's own module dumps (one module per compilation).
BUCKET_SCRIPT = textwrap.dedent("""
    import glob, json, os, sys
    import numpy as np
    import rnnstep
    dump, preset = sys.argv[1:]
    model = rnnstep.load(preset)

    def compiled():
      names = glob.glob(os.path.join(dump, "*generate_impl*"))
      return len({os.path.basename(n).split(".")[0] for n in names})

    rng = np.random.default_rng(0)
    result = []
    for length in (65, 100, 128):  # One chunked width: 128.
      ids = rng.integers(97, 123, length)  # Letters: one token each.
      text = bytes(ids.astype(np.uint8)).decode()
      assert len(model.encode(text)) == length
      for kwargs in (dict(temperature=0.0), dict(seed=5, temperature=1.3)):
        xla, graph = (rnnstep.generate(model, text, 16, jit_compile=path,
                                       **kwargs) for path in (True, False))
        result.append([length, xla == graph, compiled()])
    print(json.dumps(result))
""")


@pytest.mark.exhaustive  # A fresh interpreter and an XLA compile (minutes).
def test_xla_bucketed_prompt_lengths_share_a_program(tmp_path):
  """Prompt lengths that share a chunked width (`request.chunked_width`)
  run on one XLA program, and their texts are the graph path's."""
  root = pathlib.Path(__file__).parent.parent
  result = subprocess.run(
      [sys.executable, "-c", BUCKET_SCRIPT, str(tmp_path), PRESET],
      capture_output=True, text=True, timeout=1200, cwd=root,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
           "XLA_FLAGS": f"--xla_dump_to={tmp_path} "
                        "--xla_dump_hlo_module_re=.*generate_impl.*"})
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(result.stdout.strip().splitlines()[-1])
  assert [same for _, same, _ in rows] == [True] * len(rows), rows
  assert [count for _, _, count in rows] == [1] * len(rows), rows


@pytest.mark.parametrize("path", SWEEP_CASES)
def test_batch_rows_and_continued_states_equal_single_runs(path,
                                                           preset_model):
  """Rows of different prompt lengths each equal their prompt alone (the
  matrix state is masked like any state), and a state carried through
  `hidden_states` continues the logits exactly."""
  prompts = ["Hello the poet said", "中文", "a"]
  alone = [rnnstep.generate(preset_model, p, 12, temperature=0.0,
                            jit_compile=False) for p in prompts]
  assert rnnstep.generate(preset_model, prompts, 12, temperature=0.0,
                          jit_compile=path) == alone
  if path is not False:
    return
  ids = preset_model.encode("Hello the poet said the café 中文")
  states = rnnstep.hidden_states(preset_model, ids[:3])
  assert list(states[0]) == ["h", "att_x0", "wkv0", "ffn_x0", "att_x1",
                             "wkv1", "ffn_x1", "att_x2", "wkv2", "ffn_x2"]
  last = [{k: v[:, -1] for k, v in layer.items()} for layer in states]
  whole = rnnstep.logits(preset_model, ids)[0]
  rest = rnnstep.logits(preset_model, ids[3:], initial_state=last)[0]
  np.testing.assert_allclose(rest, whole[3:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", SWEEP_CASES)
def test_stream_stop_and_regex_over_the_world_vocabulary(path, preset_model):
  prompts = ["the", "中"]
  generate = lambda **kw: rnnstep.generate(preset_model, prompts, 24, seed=3,
                                           temperature=1.0, **kw)
  free = generate(jit_compile=False)
  chunks = list(rnnstep.stream(preset_model, prompts, 24, seed=3,
                               temperature=1.0, jit_compile=path))
  assert ["".join(c[i] for c in chunks) for i in range(2)] == free
  # Stop strings taken from the rows' own texts end each row there (not
  # spanning a U+FFFD, which stands for bytes no stop string holds).
  stops = [next(t[i:i + 2] for i in range(3, len(t) - 1)
                if "\ufffd" not in t[i:i + 2]) for t in free]
  for text, full in zip(generate(stop=stops, jit_compile=path), free):
    cut = min((full.find(s) + len(s) for s in stops if s in full),
              default=len(full))
    assert text == full[:cut]
  texts = generate(regex="[a-z ]+", jit_compile=path)
  assert texts == generate(regex="[a-z ]+", jit_compile=False)
  assert all(set(t) <= set("abcdefghijklmnopqrstuvwxyz ") for t in texts)


def test_the_servers_xla_calls_take_the_librarys_chunked_prompt_widths(
    preset_model):
  """Under XLA the server's calls pad RWKV-7 prompt pieces to powers of two,
  the widths `request.chunked_width` gives the library's requests, so its
  programs prime in the same chunks (`loop.primes_in_chunks`)."""
  from rnnstep.serve import calls as calls_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.serve import scheduler as scheduler_lib  # pylint: disable=g-import-not-at-top
  for chunk_steps, max_prompt in ((8, 32), (40, 300), (200, 1024)):
    calls = calls_lib.ChunkCalls(
        preset_model, path="xla", max_batch=2, chunk_steps=chunk_steps,
        max_tokens_limit=32, max_prompt_tokens=max_prompt,
        stats=scheduler_lib.Stats())
    assert calls.generator.chunked_prompts
    for longest in range(1, calls.prime_chars + 1):
      width = calls.prompt_width(longest)
      assert width >= longest
      assert width == request_lib.chunked_width(width), (chunk_steps, longest)


# ---------------------------------------------------------------- readers


def test_a_weights_h5_alone_reads_as_its_preset(tmp_path):
  """A preset's `model.weights.h5`, and what `RWKV7CausalLM.save_weights`
  writes (the same datasets with the task's optimizer variables beside:
  keras-hub 0.32.0, checked), read with the world vocabulary file into the
  preset's model: its config from the tensors' shapes."""
  import h5py  # pylint: disable=g-import-not-at-top
  preset = convert.read_any(PRESET)
  causal_lm = tmp_path / "causal_lm.weights.h5"
  causal_lm.write_bytes(pathlib.Path(WEIGHTS).read_bytes())
  with h5py.File(causal_lm, "a") as f:
    f.create_dataset("optimizer/vars/0", data=np.float32(2e-5))
    f.create_dataset("optimizer/vars/1", data=np.int64(0))
  for path in (WEIGHTS, str(causal_lm)):
    read = convert.read_any(path, vocab=VOCAB)
    assert read.config == preset.config
    assert read.tokens.vocab == preset.tokens.vocab
    assert sorted(read.tensors) == sorted(preset.tensors)
    for name, tensor in preset.tensors.items():
      np.testing.assert_array_equal(read.tensors[name], tensor, name)
  assert "RWKV7Backbone .weights.h5" in convert.describe(WEIGHTS).format
  with pytest.raises(convert.VocabularyRequired, match="weights file holds no"):
    convert.read_any(WEIGHTS)
  with pytest.raises(FileNotFoundError, match="nothere.txt: no such "):
    convert.read_any(WEIGHTS, vocab=str(tmp_path / "nothere.txt"))


def test_readers_refuse_in_one_line(tmp_path):
  with pytest.raises(convert.VocabularyRequired, match="world vocabulary"):
    convert.read_any(PTH)
  with pytest.raises(convert.VocabularyNotAllowed, match="holds its own"):
    convert.read_any(PRESET, vocab=VOCAB)
  config = json.loads((DATA / "preset" / "config.json").read_text())
  bad = tmp_path / "preset"
  bad.mkdir()
  for name in ("model.weights.h5", "assets"):
    os.symlink(DATA / "preset" / name, bad / name)
  config["config"]["hidden_size"] = 30
  (bad / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="multiple of its head_size"):
    convert.read_any(str(bad))
  summary = convert.describe(PTH)
  assert summary.config.layers[0].kind == "rwkv7"
  assert "official RWKV-7" in summary.format


def test_web_export_refuses_in_one_line(preset_model):
  """The web runtime has no RWKV-7 step."""
  from rnnstep.exporters import web  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="web export"):
    web.check_exportable(preset_model)


# The LiteRT artifact's cases: rnnstep-generate's warm path runs them.
# The last, 43 tokens, primes over two of the artifact's chunks
# (`request.STEPWISE_PRIME_CHUNK`), the second partly; the others in one.
LITERT_PROMPTS = ["Hello the poet said", "中文", "A",
                  "Hello the poet said, and the world said hello to the poet"
                  " and the world said hello to the poet once more"]
LITERT_CASES = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, seed=5),
    "top_k": dict(temperature=1.0, seed=-3, top_k=5),
    "options": dict(temperature=0.9, seed=2**31 - 1, top_p=0.9,
                    repetition_penalty=1.3, no_repeat_ngram_size=2,
                    stop=["he"]),
    "beams": dict(num_beams=2),
}


@pytest.fixture(scope="module")
def deep_pth_file(tmp_path_factory):
  """A 12-block official `.pth` (the 0.1B model's depth), converted: the
  fixture's three blocks four times over, block 0's ln0 once."""
  arrays = _pth_arrays()
  deep = {name: array for name, array in arrays.items()
          if not name.startswith("blocks.")}
  for block in range(12):
    prefix = f"blocks.{block % 3}."
    deep.update((f"blocks.{block}.{name[len(prefix):]}", array)
                for name, array in arrays.items() if name.startswith(prefix)
                and (block == 0 or ".ln0." not in name))
  folder = tmp_path_factory.mktemp("rwkv7_deep")
  torch_files.write_state_dict(folder / "deep.pth", deep)
  convert.convert(folder / "deep.pth", folder / "deep.npz", vocab=VOCAB)
  return str(folder / "deep.npz")


@pytest.fixture(scope="module")
def deep_pth_model(deep_pth_file):
  return rnnstep.load(deep_pth_file)


def _filled_artifact(model_file_path, cache):
  """A model file's entry in a compiled-artifact cache at `cache`, built as
  a cold run's child builds it (`fill`, here in process) and, as for an
  artifact past `runner.BUILTIN_KERNELS_FROM_BYTES` (lowered here), with
  its weights packed for XNNPACK: (the cache folder, the entry's files'
  base path)."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import fill as compiled_fill  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner as litert_runner  # pylint: disable=g-import-not-at-top
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("RNNSTEP_CACHE_DIR", str(cache))
    patch.setattr(litert_runner, "BUILTIN_KERNELS_FROM_BYTES", 0)
    the_key = compiled_cache.key(model_file_path,
                                 compiled_cache.runtime_version())
    os.makedirs(os.path.dirname(compiled_cache.entry_base(the_key)),
                mode=0o700)
    os.chmod(cache, 0o700)
    assert compiled_fill.fill(model_file_path, the_key) == "built"
    with compiled_cache.open_entry(the_key) as artifact:
      assert artifact.weight_cache is not None
    base = compiled_cache.entry_base(the_key)
  return cache, base


@pytest.fixture(scope="module")
def pth_artifact(pth_file, tmp_path_factory):
  """The official `.pth`'s entry (`_filled_artifact`): the LiteRT text test
  runs its files and the warm command line the entry (one conversion for
  both)."""
  return _filled_artifact(pth_file,
                          tmp_path_factory.mktemp("rwkv7_cache") / "cache")


@pytest.fixture(scope="module")
def deep_artifact(deep_pth_file, tmp_path_factory):
  """The 12-block model's entry (`_filled_artifact`)."""
  cache = tmp_path_factory.mktemp("rwkv7_deep_cache") / "cache"
  return _filled_artifact(deep_pth_file, cache)


def test_the_converter_s_running_maximum_is_a_scan_s():
  """The LiteRT export's unroll finds each masked position's last kept one
  without a scan (`rwkv7._running_max`): numpy's running maximum."""
  marks = np.random.default_rng(3).integers(-1, 40, size=(16, 5))
  np.testing.assert_array_equal(rwkv7._running_max(tf.constant(marks)),
                                np.maximum.accumulate(marks, axis=0))


# A model's LiteRT artifact: by default the official .pth's, the warm
# command line's entry, its weights packed (the KerasHub preset and the
# 12-block .pth are exhaustive: a conversion each, the 12 blocks' 17 CPU-s).
@pytest.mark.slow
@pytest.mark.parametrize("which", quick_params(["preset", "pth", "12 blocks"],
                                               "pth"))
def test_litert_artifact_gives_the_library_s_text(which, request, tmp_path):
  """The flatbuffer, run as rnnstep-generate's warm path runs it (inputs
  built with numpy), gives `generate`'s greedy, sampled and beam text
  (the converter once dropped the feed-forward's ReLU: `_squared_relu`),
  at 12 blocks too (TensorFlow 2.21's converter aborted the process from 9
  blocks on before the step's tensors were stacked:
  `RWKV7Cell.blocks_sliced_in_step`)."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import export as litert  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner as litert_runner  # pylint: disable=g-import-not-at-top
  if which != "preset":  # An entry the cache's fill built.
    model = request.getfixturevalue(
        {"pth": "pth_model", "12 blocks": "deep_pth_model"}[which])
    base = request.getfixturevalue(
        {"pth": "pth_artifact", "12 blocks": "deep_artifact"}[which])[1]
    path, packed = base + ".tflite", base + compiled_cache.PACKED_SUFFIX
    with open(path, "rb") as f:
      flatbuffer = f.read()
  else:
    model = request.getfixturevalue("preset_model")
    flatbuffer = litert.convert(model)
    path, packed = str(tmp_path / "m.tflite"), str(tmp_path / "m.xnnpack")
    with open(path, "wb") as f:
      f.write(flatbuffer)
    litert_runner.pack_weights(path, packed)
  # XNNPACK's kernels (small artifacts), the builtin ones, and XNNPACK on
  # weights packed once into a file (large artifacts in the cache).
  ways = {"xnnpack": dict(flatbuffer=flatbuffer, builtin_kernels=False),
          "builtin": dict(flatbuffer=flatbuffer, builtin_kernels=True),
          "packed": dict(flatbuffer=path, weight_cache=packed)}
  for case, options in LITERT_CASES.items():
    beams = options.get("num_beams", 1)
    want = rnnstep.generate(model, LITERT_PROMPTS, 30, jit_compile=False,
                            **(dict(options, num_return_sequences=beams)
                               if beams > 1 else options))
    if beams > 1:
      want = [text for texts in want for text in texts]
    for way, how in ways.items():
      got = litert_runner.run_artifact(
          vocab=list(model.vocab), prompts=LITERT_PROMPTS, num_steps=30,
          tokens=model.tokens, **how,
          **dict(options, seed=options.get("seed", 0)))
      assert got == want, (case, way)


WARM_ARGS = ["--prompt=Hello the poet said", "--num_steps=24",
             "--temperature=0.8", "--seed=5", "--verbose"]


def _warm_cli_want(model):
  return "Hello the poet said" + rnnstep.generate(
      model, "Hello the poet said", 24, temperature=0.8, seed=5) + "\n"


@pytest.mark.slow  # A fresh process.
def test_cli_runs_the_warm_artifact_without_tensorflow(
    pth_file, pth_model, pth_artifact):
  """rnnstep-generate on an RWKV-7 model file whose entry the cache's fill
  built (a cold run's child's work), its weights packed for XNNPACK: a warm
  run prints `generate`'s text from them, TensorFlow never imported."""
  from tests import test_fast_path as fast  # pylint: disable=g-import-not-at-top
  cache = pth_artifact[0]
  warm = fast.cli(cache, [f"--weights={pth_file}"] + WARM_ARGS,
                  importtime=True)
  assert warm.returncode == 0, warm.stderr[-3000:]
  assert warm.stdout == _warm_cli_want(pth_model)
  assert "fast path: compiled artifact" in fast.verbose_line(warm)
  imported = [line.split("|")[-1].strip() for line in warm.stderr.splitlines()
              if line.startswith("import time:")]
  assert not [m for m in imported if m.split(".")[0] == "tensorflow"]


@pytest.mark.slow  # The exported artifact (shared with the tests above).
def test_warm_path_leaves_a_prompt_past_its_crossover_to_tensorflow(
    pth_file, pth_model, pth_artifact, monkeypatch):
  """The fill records that RWKV-7 primes block by block, and the warm path
  serves a prompt short of the artifact's crossover (`prompt_crossover`,
  its start-up constant lowered here so that a short prompt passes it) but
  leaves one past it to TensorFlow, saying why."""
  from rnnstep.litert import warm  # pylint: disable=g-import-not-at-top
  cache, base = pth_artifact
  with open(base + ".json", encoding="utf-8") as f:
    manifest = json.load(f)
  assert manifest["primes_in_bulk"] is True
  # The layers' weights: less than the flatbuffer's (the embedding's and
  # the head's too).
  assert 0 < manifest["prime_bytes"] < manifest["tflite_bytes"]
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(cache))
  monkeypatch.setenv("RNNSTEP_COMPILED_CACHE", "on")
  # A start-up as long as 300 tokens' priming saves: the crossover 301.
  monkeypatch.setattr(warm, "TENSORFLOW_START_S_PER_BYTE", 0.0)
  monkeypatch.setattr(warm, "TENSORFLOW_START_S", 300 * manifest[
      "prime_bytes"] * (1 / warm.ARTIFACT_PRIME_BYTES_PER_S
                        - 1 / warm.TENSORFLOW_PRIME_BYTES_PER_S))
  crossover = warm.prompt_crossover(manifest)
  assert crossover in (300, 301)  # Rounding of the two products.
  assert warm.prompt_crossover(dict(manifest, primes_in_bulk=False)) is None
  short, long_ = "Hello the poet said", "the poet said " * (crossover // 3)
  assert len(pth_model.encode(long_)) >= crossover
  assert len(pth_model.encode(short)) < crossover
  from rnnstep.decoding import options as options_lib  # pylint: disable=g-import-not-at-top
  decoding = {option.name: option.default for option in options_lib.OPTIONS}
  decoding["temperature"] = 0.8
  served = warm.generate(pth_file, [short], 1, 24, seed=5,
                         decoding=decoding)
  assert served.texts == [rnnstep.generate(pth_model, short, 24,
                                           temperature=0.8, seed=5)]
  with pytest.raises(warm.NotServed, match=(
      f"a prompt of {len(pth_model.encode(long_)):,} tokens is past "
      f"the compiled artifact's crossover for this model \\({crossover:,}\\), "
      "where TensorFlow primes it faster")) as refused:
    warm.generate(pth_file, [short, long_], 1, 24, seed=5,
                  decoding=decoding)
  assert refused.value.fill_key is None  # Nothing to build.


@pytest.mark.exhaustive  # A conversion, a fresh TensorFlow process, a child.
def test_cli_never_runs_packed_weights_cut_short(tmp_path, preset_model,
                                                 monkeypatch):
  """An RWKV-7 entry whose packed weights were cut short is never run
  (XNNPACK would read them, or rebuild them in place): the command takes
  TensorFlow's path, the same text, and its child rebuilds the entry."""
  pytest.importorskip("ai_edge_litert.interpreter",
                      reason="ai_edge_litert is not installed")
  from rnnstep.litert import cache as compiled_cache  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import fill as compiled_fill  # pylint: disable=g-import-not-at-top
  from rnnstep.litert import runner as litert_runner  # pylint: disable=g-import-not-at-top
  from tests import test_fast_path as fast  # pylint: disable=g-import-not-at-top
  cache = tmp_path / "cache"
  monkeypatch.setenv("RNNSTEP_CACHE_DIR", str(cache))
  weights = str(tmp_path / "rwkv7.npz")
  convert.convert(PRESET, weights)
  the_key = compiled_cache.key(weights, compiled_cache.runtime_version())
  os.makedirs(os.path.dirname(compiled_cache.entry_base(the_key)), mode=0o700)
  os.chmod(cache, 0o700)
  monkeypatch.setattr(litert_runner, "BUILTIN_KERNELS_FROM_BYTES", 0)
  assert compiled_fill.fill(weights, the_key) == "built"
  packed = compiled_cache.entry_base(the_key) + compiled_cache.PACKED_SUFFIX
  os.truncate(packed, os.path.getsize(packed) // 2)
  cold = fast.cli(cache, [f"--weights={weights}"] + WARM_ARGS)
  assert cold.returncode == 0, cold.stderr[-3000:]
  assert cold.stdout == _warm_cli_want(preset_model)
  line = fast.verbose_line(cold)
  assert "TensorFlow path: packed-weights file does not match" in line
  assert "building the compiled artifact in the background" in line
  fast.wait_for_valid_entry(cache, the_key, monkeypatch)


@pytest.mark.slow
def test_cli_converts_a_preset_folder_and_generates(tmp_path, preset_model):
  """`rnnstep-convert --input=FOLDER` takes a preset whole; its
  `.weights.h5` alone and the official `.pth`, each with the world
  vocabulary, convert to the same model."""
  convert_cmd = cli.command("rnnstep-convert", "rnnstep.cli.convert")
  generate_cmd = cli.command("rnnstep-generate", "rnnstep.cli.generate")
  for name, flags in (("preset", [f"--input={PRESET}"]),
                      ("h5", [f"--input={WEIGHTS}", f"--vocab={VOCAB}"]),
                      ("pth", [f"--input={PTH}", f"--vocab={VOCAB}"])):
    cli.ok(cli.run_binary(convert_cmd, flags + [
        f"--output={tmp_path / name}.npz"]))
  preset, h5 = (convert.read_any(str(tmp_path / f"{name}.npz"))
                for name in ("preset", "h5"))
  for name, tensor in preset.tensors.items():
    np.testing.assert_array_equal(h5.tensors[name], tensor, name)
  # The preset's file is the model the library reads from the folder, bit
  # for bit; the official `.pth`'s generates its text through the command.
  from_file = rnnstep.load(str(tmp_path / "preset.npz"))
  assert from_file.vocab == preset_model.vocab
  for name, tensor in preset_model.tensors().items():
    np.testing.assert_array_equal(from_file.tensors()[name], tensor, name)
  want = rnnstep.generate(preset_model, "Hello the poet said", 16,
                          temperature=0.0, jit_compile=False)
  got = cli.ok(cli.run_binary(generate_cmd, [
      f"--weights={tmp_path / 'pth'}.npz", "--prompt=Hello the poet said",
      "--num_steps=16", "--temperature=0", "--nojit_compile"]))
  assert want in got, got


# Exhaustive (an export and a load, 11 CPU-s): the default run keeps the
# generate_ids signature (a BPE model's, test_tokens.py's
# test_saved_model_serves_token_models_without_rnnstep) and RWKV-7 on every
# other caller.
@pytest.mark.exhaustive
def test_saved_model_serves_ids(preset_model, tmp_path):
  """The export takes ids (the world tokenizer is not graph ops) and
  returns the library's text and ids."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tests.test_saved_model import DECODING_DEFAULTS  # pylint: disable=g-import-not-at-top
  rnnstep.export(preset_model, str(tmp_path / "sm"))
  loaded = tf.saved_model.load(str(tmp_path / "sm"))
  ids = preset_model.encode("Hello the poet said")
  dtypes = {k: tf.int64 if k == "seed" else tf.float32 if isinstance(
      v, float) else tf.int32 for k, v in DECODING_DEFAULTS.items()}
  args = {k: tf.constant(v, dtypes[k]) for k, v in
          dict(DECODING_DEFAULTS, temperature=0.0).items()}
  out = loaded.signatures["generate_ids"](
      prompt_ids=tf.constant([ids], tf.int32),
      prompt_lengths=tf.constant([len(ids)], tf.int32),
      num_steps=tf.constant(12), **args)
  want = rnnstep.generate(preset_model, "Hello the poet said", 12,
                          temperature=0.0, jit_compile=False)
  assert out["text"].numpy()[0].decode("utf-8") == want


@pytest.mark.exhaustive  # Two replicas: test_distribute's tier.
def test_strategy_equals_one_device():
  """Two replicas (one padding row) give one device's texts, sampled with
  penalties, stop strings and a pattern."""
  from tests.test_tokens import STRATEGY_SCRIPT  # pylint: disable=g-import-not-at-top
  runs = [(PRESET, ["the", "中文", "Hello"], False, dict(
      seed=5, regex="[a-z ]+", repetition_penalty=1.3, stop=["he", "an"],
      no_repeat_ngram_size=2, num_beams=1))]
  results = cli.run_script(STRATEGY_SCRIPT, json.dumps(runs))
  for (_, _, _, kwargs), (one, two) in zip(runs, results, strict=True):
    assert one == two, (kwargs, one, two)
