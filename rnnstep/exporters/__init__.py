"""Exports: the whole generation loop as a file another runtime serves.

  saved_model   `rnnstep.export`: a strings-in, strings-out SavedModel
  web           `rnnstep.export(..., format="web")`: index.html, rnnstep.js,
                model.json, weights.bin (generation in the browser)
  (LiteRT)      `rnnstep.export_litert`: model.tflite (builtin ops) +
                vocab.json, in its own package, `rnnstep.litert`, with the
                runner, the cache and the warm path that use it

This front holds the dispatcher, `export`, and imports the exporters (and so
TensorFlow) only when one is called.
"""

from rnnstep import errors

FORMATS = ("saved_model", "web", "tflite")


# `format` is the keyword the issue and the CLI flag use.
def export(model, export_dir, *, jit_compile=False, format="saved_model",
           regex=()) -> str:  # pylint: disable=redefined-builtin
  """Writes `model` as a SavedModel with string signatures
  (`saved_model.export_saved_model`), or (`format=`) as a web export or a
  LiteRT model.

  Args:
    model: an `rnnstep.Model`.
    export_dir: the directory to create; it must not exist yet or be empty.
    jit_compile: False or None (graph), True or "elementwise" (see
      `saved_model.ServingModule`); SavedModel only.
    regex: the patterns a SavedModel serves (`generate_constrained`'s
      `regex` input names one), each compiled now: a graph cannot compile
      one at serving time. A str or a list of str; SavedModel only.
    format: "saved_model"; "web" (`rnnstep.exporters.web.export_web`: a
      page and ES module that generate in the browser); "tflite"
      (`rnnstep.export_litert`).

  Returns:
    The export directory.

  Raises:
    ValueError: export_dir exists and is not empty, an unknown format,
      jit_compile or regex with another format, a bad pattern
      (`errors.ArgumentError`), or a model that format refuses.
  """
  # pylint: disable-next=g-import-not-at-top
  from rnnstep.model import check
  check.check_model(model)
  export_dir = errors.check_path(export_dir, "export_dir", "directory")
  if format not in FORMATS:
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got "
                     f"{format!r}")
  # pylint: disable=g-import-not-at-top
  if format != "saved_model":
    if jit_compile:
      raise ValueError(f"jit_compile applies to format='saved_model' only, "
                       f"not {format!r}; drop it")
    if regex:
      raise ValueError(f"regex applies to format='saved_model' only, not "
                       f"{format!r}; drop it")
    if format == "web":
      from rnnstep.exporters import web
      return web.export_web(model, export_dir)
    from rnnstep.litert import export as litert
    return litert.export_litert(model, export_dir)
  from rnnstep.exporters import saved_model
  return saved_model.export_saved_model(model, export_dir,
                                        jit_compile=jit_compile, regex=regex)
