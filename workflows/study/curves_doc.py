"""The learning-curve study's curves.md and plots, from the document workflows/study/curves_report.py builds:
per testbed a table of allocators (tokens and CPU seconds to target with the ratio to grpo, normalised AUC, final
accuracy, the sigmoid fit), the decision rule's verdicts, the trace vs trace_mc headroom, the hypotheses and the
plain-language answer; accuracy against generated tokens and against CPU seconds, mean with a 95 % band, one panel
per testbed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
        return inf if v is None else format(v * scale, spec if pct else spec)

    return f"{f(i['estimate'], 'never')}{unit} ({f(i['low'], 'never')} to {f(i['high'], 'inf')}{unit})"


def _tokens_line(alloc: str, tb: str, e: Mapping[str, Any]) -> str:
    t, c = e.get("tokens"), e.get("cpu_s")
    if not t:
        return f"- {alloc} on {tb}: no seed paired with grpo's."
    return (
        f"- {alloc} on {tb}: tokens-to-target ratio {_iv(t['ratio'], pct=True)} of grpo's, "
        f"{RULE_WORDS[t['verdict']]} by the rule; CPU-seconds ratio {_iv(c['ratio'] if c else None, pct=True)}."
    )


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
            f"{'-' if alloc == 'grpo' else _iv(t.get('ratio'), pct=True)} | {_iv(c.get('tokens_to_target'))} | "
            f"{'-' if alloc == 'grpo' else _iv(c.get('ratio'), pct=True)} | {_iv(t.get('auc'), spec='.3f')} | "
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
    h = st.get("headroom")
    if h and h.get("tokens"):
        r = h["tokens"]["ratio"]
        saved = None if r["estimate"] is None else 1 - r["estimate"]
        fd = h.get("final_difference")
        lines.append(
            f"- Headroom ({st.get('ceiling', 'trace_mc')}, the Monte-Carlo ceiling, against trace): it needs "
            f"{_iv(r, pct=True)} of trace's tokens to the target"
            + (
                f" (a perfect predictor would save {100 * saved:.0f} % of trace's tokens)"
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
    here = [c for c in cells if c["testbed"] == tb]
    off = [c for c in here if c["budget_flag"]]
    gaps = [c["budget_off"] for c in here if c["points"]]
    if gaps:
        lines.append(
            f"- Realised budget: {100 * min(gaps):+.1f} % to {100 * max(gaps):+.1f} % of {st['budget_tokens']:.0f} "
            "tokens"
            + (
                "; more than 5 % off: "
                + ", ".join(f"{c['allocator']}/s{c['seed']} ({100 * c['budget_off']:+.1f} %)" for c in off)
                if off
                else ", every cell within 5 %."
            )
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
        for tb, st in sorted(doc["testbeds"].items()):
            e = st.get("allocators", {}).get(a)
            if not e or not e.get("tokens"):
                continue
            t, c = e["tokens"]["ratio"], (e.get("cpu_s") or {}).get("ratio")
            parts.append(f"{_iv(t, pct=True)} of its tokens and {_iv(c, pct=True)} of its CPU time on {tb}")
            (wins if e["tokens"]["verdict"] == "win" else others).append(tb)
        if parts:
            lines.append(
                f"- To reach what grpo reaches, {a} needs " + "; ".join(parts) + ". More compute-efficient "
                f"than grpo by the rule {'on ' + ', '.join(wins) if wins else 'nowhere'}"
                + (f", not on {', '.join(others)}" if others else "")
                + "."
            )
    lines += ["", "Hypotheses, stated in the config before the grid ran:", ""]
    for h in doc["hypotheses"]:
        cases = "; ".join(
            f"{c['testbed']}: {c['verdict']}, ratio {_iv(c['ratio'], pct=True)}" for c in h["cases"]
        )
        lines.append(
            f"- {h['claim']} (expect {h['expect']} of {h['allocator']} against {h['vs']}): **{h['state']}**"
            + (f" ({cases})" if cases else "")
            + "."
        )
    return lines + [""]


def markdown(doc: Mapping[str, Any], plots: Sequence[str]) -> str:
    cells = doc["cells"]
    flagged = [c for c in cells if c["budget_flag"]]
    errors = [c for c in cells if c.get("error")]
    lines = [
        "# Compute-matched learning curves",
        "",
        f"Commit `{doc['sha']}`; {len(cells)} cells. Held-out greedy accuracy on each cell's fixed subset of the "
        "held-out tasks (the seed's `eval_subset`) against generated tokens and CPU seconds of training (evaluation "
        "not counted); the final accuracy is on the full held-out set. Target: "
        f"{doc['target']}. Decision rule, stated in advance: {doc['decision_rule']}. Intervals: 95 %, hierarchical "
        "bootstrap (seeds, then tasks), paired with grpo by seed and task.",
        "",
    ]
    lines += answer(doc)
    if flagged:
        lines += [
            f"**{len(flagged)} cells are more than 5 % off their token budget** (listed per testbed).",
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

    from workflows.study.curves import bootstrap_curve
    from workflows.study.curves_report import eval_curves

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
