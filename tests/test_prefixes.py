import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.algos.prefixes import flip_probability, prefix_objective, solve_prefixes


def brute_force(r: np.ndarray, p: np.ndarray, budget: int, k_max: int) -> float:
    cap = budget if k_max <= 0 else min(k_max, budget)
    best = -1.0
    for ks in itertools.product(range(cap + 1), repeat=len(r)):
        if sum(ks) == min(budget, len(r) * cap):
            best = max(best, prefix_objective(r, p, np.array(ks)))
    return best


def test_flip_probability_prefers_surprises() -> None:
    # A failed rollout (r=0) through a prefix predicted on track (p=0.9) flips with probability 0.9;
    # a successful one through a prefix predicted lost (p=0.2) flips with probability 0.8.
    np.testing.assert_allclose(
        flip_probability(np.array([0, 1, 1]), np.array([0.9, 0.2, 0.9])), [0.9, 0.8, 0.1]
    )


def random_prefixes(seed: int) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """1 to 4 prefixes drawn from ``seed``: their outcomes r and predictions p (every fourth seed's p at 0, 0.5 or 1,
    the ties), and the generator for the test's further draws (tests/test_costaware.py draws costs from it)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    r = rng.integers(0, 2, n).astype(float)
    p = rng.random(n) if seed % 4 else rng.choice([0.0, 0.5, 1.0], n)
    return rng, r, p


@pytest.mark.parametrize("seed", range(40))
def test_greedy_is_exactly_optimal(seed: int) -> None:
    rng, r, p = random_prefixes(seed)
    n = len(r)
    budget = int(rng.integers(1, 7))
    k_max = int(rng.integers(0, 3))
    k = solve_prefixes(r, p, budget, np.random.default_rng(seed), k_max)
    cap = budget if k_max <= 0 else min(k_max, budget)
    assert k.sum() == min(budget, n * cap)
    assert k_max <= 0 or k.max() <= k_max
    assert prefix_objective(r, p, k) == pytest.approx(brute_force(r, p, budget, k_max), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.floats(0, 1)), min_size=1, max_size=30),
    st.integers(0, 60),
    st.integers(0, 9),
)
def test_budget_spent_deterministically(items: list[tuple[int, float]], budget: int, seed: int) -> None:
    r = np.array([a for a, _ in items], float)
    p = np.array([b for _, b in items], float)
    k = solve_prefixes(r, p, budget, np.random.default_rng(seed))
    assert k.sum() == budget and (k >= 0).all()
    np.testing.assert_array_equal(k, solve_prefixes(r, p, budget, np.random.default_rng(seed)))


def test_golden_allocation() -> None:
    # flips: 0.9, 0.5, 0.1. Gains: prefix0 0.9, 0.09, ...; prefix1 0.5, 0.25, 0.125; prefix2 0.1, ...
    # Best 4: 0.9 (p0), 0.5 (p1), 0.25 (p1), 0.125 (p1) -> K = [1, 3, 0].
    k = solve_prefixes(np.array([0.0, 0.0, 1.0]), np.array([0.9, 0.5, 0.9]), 4, np.random.default_rng(0))
    np.testing.assert_array_equal(k, [1, 3, 0])


def test_no_prefixes_spends_nothing() -> None:
    assert solve_prefixes(np.zeros(0), np.zeros(0), 5, np.random.default_rng(0)).sum() == 0
