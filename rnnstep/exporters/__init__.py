"""Exports: the whole generation loop as a file another runtime serves.

  saved_model   `rnnstep.export`: a strings-in, strings-out SavedModel
  litert        `rnnstep.export_litert`: model.tflite (builtin ops) + vocab.json
  web           `rnnstep.export(..., format="web")`: index.html, rnnstep.js,
                model.json, weights.bin (generation in the browser)
"""
