"""What the step driver needs from an environment-plus-sampler backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tracerl.algos.allocators import Expansion
from tracerl.engine.ledger import BudgetLedger
from tracerl.tree import RolloutTree
from tracerl.types import Prompt


class TreeBackend(Protocol):
    """Rolls out bare episodes and continuations; owns its own seeded randomness."""

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        """``counts[i]`` bare rollouts of ``prompts[i]``; one tree per prompt."""
        ...

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        """Add each expansion's extra bare rollouts, then its continuations, in place."""
        ...


def account(ledger: BudgetLedger, trees: Sequence[RolloutTree]) -> None:
    """Fill the rollout counts of ``ledger`` from finished trees (token counts come from backends)."""
    for t in trees:
        ledger.bare_rollouts += t.num_bare
        ledger.continuations += t.num_paths - t.num_bare
        ledger.turns += len(t.nodes) - 1
