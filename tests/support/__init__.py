"""Helpers shared by the tests (and tools/): references, model builders, runners.

Test files (`tests/test_*.py`) hold tests only; whatever more than one of
them uses lives here.
"""
