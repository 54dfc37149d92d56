"""The reports' one run collector: MLflow runs as one pandas frame, one row a run, with ``mlflow.search_runs``'s
columns (``run_id``, ``run_name``, ``status``, ``start_time``, ``end_time`` in ms, ``experiment_id``, ``tags.<k>``,
``params.<k>``, ``metrics.<k>``: the last value logged). Metric histories are read per run only where a report
needs a series (``metric_series``, ``metric_mean``, ``metric_sum``).

Read through a client (not the module-level ``mlflow.search_runs``) so a report reads the store it was handed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from tracerl.workflows.tracking.runs import metric_series

INFO = ("run_id", "run_name", "status", "start_time", "end_time", "experiment_id")


def frame_of(runs: Iterable[Any]) -> pd.DataFrame:
    """MLflow ``Run`` objects as a frame (columns as ``mlflow.search_runs``'s; none of a run's: NaN)."""
    rows = []
    for r in runs:
        row: dict[str, Any] = {k: getattr(r.info, k, None) for k in INFO}
        row.update({f"tags.{k}": v for k, v in r.data.tags.items()})
        row.update({f"params.{k}": v for k, v in r.data.params.items()})
        row.update({f"metrics.{k}": v for k, v in r.data.metrics.items()})
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else list(INFO))


def runs_frame(
    client: Any, experiment_ids: Sequence[str], filter_string: str = "", max_results: int = 5000
) -> pd.DataFrame:
    """``client.search_runs`` as a frame."""
    return frame_of(
        client.search_runs(list(experiment_ids), filter_string=filter_string, max_results=max_results)
    )


def children(client: Any, exp_id: str, parent: str) -> pd.DataFrame:
    """The child runs of ``parent`` (a study's cells and baselines)."""
    return runs_frame(client, [exp_id], f"tags.`mlflow.parentRunId` = '{parent}'")


def newest_finished(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per distinct value of the ``keys`` columns, the newest FINISHED run that has them all (of two started in the
    same millisecond, the first in the frame's order); sorted by ``keys``."""
    if frame.empty or any(k not in frame for k in keys):
        return frame.iloc[0:0]
    done = frame[(frame["status"] == "FINISHED") & frame[list(keys)].notna().all(axis=1)]
    newest = done.sort_values("start_time", ascending=False, kind="stable").groupby(list(keys)).head(1)
    return newest.sort_values(list(keys))


def value(row: Any, column: str, default: Any = None) -> Any:
    """A frame row's ``column``; ``default`` where the run has none (the frame holds NaN there)."""
    v = row.get(column)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def param(row: Any, key: str) -> float | None:
    """A numeric param of a frame row; None where unset, null or not a number."""
    try:
        return float(value(row, f"params.{key}"))
    except (TypeError, ValueError):
        return None


def metric_mean(client: Any, run_id: str, key: str) -> float | None:
    """Mean over steps of a metric's series; None when the run never logged it."""
    s = metric_series(client, run_id, key)
    return sum(s.values()) / len(s) if s else None


def metric_sum(client: Any, run_id: str, key: str) -> float:
    """Sum over steps of a metric's series (0 when the run never logged it)."""
    return float(sum(metric_series(client, run_id, key).values()))


__all__ = [
    "children",
    "frame_of",
    "metric_mean",
    "metric_series",
    "metric_sum",
    "newest_finished",
    "param",
    "runs_frame",
    "value",
]
