"""Stop strings as TensorFlow ops: the SavedModel's `stop` input.

A served call's stop strings arrive as a string tensor, so the stop automaton
(`decoding/stopping.py`) is built inside the graph, with the same states in
the same order, so the same table:

  - `trie_automaton`: the Aho-Corasick automaton of `stopping.stop_automaton`.
    Its states are the stop strings' distinct prefixes, numbered in the order
    they first appear (`tf.unique` over the prefixes, stop by stop: the order
    in which the host's trie creates its nodes). Its rows are filled a depth
    at a time, as the host's breadth-first walk does: a state's failure state
    is shallower, so its row is complete when the state's row copies it.
  - `StopTables.automaton`: a character model's automaton over character
    ids (`host.stop_automaton`), or a token model's: the byte automaton
    advanced over every token's bytes (`stopping.token_automaton`).
  - `StopTables.cut`: a token model's text cut at its stop string's end,
    as `vocabulary.StreamText` cuts it (a character row ends at its stop).

Every check is a graph op that fails the call with InvalidArgumentError and
the host's message, naming `stop`.
"""

from typing import Tuple

import numpy as np
import tensorflow as tf

from rnnstep.decoding import stopping

# The host's messages (`host.stop_automaton`), prefixed with the input.
EMPTY_STOP = "stop: a stop string is empty; give at least one character"
NEVER_GENERATED = ("stop: a stop string can never be generated: a character "
                   "of it is not in the vocabulary of the model")
NOT_UTF8 = "stop: a stop string is not UTF-8 text"
TOO_LONG = (f"stop: the stop strings are more than {stopping.MAX_STOP_BYTES} "
            "bytes of UTF-8 together; give fewer or shorter ones")


def trie_automaton(stops: tf.Tensor, unit: str, symbols: tf.RaggedTensor,
                   alphabet: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """`stopping.stop_automaton` of the stop strings' symbols, in graph ops.

  Args:
    stops: string `[K]`, each non-empty (and UTF-8 for "UTF8_CHAR").
    unit: "BYTE" or "UTF8_CHAR", what one symbol of a stop string is.
    symbols: int32 ragged `[K, None]`: each unit's symbol, in `[0, alphabet)`.
    alphabet: A, the number of symbols.

  Returns:
    `(table, accept)`: int32 `[S, A]` and bool `[S]`, equal to the host's.
  """
  lengths = tf.cast(symbols.row_lengths(), tf.int32)
  # Every non-empty prefix (stop k, length j), stop by stop, named by its
  # text; "" (state 0) first. The texts total at most MAX_STOP_BYTES**2 / 2
  # bytes (`stopping.MAX_STOP_BYTES`).
  stop_of = tf.cast(symbols.value_rowids(), tf.int32)
  depth_of = tf.ragged.range(lengths).flat_values + 1
  prefixes = tf.strings.substr(tf.gather(stops, stop_of),
                               tf.zeros_like(depth_of), depth_of, unit=unit)
  names, state_of = tf.unique(tf.concat([[""], prefixes], 0))
  state_of = state_of[1:]
  num_states = tf.shape(names)[0]
  # A prefix's parent: the prefix one unit shorter (state 0 at depth 1).
  parent_of = tf.where(depth_of > 1, tf.concat([[0], state_of[:-1]], 0), 0)
  symbol_of = tf.cast(symbols.flat_values, tf.int32)
  # Each state's values from its first prefix (its copies have the same);
  # state 0 has none.
  first = tf.math.unsorted_segment_min(tf.range(tf.shape(state_of)[0]),
                                       state_of, num_states)[1:]

  def per_state(values):
    return tf.concat([[0], tf.gather(values, first)], 0)

  depth, parent, symbol = map(per_state, (depth_of, parent_of, symbol_of))
  is_end = tf.scatter_nd(
      tf.gather(state_of, tf.cumsum(lengths) - 1)[:, None],
      tf.ones_like(lengths, tf.bool), [num_states])
  children = tf.tensor_scatter_nd_max(
      tf.fill([num_states, alphabet], -1),
      tf.stack([parent_of, symbol_of], 1), state_of)
  # The root's row; the others are filled a depth at a time.
  table = tf.where(children >= 0, children, 0) * tf.cast(
      tf.range(num_states) == 0, tf.int32)[:, None]

  def fill_depth(d, table, fail, accept):
    # Only the states at depth d: the whole build stays O(S * A), as the
    # host's (a stop string of 4,096 units has 4,096 depths).
    here = tf.where(tf.equal(depth, d))

    def into(tensor, values):
      return tf.tensor_scatter_nd_update(tensor, here, values)

    index = here[:, 0]
    # fail(child of s by c) = table[fail(s), c]: a shallower, complete row.
    deeper_fail = tf.gather_nd(table, tf.stack(
        [tf.gather(fail, tf.gather(parent, index)),
         tf.gather(symbol, index)], 1))
    new_fail = deeper_fail * tf.cast(d > 1, tf.int32)
    # Missing edges fall back along the failure link, as on the host.
    own = tf.gather(children, index)
    rows = tf.where(own >= 0, own, tf.gather(table, new_fail))
    return (d + 1, into(table, rows), into(fail, new_fail),
            into(accept, tf.gather(is_end, index)
                 | tf.gather(accept, new_fail)))

  deepest = tf.reduce_max(depth)
  _, table, _, accept = tf.while_loop(
      lambda d, *_: d <= deepest, fill_depth,
      (tf.constant(1), table, tf.zeros([num_states], tf.int32),
       tf.zeros([num_states], tf.bool)))
  return table, accept


class StopTables(tf.Module):
  """A model's stop automaton from stop strings, in graph ops (see module).

  Args:
    model: the `rnnstep.Model`.
    char_ids: for a character model, the `tf.lookup` table from a character
      to its id (-1: not in the vocabulary); None for a token model.
  """

  def __init__(self, model, char_ids=None):
    super().__init__(name="rnnstep_stops")
    self._characters = model.is_characters
    self._vocab_size = model.vocab_size
    self._char_ids = char_ids
    if not self._characters:
      pieces = model.tokens.pieces
      lengths = np.array([len(p) for p in pieces], np.int32)
      # [W, V]: a byte position's row is contiguous for the walk's gathers.
      padded = np.zeros([max(int(lengths.max(initial=0)), 1), len(pieces)],
                        np.int32)
      for v, piece in enumerate(pieces):
        padded[:len(piece), v] = np.frombuffer(piece, np.uint8)
      # Variables, not constants: a 50k vocabulary's bytes stay out of the
      # graph.
      self._piece_bytes = tf.Variable(padded, trainable=False,
                                      name="piece_bytes")
      self._piece_lengths = tf.Variable(lengths, trainable=False,
                                        name="piece_lengths")

  def automaton(self, stops: tf.Tensor):
    """The stop automaton of string stops `[K]` (none: the no-stop one).

    Returns:
      `(automaton, checks)`: the `stopping.Automaton` of tensors, and the
      assertions that fail the call where `host.stop_automaton` refuses.
    """
    checks = [
        tf.debugging.assert_positive(tf.strings.length(stops),
                                     message=EMPTY_STOP),
        tf.debugging.assert_less_equal(
            tf.reduce_sum(tf.strings.length(stops)),
            stopping.MAX_STOP_BYTES, message=TOO_LONG),
        tf.debugging.assert_equal(
            tf.strings.unicode_transcode(
                stops, "UTF-8", "UTF-8", errors="replace",
                replacement_char=0xFFFD, replace_control_characters=False),
            stops, message=NOT_UTF8)]
    with tf.control_dependencies(checks):
      stops = tf.identity(stops)
    if self._characters:
      ids = tf.ragged.map_flat_values(self._char_ids.lookup,
                                      tf.strings.unicode_split(stops, "UTF-8"))
      checks.append(tf.debugging.assert_non_negative(
          ids.flat_values, message=NEVER_GENERATED))
      with tf.control_dependencies(checks[-1:]):
        ids = tf.ragged.map_flat_values(tf.identity, ids)
      table, accept = trie_automaton(stops, "UTF8_CHAR", ids,
                                     self._vocab_size)
      return stopping.Automaton(
          tf.ensure_shape(table, [None, self._vocab_size]), accept), checks
    codes = tf.ragged.map_flat_values(
        lambda units: tf.cast(tf.reshape(tf.io.decode_raw(units, tf.uint8),
                                         [-1]), tf.int32),
        tf.strings.bytes_split(stops))
    chars, accept = trie_automaton(stops, "BYTE", codes, 256)
    # No stop strings (most calls): the one never-accepting state, without
    # the walk (3 ms at 33k tokens).
    states = tf.shape(accept)[0]
    need = tf.cast(states, tf.int64) * self._vocab_size * 4
    checks.append(tf.debugging.Assert(
        need <= stopping.MAX_TABLE_BYTES,
        ["stop: the stop strings need a table of", states, "states x",
         self._vocab_size, f"tokens, more than the limit of "
         f"{stopping.MAX_TABLE_BYTES >> 20} MiB; give fewer or shorter stop "
         "strings"]))
    with tf.control_dependencies(checks[-1:]):
      table = tf.cond(tf.size(stops) > 0,
                      lambda: self._advance(chars, accept),
                      lambda: tf.zeros([1, self._vocab_size], tf.int32))
    return stopping.Automaton(table, accept), checks

  def _advance(self, chars, accept):
    """`stopping.token_automaton`'s walk of every token from every state."""
    states = tf.shape(accept)[0]
    state = tf.tile(tf.range(states)[:, None], [1, self._vocab_size])
    accepting = tf.cast(tf.where(accept)[:, 0], tf.int32)
    done = tf.cond(tf.size(accepting) > 0, lambda: accepting[0],
                   lambda: tf.constant(0))
    flat_chars = tf.reshape(chars, [-1])
    width = tf.shape(self._piece_bytes)[0]

    def walk(position, state, matched):
      moving = position < self._piece_lengths  # [V]
      nxt = tf.gather(flat_chars,
                      state * 256 + self._piece_bytes[position][None, :])
      state = tf.where(moving[None, :], nxt, state)
      matched |= moving[None, :] & tf.gather(accept, state)
      return position + 1, state, matched

    _, state, matched = tf.while_loop(
        lambda position, *_: position < width, walk,
        (tf.constant(0), state, tf.zeros_like(state, tf.bool)))
    return tf.ensure_shape(tf.where(matched, done, state),
                           [None, self._vocab_size])

  def cut(self, text: tf.Tensor, ids: tf.Tensor, lengths: tf.Tensor,
          stops: tf.Tensor) -> tf.Tensor:
    """A token model's generated bytes cut at the earliest stop string's end.

    A row ends (on device) at the token inside which a stop string first
    ends, so that end lies in the row's last token: only the ends there are
    looked at, over the generated bytes only (`StreamText` matches from the
    continuation's start).

    Args:
      text: string `[B]`, each row's generated bytes (its pieces joined).
      ids: int32 `[B, N]`, the generated ids.
      lengths: int32 `[B]`, each row's count of them.
      stops: string `[K]`.

    Returns:
      string `[B]`: each row's bytes up to its stop string's end, if one
      ends in its last token; else as given.
    """
    size = tf.strings.length(text)  # [B] bytes
    last = tf.gather(ids, tf.maximum(lengths - 1, 0), batch_dims=1)
    last_length = tf.where(lengths > 0,
                           tf.gather(self._piece_lengths, last), 0)
    width = tf.shape(self._piece_bytes)[0]
    # End e (exclusive) = size - last_length + 1 + t, for t < last_length.
    offsets = tf.range(width)[None, None, :]
    ends = (size - last_length + 1)[:, None, None] + offsets  # [B, 1, W]
    stop_length = tf.strings.length(stops)[None, :, None]  # [1, K, 1]
    starts = ends - stop_length  # [B, K, W]
    valid = (offsets < last_length[:, None, None]) & (starts >= 0)
    shape = tf.shape(starts)
    found = valid & tf.equal(
        tf.strings.substr(
            tf.broadcast_to(text[:, None, None], shape),
            tf.clip_by_value(starts, 0, size[:, None, None]),
            tf.broadcast_to(stop_length, shape)),
        tf.broadcast_to(stops[None, :, None], shape))
    big = tf.int32.max
    earliest = tf.reduce_min(tf.where(found, tf.broadcast_to(ends, shape),
                                      big), axis=[1, 2])
    return tf.strings.substr(text, tf.zeros_like(size),
                             tf.minimum(earliest, size))


__all__ = ["StopTables", "trie_automaton"]
