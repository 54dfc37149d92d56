"""Cost-aware TRACE (``trace_plus``): roots and continuations priced by predicted generated tokens.

Under a token budget T per step, a bare rollout of prompt i costs c_i (its predicted generated
tokens from the root) and a continuation from prefix (j, t) costs c_jt (the predicted tokens of
its remaining turns only: deep prefixes are cheap). Both stages become knapsacks.

Stage 1 (roots): choose m_i in {0} U [m_min, m_max] maximising

    sum_i V_root(v_i, m_i)    s.t.    sum_i m_i c_i (1 + N) <= T,

where N is the expansion factor of the leaves budget (M bare rollouts, M N continuations): each
bare rollout brings N bare-rollout costs of continuation tokens. Prompt i's continuation share is
then fixed at S_i = m_i c_i N tokens, so its expansion can stream as soon as its own roots finish.

Stage 2 (prefixes, per prompt): with q_jt = r p + (1 - r)(1 - p) (algos/prefixes.py), choose K_jt
maximising

    sum_jt (1 - q_jt^K_jt)    s.t.    sum_jt K_jt c_jt <= S_i,   0 <= K_jt <= k_cap.

Solver (both stages): an exact dynamic programme for the multiple-choice knapsack (one choice per
prompt / prefix) over integer token units of size Delta = max(1, ceil(T / max_units)); the cost of
a choice is ceil(choice cost / Delta) units, rounded up, so every answer respects the real budget.

* Exact: when every choice cost is a whole number of tokens and T <= max_units (Delta = 1), the
  DP is the exact optimum over the real costs.
* Bound otherwise: rounding adds less than Delta per group, so any allocation whose real cost is
  at most T - G Delta (G groups: prompts or prefixes) fits the quantised budget. Hence

      OPT(T - G Delta) <= DP(T) <= OPT(T),

  i.e. the answer is at least as good as the exact optimum with G Delta = G ceil(T / max_units)
  tokens fewer (with max_units = 4096 and G = 64 prefixes, under 1.6 % of the budget).

[choice] max_units = 4096 units per knapsack; k_cap = 32 continuations per prefix at most (with
the stage's own k_max where smaller); a cost below one token counts as one token.
[choice] Objective values are quantised to integers (2^-40 resolution) so equal objectives tie
exactly; ties are broken by a seeded random order of the groups, preferring the smaller choice.
[choice] A choice worth no more than a smaller (no dearer) one of its group is dropped before the
DP (exact: it can never be strictly better), which keeps the DP small once gains saturate.
[choice] Unspent tokens are the caller's (the budget carries them over to the next step).
"""

from __future__ import annotations

import math

import numpy as np

from tracerl.algos.prefixes import flip_probability, v_pref
from tracerl.algos.roots import allowed_counts, v_root

_SCALE = float(2**40)
MAX_UNITS = 4096
K_CAP = 32


def token_quantum(token_budget: float, max_units: int = MAX_UNITS) -> int:
    """Delta: tokens per DP unit, so that the budget spans at most ``max_units`` units."""
    if max_units < 1:
        raise ValueError(f"max_units must be >= 1 (got {max_units})")
    return max(1, math.ceil(token_budget / max_units))


def solve_choices(
    values: np.ndarray,
    costs: np.ndarray,
    token_budget: float,
    rng: np.random.Generator,
    max_units: int = MAX_UNITS,
) -> np.ndarray:
    """Multiple-choice knapsack: one choice per group, maximising total value within the budget.

    Args:
        values: value of each choice, shape (G, C); choice 0 must be the empty one (value 0, cost 0).
        costs: real token cost of each choice, shape (G, C), non-decreasing along C; ``np.inf`` marks a
            choice not allowed (so only at the end of a row).
        token_budget: T, the tokens the choices may spend together.
        rng: breaks ties between equally good allocations.
        max_units: DP resolution (see the module docstring for the bound).

    Returns:
        the chosen column per group, shape (G,), int64; the real cost of the choices is <= T.
    """
    values = np.asarray(values, float)
    costs = np.asarray(costs, float)
    if values.shape != costs.shape or values.ndim != 2:
        raise ValueError(
            f"values and costs must both have shape (G, C); got {values.shape} and {costs.shape}"
        )
    num = values.shape[0]
    if num == 0 or token_budget <= 0:
        return np.zeros(num, dtype=np.int64)
    if np.any(costs[:, 0] != 0) or np.any(values[:, 0] != 0):
        raise ValueError("choice 0 of every group must be the empty choice (value 0, cost 0)")
    if np.any(costs < 0) or np.any(np.isnan(costs)):
        raise ValueError("choice costs must be >= 0 (np.inf marks a forbidden choice)")
    if np.any(np.diff(costs, axis=1) < 0):
        raise ValueError("choice costs must not decrease along a group's choices (order choices by cost)")
    delta = token_quantum(token_budget, max_units)
    units = int(token_budget // delta)
    with np.errstate(invalid="ignore"):
        q = np.ceil(np.where(np.isfinite(costs), costs, 0.0) / delta - 1e-9)
    unit_cost = np.where(np.isfinite(costs) & (q <= units), q, units + 1).astype(np.int64)
    gains = np.round(values * _SCALE).astype(np.int64)
    neg = np.iinfo(np.int64).min // 4
    cols = np.arange(units + 1)
    order = rng.permutation(num)
    best = np.zeros(units + 1, dtype=np.int64)  # best[b]: max value with at most b units spent
    pick = np.zeros((num, units + 1), dtype=np.int64)
    running = np.maximum.accumulate(gains, axis=1)
    for row, g in enumerate(order):
        # Only choices that fit and add value over every smaller (hence no dearer) choice can be optimal.
        keep = np.flatnonzero(
            (unit_cost[g] <= units) & np.concatenate([[True], gains[g, 1:] > running[g, :-1]])
        )
        s = cols[None, :] - unit_cost[g, keep][:, None]  # (C', U+1): units left before buying each choice
        cand = np.where(s >= 0, best[np.maximum(s, 0)] + gains[g, keep][:, None], neg)
        local = np.argmax(cand, axis=0)  # first maximum: the smallest choice among equals
        pick[row] = keep[local]
        best = cand[local, cols]
    out = np.zeros(num, dtype=np.int64)
    b = units
    for row in range(num - 1, -1, -1):
        c = int(pick[row, b])
        out[order[row]] = c
        b -= int(unit_cost[order[row], c])
    assert b >= 0
    return out


def solve_roots_tokens(
    v: np.ndarray,
    cost: np.ndarray,
    token_budget: float,
    m_min: int,
    m_max: int,
    rng: np.random.Generator,
    expansion: float = 0.0,
    max_units: int = MAX_UNITS,
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1: rollout counts m_i and each prompt's continuation share S_i = m_i c_i N (tokens).

    Args:
        v: predicted root success probabilities, shape (B,).
        cost: predicted generated tokens of one bare rollout of each prompt, shape (B,).
        token_budget: T for the step (bare rollouts and continuations together).
        m_min, m_max: the counts allowed besides 0.
        rng: breaks ties.
        expansion: N, continuation tokens reserved per bare rollout, in bare-rollout costs.
        max_units: DP resolution.

    Returns:
        (counts, shares): int64 counts with sum_i m_i c_i (1 + N) <= T, and float shares S_i.
    """
    v = np.clip(np.asarray(v, float), 0.0, 1.0)
    cost = np.maximum(np.asarray(cost, float), 1.0)
    if not 1 <= m_min <= m_max:
        raise ValueError(f"need 1 <= m_min <= m_max, got m_min={m_min}, m_max={m_max}")
    if expansion < 0:
        raise ValueError(f"expansion N must be >= 0 (got {expansion})")
    choices = allowed_counts(m_min, m_max)
    values = v_root(v[:, None], choices[None, :])
    costs = choices[None, :] * cost[:, None] * (1.0 + expansion)
    counts = choices[solve_choices(values, costs, token_budget, rng, max_units)]
    return counts.astype(np.int64), counts * cost * expansion


def solve_prefixes_tokens(
    r: np.ndarray,
    p: np.ndarray,
    cost: np.ndarray,
    token_budget: float,
    rng: np.random.Generator,
    k_max: int = 0,
    max_units: int = MAX_UNITS,
) -> np.ndarray:
    """Stage 2: continuation counts K per prefix of one prompt within its token share.

    Args:
        r: reward of the rollout each prefix belongs to, shape (P,).
        p: predicted success probability at each prefix, shape (P,).
        cost: predicted generated tokens of one continuation from each prefix, shape (P,).
        token_budget: the prompt's share S_i.
        rng: breaks ties.
        k_max: per-prefix cap on K (0: only the module's K_CAP).
        max_units: DP resolution.

    Returns:
        K, shape (P,), int64, with sum K c <= token_budget.
    """
    num = len(r)
    cost = np.maximum(np.asarray(cost, float), 1.0)
    if num == 0 or token_budget <= 0:
        return np.zeros(num, dtype=np.int64)
    cap = K_CAP if k_max <= 0 else min(k_max, K_CAP)
    cap = max(0, min(cap, int(token_budget // cost.min())))
    ks = np.arange(cap + 1)
    q = 1.0 - flip_probability(r, p)
    values = v_pref(q[:, None], ks[None, :])
    costs = ks[None, :] * cost[:, None]
    return solve_choices(values, costs, token_budget, rng, max_units)


def costed_prefix_objective(r: np.ndarray, p: np.ndarray, k: np.ndarray) -> float:
    """sum V_pref(K) (the same objective as algos/prefixes.py; costs only constrain it)."""
    return float(v_pref(1.0 - flip_probability(r, p), np.asarray(k)).sum())
