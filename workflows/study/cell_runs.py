"""The study's cells read back from MLflow: per cell its newest FINISHED child run of the study's parent, off the run
frame (workflows/tracking/frame.py), as a ``StudyCell`` (``collect``); a run's last per-task evaluation outcomes
(``run_outcomes``). The study's report (workflows/study/report.py) and the learning-curve report read them here."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.workflows.study.baseline import baseline_accuracy, finished_baselines
from tracerl.workflows.tracking import frame
from tracerl.workflows.tracking.runs import run_summary

CELL_KEYS = tuple(f"tags.tracerl.study.{k}" for k in ("testbed", "budget", "allocator", "seed"))
"""The frame columns naming a cell."""
NOT_IN_JSON = {"json": False}
"""Metadata of a ``StudyCell`` field that study.json leaves out."""


@dataclass(frozen=True)
class StudyCell:
    """One cell of the study: its newest FINISHED child run, read back from MLflow. study.json holds the fields
    up to ``cpu_s`` (``FIELDS``), the schema of issue 15."""

    testbed: str
    budget: str
    allocator: str
    seed: int
    run_id: str
    steps: int
    acc_before: float
    acc_after: float
    effective_ratio: float
    prefix_group_er: float | None
    mixed_groups_per_step: float
    leaves: int
    generated_tokens: int
    tokens_per_step: float
    wall_s: float
    cpu_s: float
    token_budget: float | None = field(metadata=NOT_IN_JSON)
    """T of a token cell (None in leaves mode)."""
    tokens_vs_budget: float | None = field(metadata=NOT_IN_JSON)
    """Realised tokens per step over T, minus 1."""
    tool_calls: int = field(metadata=NOT_IN_JSON)
    step_s: float | None = field(metadata=NOT_IN_JSON)
    outcomes: dict[str, float] | None = field(metadata=NOT_IN_JSON)
    """The last evaluation's per-task outcomes (None: none logged)."""
    git_sha: str = field(default="unknown", metadata=NOT_IN_JSON)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FIELDS}


FIELDS = tuple(f.name for f in fields(StudyCell) if f.metadata.get("json", True))
"""A cell's fields in study.json."""


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


def newest_finished(client: Any, exp_id: str, parent: str) -> list[tuple[tuple[str, str, str, int], Any]]:
    """((testbed, budget, allocator, seed), frame row) of each cell's newest FINISHED child run of the study's
    parent run, in key order."""
    rows = frame.newest_finished(frame.children(client, exp_id, parent), CELL_KEYS)
    keyed = [
        ((r[CELL_KEYS[0]], r[CELL_KEYS[1]], r[CELL_KEYS[2]], int(r[CELL_KEYS[3]])), r)
        for _, r in rows.iterrows()
    ]
    return sorted(keyed, key=lambda kr: kr[0])


def collect(client: Any, exp_id: str, parent: str, tracking: Any) -> list[StudyCell]:
    """One ``StudyCell`` per cell (its newest FINISHED child run)."""
    before = {
        tb: baseline_accuracy(client, rid) for tb, rid in finished_baselines(client, exp_id, parent).items()
    }
    cells = []
    for (tb, budget, alloc, seed), r in newest_finished(client, exp_id, parent):
        rid = str(r["run_id"])
        s = run_summary(rid, tracking)
        steps = int(s.get("steps", 0))
        t_raw = frame.param(r, "budget.token_budget")
        target = t_raw if budget == "tokens" else None
        per_step = s["generated_tokens"] / steps if steps else 0.0
        end = frame.value(r, "end_time")
        own_start = float(frame.metric_series(client, rid, M.EVAL_ACCURACY).get(0, math.nan))
        cells.append(
            StudyCell(
                testbed=tb,
                budget=budget,
                allocator=alloc,
                seed=seed,
                run_id=rid,
                steps=steps,
                # the testbed's baseline; a cell's own step-0 evaluation in studies from before the baseline runs
                acc_before=before.get(tb, own_start),
                acc_after=float(s.get("acc_after", math.nan)),
                effective_ratio=float(s["effective_ratio"]),
                prefix_group_er=frame.metric_mean(client, rid, M.PREFIX_GROUP_ER),
                mixed_groups_per_step=float(frame.metric_mean(client, rid, M.MIXED_GROUPS) or 0.0),
                leaves=int(s["leaves"]),
                generated_tokens=int(s["generated_tokens"]),
                tokens_per_step=per_step,
                token_budget=target,
                tokens_vs_budget=per_step / target - 1.0 if target else None,
                wall_s=float((end - r["start_time"]) / 1000 if end else 0.0),
                cpu_s=frame.metric_sum(client, rid, M.CPU_S),
                tool_calls=int(s["tool_calls"]),
                step_s=frame.metric_mean(client, rid, M.TIME_STEP),
                outcomes=run_outcomes(client, rid),
                git_sha=str(frame.value(r, "tags.tracerl.git_sha")),
            )
        )
    return cells


__all__ = ["CELL_KEYS", "FIELDS", "StudyCell", "collect", "newest_finished", "run_outcomes"]
