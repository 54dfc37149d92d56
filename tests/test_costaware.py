import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_prefixes import random_prefixes
from tracerl.algos.costaware import (
    K_CAP,
    costed_prefix_objective,
    solve_choices,
    solve_prefixes_tokens,
    solve_roots_tokens,
    token_quantum,
)
from tracerl.algos.roots import allowed_counts, root_objective


def brute_prefixes(r: np.ndarray, p: np.ndarray, cost: np.ndarray, budget: float, cap: int) -> float:
    best = 0.0
    for ks in itertools.product(range(cap + 1), repeat=len(r)):
        if float(np.dot(ks, cost)) <= budget + 1e-9:
            best = max(best, costed_prefix_objective(r, p, np.array(ks)))
    return best


def brute_roots(v: np.ndarray, cost: np.ndarray, budget: float, m_min: int, m_max: int, n: float) -> float:
    best = 0.0
    for counts in itertools.product(allowed_counts(m_min, m_max), repeat=len(v)):
        if float(np.dot(counts, cost)) * (1 + n) <= budget + 1e-9:
            best = max(best, root_objective(v, np.array(counts)))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_prefixes_exact_on_integer_costs(seed: int) -> None:
    rng, r, p = random_prefixes(seed)
    cost = rng.integers(1, 30, len(r)).astype(float)
    budget = float(rng.integers(0, 90))
    k_max = int(rng.integers(1, 4))
    k = solve_prefixes_tokens(r, p, cost, budget, np.random.default_rng(seed), k_max)
    assert float(k @ cost) <= budget and k.max(initial=0) <= k_max and (k >= 0).all()
    assert costed_prefix_objective(r, p, k) == pytest.approx(
        brute_prefixes(r, p, cost, budget, k_max), abs=1e-9
    )


@pytest.mark.parametrize("seed", range(40))
def test_roots_exact_on_integer_costs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    v = rng.random(n) if seed % 3 else rng.choice([0.0, 0.2, 0.5, 0.9, 1.0], n)
    cost = rng.integers(1, 20, n).astype(float)
    m_min, m_max = 2, int(rng.integers(2, 5))
    expansion = float(rng.integers(0, 3))
    budget = float(rng.integers(0, 400))
    counts, shares = solve_roots_tokens(v, cost, budget, m_min, m_max, np.random.default_rng(seed), expansion)
    assert float(counts @ cost) * (1 + expansion) <= budget
    assert ((counts == 0) | ((counts >= m_min) & (counts <= m_max))).all()
    np.testing.assert_allclose(shares, counts * cost * expansion)
    assert root_objective(v, counts) == pytest.approx(
        brute_roots(v, cost, budget, m_min, m_max, expansion), abs=1e-9
    )


@pytest.mark.parametrize("seed", range(30))
def test_prefixes_quantised_bound(seed: int) -> None:
    # Real-valued costs and a coarse grid (max_units=20): OPT(T - P Delta) <= DP(T) <= OPT(T), within T.
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 5))
    r = rng.integers(0, 2, n).astype(float)
    p = rng.random(n)
    cost = rng.uniform(1.0, 40.0, n)
    budget = float(rng.uniform(30.0, 150.0))
    k = solve_prefixes_tokens(r, p, cost, budget, np.random.default_rng(seed), 3, max_units=20)
    delta = token_quantum(budget, 20)
    assert delta > 1
    got = costed_prefix_objective(r, p, k)
    assert float(k @ cost) <= budget
    assert got <= brute_prefixes(r, p, cost, budget, 3) + 1e-9
    assert got >= brute_prefixes(r, p, cost, budget - n * delta, 3) - 1e-9


@pytest.mark.parametrize("seed", range(30))
def test_roots_quantised_bound(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(1, 5))
    v = rng.random(n)
    cost = rng.uniform(1.0, 30.0, n)
    budget = float(rng.uniform(20.0, 300.0))
    counts, _ = solve_roots_tokens(v, cost, budget, 2, 4, np.random.default_rng(seed), 1.0, max_units=25)
    delta = token_quantum(budget, 25)
    got = root_objective(v, counts)
    assert float(counts @ cost) * 2 <= budget
    assert got <= brute_roots(v, cost, budget, 2, 4, 1.0) + 1e-9
    assert got >= brute_roots(v, cost, budget - n * delta, 2, 4, 1.0) - 1e-9


# Two prefixes with the same flip probability 0.5; the deep one costs 10 tokens, the shallow 100. With 100 tokens:
# four deep continuations (k_max=4) (1 - 0.5^4 = 0.9375) beat one shallow (0.5). With 140 tokens both fit: one
# shallow (100) plus four deep (40).
@pytest.mark.parametrize(("budget", "want"), [(100.0, [0, 4]), (140.0, [1, 4])])
def test_cheap_deep_prefix_wins_at_equal_flip(budget: float, want: list[int]) -> None:
    r, p, cost = np.array([0.0, 0.0]), np.array([0.5, 0.5]), np.array([100.0, 10.0])
    k = solve_prefixes_tokens(r, p, cost, budget, np.random.default_rng(0), k_max=4)
    np.testing.assert_array_equal(k, want)


def test_uncapped_prefixes_use_k_cap() -> None:
    k = solve_prefixes_tokens(
        np.array([0.0]), np.array([0.01]), np.array([1.0]), 1000.0, np.random.default_rng(0)
    )
    assert k[0] == K_CAP


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.floats(0, 1), st.floats(0, 500)), min_size=0, max_size=40),
    st.floats(0, 20000),
    st.integers(0, 9),
)
def test_prefix_budget_respected_and_deterministic(
    items: list[tuple[int, float, float]], budget: float, seed: int
) -> None:
    r = np.array([a for a, _, _ in items], float)
    p = np.array([b for _, b, _ in items], float)
    cost = np.array([c for _, _, c in items], float)
    k = solve_prefixes_tokens(r, p, cost, budget, np.random.default_rng(seed))
    assert (k >= 0).all() and float(k @ np.maximum(cost, 1.0)) <= budget + 1e-6
    np.testing.assert_array_equal(k, solve_prefixes_tokens(r, p, cost, budget, np.random.default_rng(seed)))


def test_bad_input_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="choice 0 of every group must be the empty choice"):
        solve_choices(np.array([[1.0, 2.0]]), np.array([[0.0, 1.0]]), 5.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="need 1 <= m_min <= m_max"):
        solve_roots_tokens(np.array([0.5]), np.array([3.0]), 10.0, 3, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="expansion N must be >= 0"):
        solve_roots_tokens(np.array([0.5]), np.array([3.0]), 10.0, 2, 2, np.random.default_rng(0), -1.0)
