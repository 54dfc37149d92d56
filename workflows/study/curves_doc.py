"""The learning-curve study's curves.md, curves.json and plots (``write_curves_report``, called by ``tracerl study``
for a curve study), from the cells and statistics of workflows/study/curves_report.py:
per testbed a table of allocators (tokens and CPU seconds to target with the ratio to grpo, normalised AUC, final
accuracy, the sigmoid fit), the decision rule's verdicts, the trace vs trace_mc headroom, the hypotheses and the
plain-language answer; accuracy against generated tokens and against CPU seconds, mean with a 95 % band, one panel
per testbed."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.experiment_config import StudyConfig
from tracerl.workflows.study.curves_report import (
    BUDGET_TOLERANCE,
    TARGET_FRAC,
    collect_cells,
    eval_curves,
    finite,
    hypothesis_verdicts,
    per_testbed_stats,
)

RULE_WORDS = {
    "win": "more compute-efficient than grpo",
    "loss": "less compute-efficient than grpo",
    "tie": "neither more nor less compute-efficient than grpo",
    "n/a": "not decided (no target: grpo did not improve)",
}


def _num(v: Any, spec: str = ".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _iv(i: Mapping[str, Any] | None, pct: bool = False, spec: str = ".0f") -> str:
    """'0.62 (0.50-0.81)', or '62 % (50-81 %)' with ``pct``; None bounds (never reached) print as 'never'/'inf'."""
    if not i:
        return "n/a"
    scale, unit = (100.0, " %") if pct else (1.0, "")

    def f(v: Any, inf: str) -> str:
        return inf if v is None else format(v * scale, spec)

    est = "never" if i["estimate"] is None else f(i["estimate"], "never") + unit
    return f"{est} ({f(i['low'], 'never')} to {f(i['high'], 'inf')}{unit})"


def _only_it_reaches(e: Mapping[str, Any]) -> bool:
    """Whether a comparison's ratio is 0 only because its baseline's mean curve never reaches the target."""
    never = (e.get("vs_tokens_to_target") or {}).get("estimate", 0.0) is None
    return never and (e.get("tokens_to_target") or {}).get("estimate") is not None


def _ratio(e: Mapping[str, Any] | None) -> str:
    """A comparison's ratio as a share of grpo's, 'n/a' where the rule has no target."""
    if not e or e.get("verdict") == "n/a":
        return "n/a"
    if _only_it_reaches(e):  # x / never = 0 by convention: say so, a bare "0 %" reads as free
        return f"0 %: only it reaches the target ({_iv(e['ratio'], pct=True)})"
    return _iv(e["ratio"], pct=True)


def _tokens_line(alloc: str, tb: str, e: Mapping[str, Any]) -> str:
    t, c = e.get("tokens"), e.get("cpu_s")
    if not t:
        return f"- {alloc} on {tb}: no seed paired with grpo's."
    if t["verdict"] == "n/a":
        return f"- {alloc} on {tb}: {RULE_WORDS['n/a']}."
    return (
        f"- {alloc} on {tb}: tokens-to-target ratio {_ratio(t)} of grpo's, "
        f"{RULE_WORDS[t['verdict']]} by the rule; CPU-seconds ratio {_ratio(c)}."
    )


def _resolution(st: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """A warning where grpo's mean curve reaches the target before any cell's first evaluation point: tokens to
    target are then read off the straight line from the start to that point, so a ratio there says little."""
    xs = [float(p["generated_tokens"]) for c in cells for p in c["points"]]
    first = min((x for x in xs if x > 0), default=None)
    grpo = ((st["allocators"].get("grpo") or {}).get("tokens") or {}).get("tokens_to_target") or {}
    t = grpo.get("estimate")
    if first is None or t is None or t > first:
        return []
    return [
        f"- Resolution: grpo reaches the target at {t:.0f} tokens, before the first evaluation point "
        f"({first:.0f} tokens): tokens to target here are interpolated between the start and that point, so "
        "the ratios mostly compare the first points' accuracies."
    ]


def testbed_section(tb: str, st: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [f"## {tb}", ""]
    if "target" not in st:
        return lines + [f"- {st.get('note', 'no statistics')}", ""]
    lines += [
        f"Budget {st['budget_tokens']:.0f} generated tokens per cell. Start (the baseline, on the curve's tasks) "
        f"{st['start']:.3f}; grpo ends at {st['grpo_final']:.3f}; target {st['target']:.3f}."
        + (f" {st['note']}." if st.get("note") else ""),
        "",
        "| allocator | seeds | tokens to target | ratio to grpo (95 %) | CPU s to target | CPU ratio (95 %) "
        "| AUC / budget | final acc (full set) | final - grpo (95 %) | fit A | fit C_mid | fit B | fit R^2 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    poor = []
    for alloc, e in st["allocators"].items():
        t, c, f = e.get("tokens") or {}, e.get("cpu_s") or {}, e["fit"]
        d = e.get("final_difference")
        fd = (
            f"{100 * d['estimate']:+.1f} ({100 * d['low']:+.1f} to {100 * d['high']:+.1f})"
            if d
            else ("-" if alloc == "grpo" else "n/a")
        )
        lines.append(
            f"| {alloc} | {e['seeds']} | {_iv(t.get('tokens_to_target'))} | "
            f"{'-' if alloc == 'grpo' else _ratio(t)} | {_iv(c.get('tokens_to_target'))} | "
            f"{'-' if alloc == 'grpo' else _ratio(c)} | {_iv(t.get('auc'), spec='.3f')} | "
            f"{_num(e['final_accuracy'])} +- {_num(e['final_std'])} | {fd} | {_num(f['asymptote'])} | "
            f"{_num(f['midpoint'], '.0f')} | {_num(f['exponent'], '.2f')} | {_num(f['r2'], '.2f')} |"
        )
        if f["poor"]:
            poor.append(f"{alloc} ({f['why_poor']})")
    lines.append("")
    lines += [_tokens_line(a, tb, e) for a, e in st["allocators"].items() if a != "grpo"]
    lines.append(
        f"- Sigmoid fit poor for: {'; '.join(poor)}."
        if poor
        else "- Sigmoid fit: identified with R^2 >= 0.8 for every allocator."
    )
    here = [c for c in cells if c["testbed"] == tb]
    lines += _resolution(st, here)
    h = st.get("headroom")
    if h and h.get("tokens"):
        r = h["tokens"]["ratio"]
        # none where trace never reaches the target: no share of its tokens to save
        saved = None if r["estimate"] is None or _only_it_reaches(h["tokens"]) else 1 - r["estimate"]
        fd = h.get("final_difference")
        lines.append(
            f"- Headroom ({st.get('ceiling', 'trace_mc')}, the Monte-Carlo ceiling, against trace): it needs "
            f"{_ratio(h['tokens'])} of trace's tokens to the target"
            + (
                f" (Monte-Carlo scores in place of the predictor save {100 * saved:.0f} % of trace's tokens)"
                if saved is not None
                else ""
            )
            + f", AUC {_iv(h['tokens']['auc_difference'], spec='+.3f')} against trace"
            + (
                f", final accuracy {100 * fd['estimate']:+.1f} points ({100 * fd['low']:+.1f} to {100 * fd['high']:+.1f})"
                if fd
                else ""
            )
            + "."
        )
    off = [c for c in here if c["budget_flag"]]
    gaps = [c["budget_off"] for c in here if c["points"]]
    if gaps:
        lines.append(
            f"- Realised budget: {100 * min(gaps):+.1f} % to {100 * max(gaps):+.1f} % of {st['budget_tokens']:.0f} "
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
    return lines + [""]


def answer(doc: Mapping[str, Any]) -> list[str]:
    """The plain-language answer: per allocator, what share of grpo's tokens and CPU time it needs to reach what grpo
    reaches, where the rule says it is more efficient and where not; the hypotheses."""
    lines = ["## The answer", ""]
    allocs = sorted({a for st in doc["testbeds"].values() for a in st.get("allocators", {})} - {"grpo"})
    for a in allocs:
        parts: list[str] = []
        wins: list[str] = []
        others: list[str] = []
        undecided: list[str] = []
        for tb, st in sorted(doc["testbeds"].items()):
            e = st.get("allocators", {}).get(a)
            if not e or not e.get("tokens"):
                continue
            if e["tokens"]["verdict"] == "n/a":
                undecided.append(tb)
                continue
            t, c = e["tokens"]["ratio"], (e.get("cpu_s") or {}).get("ratio")
            parts.append(
                f"on {tb} it does not reach the target within the budget (its mean curve stays below it; tokens "
                f"ratio {_iv(t, pct=True)})"
                if t["estimate"] is None
                else f"on {tb} it needs {_iv(t, pct=True)} of grpo's tokens and {_iv(c, pct=True)} of its CPU time"
            )
            (wins if e["tokens"]["verdict"] == "win" else others).append(tb)
        if parts:
            lines.append(
                f"- {a}, to reach what grpo reaches: " + "; ".join(parts) + ". More compute-efficient "
                f"than grpo by the rule {'on ' + ', '.join(wins) if wins else 'nowhere'}"
                + (f", not on {', '.join(others)}" if others else "")
                + "."
                + (f" No target on {', '.join(undecided)} (grpo did not improve)." if undecided else "")
            )
        elif undecided:
            lines.append(f"- {a}: no target on {', '.join(undecided)} (grpo did not improve).")
    lines += ["", "Hypotheses, stated in the config before the grid ran:", ""]
    for h in doc["hypotheses"]:
        cases = "; ".join(f"{c['testbed']}: {c['verdict']}, ratio {_ratio(c)}" for c in h["cases"])
        lines.append(
            f"- {h['claim']} (expect {h['expect']} of {h['allocator']} against {h['vs']}): **{h['state']}**"
            + (f" ({cases})" if cases else "")
            + "."
        )
    return lines + [""]


def _commits(cells: Sequence[Mapping[str, Any]], report_sha: str) -> str:
    """Which commits the cells ran at (a grid resumed across sessions may span several) and the report's."""
    runs = Counter(str(c.get("git_sha", "unknown")) for c in cells)
    at = ", ".join(f"`{sha}` ({n})" for sha, n in sorted(runs.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"Cells ran at commit {at or '-'}; this report at `{report_sha}`"


def markdown(doc: Mapping[str, Any], plots: Sequence[str]) -> str:
    cells = doc["cells"]
    flagged = [c for c in cells if c["budget_flag"]]
    errors = [c for c in cells if c.get("error")]
    lines = [
        "# Compute-matched learning curves",
        "",
        f"{_commits(cells, doc['sha'])}; {len(cells)} cells. Held-out greedy accuracy on each cell's fixed subset of the "
        "held-out tasks (the seed's `eval_subset`) against generated tokens and CPU seconds of training (evaluation "
        "not counted); the final accuracy is on the full held-out set. Target: "
        f"{doc['target']}. Decision rule, stated in advance: {doc['decision_rule']}. Intervals: 95 %, hierarchical "
        "bootstrap (seeds, then tasks), paired with grpo by seed and task.",
        "",
    ]
    lines += answer(doc)
    if flagged:
        lines += [
            f"**{len(flagged)} cell{' is' if len(flagged) == 1 else 's are'} more than 5 % off its token budget** "
            "(listed per testbed).",
            "",
        ]
    for c in errors:
        lines.append(f"- cell {c['testbed']}/{c['allocator']}/s{c['seed']} has no curve: {c['error']}")
    for tb, st in sorted(doc["testbeds"].items()):
        lines += testbed_section(tb, st, cells)
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def plots(
    cells: Sequence[Mapping[str, Any]], stats: Mapping[str, Any], out: Path, samples: int = 500
) -> list[str]:
    """curves_accuracy_vs_generated_tokens.png and curves_accuracy_vs_cpu_s.png: per testbed a panel, per allocator
    the mean curve with its pointwise 95 % band (hierarchical bootstrap), the target and the budget marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tracerl.workflows.study.curves import bootstrap_curve

    usable = [c for c in cells if c["points"] and not c.get("error")]
    tbs = sorted({c["testbed"] for c in usable})
    colors = {a: f"C{i % 10}" for i, a in enumerate(sorted({c["allocator"] for c in usable}))}
    paths = []
    for x, label in (
        ("generated_tokens", "generated tokens (training)"),
        ("cpu_s", "CPU seconds (training)"),
    ):
        ncols = min(len(tbs), 2)
        nrows = -(-len(tbs) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 4.2 * nrows), squeeze=False)
        for ax in axes.flat[len(tbs) :]:
            ax.set_visible(False)
        for ax, tb in zip(axes.flat, tbs):
            st = stats.get(tb, {})
            for alloc in sorted({c["allocator"] for c in usable if c["testbed"] == tb}):
                cs = [c for c in usable if c["testbed"] == tb and c["allocator"] == alloc]
                s = bootstrap_curve(eval_curves(cs, x), st.get("target", 1.0), samples=samples)
                ax.plot(s.grid, s.mean, color=colors[alloc], label=f"{alloc} ({len(cs)})")
                ax.fill_between(s.grid, s.low, s.high, color=colors[alloc], alpha=0.2, linewidth=0)
            if "target" in st:
                ax.axhline(st["target"], color="grey", linestyle="--", linewidth=0.8, label="target")
            if x == "generated_tokens":
                ax.axvline(st.get("budget_tokens", np.nan), color="grey", linestyle=":", linewidth=0.8)
            ax.set_title(tb)
            ax.set_xlabel(label)
            ax.set_ylabel("held-out accuracy (curve subset)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"curves_accuracy_vs_{x}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(str(p))
    return paths


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
    from tracerl.workflows.tracking.runs import git_sha

    sha = git_sha()  # the code writing this report (the cells name their own commits)
    doc: dict[str, Any] = {
        "sha": sha,
        "decision_rule": "more compute-efficient than grpo when the 95 % interval of the tokens-to-target ratio "
        "lies below 1 (win), less when above 1 (loss), else neither (tie)",
        "target": f"start + {TARGET_FRAC} x (grpo's final - start) on the curve's tasks",
        "budget_tolerance": BUDGET_TOLERANCE,
        "cells": [{k: v for k, v in c.items() if k not in ("final_outcomes", "tasks")} for c in cells],
        "testbeds": stats,
        "hypotheses": hyps,
    }
    for c in doc["cells"]:
        c["points"] = [{k: v for k, v in p.items() if k not in ("outcomes", "tasks")} for p in c["points"]]
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = plots(cells, stats, out) if any(c["points"] for c in cells) else []
    text = json.dumps(finite(doc), indent=2, allow_nan=False)
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
    return doc
