"""Metric names (namespaced constants, each defined once in docs/metrics.md) and step statistics."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tracerl.engine.step import StepOutcome
from tracerl.tree import (
    effective_ratio,
    leaf_effective_ratio,
    prefix_group_effective_ratio,
    total_contrast_pairs,
)

EFFECTIVE_RATIO = "rollout/effective_ratio"
EFFECTIVE_RATIO_CANDIDATES = "rollout/effective_ratio_candidates"
EFFECTIVE_RATIO_SAMPLED = "rollout/effective_ratio_sampled"
LEAF_EFFECTIVE_RATIO = "rollout/leaf_effective_ratio"
MIXED_GROUPS = "rollout/mixed_groups"
ACTIVE_PROMPTS = "rollout/active_prompts"
CONTRAST_PAIRS_PER_100 = "rollout/contrast_pairs_per_100_leaves"
STEP_CONTRAST_PAIRS_PER_100 = "rollout/step_contrast_pairs_per_100_leaves"
SUCCESS_RATE = "rollout/success_rate"
PREFIX_GROUP_ER = "rollout/prefix_group_effective_ratio"
"""Per depth t: ``f"{PREFIX_GROUP_ER}/depth_{t}"``."""
EXPANDED_PREFIXES = "rollout/expanded_prefixes"


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
    m.update({f"{PREFIX_GROUP_ER}/depth_{d}": v for d, v in by_depth.items()})
    m.update(out.ledger.as_metrics())
    return m


def mean_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Key-wise mean over metric dicts that may hold different keys (per-depth metrics come and go)
    and NaN (undefined this step); NaN where no row has a finite value."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for row in rows for k in row):
        vals = [float(row[key]) for row in rows if key in row and math.isfinite(float(row[key]))]
        out[key] = sum(vals) / len(vals) if vals else float("nan")
    return out
