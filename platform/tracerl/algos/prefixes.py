"""Stage 2 of TRACE: local prefix expansion (docs/method.md, "Stage 2").

Per active prompt, a local budget of m_i * N continuations is spread over the non-leaf prefixes
(j, t) of its bare rollouts. With r the observed reward of rollout j and p = V~(H_jt) the predicted
success probability at the prefix,

    q = r p + (1 - r)(1 - p)        (one continuation reproduces r)
    V_pref(k) = 1 - q^k             (at least one of k continuations flips the outcome)

and we maximise sum V_pref(K_jt) subject to sum K_jt = budget (and K_jt <= k_max if set). The
marginal gain of the k-th continuation, q^(k-1) (1 - q), is non-increasing in k, so taking the
``budget`` largest marginal gains over all (prefix, k) pairs, which is what the greedy max-heap
does, is exactly optimal. We take them with one sort instead of a heap (same result).

[choice] Ties are broken by a seeded random order of the prefixes; one expansion round.
"""

from __future__ import annotations

import numpy as np


def flip_probability(r: np.ndarray, p: np.ndarray) -> np.ndarray:
    """1 - q: probability one continuation from the prefix ends with the other outcome."""
    r = np.asarray(r, float)
    p = np.clip(np.asarray(p, float), 0.0, 1.0)
    q = r * p + (1.0 - r) * (1.0 - p)
    return 1.0 - q


def v_pref(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Probability that at least one of k continuations flips the outcome (q = reproduce prob.)."""
    return 1.0 - np.asarray(q, float) ** np.asarray(k)


def solve_prefixes(
    r: np.ndarray, p: np.ndarray, continuations: int, rng: np.random.Generator, k_max: int = 0
) -> np.ndarray:
    """Exactly optimal continuation counts K per prefix.

    Args:
        r: reward of the rollout each prefix belongs to, shape (P,).
        p: predicted success probability at each prefix, shape (P,).
        continuations: continuations to place (m_i * N), spent exactly unless capped out.
        rng: breaks ties between equal marginal gains.
        k_max: per-prefix cap on K; 0 means no cap.

    Returns:
        K, shape (P,), int64. Its sum is ``min(continuations, P * k_max)`` (``continuations`` when uncapped and P > 0);
        the caller turns any remainder into extra bare rollouts.
    """
    num = len(r)
    if num == 0 or continuations <= 0:
        return np.zeros(num, dtype=np.int64)
    q = 1.0 - flip_probability(r, p)
    cap = continuations if k_max <= 0 else min(k_max, continuations)
    ks = np.arange(cap)
    gains = (q[:, None] ** ks[None, :]) * (1.0 - q[:, None])  # (P, cap): gain of the (k+1)-th continuation
    tie = rng.permutation(num)
    # Sort by gain (desc), then random prefix order, then k (asc) so each row is taken as a prefix.
    g = np.round(gains, 14).ravel()
    rows = np.repeat(np.arange(num), cap)
    kk = np.tile(ks, num)
    order = np.lexsort((kk, tie[rows], -g))
    take = order[: min(continuations, num * cap)]
    return np.bincount(rows[take], minlength=num).astype(np.int64)


def prefix_objective(r: np.ndarray, p: np.ndarray, k: np.ndarray) -> float:
    """sum V_pref(K): expected number of prefixes whose outcome flips at least once."""
    q = 1.0 - flip_probability(r, p)
    return float(v_pref(q, k).sum())
