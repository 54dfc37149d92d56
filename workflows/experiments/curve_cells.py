"""A learning-curve study's cells (issue 29): every testbed sets ``stop_tokens``, so each cell stops on its total
generated tokens (train's ``stop.tokens``) instead of a step count and evaluates its held-out subset every
``eval_every_tokens`` (conf/study/curves.yaml). The grid (workflows/study/grid.py) adds these overrides to a cell's
train config, and after a cell finishes it keeps the cell's ``curve.jsonl`` as an MLflow artifact of the cell's run
(``curve/curve.jsonl``), so the report (workflows/experiments/curves_report.py) reads it even after ``runs_dir`` moved.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.train.budget import CURVE_FILE

CURVE_ARTIFACT_DIR = "curve"
"""Where a cell's curve file goes among its run's MLflow artifacts."""

EXPECTS = ("win", "loss", "tie")
"""A hypothesis's expected verdict of the decision rule (workflows/experiments/curves_report.py ``rule``)."""


def is_curve_study(cfg: StudyConfig) -> bool:
    """Whether the study's testbeds set ``stop_tokens`` (a learning-curve study, reported as curves.md)."""
    return any(tb.get("stop_tokens") is not None for tb in cfg.testbeds.values())


def check_curve_study(cfg: StudyConfig, where: str | Path = "the study config") -> None:
    """Raise one ValueError line naming the key when a curve study's settings do not fit together: every testbed
    or none sets stop_tokens, each with eval_every_tokens, both integers >= 1; hypotheses well formed."""
    if not is_curve_study(cfg):
        return
    for name, tb in cfg.testbeds.items():
        for key in ("stop_tokens", "eval_every_tokens"):
            v = tb.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(
                    f"{where}: testbeds.{name}.{key} must be an integer >= 1 in a learning-curve study (got "
                    f"{v!r}); every testbed sets stop_tokens and eval_every_tokens, or none does"
                )
    testbeds, allocators = set(cfg.testbeds), {str(a) for g in cfg.groups for a in g["allocators"]}
    for i, h in enumerate(cfg.hypotheses):
        need = {"claim", "allocator", "vs", "testbeds", "expect"}
        if not isinstance(h, Mapping) or not need <= set(h):
            raise ValueError(f"{where}: hypotheses[{i}] needs {', '.join(sorted(need))} (got {h!r})")
        if h["expect"] not in EXPECTS:
            raise ValueError(
                f"{where}: hypotheses[{i}].expect must be one of {EXPECTS} (got {h['expect']!r})"
            )
        bad = sorted({str(t) for t in h["testbeds"]} - testbeds) + sorted(
            {str(h["allocator"]), str(h["vs"])} - allocators
        )
        if bad:
            raise ValueError(f"{where}: hypotheses[{i}] names {bad}, not testbeds or allocators of the grid")


def eval_points(tb: Mapping[str, Any]) -> int:
    """Evaluation points a cell of testbed ``tb`` takes on its token schedule up to its budget (the last one, at the
    stop, evaluates every held-out task); the start point comes from the testbed's baseline."""
    return int(tb["stop_tokens"]) // int(tb["eval_every_tokens"])


def curve_overrides(cfg: StudyConfig, tb: Mapping[str, Any]) -> list[str]:
    """The train overrides of a curve cell: its token stop, its evaluation schedule and subset, no evaluation of
    every held-out task before the last (``eval_every=0``)."""
    if tb.get("stop_tokens") is None:
        return []
    return [
        f"stop.tokens={int(tb['stop_tokens'])}",
        f"eval_every_tokens={int(tb['eval_every_tokens'])}",
        f"eval_subset={cfg.eval_subset}",
        "eval_every=0",
    ]


def keep_curve(client: Any, summary: Mapping[str, Any]) -> bool:
    """Log the finished cell's ``<storage>/curve.jsonl`` as its run's artifact ``curve/curve.jsonl``; False when
    the run wrote none (a cell without a token schedule)."""
    storage, run_id = summary.get("storage"), summary.get("run_id")
    if not storage or not run_id or not (Path(storage) / CURVE_FILE).is_file():
        return False
    client.log_artifact(str(run_id), str(Path(storage) / CURVE_FILE), CURVE_ARTIFACT_DIR)
    return True
