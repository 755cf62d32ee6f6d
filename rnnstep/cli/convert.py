"""rnnstep-convert: turn saved Keras, PyTorch or RWKV-7 weights into an rnnstep
model file.

Reads the weights as data -- never imports Keras or torch, never runs code from
the file (PyTorch pickles go through an unpickler that rebuilds only tensors
and dicts, and reads a pickled module's classes as inert records, calling
nothing).

  rnnstep-convert --input=training_checkpoints --output=model.npz --corpus=shakespeare.txt
  rnnstep-convert --input=model.keras --output=model.npz --vocab=vocab.json
  rnnstep-convert --input=char_rnn.pt --output=model.npz --vocab=vocab.json
  rnnstep-convert --input=model.pt --output=words.npz --corpus=data/wikitext-2
  rnnstep-convert --input=rwkv7-g1a-0.1b-20250728-ctx4096.pth \\
      --vocab=rwkv_vocab_v20230424.txt --output=rwkv7.npz
  rnnstep-convert --input=my_rwkv7_preset --output=rwkv7.npz
  rnnstep-convert --input=w.h5 --inspect

--input takes a Keras 3 .keras archive, a .weights.h5, a Keras 2 / tf.keras .h5
(save_weights or full save), a TF checkpoint prefix (ckpt_5), a directory of TF
checkpoints (its latest), or a PyTorch state dict: torch.save(
model.state_dict(), PATH) (.pt/.pth/.bin, zip or legacy format) or
.safetensors, or a whole pickled module: torch.save(model, PATH).

Recurrent stacks: Embedding -> GRU/LSTM/SimpleRNN layer(s) -> Dense (PyTorch:
nn.Embedding -> nn.GRU/nn.LSTM/nn.RNN -> nn.Linear, any module names,
unidirectional; an nn.RNN is tanh, its default, unless a whole pickled module
says relu), over characters, words, bytes or subword tokens. A Keras model
fed one-hot vectors (no Embedding) gets an identity embedding; one built for
fixed windows records its window length in the model file, and may wrap its
recurrent layers in Bidirectional (run as recomputed windows) and put Dense
layers before its output Dense. textgenrnn's weights file converts too.

RWKV-7: an official RWKV-LM checkpoint (.pth; give
--vocab=rwkv_vocab_v20230424.txt, the world vocabulary from RWKV-LM), a
KerasHub RWKV7CausalLM preset folder (save_to_preset; it holds its own
vocabulary), or its model.weights.h5 with --vocab=the preset's
assets/tokenizer/vocabulary.txt (docs/guide/rwkv.md).

A sherjilozair/char-rnn-tensorflow save directory (train.py's --save_dir:
the TF1 checkpoint with config.pkl and chars_vocab.pkl beside it) converts
with no --corpus or --vocab: its chars_vocab.pkl is the vocabulary, and both
pickles are read as data (an argparse.Namespace and a (chars, vocab) tuple).

  rnnstep-convert --input=save --output=model.npz

Otherwise the vocabulary comes from --corpus (the training text: sorted(set(text))) or
--vocab (a UTF-8 JSON list of characters, e.g. ["\\n", " ", "!"], optionally
with "[UNK]" first). If the embedding has one row more than the characters, id 0
is "[UNK]" (the current TF tutorial's StringLookup). Token models: --corpus=FOLDER
(word_language_model's data folder), or --vocab with a list of words, a Keras
Tokenizer's to_json(), a Hugging Face tokenizer.json or {"kind": "bytes"}
(docs/guide/converting.md). A Keras model whose
string Input feeds a TextVectorization layer holds its own vocabulary: give
neither.

--inspect prints what was found (format, layers, shapes, vocab size) and writes
nothing; with --corpus or --vocab it also checks the vocabulary fits.

--weights_dtype=float16|bfloat16|int8 stores the large matrices in fewer bits
(int8: a quarter of the file); the file records it, and every tool loads it
so. An rnnstep model file is an --input too, to store it again:

  rnnstep-convert --input=model.npz --output=model-int8.npz --weights_dtype=int8

Every failure exits non-zero with one line on stderr; a failed run leaves no
file at --output. Set RNNSTEP_DEBUG=1 to see TensorFlow's own logging and
tracebacks.
"""

import os

from absl import flags

from rnnstep.cli import common  # pylint: disable=g-bad-import-order

PROGRAM = "rnnstep-convert"

# Private flags: see common.py.
FLAGS = flags.FlagValues()
flags.DEFINE_string("input", None, "The saved weights: .keras, .weights.h5, "
                    ".h5, a TF checkpoint prefix, a checkpoint directory, or a "
                    "PyTorch state dict or whole module (.pt, .pth, .bin, "
                    ".safetensors), an RWKV-LM RWKV-7 checkpoint (.pth) or a "
                    "KerasHub RWKV-7 preset folder.",
                    flag_values=FLAGS)
flags.DEFINE_string("output", None, "The rnnstep model file to write (.npz). "
                    "Written atomically.", flag_values=FLAGS)
flags.DEFINE_string("corpus", None, "The training text (UTF-8); the vocabulary "
                    "is sorted(set(text)). A folder: word_language_model's "
                    "data (train.txt, valid.txt, test.txt), whose words it "
                    "numbers as the recipe does.", flag_values=FLAGS)
flags.DEFINE_string("vocab", None, "A vocabulary file: a UTF-8 JSON list of "
                    "characters in id order, optionally with \"[UNK]\" first, "
                    "or of a word model's words; or a tokenizer file: a Keras "
                    "Tokenizer's to_json(), a Hugging Face tokenizer.json, "
                    "{\"kind\": \"bytes\"}; or, for RWKV-7, "
                    "rwkv_vocab_v20230424.txt (RWKV-LM's world vocabulary) "
                    "or a KerasHub preset's vocabulary.txt.",
                    flag_values=FLAGS)
flags.DEFINE_bool("inspect", False, "Print what the input holds and write "
                  "nothing.", flag_values=FLAGS)
_WEIGHTS_DTYPE = common.define_weights_dtype_flag(FLAGS)

flags.mark_flag_as_required("input", flag_values=FLAGS)
flags.mark_flags_as_mutual_exclusive(["corpus", "vocab"], flag_values=FLAGS)


def _check_mode(values):
  if values["inspect"]:
    if values["output"] is not None:
      raise flags.ValidationError("--inspect writes nothing; drop --output")
    return True
  if values["output"] == "":
    raise flags.ValidationError("--output must not be empty")
  if values["output"] is None:
    raise flags.ValidationError("--output is required (or use --inspect)")
  # Without --corpus or --vocab, only an input holding its own vocabulary
  # (a char-rnn-tensorflow save directory, a Keras TextVectorization layer)
  # converts: `main` says so.
  return True


flags.register_multi_flags_validator(["inspect", "output", "corpus", "vocab"],
                                     _check_mode, flag_values=FLAGS)
common.forbid_empty(FLAGS, "input", "output", "corpus", "vocab")


def main(argv):
  """Does the work; errors propagate to common.run, which reports them."""
  common.reject_arguments(argv)
  from rnnstep import convert as convert_lib  # pylint: disable=g-import-not-at-top
  from rnnstep.convert import vocabulary as convert_vocabulary  # pylint: disable=g-import-not-at-top
  if FLAGS.inspect:
    summary = convert_lib.describe(FLAGS.input)
    print(summary)
    chars = tokens = None
    if FLAGS.corpus is not None or FLAGS.vocab is not None:
      chars, source, tokens = convert_lib.read_vocabulary(FLAGS.corpus,
                                                          FLAGS.vocab)
    if tokens is not None:
      if len(chars) != summary.vocab_size:
        raise ValueError(
            f"vocabulary size mismatch: {source} gives {len(chars)} "
            f"{convert_vocabulary.unit(tokens)} but the model's embedding has "
            f"{summary.vocab_size} rows")
      print(f"vocabulary: {source} fits: {len(chars)} "
            f"{convert_vocabulary.unit(tokens)}")
    elif chars is not None:
      vocab = convert_lib.resolve_vocab(chars, summary.vocab_size, source)
      unk = " ([UNK] at id 0)" if vocab[0] != chars[0] else ""
      print(f"vocabulary: {source} fits: {len(vocab)} entries{unk}")
    print("(--inspect: nothing written)")
    return 0
  if _WEIGHTS_DTYPE.value and convert_lib.is_model_file(FLAGS.input):
    if FLAGS.corpus is not None or FLAGS.vocab is not None:
      raise common.Failure("--input is an rnnstep model file, which holds its "
                           "own vocabulary; drop --corpus/--vocab",
                           common.EXIT_USAGE)
    return _store_again(FLAGS.input, FLAGS.output, _WEIGHTS_DTYPE.value)
  if (FLAGS.corpus is None and FLAGS.vocab is None
      and not convert_lib.holds_vocabulary(FLAGS.input)):
    raise common.Failure("give --corpus=TEXT_FILE or --vocab=VOCAB_FILE for "
                         "the vocabulary (only a char-rnn-tensorflow save "
                         "directory, a KerasHub preset folder or a Keras "
                         "model with a TextVectorization layer holds its "
                         "own)", common.EXIT_USAGE)
  summary = convert_lib.convert(
      FLAGS.input, FLAGS.output, corpus=FLAGS.corpus, vocab=FLAGS.vocab,
      weights_dtype=_WEIGHTS_DTYPE.value or "float32")
  print(summary)
  return 0


def _store_again(input_path: str, output_path: str, weights_dtype: str):
  """An rnnstep model file written again with another weights dtype."""
  from rnnstep.model import model_file  # pylint: disable=g-import-not-at-top
  if os.path.exists(output_path) and os.path.samefile(output_path,
                                                      input_path):
    raise common.Failure(f"--output={output_path}: would overwrite --input",
                         common.EXIT_USAGE)
  read = model_file.read(input_path)
  tensors = model_file.reduce_tensors(read.config, read.tensors,
                                      weights_dtype)
  model_file.write(output_path, read.config, read.vocab, tensors,
                   read.tokens, chat_template=read.chat_template,
                   weights_dtype=weights_dtype)
  print(f"input:      {input_path} (an rnnstep model file, weights "
        f"{read.weights_dtype})\noutput:     {output_path}\nweights:    "
        f"{weights_dtype} ({os.path.getsize(input_path):,} -> "
        f"{os.path.getsize(output_path):,} bytes)")
  return 0


# The console-script entry point: run(argv=None).
run = common.entry_point(PROGRAM, __doc__, FLAGS, main)

if __name__ == "__main__":
  run()
