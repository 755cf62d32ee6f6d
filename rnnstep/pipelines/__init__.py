"""Apache Beam pipelines: RunInference model handlers, and a pipeline command.

    from rnnstep import pipelines
    handler = pipelines.CompletionsModelHandler("model.npz", max_tokens=200)

`handlers.py` holds the model handlers (generation and scoring);
`pipeline.py` the pipeline that `python -m rnnstep.pipelines` runs
(docs/guide/beam.md). Apache Beam is an optional dependency
(`pip install 'rnnstep[beam]'`): `import rnnstep` never imports this package.
("Beam" elsewhere in rnnstep means beam search, `engine/beams.py`.)
"""

from rnnstep.pipelines.handlers import CompletionsModelHandler
from rnnstep.pipelines.handlers import LoadedModel
from rnnstep.pipelines.handlers import LoglikelihoodModelHandler
from rnnstep.pipelines.handlers import prompt_index
from rnnstep.pipelines.pipeline import main
from rnnstep.pipelines.pipeline import run

__all__ = ["CompletionsModelHandler", "LoadedModel",
           "LoglikelihoodModelHandler", "prompt_index", "main", "run"]
