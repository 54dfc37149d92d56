"""Knapsack RL (Li et al., arXiv 2509.25849) as a flat allocator: rollout counts per prompt by an exact knapsack.

Every prompt of the candidate pool is an item; giving it n bare rollouts, at predicted success rate p, is worth

    Value(p, n) = (1 - p^n - (1 - p)^n) I(p),    Value(p, 0) = 0,

the probability that the n rollouts are mixed (so its GRPO group has a non-zero gradient: V_root of roots.py) times
an information term I(p), what one mixed group of that prompt is worth. The allocator chooses counts

    maximise  sum_i Value(v_i, n_i)   s.t.  sum_i n_i = L,   n_i in {0} U [m_min, m_max],

with L the flat allocators' leaf budget (budget.leaves) and m_min, m_max the allocator's bounds, so it spends the
leaves grpo and pcl spend, as bare rollouts only (no Stage 2). Value is concave in n from n = 1 on, but a prompt's
first useful step is the jump from 0 to m_min (one rollout is never mixed), so a greedy over marginal gains is not
exact; the exact DP over (prompt, rollouts spent) of roots.py (``solve_gain_table``, O(B L (m_max - m_min + 2)))
solves it, with its tie rule: gains quantised to 2^-40 so equal objectives tie exactly, ties broken by a seeded
random order of the prompts.

[choice] I(p) = p (1 - p)^2, the paper's approximate InfoGain (the rise in success rate one step on the prompt is
expected to bring), by default; ``allocator.knapsack_info = variance`` uses the reward variance p (1 - p) instead.
[choice] The bounds are ``allocator.m_min`` (2) and ``allocator.m_max`` (16, shared with the tree allocators; the
paper let hard prompts reach far larger counts, raise it to allow that). Prompts with I(p) = 0 (p in {0, 1}) are
worth nothing and get rollouts only when the informative prompts cannot absorb the whole budget; the paper's fallback
for prompts never solved is not implemented.
[choice] The items are the shared candidate pool (budget.pool_factor L/G prompts), so the knapsack also chooses
which prompts to roll out; the paper spreads a batch's budget over that batch's prompts.
[choice] Cold start: while the predictor is cold (v is None) the allocation is grpo's, L/G random prompts x G.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from tracerl.algos.allocators import ALLOCATORS, FlatAllocator, uniform_roots
from tracerl.algos.config import BudgetConfig
from tracerl.algos.roots import allowed_counts, check_placeable, solve_gain_table, v_root

InfoTerm = Literal["paper", "variance"]


def info_gain(p: np.ndarray | float, kind: InfoTerm = "paper") -> np.ndarray:
    """I(p), the worth of one mixed group of a prompt with success rate p: p (1 - p)^2 ('paper') or p (1 - p)."""
    q = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    if kind == "paper":
        return q * (1.0 - q) ** 2
    if kind == "variance":
        return q * (1.0 - q)
    raise ValueError(f"unknown knapsack information term {kind!r}; known: paper, variance")


def knapsack_value(p: np.ndarray | float, n: np.ndarray | int, kind: InfoTerm = "paper") -> np.ndarray:
    """Value(p, n) = (1 - p^n - (1 - p)^n) I(p): n rollouts' chance of a non-zero gradient times its worth."""
    q = np.clip(np.asarray(p, dtype=float), 0.0, 1.0)
    return v_root(q, n) * info_gain(q, kind)


def solve_knapsack(
    v: np.ndarray,
    rollouts: int,
    m_min: int,
    m_max: int,
    rng: np.random.Generator,
    kind: InfoTerm = "paper",
) -> np.ndarray:
    """Exactly optimal rollout counts: maximise sum_i Value(v_i, n_i) with sum_i n_i = ``rollouts``.

    Args:
        v: predicted success probabilities, shape (B,), clipped to [0, 1].
        rollouts: rollouts to place; spent exactly.
        m_min: smallest non-zero count.
        m_max: largest count per prompt.
        rng: breaks ties between equally good allocations.
        kind: the information term (``info_gain``).

    Returns:
        counts, shape (B,), int64, summing to ``rollouts``, each 0 or in [m_min, m_max].

    Raises:
        ValueError: ``rollouts`` cannot be placed exactly under the bounds.
    """
    v = np.clip(np.asarray(v, dtype=float), 0.0, 1.0)
    check_placeable(v.shape[0], rollouts, m_min, m_max)
    choices = allowed_counts(m_min, m_max)
    return solve_gain_table(knapsack_value(v[:, None], choices[None, :], kind), choices, rollouts, rng)


def knapsack_objective(v: np.ndarray, counts: np.ndarray, kind: InfoTerm = "paper") -> float:
    """sum_i Value(v_i, n_i), the objective ``solve_knapsack`` maximises."""
    return float(knapsack_value(np.asarray(v, float), np.asarray(counts), kind).sum())


@ALLOCATORS.register("knapsack")
class KnapsackAllocator(FlatAllocator):
    """Knapsack RL: L bare rollouts spread over the pool by the exact knapsack on Value(v, n); grpo while cold."""

    name = "knapsack"

    def roots(
        self, v: np.ndarray | None, num_candidates: int, budget: BudgetConfig, rng: np.random.Generator
    ) -> np.ndarray:
        if v is None:
            return uniform_roots(num_candidates, budget.leaves, budget.group_size, rng)
        return solve_knapsack(v, budget.leaves, self.cfg.m_min, self.cfg.m_max, rng, self.cfg.knapsack_info)
