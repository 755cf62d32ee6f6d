"""`python -m rnnstep.pipelines`: the pipeline's command line (pipeline.py)."""

from rnnstep.pipelines import pipeline

if __name__ == "__main__":
  raise SystemExit(pipeline.main())
