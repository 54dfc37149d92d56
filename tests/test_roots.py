import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.algos.roots import allowed_counts, root_objective, solve_roots, v_root


def brute_force(v: np.ndarray, budget: int, m_min: int, m_max: int) -> float:
    best = -1.0
    for counts in itertools.product(allowed_counts(m_min, m_max), repeat=len(v)):
        if sum(counts) == budget:
            best = max(best, root_objective(v, np.array(counts)))
    return best


def test_v_root_values() -> None:
    assert v_root(0.5, 2) == pytest.approx(0.5)
    assert v_root(0.5, 3) == pytest.approx(0.75)
    assert v_root(0.1, 2) == pytest.approx(1 - 0.01 - 0.81)
    assert v_root(0.3, 0) == 0.0 and v_root(0.3, 1) == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(40))
def test_dp_is_exactly_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    m_min, m_max = int(rng.integers(1, 3)), int(rng.integers(3, 6))
    v = rng.random(n) if seed % 3 else rng.choice([0.0, 0.2, 0.5, 0.9, 1.0], n)
    budget = int(rng.integers(m_min, n * m_max + 1))
    counts = solve_roots(v, budget, m_min, m_max, np.random.default_rng(seed))
    assert counts.sum() == budget
    assert all(c == 0 or m_min <= c <= m_max for c in counts)
    assert root_objective(v, counts) == pytest.approx(brute_force(v, budget, m_min, m_max), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    v=st.lists(st.floats(0, 1), min_size=1, max_size=40),
    data=st.data(),
)
def test_budget_spent_and_bounds(v: list[float], data: st.DataObject) -> None:
    m_min, m_max = (
        2,
        data.draw(st.integers(3, 8)),
    )  # with m_max >= 3 every budget in [2, n m_max] is reachable
    budget = data.draw(st.integers(m_min, len(v) * m_max))
    seed = data.draw(st.integers(0, 10))
    counts = solve_roots(np.array(v), budget, m_min, m_max, np.random.default_rng(seed))
    assert counts.sum() == budget
    assert ((counts == 0) | ((counts >= m_min) & (counts <= m_max))).all()
    again = solve_roots(np.array(v), budget, m_min, m_max, np.random.default_rng(seed))
    np.testing.assert_array_equal(counts, again)  # same seed, same allocation


def test_prefers_uncertain_prompts() -> None:
    v = np.array([0.0, 1.0, 0.5, 0.02, 0.45])
    counts = solve_roots(v, 4, 2, 16, np.random.default_rng(0))
    np.testing.assert_array_equal(counts, [0, 0, 2, 0, 2])


def test_ties_are_broken_by_the_seeded_rng() -> None:
    v = np.full(10, 0.5)  # every prompt equal: which two get the pair depends on the rng only
    picks = {tuple(np.flatnonzero(solve_roots(v, 2, 2, 4, np.random.default_rng(s)))) for s in range(20)}
    assert len(picks) > 3


def test_unreachable_budget_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="raise the candidate pool or m_max"):
        solve_roots(np.full(3, 0.5), 20, 2, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cannot place 1 rollouts"):
        solve_roots(np.full(3, 0.5), 1, 2, 4, np.random.default_rng(0))


def test_parity_gap_is_reported() -> None:
    with pytest.raises(ValueError, match="cannot place exactly 3 rollouts"):
        solve_roots(np.zeros(2), 3, 2, 2, np.random.default_rng(0))
