"""The compiled-artifact cache's background child: builds one entry.

Started detached by `cache.spawn_fill` after a cold rnnstep-generate
run has written its text, isolated (`python -I`, in the cache folder, its
sys.path set by `cache.child_path`); by hand and by the tools:
`python -m rnnstep.litert.fill MODEL_PATH KEY_JSON`. The work is
`cache.fill`.
"""

import contextlib
import json
import os
import sys

from rnnstep.litert import cache


def main(argv) -> int:
  """The child: `argv` is [program, MODEL_PATH, KEY_JSON]."""
  with contextlib.suppress(AttributeError, OSError):
    os.nice(10)  # Background work: the user's next command comes first.
  try:
    model_path, the_key = argv[1], json.loads(argv[2])
    print(cache.fill(model_path, the_key))
    return 0
  except Exception as e:  # pylint: disable=broad-except
    # Detached, with no one to tell: the next cold run tries again.
    print(f"failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main(sys.argv))
