"""The study's report, rebuilt from MLflow: study.md (per testbed x budget a table of allocators), study.json
(the schema of issue 15), PNG plots, and for every allocator against grpo a paired difference of held-out accuracy
with a 95 % interval from a hierarchical bootstrap (seeds, then held-out tasks within seeds). Decision rule: A beats
grpo on a testbed and budget when the interval excludes 0.

Cells are ``StudyCell`` (workflows/study/cell_runs.py, off the run frame); comparisons are
``PairedComparison`` (workflows/study/bootstrap.py's ``paired_difference``); both stay typed until study.json.
Each verdict sentence is one template per outcome (``VERDICTS``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.workflows.study.bootstrap import Interval, paired_difference
from tracerl.workflows.study.cell_runs import StudyCell, collect
from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.study.plots import study_plots
from tracerl.workflows.tracking import tables
from tracerl.workflows.tracking.tables import num


@dataclass(frozen=True)
class PairedComparison:
    """An allocator against ``vs`` on one testbed and budget: the paired difference of held-out accuracy."""

    testbed: str
    budget: str
    allocator: str
    vs: str
    diff: Interval

    @property
    def outcome(self) -> str:
        """'win', 'loss' or 'tie' of ``allocator`` against ``vs`` by the decision rule."""
        return "win" if self.diff.low > 0 else "loss" if self.diff.high < 0 else "tie"

    def to_json(self) -> dict[str, Any]:
        """As in study.json: the estimate as ``diff``, the interval as ``ci95``."""
        names = {k: getattr(self, k) for k in ("testbed", "budget", "allocator", "vs")}
        return names | {"diff": self.diff.estimate, "ci95": [self.diff.low, self.diff.high]}


def comparisons(
    cells: Sequence[StudyCell], samples: int, vs: str = "grpo", only: Sequence[str] | None = None
) -> list[PairedComparison]:
    """Every allocator (or those in ``only``) against ``vs`` per testbed x budget, paired by seed and held-out task."""
    out = []
    for tb, budget in sorted({(c.testbed, c.budget) for c in cells}):
        here = [c for c in cells if c.testbed == tb and c.budget == budget]
        base = {c.seed: c for c in here if c.allocator == vs}
        if not base:
            continue
        for alloc in sorted({c.allocator for c in here} - {vs}):
            if only is not None and alloc not in only:
                continue
            a, b = _paired({c.seed: c for c in here if c.allocator == alloc}, base)
            if a:
                out.append(PairedComparison(tb, budget, alloc, vs, paired_difference(a, b, samples)))
    return out


def _paired(
    mine: dict[int, StudyCell], base: dict[int, StudyCell]
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Per common seed, task-aligned outcome vectors (a one-element accuracy vector where outcomes are missing)."""
    a: dict[int, np.ndarray] = {}
    b: dict[int, np.ndarray] = {}
    for s in sorted(set(mine) & set(base)):
        oa, ob = mine[s].outcomes or {}, base[s].outcomes or {}
        tasks = sorted(set(oa) & set(ob))
        if tasks:
            a[s], b[s] = np.array([oa[t] for t in tasks]), np.array([ob[t] for t in tasks])
        else:
            a[s], b[s] = np.array([mine[s].acc_after]), np.array([base[s].acc_after])
    return a, b


def verdict(c: PairedComparison) -> str:
    """The decision rule's sentence on one comparison: one template per outcome, the numbers filled in."""
    d = c.diff
    pts = f"{100 * d.estimate:+.1f} points (95 % interval {100 * d.low:+.1f} to {100 * d.high:+.1f})"
    return VERDICTS[c.outcome].format(
        a=c.allocator, vs=c.vs, where=f"on {c.testbed} at equal {c.budget}", pts=pts
    )


VERDICTS = {
    "win": "{a} beats {vs} {where}: {pts}, the interval excludes 0.",
    "loss": "{vs} beats {a} {where}: {pts}, the interval excludes 0.",
    "tie": "{a} does not beat {vs} {where}: {pts}, the interval contains 0.",
}


def answer(comps: Sequence[PairedComparison], vs_trace: Sequence[PairedComparison]) -> list[str]:
    """The plain-language answer, read off the decision rule: where an allocator beats grpo, where grpo beats it,
    where neither, and the stated hypothesis checked case by case (confirmed, refuted or not measured)."""
    lines = ["## The answer", ""]
    for kind, say in (("win", "beats grpo"), ("loss", "loses to grpo"), ("tie", "neither wins")):
        hits = [f"{c.allocator} on {c.testbed} at equal {c.budget}" for c in comps if c.outcome == kind]
        lines.append(f"- {say.capitalize()}: {'; '.join(hits) if hits else 'nowhere'}.")
    lines += ["", "The hypothesis, stated before the grid ran:", ""]

    def check(claim: str, cases: list[PairedComparison], want: Callable[[str], bool]) -> None:
        if not cases:
            lines.append(f"- {claim}: not measured.")
            return
        held = [want(c.outcome) for c in cases]
        state = "confirmed" if all(held) else "refuted" if not any(held) else "partly confirmed"
        lines.append(f"- {claim}: {state} ({'; '.join(verdict(c) for c in cases)})")

    late = [c for c in comps if c.testbed.endswith("-late")]
    habit = [c for c in comps if c.testbed.endswith("-habit")]
    check("on the -late testbeds trace beats grpo", [c for c in late if c.allocator == "trace"], "win".__eq__)
    check(
        "on the -late testbeds trace_plus beats trace at equal tokens",
        [c for c in vs_trace if c.allocator == "trace_plus" and c.testbed.endswith("-late")],
        "win".__eq__,
    )
    check(
        "on the turn-1 (-habit) testbeds grpo keeps up with trace",
        [c for c in habit if c.allocator == "trace"],
        "win".__ne__,
    )
    return lines + [""]


TOKEN_TOLERANCE = 0.05
"""A token cell's realised mean generated tokens per step must lie within this fraction of T."""


def token_check(cells: Sequence[StudyCell]) -> str:
    """One line on the token cells' realised tokens per step against T: the range, and any cell off by more
    than ``TOKEN_TOLERANCE``."""
    gaps = [(c, c.tokens_vs_budget) for c in cells if c.tokens_vs_budget is not None]
    if not gaps:
        return "- Realised tokens per step: no T recorded for these cells."
    lo, hi = min(g for _, g in gaps), max(g for _, g in gaps)
    off = [(c, g) for c, g in gaps if abs(g) > TOKEN_TOLERANCE]
    line = f"- Realised tokens per step against T = {gaps[0][0].token_budget:.0f}: {100 * lo:+.1f} % to {100 * hi:+.1f} %"
    if not off:
        return line + f", every cell within +-{100 * TOKEN_TOLERANCE:.0f} %."
    names = ", ".join(f"{c.allocator}/s{c.seed} ({100 * g:+.1f} %)" for c, g in off)
    return line + f"; outside +-{100 * TOKEN_TOLERANCE:.0f} %: {names}."


NOTES = "study_notes.md"
"""A hand-written discussion beside the report (the why behind the answer); the report includes it as it is."""


COLUMNS = (
    "allocator",
    "seeds",
    "acc before",
    "acc after",
    "change",
    "ER",
    "prefix-group ER",
    "mixed groups/step",
    "leaves",
    "generated tokens",
    "tool calls",
    "wall s",
    "CPU s",
)
"""The per testbed x budget table's columns (``_row`` writes their cells)."""


def _row(alloc: str, cs: Sequence[StudyCell]) -> list[str]:
    """One allocator's cells of a testbed and budget as a table row: means over seeds (after: mean +- std)."""

    def m(k: str) -> float:
        vals = [getattr(c, k) for c in cs if getattr(c, k) is not None]
        return float(np.mean(vals)) if vals else math.nan

    after = np.array([c.acc_after for c in cs])
    return [
        alloc,
        str(len(cs)),
        num(m("acc_before")),
        f"{after.mean():.3f} +- {after.std():.3f}",
        f"{100 * (m('acc_after') - m('acc_before')):+.1f}",
        num(m("effective_ratio")),
        num(m("prefix_group_er")),
        num(m("mixed_groups_per_step"), ".1f"),
        f"{m('leaves'):.0f}",
        f"{m('generated_tokens'):.0f}",
        f"{m('tool_calls'):.0f}",
        f"{m('wall_s'):.0f}",
        num(m("cpu_s"), ".0f"),
    ]


def markdown(
    sha: str,
    cells: Sequence[StudyCell],
    comps: Sequence[PairedComparison],
    plots: Sequence[str],
    vs_trace: Sequence[PairedComparison] = (),
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
    for tb, budget in sorted({(c.testbed, c.budget) for c in cells}):
        here = [c for c in cells if c.testbed == tb and c.budget == budget]
        allocs = sorted({c.allocator for c in here}, key=lambda a: (a != "grpo", a))
        rows = [_row(a, [c for c in here if c.allocator == a]) for a in allocs]
        lines += [f"## {tb}, equal {budget}", "", *tables.markdown(COLUMNS, rows), ""]
        lines += [f"- {verdict(c)}" for c in (*comps, *vs_trace) if c.testbed == tb and c.budget == budget]
        if budget == "tokens":
            lines.append(token_check(here))
        lines.append("")
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    lines[4:4] = answer(comps, vs_trace) + (["## Why", "", notes.strip(), ""] if notes else [])
    return "\n".join(lines) + "\n"


def write_report(
    cfg: StudyConfig, client: Any, exp_id: str, parent: str, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """study.md, study.json and plots under ``cfg.out_dir`` (and ``cfg.json_path``), logged on the parent run."""
    cells = collect(client, exp_id, parent, cfg.tracking)
    comps = comparisons(cells, cfg.bootstrap_samples)
    vs_trace = comparisons(cells, cfg.bootstrap_samples, vs="trace", only=("trace_debiased", "trace_plus"))
    sha = client.get_run(parent).data.tags.get("tracerl.git_sha", "unknown")
    cell_shas = Counter(c.git_sha for c in cells)
    if len(cell_shas) > 1:
        progress(f"cells ran at {len(cell_shas)} commits ({', '.join(sorted(cell_shas))})")
    doc = {"sha": sha, "cells": [c.to_json() for c in cells], "comparisons": [c.to_json() for c in comps]}
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = study_plots(cells, out) if cells else []
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
