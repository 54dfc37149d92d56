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
from typing import Protocol, runtime_checkable

import numpy as np

from tracerl.algos.allocators import Allocator, Expansion, PrefixCandidates, StepPlan
from tracerl.algos.config import BudgetConfig
from tracerl.engine.config import PipelineMode
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.protocol import TreeBackend, account
from tracerl.engine.stream import OnBare
from tracerl.engine.timer import PhaseTimer
from tracerl.tree import RolloutTree
from tracerl.types import Anchor, Prompt


@runtime_checkable
class StreamingBackend(TreeBackend, Protocol):
    """A backend that runs a step without the barrier (engine/stream.py)."""

    def stream(self, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare) -> list[RolloutTree]:
        """``counts[i]`` bare rollouts of ``prompts[i]``; each tree's expansion, once ``on_bare`` returns it, runs
        while other trees still roll out. One finished tree per prompt."""
        ...


class Scorer(Protocol):
    """What the step needs of a predictor (tracerl.predictors.Predictor satisfies it)."""

    @property
    def ready(self) -> bool: ...

    def score(self, anchors: Sequence[Anchor]) -> np.ndarray: ...


@runtime_checkable
class TreeScorer(Scorer, Protocol):
    """A scorer that scores prefixes from their trees (trace_mc's ``MonteCarloScorer`` continues from them)."""

    def score_prefixes(self, trees: Sequence[RolloutTree], node_ids: Sequence[np.ndarray]) -> np.ndarray:
        """Scores of ``node_ids[i]`` of ``trees[i]``, concatenated in order (the trees must not change)."""
        ...


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
    stage2_inputs: list[PrefixCandidates] = field(default_factory=list)
    """What the allocator's Stage 2 saw, per tree in ``trees`` order (``same_allocation``)."""
    stage2_seed: int | None = None
    """The seed of the step's Stage 2: tree k breaks its ties with ``tree_rng(stage2_seed, k)``."""


@dataclass
class PlannedStep:
    """A step after Stage 1 (``plan_roots``): what its rollouts and its Stage 2 need."""

    pool: list[Prompt]
    scores: np.ndarray
    """Predicted v per candidate."""
    plan: StepPlan
    seed: int | None
    """The Stage 2 seed (None when the plan has no continuations)."""
    ledger: BudgetLedger
    timer: PhaseTimer


@dataclass
class BareRollouts:
    """A planned step's bare rollouts (``roll_out_bare``), before Stage 2."""

    out: StepOutcome
    kept: list[int]
    """Candidate index of each kept tree."""


def run_step(
    pool: Sequence[Prompt],
    allocator: Allocator,
    predictor: Scorer,
    backend: TreeBackend,
    budget: BudgetConfig,
    rng: np.random.Generator,
    timer: PhaseTimer | None = None,
    mode: PipelineMode = "barrier",
) -> StepOutcome:
    """Allocate and roll out one step's budget. Returns the trees and every decision taken.

    Phases are timed by ``timer`` (score, allocate_roots, rollout, expand_prefixes); without one, into the
    outcome's ``ledger.phase_s``. ``mode`` is ``pipeline.mode``: 'streaming' expands each tree as soon as its own
    bare rollouts end (``streams``: plans with one generation batch and a Stage 2, on a backend that streams);
    the step then takes the same decisions as in 'barrier' mode (``_TreeStage2``). The three parts
    (``plan_roots``, ``roll_out_bare``, ``complete``) are also called apart: an overlapped step
    (``pipeline.overlap``) rolls out its bare rollouts beside the previous update and completes after the weight
    push."""
    p = plan_roots(pool, allocator, predictor, budget, rng, timer)
    if mode == "streaming" and streams(p.plan, backend) and p.seed is not None:
        out = _stream(p.pool, p.plan, allocator, predictor, backend, p.scores, p.ledger, p.seed, p.timer)
        return _account(out)
    return complete(p, roll_out_bare(p, backend), allocator, predictor, backend)


def plan_roots(
    pool: Sequence[Prompt],
    allocator: Allocator,
    predictor: Scorer,
    budget: BudgetConfig,
    rng: np.random.Generator,
    timer: PhaseTimer | None = None,
) -> PlannedStep:
    """Stage 1: score the candidates and let the allocator plan the step (root counts, batches, N)."""
    ledger = BudgetLedger()
    timer = timer or PhaseTimer(ledger.phase_s)
    pool = list(pool)
    roots = [Anchor(p) for p in pool]
    with timer("score"):
        scores = predictor.score(roots)
    with timer("allocate_roots"):
        plan = allocator.plan_step(scores if predictor.ready else None, roots, budget, rng)
    # One draw, before any rollout, in both modes: each tree's Stage 2 then has its own generator, so its
    # decision does not depend on when or in which order the trees finish (streaming solves each on arrival).
    seed = int(rng.integers(2**63)) if plan.continuations > 0 else None
    return PlannedStep(pool, scores, plan, seed, ledger, timer)


def roll_out_bare(planned: PlannedStep, backend: TreeBackend) -> BareRollouts:
    """The plan's bare rollouts (every generation batch), without Stage 2."""
    with planned.timer("rollout"):
        out, kept = _roll_out(planned.pool, planned.plan, backend, planned.scores, planned.ledger)
    return BareRollouts(out, kept)


def complete(
    planned: PlannedStep, bare: BareRollouts, allocator: Allocator, predictor: Scorer, backend: TreeBackend
) -> StepOutcome:
    """Stage 2 on the bare rollouts (when the plan has continuations) and the step's counts."""
    out = bare.out
    if planned.seed is not None:
        _expand(out, planned.plan, bare.kept, allocator, predictor, backend, planned.seed, planned.timer)
    return _account(out)


def _account(out: StepOutcome) -> StepOutcome:
    ledger = out.ledger
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
    seed: int,
    timer: PhaseTimer,
) -> None:
    """Stage 2: score every tree's bare prefixes, let the allocator place N continuations per bare rollout (priced
    prompts: within their token share), tree k with ``tree_rng(seed, k)``, and roll the continuations out."""
    with timer("score"):
        scored = _score_prefixes(out.trees, plan, allocator, predictor)
    with timer("expand_prefixes"):
        out.stage2_inputs = _candidates(out, plan, kept, 0, scored, predictor)
        out.stage2_seed = seed
        out.expansions = solve_trees(allocator, out.stage2_inputs, seed)
    with timer("rollout"):
        backend.expand(out.trees, out.expansions)


_Scored = tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[int, int]], np.ndarray, np.ndarray | None]


def _score_prefixes(
    trees: Sequence[RolloutTree], plan: StepPlan, allocator: Allocator, predictor: Scorer
) -> _Scored:
    """Every bare prefix of ``trees`` scored (and priced, for cost-aware plans) in one call: per tree its prefix
    ids and rewards, its span in the scores, the scores and the costs."""
    anchors: list[Anchor] = []
    spans: list[tuple[int, int]] = []
    cands_meta: list[tuple[np.ndarray, np.ndarray]] = []
    for tree in trees:
        ids = np.array(tree.bare_prefixes(), dtype=np.int64)
        rewards = tree.path_rewards()
        r = np.array([rewards[tree.nodes[i].path_id] for i in ids], dtype=float)
        spans.append((len(anchors), len(anchors) + len(ids)))
        anchors += [tree.anchor(int(i)) for i in ids]
        cands_meta.append((ids, r))
    if isinstance(predictor, TreeScorer):
        p_all = predictor.score_prefixes(trees, [ids for ids, _ in cands_meta])
    else:
        p_all = predictor.score(anchors)
    c_all = None if plan.costs is None else allocator.price(anchors)
    return cands_meta, spans, p_all, c_all


def _candidates(
    out: StepOutcome, plan: StepPlan, kept: list[int], first: int, scored: _Scored, predictor: Scorer
) -> list[PrefixCandidates]:
    """The allocator's input for the scored trees ``first, first + 1, ...`` of ``out.trees`` (candidate indices
    ``kept``); records their prefix scores."""
    cands_meta, spans, p_all, c_all = scored
    n = plan.continuations
    cands = []
    for ti, ((ids, r), (a, b), i) in enumerate(zip(cands_meta, spans, kept[first:]), start=first):
        p = p_all[a:b]
        m = int(plan.counts[i])
        out.prefix_scores += [(ti, int(j), float(x)) for j, x in zip(ids, p)]
        cost = None if c_all is None else c_all[a:b]
        share = None if plan.costs is None else float(m * plan.costs[i] * n)
        cands.append(PrefixCandidates(ids, r, p if predictor.ready else None, m * n, cost, share))
    return cands


def streams(plan: StepPlan, backend: TreeBackend) -> bool:
    """Whether a streaming step runs this plan: one generation batch, all kept, a Stage 2, and a backend with
    ``stream``. Other plans (flat allocators, dynamic sampling) have no Stage 2 to overlap and run as in barrier
    mode."""
    return (
        plan.continuations > 0
        and len(plan.batches) == 1
        and plan.keep_mixed is None
        and isinstance(backend, StreamingBackend)
    )


def tree_rng(seed: int, k: int) -> np.random.Generator:
    """Tree ``k``'s Stage 2 generator in a step whose Stage 2 seed is ``seed``."""
    return np.random.default_rng([seed, k])


def solve_trees(allocator: Allocator, cands: Sequence[PrefixCandidates], seed: int) -> list[Expansion]:
    """Stage 2 of every tree, each on its own: tree k's local budget (m N continuations, or its token share m c N)
    was fixed by Stage 1, and its ties are broken by ``tree_rng(seed, k)``."""
    return [allocator.prefixes([c], tree_rng(seed, k))[0] for k, c in enumerate(cands)]


class _TreeStage2:
    """Stage 2 of a streaming step: each tree is scored and solved as soon as its own bare rollouts end.

    Its decision is the barrier's: the local budget was fixed by Stage 1 before any rollout, and the tree's ties
    are broken by its own generator (``tree_rng``), so neither the order nor the time the trees finish changes what
    is placed. Scores (and prices) are computed per tree instead of in one batch (docs/design.md, "Streaming
    steps")."""

    def __init__(
        self,
        out: StepOutcome,
        plan: StepPlan,
        kept: list[int],
        allocator: Allocator,
        predictor: Scorer,
        seed: int,
        timer: PhaseTimer,
    ) -> None:
        self.out, self.plan, self.kept = out, plan, kept
        self.allocator, self.predictor, self.seed, self.timer = allocator, predictor, seed, timer
        self.inputs: dict[int, PrefixCandidates] = {}
        self.expansions: dict[int, Expansion] = {}

    def __call__(self, ids: list[int], trees: list[RolloutTree]) -> list[tuple[int, Expansion]]:
        launch = []
        for k, tree in zip(ids, trees):
            with self.timer("score"):
                scored = _score_prefixes([tree], self.plan, self.allocator, self.predictor)
            with self.timer("expand_prefixes"):
                (cand,) = _candidates(self.out, self.plan, self.kept, k, scored, self.predictor)
                ex = self.allocator.prefixes([cand], tree_rng(self.seed, k))[0]
            self.inputs[k], self.expansions[k] = cand, ex
            launch.append((k, ex))
        return launch


def _stream(
    pool: list[Prompt],
    plan: StepPlan,
    allocator: Allocator,
    predictor: Scorer,
    backend: TreeBackend,
    scores: np.ndarray,
    ledger: BudgetLedger,
    seed: int,
    timer: PhaseTimer,
) -> StepOutcome:
    """A streaming step's rollouts and Stage 2 (``time/rollout_s`` then includes the Stage 2 scoring and solving
    that ran meanwhile, also timed as ``score`` and ``expand_prefixes``)."""
    assert isinstance(backend, StreamingBackend)
    batch = [int(i) for i in plan.batches[0]]
    counts = np.zeros_like(plan.counts)
    counts[batch] = plan.counts[batch]
    out = StepOutcome(pool, [], [], counts, scores, ledger=ledger)
    stage2 = _TreeStage2(out, plan, batch, allocator, predictor, seed, timer)
    with timer("rollout"):
        trees = backend.stream([pool[i] for i in batch], [int(plan.counts[i]) for i in batch], stage2)
    if len(stage2.expansions) != len(trees):
        raise RuntimeError(f"streaming step: {len(stage2.expansions)} of {len(trees)} trees were expanded")
    order = range(len(trees))
    out.trees, out.sampled_trees = trees, list(trees)
    out.expansions = [stage2.expansions[k] for k in order]
    out.stage2_inputs, out.stage2_seed = [stage2.inputs[k] for k in order], seed
    out.prefix_scores.sort(
        key=lambda x: x[0]
    )  # tree order, as the barrier records them (stable within a tree)
    return out


def same_allocation(out: StepOutcome, allocator: Allocator) -> bool:
    """Whether the barrier's Stage 2 (``solve_trees`` with the step's Stage 2 seed), run on this step's own bare
    trees and scores (``out.stage2_inputs``), places exactly ``out.expansions``."""
    if out.stage2_seed is None:
        return not out.expansions
    again = solve_trees(allocator, out.stage2_inputs, out.stage2_seed)
    return len(again) == len(out.expansions) and all(
        np.array_equal(a.node_ids, b.node_ids)
        and np.array_equal(a.counts, b.counts)
        and a.extra_bare == b.extra_bare
        for a, b in zip(again, out.expansions)
    )
