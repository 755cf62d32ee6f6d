"""rnnstep's version, at the lowest layer.

`rnnstep/__init__.py` re-exports it as `rnnstep.__version__`; the
compiled-artifact cache keys on it (`rnnstep.litert.cache.key`) without
importing the package's front door.
"""

__version__ = "0.29.0"
