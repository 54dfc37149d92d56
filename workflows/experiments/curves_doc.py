"""The learning-curve study's curves.md, curves.json and plots (``write_curves_report``, called by ``tracerl study``
for a curve study), from the cells and typed statistics of workflows/experiments/curves_report.py:
per testbed a table of allocators (tokens and CPU seconds to target with the ratio to grpo, normalised AUC, final
accuracy, the sigmoid fit), the decision rule's verdicts, the trace vs trace_mc headroom, the hypotheses and the
plain-language answer; accuracy against generated tokens and against CPU seconds, mean with a 95 % band, one panel
per testbed (workflows/experiments/curve_plots.py). Every number is in a table; each verdict is said by one template
(``VERDICT_LINE``, ``RULE_WORDS``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.workflows.experiments.curve_plots import curve_plots
from tracerl.workflows.experiments.curve_results import (
    AllocatorStats,
    CurveVerdict,
    Hypothesis,
    HypothesisCase,
    TestbedStats,
    as_json,
    finite,
)
from tracerl.workflows.experiments.curves_report import (
    BUDGET_TOLERANCE,
    TARGET_FRAC,
    collect_cells,
    hypothesis_verdicts,
    per_testbed_stats,
)
from tracerl.workflows.study.bootstrap import Interval
from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.tracking import tables
from tracerl.workflows.tracking.runs import git_sha
from tracerl.workflows.tracking.tables import num

DECISION_RULE = (
    "more compute-efficient than grpo when the 95 % interval of the tokens-to-target ratio lies below 1 (win), less "
    "when above 1 (loss), else neither (tie)"
)

RULE_WORDS = {
    "win": "more compute-efficient than grpo",
    "loss": "less compute-efficient than grpo",
    "tie": "neither more nor less compute-efficient than grpo",
    "n/a": "not decided (no target: grpo did not improve)",
}
"""The decision rule's verdicts in words; every verdict the report states is one of these, its numbers in a table."""
VERDICT_LINE = {
    "win": "- {a} on {tb}: more compute-efficient than grpo by the rule (the tokens ratio's interval lies below 1).",
    "loss": "- {a} on {tb}: less compute-efficient than grpo by the rule (the tokens ratio's interval lies above 1).",
    "tie": "- {a} on {tb}: neither more nor less compute-efficient than grpo by the rule (the tokens ratio's "
    "interval contains 1).",
    "n/a": "- {a} on {tb}: not decided (no target: grpo did not improve).",
    None: "- {a} on {tb}: no seed paired with grpo's.",
}
"""One template per verdict under a testbed's table (its ratio columns hold the numbers)."""


def _iv(i: Interval | None, pct: bool = False, spec: str = ".0f") -> str:
    """'0.62 (0.50-0.81)', or '62 % (50-81 %)' with ``pct``; a bound that is not finite (never reached) prints as
    'never' (estimate, low) or 'inf' (high)."""
    if i is None:
        return "n/a"
    scale, unit = (100.0, " %") if pct else (1.0, "")

    def f(v: float, inf: str) -> str:
        return format(v * scale, spec) if math.isfinite(v) else inf

    est = f(i.estimate, "never") + (unit if math.isfinite(i.estimate) else "")
    return f"{est} ({f(i.low, 'never')} to {f(i.high, 'inf')}{unit})"


def _ratio(e: CurveVerdict | None) -> str:
    """A comparison's ratio as a share of grpo's, 'n/a' where the rule has no target."""
    if e is None or e.verdict == "n/a":
        return "n/a"
    if e.only_it_reaches:  # x / never = 0 by convention: say so, a bare "0 %" reads as free
        return f"0 %: only it reaches the target ({_iv(e.ratio, pct=True)})"
    return _iv(e.ratio, pct=True)


def _points(d: Interval | None) -> str:
    """A difference of accuracies in points, with its interval."""
    if d is None:
        return "n/a"
    return f"{100 * d.estimate:+.1f} ({100 * d.low:+.1f} to {100 * d.high:+.1f})"


def _resolution(st: TestbedStats, cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """A warning where grpo's mean curve reaches the target before any cell's first evaluation point: tokens to
    target are then read off the straight line from the start to that point, so a ratio there says little."""
    xs = [float(p["generated_tokens"]) for c in cells for p in c["points"]]
    first = min((x for x in xs if x > 0), default=None)
    grpo = st.allocators.get("grpo")
    t = grpo.tokens.tokens_to_target.estimate if grpo and grpo.tokens else math.inf
    if first is None or not math.isfinite(t) or t > first:
        return []
    return [
        f"- Resolution: grpo reaches the target at {t:.0f} tokens, before the first evaluation point "
        f"({first:.0f} tokens): tokens to target here are interpolated between the start and that point, so "
        "the ratios mostly compare the first points' accuracies."
    ]


COLUMNS = (
    "allocator",
    "seeds",
    "tokens to target",
    "ratio to grpo (95 %)",
    "CPU s to target",
    "CPU ratio (95 %)",
    "AUC / budget",
    "final acc (full set)",
    "final - grpo (95 %)",
    "fit A",
    "fit C_mid",
    "fit B",
    "fit R^2",
)


def _row(alloc: str, e: AllocatorStats) -> list[str]:
    t, c, f = e.tokens, e.cpu_s, e.fit
    base = alloc == "grpo"
    return [
        alloc,
        str(e.seeds),
        _iv(t.tokens_to_target if t else None),
        "-" if base else _ratio(t),
        _iv(c.tokens_to_target if c else None),
        "-" if base else _ratio(c),
        _iv(t.auc if t else None, spec=".3f"),
        f"{num(e.final_accuracy)} +- {num(e.final_std)}",
        "-" if base and e.final_difference is None else _points(e.final_difference),
        num(f.asymptote),
        num(f.midpoint, ".0f"),
        num(f.exponent, ".2f"),
        num(f.r2, ".2f"),
    ]


def _headroom(st: TestbedStats) -> list[str]:
    """The Monte-Carlo ceiling against trace, as a table."""
    h = st.headroom
    if h is None or h.tokens is None:
        return []
    r = h.tokens.ratio
    # none where trace never reaches the target: no share of its tokens to save
    saved = None if not math.isfinite(r.estimate) or h.tokens.only_it_reaches else 1 - r.estimate
    head: tuple[str, ...] = (
        "ceiling",
        "share of trace's tokens to the target (95 %)",
        "tokens saved",
        "AUC - trace (95 %)",
    )
    row = [str(st.ceiling or "trace_mc"), _ratio(h.tokens), "-" if saved is None else f"{100 * saved:.0f} %"]
    row += [_iv(h.tokens.auc_difference, spec="+.3f")]
    if h.final_difference is not None:
        head += ("final - trace, points (95 %)",)
        row.append(_points(h.final_difference))
    return [
        "",
        "Headroom: the Monte-Carlo ceiling against trace (Monte-Carlo scores in place of the predictor; tokens saved: "
        "the share of trace's tokens to the target they save).",
        "",
        *tables.markdown(head, [row]),
    ]


def testbed_section(tb: str, st: TestbedStats, cells: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [f"## {tb}", ""]
    if st.target is None or st.start is None or st.grpo_final is None:
        return lines + [f"- {st.note or 'no statistics'}", ""]
    lines += [
        f"Budget {st.budget_tokens:.0f} generated tokens per cell. Start (the baseline, on the curve's tasks) "
        f"{st.start:.3f}; grpo ends at {st.grpo_final:.3f}; target {st.target:.3f}."
        + (f" {st.note}." if st.note else ""),
        "",
        *tables.markdown(COLUMNS, [_row(a, e) for a, e in st.allocators.items()]),
        "",
    ]
    poor = [f"{a} ({e.fit.why_poor})" for a, e in st.allocators.items() if e.fit.poor]
    lines += [
        VERDICT_LINE[e.tokens.verdict if e.tokens else None].format(a=a, tb=tb)
        for a, e in st.allocators.items()
        if a != "grpo"
    ]
    lines.append(
        f"- Sigmoid fit poor for: {'; '.join(poor)}."
        if poor
        else "- Sigmoid fit: identified with R^2 >= 0.8 for every allocator."
    )
    here = [c for c in cells if c["testbed"] == tb]
    lines += _resolution(st, here)
    off = [c for c in here if c["budget_flag"]]
    gaps = [c["budget_off"] for c in here if c["points"]]
    if gaps:
        lines.append(
            f"- Realised budget: {100 * min(gaps):+.1f} % to {100 * max(gaps):+.1f} % of {st.budget_tokens:.0f} "
            "tokens"
            + (
                "; more than 5 % off: "
                + ", ".join(f"{c['allocator']}/s{c['seed']} ({100 * c['budget_off']:+.1f} %)" for c in off)
                + "."
                if off
                else ", every cell within 5 %."
            )
        )
    timed = [c for c in here if c.get("eval_timeouts")]
    if timed:
        lines.append(
            "- Evaluations that hit a wall-clock limit (tool calls or gradings past their timeout; those points may "
            "not reproduce on a re-run): "
            + ", ".join(f"{c['allocator']}/s{c['seed']} ({c['eval_timeouts']})" for c in timed)
            + "."
        )
    return lines + _headroom(st) + [""]


def answer(testbeds: Mapping[str, TestbedStats], hypotheses: Sequence[Hypothesis]) -> list[str]:
    """The plain-language answer: per allocator and testbed what share of grpo's tokens and CPU time it needs to
    reach what grpo reaches and the rule's verdict (a table), per allocator where the rule says it is more
    efficient and where not; the hypotheses (a table)."""
    rows, lines = [], ["## The answer", ""]
    summary = []
    allocs = sorted({a for st in testbeds.values() for a in st.allocators} - {"grpo"})
    for a in allocs:
        wins: list[str] = []
        others: list[str] = []
        undecided: list[str] = []
        for tb, st in sorted(testbeds.items()):
            e = st.allocators.get(a)
            if not e or not e.tokens:
                continue
            if e.tokens.verdict == "n/a":
                undecided.append(tb)
                continue
            cpu = e.cpu_s.ratio if e.cpu_s else None
            rows.append(
                [a, tb, _iv(e.tokens.ratio, pct=True), _iv(cpu, pct=True), RULE_WORDS[e.tokens.verdict]]
            )
            (wins if e.tokens.verdict == "win" else others).append(tb)
        no_target = f"; no target on {', '.join(undecided)} (grpo did not improve)" if undecided else ""
        if wins or others:
            summary.append(
                f"- {a}: more compute-efficient than grpo by the rule {'on ' + ', '.join(wins) if wins else 'nowhere'}"
                + (f", not on {', '.join(others)}" if others else "")
                + no_target
                + "."
            )
        elif undecided:
            summary.append(f"- {a}: no target on {', '.join(undecided)} (grpo did not improve).")
    if rows:
        head = (
            "allocator",
            "testbed",
            "share of grpo's tokens (95 %)",
            "share of grpo's CPU time (95 %)",
            "by the rule",
        )
        lines += [
            "To reach what grpo reaches (never: its mean curve stays below the target within the budget):",
            "",
            *tables.markdown(head, rows),
            "",
        ]
    lines += summary
    lines += ["", "Hypotheses, stated in the config before the grid ran:", ""]
    if hypotheses:
        hrows = [
            [
                h.claim,
                f"{h.expect} of {h.allocator} against {h.vs}",
                f"**{h.state}**",
                "; ".join(f"{c.testbed}: {c.verdict}, {_ratio_of(c)}" for c in h.cases) or "-",
            ]
            for h in hypotheses
        ]
        lines += tables.markdown(
            ("hypothesis", "expect", "state", "per testbed: verdict, tokens ratio (95 %)"), hrows
        )
    return lines + [""]


def _ratio_of(c: HypothesisCase) -> str:
    return "n/a" if c.verdict == "n/a" else _iv(c.ratio, pct=True)


def _commits(cells: Sequence[Mapping[str, Any]], report_sha: str) -> str:
    """Which commits the cells ran at (a grid resumed across sessions may span several) and the report's."""
    runs = Counter(str(c.get("git_sha", "unknown")) for c in cells)
    at = ", ".join(f"`{sha}` ({n})" for sha, n in sorted(runs.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"Cells ran at commit {at or '-'}; this report at `{report_sha}`"


@dataclass(frozen=True)
class CurvesReport:
    """What curves.md and curves.json say: the cells (records of ``curves_report.cell_record``) and the typed
    statistics per testbed and per hypothesis."""

    sha: str
    """The commit writing the report (the cells name their own)."""
    cells: Sequence[Mapping[str, Any]]
    testbeds: Mapping[str, TestbedStats]
    hypotheses: Sequence[Hypothesis]
    decision_rule: str = DECISION_RULE
    target: str = f"start + {TARGET_FRAC} x (grpo's final - start) on the curve's tasks"
    budget_tolerance: float = BUDGET_TOLERANCE

    def to_json(self) -> dict[str, Any]:
        """curves.json: strict JSON (never reached or not measured: None); per cell its points without per-task
        outcomes."""
        cells = [{k: v for k, v in c.items() if k not in ("final_outcomes", "tasks")} for c in self.cells]
        for c in cells:
            c["points"] = [
                {k: v for k, v in p.items() if k not in ("outcomes", "tasks")} for p in c["points"]
            ]
        return finite(
            {
                "sha": self.sha,
                "decision_rule": self.decision_rule,
                "target": self.target,
                "budget_tolerance": self.budget_tolerance,
                "cells": cells,
                "testbeds": as_json(self.testbeds),
                "hypotheses": as_json(self.hypotheses),
            }
        )


def markdown(doc: CurvesReport, plots: Sequence[str]) -> str:
    cells = doc.cells
    flagged = [c for c in cells if c["budget_flag"]]
    errors = [c for c in cells if c.get("error")]
    lines = [
        "# Compute-matched learning curves",
        "",
        f"{_commits(cells, doc.sha)}; {len(cells)} cells. Held-out greedy accuracy on each cell's fixed subset of the "
        "held-out tasks (the seed's `eval_subset`) against generated tokens and CPU seconds of training (evaluation "
        "not counted); the final accuracy is on the full held-out set. Target: "
        f"{doc.target}. Decision rule, stated in advance: {doc.decision_rule}. Intervals: 95 %, hierarchical "
        "bootstrap (seeds, then tasks), paired with grpo by seed and task.",
        "",
    ]
    lines += answer(doc.testbeds, doc.hypotheses)
    if flagged:
        lines += [
            f"**{len(flagged)} cell{' is' if len(flagged) == 1 else 's are'} more than 5 % off its token budget** "
            "(listed per testbed).",
            "",
        ]
    for c in errors:
        lines.append(f"- cell {c['testbed']}/{c['allocator']}/s{c['seed']} has no curve: {c['error']}")
    for tb, st in sorted(doc.testbeds.items()):
        lines += testbed_section(tb, st, cells)
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_curves_report(
    cfg: StudyConfig, client: Any, exp_id: str, parent: str, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """curves.md, curves.json and the plots under ``cfg.out_dir`` (curves.json also at ``cfg.json_path``), logged
    on the parent run under ``report``."""
    cells = collect_cells(cfg, client, exp_id, parent)
    stats = {
        tb: per_testbed_stats(
            [c for c in cells if c["testbed"] == tb],
            float(cfg.testbeds[tb]["stop_tokens"]),
            cfg.bootstrap_samples,
        )
        for tb in sorted({c["testbed"] for c in cells})
    }
    hyps = hypothesis_verdicts(cfg, stats, cells, cfg.bootstrap_samples)
    doc = CurvesReport(
        git_sha(), cells, stats, hyps
    )  # the code writing it (the cells name their own commits)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = curve_plots(cells, stats, out) if any(c["points"] for c in cells) else []
    result = doc.to_json()
    text = json.dumps(result, indent=2, allow_nan=False)
    (out / "curves.json").write_text(text)
    (out / "curves.md").write_text(markdown(doc, pngs))
    if cfg.json_path:
        Path(cfg.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json_path).write_text(text)
    for f in ["curves.json", "curves.md", *[Path(p).name for p in pngs]]:
        client.log_artifact(parent, str(out / f), "report")
    flagged = [c for c in cells if c["budget_flag"]]
    progress(
        f"report: {out / 'curves.md'} ({len(cells)} cells, {len(flagged)} off their budget by more than "
        f"{100 * BUDGET_TOLERANCE:.0f} %)"
    )
    return result
