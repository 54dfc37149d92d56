"""Workflows: the only layer that wires Ray, MLflow, Tune and the CLI (console script ``tracerl``).

One room per command family, imports flowing one way (docs/design.md; tests/test_layout.py checks it):
ops -> lm -> tracking -> bootstrap -> train -> study -> pipeline -> bench -> cli
(a room imports only rooms to its left).
"""

ROOMS = ("ops", "lm", "tracking", "bootstrap", "train", "study", "pipeline", "bench", "cli")
