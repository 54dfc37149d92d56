"""One allocation-and-rollout step (docs/design.md, "One training step"), backend-agnostic.

    v     = predictor.score(roots)          # Stage 1 (None while the predictor is cold)
    m     = allocator.roots(v, M)
    bare  = backend.rollout(candidates, m)
    p     = predictor.score(prefixes(bare)) # Stage 2
    K     = allocator.prefixes(bare, p, N)
    trees = backend.expand(bare, K)

Dynamic sampling (dapo) replaces Stage 1 with re-sampled generation batches. Every score is kept
with its anchor so calibration can be measured once the trees are finished.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tracerl.algos.allocators import Allocator, Expansion, PrefixCandidates
from tracerl.config import BudgetConfig
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.protocol import TreeBackend, account
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


def _timed(ledger: BudgetLedger, phase: str, t0: float) -> float:
    now = time.perf_counter()
    ledger.phase_s[phase] = ledger.phase_s.get(phase, 0.0) + now - t0
    return now


def run_step(
    pool: Sequence[Prompt],
    allocator: Allocator,
    predictor: Scorer,
    backend: TreeBackend,
    budget: BudgetConfig,
    rng: np.random.Generator,
) -> StepOutcome:
    """Allocate and roll out one step's budget. Returns the trees and every decision taken."""
    ledger = BudgetLedger()
    pool = list(pool)
    t0 = time.perf_counter()
    scores = predictor.score([Anchor(p) for p in pool])
    t0 = _timed(ledger, "score", t0)
    v = scores if predictor.ready else None
    if allocator.dynamic:
        return _dynamic_step(pool, scores, allocator, backend, budget, rng, ledger, t0)
    costs = allocator.price([Anchor(p) for p in pool])  # cost-aware allocators only (trace_plus)
    if costs is None:
        counts = allocator.roots(v, len(pool), budget, rng)
    else:
        counts = allocator.priced_roots(v, costs, budget, rng)
    t0 = _timed(ledger, "allocate_roots", t0)
    active = np.flatnonzero(counts)
    trees = backend.rollout([pool[i] for i in active], counts[active].tolist())
    t0 = _timed(ledger, "rollout", t0)
    out = StepOutcome(pool, trees, trees, counts, scores, ledger=ledger)
    if not allocator.flat and budget.continuations > 0:
        root_costs = None if costs is None else costs[active]
        _expand(out, allocator, predictor, backend, budget, rng, counts[active], t0, root_costs)
    account(ledger, trees)
    ledger.leaves = ledger.sampled_leaves = sum(t.num_leaves for t in trees)
    ledger.extra_bare = sum(e.extra_bare for e in out.expansions)
    return out


def _expand(
    out: StepOutcome,
    allocator: Allocator,
    predictor: Scorer,
    backend: TreeBackend,
    budget: BudgetConfig,
    rng: np.random.Generator,
    bare_counts: np.ndarray,
    t0: float,
    root_costs: np.ndarray | None = None,
) -> None:
    ledger = out.ledger
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
    c_all = None if root_costs is None else allocator.price(anchors)
    t0 = _timed(ledger, "score", t0)
    cands = []
    for ti, ((ids, r), (a, b), m) in enumerate(zip(cands_meta, spans, bare_counts)):
        p = p_all[a:b]
        out.prefix_scores += [(ti, int(i), float(x)) for i, x in zip(ids, p)]
        cost = None if c_all is None else c_all[a:b]
        share = None if root_costs is None else float(m * root_costs[ti] * budget.continuations)
        cands.append(
            PrefixCandidates(
                ids, r, p if predictor.ready else None, int(m) * budget.continuations, cost, share
            )
        )
    out.expansions = allocator.prefixes(cands, rng)
    t0 = _timed(ledger, "expand_prefixes", t0)
    backend.expand(out.trees, out.expansions)
    _timed(ledger, "rollout", t0)


def _dynamic_step(
    pool: list[Prompt],
    scores: np.ndarray,
    allocator: Allocator,
    backend: TreeBackend,
    budget: BudgetConfig,
    rng: np.random.Generator,
    ledger: BudgetLedger,
    t0: float,
) -> StepOutcome:
    """DAPO dynamic sampling: generation batches of L/G prompts until L/G mixed groups are kept."""
    want, g = budget.num_groups, budget.group_size
    order = rng.permutation(len(pool))
    counts = np.zeros(len(pool), dtype=np.int64)
    kept: list[RolloutTree] = []
    sampled: list[RolloutTree] = []
    max_batches = allocator.cfg.max_gen_batches
    for b in range(max_batches):
        chunk = order[b * want : (b + 1) * want]
        if len(kept) >= want or len(chunk) == 0:
            break
        counts[chunk] = g
        trees = backend.rollout([pool[i] for i in chunk], [g] * len(chunk))
        sampled += trees
        kept += [t for t in trees if t.is_mixed()]
    kept = kept[:want]
    _timed(ledger, "rollout", t0)
    account(ledger, sampled)
    ledger.leaves = sum(t.num_leaves for t in kept)
    ledger.sampled_leaves = sum(t.num_leaves for t in sampled)
    return StepOutcome(pool, kept, sampled, counts, scores, ledger=ledger)
