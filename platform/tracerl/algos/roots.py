"""Stage 1 of TRACE: global root allocation (docs/method.md, "Stage 1").

Given predicted success probabilities v_i for a candidate pool, choose rollout counts m_i with
sum_i m_i = M and m_i in {0} U [m_min, m_max], maximising

    sum_i V_root(v_i, m_i),    V_root(v, m) = 1 - v^m - (1-v)^m,    V_root(v, 0) = 0,

the expected number of mixed (contrastive) groups.

Solver: an exact dynamic programme over (prompt, budget spent), vectorised over the budget axis;
O(B * M * (m_max - m_min + 2)) with B candidates. The paper notes greedy is optimal up to parity and
"an exact small DP settles parity"; we use the DP throughout, so the allocation is exactly optimal.

[choice] Gains are quantised to integers (2^-40 resolution) so that equal objectives tie exactly;
ties are broken by a seeded random order of the candidates, preferring fewer rollouts for the
earlier candidate in that order.
"""

from __future__ import annotations

import numpy as np

_SCALE = float(2**40)


def v_root(v: np.ndarray | float, m: np.ndarray | int) -> np.ndarray:
    """Probability that m Bernoulli(v) rollouts hold both a success and a failure; 0 for m = 0."""
    v = np.asarray(v, dtype=float)
    m = np.asarray(m)
    out = 1.0 - v**m - (1.0 - v) ** m
    return np.where(m > 0, out, 0.0)


def allowed_counts(m_min: int, m_max: int) -> np.ndarray:
    """The count values a candidate may receive: 0 (filtered out) or m_min..m_max."""
    return np.concatenate([[0], np.arange(m_min, m_max + 1)])


def check_placeable(num: int, rollouts: int, m_min: int, m_max: int) -> None:
    """Raise ValueError unless ``rollouts`` rollouts can be spread over ``num`` candidates, each 0 or m_min..m_max."""
    if not 1 <= m_min <= m_max:
        raise ValueError(f"need 1 <= m_min <= m_max, got m_min={m_min}, m_max={m_max}")
    if rollouts < 0 or rollouts > num * m_max or 0 < rollouts < m_min:
        raise ValueError(
            f"cannot place {rollouts} rollouts on {num} candidates with counts in {{0}} U [{m_min}, {m_max}]: "
            f"raise the candidate pool or m_max, or change the budget"
        )


def solve_roots(v: np.ndarray, roots: int, m_min: int, m_max: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly optimal rollout counts for the candidates.

    Args:
        v: predicted success probabilities, shape (B,), each in [0, 1].
        roots: M, the number of bare rollouts to place; spent exactly.
        m_min: smallest non-zero count (2: a single rollout has no contrast).
        m_max: largest count per candidate.
        rng: breaks ties between equally good allocations.

    Returns:
        counts, shape (B,), int64, summing to ``roots``.

    Raises:
        ValueError: M rollouts cannot be placed exactly under the bounds.
    """
    v = np.clip(np.asarray(v, dtype=float), 0.0, 1.0)
    check_placeable(v.shape[0], roots, m_min, m_max)
    choices = allowed_counts(m_min, m_max)
    return solve_gain_table(v_root(v[:, None], choices[None, :]), choices, roots, rng)


def solve_gain_table(
    gains: np.ndarray, choices: np.ndarray, rollouts: int, rng: np.random.Generator
) -> np.ndarray:
    """Exact separable allocation: one count per candidate from ``choices``, maximising the summed gains.

    The DP behind ``solve_roots``, over any gain table (``algos/knapsack.py`` weights V_root per prompt), so the
    solvers share one tie rule.

    Args:
        gains: value of giving candidate i ``choices[c]`` rollouts, shape (B, C); choice 0 is 0 rollouts.
        choices: the allowed counts, shape (C,), increasing, starting at 0.
        rollouts: rollouts to place; spent exactly.
        rng: breaks ties between equally good allocations (module docstring).

    Returns:
        counts, shape (B,), int64, summing to ``rollouts``.

    Raises:
        ValueError: ``rollouts`` is not reachable with these choices.
    """
    num = gains.shape[0]
    order = rng.permutation(num)
    neg = np.iinfo(np.int64).min // 4
    best = np.full(rollouts + 1, neg, dtype=np.int64)  # best[b]: max objective spending exactly b
    best[0] = 0
    pick = np.zeros((num, rollouts + 1), dtype=np.int64)  # index into `choices`
    cols = np.arange(rollouts + 1)
    src = cols[None, :] - choices[:, None]  # (C, M+1): rollouts before buying `choices[c]` rollouts
    valid = src >= 0
    src = np.maximum(src, 0)
    gains_all = np.round(np.asarray(gains, dtype=float) * _SCALE).astype(np.int64)  # (B, C)
    for row, i in enumerate(order):
        cand = np.where(valid, best[src] + gains_all[i][:, None], neg)
        # argmax returns the first maximum: the smallest count among equally good choices.
        pick[row] = np.argmax(cand, axis=0)
        best = cand[pick[row], cols]
    if best[rollouts] <= neg // 2:
        raise ValueError(
            f"cannot place exactly {rollouts} rollouts with per-candidate counts in {choices.tolist()}"
        )
    counts = np.zeros(num, dtype=np.int64)
    b = rollouts
    for row in range(num - 1, -1, -1):
        m = int(choices[pick[row, b]])
        counts[order[row]] = m
        b -= m
    assert b == 0
    return counts


def root_objective(v: np.ndarray, counts: np.ndarray) -> float:
    """sum_i V_root(v_i, m_i): expected number of mixed groups."""
    return float(v_root(np.asarray(v, float), np.asarray(counts)).sum())
