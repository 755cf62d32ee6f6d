"""A restarted server's time to its compiled speed (issue 60's done-when:
"a restarted default server is at its compiled speed within 10 s of
/health").

    python tools/bench/restart.py                      # the bundled model
    python tools/bench/restart.py --model=m.npz --restarts=3 -- --max_batch=8

Starts `rnnstep-serve` with its defaults (and the flags after `--`) over an
empty cache folder (`RNNSTEP_CACHE_DIR`, a temporary one): the first start
compiles its XLA programs behind `/health` and keeps them on disk. Then it
stops the server (SIGTERM) and starts it again --restarts times over the
same folder. For each start it prints when `/health` first answered 200 and
when `programs_compiling` reached 0 after it (`tools/bench/serve.py`'s
`start`), the XLA programs on disk (no new one after a restart: nothing was
compiled again) and the machine's load.
"""

import logging
import os
import signal
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
from tools.bench import serve  # pylint: disable=g-import-not-at-top,wrong-import-position

_RESTARTS = flags.DEFINE_integer("restarts", 2, "Starts after the first.")


def _entries(folder: str) -> int:
  """The compiled programs TensorFlow keeps in the folder (its `.pb`s)."""
  return sum(name.endswith(".pb") for _, _, names in
             os.walk(os.path.join(folder, "xla")) for name in names)


def main(argv):
  logging.getLogger("httpx").setLevel(logging.WARNING)
  extra = [arg for arg in argv[1:] if arg.startswith("-")]
  with tempfile.TemporaryDirectory(prefix="rnnstep_restart_") as folder:
    for start in range(1 + _RESTARTS.value):
      before = _entries(folder)
      print(f"start {start} ({serve.load()}):", flush=True)
      # TF_XLA_FLAGS emptied: this process's own cache folder (named there
      # when it imported rnnstep) is not the server's.
      process, _ = serve.start("serve", [f"RNNSTEP_CACHE_DIR={folder}",
                                         "TF_XLA_FLAGS=", *extra])
      process.send_signal(signal.SIGTERM)
      process.wait(timeout=120)
      print(f"  XLA programs on disk {before} -> {_entries(folder)}",
            flush=True)


if __name__ == "__main__":
  app.run(main)
