"""The compiled-artifact cache's background child: builds one entry.

`python -m rnnstep.cli.cache_fill MODEL_PATH KEY_JSON`, started detached by
`compiled_cache.spawn_fill` after a cold rnnstep-generate run has written its
text; the work is `compiled_cache.fill`.
"""

import contextlib
import json
import os
import sys

from rnnstep.cli import compiled_cache


def _main(argv) -> int:
  """`python -m rnnstep.cli.cache_fill MODEL_PATH KEY_JSON` (the child)."""
  with contextlib.suppress(AttributeError, OSError):
    os.nice(10)  # Background work: the user's next command comes first.
  try:
    model_path, the_key = argv[1], json.loads(argv[2])
    print(compiled_cache.fill(model_path, the_key))
    return 0
  except Exception as e:  # pylint: disable=broad-except
    # Detached, with no one to tell: the next cold run tries again.
    print(f"failed: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(_main(sys.argv))
