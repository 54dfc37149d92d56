"""One allocation-and-rollout step (docs/design.md, "One training step"), backend-agnostic.

    v     = predictor.score(roots)          # Stage 1 (None while the predictor is cold)
    plan  = allocator.plan_step(v, M)       # root counts, generation batches, N
    bare  = backend.rollout(candidates, plan)
    p     = predictor.score(prefixes(bare)) # Stage 2 (when the plan has continuations)
    K     = allocator.prefixes(bare, p, N)
    trees = backend.expand(bare, K)

The allocator's plan, not the step, holds what differs between allocators: flat allocators plan no Stage 2,
dynamic sampling (dapo) plans re-sampled generation batches and keeps only mixed groups, cost-aware allocators
price roots and prefixes. Every score is kept with its anchor so calibration can be measured once the trees are
finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tracerl.algos.allocators import Allocator, Expansion, PrefixCandidates, StepPlan
from tracerl.config import BudgetConfig
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.protocol import TreeBackend, account
from tracerl.engine.timer import PhaseTimer
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt


class Scorer(Protocol):
    """What the step needs of a predictor (predictors.Predictor satisfies it)."""

    @property
    def ready(self) -> bool: ...

    def score(self, anchors: Sequence[Anchor]) -> np.ndarray: ...


@dataclass
class StepOutcome:
    """Everything one step produced."""

    pool: list[Prompt]
    """The candidate pool."""
    trees: list[RolloutTree]
    """Trees kept for training (active prompts; dapo: the kept mixed groups)."""
    sampled_trees: list[RolloutTree]
    """Every tree rolled out (dapo includes the dropped groups); the predictor fits on these."""
    root_counts: np.ndarray
    """Bare rollouts per candidate (dapo: per sampled candidate)."""
    root_scores: np.ndarray
    """Predicted v per candidate."""
    prefix_scores: list[tuple[int, int, float]] = field(default_factory=list)
    """(tree index in ``trees``, node id, predicted p) for every scored prefix."""
    expansions: list[Expansion] = field(default_factory=list)
    """Stage 2 decisions, aligned with ``trees``."""
    ledger: BudgetLedger = field(default_factory=BudgetLedger)


def run_step(
    pool: Sequence[Prompt],
    allocator: Allocator,
    predictor: Scorer,
    backend: TreeBackend,
    budget: BudgetConfig,
    rng: np.random.Generator,
    timer: PhaseTimer | None = None,
) -> StepOutcome:
    """Allocate and roll out one step's budget. Returns the trees and every decision taken.

    Phases are timed by ``timer`` (score, allocate_roots, rollout, expand_prefixes); without one, into the
    outcome's ``ledger.phase_s``."""
    ledger = BudgetLedger()
    timer = timer or PhaseTimer(ledger.phase_s)
    pool = list(pool)
    roots = [Anchor(p) for p in pool]
    with timer("score"):
        scores = predictor.score(roots)
    with timer("allocate_roots"):
        plan = allocator.plan_step(scores if predictor.ready else None, roots, budget, rng)
    with timer("rollout"):
        out, kept = _roll_out(pool, plan, backend, scores, ledger)
    if plan.continuations > 0:
        _expand(out, plan, kept, allocator, predictor, backend, rng, timer)
    account(ledger, out.sampled_trees)
    ledger.leaves = sum(t.num_leaves for t in out.trees)
    ledger.sampled_leaves = sum(t.num_leaves for t in out.sampled_trees)
    ledger.extra_bare = sum(e.extra_bare for e in out.expansions)
    return out


def _roll_out(
    pool: list[Prompt], plan: StepPlan, backend: TreeBackend, scores: np.ndarray, ledger: BudgetLedger
) -> tuple[StepOutcome, list[int]]:
    """The plan's bare rollouts, batch by batch (dynamic sampling: until enough mixed groups are kept); the outcome
    and the candidate index of each kept tree."""
    counts = np.zeros_like(plan.counts)
    kept: list[RolloutTree] = []
    kept_idx: list[int] = []
    sampled: list[RolloutTree] = []
    for batch in plan.batches:
        if plan.keep_mixed is not None and len(kept) >= plan.keep_mixed:
            break
        counts[batch] = plan.counts[batch]
        trees = backend.rollout([pool[i] for i in batch], plan.counts[batch].tolist())
        sampled += trees
        for i, t in zip(batch, trees):
            if plan.keep_mixed is None or t.is_mixed():
                kept.append(t)
                kept_idx.append(int(i))
    if plan.keep_mixed is not None:
        kept, kept_idx = kept[: plan.keep_mixed], kept_idx[: plan.keep_mixed]
    return StepOutcome(pool, kept, sampled, counts, scores, ledger=ledger), kept_idx


def _expand(
    out: StepOutcome,
    plan: StepPlan,
    kept: list[int],
    allocator: Allocator,
    predictor: Scorer,
    backend: TreeBackend,
    rng: np.random.Generator,
    timer: PhaseTimer,
) -> None:
    """Stage 2: score every tree's bare prefixes, let the allocator place N continuations per bare rollout (priced
    prompts: within their token share), and roll the continuations out."""
    with timer("score"):
        anchors: list[Anchor] = []
        spans: list[tuple[int, int]] = []
        cands_meta: list[tuple[np.ndarray, np.ndarray]] = []
        for tree in out.trees:
            ids = np.array(tree.bare_prefixes(), dtype=np.int64)
            rewards = tree.path_rewards()
            r = np.array([rewards[tree.nodes[i].path_id] for i in ids], dtype=float)
            spans.append((len(anchors), len(anchors) + len(ids)))
            anchors += [tree.anchor(int(i)) for i in ids]
            cands_meta.append((ids, r))
        p_all = predictor.score(anchors)
        c_all = None if plan.costs is None else allocator.price(anchors)
    with timer("expand_prefixes"):
        n = plan.continuations
        cands = []
        for ti, ((ids, r), (a, b), i) in enumerate(zip(cands_meta, spans, kept)):
            p = p_all[a:b]
            m = int(plan.counts[i])
            out.prefix_scores += [(ti, int(j), float(x)) for j, x in zip(ids, p)]
            cost = None if c_all is None else c_all[a:b]
            share = None if plan.costs is None else float(m * plan.costs[i] * n)
            cands.append(PrefixCandidates(ids, r, p if predictor.ready else None, m * n, cost, share))
        out.expansions = allocator.prefixes(cands, rng)
    with timer("rollout"):
        backend.expand(out.trees, out.expansions)
