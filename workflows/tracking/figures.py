"""The reports' figure set-up: matplotlib without a display, a grid of panels, a saved and closed figure.

matplotlib is imported here, inside the functions: it is slow to import and only a report draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (no display on the machines the reports run on)."""
    # slow to import: matplotlib
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # slow to import: matplotlib; after the backend is chosen

    return plt


def panels(count: int, max_cols: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of ``count`` panels (at least one), at most ``max_cols`` a row, each ``width`` x ``height``
    inches; the grid's spare panels hidden. Returns the figure and the ``count`` panels in reading order."""
    n = max(count, 1)
    ncols = min(n, max_cols)
    nrows = -(-n // ncols)
    fig, axes = pyplot().subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def save(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay out, write and close ``fig``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


__all__ = ["panels", "pyplot", "save"]
