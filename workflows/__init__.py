"""Workflows: the only layer that wires Ray, MLflow, Tune and the CLI (console script ``tracerl``).

One room per command family, imports flowing one way (docs/design.md; tests/test_layout.py checks it):
ops -> lm -> tracking -> bootstrap -> train -> study -> pipeline -> bench -> cli -> experiments
(a room imports only rooms to its left). The command rooms hold what users run every day; experiments holds the
one-study instruments (``bench peer``, ``limit``, ``targets``, ``baseline``, ``testbeds``, ``update``, ``sync``, the
pipeline scale model, the GPU check), which no command room imports.
"""

COMMAND_ROOMS = ("ops", "lm", "tracking", "bootstrap", "train", "study", "pipeline", "bench", "cli")
ROOMS = (*COMMAND_ROOMS, "experiments")

COMMAND_FAMILIES = {"experiments": "tracerl.workflows.experiments.commands:FAMILY"}
"""The command families outside the command rooms, as lazy ``"module:attr"`` entries the CLI loads the way it loads
plug-ins (workflows/cli/families.py); an installed package adds its own under the entry-point group
``tracerl.commands``. The one place that names the experiments room."""
