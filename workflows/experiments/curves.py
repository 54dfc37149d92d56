"""Compute-matched learning curves (issue 29): time to a target accuracy, normalised area, a hierarchical bootstrap
over seeds and held-out tasks. Pure numpy (no MLflow, no Ray): the curves report (workflows/experiments/curves_report.py)
hands it arrays; ScaleRL's saturating fit is in workflows/experiments/sigmoid.py.

A curve is held-out accuracy y at evaluation points x (generated tokens, or any compute measure), x strictly
increasing. [choice] Between points the curve is linear; before its first point it is held at its first value and
after its last point at its last value (a run is taken to stay where it was last measured), both for the area and
for putting seeds with different evaluation points on one grid.

The bootstrap (seeds, then tasks) is workflows/study/bootstrap.py's. Statistics of a set of runs (``EvalCurves``: per seed its points x and per task 0/1 correctness at each point) are
read off its mean curve: the seeds' curves put on a common grid (the union of their points) and averaged.
[choice] Tokens to target is that of the mean curve, not the mean of per-seed times (a seed that never reaches the
target would make the latter infinite).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracerl.workflows.study.bootstrap import Draws, Interval, bounds, draw, interval, replicate_means

# -- one curve -----------------------------------------------------------------------------------------------


def _check_points(x: np.ndarray, y: np.ndarray) -> None:
    """Raise ValueError unless x is a non-empty, strictly increasing vector and y's last axis matches it."""
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"evaluation points must be a non-empty vector (got shape {x.shape})")
    if y.shape[-1] != x.size:
        raise ValueError(f"{x.size} evaluation points but {y.shape[-1]} values per curve")
    if not np.all(np.diff(x) > 0):
        raise ValueError("evaluation points must be strictly increasing")


def first_crossing(x: np.ndarray, y: np.ndarray, target: float | np.ndarray) -> np.ndarray:
    """Vectorised ``tokens_to_target``: curves y, shape (N, P), on shared points x, shape (P,); target scalar or (N,).

    Returns:
        shape (N,): the first x at which each curve reaches its target (``inf`` where it never does).
    """
    x = np.asarray(x, dtype=float)
    y = np.atleast_2d(np.asarray(y, dtype=float))
    _check_points(x, y)
    tgt = np.broadcast_to(np.asarray(target, dtype=float), y.shape[:1])
    reached = y >= tgt[:, None]
    k = np.argmax(reached, axis=1)  # first point at or above the target
    rows = np.arange(y.shape[0])
    lo = np.maximum(k - 1, 0)
    y0, y1 = y[rows, lo], y[rows, k]
    # k > 0: y0 < target <= y1, so y1 > y0 and the interpolation is well defined.
    frac = np.where(k > 0, (tgt - y0) / np.where(k > 0, y1 - y0, 1.0), 0.0)
    at = x[lo] + frac * (x[k] - x[lo])
    return np.where(reached.any(axis=1), at, np.inf)


def tokens_to_target(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """The first x at which the piecewise-linear curve y(x) reaches ``target``; ``math.inf`` if it never does.

    A curve that starts at or above the target reaches it at its first point.
    """
    return float(first_crossing(np.asarray(x, float), np.asarray(y, float)[None, :], target)[0])


def interp_matrix(at: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The linear map from a curve's values at points x, shape (P,), to its values at ``at``, shape (Q,): (Q, P).

    Linear between points, held at the end values outside them (as ``np.interp``); curves are rows, so
    ``values_at = values @ interp_matrix(at, x).T``.
    """
    x = np.asarray(x, dtype=float)
    at = np.asarray(at, dtype=float)
    out = np.zeros((at.size, x.size))
    if x.size == 1:
        out[:, 0] = 1.0
        return out
    left = np.clip(np.searchsorted(x, at, side="right") - 1, 0, x.size - 2)
    w = np.clip((at - x[left]) / (x[left + 1] - x[left]), 0.0, 1.0)
    rows = np.arange(at.size)
    out[rows, left] = 1.0 - w
    out[rows, left + 1] += w
    return out


def auc_batch(x: np.ndarray, y: np.ndarray, budget: float) -> np.ndarray:
    """Vectorised ``normalised_auc``: curves y, shape (N, P), on shared points x, shape (P,). Returns (N,)."""
    x = np.asarray(x, dtype=float)
    y = np.atleast_2d(np.asarray(y, dtype=float))
    _check_points(x, y)
    if not budget > 0:
        raise ValueError(f"the compute budget must be > 0 (got {budget})")
    knots = np.unique(np.concatenate([[0.0, budget], x[(x > 0) & (x < budget)]]))
    values = y @ interp_matrix(knots, x).T  # exact: the curve is linear between consecutive knots
    widths = np.diff(knots)
    return ((values[:, 1:] + values[:, :-1]) / 2 * widths).sum(axis=1) / budget


def normalised_auc(x: np.ndarray, y: np.ndarray, budget: float) -> float:
    """Trapezoid area under y over [0, budget], divided by budget: the curve's mean accuracy over that compute.

    The curve is held at its first value from 0 to its first point and at its last value from its last point up to
    the budget (module docstring); a budget inside the points cuts the curve there. A constant c gives c.
    """
    return float(auc_batch(np.asarray(x, float), np.asarray(y, float)[None, :], budget)[0])


def target_accuracy(start: float, baseline_final: float, frac: float = 0.9) -> float:
    """The accuracy a run must reach: ``frac`` of the way from ``start`` to the baseline's final accuracy."""
    return start + frac * (baseline_final - start)


# -- runs: seeds x evaluation points x tasks -----------------------------------------------------------------


@dataclass(frozen=True)
class EvalCurves:
    """One allocator's runs: per seed its evaluation points and per held-out task its 0/1 correctness at each."""

    x: np.ndarray
    """Evaluation points per seed, shape (S, P), each row strictly increasing (e.g. generated tokens so far)."""
    correct: np.ndarray
    """Correctness, shape (S, P, T): seed, evaluation point, task; values in {0, 1} (or a score in [0, 1])."""

    def __post_init__(self) -> None:
        x, c = np.asarray(self.x, dtype=float), np.asarray(self.correct, dtype=float)
        if x.ndim != 2 or c.ndim != 3 or c.shape[:2] != x.shape or 0 in c.shape:
            raise ValueError(
                f"need x of shape (seeds, points) and correct of shape (seeds, points, tasks), non-empty "
                f"(got {x.shape} and {c.shape})"
            )
        for row in x:
            _check_points(row, row)
        if np.isnan(c).any() or (c < 0).any() or (c > 1).any():
            raise ValueError("correctness must lie in [0, 1]")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "correct", c)

    @property
    def seeds(self) -> int:
        return int(self.x.shape[0])

    @property
    def tasks(self) -> int:
        return int(self.correct.shape[2])

    def grid(self) -> np.ndarray:
        """The union of the seeds' evaluation points: the mean curve's points."""
        return np.unique(self.x)

    def task_curves(self, grid: np.ndarray) -> np.ndarray:
        """Each seed's per-task curves on ``grid``, shape (S, T, G): what a draw of tasks averages."""
        return np.stack([self.correct[s].T @ interp_matrix(grid, self.x[s]).T for s in range(self.seeds)])

    def mean_curve(self, grid: np.ndarray | None = None) -> np.ndarray:
        """The mean over seeds of the seeds' accuracy curves on ``grid`` (default ``self.grid()``), shape (G,)."""
        g = self.grid() if grid is None else np.asarray(grid, float)
        return self.task_curves(g).mean(axis=(0, 1))


@dataclass(frozen=True)
class CurveStats:
    """One allocator's mean curve with its band, and the derived statistics with intervals."""

    grid: np.ndarray
    """The mean curve's points, shape (G,)."""
    mean: np.ndarray
    """The mean curve on the data, shape (G,)."""
    low: np.ndarray
    """Lower band, shape (G,)."""
    high: np.ndarray
    """Upper band, shape (G,)."""
    tokens_to_target: Interval
    """First x at which the mean curve reaches the target (inf: never)."""
    auc: Interval
    """Normalised area of the mean curve over [0, budget]."""
    reached: float
    """Fraction of replicates whose mean curve reaches the target."""


def _stats(
    curves: EvalCurves, draws: Draws, target: float, budget: float, level: float
) -> tuple[CurveStats, np.ndarray, np.ndarray]:
    """The curve's statistics, plus the replicates' tokens to target and areas, shape (B,) each."""
    grid = curves.grid()
    mean = curves.mean_curve(grid)
    reps = replicate_means(list(curves.task_curves(grid)), draws)
    low, high = bounds(reps, level)
    t_reps, a_reps = first_crossing(grid, reps, target), auc_batch(grid, reps, budget)
    stats = CurveStats(
        grid=grid,
        mean=mean,
        low=low,
        high=high,
        tokens_to_target=interval(tokens_to_target(grid, mean, target), t_reps, level),
        auc=interval(normalised_auc(grid, mean, budget), a_reps, level),
        reached=float(np.isfinite(t_reps).mean()),
    )
    return stats, t_reps, a_reps


def bootstrap_curve(
    curves: EvalCurves,
    target: float,
    budget: float | None = None,
    samples: int = 2000,
    rng: np.random.Generator | None = None,
    level: float = 0.95,
) -> CurveStats:
    """Mean curve, its pointwise ``level`` band and intervals for tokens to ``target`` and the area up to ``budget``
    (default: the last evaluation point), by a hierarchical bootstrap: seeds, then tasks within each drawn seed."""
    gen = np.random.default_rng(0) if rng is None else rng
    draws = draw(curves.seeds, curves.tasks, samples, gen)
    horizon = float(curves.grid()[-1]) if budget is None else budget
    return _stats(curves, draws, target, horizon, level)[0]


@dataclass(frozen=True)
class Comparison:
    """An allocator's learning curve against a baseline's, at one target and one compute budget."""

    allocator: CurveStats
    baseline: CurveStats
    target: float
    """The accuracy both must reach (``target_accuracy`` of the baseline unless given)."""
    budget: float
    """The compute over which the areas are taken."""
    ratio: Interval
    """Tokens to target of the allocator over the baseline's: 0.5 reaches it with half the compute. A replicate
    where only the allocator reaches it counts 0, where only the baseline does inf, where neither is left out."""
    auc_difference: Interval
    """Normalised area of the allocator minus the baseline's."""
    paired: bool
    """Whether both were resampled with the same seed and task draws."""


def _ratio(t_a: np.ndarray | float, t_b: np.ndarray | float) -> np.ndarray:
    """t_a / t_b, with x / inf = 0 for finite x, inf / inf = NaN (neither reaches the target)."""
    a, b = np.asarray(t_a, float), np.asarray(t_b, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isinf(b), np.where(np.isinf(a), np.nan, 0.0), a / b)


def compare_curves(
    curves: EvalCurves,
    baseline: EvalCurves,
    target: float | None = None,
    budget: float | None = None,
    frac: float = 0.9,
    samples: int = 2000,
    rng: np.random.Generator | None = None,
    paired: bool = True,
    level: float = 0.95,
) -> Comparison:
    """Compare an allocator's runs with a baseline's: tokens-to-target ratio and area difference, with intervals.

    Args:
        target: accuracy to reach; [choice] default ``target_accuracy(start, final, frac)`` of the baseline's mean
            curve (its first and last points: both allocators start from the same policy), fixed across replicates.
        budget: compute for the areas; default the smaller of the two curves' last points.
        paired: [choice] by default resample both with the same draws (seed j of one with seed j of the other, task t with task t), as
            the study pairs seeds; needs equal seed and task counts. False: independent draws.
        rng: the bootstrap's generator (default seed 0).
    """
    gen = np.random.default_rng(0) if rng is None else rng
    base_mean = baseline.mean_curve()
    tgt = target_accuracy(float(base_mean[0]), float(base_mean[-1]), frac) if target is None else target
    horizon = min(float(curves.grid()[-1]), float(baseline.grid()[-1])) if budget is None else budget
    if paired:
        if (curves.seeds, curves.tasks) != (baseline.seeds, baseline.tasks):
            raise ValueError(
                f"paired comparison needs equal seeds and tasks (got {curves.seeds} x {curves.tasks} and "
                f"{baseline.seeds} x {baseline.tasks}); pass paired=False"
            )
        draws_a = draws_b = draw(curves.seeds, curves.tasks, samples, gen)
    else:
        draws_a = draw(curves.seeds, curves.tasks, samples, gen)
        draws_b = draw(baseline.seeds, baseline.tasks, samples, gen)
    a, t_a, auc_a = _stats(curves, draws_a, tgt, horizon, level)
    b, t_b, auc_b = _stats(baseline, draws_b, tgt, horizon, level)
    ratio = interval(
        float(_ratio(a.tokens_to_target.estimate, b.tokens_to_target.estimate)), _ratio(t_a, t_b), level
    )
    diff = interval(a.auc.estimate - b.auc.estimate, auc_a - auc_b, level)
    return Comparison(a, b, tgt, horizon, ratio, diff, paired)
