"""The ``env.math`` section: the math environment's tasks and its Python tool's sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field

from tracerl.envs.math.tasks import LEVELS
from tracerl.envs.sandbox import SandboxConfig
from tracerl.schema import check


@dataclass(frozen=True)
class MathEnvConfig:
    """The math environment: tasks and the Python tool."""

    tasks: str = "generated"
    """'generated' (the built-in family) or a path to a JSON / JSONL / parquet task file."""
    num_tasks: int = 256
    """Tasks in the training set (generated: drawn from the training side of the split; file: the first N)."""
    eval_tasks: int = 200
    """Held-out generated tasks for evaluation (never overlap training)."""
    task_seed: int = 0
    """Seed of the generated task family."""
    levels: list[int] = field(default_factory=lambda: list(LEVELS))
    """Levels of the generated tasks (1-5, cycled in this order; envs/math/tasks.py), e.g. [1, 2] for a testbed of
    the one-call tasks."""
    stateful_python: bool = True
    """Re-run earlier cells before each new one (notebook-like state by replay)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox limits."""

    def __post_init__(self) -> None:
        check(self.num_tasks >= 1, f"env.math.num_tasks must be >= 1 (got {self.num_tasks})")
        check(self.eval_tasks >= 1, f"env.math.eval_tasks must be >= 1 (got {self.eval_tasks})")
        check(
            bool(self.levels) and all(level in LEVELS for level in self.levels),
            f"env.math.levels must be a non-empty list of levels from {list(LEVELS)} (got {list(self.levels)})",
        )
