"""``tracerl bench pipeline``: barrier vs streaming steps (``pipeline.mode``) on the training setup.

The sampler actors of ``tracerl train`` (conf/bench/pipeline.yaml: the embedded default, 2 hf sampler actors, the
tiny policy, equal leaves) run ``steps`` allocation-and-rollout steps per (seed, mode) with the policy frozen,
seeds interleaved (seed s in every mode, then seed s + 1; the modes' order alternates by seed) on one pool after
``warmup_steps`` unmeasured steps, the predictor learning online in each run.
Per step: the step's wall time, its rollout phase, the samplers' busy fraction (seconds they spent generating, as
measured by each sampler actor, over actors x step wall), their mean batch occupancy (rows that produced a token
per decode forward, measured by the samplers), generated tokens, and ``same_allocation`` (the barrier's Stage 2
re-run on the step's own bare trees and scores places the same continuations). ``batchings`` (``--batching
rounds,join``) runs every mode also with the samplers' per-token join (``sampler.join``, switched on the same
actors) and pairs the two by seed (``join_vs_rounds``). Modes that need the update
(overlap) are compared in ``tracerl train`` runs (``train_steps``, ``train_modes``; workflows/pipeline/bench_train.py).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.actors.spec import WorkerSpec
from tracerl.config import PipelineMode
from tracerl.engine.allocation import build_allocation
from tracerl.engine.react import make_template
from tracerl.engine.step import same_allocation
from tracerl.engine.stepper import Stepper
from tracerl.engine.timer import PhaseTimer
from tracerl.envs.registry import check_data, tool_env_class
from tracerl.models.hf import load_policy
from tracerl.workflows.ops.ray_utils import init_ray
from tracerl.workflows.pipeline.bench_train import format_train, mode_means, run_train_modes, summarize_train
from tracerl.workflows.pipeline.config import BenchPipelineConfig

KEYS = ("step_s", "rollout_s", "busy", "occupancy", "generated_tokens")
IN_TRAIN = {
    "status": "measured with the update",
    "see": "train (tracerl train runs: overlap against barrier there)",
}


def run_pipeline_bench(
    cfg: BenchPipelineConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    check_data(cfg.train.env)
    init_ray(cfg.train.cluster)
    runs = run_frozen_modes(cfg, progress) if cfg.modes else []
    train_runs = run_train_modes(cfg, progress) if cfg.train_steps else []  # the pool's CPUs are free again
    summary = summarize(cfg, runs)
    if train_runs:
        summary["train"] = summarize_train(cfg, train_runs)
        if (
            "overlap" in summary["train"]
        ):  # the cpu.overlap: from steps with the update, beside train.barrier
            summary["cpu"]["overlap"] = {**summary["train"]["overlap"], "measured_in": "train"}
        summary["train_runs"] = train_runs
        summary["config"]["train_steps"] = cfg.train_steps
    out = Path(cfg.bench_out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    if cfg.json_path:
        path = Path(cfg.json_path)
        kept = json.loads(path.read_text()) if path.is_file() else {}  # the scale model's "sim" part stays
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**kept, **summary}, indent=2))
    return summary


def run_frozen_modes(cfg: BenchPipelineConfig, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every (seed, mode) of ``modes`` on one sampler pool, the policy frozen."""
    pool = bench_pool(cfg)
    policy = load_policy(cfg.train.model)  # the predictor's features (the samplers load their own copy)
    runs: list[dict[str, Any]] = []
    combos = [(mode, b) for mode in cfg.modes for b in cfg.batchings]
    try:
        if cfg.warmup_steps:
            for b in cfg.batchings:
                progress(f"warm-up ({b}): {cfg.warmup_steps} unmeasured steps")
                set_batching(pool, b)
                run_one(
                    cfg, pool, policy, cfg.modes[0], cfg.train.seed + cfg.seeds, progress, cfg.warmup_steps
                )
        for k in range(cfg.seeds):
            seed = cfg.train.seed + k
            for mode, b in combos[:: 1 if k % 2 == 0 else -1]:  # alternate which mode runs first
                set_batching(pool, b)
                steps = run_one(cfg, pool, policy, mode, seed, progress, cfg.train.num_steps, label(mode, b))
                runs.append({"mode": label(mode, b), "seed": seed, "steps": steps})
    finally:
        pool.shutdown()
    return runs


def bench_pool(cfg: BenchPipelineConfig, pool_class: Any = None) -> Any:
    """The bench's sampler pool (``cfg.train.pools``: its actors, their environment actors), seeded with
    ``cfg.train.seed``; ``pool_class``: a ``RolloutPool`` subclass (workflows/experiments/pipeline_pool.py times its actors)."""
    from tracerl.actors.pools import RolloutPool  # slow to import: ray

    p = cfg.train.pools
    spec = WorkerSpec(cfg.train.model, cfg.train.sampler, cfg.train.env, p)
    return (pool_class or RolloutPool)(
        spec,
        p.rollout_workers,
        p.rollout_cpus,
        p.rollout_gpus,
        p.max_retries,
        cfg.train.seed,
        cfg.train.pipeline.reencode_queue,
    )


def label(mode: str, batching: str) -> str:
    """A run's name in the summary: the pipeline mode, with ``+join`` when the samplers join per token."""
    return mode if batching == "rounds" else f"{mode}+{batching}"


def set_batching(pool: Any, batching: str) -> None:
    """Every sampler actor of ``pool`` batches by ``batching`` from its next call (``sampler.join``)."""
    import ray  # slow to import: ray

    ray.get([w.set_join.remote(batching == "join") for w in pool.workers])


def run_one(
    cfg: BenchPipelineConfig,
    pool: Any,
    policy: tuple[Any, Any],
    mode: PipelineMode,
    seed: int,
    progress: Callable[[str], None],
    num_steps: int,
    name: str = "",
) -> list[dict[str, Any]]:
    """``num_steps`` steps of one (mode, seed) on ``pool``: per step its measurements."""
    from tracerl.workflows.lm.stack import task_prompts, text_features  # slow to import: torch, transformers

    tok, model = policy
    template = make_template(cfg.train.model.template, tok, cfg.train.model.system_prompt)
    tools = list(tool_env_class(cfg.train.env.name).tools)
    features = text_features(cfg.train.predictor, model, tok, lambda q: template.prompt(q, tools))
    allocator, predictor = build_allocation(cfg.train.allocator, cfg.train.predictor, seed, pool, features)
    prompts = task_prompts(cfg.train.env)
    rng = np.random.default_rng(seed)
    pool.seed = seed
    steps = []
    stepper = Stepper(prompts, allocator, predictor, pool, rng, mode)
    for s in range(num_steps):
        timer = PhaseTimer()
        t0 = time.perf_counter()
        out = stepper.run(s, cfg.train.budget, timer)
        wall = time.perf_counter() - t0
        led = pool.ledger
        m = {
            "step_s": wall,
            "rollout_s": timer.seconds.get("rollout", 0.0),
            "busy": led.sampler_busy_s / (len(pool.workers) * wall),
            "occupancy": led.decode_rows / led.decode_steps if led.decode_steps else 0.0,
            "generated_tokens": led.generated_tokens,
            "same_allocation": same_allocation(out, allocator),
            "leaves": sum(t.num_leaves for t in out.trees),
            "kv_reencoded_continuations": led.kv_reencoded_continuations,
        }
        steps.append(m)
        predictor.fit(out.sampled_trees)
        allocator.observe(out.sampled_trees)
        progress(
            f"  {name or mode} seed {seed} step {s}: {wall:.1f} s (rollout {m['rollout_s']:.1f} s), busy {m['busy']:.2f}, "
            f"occupancy {m['occupancy']:.1f}, {m['generated_tokens']} tokens, same allocation {m['same_allocation']}"
        )
    return steps


def summarize(cfg: BenchPipelineConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's "cpu" part: per mode the mean over seeds of each run's mean step; ``same_allocation`` over every
    streaming step."""
    labels = [label(m, b) for m in cfg.modes for b in cfg.batchings]
    cpu: dict[str, Any] = mode_means(runs, labels, KEYS)
    cpu.setdefault("overlap", IN_TRAIN)
    cpu["same_allocation"] = all(s["same_allocation"] for r in runs for s in r["steps"]) if runs else None
    if len(cfg.batchings) > 1:
        cpu["join"] = {m: join_vs_rounds(runs, m) for m in cfg.modes}
    return {
        "cpu": cpu,
        "runs": runs,
        "config": {
            "seeds": cfg.seeds,
            "steps": cfg.train.steps,
            "rollout_workers": cfg.train.pools.rollout_workers,
            "budget": dataclasses.asdict(cfg.train.budget),
            "reencode_queue": cfg.train.pipeline.reencode_queue,
            "batchings": list(cfg.batchings),
        },
    }


def join_vs_rounds(runs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """Per-token join against rounds in ``mode``, paired by seed (both ran the same prompts, one after the other):
    each seed's mean step time in both, its gain (rounds minus join), the mean gain and the spread of the gains over
    seeds (max minus min); ``faster``: the mean gain exceeds that spread."""

    def per_seed(name: str, key: str) -> list[float]:
        return [statistics.fmean(s[key] for s in r["steps"]) for r in runs if r["mode"] == name]

    rounds, join = per_seed(mode, "step_s"), per_seed(label(mode, "join"), "step_s")
    gains = [r - j for r, j in zip(rounds, join)]
    gain, spread = statistics.fmean(gains), max(gains) - min(gains)
    return {
        "rounds_step_s": rounds,
        "join_step_s": join,
        "gain_s_by_seed": gains,
        "rounds_tokens": per_seed(mode, "generated_tokens"),
        "join_tokens": per_seed(label(mode, "join"), "generated_tokens"),
        "ratio": statistics.fmean(join) / statistics.fmean(rounds),
        "gain_s": gain,
        "spread_s": spread,
        "faster": gain > spread,
    }


def format_table(summary: dict[str, Any]) -> str:
    cpu, c = summary["cpu"], summary["config"]
    lines = [
        f"seeds={c['seeds']}, steps={c['steps']}, sampler actors={c['rollout_workers']}, "
        f"leaves/step={c['budget']['num_leaves']}",
        f"{'mode':<15} {'step s':>7} {'rollout s':>9} {'busy':>5} {'occupancy':>9} {'gen tokens':>10}",
    ]
    for mode, m in cpu.items():
        if mode == "join":
            continue
        if isinstance(m, dict) and "step_s" in m:
            lines.append(
                f"{mode:<15} {m['step_s']:>7.2f} {m['rollout_s']:>9.2f} {m['busy']:>5.2f} {m['occupancy']:>9.2f} "
                f"{m['generated_tokens']:>10d}"
            )
        elif isinstance(m, dict):
            lines.append(f"{mode:<15} {m['status']}")
    if "step_s" in cpu.get("barrier", {}) and "step_s" in cpu.get("streaming", {}):
        lines.append(
            f"streaming / barrier step time: {cpu['streaming']['step_s'] / cpu['barrier']['step_s']:.3f}"
        )
    for mode, j in cpu.get("join", {}).items():
        lines.append(
            f"{mode}: join / rounds step time {j['ratio']:.3f} (gain {j['gain_s']:.2f} s a step, its spread over "
            f"seeds {j['spread_s']:.2f} s: {'faster' if j['faster'] else 'not faster'})"
        )
    lines.append(f"same_allocation: {cpu['same_allocation']}")
    if "train" in summary:
        lines += format_train(summary["train"], c["train_steps"])
    return "\n".join(lines)
