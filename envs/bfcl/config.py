"""The ``env.bfcl`` section: BFCL categories, the train/test split, documentation and call limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from tracerl.schema import check, check_choices

Category = Literal["base", "miss_func", "miss_param", "long_context"]
"""The BFCL v4 multi-turn categories the environment serves."""


@dataclass(frozen=True)
class BfclEnvConfig:
    """The BFCL v4 multi-turn function-calling environment (envs/bfcl)."""

    categories: list[Category] = field(
        default_factory=lambda: ["base", "miss_func", "miss_param", "long_context"]
    )
    """Multi-turn categories to draw tasks from."""
    num_tasks: int = 256
    """Training tasks (from the training side of the split)."""
    eval_tasks: int = 200
    """Held-out tasks (from the test side of the split)."""
    split_seed: int = 0
    """Seed of the train/test split."""
    test_fraction: float = 0.2
    """Share of each category held out for evaluation."""
    docs: Literal["full", "brief"] = "full"
    """Function documentation shown to the policy: 'full' (BFCL's docs) or 'brief' (each function's own sentence,
    parameter names and types; about a third of the tokens, for small models and context windows)."""
    call_timeout_s: float = 10.0
    """Wall-clock limit on executing one turn's calls (recorded calls replayed first); past it: an error observation."""

    def __post_init__(self) -> None:
        check_choices(self, "env.bfcl")
        check(self.call_timeout_s > 0, f"env.bfcl.call_timeout_s must be > 0 (got {self.call_timeout_s})")
        check(self.num_tasks >= 1 and self.eval_tasks >= 1, "env.bfcl.num_tasks and eval_tasks must be >= 1")
        check(
            0.0 < self.test_fraction < 1.0,
            f"env.bfcl.test_fraction must be in (0, 1) (got {self.test_fraction})",
        )
        check(
            bool(self.categories),
            f"env.bfcl.categories must be a non-empty list of {', '.join(get_args(Category))}",
        )
        check(
            len(set(self.categories)) == len(self.categories),
            f"env.bfcl.categories lists a category twice (got {list(self.categories)})",
        )
