"""The learning-curve study's figures (curves.md's PNGs), on the report's cells and typed statistics; the figure
set-up is workflows/tracking/figures.py's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.workflows.experiments.curve_results import TestbedStats
from tracerl.workflows.experiments.curves import bootstrap_curve
from tracerl.workflows.experiments.curves_report import eval_curves
from tracerl.workflows.tracking import figures


def curve_plots(
    cells: Sequence[Mapping[str, Any]], stats: Mapping[str, TestbedStats], out: Path, samples: int = 500
) -> list[str]:
    """curves_accuracy_vs_generated_tokens.png and curves_accuracy_vs_cpu_s.png: per testbed a panel, per allocator
    the mean curve with its pointwise 95 % band (hierarchical bootstrap), the target and the budget marked."""
    usable = [c for c in cells if c["points"] and not c.get("error")]
    tbs = sorted({c["testbed"] for c in usable})
    colors = {a: f"C{i % 10}" for i, a in enumerate(sorted({c["allocator"] for c in usable}))}
    paths = []
    for x, label in (
        ("generated_tokens", "generated tokens (training)"),
        ("cpu_s", "CPU seconds (training)"),
    ):
        fig, axes = figures.panels(len(tbs), 2, 6, 4.2)
        for ax, tb in zip(axes, tbs):
            st = stats.get(tb)
            target = st.target if st else None
            for alloc in sorted({c["allocator"] for c in usable if c["testbed"] == tb}):
                cs = [c for c in usable if c["testbed"] == tb and c["allocator"] == alloc]
                s = bootstrap_curve(eval_curves(cs, x), 1.0 if target is None else target, samples=samples)
                ax.plot(s.grid, s.mean, color=colors[alloc], label=f"{alloc} ({len(cs)})")
                ax.fill_between(s.grid, s.low, s.high, color=colors[alloc], alpha=0.2, linewidth=0)
            if target is not None:
                ax.axhline(target, color="grey", linestyle="--", linewidth=0.8, label="target")
            if x == "generated_tokens":
                ax.axvline(st.budget_tokens if st else np.nan, color="grey", linestyle=":", linewidth=0.8)
            ax.set_title(tb)
            ax.set_xlabel(label)
            ax.set_ylabel("held-out accuracy (curve subset)")
            ax.legend(fontsize=7)
        paths.append(str(figures.save(fig, out / f"curves_accuracy_vs_{x}.png")))
    return paths
