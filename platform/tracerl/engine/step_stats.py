"""Rollout statistics of one step (docs/metrics.md): the ``rollout/`` metrics plus the step's budget ledger."""

from __future__ import annotations

from collections.abc import Sequence

from tracerl.engine.step import StepOutcome
from tracerl.metrics import (
    ACTIVE_PROMPTS,
    CONTRAST_PAIRS_PER_100,
    EFFECTIVE_RATIO,
    EFFECTIVE_RATIO_CANDIDATES,
    EFFECTIVE_RATIO_SAMPLED,
    EXPANDED_PREFIXES,
    LEAF_EFFECTIVE_RATIO,
    MIXED_GROUPS,
    PREFIX_GROUP_ER,
    STEP_CONTRAST_PAIRS_PER_100,
    SUCCESS_RATE,
    prefix_group_depth,
)
from tracerl.tree import (
    RolloutTree,
    effective_ratio,
    leaf_effective_ratio,
    prefix_group_effective_ratio,
    total_contrast_pairs,
)


def step_metrics(out: StepOutcome) -> dict[str, float]:
    """Rollout statistics of one step (docs/metrics.md), plus its budget ledger."""
    trees, sampled = out.trees, out.sampled_trees
    leaves = sum(t.num_leaves for t in trees)
    mixed = sum(t.is_mixed() for t in trees)
    pairs = total_contrast_pairs(trees)
    step_pairs = sum(v for t in trees for d, v in t.contrast_pairs().items() if d > 0)
    rewards = [r for t in trees for r in t.rewards()]
    m = {
        EFFECTIVE_RATIO: effective_ratio(trees),
        EFFECTIVE_RATIO_CANDIDATES: mixed / len(out.pool) if out.pool else 0.0,
        EFFECTIVE_RATIO_SAMPLED: effective_ratio(sampled),
        LEAF_EFFECTIVE_RATIO: leaf_effective_ratio(trees),
        MIXED_GROUPS: float(mixed),
        ACTIVE_PROMPTS: float(len(trees)),
        CONTRAST_PAIRS_PER_100: 100.0 * pairs / leaves if leaves else 0.0,
        STEP_CONTRAST_PAIRS_PER_100: 100.0 * step_pairs / leaves if leaves else 0.0,
        SUCCESS_RATE: sum(rewards) / len(rewards) if rewards else 0.0,
    }
    pg_ratio, expanded, by_depth = prefix_group_effective_ratio(trees)
    m[PREFIX_GROUP_ER] = pg_ratio  # NaN without continuations (flat allocators): MLflow logging drops it
    m[EXPANDED_PREFIXES] = float(expanded)
    m.update({prefix_group_depth(d): v for d, v in by_depth.items()})
    m.update(out.ledger.as_metrics())
    return m


def weight_staleness(trees: Sequence[RolloutTree], version: int) -> tuple[float, int]:
    """Mean and max, over the loss tokens of ``trees`` (every leaf's path, as collate builds its sequences), of how
    many updates the weights that sampled a token lag ``version`` (the weights being updated)."""
    tokens = lag = worst = 0
    for tree in trees:
        for leaf in tree.leaves():
            for nid in tree.path(leaf.node_id)[1:]:
                node = tree.nodes[nid]
                if node.weight_version is None:
                    raise ValueError(
                        f"prompt {tree.prompt.prompt_id!r}, node {nid}: no weight version recorded for this turn"
                    )
                k, d = sum(node.model_mask), version - node.weight_version
                tokens, lag = tokens + k, lag + k * d
                worst = max(worst, d) if k else worst
    return (lag / tokens if tokens else 0.0), worst
