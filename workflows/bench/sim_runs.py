"""Online allocation runs on the simulator: the engine of ``tracerl bench allocation``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tracerl.algos.allocators import build_allocator
from tracerl.calibration import CalibrationData, collect_calibration, summarize_calibration
from tracerl.engine.mc_scorer import with_monte_carlo
from tracerl.engine.step import StepOutcome, run_step
from tracerl.engine.step_stats import step_metrics
from tracerl.envs.simulator import Simulator, SimulatorConfig, with_noise_scale
from tracerl.experiment_config import BenchAllocationConfig
from tracerl.predictors import build_predictor
from tracerl.predictors.length import attach_lengths


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
    allocator = build_allocator(dataclasses.replace(cfg.allocator, name=name))
    attach_lengths(allocator)
    env = Simulator(with_noise_scale(cfg.env.settings(SimulatorConfig), noise_scale), seed=seed)
    predictor = build_predictor(cfg.predictor, seed=seed, name=allocator.predictor, targets=allocator.targets)
    predictor = with_monte_carlo(allocator, predictor, env)  # trace_mc: scored by extra simulator rollouts
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
