"""A training run's compute budget and learning curve (issue 29): when ``tracerl train`` stops (``stop.tokens``,
``stop.cpu_s``, ``steps``), when it evaluates on the token schedule (``eval_every_tokens``), the fixed subset of
held-out tasks its curve is measured on (``eval_subset``), and the per-run curve file ``<storage>/curve.jsonl``.

Pure functions and the file format; the driver (workflows/train/driver.py) calls them. Compute is counted for the
training rollouts and updates only: an evaluation's tokens, wall and CPU seconds are recorded beside its point and
never added to the totals a stop or the curve's x reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracerl import metrics as M
from tracerl.config import StopConfig

CURVE_FILE = "curve.jsonl"
"""One JSON line per evaluation of the run, in its storage directory (``out_dir/<run name>/``)."""


@dataclass(frozen=True)
class Totals:
    """The run's compute after ``updates`` steps (a resumed run carries them over from its checkpoint)."""

    generated_tokens: float = 0.0
    """Tokens the policy generated in the training rollouts (``total/generated_tokens``)."""
    leaves: float = 0.0
    """Leaves (finished rollouts) kept for training (``total/leaves``)."""
    updates: int = 0
    """Steps (policy updates) completed."""
    cpu_s: float = 0.0
    """CPU seconds of the trainer ranks, sampler actors and their env actors (``total/cpu_s``)."""
    wall_s: float = 0.0
    """Wall seconds of the steps (``total/wall_s``)."""

    def metrics(self) -> dict[str, float]:
        """The per-step running totals."""
        return {
            M.TOTAL_GENERATED_TOKENS: float(self.generated_tokens),
            M.TOTAL_LEAVES: float(self.leaves),
            M.TOTAL_CPU_S: float(self.cpu_s),
            M.TOTAL_WALL_S: float(self.wall_s),
        }


def stop_reason(stop: StopConfig, steps: int | None, totals: Totals) -> str | None:
    """Why the run ends after step ``totals.updates``: ``"tokens"`` or ``"cpu_s"`` (the total reached its
    ``stop`` limit), ``"steps"`` (the upper bound), the first of these that holds; None: the run goes on."""
    if stop.tokens is not None and totals.generated_tokens >= stop.tokens:
        return "tokens"
    if stop.cpu_s is not None and totals.cpu_s >= stop.cpu_s:
        return "cpu_s"
    if steps is not None and totals.updates >= steps:
        return "steps"
    return None


def overshoot(stop: StopConfig, totals: Totals) -> dict[str, float]:
    """How far the last step took each total past its limit (``stop/overshoot_*``; negative: a limit not reached,
    the run having stopped on another)."""
    out = {}
    if stop.tokens is not None:
        out[M.OVERSHOOT_TOKENS] = float(totals.generated_tokens - stop.tokens)
    if stop.cpu_s is not None:
        out[M.OVERSHOOT_CPU_S] = float(totals.cpu_s - stop.cpu_s)
    return out


def crosses(before: float, after: float, every: int) -> bool:
    """Whether a token total going from ``before`` to ``after`` passes a multiple of ``every`` (reaching one counts;
    ``every`` 0: never)."""
    return every > 0 and math.floor(after / every) > math.floor(before / every)


def token_eval_steps(totals: Sequence[float], every: int, start: float = 0.0) -> list[int]:
    """The steps (1-based, counted from the run's start or resume point ``start``) that evaluate on the token
    schedule, given the token total after each step: those whose step crosses a multiple of ``every``. A step that
    crosses several multiples evaluates once."""
    out, before = [], start
    for i, after in enumerate(totals, 1):
        if crosses(before, after, every):
            out.append(i)
        before = after
    return out


def eval_subset(n: int, k: int, seed: int) -> list[int]:
    """The indices (sorted) of the ``k`` held-out tasks of ``n`` the curve is measured on: drawn from ``seed``
    alone, so every evaluation of a run (and of a resumed one) and every run with that seed use the same tasks;
    ``k`` 0 or at least ``n``: all of them."""
    if k <= 0 or k >= n:
        return list(range(n))
    return sorted(int(i) for i in np.random.default_rng([seed, 29]).choice(n, size=k, replace=False))


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation on the learning curve (one line of ``curve.jsonl``)."""

    totals: Totals
    """The run's compute when it was taken (evaluation not counted)."""
    accuracy: float
    """Greedy accuracy over the curve's tasks (the subset: ``outcomes`` restricted to ``tasks``)."""
    tasks: list[str]
    """The curve's task ids (prompt ids), the same at every point."""
    outcomes: dict[str, float]
    """Prompt id -> greedy outcome (1 solved, 0 not) of every task this evaluation ran: the curve's tasks, or the
    whole held-out set (``full``)."""
    full: bool
    """Whether this evaluation ran the whole held-out set (the start, ``eval_every`` and the last)."""
    eval_cost: dict[str, float] = field(default_factory=dict)
    """The evaluation's own compute: ``generated_tokens``, ``wall_s``, ``cpu_s`` (not in ``totals``), and the
    wall-clock limits that fired in it: ``tool_timeouts``, ``grade_timeouts``."""
    attempt: int = 1
    """The attempt of the run that took it (``system/attempt``)."""

    def metrics(self) -> dict[str, float]:
        """The ``curve/`` metrics, logged at MLflow step = ``totals.generated_tokens``."""
        t = self.totals
        return {
            M.CURVE_ACCURACY: self.accuracy,
            M.CURVE_TASKS: float(len(self.tasks)),
            M.CURVE_LEAVES: float(t.leaves),
            M.CURVE_UPDATES: float(t.updates),
            M.CURVE_WALL_S: float(t.wall_s),
            M.CURVE_CPU_S: float(t.cpu_s),
        }

    def record(self) -> dict[str, Any]:
        return {
            **asdict(self.totals),
            "accuracy": self.accuracy,
            "full": self.full,
            "tasks": self.tasks,
            "outcomes": self.outcomes,
            "eval": self.eval_cost,
            "attempt": self.attempt,
        }


def curve_point(
    totals: Totals,
    outcomes: dict[str, float],
    tasks: Sequence[str],
    full: bool,
    eval_cost: dict[str, float],
    attempt: int = 1,
) -> CurvePoint:
    """The point of an evaluation whose per-task ``outcomes`` cover the curve's ``tasks``.

    Raises:
        ValueError: a curve task the evaluation did not run.
    """
    missing = [t for t in tasks if t not in outcomes]
    if missing:
        raise ValueError(f"the evaluation ran none of the curve's tasks {missing[:3]}")
    acc = sum(outcomes[t] for t in tasks) / len(tasks) if tasks else 0.0
    return CurvePoint(totals, acc, list(tasks), dict(outcomes), full, dict(eval_cost), attempt)


def append_point(storage: Path, point: CurvePoint) -> None:
    """Add ``point`` to the run's curve file."""
    with open(Path(storage) / CURVE_FILE, "a") as f:
        f.write(json.dumps(point.record()) + "\n")


def read_curve(path: Path | str) -> list[dict[str, Any]]:
    """The points of a curve file (a run's storage directory or the file), one per step: where a restarted or
    resumed run evaluated a step again, the line written last; ordered by step.

    Raises:
        ValueError: no curve file there, or a line that is not a point (says which).
    """
    path = Path(path)
    if path.is_dir():
        path = path / CURVE_FILE
    if not path.is_file():
        raise ValueError(f"no learning curve at {path}: a run writes it at its first evaluation")
    points: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            points[int(rec["updates"])] = rec
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n} is not a curve point ({type(exc).__name__}: {exc})") from exc
    return [points[k] for k in sorted(points)]


def curve_arrays(points: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """One run's points as rows of the learning-curve statistics' ``EvalCurves`` (the curves study, one of the
    experiments): x (generated tokens, shape (P,)) and the 0/1 outcomes on the curve's tasks (shape (P, T)); stack the
    runs (seeds) of an allocator for ``EvalCurves``.

    Raises:
        ValueError: no points, or points measured on different tasks.
    """
    if not points:
        raise ValueError("a curve needs at least one point")
    tasks = points[0]["tasks"]
    if any(p["tasks"] != tasks for p in points):
        raise ValueError("the curve's points were measured on different tasks (eval_subset or seed changed)")
    x = np.array([float(p["generated_tokens"]) for p in points])
    correct = np.array([[float(p["outcomes"][t]) for t in tasks] for p in points])
    return x, correct
