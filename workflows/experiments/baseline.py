"""``tracerl bench baseline``: bias of the advantage baseline against the true V, on the simulator.

``tree_subgroup`` (docs/method.md, "Tree-aware advantages") subtracts a node value from every leaf's reward: at
depth 0 the prompt's value, at depth d >= 1 the value of the leaf's ancestor at depth d where two or more leaves
share it (a subgroup). Two choices of that value (``loss.debiased_values``):

* ``leaf_mean`` (false; 'auto', the default, for flat allocators): V^, the mean reward of the leaves below the node.
  At the root that averages the continuations too, whose prefixes the allocator chose after seeing the bare
  rollouts' rewards.
* ``debiased`` (true; 'auto' for tree allocators, as this bench decided, docs/results/baseline_bias.md): D, the mean
  over the node's children of each child's path reward (platform/tracerl/tree.py); at the root, the mean of the bare
  rollouts.

Both are read off the same trees, so one run per (allocator, seed) measures the pair. For every post-warm-up tree
(level ``root``) and every subgroup node (level ``subgroups``: a non-leaf node at depth >= 1 with two or more
leaves below, as the estimator groups them) the error is value - V, V the simulator's true success probability at
the node. Per seed: the mean error (the bias) and the root mean squared error, over all nodes and per bin of the
true V (width 1 / ``BINS``); over seeds: the mean and a 95 % t interval (seeds as the independent units). Over the
bins (``over_bins``): the mean |bias| and how many bins' intervals exclude 0, since a pull towards 1/2 cancels in
the all-nodes row. Prints a table and writes JSON to ``out_dir/results.json`` (and ``json_path``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tracerl.engine.step import StepOutcome
from tracerl.tree import RolloutTree
from tracerl.workflows.bench.config import BenchAllocationConfig
from tracerl.workflows.bench.sim_runs import run_allocator
from tracerl.workflows.experiments.sim_summary import sim_shape, sim_summary, write_summary
from tracerl.workflows.ops.results import ci95, results_dir

BINS = 5
KINDS = ("leaf_mean", "debiased")
LEVELS = ("root", "subgroups")
Record = tuple[float, float, float]  # true V, leaf mean V^, debiased D


def baseline_records(trees: Sequence[RolloutTree]) -> dict[str, list[Record]]:
    """(true V, V^, D) at every tree's root and at every subgroup node (non-leaf, depth >= 1, >= 2 leaves below)."""
    out: dict[str, list[Record]] = {level: [] for level in LEVELS}
    for tree in trees:
        if tree.num_leaves == 0:
            continue
        if tree.prompt.true_value is None:
            raise ValueError(
                "bench baseline needs true success probabilities, which only the simulator provides"
            )
        vhat, d, n = tree.targets(), tree.debiased_targets()[0], tree.leaf_counts()
        out["root"].append((float(tree.prompt.true_value), float(vhat[0]), float(d[0])))
        for node in tree.nodes[1:]:
            if node.is_leaf or n[node.node_id] < 2:
                continue
            if node.true_value is None:
                raise ValueError(f"node {node.node_id} of prompt {tree.prompt.prompt_id!r} has no true value")
            i = node.node_id
            out["subgroups"].append((float(node.true_value), float(vhat[i]), float(d[i])))
    return out


def seed_errors(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """One seed's records -> per group ("all", then each V bin): count, and per kind the bias and RMSE (None when
    the group is empty)."""
    rec = np.asarray(records, dtype=float).reshape(-1, 3)
    idx = np.minimum((rec[:, 0] * BINS).astype(int), BINS - 1)
    groups = {"all": np.ones(len(rec), dtype=bool)}
    groups |= {f"{b / BINS:.1f}-{(b + 1) / BINS:.1f}": idx == b for b in range(BINS)}
    out: dict[str, dict[str, Any]] = {}
    for name, sel in groups.items():
        row: dict[str, Any] = {"count": int(sel.sum())}
        for col, kind in enumerate(KINDS, start=1):
            err = rec[sel, col] - rec[sel, 0]
            row[kind] = (
                {"bias": float(err.mean()), "rmse": float(np.sqrt(np.mean(err**2)))}
                if err.size
                else {"bias": None, "rmse": None}
            )
        out[name] = row
    return out


def over_seeds(per_seed: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per group: total count, the seeds with data, and per kind the mean bias over seeds with its 95 % interval,
    the mean RMSE, and the paired difference debiased - leaf_mean of the bias with its interval."""
    out: dict[str, dict[str, Any]] = {}
    for name in per_seed[0]:
        rows = [s[name] for s in per_seed if s[name]["count"] > 0]
        row: dict[str, Any] = {"count": sum(r["count"] for r in rows), "seeds": len(rows)}
        for kind in KINDS:
            bias = [r[kind]["bias"] for r in rows]
            row[kind] = {
                "bias": float(np.mean(bias)) if bias else None,
                "bias_ci95": ci95(bias),
                "rmse": float(np.mean([r[kind]["rmse"] for r in rows])) if rows else None,
            }
        diff = [r["debiased"]["bias"] - r["leaf_mean"]["bias"] for r in rows]
        row["difference"] = {"bias": float(np.mean(diff)) if diff else None, "bias_ci95": ci95(diff)}
        out[name] = row
    return out


def over_bins(groups: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind, over the V bins that hold nodes: the mean |bias| and how many bins' 95 % intervals exclude 0 (the
    "all" row's bias can be near 0 while every bin is biased: a pull towards 1/2 cancels over V)."""
    bins = [r for g, r in groups.items() if g != "all" and r["count"] > 0]
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        excl = [abs(r[kind]["bias"]) > r[kind]["bias_ci95"] for r in bins if r[kind]["bias_ci95"] is not None]
        out[kind] = {
            "mean_abs_bias": float(np.mean([abs(r[kind]["bias"]) for r in bins])) if bins else None,
            "bins_excluding_zero": int(sum(excl)),
            "bins": len(bins),
        }
    return out


def _collect(
    cfg: BenchAllocationConfig, name: str, warm: int, progress: Callable[[str], None]
) -> list[dict[str, list[Record]]]:
    """Per seed, the records of its post-warm-up steps under allocator ``name``."""
    per_seed = []
    t0 = time.perf_counter()
    for k in range(cfg.seeds):
        recs: dict[str, list[Record]] = {level: [] for level in LEVELS}

        def collect(step: int, out: StepOutcome, recs: dict[str, list[Record]] = recs) -> None:
            if step >= warm:
                for level, rows in baseline_records(out.trees).items():
                    recs[level] += rows

        threads = torch.get_num_threads()
        torch.set_num_threads(
            1
        )  # the predictor's ops are tiny; more threads only contend (as bench allocation)
        try:
            run_allocator(cfg, name, cfg.seed + k, on_step=collect)
        finally:
            torch.set_num_threads(threads)
        per_seed.append(recs)
        progress(
            f"{name} seed {cfg.seed + k}: {len(recs['root'])} trees, {len(recs['subgroups'])} subgroup nodes "
            f"({time.perf_counter() - t0:.0f} s)"
        )
    return per_seed


def run_baseline(
    cfg: BenchAllocationConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Measure; returns the JSON summary (also written to ``out_dir/results.json`` and ``json_path``)."""
    out_dir = results_dir(cfg.out_dir, cfg)
    warm = int(cfg.steps * cfg.warmup_fraction)
    summary = {**sim_summary(cfg, warm), "first_seed": cfg.seed}
    for name in cfg.allocators:
        per_seed = _collect(cfg, name, warm, progress)
        summary["allocators"][name] = {}
        for level in LEVELS:
            groups = over_seeds([seed_errors(s[level]) for s in per_seed])
            summary["allocators"][name][level] = {"groups": groups, "over_bins": over_bins(groups)}
    write_summary(out_dir, cfg.json_path, summary, format_baseline_table(summary))
    return summary


def _cell(x: dict[str, Any]) -> str:
    if x["bias"] is None:
        return "-"
    ci = f" ±{x['bias_ci95']:.4f}" if x.get("bias_ci95") is not None else ""
    return f"{x['bias']:+.4f}{ci}"


def format_baseline_table(summary: dict[str, Any]) -> str:
    """Per allocator and level, per V bin: bias ± 95 % interval over seeds and RMSE, leaf mean vs debiased."""
    lines = [
        f"advantage-baseline error (value - true V) of tree_subgroup's node values; {sim_shape(summary)}; bias = "
        "mean over nodes, ± 95 % t interval over seeds"
    ]
    head = (
        f"  {'true V':<8} {'nodes':>8}  {'leaf mean bias':>18} {'rmse':>6}  {'debiased bias':>18} {'rmse':>6}"
    )
    for name, levels in summary["allocators"].items():
        for level, s in levels.items():
            if s["groups"]["all"]["count"] == 0:
                lines += ["", f"{name}, {level}: none"]
                continue
            lines += ["", f"{name}, {level}:", head]
            for g, r in s["groups"].items():
                if r["count"] == 0:
                    lines.append(f"  {g:<8} {0:>8}")
                    continue
                cells = []
                for kind in KINDS:
                    x = r[kind]
                    cells += [_cell(x), f"{x['rmse']:.3f}"]
                lines.append(
                    f"  {g:<8} {r['count']:>8d}  {cells[0]:>18} {cells[1]:>6}  {cells[2]:>18} {cells[3]:>6}"
                )
            lm, db = s["over_bins"]["leaf_mean"], s["over_bins"]["debiased"]
            lines.append(
                f"  over the V bins, mean |bias| (bins whose interval excludes 0): leaf mean "
                f"{lm['mean_abs_bias']:.4f} ({lm['bins_excluding_zero']}/{lm['bins']}), "
                f"debiased {db['mean_abs_bias']:.4f} ({db['bins_excluding_zero']}/{db['bins']})"
            )
    return "\n".join(lines)
