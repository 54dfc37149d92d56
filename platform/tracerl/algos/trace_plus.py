"""Allocator ``trace_plus``: debiased predictor targets plus token-priced allocation (algos/costaware.py).

* Targets: as ``trace_debiased`` (each policy-sampled child counted once; platform/tracerl/tree.py).
* Prices: a length model L~ (``lengths``, attached by the driver: predictors/length.py) predicts the
  generated tokens of one rollout from each anchor: c_i = L~(root i) for a bare rollout,
  c_jt = L~(H_jt) for a continuation (its remaining turns only).
* Stage 1: ``solve_roots_tokens`` within the step's token budget T; prompt i's continuation share
  S_i = m_i c_i N is fixed there. Stage 2: ``solve_prefixes_tokens`` within S_i per prompt.

[choice] T is ``budget.token_budget`` in token mode; in leaf mode it is L times the pool's mean
predicted bare-rollout cost (what L bare rollouts of an average prompt would generate).
[choice] While the success predictor is cold (v or p is None) it falls back to trace's uniform
allocation with leaf budgets; while the length predictor is not ready it allocates exactly as trace. Tokens a prompt leaves unspent are not re-spent as bare rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np

from tracerl.algos.allocators import (
    ALLOCATORS,
    Expansion,
    PrefixCandidates,
    StepPlan,
    TraceAllocator,
    one_batch,
    uniform_roots,
)
from tracerl.algos.config import BudgetConfig
from tracerl.algos.costaware import solve_prefixes_tokens, solve_roots_tokens
from tracerl.tree import RolloutTree
from tracerl.types import Anchor


class LengthModel(Protocol):
    """What trace_plus needs of a length predictor (tracerl.predictors.length.RidgeLengthPredictor)."""

    @property
    def ready(self) -> bool: ...

    def predict(self, anchors: Sequence[Anchor]) -> np.ndarray: ...

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


@ALLOCATORS.register("trace_plus")
class TracePlusAllocator(TraceAllocator):
    """TRACE with debiased targets and roots / continuations priced by predicted generated tokens."""

    name = "trace_plus"
    targets = "debiased"
    length_predictor = "ridge"
    lengths: LengthModel | None = None

    def price(self, anchors: Sequence[Anchor]) -> np.ndarray | None:
        if self.lengths is None:
            raise ValueError(
                "allocator trace_plus needs a length predictor: build it with "
                "tracerl.engine.allocation.build_allocation, which attaches one"
            )
        return self.lengths.predict(anchors) if self.lengths.ready else None

    def observe(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        return {} if self.lengths is None else self.lengths.fit(trees)

    def state_dict(self) -> dict[str, object]:
        return {} if self.lengths is None else {"lengths": self.lengths.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        if self.lengths is not None and "lengths" in state:
            self.lengths.load_state_dict(cast("dict[str, object]", state["lengths"]))

    def plan_step(
        self, v: np.ndarray | None, anchors: Sequence[Anchor], budget: BudgetConfig, rng: np.random.Generator
    ) -> StepPlan:
        costs = self.price(anchors)
        if costs is None:  # the length predictor is not ready: trace's plan
            return super().plan_step(v, anchors, budget, rng)
        return one_batch(self.priced_roots(v, costs, budget, rng), budget.continuations, costs)

    def priced_roots(
        self, v: np.ndarray | None, costs: np.ndarray, budget: BudgetConfig, rng: np.random.Generator
    ) -> np.ndarray:
        """Root counts within the step's token budget, given per-candidate rollout costs."""
        if v is None:
            return uniform_roots(len(costs), budget.roots, self.cfg.root_group_size, rng)
        tokens = (
            budget.token_budget if budget.token_budget is not None else budget.leaves * float(np.mean(costs))
        )
        counts, _ = solve_roots_tokens(
            v, costs, tokens, self.cfg.m_min, self.cfg.m_max, rng, budget.continuations
        )
        return counts

    def prefixes(self, cands: Sequence[PrefixCandidates], rng: np.random.Generator) -> list[Expansion]:
        if any(c.scores is None or c.costs is None or c.token_share is None for c in cands):
            return super().prefixes(cands, rng)
        out = []
        for c in cands:
            assert c.scores is not None and c.costs is not None and c.token_share is not None
            k = solve_prefixes_tokens(c.rewards, c.scores, c.costs, c.token_share, rng, self.cfg.k_max)
            out.append(Expansion(c.node_ids, k, 0))
        return out
