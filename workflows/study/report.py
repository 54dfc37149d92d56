"""The study's report, rebuilt from MLflow: study.md (per testbed x budget a table of allocators), study.json
(the schema of issue 15), PNG plots, and for every allocator against grpo a paired difference of held-out accuracy
with a 95 % interval from a hierarchical bootstrap (seeds, then held-out tasks within seeds). Decision rule: A beats
grpo on a testbed and budget when the interval excludes 0."""

from __future__ import annotations

import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl import metrics as M
from tracerl.experiment_config import StudyConfig

FIELDS = (
    "testbed",
    "budget",
    "allocator",
    "seed",
    "run_id",
    "steps",
    "acc_before",
    "acc_after",
    "effective_ratio",
    "prefix_group_er",
    "mixed_groups_per_step",
    "leaves",
    "generated_tokens",
    "tokens_per_step",
    "wall_s",
    "cpu_s",
)


def hierarchical_bootstrap(
    a: dict[int, np.ndarray], b: dict[int, np.ndarray], samples: int = 2000, seed: int = 0
) -> tuple[float, tuple[float, float]]:
    """Paired difference mean(a - b) over the seeds both hold (per seed the mean over tasks of a task-aligned
    outcome difference) and its 95 % percentile interval: resample seeds, then tasks within each drawn seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed common to both allocators: nothing to pair")
    diffs = [np.asarray(a[s], float) - np.asarray(b[s], float) for s in seeds]
    for s, d in zip(seeds, diffs):
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"seed {s}: per-task outcomes must be equal-length non-empty vectors")
    observed = float(np.mean([d.mean() for d in diffs]))
    rng = np.random.default_rng(seed)
    stats = np.empty(samples)
    for i in range(samples):
        picks = rng.integers(0, len(diffs), len(diffs))
        stats[i] = np.mean([diffs[j][rng.integers(0, diffs[j].size, diffs[j].size)].mean() for j in picks])
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return observed, (float(lo), float(hi))


def _mean(client: Any, run_id: str, key: str) -> float | None:
    from tracerl.workflows.tracking.runs import metric_series

    s = metric_series(client, run_id, key)
    return sum(s.values()) / len(s) if s else None


def run_outcomes(client: Any, run_id: str) -> dict[str, float] | None:
    """The last evaluation's per-task outcomes (``eval/outcomes_step_*.json``, logged by train)."""
    try:
        names = sorted(f.path for f in client.list_artifacts(run_id, "eval") if f.path.endswith(".json"))
    except Exception:  # noqa: BLE001 - MLflow raises its own exception types per store (none logged: no outcomes)
        return None
    if not names:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(run_id, names[-1], tmp)
        try:
            return {str(k): float(v) for k, v in json.loads(Path(local).read_text()).items()}
        except (
            ValueError,
            TypeError,
            AttributeError,
        ) as exc:  # a damaged file must not drop the cell silently
            raise ValueError(
                f"run {run_id}: {names[-1]} is not a JSON object of prompt id -> outcome ({exc})"
            ) from exc


def _own_start(client: Any, run_id: str) -> float:
    """A cell's own step-0 evaluation (cells of studies from before the baseline runs), NaN without one."""
    from tracerl.workflows.tracking.runs import metric_series

    return float(metric_series(client, run_id, M.EVAL_ACCURACY).get(0, math.nan))


def newest_finished(client: Any, exp_id: str, parent: str) -> dict[tuple[str, str, str, int], Any]:
    """(testbed, budget, allocator, seed) -> the cell's newest FINISHED child run of the study's parent run."""
    newest: dict[tuple[str, str, str, int], Any] = {}
    for r in client.search_runs(
        [exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=5000
    ):
        t = r.data.tags
        if r.info.status != "FINISHED" or "tracerl.study.testbed" not in t:
            continue
        k = (
            t["tracerl.study.testbed"],
            t["tracerl.study.budget"],
            t["tracerl.study.allocator"],
            int(t["tracerl.study.seed"]),
        )
        if k not in newest or r.info.start_time > newest[k].info.start_time:
            newest[k] = r
    return newest


def collect(client: Any, exp_id: str, parent: str, tracking: Any) -> list[dict[str, Any]]:
    """One record per cell (its newest FINISHED child run), the JSON fields plus ``outcomes`` and ``tool_calls``."""
    from tracerl.workflows.study.baseline import baseline_accuracy, finished_baselines
    from tracerl.workflows.tracking.runs import metric_series, run_summary

    newest = newest_finished(client, exp_id, parent)
    before = {
        tb: baseline_accuracy(client, rid) for tb, rid in finished_baselines(client, exp_id, parent).items()
    }
    cells = []
    for (tb, budget, alloc, seed), r in sorted(newest.items()):
        rid = r.info.run_id
        s = run_summary(rid, tracking)
        steps = int(s.get("steps", 0))
        step_s = _mean(client, rid, M.TIME_STEP)
        t_raw = r.data.params.get("budget.token_budget")
        target = float(t_raw) if budget == "tokens" and t_raw not in (None, "None", "null") else None
        per_step = s["generated_tokens"] / steps if steps else 0.0
        cells.append(
            {
                "testbed": tb,
                "budget": budget,
                "allocator": alloc,
                "seed": seed,
                "run_id": rid,
                "steps": steps,
                "acc_before": before.get(tb, _own_start(client, rid)),
                "acc_after": float(s.get("acc_after", math.nan)),
                "effective_ratio": float(s["effective_ratio"]),
                "prefix_group_er": _mean(client, rid, M.PREFIX_GROUP_ER),
                "mixed_groups_per_step": float(_mean(client, rid, M.MIXED_GROUPS) or 0.0),
                "leaves": int(s["leaves"]),
                "generated_tokens": int(s["generated_tokens"]),
                "tokens_per_step": per_step,
                "token_budget": target,
                "tokens_vs_budget": per_step / target - 1.0 if target else None,
                "wall_s": float((r.info.end_time - r.info.start_time) / 1000 if r.info.end_time else 0.0),
                "cpu_s": float(sum(metric_series(client, rid, M.CPU_S).values())),
                "tool_calls": int(s["tool_calls"]),
                "step_s": step_s,
                "outcomes": run_outcomes(client, rid),
            }
        )
    return cells


def comparisons(
    cells: Sequence[dict[str, Any]], samples: int, vs: str = "grpo", only: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Every allocator (or those in ``only``) against ``vs`` per testbed x budget, paired by seed and held-out task."""
    out = []
    groups = sorted({(c["testbed"], c["budget"]) for c in cells})
    for tb, budget in groups:
        here = [c for c in cells if c["testbed"] == tb and c["budget"] == budget]
        base = {c["seed"]: c for c in here if c["allocator"] == vs}
        if not base:
            continue
        for alloc in sorted({c["allocator"] for c in here} - {vs}):
            if only is not None and alloc not in only:
                continue
            mine = {c["seed"]: c for c in here if c["allocator"] == alloc}
            a, b = _paired(mine, base)
            if not a:
                continue
            diff, ci = hierarchical_bootstrap(a, b, samples)
            out.append(
                {
                    "testbed": tb,
                    "budget": budget,
                    "allocator": alloc,
                    "vs": vs,
                    "diff": diff,
                    "ci95": [ci[0], ci[1]],
                }
            )
    return out


def _paired(
    mine: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]]
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Per common seed, task-aligned outcome vectors (a one-element accuracy vector where outcomes are missing)."""
    a: dict[int, np.ndarray] = {}
    b: dict[int, np.ndarray] = {}
    for s in sorted(set(mine) & set(base)):
        oa, ob = mine[s].get("outcomes") or {}, base[s].get("outcomes") or {}
        tasks = sorted(set(oa) & set(ob))
        if tasks:
            a[s], b[s] = np.array([oa[t] for t in tasks]), np.array([ob[t] for t in tasks])
        else:
            a[s], b[s] = np.array([mine[s]["acc_after"]]), np.array([base[s]["acc_after"]])
    return a, b


def outcome(c: dict[str, Any]) -> str:
    """'win', 'loss' or 'tie' of ``c['allocator']`` against ``c['vs']`` by the decision rule."""
    lo, hi = c["ci95"]
    return "win" if lo > 0 else "loss" if hi < 0 else "tie"


def verdict(c: dict[str, Any]) -> str:
    lo, hi = c["ci95"]
    vs = c.get("vs", "grpo")
    pts = f"{100 * c['diff']:+.1f} points (95 % interval {100 * lo:+.1f} to {100 * hi:+.1f})"
    where = f"on {c['testbed']} at equal {c['budget']}"
    return {
        "win": f"{c['allocator']} beats {vs} {where}: {pts}, the interval excludes 0.",
        "loss": f"{vs} beats {c['allocator']} {where}: {pts}, the interval excludes 0.",
        "tie": f"{c['allocator']} does not beat {vs} {where}: {pts}, the interval contains 0.",
    }[outcome(c)]


def answer(comps: Sequence[dict[str, Any]], vs_trace: Sequence[dict[str, Any]]) -> list[str]:
    """The plain-language answer, read off the decision rule: where an allocator beats grpo, where grpo beats it,
    where neither, and the stated hypothesis checked case by case (confirmed, refuted or not measured)."""
    lines = ["## The answer", ""]
    for kind, say in (("win", "beats grpo"), ("loss", "loses to grpo"), ("tie", "neither wins")):
        hits = [
            f"{c['allocator']} on {c['testbed']} at equal {c['budget']}" for c in comps if outcome(c) == kind
        ]
        lines.append(f"- {say.capitalize()}: {'; '.join(hits) if hits else 'nowhere'}.")
    lines += ["", "The hypothesis, stated before the grid ran:", ""]

    def check(claim: str, cases: list[dict[str, Any]], want: Callable[[str], bool]) -> None:
        if not cases:
            lines.append(f"- {claim}: not measured.")
            return
        held = [want(outcome(c)) for c in cases]
        state = "confirmed" if all(held) else "refuted" if not any(held) else "partly confirmed"
        lines.append(f"- {claim}: {state} ({'; '.join(verdict(c) for c in cases)})")

    late = [c for c in comps if c["testbed"].endswith("-late")]
    habit = [c for c in comps if c["testbed"].endswith("-habit")]
    check(
        "on the -late testbeds trace beats grpo", [c for c in late if c["allocator"] == "trace"], "win".__eq__
    )
    check(
        "on the -late testbeds trace_plus beats trace at equal tokens",
        [c for c in vs_trace if c["allocator"] == "trace_plus" and c["testbed"].endswith("-late")],
        "win".__eq__,
    )
    check(
        "on the turn-1 (-habit) testbeds grpo keeps up with trace",
        [c for c in habit if c["allocator"] == "trace"],
        "win".__ne__,
    )
    return lines + [""]


TOKEN_TOLERANCE = 0.05
"""A token cell's realised mean generated tokens per step must lie within this fraction of T."""


def token_check(cells: Sequence[dict[str, Any]]) -> str:
    """One line on the token cells' realised tokens per step against T: the range, and any cell off by more
    than ``TOKEN_TOLERANCE``."""
    gaps = [(c, c["tokens_vs_budget"]) for c in cells if c.get("tokens_vs_budget") is not None]
    if not gaps:
        return "- Realised tokens per step: no T recorded for these cells."
    lo, hi = min(g for _, g in gaps), max(g for _, g in gaps)
    off = [c for c, g in gaps if abs(g) > TOKEN_TOLERANCE]
    line = f"- Realised tokens per step against T = {gaps[0][0]['token_budget']:.0f}: {100 * lo:+.1f} % to {100 * hi:+.1f} %"
    if not off:
        return line + f", every cell within +-{100 * TOKEN_TOLERANCE:.0f} %."
    names = ", ".join(f"{c['allocator']}/s{c['seed']} ({100 * c['tokens_vs_budget']:+.1f} %)" for c in off)
    return line + f"; outside +-{100 * TOKEN_TOLERANCE:.0f} %: {names}."


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


NOTES = "study_notes.md"
"""A hand-written discussion beside the report (the why behind the answer); the report includes it as it is."""


def markdown(
    sha: str,
    cells: Sequence[dict[str, Any]],
    comps: Sequence[dict[str, Any]],
    plots: Sequence[str],
    vs_trace: Sequence[dict[str, Any]] = (),
    notes: str | None = None,
    cell_shas: dict[str, int] | None = None,
) -> str:
    ran = ""
    if cell_shas and set(cell_shas) != {sha}:
        ran = " (the parent run's); the cells ran at " + ", ".join(
            f"`{s}` ({n} cells)" for s, n in sorted(cell_shas.items(), key=lambda kv: -kv[1])
        )
    lines = [
        "# The TRACE study",
        "",
        f"Commit `{sha}`{ran}; {len(cells)} cells. Held-out greedy accuracy of the testbed's starting checkpoint "
        "(evaluated once per testbed) and after the last step; after is the mean +- std over seeds. Decision rule, stated in advance: an "
        "allocator beats grpo on a testbed and budget when the 95 % interval of the paired difference "
        "(hierarchical bootstrap over seeds, then held-out tasks) excludes 0.",
        "",
    ]
    for tb, budget in sorted({(c["testbed"], c["budget"]) for c in cells}):
        lines += [
            f"## {tb}, equal {budget}",
            "",
            "| allocator | seeds | acc before | acc after | change | ER | prefix-group ER | mixed groups/step "
            "| leaves | generated tokens | tool calls | wall s | CPU s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        here = [c for c in cells if c["testbed"] == tb and c["budget"] == budget]
        for alloc in sorted({c["allocator"] for c in here}, key=lambda a: (a != "grpo", a)):
            cs = [c for c in here if c["allocator"] == alloc]

            def m(k: str, cs: list[dict[str, Any]] = cs) -> float:
                vals = [c[k] for c in cs if c[k] is not None]
                return float(np.mean(vals)) if vals else math.nan

            after = np.array([c["acc_after"] for c in cs])
            lines.append(
                f"| {alloc} | {len(cs)} | {_fmt(m('acc_before'))} | {after.mean():.3f} +- {after.std():.3f} "
                f"| {100 * (m('acc_after') - m('acc_before')):+.1f} | {_fmt(m('effective_ratio'))} "
                f"| {_fmt(m('prefix_group_er'))} | {_fmt(m('mixed_groups_per_step'), '.1f')} "
                f"| {m('leaves'):.0f} | {m('generated_tokens'):.0f} | {m('tool_calls'):.0f} "
                f"| {m('wall_s'):.0f} | {_fmt(m('cpu_s'), '.0f')} |"
            )
        lines += [""] + [
            f"- {verdict(c)}" for c in (*comps, *vs_trace) if c["testbed"] == tb and c["budget"] == budget
        ]
        if budget == "tokens":
            lines.append(token_check(here))
        lines.append("")
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    lines[4:4] = answer(comps, vs_trace) + (["## Why", "", notes.strip(), ""] if notes else [])
    return "\n".join(lines) + "\n"


def plots(cells: Sequence[dict[str, Any]], out: Path) -> list[str]:
    """Held-out accuracy after training against generated tokens and against leaves: mean over seeds per allocator
    with a +-1 std band (error bars), one panel per testbed x budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(c["testbed"], c["budget"]) for c in cells})
    colors = {
        a: f"C{i % 10}" for i, a in enumerate(sorted({c["allocator"] for c in cells}))
    }  # same in every panel
    paths = []
    for x, label in (("generated_tokens", "generated tokens"), ("leaves", "leaves")):
        ncols = min(max(len(groups), 1), 4)
        nrows = -(-max(len(groups), 1) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.5 * ncols, 3.8 * nrows), squeeze=False)
        for ax in axes.flat[len(groups) :]:
            ax.set_visible(False)
        for ax, (tb, budget) in zip(axes.flat, groups):
            here = [c for c in cells if c["testbed"] == tb and c["budget"] == budget]
            for alloc in sorted({c["allocator"] for c in here}):
                cs = [c for c in here if c["allocator"] == alloc]
                xs, ys = np.array([c[x] for c in cs], float), np.array([c["acc_after"] for c in cs], float)
                ax.errorbar(
                    xs.mean(),
                    ys.mean(),
                    xerr=xs.std(),
                    yerr=ys.std(),
                    fmt="o",
                    capsize=3,
                    label=alloc,
                    color=colors[alloc],
                )
            ax.set_title(f"{tb}, equal {budget}")
            ax.set_xlabel(label)
            ax.tick_params(axis="x", labelrotation=30)
            ax.set_ylabel("held-out accuracy after")
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"study_accuracy_vs_{x}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    return paths


def write_report(
    cfg: StudyConfig, client: Any, exp_id: str, parent: str, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """study.md, study.json and plots under ``cfg.out_dir`` (and ``cfg.json_path``), logged on the parent run."""
    cells = collect(client, exp_id, parent, cfg.tracking)
    comps = comparisons(cells, cfg.bootstrap_samples)
    vs_trace = comparisons(cells, cfg.bootstrap_samples, vs="trace", only=("trace_debiased", "trace_plus"))
    sha = client.get_run(parent).data.tags.get("tracerl.git_sha", "unknown")
    cell_shas = Counter(str(client.get_run(c["run_id"]).data.tags.get("tracerl.git_sha")) for c in cells)
    if len(cell_shas) > 1:
        progress(f"cells ran at {len(cell_shas)} commits ({', '.join(sorted(cell_shas))})")
    doc = {"sha": sha, "cells": [{k: c[k] for k in FIELDS} for c in cells], "comparisons": comps}
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = plots(cells, out) if cells else []
    (out / "study.json").write_text(json.dumps(doc, indent=2))
    notes = out / NOTES
    text = notes.read_text() if notes.is_file() else None
    (out / "study.md").write_text(markdown(sha, cells, comps, pngs, vs_trace, text, dict(cell_shas)))
    if cfg.json_path:
        Path(cfg.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json_path).write_text(json.dumps(doc, indent=2))
    for f in ["study.json", "study.md", *[Path(p).name for p in pngs]]:
        client.log_artifact(parent, str(out / f), "report")
    progress(f"report: {out / 'study.md'} ({len(cells)} cells, {len(comps)} comparisons)")
    return doc
