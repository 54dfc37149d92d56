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
    """Rolls out bare episodes and continuations; owns its own seeded randomness.

    Every sampled turn (or simulated episode) draws from a seed keyed by (run seed, step, prompt id, path, turn)
    (``tracerl.engine.seeds``), so the trees depend on the seed and the step alone; a backend knows its step
    (``RolloutPool.begin_step``, ``TreeRolloutEngine.step``, ``Simulator.step``)."""

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


@dataclass(frozen=True)
class AnswerResult:
    """What an environment does with a turn that ends without a tool call (``ToolEnv.on_answer``).

    Either the episode ends (``observation`` is None) with ``reward``, or it goes on: ``observation`` is the
    next user message (rendered by the template's ``user_message``) and ``state`` the state after it.
    """

    reward: float | None = None
    """The episode's reward when it ends here (None: the engine asks ``reward(prompt, answer)``)."""
    observation: str | None = None
    """The next user message, or None to end the episode."""
    state: Any = None
    """The environment state after the user message (stored on the turn node, so continuations fork there)."""


class ToolEnv(Protocol):
    """A ReAct tool environment. States are immutable values: forking at a prefix re-uses its state.

    Optional hooks the engine uses when an environment has them (``getattr``; without them an episode has
    one user message, fixed tools and a reward from the final answer):

    - ``tools_for(prompt, state) -> Sequence[ToolSpec]``: the tools available at ``state`` (per task, and
      per user turn where tools are added mid-episode); used to render the prompt (at the initial state)
      and to parse every turn. Default: ``tools``.
    - ``on_answer(prompt, state, action) -> AnswerResult | None``: called for every ANSWER turn (a response
      without calls). Multi-turn tasks return the next user message and state, and at the last user turn
      the reward (computed from ``state``, e.g. by replaying its recorded calls). None: the default, the
      episode ends with ``reward(prompt, action.answer)``.

    A TOOL action may carry several calls (``action.calls``); ``execute`` runs them all and returns one
    observation.
    """

    tools: Sequence[ToolSpec]
    fork_mode: str
    """'snapshot' (states are copied values) or 'replay' (states are recorded calls re-run on demand)."""

    def initial_state(self, prompt: Prompt) -> Any: ...

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult: ...

    def reward(self, prompt: Prompt, answer: str | None) -> float: ...


def tools_for(env: ToolEnv, prompt: Prompt, state: Any) -> Sequence[ToolSpec]:
    """The tools available to ``prompt``'s episode at ``state`` (``env.tools_for`` where offered, else ``env.tools``)."""
    hook = getattr(env, "tools_for", None)
    return env.tools if hook is None else hook(prompt, state)


def on_answer(env: ToolEnv, prompt: Prompt, state: Any, action: Action) -> AnswerResult | None:
    """``env.on_answer`` where offered (a multi-turn environment's next user message, or its final reward)."""
    hook = getattr(env, "on_answer", None)
    return None if hook is None else hook(prompt, state, action)  # type: ignore[no-any-return]


def execute_batch(env: ToolEnv, calls: Sequence[tuple[Prompt, Any, Action]]) -> list[ToolResult]:
    """Run a round's tool calls: through ``env.execute_batch`` where the environment offers it (a pool runs
    them in parallel), else one by one. Results come back in call order."""
    if not calls:
        return []
    batch = getattr(env, "execute_batch", None)
    if batch is not None:
        return list(batch(calls))
    return [env.execute(p, s, a) for p, s, a in calls]
