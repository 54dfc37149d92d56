"""The per-step budget ledger: what a step spent, counted where the work actually happened."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tracerl.metrics import BUDGET, ENGINE_PHASES, kv_hit_rate_depth, phase_time

ENGINE_COUNTS = (
    "generated_tokens",
    "prefill_tokens_computed",
    "prefill_tokens_reused",
    "llm_calls",
    "tool_calls",
    "tool_calls_replayed",
    "tool_timeouts",
    "invalid_actions",
    "grade_timeouts",
    "retried",
    "kv_local_continuations",
    "kv_reencoded_continuations",
    "decode_steps",
    "decode_rows",
    "sampler_busy_s",
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
    tool_timeouts: int = 0
    """Tool calls stopped at the environment's time limit (an error observation; math: the sandbox's
    ``timeout_s``, bfcl: ``call_timeout_s``)."""
    invalid_actions: int = 0
    """Turns whose action was malformed (answered with an error observation)."""
    grade_timeouts: int = 0
    """Answers whose grading ran past ``env.reward_timeout_s`` (reward 0, leaf status ``grade_timeout``)."""
    retried: int = 0
    """Work items retried after an actor failure."""
    kv_local_continuations: int = 0
    """Continuations run by the sampler that holds their prefix's KV cache (its own copy of the tree)."""
    kv_reencoded_continuations: int = 0
    """Continuations run by a sampler without that copy (a busy owner's overflow, a replaced actor): it re-encodes
    the prefix."""
    decode_steps: int = 0
    """Decode forwards: per sampler call, the longest generation in its batch (a batched call runs that many)."""
    decode_rows: int = 0
    """Rows that produced a token, summed over decode forwards (tokens generated, before per-path caps);
    ``decode_rows / decode_steps`` is the mean batch occupancy."""
    sampler_busy_s: float = 0.0
    """Seconds the samplers spent generating, summed over sampler actors (busy fraction: over actors x wall)."""
    kv_depth: dict[int, list[int]] = field(default_factory=dict)
    """Continuations per prefix depth: [on the KV owner, total] (``rollout/kv_hit_rate/depth_<t>``)."""
    phase_s: dict[str, float] = field(default_factory=dict)
    """Wall time per phase, seconds."""

    def count_continuations(self, depths: list[int], local: bool) -> None:
        """Count continuations starting at prefixes of these depths, run on their KV owner (``local``) or not."""
        for d in depths:
            hit = self.kv_depth.setdefault(d, [0, 0])
            hit[0] += int(local)
            hit[1] += 1
        if local:
            self.kv_local_continuations += len(depths)
        else:
            self.kv_reencoded_continuations += len(depths)

    def add_engine(self, other: BudgetLedger) -> None:
        """Add an engine's (a sampler worker's) counts: ``ENGINE_COUNTS`` and the per-depth KV counts."""
        for f in ENGINE_COUNTS:
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for d, (hit, total) in other.kv_depth.items():
            mine = self.kv_depth.setdefault(d, [0, 0])
            mine[0] += hit
            mine[1] += total

    def as_metrics(self) -> dict[str, float]:
        """``budget/<field>`` for every count, ``time/<phase>_s`` for every phase, the KV hit rate per prefix depth
        (docs/metrics.md)."""
        out = {f"{BUDGET}{k}": float(v) for k, v in asdict(self).items() if k not in ("phase_s", "kv_depth")}
        # every engine phase every step, 0 when nothing ran in it (a step whose paths all hit max_turns grades
        # nothing): a per-step metric is logged at every step (the exactly-once checks expect 1..S)
        out.update({phase_time(k): self.phase_s.get(k, 0.0) for k in ENGINE_PHASES})
        out.update({phase_time(k): v for k, v in self.phase_s.items()})
        out.update({kv_hit_rate_depth(d): hit / total for d, (hit, total) in self.kv_depth.items() if total})
        return out
