"""Workflows: the only layer that wires Ray, MLflow, Tune and the CLI (console script ``tracerl``)."""
