"""The contracts of the engine: what the step driver needs from a backend, and the environment base classes.

``Env`` is the base of every environment (its registry-level hooks), ``ToolEnv`` of the ReAct tool
environments (the per-episode part the rollout engine calls). Both give every optional hook a default, so
call sites call hooks directly. Environment authors import them from ``tracerl.envs.base``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

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
    timed_out: bool = False
    """The call ran past the environment's time limit and was stopped (its observation says so)."""


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


class Env:
    """Base class of every environment: what workflows, the registry and the actor pools call on one.

    Subclasses override what they offer; every hook below has a documented default, so callers call hooks
    directly (no ``getattr`` probing). Class attributes describe the environment to the config loader:

    - ``config``: the dataclass of the environment's settings, read from ``env.<section>`` (None: none).
    - ``tool_env``: a ReAct tool environment the language-model workflows can run on (``ToolEnv`` sets it).
    - ``true_values``: its prompts carry the true success probability (what the oracle predictor reads).
    """

    config: ClassVar[type | None] = None
    tool_env: ClassVar[bool] = False
    true_values: ClassVar[bool] = False
    fork_mode: str = "snapshot"
    """'snapshot' (states are copied values) or 'replay' (states are recorded calls re-run on demand)."""

    @classmethod
    def from_config(cls, env_cfg: Any, services: Mapping[str, Any] | None = None) -> Self:
        """One instance from the resolved ``env`` config (called in every environment actor); ``services`` are
        the run's shared objects named by ``services`` (absent without Ray: build them in-process)."""
        raise NotImplementedError(f"{cls.__name__} does not implement from_config(env_cfg)")

    @staticmethod
    def prompts(env_cfg: Any, held_out: bool = False) -> list[Prompt]:
        """The training prompts, or the held-out evaluation prompts (never overlapping training)."""
        raise NotImplementedError("this environment does not implement prompts(env_cfg, held_out)")

    @staticmethod
    def services(env_cfg: Any) -> Mapping[str, Callable[[], Any]]:
        """Objects a run builds once and shares between its environment actors (one Ray actor each,
        ``tracerl.actors.services``), by name. Default: none."""
        return {}

    @staticmethod
    def check_data(env_cfg: Any) -> None:
        """Read the configured data files now and raise a clear error (``FileNotFoundError``, ``ValueError``)
        naming the file and the record; workflows call it before they start Ray. Default: nothing to check."""

    @property
    def warnings(self) -> list[str]:
        """Protections or features this machine does not provide (logged by the workflows). Default: none."""
        return []

    def scores(self, prompt: Prompt, answer: str | None) -> dict[str, float]:
        """Answer metrics beyond the reward (search: em, f1), kept on every leaf (``Node.scores``) and logged as
        ``rollout/<metric>`` and ``eval/<metric>``. Default: none."""
        return {}

    def gold_turns(self, prompt: Prompt, template: Any) -> list[str]:
        """The reference turns as model text in ``template``'s format (``tracerl.engine.gold``), replayed by
        ``tracerl bench env --gold``. Default: the environment has none (ValueError)."""
        raise ValueError(f"{type(self).__name__} has no gold_turns(prompt, template): it cannot be replayed")


class ToolEnv(Env):
    """A ReAct tool environment. States are immutable values: forking at a prefix re-uses its state.

    Subclasses implement ``execute`` and ``reward`` and set ``tools``. Without overriding the optional hooks an
    episode has one user message, fixed tools and a reward from the final answer. A TOOL action may carry several
    calls (``action.calls``); ``execute`` runs them all and returns one observation.
    """

    tool_env: ClassVar[bool] = True
    tools: Sequence[ToolSpec] = ()
    """The tool specs shown to the policy (per-task tools: override ``tools_for``)."""

    def initial_state(self, prompt: Prompt) -> Any:
        """The state an episode of ``prompt`` starts from. Default: None (a stateless environment)."""
        return None

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        """Run the TOOL action's calls at ``state``: the observation and the state after them."""
        raise NotImplementedError(f"{type(self).__name__} does not implement execute")

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        """The episode's reward for its final answer (None: it ended without one)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement reward")

    def tools_for(self, prompt: Prompt, state: Any) -> Sequence[ToolSpec]:
        """The tools available at ``state`` (per task, and per user turn where tools are added mid-episode);
        used to render the prompt (at the initial state) and to parse every turn. Default: ``tools``."""
        return self.tools

    def on_answer(self, prompt: Prompt, state: Any, action: Action) -> AnswerResult | None:
        """Called for every ANSWER turn (a response without calls). Multi-turn tasks return the next user
        message and state, and at the last user turn the reward (computed from ``state``). Default: None, the
        episode ends with ``reward(prompt, action.answer)``."""
        return None

    def execute_batch(self, calls: Sequence[tuple[Prompt, Any, Action]]) -> list[ToolResult]:
        """Run a round's tool calls; results in call order. Default: one by one (a pool runs them in parallel)."""
        return [self.execute(p, s, a) for p, s, a in calls]


class WrappedEnv(ToolEnv):
    """An environment around ``local``: every hook is ``local``'s; a subclass changes where the tool calls run
    (``tracerl.actors.envpool.EnvPool`` on Ray actors, ``tracerl.engine.concurrent_env.ConcurrentEnv`` on threads)."""

    def __init__(self, local: ToolEnv) -> None:
        self.local = local
        self.tools, self.fork_mode = local.tools, local.fork_mode

    def initial_state(self, prompt: Prompt) -> Any:
        return self.local.initial_state(prompt)

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        return self.local.execute(prompt, state, action)

    def reward(self, prompt: Prompt, answer: str | None) -> float:
        return float(self.local.reward(prompt, answer))

    def tools_for(self, prompt: Prompt, state: Any) -> Sequence[ToolSpec]:
        return self.local.tools_for(prompt, state)

    def on_answer(self, prompt: Prompt, state: Any, action: Action) -> AnswerResult | None:
        """The wrapped environment's multi-turn hook (next user message or final reward), run here."""
        return self.local.on_answer(prompt, state, action)

    def scores(self, prompt: Prompt, answer: str | None) -> dict[str, float]:
        return self.local.scores(prompt, answer)

    def gold_turns(self, prompt: Prompt, template: Any) -> list[str]:
        return self.local.gold_turns(prompt, template)

    @property
    def warnings(self) -> list[str]:
        return self.local.warnings
