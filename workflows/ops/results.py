"""Benchmark results: intervals over seeds, and the JSON files a benchmark writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.config_loader import to_yaml


def ci95(values: Sequence[float]) -> float | None:
    """Half-width of the 95 % t interval of the mean of ``values`` (None with fewer than two values)."""
    from scipy import stats  # slow to import: every tracerl command imports this module at start-up

    if len(values) < 2:
        return None
    return float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / np.sqrt(len(values)))


def results_dir(out_dir: str | Path, cfg: Any) -> Path:
    """A command's output folder ``out_dir``, created, holding the resolved config it runs as ``config.yaml``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    return out


def write_json(path: str | Path | None, data: Any, indent: int = 2) -> None:
    """``data`` as JSON at ``path`` (its folder created); nothing when ``path`` is None."""
    if path is None:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=indent))


def write_results(out_dir: str | Path, data: Any, json_path: str | None = None, indent: int = 2) -> None:
    """A benchmark's summary as ``out_dir/results.json`` and, where the user asked for it, at ``json_path``."""
    write_json(Path(out_dir) / "results.json", data, indent)
    write_json(json_path, data, indent)
