"""The study's figures (study.md's PNGs), on the report's typed cells; the figure set-up is
workflows/tracking/figures.py's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tracerl.workflows.study.cell_runs import StudyCell
from tracerl.workflows.tracking import figures


def study_plots(cells: Sequence[StudyCell], out: Path) -> list[str]:
    """Held-out accuracy after training against generated tokens and against leaves: mean over seeds per allocator
    with a +-1 std band (error bars), one panel per testbed x budget."""
    groups = sorted({(c.testbed, c.budget) for c in cells})
    # an allocator's colour is the same in every panel
    colors = {a: f"C{i % 10}" for i, a in enumerate(sorted({c.allocator for c in cells}))}
    paths = []
    for x, label in (("generated_tokens", "generated tokens"), ("leaves", "leaves")):
        fig, axes = figures.panels(len(groups), 4, 4.5, 3.8)
        for ax, (tb, budget) in zip(axes, groups):
            here = [c for c in cells if c.testbed == tb and c.budget == budget]
            for alloc in sorted({c.allocator for c in here}):
                cs = [c for c in here if c.allocator == alloc]
                xs, ys = (
                    np.array([getattr(c, x) for c in cs], float),
                    np.array([c.acc_after for c in cs], float),
                )
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
        paths.append(str(figures.save(fig, out / f"study_accuracy_vs_{x}.png")))
    return paths
