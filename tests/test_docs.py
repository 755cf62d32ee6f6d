"""The documentation cites only what exists.

Scans README.md, BUILD_NOTES.md and docs/**/*.md (not CHANGELOG.md or
benchmarks/results/, which record history and may name what is gone) for:

- dotted names starting with `rnnstep.` in backticks or code blocks
  (`rnnstep.engine.request.Request`, `rnnstep.generate`): the longest
  importable module prefix is imported and the rest looked up by getattr;
- repository paths in backticks (`rnnstep/engine/loop.py`, `tools/benchmark.py`,
  `tests/data/torch/`): they must exist;
- relative markdown links (`[text](docs/guide/generation.md#stop-strings)`):
  the file must exist and, for a markdown target, the anchor must be a heading.

The same checks read every console script's `--help` (its module docstring
and its flags' help, taken in process from setup.cfg's entry points) and every
public docstring of the package (each module's, and each public function's,
class's and method's: what `help()` shows), read from the source by AST so
that no optional dependency need be installed. There names and paths are
matched in the prose too, backticks or not.

Everywhere (the docs, setup.cfg, --help, the package's whole source): no
stale claims (`STALE`: a moved module's old name, "char models" as what
rnnstep runs, the old count of tools, the bundled model's size), and
benchmarks/README.md lists every log in benchmarks/results/, and the
package's version (setup.cfg, `rnnstep.__version__`) is CHANGELOG.md's newest
released one.

And nothing in the code or the docs points outside the repository at the old
design notes. Each test lists every broken citation as file:line.
"""

import ast
import configparser
import functools
import glob
import importlib
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Where the docs live; history (the changelog, measurement logs) is exempt.
DOC_GLOBS = ("README.md", "BUILD_NOTES.md", "docs/**/*.md")

INLINE_CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
DOTTED = re.compile(r"(?<![\w./-])rnnstep(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(
    r"(?<![\w./~-])((?:rnnstep|tests|tools|docs|benchmarks|\.ci)/[\w./{},-]*)")
TOP_FILES = re.compile(
    r"(?<![\w./-])(README\.md|BUILD_NOTES\.md|CHANGELOG\.md|setup\.cfg|"
    r"setup\.py)(?![\w/])")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A file name in prose, not a dotted Python name.
FILE_NAME = re.compile(r"\.(?:js|json|html|npz|tflite|md|py|txt)$")

# Claims that were once true, or never were, wherever the docs, --help or a
# docstring say them.
STALE = {
    re.compile(r"rnnstep[./]options\b(?!\.py)|rnnstep/options\.py"):
        "the decoding options live in rnnstep/decoding/options.py",
    re.compile(r"recurrent\s+char(?:acter)?\s+models?\b", re.IGNORECASE):
        "rnnstep runs word, subword, byte and RWKV-7 models too",
    re.compile(r"\bfive\s+(?:absl\s+)?(?:tools|command[- ]lines|console "
               r"scripts)", re.IGNORECASE):
        "there are six console scripts (setup.cfg)",
    re.compile(r"must be Embedding\s*->"):
        "rnnstep-convert also reads RWKV-7 and stacks beyond one recurrent "
        "layer",
    re.compile(r"bundled (?:model \()?GRU 1024"):
        "the bundled model is a GRU 768",
}


def doc_files():
  found = set()
  for pattern in DOC_GLOBS:
    found.update(glob.glob(os.path.join(ROOT, pattern), recursive=True))
  return sorted(found)


def lines_of(path):
  """(line number, text, inside a fenced code block) for each line."""
  fenced = False
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if FENCE.match(line):
        fenced = not fenced
        continue
      yield number, line, fenced


def where(path, number):
  return f"{os.path.relpath(path, ROOT)}:{number}"


def expand_braces(path):
  """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`] (one level is all the docs use)."""
  match = re.search(r"\{([^{}]*)\}", path)
  if not match:
    return [path]
  return [out for part in match.group(1).split(",")
          for out in expand_braces(
              path[:match.start()] + part + path[match.end():])]


@functools.lru_cache(maxsize=None)
def resolves(name):
  """Whether `rnnstep.a.b.c` is a module, or an attribute chain under one."""
  parts = name.split(".")
  for cut in range(len(parts), 0, -1):
    try:
      target = importlib.import_module(".".join(parts[:cut]))
    except ImportError:
      continue
    try:
      for attribute in parts[cut:]:
        target = getattr(target, attribute)
    except AttributeError:
      return False
    return True
  return False


def slug(heading):
  """GitHub's anchor for a heading: lower case, punctuation dropped."""
  text = re.sub(r"`", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
  out = set()
  for _, line, fenced in lines_of(path):
    if not fenced and line.startswith("#"):
      out.add(slug(line.lstrip("#")))
  return out


def console_scripts():
  """{script: module} of setup.cfg's console scripts."""
  config = configparser.ConfigParser()
  config.read(os.path.join(ROOT, "setup.cfg"), encoding="utf-8")
  out = {}
  for line in config["options.entry_points"]["console_scripts"].splitlines():
    if line.strip():
      script, target = (part.strip() for part in line.split("="))
      out[script] = target.split(":")[0]
  return out


def help_texts():
  """[(where, text)]: each console script's --help, as `common.parse_flags`
  prints it (its module docstring and its flags' help), taken in process."""
  out = []
  for script, module_name in sorted(console_scripts().items()):
    module = importlib.import_module(module_name)
    text = f"{module.__doc__}\n{module.FLAGS.get_help()}"
    out.append((f"{script} --help", text))
  return out


def package_modules():
  """Every module file of the package, relative to ROOT."""
  return sorted(os.path.relpath(path, ROOT) for path in glob.glob(
      os.path.join(ROOT, "rnnstep", "**", "*.py"), recursive=True))


def docstrings(relative):
  """[(line, text)]: a module's docstring and its public functions', classes'
  and their public methods' (what `help()` shows), read from the source."""
  with open(os.path.join(ROOT, relative), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  out = []

  def add(node):
    text = ast.get_docstring(node, clean=False)
    if text:
      out.append((node.body[0].lineno, text))

  add(tree)
  for node in tree.body:
    if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and not node.name.startswith("_")):
      add(node)
      if isinstance(node, ast.ClassDef):
        for method in node.body:
          if (isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
              and (not method.name.startswith("_")
                   or method.name == "__init__")):
            add(method)
  return out


def prose():
  """[(where, text)]: every --help text and every public docstring."""
  out = help_texts()
  for relative in package_modules():
    out.extend((f"{relative}:{line}", text)
               for line, text in docstrings(relative))
  return out


def citation_errors(where_, text):
  """The names and paths `text` cites that do not exist (prose: backticks or
  not)."""
  broken = []
  for name in DOTTED.findall(text):
    name = name.rstrip(".")
    if FILE_NAME.search(name):  # rnnstep.js, the web export's module
      continue
    if not resolves(name):
      broken.append(f"{where_}: `{name}`")
  for match in PATH.finditer(text):
    if text.startswith("<", match.end()):  # tests/test_<x>.py
      continue
    for expanded in expand_braces(match.group(1).rstrip(".,:;")):
      if not os.path.exists(os.path.join(ROOT, expanded)):
        broken.append(f"{where_}: `{expanded}`")
  return broken


def stale_claims(where_, text):
  return [f"{where_}: {match.group(0)!r}: {why}"
          for pattern, why in STALE.items() for match in pattern.finditer(text)]


class DocsTest(unittest.TestCase):

  def test_there_are_docs_to_check(self):
    files = [os.path.relpath(p, ROOT) for p in doc_files()]
    self.assertIn("README.md", files)
    self.assertIn(os.path.join("docs", "README.md"), files)

  def test_every_cited_rnnstep_name_exists(self):
    broken = []
    for path in doc_files():
      for number, line, fenced in lines_of(path):
        spans = [line] if fenced else INLINE_CODE.findall(line)
        for span in spans:
          for name in DOTTED.findall(span):
            if not resolves(name):
              broken.append(f"{where(path, number)}: `{name}`")
    self.assertEqual(broken, [], "names the docs cite that do not exist:\n" +
                     "\n".join(broken))

  def test_every_cited_path_exists(self):
    broken = []
    for path in doc_files():
      for number, line, fenced in lines_of(path):
        if fenced:
          continue
        for span in INLINE_CODE.findall(line):
          cited = [m.group(1) for m in PATH.finditer(span)
                   if not span.startswith("<", m.end())]  # tests/test_<x>.py
          for one in cited + TOP_FILES.findall(span):
            for expanded in expand_braces(one.rstrip(".,:;")):
              if not os.path.exists(os.path.join(ROOT, expanded)):
                broken.append(f"{where(path, number)}: `{expanded}`")
    self.assertEqual(broken, [], "paths the docs cite that do not exist:\n" +
                     "\n".join(broken))

  def test_every_relative_link_resolves(self):
    broken = []
    for path in doc_files():
      # Fenced lines blanked (line numbers kept); a link may wrap lines.
      text = "\n".join("" if fenced else INLINE_CODE.sub("", line.rstrip("\n"))
                       for _, line, fenced in lines_of(path))
      for match in LINK.finditer(text):
        target = match.group(1)
        number = text.count("\n", 0, match.start(1)) + 1
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
          continue
        file_part, _, anchor = target.partition("#")
        linked = (os.path.normpath(os.path.join(os.path.dirname(path),
                                                file_part))
                  if file_part else path)
        if not os.path.exists(linked):
          broken.append(f"{where(path, number)}: ({target}): no such file")
        elif anchor and linked.endswith(".md") and (
            anchor not in anchors(linked)):
          broken.append(f"{where(path, number)}: ({target}): no heading "
                        f"#{anchor} in {os.path.relpath(linked, ROOT)}")
    self.assertEqual(broken, [], "links that do not resolve:\n" +
                     "\n".join(broken))

  def test_every_help_text_has_its_console_script(self):
    scripts = console_scripts()
    self.assertEqual(len(scripts), 6, scripts)
    self.assertEqual(len(help_texts()), len(scripts))

  def test_help_and_docstrings_cite_what_exists(self):
    broken = []
    for where_, text in prose():
      broken.extend(citation_errors(where_, text))
    self.assertEqual(broken, [], "names and paths that --help texts and "
                     "docstrings cite that do not exist:\n" +
                     "\n".join(broken))

  def test_no_stale_claims(self):
    texts = help_texts()  # The package's docstrings: with its source below.
    for path in doc_files() + [os.path.join(ROOT, "setup.cfg")] + [
        os.path.join(ROOT, relative) for relative in package_modules()]:
      with open(path, encoding="utf-8") as f:
        texts.append((os.path.relpath(path, ROOT), f.read()))
    broken = []
    for where_, text in texts:
      broken.extend(stale_claims(where_, text))
    self.assertEqual(broken, [], "claims that are no longer true:\n" +
                     "\n".join(broken))

  def test_the_benchmarks_index_lists_every_log(self):
    with open(os.path.join(ROOT, "benchmarks", "README.md"),
              encoding="utf-8") as f:
      index = f.read()
    missing = [name for name in sorted(os.listdir(
        os.path.join(ROOT, "benchmarks", "results")))
               if name.endswith(".md") and f"(results/{name})" not in index]
    self.assertEqual(missing, [], "logs benchmarks/README.md does not list")

  def test_the_version_is_the_newest_released_one(self):
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
      released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$",
                            f.read(), re.MULTILINE)
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"), encoding="utf-8")
    import rnnstep  # pylint: disable=g-import-not-at-top
    self.assertTrue(released, "CHANGELOG.md has no `## [x.y.z] - date`")
    self.assertEqual(config["metadata"]["version"], released[0])
    self.assertEqual(rnnstep.__version__, released[0])

  def test_nothing_points_at_the_old_design_notes(self):
    needle = "shared" + "/design"  # Spelled apart so this file passes.
    places = [os.path.join(ROOT, name) for name in ("README.md",
                                                    "BUILD_NOTES.md")]
    for top in ("rnnstep", "tests", "tools", "docs"):
      for directory, _, files in os.walk(os.path.join(ROOT, top)):
        places.extend(os.path.join(directory, name) for name in files
                      if name.endswith((".py", ".md", ".txt", ".cfg")))
    broken = []
    for place in places:
      if not os.path.exists(place):
        continue
      with open(place, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
          if needle in line:
            broken.append(f"{where(place, number)}: {line.strip()}")
    self.assertEqual(broken, [], "references outside the repository (write "
                     "what they need into docs/ instead):\n" +
                     "\n".join(broken))


if __name__ == "__main__":
  unittest.main()
