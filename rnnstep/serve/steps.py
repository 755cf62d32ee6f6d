"""How many steps a scheduler's device call decodes (`scheduler.py`).

A call runs a chunk (`chunk_steps`) at most, and fewer where that serves
the rows better with the same texts (a row's text depends on its own seed
and position only, so where a call stops changes none):

  - where every decoding row ends sooner: no row needs more than its own
    ids;
  - `burst_steps`, where the rows just admitted are most of a batch that is
    not full: more are likely on their way (a burst, whose requests the
    HTTP side reads one after another); a short call lets them join at its
    end rather than wait a whole chunk beside a few rows, and the burst then
    runs, and ends, in full chunks together;
  - one, where rows start decoding after their prompts took calls before
    this one (a long prompt primed in pieces, or a wait for the shared
    prefix another row primed: a burst's rows after one system prompt) or
    the prefix cache's state, and they are most of the call's rows (or no
    row decodes on from before): their first ids go out as soon as their
    prompts are primed, not a chunk's decoding later, and the next call
    decodes on. A lane running mostly other rows' decoding keeps its
    chunks; in a burst over a cached system prompt, the rows arriving
    after the first call's would otherwise wait a chunk of its rows'
    decoding for their first ids (the 0.1B RWKV-7's: 8 steps, 1.5 s);
  - the first of their limits, where a row wants scores: a row's score
    counts only its own ids.
"""

from typing import List, Sequence

from rnnstep.serve.completion import Row


def call_steps(rows: List[Row], prepared: Sequence, fresh: int, *,
               chunk_steps: int, burst_steps: int, max_batch: int) -> int:
  """The steps of a round's call over `rows` (module docstring).

  Args:
    rows: the call's rows, before it runs (`Row.primed`: the prompt ids
      their state has consumed so far).
    prepared: their `calls.Prepared` host work (a piece that is not the
      prompt's last only primes; no piece: the row decodes on).
    fresh: how many of them were just admitted.
    chunk_steps, burst_steps, max_batch: the scheduler's.
  """
  steps = chunk_steps
  decoding = [row for row, p in zip(rows, prepared) if not p.primes_only]
  if decoding:  # Each row's own ids at most.
    steps = min(steps, max(row.completion.max_tokens - row.produced
                           for row in decoding))
  if fresh and len(rows) < max_batch and 2 * fresh > len(rows):  # A burst.
    steps = min(steps, burst_steps)
  # Rows whose prompts' last piece this call primes, and whether any row
  # decodes on from before (it has no piece).
  starting = [row for row, p in zip(rows, prepared)
              if p.piece is not None and not p.primes_only]
  resumed = [row for row in starting if row.primed]
  if resumed and (all(p.piece is not None for p in prepared)
                  or 2 * len(resumed) > len(rows)):
    steps = min(steps, 1)  # Their first ids, as soon as they are primed.
  scored = [row for row in decoding if row.completion.want_scores]
  if scored:
    steps = min([steps] + [row.completion.max_tokens - row.produced
                           for row in scored])
  return steps
