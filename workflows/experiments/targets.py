"""``tracerl bench targets``: bias of the predictor's fit targets against the true V, on the simulator.

Runs ``allocators`` (default ``oracle_trace``: allocation by the true success probabilities) for
``steps`` x ``seeds`` on the calibrated simulator, leaving out the first ``warmup_fraction`` of the steps,
and records, for every tree's root and every prefix that received continuations, the true V at the node
and both fit targets with the weights the fit gives them:

* ``recursive``: V^, the mean of the leaves below, weight n_y (leaf count);
* ``debiased``: the fit's debiased example (platform/tracerl/tree.py derives why it is unbiased and V^
  is not): at a root D, the mean of its bare rollouts' rewards, weight = their number; at an expanded
  prefix the continuations' mean reward, weight K (its other example, the original path's reward with
  weight 1, exists at every prefix whether expanded or not).

Per bin of the true V (width 1 / ``BINS``) the bias is sum w (target - V) / sum w, with a standard error
sqrt(sum w^2 (target - V - bias)^2) / sum w (nodes taken as independent). A bin is judged when it holds at
least ``min_count`` trees (roots) or expanded prefixes; the target is |bias| <= ``TOLERANCE`` in every
judged bin. Prints a table and writes JSON to ``out_dir/results.json`` (and ``json_path``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tracerl.engine.step import StepOutcome
from tracerl.tree import RolloutTree
from tracerl.workflows.bench.config import BenchAllocationConfig
from tracerl.workflows.bench.sim_runs import run_allocator
from tracerl.workflows.experiments.sim_summary import sim_shape, sim_summary, write_summary
from tracerl.workflows.ops.results import results_dir

BINS = 10
TOLERANCE = 0.02
MIN_COUNT = 400
KINDS = ("recursive", "debiased")
LEVELS = ("roots", "prefixes")
# Columns of a record: true V, recursive target, its weight, debiased target, its weight.
V, OLD, N, DEB, W = range(5)


def target_records(trees: Sequence[RolloutTree]) -> dict[str, list[tuple[float, float, float, float, float]]]:
    """(true V, V^, n_y, debiased value, weight) of every root and every prefix that received continuations."""
    out: dict[str, list[tuple[float, float, float, float, float]]] = {level: [] for level in LEVELS}
    for tree in trees:
        old, n = tree.targets(), tree.leaf_counts()
        deb, w = tree.debiased_targets()
        k = tree.continuation_counts()
        if tree.prompt.true_value is None:
            raise ValueError(
                "bench targets needs true success probabilities, which only the simulator provides"
            )
        out["roots"].append((float(tree.prompt.true_value), old[0], float(n[0]), deb[0], w[0]))
        rewards = tree.path_rewards()
        for node in tree.nodes[1:]:
            if k[node.node_id] > 0 and node.true_value is not None:
                i = node.node_id
                conts = [
                    rewards[p] for p in (tree.nodes[c].path_id for c in node.children) if p != node.path_id
                ]
                out["prefixes"].append(
                    (float(node.true_value), old[i], float(n[i]), float(np.mean(conts)), float(len(conts)))
                )
    return out


def bias_by_bin(records: np.ndarray, min_count: int = MIN_COUNT) -> list[dict[str, Any]]:
    """Per V bin: count, whether it is judged, and per target kind the weighted bias and its standard error."""
    records = np.asarray(records, dtype=float).reshape(-1, 5)
    idx = np.minimum((records[:, V] * BINS).astype(int), BINS - 1)
    rows = []
    for b in range(BINS):
        sel = records[idx == b]
        row: dict[str, Any] = {
            "v_lo": b / BINS,
            "v_hi": (b + 1) / BINS,
            "count": len(sel),
            "judged": len(sel) >= min_count,
        }
        for kind, (t, wcol) in zip(KINDS, ((OLD, N), (DEB, W))):
            if not len(sel):
                row[kind] = {"bias": None, "se": None}
                continue
            err, w = sel[:, t] - sel[:, V], sel[:, wcol]
            bias = float(np.sum(w * err) / np.sum(w))
            se = float(np.sqrt(np.sum(w**2 * (err - bias) ** 2)) / np.sum(w))
            row[kind] = {"bias": bias, "se": se}
        rows.append(row)
    return rows


def _verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [r for r in rows if r["judged"]]
    out: dict[str, Any] = {"judged_bins": len(judged)}
    for kind in KINDS:
        worst = max((abs(r[kind]["bias"]) for r in judged), default=float("nan"))
        out[kind] = {"max_abs_bias": worst, "within_tolerance": bool(judged) and worst <= TOLERANCE}
    return out


def _collect(
    cfg: BenchAllocationConfig, name: str, warm: int, progress: Callable[[str], None]
) -> dict[str, list[Any]]:
    """Records of every seed's post-warm-up steps under allocator ``name``."""
    recs: dict[str, list[Any]] = {level: [] for level in LEVELS}
    t0 = time.perf_counter()

    def collect(step: int, out: StepOutcome) -> None:
        if step >= warm:
            for level, rows in target_records(out.trees).items():
                recs[level] += rows

    for k in range(cfg.seeds):
        run_allocator(cfg, name, cfg.seed + k, on_step=collect)
        progress(
            f"{name} seed {cfg.seed + k}: {len(recs['roots'])} trees, {len(recs['prefixes'])} expanded "
            f"prefixes so far ({time.perf_counter() - t0:.0f} s)"
        )
    return recs


def run_targets(
    cfg: BenchAllocationConfig, progress: Callable[[str], None] = lambda s: None, min_count: int = MIN_COUNT
) -> dict[str, Any]:
    """Measure; returns the JSON summary (also written to ``out_dir/results.json`` and ``json_path``)."""
    out_dir = results_dir(cfg.out_dir, cfg)
    warm = int(cfg.steps * cfg.warmup_fraction)
    summary = {"tolerance": TOLERANCE, "min_count": min_count, **sim_summary(cfg, warm)}
    for name in cfg.allocators:
        recs = _collect(cfg, name, warm, progress)
        summary["allocators"][name] = {}
        for level in LEVELS:
            rows = bias_by_bin(np.array(recs[level]), min_count)
            summary["allocators"][name][level] = {"bins": rows, **_verdict(rows)}
    write_summary(out_dir, cfg.json_path, summary, format_targets_table(summary))
    return summary


def format_targets_table(summary: dict[str, Any]) -> str:
    """Bias per V bin (weighted as the fit weights), recursive vs debiased, with standard errors."""
    lines = [
        f"fit-target bias vs the true V (weighted as the fit weights them); {sim_shape(summary)}; judged: bins "
        f"with >= {summary['min_count']} nodes, target |bias| <= {summary['tolerance']}"
    ]
    for name, levels in summary["allocators"].items():
        for level, s in levels.items():
            lines += [
                "",
                f"{name}, {level}:",
                f"  {'V bin':<10} {'count':>7}  {'recursive':>16}  {'debiased':>16}",
            ]
            for r in s["bins"]:
                cells = []
                for kind in KINDS:
                    x = r[kind]
                    cells.append(f"{x['bias']:+.3f} ±{x['se']:.3f}" if x["bias"] is not None else "-")
                mark = "" if r["judged"] else "  (not judged)"
                lines.append(
                    f"  {r['v_lo']:.1f}-{r['v_hi']:.1f}  {r['count']:>7d}  {cells[0]:>16}  {cells[1]:>16}{mark}"
                )
            verdict = ", ".join(
                f"{k} max |bias| {s[k]['max_abs_bias']:.3f} "
                f"({'within' if s[k]['within_tolerance'] else 'OUTSIDE'} ±{summary['tolerance']})"
                for k in KINDS
            )
            lines.append(f"  over {s['judged_bins']} judged bins: {verdict}")
    return "\n".join(lines)
