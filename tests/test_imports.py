"""The import graph of rnnstep/: no circle anywhere, and the readers that need no TF.

Read from the source by AST (every `import` and `from ... import`, at module
level or inside a function: a deferred import that breaks a circle at import
time still ties the two modules into one), so the check needs no imports of
its own and names the circle it finds.
"""

import ast
import os
import subprocess
import sys
import unittest

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "rnnstep"


def module_files():
  """{dotted module name: file path} for every .py file under rnnstep/."""
  found = {}
  for directory, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(directory, name)
      parts = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      found[".".join(parts)] = path
  return found


def imports_of(path, name, modules):
  """The rnnstep modules `path` (module `name`) imports, anywhere in it."""
  package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(base + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      # `from a import b` imports a.b when that is a module, else a.
      targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules
                 else base for alias in node.names]
    else:
      continue
    for target in targets:
      while target and target not in modules:  # `import a.b.c` -> a.b.c, ...
        target = target.rpartition(".")[0]
      if target and target != name:
        out.add(target)
  return out


def import_graph():
  modules = module_files()
  return {name: imports_of(path, name, modules)
          for name, path in modules.items()}


# The pipeline's layers, lowest first: a module imports only from its own part
# (its subpackage, or itself) and from parts in lower layers. Two parts in one
# layer know nothing of each other (the model and decoding; the engine and the
# converters). `rnnstep` itself (the lazy front door) sits below the CLIs.
LAYERS = (
    ("rnnstep.errors", "rnnstep.staging", "rnnstep.version"),
    ("rnnstep.model", "rnnstep.decoding"),
    # records: the one check of a request's values, under every front end.
    ("rnnstep.engine", "rnnstep.convert", "rnnstep.records"),
    ("rnnstep.api",),
    # The LiteRT export, its runner and cache, and rnnstep-generate's warm
    # path (below the exporters: `rnnstep.export` dispatches to it).
    # states: a model's states and state files (on top of api's checks).
    ("rnnstep.litert", "rnnstep.states"),
    ("rnnstep.tuning", "rnnstep.exporters", "rnnstep.inspect"),
    ("rnnstep",),
    ("rnnstep.cli", "rnnstep.pipelines"),  # Front ends: command lines, Beam.
    ("rnnstep.serve",),  # A front end: imports cli.common for its flags.
)


def part_of(module):
  """The layer part a module belongs to: `rnnstep.engine.loop` -> engine."""
  return ".".join(module.split(".")[:2])


def layer_of(part):
  for index, parts in enumerate(LAYERS):
    if part in parts:
      return index
  raise KeyError(f"{part} has no layer in tests/test_imports.py LAYERS")


def layer_violations(graph):
  """['a imports b (layer i part p >= layer j)'] for each edge going up."""
  found = []
  for name, targets in sorted(graph.items()):
    here = part_of(name)
    for target in sorted(targets):
      there = part_of(target)
      if there != here and layer_of(there) >= layer_of(here):
        found.append(f"{name} (layer {layer_of(here)}) imports {target} "
                     f"(layer {layer_of(there)})")
  return found


def find_cycle(graph):
  """One import circle as a list of modules (first == last), or None."""
  state = {}  # name -> "open" while on the DFS stack, "done" after.
  stack = []

  def visit(name):
    state[name] = "open"
    stack.append(name)
    for nxt in sorted(graph.get(name, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        cycle = visit(nxt)
        if cycle:
          return cycle
    stack.pop()
    state[name] = "done"
    return None

  for name in sorted(graph):
    if name not in state:
      cycle = visit(name)
      if cycle:
        return cycle
  return None


class ImportGraphTest(unittest.TestCase):

  def test_no_import_circle_in_rnnstep(self):
    cycle = find_cycle(import_graph())
    self.assertIsNone(cycle, " -> ".join(cycle or ()))

  def test_no_module_imports_a_layer_above_or_beside_its_own(self):
    self.assertEqual(layer_violations(import_graph()), [])

  def test_every_part_has_a_layer(self):
    for name in import_graph():
      layer_of(part_of(name))  # KeyError names a new part without a layer.

  def test_the_layer_checker_sees_an_upward_import(self):
    self.assertEqual(
        layer_violations({"rnnstep.decoding.sampling": {"rnnstep.engine.loop"},
                          "rnnstep.model.cells": {"rnnstep.decoding.options"},
                          "rnnstep.engine.loop": {"rnnstep.model.cells"}}),
        ["rnnstep.decoding.sampling (layer 1) imports rnnstep.engine.loop "
         "(layer 2)",
         "rnnstep.model.cells (layer 1) imports rnnstep.decoding.options "
         "(layer 1)"])

  def test_the_checker_sees_edges_and_circles(self):
    graph = import_graph()
    # Edges the layering promises (paths.py owns the choice, tune() above it).
    self.assertIn("rnnstep.engine.paths", graph["rnnstep.api"])
    self.assertIn("rnnstep.engine.tuning_cache", graph["rnnstep.engine.paths"])
    self.assertIn("rnnstep.api", graph["rnnstep.tuning"])
    self.assertIn("rnnstep.cli.common", graph["rnnstep.cli.tune"])
    self.assertNotIn("rnnstep.tuning", graph["rnnstep.engine.paths"])
    self.assertNotIn("rnnstep.api", graph["rnnstep.engine.paths"])
    self.assertEqual(find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}),
                     ["a", "b", "c", "a"])
    self.assertIsNone(find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}))

  def test_only_rnnstep_pipelines_imports_apache_beam(self):
    # An optional dependency: `import rnnstep` and every other module run
    # without it (tests/test_keras_free.py checks a fresh interpreter too).
    importers = set()
    for name, path in module_files().items():
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
      for node in ast.walk(tree):
        names = ([alias.name for alias in node.names]
                 if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [])
        if any(n.split(".")[0] == "apache_beam" for n in names):
          importers.add(name)
    self.assertEqual({part_of(name) for name in importers},
                     {"rnnstep.pipelines"})

  def assert_loads_no_tensorflow(self, statements):
    """Runs `statements` in a fresh interpreter: none of TensorFlow, Keras
    and numpy is imported."""
    probe = (f"import sys; {statements}; "
             "print(sorted(m for m in ('tensorflow', 'keras', 'numpy') "
             "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          check=True)
    self.assertEqual(proc.stdout.strip(), "[]", proc.stderr)

  @pytest.mark.light_process  # A fresh interpreter without TensorFlow.
  def test_tuning_cache_and_cpu_read_without_tensorflow(self):
    self.assert_loads_no_tensorflow(
        "from rnnstep.engine import cpu, tuning_cache; "
        "cpu.info(); tuning_cache.machine_key(); "
        "tuning_cache.entries(tuning_cache.cache_file())")

  @pytest.mark.light_process  # A fresh interpreter without TensorFlow.
  def test_the_warm_path_imports_without_tensorflow(self):
    """A warm rnnstep-generate imports these before it knows whether
    TensorFlow will be needed: none imports it (or numpy) at module level."""
    self.assert_loads_no_tensorflow(
        "from rnnstep.litert import cache, fill, inputs, runner, warm; "
        "from rnnstep import version")


# A module past these is doing more than one job (issue #59's rooms): split
# it by role before adding to it.
MAX_MODULE_LINES = 900
MAX_CLASS_LINES = 500


class RoomSizeTest(unittest.TestCase):

  def test_no_module_or_class_outgrows_its_room(self):
    too_big = []
    for name, path in sorted(module_files().items()):
      with open(path, encoding="utf-8") as f:
        source = f.read()
      lines = source.count("\n")
      if lines > MAX_MODULE_LINES:
        too_big.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
      for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.ClassDef):
          size = node.end_lineno - node.lineno + 1
          if size > MAX_CLASS_LINES:
            too_big.append(f"{name}.{node.name}: {size} lines "
                           f"(at most {MAX_CLASS_LINES})")
    self.assertEqual(too_big, [])


if __name__ == "__main__":
  unittest.main()
