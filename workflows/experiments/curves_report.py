"""A learning-curve study's report (issue 29), rebuilt from MLflow by ``tracerl study --report-only``: per cell its
evaluation points (``curve.jsonl``: the MLflow artifact ``curve/curve.jsonl`` the grid keeps, else the file in the
run's storage), per testbed the statistics of workflows/experiments/curves.py against grpo and ScaleRL's fit
(workflows/experiments/sigmoid.py), the hypotheses' verdicts, as the typed results of workflows/experiments/curve_results.py.
workflows/experiments/curves_doc.py writes curves.md, curves.json and the plots to ``out_dir`` and onto the study's parent
run.

Decision rule (stated in conf/study/curves.yaml before the grid runs): an allocator is more compute-efficient than
grpo on a testbed when the 95 % interval of its tokens-to-target ratio lies below 1 ("win"), less when it lies above
1 ("loss"), else neither ("tie"). The target is the testbed's start accuracy plus 90 % of grpo's gain at the end of
its budget, on the curve's tasks; the start is the testbed's baseline (its starting checkpoint, evaluated once).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.workflows.experiments.curve_cells import CURVE_ARTIFACT_DIR
from tracerl.workflows.experiments.curve_results import (
    AllocatorStats,
    CurveVerdict,
    Fit,
    Headroom,
    Hypothesis,
    HypothesisCase,
    TestbedStats,
)
from tracerl.workflows.experiments.curves import (
    Comparison,
    EvalCurves,
    compare_curves,
    interp_matrix,
    target_accuracy,
)
from tracerl.workflows.experiments.sigmoid import fit_sigmoid
from tracerl.workflows.study.baseline import finished_baselines
from tracerl.workflows.study.bootstrap import Interval, paired_difference
from tracerl.workflows.study.cell_runs import newest_finished, run_outcomes
from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.tracking import frame
from tracerl.workflows.train.budget import CURVE_FILE, curve_arrays, read_curve

BUDGET_TOLERANCE = 0.05
"""A cell whose realised generated tokens are more than this fraction off its budget is flagged."""
TARGET_FRAC = 0.9
"""The target: the start accuracy plus this fraction of grpo's gain at the end of its budget."""
POOR_FIT_R2 = 0.8
"""A converged sigmoid fit with R^2 below this is reported as a poor fit."""
BASELINE = "grpo"
CEILING = ("trace", "trace_mc")
"""The headroom pair: trace against its Monte-Carlo ceiling (the first allocator whose name starts with trace_mc,
e.g. trace_mc_k2)."""


# -- cells ---------------------------------------------------------------------------------------------------


def read_cell_curve(client: Any, run: Any) -> tuple[list[dict[str, Any]], str]:
    """A cell's curve points and where they came from: its run's artifact ``curve/curve.jsonl`` (kept by the grid,
    survives a moved ``runs_dir``), else ``<storage>/curve.jsonl`` (the run's ``tracerl.storage`` tag).

    Raises:
        ValueError: neither holds a curve (says where it looked).
    """
    rid = str(run["run_id"])
    try:
        names = {f.path for f in client.list_artifacts(rid, CURVE_ARTIFACT_DIR)}
    except Exception:  # noqa: BLE001 - MLflow raises its own types per artifact store; none listed: try the storage
        names = set()
    if f"{CURVE_ARTIFACT_DIR}/{CURVE_FILE}" in names:
        with tempfile.TemporaryDirectory() as tmp:
            return read_curve(
                client.download_artifacts(rid, f"{CURVE_ARTIFACT_DIR}/{CURVE_FILE}", tmp)
            ), "mlflow"
    storage = frame.value(run, "tags.tracerl.storage")
    if storage and (Path(storage) / CURVE_FILE).is_file():
        return read_curve(storage), "storage"
    raise ValueError(
        f"run {rid}: no learning curve (no artifact {CURVE_ARTIFACT_DIR}/{CURVE_FILE}, none in storage {storage}); "
        "was the cell run with a token schedule (testbeds.*.eval_every_tokens)?"
    )


def _eval_timeouts(evals: Sequence[Mapping[str, Any]]) -> int | None:
    """Tool calls and gradings past their wall-clock limit over a cell's evaluations (None: its points predate
    their recording): a point where one fired may not reproduce on a re-run."""
    seen = [e for e in evals if "tool_timeouts" in e or "grade_timeouts" in e]
    if not seen:
        return None
    return int(sum(e.get("tool_timeouts", 0.0) + e.get("grade_timeouts", 0.0) for e in seen))


def cell_record(
    key: tuple[str, str, str, int],
    run_id: str,
    points: Sequence[Mapping[str, Any]],
    budget: float,
    start: Mapping[str, float] | None,
    source: str = "",
) -> dict[str, Any]:
    """One cell: its points (with the testbed's baseline prepended at zero compute, on the curve's tasks, unless
    the run evaluated its own start), realised budget against ``budget`` and the final full evaluation."""
    tb, mode, alloc, seed = key
    pts = [dict(p) for p in points]
    tasks = list(pts[0]["tasks"]) if pts else []
    if pts and float(pts[0]["generated_tokens"]) > 0 and start and all(t in start for t in tasks):
        zero = {"generated_tokens": 0.0, "cpu_s": 0.0, "wall_s": 0.0, "leaves": 0.0, "updates": 0}
        outcomes = {t: float(start[t]) for t in tasks}
        acc = sum(outcomes.values()) / len(tasks) if tasks else math.nan
        pts.insert(
            0, {**zero, "accuracy": acc, "tasks": tasks, "outcomes": outcomes, "full": False, "start": True}
        )
    last = pts[-1] if pts else {}
    realised = float(last.get("generated_tokens", 0.0))
    off = realised / budget - 1.0 if budget else math.nan
    final = last.get("outcomes", {}) if last.get("full") else {}
    evals = [p.get("eval", {}) for p in pts]
    return {
        "testbed": tb,
        "budget_mode": mode,
        "allocator": alloc,
        "seed": seed,
        "run_id": run_id,
        "source": source,
        "budget_tokens": budget,
        "realised_tokens": realised,
        "budget_off": off,
        "budget_flag": not (abs(off) <= BUDGET_TOLERANCE),
        "updates": int(last.get("updates", 0)),
        "cpu_s": float(last.get("cpu_s", 0.0)),
        "wall_s": float(last.get("wall_s", 0.0)),
        "eval_tokens": float(sum(e.get("generated_tokens", 0.0) for e in evals)),
        "eval_wall_s": float(sum(e.get("wall_s", 0.0) for e in evals)),
        "eval_timeouts": _eval_timeouts(evals),
        "final_accuracy": float(np.mean(list(final.values()))) if final else math.nan,
        "final_outcomes": {str(k): float(v) for k, v in final.items()},
        "tasks": tasks,
        "points": pts,
    }


def collect_cells(cfg: StudyConfig, client: Any, exp_id: str, parent: str) -> list[dict[str, Any]]:
    """Every finished cell of the study with its curve; a cell without one is recorded with an ``error``."""
    starts = {tb: run_outcomes(client, rid) for tb, rid in finished_baselines(client, exp_id, parent).items()}
    out = []
    for key, run in newest_finished(client, exp_id, parent):
        raw = frame.param(run, "stop.tokens")
        budget = raw if raw is not None else float(cfg.testbeds[key[0]]["stop_tokens"])
        rid = str(run["run_id"])
        try:
            points, source = read_cell_curve(client, run)
            rec = cell_record(key, rid, points, budget, starts.get(key[0]), source)
        except ValueError as e:
            rec = {**cell_record(key, rid, [], budget, None), "error": str(e)}
        rec["git_sha"] = frame.value(run, "tags.tracerl.git_sha", "unknown")  # archived cells keep their own
        out.append(rec)
    return out


# -- statistics per testbed ----------------------------------------------------------------------------------


def eval_curves(cells: Sequence[Mapping[str, Any]], x: str = "generated_tokens") -> EvalCurves:
    """The cells (seeds) as ``EvalCurves`` on the union of their points: each seed's per-task outcomes interpolated
    there (exact: the curve is linear between its points and held beyond them)."""
    rows = []
    for c in cells:
        _, correct = curve_arrays(c["points"])
        rows.append((np.array([float(p[x]) for p in c["points"]]), correct))
    grid = np.unique(np.concatenate([r[0] for r in rows]))
    return EvalCurves(
        np.tile(grid, (len(rows), 1)),
        np.stack([interp_matrix(grid, xs) @ correct for xs, correct in rows]),
    )


def rule(ratio: Interval) -> str:
    """The decision rule on a tokens-to-target ratio's interval: 'win' (below 1), 'loss' (above 1), else 'tie';
    'n/a' when undefined (neither reached the target in some replicate's mean, so no bound)."""
    if math.isnan(ratio.low) or math.isnan(ratio.high):
        return "n/a"
    return "win" if ratio.high < 1 else "loss" if ratio.low > 1 else "tie"


def _comparison(c: Comparison) -> CurveVerdict:
    return CurveVerdict(
        ratio=c.ratio,
        auc_difference=c.auc_difference,
        tokens_to_target=c.allocator.tokens_to_target,
        vs_tokens_to_target=c.baseline.tokens_to_target,
        auc=c.allocator.auc,
        reached=c.allocator.reached,
        paired=c.paired,
        verdict=rule(c.ratio),
    )


def _pair(
    mine: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The two allocators' cells on their common seeds, in seed order."""
    common = sorted({c["seed"] for c in mine} & {c["seed"] for c in base})
    by = lambda cs: {c["seed"]: c for c in cs}  # noqa: E731 - two lookups
    return [by(mine)[s] for s in common], [by(base)[s] for s in common]


def compare(
    mine: Sequence[Mapping[str, Any]],
    base: Sequence[Mapping[str, Any]],
    target: float,
    budget: float | None,
    samples: int,
    x: str = "generated_tokens",
) -> CurveVerdict | None:
    """``compare_curves`` of two allocators' cells (paired on common seeds when their task counts match)."""
    a, b = _pair(mine, base)
    if not a:
        return None
    ca, cb = eval_curves(a, x), eval_curves(b, x)
    paired = ca.tasks == cb.tasks
    return _comparison(compare_curves(ca, cb, target=target, budget=budget, samples=samples, paired=paired))


def final_difference(
    mine: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], samples: int
) -> Interval | None:
    """Final full-set accuracy of ``mine`` minus ``base``, paired by seed and task (hierarchical bootstrap)."""
    a, b = _pair(mine, base)
    va, vb = {}, {}
    for ca, cb in zip(a, b):
        tasks = sorted(set(ca["final_outcomes"]) & set(cb["final_outcomes"]))
        if tasks:
            va[ca["seed"]] = np.array([ca["final_outcomes"][t] for t in tasks])
            vb[cb["seed"]] = np.array([cb["final_outcomes"][t] for t in tasks])
    return paired_difference(va, vb, samples) if va else None


def _fit(cs: Sequence[Mapping[str, Any]], start: float) -> Fit:
    curves = eval_curves(cs)
    f = fit_sigmoid(curves.grid(), curves.mean_curve(), start=start)
    flat = f.converged and abs(f.asymptote - f.start) < 1e-3
    poor = not f.converged or not f.identified or f.r2 < POOR_FIT_R2 or flat
    why = (
        f.message
        if not f.converged
        else "no gain: the asymptote is the start, C_mid and B are undefined"
        if flat
        else f"R^2 {f.r2:.2f} < {POOR_FIT_R2}"
        if f.r2 < POOR_FIT_R2
        else "a parameter on its bound or C_mid outside the data: the asymptote is extrapolated"
        if not f.identified
        else ""
    )
    return Fit(f.asymptote, f.midpoint, f.exponent, f.r2, f.rmse, f.identified, poor, why)


def per_testbed_stats(
    cells: Sequence[Mapping[str, Any]], budget: float, samples: int, frac: float = TARGET_FRAC
) -> TestbedStats:
    """One testbed's statistics: start, target, per allocator its curve statistics against grpo (in tokens and
    in CPU seconds), final accuracy, fit; and the trace vs trace_mc headroom."""
    usable = [c for c in cells if c["points"] and "error" not in c]
    by: dict[str, list[Mapping[str, Any]]] = {}
    for c in usable:
        by.setdefault(c["allocator"], []).append(c)
    base = by.get(BASELINE)
    if not base:
        return TestbedStats(budget, note=f"no finished {BASELINE} cell: no target")
    gm = eval_curves(base).mean_curve()
    start, end = float(gm[0]), float(gm[-1])
    target = target_accuracy(start, end, frac)
    allocators = {}
    for alloc, cs in sorted(by.items(), key=lambda kv: (kv[0] != BASELINE, kv[0])):
        finals = np.array([c["final_accuracy"] for c in cs], float)
        measured = bool(np.isfinite(finals).any())
        tokens = compare(cs, base, target, budget, samples)
        cpu = compare(cs, base, target, None, samples, x="cpu_s")
        if end <= start:  # grpo gained nothing: no target to reach sooner
            tokens, cpu = (
                None if v is None else dataclasses.replace(v, verdict="n/a") for v in (tokens, cpu)
            )
        allocators[alloc] = AllocatorStats(
            seeds=len(cs),
            final_accuracy=float(np.nanmean(finals)) if measured else None,
            final_std=float(np.nanstd(finals)) if measured else None,
            tokens=tokens,
            cpu_s=cpu,
            final_difference=None if alloc == BASELINE else final_difference(cs, base, samples),
            fit=_fit(cs, start),
            mean_cpu_s=float(np.mean([c["cpu_s"] for c in cs])),
        )
    ceiling = next((a for a in sorted(by) if a.startswith(CEILING[1])), None)
    headroom = None
    if ceiling and CEILING[0] in by:
        mc, tr = by[ceiling], by[CEILING[0]]
        headroom = Headroom(
            tokens=compare(mc, tr, target, budget, samples),
            cpu_s=compare(mc, tr, target, None, samples, x="cpu_s"),
            final_difference=final_difference(mc, tr, samples),
        )
    note = (
        f"{BASELINE} did not improve on the start ({start:.3f} -> {end:.3f}): no target to reach"
        if end <= start
        else None
    )
    return TestbedStats(
        budget,
        allocators,
        headroom,
        start=start,
        grpo_final=end,
        target=target,
        ceiling=ceiling if headroom else None,
        note=note,
    )


def hypothesis_verdicts(
    cfg: StudyConfig, stats: Mapping[str, TestbedStats], cells: Sequence[Mapping[str, Any]], samples: int
) -> list[Hypothesis]:
    """Each hypothesis of the config, checked testbed by testbed with the decision rule: 'held', 'failed',
    'partly held' or 'not measured'."""
    out = []
    for h in cfg.hypotheses:
        cases = []
        for tb in h["testbeds"]:
            st = stats.get(tb)
            if st is None or st.target is None:
                continue
            if h["vs"] == BASELINE:
                entry = st.allocators.get(h["allocator"])
                got = entry.tokens if entry else None
            else:
                mine = [
                    c
                    for c in cells
                    if c["testbed"] == tb and c["allocator"] == h["allocator"] and c["points"]
                ]
                base = [c for c in cells if c["testbed"] == tb and c["allocator"] == h["vs"] and c["points"]]
                got = compare(mine, base, st.target, st.budget_tokens, samples) if mine and base else None
            if got is not None:
                cases.append(HypothesisCase(tb, got.verdict, got.ratio))
        hits = [c.verdict == h["expect"] for c in cases if c.verdict != "n/a"]
        state = (
            "not measured"
            if not cases
            else "not decided"
            if not hits
            else "held"
            if all(hits)
            else "failed"
            if not any(hits)
            else "partly held"
        )
        out.append(Hypothesis(h["claim"], h["allocator"], h["vs"], h["expect"], state, cases))
    return out
