"""Small shared records: prompts, episode statuses, tree nodes, anchors.

An *anchor* (docs/method.md, "Objects") is a root (the prompt alone) or a prefix (the prompt plus the
turns so far); predictors score anchors, allocators spend budget on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np


class Status(str, Enum):
    """How a node ends. ``TURN`` marks an interior turn; every other value is a terminal status."""

    TURN = "turn"
    """An interior turn: the episode went on after it."""
    ANSWERED = "answered"
    """The agent gave a final answer (the reward is the verifier's)."""
    MAX_TURNS = "max_turns"
    """The per-episode turn limit was reached without a final answer."""
    MAX_TOKENS = "max_tokens"
    """The per-episode (or per-turn) token limit was reached."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The history no longer fits the model's context window."""
    GRADE_TIMEOUT = "grade_timeout"
    """The agent answered, but grading ran past ``env.reward_timeout_s``: reward 0."""
    ENV_ERROR = "env_error"
    """The environment failed in a way the episode cannot continue from."""

    @property
    def terminal(self) -> bool:
        return self is not Status.TURN


@dataclass(slots=True, eq=False)
class Node:
    """One node of a rollout tree."""

    node_id: int
    """Index in ``RolloutTree.nodes``."""
    parent: int | None
    """Parent node id; ``None`` for the root."""
    depth: int
    """Number of turns from the root (root = 0)."""
    path_id: int
    """The rollout that generated this node: 0..m-1 for bare rollouts, then continuations in order."""
    content: str = ""
    """The turn's text: thought, action and observation (empty for the root and the simulator)."""
    token_ids: list[int] = field(default_factory=list)
    """Tokens of this turn, model-generated and tool/observation tokens interleaved."""
    model_mask: list[bool] = field(default_factory=list)
    """Per token: True if the model generated it, False for tool/observation tokens (masked in the loss)."""
    status: Status = Status.TURN
    """``TURN`` for interior nodes; a terminal status on leaves."""
    reward: float | None = None
    """Terminal reward on leaves (in {0, 1} for RLVR); ``None`` on interior nodes."""
    children: list[int] = field(default_factory=list)
    """Child node ids, in creation order."""
    features: np.ndarray | None = None
    """Numeric features of the prefix ending here (simulator); text environments leave it ``None``."""
    true_value: float | None = None
    """True V_t at this node (simulator only)."""
    logprobs: list[float] = field(default_factory=list)
    """Sampler log-probs of the model-generated tokens of this turn (may be empty)."""
    prefill_computed: int = 0
    """Context tokens the sampler encoded to generate this turn (the rest came from a KV cache)."""
    scores: dict[str, float] = field(default_factory=dict)
    """Answer scores on answered leaves from the environment's optional ``scores`` hook (search: em, f1)."""
    weight_version: int | None = None
    """The policy version (updates applied) whose weights sampled this turn (``tracerl train``); ``None`` where
    not recorded."""

    @property
    def is_leaf(self) -> bool:
        return self.status is not Status.TURN


@dataclass(frozen=True, eq=False)
class Prompt:
    """One task instance (a tree root).

    ``features`` and ``true_value`` exist for the simulator: real environments leave them ``None`` and
    predictors read ``text`` instead.
    """

    prompt_id: str
    """Stable identity; prompts are revisited across steps under the same id."""
    text: str = ""
    """The task as shown to the policy."""
    answer: str | None = None
    """Reference answer for the verifier, if any."""
    features: np.ndarray | None = None
    """Numeric features of the prompt (simulator), shape (d,)."""
    true_value: float | None = None
    """True success probability at sampling time (simulator only; the oracle reads it)."""
    source: str = ""
    """Where it came from (task family, dataset file, category)."""


@dataclass(frozen=True, eq=False)
class Anchor:
    """A root (``history == ()``) or a prefix H_t (``history`` = the t turn nodes after the root)."""

    prompt: Prompt
    history: tuple[Node, ...] = field(default_factory=tuple)

    @property
    def depth(self) -> int:
        return len(self.history)

    @property
    def node(self) -> Node | None:
        """The last turn node of the prefix, or ``None`` for a root."""
        return self.history[-1] if self.history else None
