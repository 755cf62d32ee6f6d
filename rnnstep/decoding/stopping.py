"""Stop strings as a device-side automaton.

Several stop strings become one Aho-Corasick automaton, flattened into a dense
transition table `[S, V]` (state x next id -> state) and an `accept [S]` flag.
On device a row's stop state advances with one gather per step; the row has
ended when its state accepts. With no stop strings the table has one state that
never accepts, so the compiled loop is the same either way.
"""

import collections
from typing import NamedTuple, Sequence

import numpy as np


class Automaton(NamedTuple):
  """The stop automaton: `table` int32 `[S, V]`, `accept` bool `[S]`."""
  table: np.ndarray
  accept: np.ndarray


def stop_automaton(stops: Sequence[Sequence[int]], vocab_size: int) -> Automaton:
  """Builds the automaton that accepts as soon as any stop sequence has appeared.

  Args:
    stops: id sequences, each non-empty.
    vocab_size: V.

  Returns:
    The `Automaton`; state 0 is the start.
  """
  children = [dict()]
  accept = [False]
  for seq in stops:
    node = 0
    for token in seq:
      if token not in children[node]:
        children.append({})
        accept.append(False)
        children[node][token] = len(children) - 1
      node = children[node][token]
    accept[node] = True
  table = np.zeros([len(children), vocab_size], np.int32)
  fail = [0] * len(children)
  queue = collections.deque()
  for token, child in children[0].items():
    table[0, token] = child
    queue.append(child)
  while queue:
    node = queue.popleft()
    accept[node] = accept[node] or accept[fail[node]]
    # Missing edges fall back along the failure link; the fail node is closer to
    # the root, so its row is already complete.
    table[node] = table[fail[node]]
    for token, child in children[node].items():
      fail[child] = table[fail[node], token] if node else 0
      table[node, token] = child
      queue.append(child)
  return Automaton(table, np.array(accept, bool))
