"""The quick tier's cut inside a sweep: which cases of a parameterized test run
under `python -m pytest -m "not slow"` (tests/conftest.py applies it).

For pytest's own parametrize, `quick_params` makes the cases it does not name
`pytest.param(..., marks=pytest.mark.slow)`. absl's parameterized cases cannot
carry marks, so the decorator `quick_cases` names the cases that stay quick,
and conftest marks the test's other cases slow.
"""

import dataclasses

import pytest


@dataclasses.dataclass(frozen=True)
class QuickCases:
  name: str  # The test method's own name, before absl adds the case's.
  cases: frozenset


def quick_cases(*cases):
  """Under an absl parameterized decorator: the cases named (a named case by
  its name, another by its index) stay quick; the others are slow."""
  def decorate(test):
    test.quick_cases = QuickCases(test.__name__, frozenset(map(str, cases)))
    return test
  return decorate


def is_slow_case(item):
  """Whether `item` is a case that its test's `quick_cases` leaves out."""
  quick = getattr(getattr(item, "obj", None), "quick_cases", None)
  if not isinstance(quick, QuickCases) or not item.name.startswith(quick.name):
    return False
  return item.name[len(quick.name):].lstrip("_") not in quick.cases


def quick_params(values, *quick):
  """`pytest.mark.parametrize` values in which only those in `quick` stay in
  the quick tier: the others come as `pytest.param(..., marks=slow)` (a tuple
  value is one case of several arguments)."""
  return [value if value in quick else
          pytest.param(*(value if isinstance(value, tuple) else (value,)),
                       marks=pytest.mark.slow)
          for value in values]
