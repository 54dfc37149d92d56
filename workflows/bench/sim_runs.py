"""Online allocation runs on the simulator: the engine of ``tracerl bench allocation`` (the simulator experiments,
``bench targets`` and ``bench baseline``, run it too)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracerl.calibration import CalibrationData, collect_calibration, summarize_calibration
from tracerl.engine.allocation import build_allocation
from tracerl.engine.step import StepOutcome, run_step
from tracerl.engine.step_stats import step_metrics
from tracerl.envs.simulator import Simulator, SimulatorConfig, with_noise_scale
from tracerl.workflows.bench.config import BenchAllocationConfig


@dataclass
class RunResult:
    """One allocator x seed run: per-step metrics and post-warm-up predictor calibration."""

    allocator: str
    seed: int
    noise: float
    steps: list[dict[str, float]]
    calibration: dict[str, dict[str, float]]


def run_allocator(
    cfg: BenchAllocationConfig,
    name: str,
    seed: int,
    noise_scale: float = 1.0,
    on_step: Callable[[int, StepOutcome], None] | None = None,
) -> RunResult:
    """S steps of allocator ``name`` on a fresh simulator and predictor, the predictor learning online.

    The simulator's pools and drift depend on the seed only, so every allocator sees the same prompts.
    ``on_step(step, outcome)`` sees each step's finished trees before the predictor fits on them.
    """
    env = Simulator(with_noise_scale(cfg.env.settings(SimulatorConfig), noise_scale), seed=seed)
    # trace_mc: scored by extra simulator rollouts
    allocator, predictor = build_allocation(
        dataclasses.replace(cfg.allocator, name=name), cfg.predictor, seed, env
    )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    warm = int(cfg.steps * cfg.warmup_fraction)
    steps, calib = [], CalibrationData()
    for s in range(cfg.steps):
        pool = env.sample_pool(cfg.budget.num_candidates)
        out = run_step(pool, allocator, predictor, env, cfg.budget, rng)
        metrics = step_metrics(out)
        if on_step is not None:
            on_step(s, out)
        if s >= warm:
            collect_calibration(out, calib)
        predictor.fit(out.sampled_trees)
        allocator.observe(out.sampled_trees)
        env.advance()
        steps.append(metrics)
    return RunResult(name, seed, noise_scale, steps, summarize_calibration(calib))
