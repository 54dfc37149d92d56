"""The reports' one hierarchical bootstrap: resample seeds, then held-out tasks within each drawn seed.

A resampling is a ``Draws`` (which seed fills each slot of each replicate, how often each task is drawn there);
``replicate_means`` turns per-seed, per-task values into each replicate's mean, and ``interval`` reads an estimate's
percentile interval off the replicates. The learning curves (the curves study, one of the experiments) resample
whole curves with it; ``paired_difference`` is the study's paired difference of held-out accuracy
(workflows/study/report.py) and the curves report's final-accuracy difference.

Two draw orders, one resampling: ``draw`` draws all replicates at once (the curves); ``draw_in_turn`` draws replicate
after replicate, seeds then each slot's tasks, the order the study's published intervals were drawn in [choice:
kept so that docs/results/study.md and the curves report's final differences reproduce].
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Percentile = Literal["inverted_cdf", "linear"]
"""How a bound is read off the replicates (``bounds``)."""


@dataclass(frozen=True)
class Interval:
    """A statistic's estimate on the data and its bootstrap percentile interval."""

    estimate: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_json(self, scale: float = 1.0) -> dict[str, float | None]:
        """As JSON, each bound times ``scale`` (``None``: infinite or undefined, e.g. never reached)."""

        def f(v: float) -> float | None:
            return float(v * scale) if math.isfinite(v) else None

        return {"estimate": f(self.estimate), "low": f(self.low), "high": f(self.high)}


@dataclass(frozen=True)
class Draws:
    """One hierarchical bootstrap's resampling: which seeds each replicate draws, and how often each task."""

    seeds: np.ndarray
    """Seed drawn in each slot, shape (B, S)."""
    task_counts: np.ndarray
    """Times each task is drawn for each slot's seed, shape (B, S, T); a row sums to that seed's task count."""


def draw(seeds: int, tasks: int, samples: int, rng: np.random.Generator) -> Draws:
    """Resample ``seeds`` seeds with replacement, then ``tasks`` tasks with replacement within each drawn seed."""
    picks = rng.integers(0, seeds, size=(samples, seeds))
    counts = rng.multinomial(tasks, np.full(tasks, 1.0 / tasks), size=(samples, seeds))
    return Draws(picks, counts)


def draw_in_turn(tasks: Sequence[int], samples: int, rng: np.random.Generator) -> Draws:
    """As ``draw``, replicate by replicate: its seeds, then each slot's tasks (seed j has ``tasks[j]`` of them)."""
    n = len(tasks)
    picks = np.empty((samples, n), dtype=np.int64)
    counts = np.zeros((samples, n, max(tasks)), dtype=np.int64)
    for i in range(samples):
        picks[i] = rng.integers(0, n, n)
        for slot, j in enumerate(picks[i]):
            counts[i, slot, : tasks[j]] = np.bincount(rng.integers(0, tasks[j], tasks[j]), minlength=tasks[j])
    return Draws(picks, counts)


def replicate_means(per_task: Sequence[np.ndarray], draws: Draws) -> np.ndarray:
    """Each replicate's mean over its slots of the drawn tasks' mean value: ``per_task[s]`` holds seed s's values,
    shape (T_s, G) (G values per task, e.g. a curve's points). Returns shape (B, G)."""
    width = per_task[0].shape[1]
    slots = np.empty(draws.seeds.shape + (width,))
    for s, values in enumerate(per_task):
        mine = draws.seeds == s
        slots[mine] = draws.task_counts[mine][:, : values.shape[0]] @ values / values.shape[0]
    return slots.mean(axis=1)


def bounds(
    values: np.ndarray, level: float = 0.95, method: Percentile = "inverted_cdf"
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper ``level`` percentile bounds along axis 0, ignoring NaN.

    [choice] The curves take the inverted-CDF percentile (an order statistic, no interpolation): a replicate that
    never reaches the target (inf) cannot turn the bound into NaN. The paired difference interpolates ("linear").
    """
    alpha = (1.0 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: NaN bounds
        low = np.nanquantile(values, alpha, axis=0, method=method)
        high = np.nanquantile(values, 1.0 - alpha, axis=0, method=method)
    return np.asarray(low, float), np.asarray(high, float)


def interval(
    estimate: float, values: np.ndarray, level: float = 0.95, method: Percentile = "inverted_cdf"
) -> Interval:
    low, high = bounds(values, level, method)
    return Interval(float(estimate), float(low), float(high))


def paired_difference(
    a: Mapping[int, np.ndarray], b: Mapping[int, np.ndarray], samples: int = 2000, seed: int = 0
) -> Interval:
    """Paired difference mean(a - b) over the seeds both hold (per seed the mean over tasks of a task-aligned
    outcome difference) and its 95 % percentile interval: resample seeds, then tasks within each drawn seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed common to both allocators: nothing to pair")
    diffs = [np.asarray(a[s], float) - np.asarray(b[s], float) for s in seeds]
    for s, d in zip(seeds, diffs):
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"seed {s}: per-task outcomes must be equal-length non-empty vectors")
    observed = float(np.mean([d.mean() for d in diffs]))
    draws = draw_in_turn([d.size for d in diffs], samples, np.random.default_rng(seed))
    reps = replicate_means([d[:, None] for d in diffs], draws)[:, 0]
    return interval(observed, reps, method="linear")


__all__ = [
    "Draws",
    "Interval",
    "bounds",
    "draw",
    "draw_in_turn",
    "interval",
    "paired_difference",
    "replicate_means",
]
