"""Objects whose pickles ask to run code, for the tests that check a reader
refuses them with nothing run (pickling them runs nothing)."""

import os


class RunsCode:
  """Pickles as a call of os.system that would create `marker`."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))
