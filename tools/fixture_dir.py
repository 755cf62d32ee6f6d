"""The `--out` flag every `tools/make_*_fixtures.py` script shares.

Each script writes its fixtures into `tests/data/<name>` unless `--out`
says otherwise; this parses that flag (the script's first docstring line as
the description) and makes the directory.
"""

import argparse
import os

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                    "data")


def output_dir(doc: str, name: str) -> str:
  """Parses `--out` (default `tests/data/<name>`), makes it, returns it.

  Args:
    doc: the script's `__doc__`; its first line describes the script.
    name: the fixture directory's name under `tests/data`.

  Returns:
    The output directory, which exists.
  """
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(DATA, name))
  out = parser.parse_args().out
  os.makedirs(out, exist_ok=True)
  return out
