"""Decoding: from a step's logits to the next ids, on device.

Imports neither the model nor the engine (only `rnnstep.errors`): each piece
is a function of logits and per-row tensors, so the loops in `rnnstep.engine`
compose them and the references in tests/ check them alone.

  options      every decoding option, declared once (defaults, checks, flags)
  processors   the repetition, frequency and presence penalties and the
               n-gram ban (look-back over ids)
  sampling     temperature, top-k, top-p, min-p, typical and the seeded draw
  constraints  regex= as a DFA over the vocabulary, masked per row
  stopping     stop strings as an automaton over ids
  pipeline     one step's order: mask, penalize, filter, choose
"""
