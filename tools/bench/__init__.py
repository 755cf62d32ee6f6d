"""The sections and parts of tools/benchmark.py (see its docstring)."""
