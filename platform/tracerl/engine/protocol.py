"""What the step driver needs from an environment-plus-sampler backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tracerl.algos.allocators import Expansion
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.react import Action, ToolSpec
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


@dataclass(frozen=True)
class ToolResult:
    """An executed tool call: what the agent sees and the environment state after it."""

    observation: str
    state: Any
    """The episode's environment state after the call; stored on the turn node so continuations fork there."""
    calls: int = 1
    """Tool executions this call cost."""
    replayed: int = 0
    """Earlier tool calls re-executed to rebuild state (deterministic replay)."""
    retried: int = 0
    """Times the call was re-submitted because the worker running it died."""


class ToolEnv(Protocol):
    """A ReAct tool environment. States are immutable values: forking at a prefix re-uses its state."""

    tools: Sequence[ToolSpec]
    fork_mode: str
    """'snapshot' (states are copied values) or 'replay' (states are recorded calls re-run on demand)."""

    def initial_state(self, prompt: Prompt) -> Any: ...

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult: ...

    def reward(self, prompt: Prompt, answer: str | None) -> float: ...


def execute_batch(env: ToolEnv, calls: Sequence[tuple[Prompt, Any, Action]]) -> list[ToolResult]:
    """Run a round's tool calls: through ``env.execute_batch`` where the environment offers it (a pool runs
    them in parallel), else one by one. Results come back in call order."""
    if not calls:
        return []
    batch = getattr(env, "execute_batch", None)
    if batch is not None:
        return list(batch(calls))
    return [env.execute(p, s, a) for p, s, a in calls]
