"""The per-step budget ledger: what a step spent, counted where the work actually happened."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tracerl.metrics import BUDGET, phase_time

ENGINE_COUNTS = (
    "generated_tokens",
    "prefill_tokens_computed",
    "prefill_tokens_reused",
    "llm_calls",
    "tool_calls",
    "tool_calls_replayed",
    "invalid_actions",
    "grade_timeouts",
    "retried",
)
"""The ledger counts an engine (a sampler worker) adds up; the step's own counts (leaves, rollouts) are not."""


@dataclass
class BudgetLedger:
    """Counts for one step. Backends that have no tokens (the simulator) leave those at zero."""

    leaves: int = 0
    """Finished rollouts kept for training."""
    sampled_leaves: int = 0
    """Finished rollouts generated, including those dynamic sampling dropped."""
    bare_rollouts: int = 0
    """Rollouts started from the root (including extra bare rollouts)."""
    continuations: int = 0
    """Rollouts started from a stored prefix."""
    extra_bare: int = 0
    """Bare rollouts added because a prompt's local budget had too few prefixes to spend on."""
    turns: int = 0
    """Turn nodes generated."""
    generated_tokens: int = 0
    """Tokens sampled by the policy."""
    prefill_tokens_computed: int = 0
    """Prompt/prefix tokens the sampler had to encode."""
    prefill_tokens_reused: int = 0
    """Prefix tokens served from a KV cache instead of re-encoding."""
    llm_calls: int = 0
    """Generation calls (one per turn per rollout)."""
    tool_calls: int = 0
    """Tool executions."""
    tool_calls_replayed: int = 0
    """Tool executions re-run to fork an environment at a prefix."""
    invalid_actions: int = 0
    """Turns whose action was malformed (answered with an error observation)."""
    grade_timeouts: int = 0
    """Answers whose grading ran past ``env.reward_timeout_s`` (reward 0, leaf status ``grade_timeout``)."""
    retried: int = 0
    """Work items retried after an actor failure."""
    phase_s: dict[str, float] = field(default_factory=dict)
    """Wall time per phase, seconds."""

    def as_metrics(self) -> dict[str, float]:
        """``budget/<field>`` for every count, ``time/<phase>_s`` for every phase (docs/metrics.md)."""
        out = {f"{BUDGET}{k}": float(v) for k, v in asdict(self).items() if k != "phase_s"}
        out.update({phase_time(k): v for k, v in self.phase_s.items()})
        return out
