"""The part of ``tracerl bench pipeline`` that needs the update: ``train_modes`` compared in real ``tracerl train``
runs (``train_steps`` steps each, seeds interleaved, the modes' order alternating by seed).

Overlap (``pipeline.overlap``) runs the next step's bare rollouts beside the update, so it can only be measured
with one. Each (mode, seed) is a ``train`` run on the bench's config (the embedded default) without held-out
evaluation except the final one, one checkpoint at the end; per step the metrics it logged. The first step (actor
start-up, no previous update to overlap) and the last (the final evaluation and checkpoint) are not measured.
Modes: ``barrier``, ``streaming`` (``pipeline.mode``) and ``overlap`` (streaming plus ``pipeline.overlap``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrackingConfig, TrainConfig
from tracerl.workflows.pipeline.config import BenchPipelineConfig
from tracerl.workflows.tracking.runs import metric_series
from tracerl.workflows.train.run import train

STEP_KEYS = {
    "step_s": M.TIME_STEP,
    "rollout_s": M.TIME_ROLLOUT,
    "update_s": M.phase_time("update_policy"),
    "wait_s": M.phase_time("wait_rollouts"),
    "overlapped_s": M.TIME_OVERLAPPED,
    "generated_tokens": M.GENERATED_TOKENS,
    "staleness_mean": M.STALENESS_MEAN,
}
KEYS = ("step_s", "rollout_s", "update_s", "busy", "occupancy", "generated_tokens", "staleness_mean")


def train_config(cfg: BenchPipelineConfig, mode: str, seed: int, stamp: str) -> TrainConfig:
    """The bench's training setup for one (mode, seed) run."""
    out = Path(cfg.bench_out).resolve()
    pipeline = dataclasses.replace(
        cfg.train.pipeline, mode="barrier" if mode == "barrier" else "streaming", overlap=mode == "overlap"
    )
    return dataclasses.replace(
        cfg.train,
        pipeline=pipeline,
        steps=cfg.train_steps,
        seed=seed,
        eval_every=0,
        eval_at_start=False,
        checkpoint_every=cfg.train_steps,
        log_trees_every=0,
        tracking=TrackingConfig(
            uri=f"sqlite:///{out}/mlruns.db", artifact_location=str(out / "mlartifacts"), experiment="bench"
        ),
        out_dir=str(out / "runs"),
        run_name=f"pipeline-{mode}-s{seed}-{stamp}",
    )


def run_train_modes(cfg: BenchPipelineConfig, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every (seed, mode) train run: per measured step its measurements."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = []
    for k in range(cfg.seeds):
        seed = cfg.train.seed + k
        for mode in cfg.train_modes[:: 1 if k % 2 == 0 else -1]:
            tc = train_config(cfg, mode, seed, stamp)
            progress(f"== train {mode}, seed {seed}: {tc.steps} steps")
            s = train(tc, progress=progress)
            steps = step_measurements(s["run_id"], tc)
            runs.append({"mode": mode, "seed": seed, "run_id": s["run_id"], "steps": steps})
            progress(
                f"   {mode} seed {seed}: "
                f"{statistics.fmean(x['step_s'] for x in steps):.2f} s a step (steps 2..{tc.num_steps - 1})"
            )
    return runs


def step_measurements(run_id: str, tc: TrainConfig) -> list[dict[str, float]]:
    """Steps 2 .. steps-1 of a finished run, from its metrics: the bench's per-step record."""
    import mlflow  # slow to import: mlflow

    client = mlflow.MlflowClient(tc.tracking.uri)
    series = {k: metric_series(client, run_id, name) for k, name in STEP_KEYS.items()}
    busy = metric_series(client, run_id, M.SAMPLER_BUSY_S)
    rows, iters = metric_series(client, run_id, M.DECODE_ROWS), metric_series(client, run_id, M.DECODE_STEPS)
    out = []
    for s in range(2, tc.num_steps):
        m = {k: v.get(s, 0.0) for k, v in series.items()}
        m["busy"] = busy.get(s, 0.0) / (tc.pools.rollout_workers * m["step_s"]) if m["step_s"] else 0.0
        m["occupancy"] = rows.get(s, 0.0) / iters[s] if iters.get(s) else 0.0
        m["step"] = float(s)
        out.append(m)
    return out


def mode_means(runs: list[dict[str, Any]], modes: list[Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Per mode the mean over seeds of each run's mean step, for ``keys`` (generated tokens rounded)."""
    out: dict[str, Any] = {}
    for mode in modes:
        per_seed = [r["steps"] for r in runs if r["mode"] == mode]
        out[mode] = {
            k: statistics.fmean(statistics.fmean(s[k] for s in steps) for steps in per_seed) for k in keys
        }
        out[mode]["generated_tokens"] = int(round(out[mode]["generated_tokens"]))
    return out


def summarize_train(cfg: BenchPipelineConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per train mode the mean over seeds of each run's mean measured step."""
    return mode_means(runs, list(cfg.train_modes), KEYS)


def format_train(train: dict[str, Any], steps: int) -> list[str]:
    lines = [
        f"with the update (tracerl train, steps 2..{steps - 1} of {steps}):",
        f"{'mode':<10} {'step s':>7} {'rollout s':>9} {'update s':>8} {'busy':>5} {'occupancy':>9} "
        f"{'gen tokens':>10} {'staleness':>9}",
    ]
    for mode, m in train.items():
        lines.append(
            f"{mode:<10} {m['step_s']:>7.2f} {m['rollout_s']:>9.2f} {m['update_s']:>8.2f} {m['busy']:>5.2f} "
            f"{m['occupancy']:>9.2f} {m['generated_tokens']:>10d} {m['staleness_mean']:>9.3f}"
        )
    if "barrier" in train:
        for mode in train:
            if mode != "barrier":
                lines.append(
                    f"{mode} / barrier step time: {train[mode]['step_s'] / train['barrier']['step_s']:.3f}"
                )
    return lines
