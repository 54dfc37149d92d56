import itertools

import numpy as np
import pytest

from tracerl.algos.allocators import ALLOCATORS, build_allocator
from tracerl.algos.knapsack import (
    InfoTerm,
    KnapsackAllocator,
    info_gain,
    knapsack_objective,
    knapsack_value,
    solve_knapsack,
)
from tracerl.algos.roots import allowed_counts
from tracerl.config import AllocatorConfig, BudgetConfig

BUDGET = BudgetConfig()  # L = 288, G = 8, B = 144


def brute_force(v: np.ndarray, budget: int, m_min: int, m_max: int, kind: InfoTerm) -> float:
    """The best objective over every allocation that spends ``budget`` exactly."""
    best = -1.0
    for counts in itertools.product(allowed_counts(m_min, m_max), repeat=len(v)):
        if sum(counts) == budget:
            best = max(best, knapsack_objective(v, np.array(counts), kind))
    return best


def test_value_is_mixed_probability_times_information() -> None:
    # p = 0.5, n = 2: P(mixed) = 1/2; paper I = 0.5 * 0.25 = 1/8, variance I = 1/4.
    assert knapsack_value(0.5, 2, "paper") == pytest.approx(1 / 16)
    assert knapsack_value(0.5, 2, "variance") == pytest.approx(1 / 8)
    # p = 0.2, n = 3: 1 - 0.008 - 0.512 = 0.48; I = 0.2 * 0.64 = 0.128.
    assert knapsack_value(0.2, 3) == pytest.approx(0.48 * 0.128)
    assert knapsack_value(0.3, 0) == 0.0 and knapsack_value(0.3, 1) == pytest.approx(0.0)
    assert info_gain(np.array([0.0, 1.0])).tolist() == [0.0, 0.0]
    # The paper's term favours hard prompts: p = 1/3 maximises p (1 - p)^2.
    grid = np.linspace(0, 1, 301)
    assert grid[np.argmax(info_gain(grid))] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="unknown knapsack information term 'nope'"):
        info_gain(0.5, "nope")  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(30))
def test_dp_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 5))
    m_min, m_max = 2, int(rng.integers(3, 5))
    v = rng.random(n) if seed % 3 else rng.choice([0.0, 0.1, 0.3, 0.5, 0.9, 1.0], n)
    budget = int(rng.integers(m_min, min(12, n * m_max) + 1))
    kind: InfoTerm = "paper" if seed % 2 else "variance"
    counts = solve_knapsack(v, budget, m_min, m_max, np.random.default_rng(seed), kind)
    assert counts.sum() == budget
    assert all(c == 0 or m_min <= c <= m_max for c in counts)
    assert knapsack_objective(v, counts, kind) == pytest.approx(
        brute_force(v, budget, m_min, m_max, kind), abs=1e-12
    )


def test_a_known_optimum() -> None:
    """6 rollouts on p = (0.5, 0.2, 0.9), counts 0 or 2..4, paper term (I = 0.125, 0.128, 0.009).

    By hand: (3, 3, 0) = 0.75 x 0.125 + 0.48 x 0.128 = 0.15519 beats (4, 2, 0) = 0.875 x 0.125 + 0.32 x 0.128 =
    0.15034, (2, 4, 0) = 0.0625 + 0.5888 x 0.128 = 0.13787 and every split that gives p = 0.9 rollouts."""
    v = np.array([0.5, 0.2, 0.9])
    counts = solve_knapsack(v, 6, 2, 4, np.random.default_rng(0))
    assert counts.tolist() == [3, 3, 0]
    assert knapsack_objective(v, counts) == pytest.approx(0.75 * 0.125 + 0.48 * 0.128)


def test_certain_prompts_get_nothing_while_others_are_informative() -> None:
    v = np.array([0.0, 1.0, 0.4, 1.0, 0.6, 0.0, 0.3])
    for seed in range(10):
        counts = solve_knapsack(v, 12, 2, 16, np.random.default_rng(seed))
        assert counts.sum() == 12
        assert counts[[0, 1, 3, 5]].tolist() == [0, 0, 0, 0]
    # Only when the informative prompts are full (3 x 4 = 12 < 16) does the rest go to worthless prompts.
    counts = solve_knapsack(v, 16, 2, 4, np.random.default_rng(0))
    assert counts[[2, 4, 6]].tolist() == [4, 4, 4] and counts.sum() == 16


def test_budget_is_spent_exactly_and_bounds_hold_at_the_default_size() -> None:
    v = np.random.default_rng(1).random(144)
    counts = build_allocator(AllocatorConfig(name="knapsack")).roots(v, 144, BUDGET, np.random.default_rng(2))
    assert counts.sum() == BUDGET.leaves == 288
    assert ((counts == 0) | ((counts >= 2) & (counts <= 16))).all()


def test_unplaceable_budget_says_so() -> None:
    with pytest.raises(ValueError, match="cannot place 20 rollouts on 2 candidates"):
        solve_knapsack(np.array([0.5, 0.5]), 20, 2, 4, np.random.default_rng(0))


def test_cold_predictor_is_grpo() -> None:
    knap = build_allocator(AllocatorConfig(name="knapsack"))
    grpo = build_allocator(AllocatorConfig(name="grpo"))
    counts = knap.roots(None, 144, BUDGET, np.random.default_rng(5))
    np.testing.assert_array_equal(counts, grpo.roots(None, 144, BUDGET, np.random.default_rng(5)))
    assert sorted(set(counts.tolist())) == [0, 8] and counts.sum() == 288
    plan = knap.plan_step(None, [object()] * 144, BUDGET, np.random.default_rng(5))  # type: ignore[list-item]
    assert plan.continuations == 0 and plan.batches[0].tolist() == np.flatnonzero(counts).tolist()


def test_same_seed_same_plan() -> None:
    v = np.round(np.random.default_rng(3).random(144), 1)  # many exact ties
    alloc = build_allocator(AllocatorConfig(name="knapsack"))
    a = alloc.roots(v, 144, BUDGET, np.random.default_rng(7))
    np.testing.assert_array_equal(a, alloc.roots(v, 144, BUDGET, np.random.default_rng(7)))
    assert any(
        not np.array_equal(a, alloc.roots(v, 144, BUDGET, np.random.default_rng(s))) for s in range(8, 12)
    )  # ties are broken by the seed
    objs = {
        knapsack_objective(v, alloc.roots(v, 144, BUDGET, np.random.default_rng(s))) for s in range(7, 12)
    }
    assert max(objs) - min(objs) < 1e-9  # every tie-break is optimal


def test_registered_and_configured() -> None:
    assert ALLOCATORS.get("knapsack") is KnapsackAllocator
    alloc = build_allocator(AllocatorConfig(name="knapsack", knapsack_info="variance", m_max=8))
    assert isinstance(alloc, KnapsackAllocator) and alloc.name == "knapsack"
    v = np.array([0.5, 0.2])
    counts = alloc.roots(
        v, 2, BudgetConfig(num_leaves=16, continuations=0, group_size=8), np.random.default_rng(0)
    )
    assert counts.tolist() == [8, 8]
    with pytest.raises(ValueError, match="allocator.knapsack_info"):
        AllocatorConfig(name="knapsack", knapsack_info="nope")  # type: ignore[arg-type]
