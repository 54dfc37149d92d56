"""Calibration of a predictor's scores against what the trees then showed.

For a scored anchor with prediction p, recursive target V^ and leaves r_1..r_n below it:

* ``mse``: sum n (p - V^)^2 / sum n (leaf-count weighted squared error against the target);
* ``brier``: mean over (anchor, leaf) pairs of (p - r)^2;
* ``auc``: ROC AUC of p for the leaf outcomes r over (anchor, leaf) pairs (ties count one half);
* ``ece``: expected calibration error over (anchor, leaf) pairs, 10 equal-width bins of p;
* ``mse_true`` (simulator only): mean (p - true V)^2 against the true success probability.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

from tracerl.engine.step import StepOutcome


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC via the Mann-Whitney statistic; NaN when only one class is present."""
    labels = np.asarray(labels) > 0.5
    npos, nneg = int(labels.sum()), int((~labels).sum())
    if npos == 0 or nneg == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def ece(scores: np.ndarray, labels: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error with equal-width bins."""
    if len(scores) == 0:
        return float("nan")
    idx = np.minimum((np.asarray(scores) * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.sum() * abs(scores[m].mean() - labels[m].mean())
    return float(total / len(scores))


def calibration_metrics(
    preds: Sequence[float],
    targets: Sequence[float],
    leaf_rewards: Sequence[Sequence[float]],
    true_values: Sequence[float | None] | None = None,
) -> dict[str, float]:
    """Calibration of ``preds`` (one per anchor) against targets V^ and the leaves below each anchor."""
    p = np.asarray(preds, float)
    if p.size == 0:
        return {}
    v = np.asarray(targets, float)
    n = np.array([len(r) for r in leaf_rewards], float)
    pair_p = np.repeat(p, n.astype(int))
    pair_r = np.concatenate([np.asarray(r, float) for r in leaf_rewards]) if n.sum() else np.zeros(0)
    out = {
        "mse": float((n * (p - v) ** 2).sum() / max(n.sum(), 1)),
        "brier": float(((pair_p - pair_r) ** 2).mean()) if pair_r.size else float("nan"),
        "auc": auc(pair_p, pair_r),
        "ece": ece(pair_p, pair_r),
        "count": float(p.size),
    }
    if true_values is not None and all(t is not None for t in true_values):
        out["mse_true"] = float(((p - np.asarray(true_values, float)) ** 2).mean())
    return out


CalibrationData = dict[str, tuple[list[float], list[float], list[list[float]], list[float | None]]]
"""group ("roots", "prefixes", "depth_1", ...) -> (predictions, targets V^, leaf rewards below, true values)."""


def collect_calibration(outcome: StepOutcome, acc: CalibrationData | None = None) -> CalibrationData:
    """Add a step's root and prefix scores, with what their trees then showed, to ``acc``.

    Roots are the active prompts' scores (inactive prompts have no outcome); prefixes are every
    scored bare prefix, also grouped by depth.
    """
    acc = {} if acc is None else acc

    def add(key: str, p: float, v: float, leaves: list[float], true: float | None) -> None:
        g = acc.setdefault(key, ([], [], [], []))
        g[0].append(p)
        g[1].append(v)
        g[2].append(leaves)
        g[3].append(true)

    index = {id(p): i for i, p in enumerate(outcome.pool)}
    by_tree: dict[int, list[tuple[int, float]]] = {}
    for ti, node_id, p in outcome.prefix_scores:
        by_tree.setdefault(ti, []).append((node_id, p))
    for ti, tree in enumerate(outcome.trees):
        v = tree.targets()
        leaves: list[list[float]] = [[] for _ in tree.nodes]
        for node in reversed(tree.nodes):
            if node.is_leaf:
                leaves[node.node_id].append(float(node.reward or 0.0))
            if node.parent is not None:
                leaves[node.parent].extend(leaves[node.node_id])
        add(
            "roots",
            float(outcome.root_scores[index[id(tree.prompt)]]),
            float(v[0]),
            leaves[0],
            tree.prompt.true_value,
        )
        for node_id, p in by_tree.get(ti, []):
            node = tree.nodes[node_id]
            add("prefixes", p, float(v[node_id]), leaves[node_id], node.true_value)
            add(f"depth_{node.depth}", p, float(v[node_id]), leaves[node_id], node.true_value)
    return acc


def summarize_calibration(acc: CalibrationData) -> dict[str, dict[str, float]]:
    """Calibration metrics per group of :func:`collect_calibration` data."""
    return {k: calibration_metrics(*g) for k, g in sorted(acc.items())}


def mean_calibration(cals: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Average per-run calibration summaries group by group, metric by metric (NaNs ignored)."""
    out: dict[str, dict[str, float]] = {}
    for group in sorted({g for c in cals for g in c}):
        keys = sorted({k for c in cals for k in c.get(group, {})})
        vals = {k: [c[group][k] for c in cals if group in c and k in c[group]] for k in keys}
        out[group] = {
            k: float(np.nanmean(v)) if not all(np.isnan(v)) else float("nan") for k, v in vals.items()
        }
    return out
