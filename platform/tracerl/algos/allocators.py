"""Allocators: who gets bare rollouts (roots) and where continuations go (prefixes).

Every allocator answers two questions with the same signature, so the step driver has no special
cases (docs/method.md, "Stage 1", "Stage 2", "Baselines"):

* ``plan_step(v, anchors, budget, rng)``: Stage 1 as a ``StepPlan``: rollout counts for the candidate pool,
  given predicted root success probabilities ``v`` (``None`` while the predictor is cold: uniform
  allocation), in which generation batches to roll them out, and how many continuations Stage 2 spends. The
  default plans ``roots(...)`` in one batch followed by N continuations per bare rollout; flat allocators plan
  no Stage 2, dapo plans re-sampled batches, trace_plus prices its roots. engine/step.py carries the plan out.
* ``prefixes(cands, rng)``: continuation counts per non-leaf bare prefix of each active tree,
  given the prefix's rollout reward r and predicted probability p (``None`` while cold).

| name               | roots                                 | prefixes             |
|--------------------|---------------------------------------|----------------------|
| grpo               | L/G random prompts x G                | none                 |
| pcl                | L/G prompts with v closest to 0.5 x G | none                 |
| knapsack           | L rollouts, Value(v, n) knapsack      | none                 |
| dapo               | like grpo, re-sampled until L/G mixed | none (dynamic)       |
| treepo             | M/g random prompts x g                | uniformly random     |
| trace_root_only    | exact V_root solver                   | uniformly random     |
| trace_prefix_only  | M/g random prompts x g                | exact V_pref solver  |
| trace              | exact V_root solver                   | exact V_pref solver  |
| trace_debiased     | trace; the predictor fits debiased targets (tree.py)         |
| oracle_trace       | trace with the simulator's true probabilities (the ceiling)  |
| trace_mc           | trace with Monte-Carlo estimates from extra rollouts (engine/mc_scorer.py) |
| trace_plus         | trace_debiased, priced by predicted tokens (algos/trace_plus.py) |

Leaves are equal for all but dapo: flat allocators spend L = (L/G) G leaves at the roots; tree
allocators spend M at the roots and M N as continuations, a prompt with m bare rollouts getting a
local budget of m N. [choice] Local budget a prompt cannot spend (too few non-leaf prefixes, or the
k_max cap) becomes extra bare rollouts of the same prompt, so leaves stay equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tracerl.algos.config import AllocatorConfig, BudgetConfig
from tracerl.algos.prefixes import solve_prefixes
from tracerl.algos.roots import solve_roots
from tracerl.registry import Registry
from tracerl.tree import RolloutTree
from tracerl.types import Anchor


@dataclass(frozen=True)
class PrefixCandidates:
    """The expandable prefixes of one active tree."""

    node_ids: np.ndarray
    """Non-leaf bare-rollout prefix nodes, shape (P,)."""
    rewards: np.ndarray
    """Reward r of the rollout each prefix belongs to, shape (P,)."""
    scores: np.ndarray | None
    """Predicted success probability p at each prefix, shape (P,); None while the predictor is cold."""
    local_budget: int
    """Continuations this prompt may spend: m N."""
    costs: np.ndarray | None = None
    """Cost-aware allocators: predicted generated tokens of one continuation from each prefix, shape (P,)."""
    token_share: float | None = None
    """Cost-aware allocators: the prompt's continuation tokens S_i = m c_i N (algos/costaware.py)."""


@dataclass(frozen=True)
class Expansion:
    """What to add to one tree: continuations per prefix node, then extra bare rollouts."""

    node_ids: np.ndarray
    """Prefix nodes, shape (P,)."""
    counts: np.ndarray
    """Continuations K per prefix node, shape (P,)."""
    extra_bare: int
    """Bare rollouts added because the local budget could not be spent on prefixes."""

    @property
    def leaves(self) -> int:
        return int(self.counts.sum()) + self.extra_bare


@dataclass(frozen=True)
class StepPlan:
    """Stage 1's decisions for one step (``Allocator.plan_step``); engine/step.py carries them out.

    The step rolls out ``batches`` in order, ``counts[i]`` bare rollouts of each candidate i of a batch, until
    ``keep_mixed`` mixed groups are kept (dynamic sampling); then, when ``continuations`` N > 0, Stage 2 gives every
    kept tree with m bare rollouts a local budget of m N continuations.
    """

    counts: np.ndarray
    """Bare rollouts per candidate, shape (B,) (for every batch, whether the step draws it or not)."""
    batches: list[np.ndarray]
    """Candidate indices per generation batch, in rollout order (one batch: the candidates with counts > 0)."""
    continuations: int = 0
    """N, continuations per bare rollout in Stage 2; 0: no Stage 2 (flat allocators)."""
    keep_mixed: int | None = None
    """Dynamic sampling: keep only mixed groups, at most this many, drawing batches until that many are kept.
    None: keep every tree."""
    costs: np.ndarray | None = None
    """Cost-aware allocators: predicted generated tokens of one bare rollout per candidate, shape (B,); Stage 2 then
    prices prefixes too (``Allocator.price``) and gives each prompt its token share m c N."""


def one_batch(counts: np.ndarray, continuations: int = 0, costs: np.ndarray | None = None) -> StepPlan:
    """The usual plan: every candidate with counts > 0 in one generation batch."""
    return StepPlan(counts, [np.flatnonzero(counts)], continuations, costs=costs)


class Allocator:
    """Base allocator: ``roots`` then ``prefixes`` (a tree step). Users may subclass and register."""

    name = "base"
    predictor: str | None = None
    """Force this predictor (oracle_trace uses the simulator's oracle)."""
    targets: Literal["recursive", "debiased"] | None = None
    """Force the predictor's fit targets (predictor.targets); trace_debiased uses 'debiased'."""
    branches: bool = False
    """Places continuations after seeing the bare rollouts' rewards (tree allocators): ``loss.debiased_values: auto``
    then takes the debiased node values (docs/results/baseline_bias.md); False keeps the leaf means."""
    monte_carlo: bool = False
    """Score roots and prefixes by Monte-Carlo rollouts of the current policy instead of the predictor: the
    workflow wraps its predictor in ``tracerl.engine.mc_scorer.MonteCarloScorer`` over its backend (trace_mc)."""

    def __init__(self, cfg: AllocatorConfig) -> None:
        self.cfg = cfg

    def plan_step(
        self, v: np.ndarray | None, anchors: Sequence[Anchor], budget: BudgetConfig, rng: np.random.Generator
    ) -> StepPlan:
        """Stage 1 over the candidates' root ``anchors``: ``roots`` in one batch, then N continuations each."""
        return one_batch(self.roots(v, len(anchors), budget, rng), budget.continuations)

    def roots(
        self, v: np.ndarray | None, num_candidates: int, budget: BudgetConfig, rng: np.random.Generator
    ) -> np.ndarray:
        raise NotImplementedError

    length_predictor: str | None = None
    """Cost-aware allocators: the length predictor the driver attaches (predictors/length.py)."""
    lengths: object | None = None
    """The attached length predictor (None until attached)."""

    def price(self, anchors: Sequence[Anchor]) -> np.ndarray | None:
        """Predicted generated tokens of one rollout from each anchor; None: the allocator is not cost-aware."""
        return None

    def observe(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Fit allocator-owned models (trace_plus: its length predictor) on a step's finished trees."""
        return {}

    def state_dict(self) -> dict[str, object]:
        """State of allocator-owned models for checkpoints (empty: nothing to save)."""
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what ``state_dict`` returned."""

    def prefixes(self, cands: Sequence[PrefixCandidates], rng: np.random.Generator) -> list[Expansion]:
        """Default: spend nothing on prefixes."""
        return [Expansion(c.node_ids, np.zeros(len(c.node_ids), np.int64), 0) for c in cands]


class FlatAllocator(Allocator):
    """Flat allocators spend the whole leaf budget as bare rollouts: their plan has no Stage 2."""

    def plan_step(
        self, v: np.ndarray | None, anchors: Sequence[Anchor], budget: BudgetConfig, rng: np.random.Generator
    ) -> StepPlan:
        return one_batch(self.roots(v, len(anchors), budget, rng))


# -- root modes ---------------------------------------------------------------------------------
def uniform_roots(num_candidates: int, total: int, group: int, rng: np.random.Generator) -> np.ndarray:
    """``total`` rollouts on randomly drawn prompts, ``group`` each (the remainder on one more prompt)."""
    full, rest = divmod(total, group)
    need = full + (1 if rest else 0)
    if need > num_candidates:
        raise ValueError(
            f"uniform roots need {need} prompts but the pool has {num_candidates}; raise budget.pool_factor"
        )
    chosen = rng.choice(num_candidates, size=need, replace=False)
    counts = np.zeros(num_candidates, dtype=np.int64)
    counts[chosen[:full]] = group
    if rest:
        counts[chosen[full]] = rest
    return counts


def closest_to_half_roots(v: np.ndarray, num_groups: int, group: int, rng: np.random.Generator) -> np.ndarray:
    """PCL: the ``num_groups`` prompts with v closest to 0.5, ``group`` rollouts each (ties random)."""
    if num_groups > len(v):
        raise ValueError(
            f"pcl needs {num_groups} prompts but the pool has {len(v)}; raise budget.pool_factor"
        )
    dist = np.round(np.abs(np.asarray(v, float) - 0.5), 12)
    order = np.lexsort((rng.permutation(len(v)), dist))
    counts = np.zeros(len(v), dtype=np.int64)
    counts[order[:num_groups]] = group
    return counts


# -- prefix modes -------------------------------------------------------------------------------
def uniform_prefix_counts(num: int, continuations: int, k_max: int, rng: np.random.Generator) -> np.ndarray:
    """Each continuation starts at a uniformly random prefix (with replacement, up to k_max each)."""
    if num == 0 or continuations <= 0:
        return np.zeros(num, dtype=np.int64)
    if k_max <= 0:
        return np.bincount(rng.integers(0, num, size=continuations), minlength=num).astype(np.int64)
    slots = np.repeat(np.arange(num), k_max)
    take = rng.choice(len(slots), size=min(continuations, len(slots)), replace=False)
    return np.bincount(slots[take], minlength=num).astype(np.int64)


def _expansions(
    cands: Sequence[PrefixCandidates], counts_fn: Callable[[PrefixCandidates], np.ndarray]
) -> list[Expansion]:
    out = []
    for c in cands:
        k = counts_fn(c)
        out.append(Expansion(c.node_ids, k, c.local_budget - int(k.sum())))
    return out


class TreeAllocator(Allocator):
    """Tree allocators: root mode x prefix mode, both 'uniform' or 'active'."""

    root_mode = "active"
    prefix_mode = "active"
    branches = True

    def roots(
        self, v: np.ndarray | None, num_candidates: int, budget: BudgetConfig, rng: np.random.Generator
    ) -> np.ndarray:
        if self.root_mode == "uniform" or v is None:
            return uniform_roots(num_candidates, budget.roots, self.cfg.root_group_size, rng)
        return solve_roots(v, budget.roots, self.cfg.m_min, self.cfg.m_max, rng)

    def prefixes(self, cands: Sequence[PrefixCandidates], rng: np.random.Generator) -> list[Expansion]:
        k_max = self.cfg.k_max

        def counts(c: PrefixCandidates) -> np.ndarray:
            if self.prefix_mode == "uniform" or c.scores is None:
                return uniform_prefix_counts(len(c.node_ids), c.local_budget, k_max, rng)
            return solve_prefixes(c.rewards, c.scores, c.local_budget, rng, k_max)

        return _expansions(cands, counts)


ALLOCATORS: Registry[type[Allocator]] = Registry("allocator", group="tracerl.allocators")


@ALLOCATORS.register("grpo")
class GRPOAllocator(FlatAllocator):
    """Uniform prompts, G full rollouts each."""

    name = "grpo"

    def roots(
        self, v: np.ndarray | None, num_candidates: int, budget: BudgetConfig, rng: np.random.Generator
    ) -> np.ndarray:
        return uniform_roots(num_candidates, budget.leaves, budget.group_size, rng)


@ALLOCATORS.register("pcl")
class PCLAllocator(FlatAllocator):
    """Prompt curriculum learning: the L/G prompts predicted closest to 0.5, G rollouts each."""

    name = "pcl"

    def roots(
        self, v: np.ndarray | None, num_candidates: int, budget: BudgetConfig, rng: np.random.Generator
    ) -> np.ndarray:
        if v is None:
            return uniform_roots(num_candidates, budget.leaves, budget.group_size, rng)
        return closest_to_half_roots(v, budget.num_groups, budget.group_size, rng)


@ALLOCATORS.register("dapo")
class DAPOAllocator(GRPOAllocator):
    """DAPO dynamic sampling: GRPO groups, zero-variance groups dropped and re-sampled.

    The step draws generation batches of L/G prompts x G rollouts from the candidate pool (in a
    random order) until L/G mixed groups are kept or ``max_gen_batches`` batches were drawn; surplus
    mixed groups of the last batch are dropped, as in DAPO. It spends more rollouts than it keeps.
    """

    name = "dapo"

    def plan_step(
        self, v: np.ndarray | None, anchors: Sequence[Anchor], budget: BudgetConfig, rng: np.random.Generator
    ) -> StepPlan:
        want = budget.num_groups
        order = rng.permutation(len(anchors))
        chunks = [order[b * want : (b + 1) * want] for b in range(self.cfg.max_gen_batches)]
        counts = np.full(len(anchors), budget.group_size, dtype=np.int64)
        return StepPlan(counts, [c for c in chunks if len(c)], keep_mixed=want)


@ALLOCATORS.register("treepo")
class TreePOAllocator(TreeAllocator):
    """Uniform roots, continuations from uniformly random prefixes (TRACE's uniform/uniform ablation)."""

    name = "treepo"
    root_mode = "uniform"
    prefix_mode = "uniform"


@ALLOCATORS.register("trace")
class TraceAllocator(TreeAllocator):
    """TRACE: exact V_root allocation over the pool, exact V_pref expansion per prompt."""

    name = "trace"


@ALLOCATORS.register("trace_debiased")
class TraceDebiasedAllocator(TraceAllocator):
    """TRACE whose predictor fits targets without selection bias: each policy-sampled child counts once.

    Allocation is trace's; what changes is what the predictor learns from the finished trees: the
    debiased targets D with weights = number of children (platform/tracerl/tree.py derives them).
    """

    name = "trace_debiased"
    targets = "debiased"


@ALLOCATORS.register("trace_root_only")
class TraceRootOnlyAllocator(TreeAllocator):
    """Ablation: active roots, uniformly random prefixes."""

    name = "trace_root_only"
    prefix_mode = "uniform"


@ALLOCATORS.register("trace_prefix_only")
class TracePrefixOnlyAllocator(TreeAllocator):
    """Ablation: uniform roots, active prefixes."""

    name = "trace_prefix_only"
    root_mode = "uniform"


@ALLOCATORS.register("oracle_trace")
class OracleTraceAllocator(TraceAllocator):
    """TRACE driven by the simulator's true success probabilities: the ceiling."""

    name = "oracle_trace"
    predictor = "oracle"


@ALLOCATORS.register("trace_mc")
class TraceMCAllocator(TraceAllocator):
    """TRACE whose scores are Monte-Carlo estimates from ``allocator.mc_samples`` extra rollouts of the current
    policy per root and per prefix, not trained on and not charged to the budget: what a perfect predictor of the
    policy's success rates would buy (docs/method.md, "trace_mc")."""

    name = "trace_mc"
    monte_carlo = True


def build_allocator(cfg: AllocatorConfig) -> Allocator:
    """Instantiate the allocator named by ``cfg.name`` (registered name or 'module:attr')."""
    cls = ALLOCATORS.get(cfg.name)
    return cls(cfg)
