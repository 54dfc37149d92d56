"""``tracerl bench limit``: the embedded default's step at the limit this machine allows, next to a real step.

Three parts, in this process, one after the other:

1. **A real run**: ``tracerl train`` on the configured setup (the embedded default, conf/train/default.yaml, with
   ``steps`` short and the held-out set small: neither changes a training step), read back from MLflow: per step
   the work (generated and prefill tokens, decode forwards and rows, tool calls and replayed cells, leaves, loss
   tokens) and the seconds per phase (``time/*``). Steps ``1 + warmup_steps`` .. ``steps - 1`` are measured: the
   first pays for lazy set-up, the last holds the final evaluation and the trees' log.
2. **The bench's own step**: one allocation-and-rollout step of the same setup in this process (one sampler, the
   environment without actors), its sampler calls, tool calls and grades timed where they run (real model
   actions, real answers); its trees collated as the trainer collates them.
3. **Microbenchmarks**, one torch thread (as each sampler actor and the trainer run): the model's decode rate with
   a KV cache and its prefill rate at the real run's decode occupancy B and mean context, one update (forward,
   backward, optimizer step at ``loss.micro_batch_size``) of the bench step's batch, and a matmul's FLOP/s.

``tracerl.workflows.experiments.limit_report`` composes the limit from the real run's counts and these rates with the default
layout's parallelism and divides the real step by it, per phase and in total (docs/results/limit.md).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.workflows.experiments.config import BenchLimitConfig
from tracerl.workflows.experiments.limit_micro import (
    Micro,
    clock,
    since,
)
from tracerl.workflows.experiments.limit_report import (
    Layout,
    StepCounts,
    compose,
    fastest_step,
    mean_split,
    real_split,
    summary_json,
    write_json,
)

COUNT_KEYS = (
    M.GENERATED_TOKENS,
    M.PREFILL_COMPUTED,
    M.PREFILL_REUSED,
    M.LLM_CALLS,
    M.DECODE_STEPS,
    M.DECODE_ROWS,
    M.TOOL_CALLS,
    M.TOOL_CALLS_REPLAYED,
    M.SAMPLED_LEAVES,
    M.LOSS_TOKENS,
    M.SEQUENCES,
    M.TOTAL_CPU_S,
)
TIME_PHASES = (
    "step",
    "eval",
    "rollout",
    "generate",
    "tools",
    "grade",
    "update_policy",
    "broadcast",
    "select",
    "score",
    "allocate_roots",
    "expand_prefixes",
    "fit_predictor",
    "collate",
    "sync_weights",
    "log",
)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- 1. the real run ---------------------------------------------------------------------------------------------


def run_real(cfg: BenchLimitConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    """The short ``tracerl train`` run; its per-step counts and phase seconds from MLflow."""
    import mlflow

    from tracerl.workflows.train.run import train

    tc = dataclasses.replace(
        cfg.train,
        out_dir=str(Path(cfg.bench_out).resolve() / "runs"),
        run_name=f"bench-limit-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    progress(f"== the real run: tracerl train, {tc.steps} steps")
    summary = train(tc, progress=progress)
    client = mlflow.MlflowClient(tracking_uri=summary["tracking_uri"])
    keys = [*COUNT_KEYS, *(M.phase_time(p) for p in TIME_PHASES)]
    per: dict[int, dict[str, float]] = {}
    for key in keys:
        latest: dict[int, tuple[int, float]] = {}
        for m in client.get_metric_history(summary["run_id"], key):
            if m.step not in latest or m.timestamp >= latest[m.step][0]:
                latest[m.step] = (m.timestamp, m.value)
        for step, (_, value) in latest.items():
            per.setdefault(step, {})[key] = value
    steps = [{"step": k, **per[k]} for k in sorted(per) if k >= 1]
    return {"run_id": summary["run_id"], "tracking_uri": summary["tracking_uri"], "steps": steps}


def measured(steps: Sequence[dict[str, Any]], warmup: int, total: int) -> list[dict[str, Any]]:
    """The steps ``1 + warmup`` .. ``total - 1`` of a run's per-step records."""
    return [s for s in steps if warmup < s["step"] < total]


# -- 2. the bench's own step -------------------------------------------------------------------------------------


def own_step(tc: TrainConfig) -> dict[str, Any]:
    """One allocation-and-rollout step in this process: its sampler calls timed where they run, its tool calls' cells
    and its graded answers recorded (``tool_costs`` and ``grade_costs`` time them again, alone); the collated batch
    of its trees."""
    import numpy as np

    from tracerl.algos.batch import collate, debiased_setting
    from tracerl.engine.stepper import Stepper
    from tracerl.envs.math.reward import is_correct
    from tracerl.workflows.lm.stack import build_stack, stack_allocation, task_prompts

    stack = build_stack(tc.model, tc.sampler, tc.env, tc.seed)
    env, sampler = stack.env, stack.engine.sampler
    is_correct(
        "1/2", "0.5", env.grader
    )  # the grading worker starts once per actor, before the measured steps
    env.sandbox.run_cells(("print(1)",))
    calls: list[dict[str, float]] = []
    cells_run: list[tuple[str, ...]] = []
    answers: list[tuple[Any, str | None]] = []

    def timed_generate(contexts: Any, *args: Any, **kw: Any) -> Any:
        t0 = clock()
        gens = generate(contexts, *args, **kw)
        wall, cpu = since(t0)
        kept = [len(g.token_ids) for g in gens]
        calls.append(
            {
                "rows": len(gens),
                "kept_tokens": sum(kept),
                "forwards": max(kept, default=0),
                "prefill_tokens": sum(g.prefill_tokens for g in gens),
                "seconds": wall,
                "cpu_s": cpu,
            }
        )
        return gens

    def recorded_cells(cells: Sequence[str]) -> Any:
        cells_run.append(tuple(cells))
        return run_cells(cells)

    def recorded_reward(prompt: Any, answer: str | None) -> float:
        answers.append((prompt, answer))
        return reward(prompt, answer)

    generate, run_cells, reward = sampler.generate, env.sandbox.run_cells, env.reward
    wrapped = ((sampler, "generate"), (env.sandbox, "run_cells"), (env, "reward"))
    for (obj, name), fn in zip(wrapped, (timed_generate, recorded_cells, recorded_reward)):
        setattr(obj, name, fn)  # on the instances: the engine and the environment call these
    allocator, predictor = stack_allocation(tc.allocator, tc.predictor, stack, tc.seed)
    stepper = Stepper(
        task_prompts(tc.env), allocator, predictor, stack.engine, np.random.default_rng(tc.seed), "barrier"
    )
    t0 = time.perf_counter()
    out = stepper.run(0, tc.budget)
    wall = time.perf_counter() - t0
    for obj, name in wrapped:
        delattr(obj, name)  # the methods again
    debiased = debiased_setting(tc.loss.debiased_values, allocator, tc.loss.advantage)
    batch = collate(out.trees, tc.loss.advantage, tc.loss.normalize_std, debiased)
    sampled = sum(len(t.leaves()) for t in out.sampled_trees)
    return {
        "stack": stack,
        "trees": out.trees,
        "batch": batch,
        "wall_s": wall,
        "sampler_calls": calls,
        "cells": cells_run,
        "answers": answers,
        "sampled_leaves": sampled,
        "ledger": {
            "generated_tokens": out.ledger.generated_tokens,
            "tool_calls": out.ledger.tool_calls,
            "leaves": out.ledger.leaves,
        },
    }


# -- the bench ---------------------------------------------------------------------------------------------------


def _mean(steps: Sequence[Mapping[str, Any]], key: str) -> float:
    return statistics.fmean(float(s.get(key, 0.0)) for s in steps)


def step_counts(steps: Sequence[Mapping[str, Any]], graded_share: float) -> StepCounts:
    """The real run's mean work per measured step; graded answers = sampled leaves x ``graded_share``."""
    return StepCounts(
        generated_tokens=_mean(steps, M.GENERATED_TOKENS),
        prefill_tokens=_mean(steps, M.PREFILL_COMPUTED),
        decode_steps=_mean(steps, M.DECODE_STEPS),
        decode_rows=_mean(steps, M.DECODE_ROWS),
        tool_calls=_mean(steps, M.TOOL_CALLS),
        replayed_cells=_mean(steps, M.TOOL_CALLS_REPLAYED),
        grades=_mean(steps, M.SAMPLED_LEAVES) * graded_share,
        loss_tokens=_mean(steps, M.LOSS_TOKENS),
    )


def cpu_per_step(steps: Sequence[dict[str, Any]], measured_steps: Sequence[dict[str, Any]]) -> float | None:
    """Mean CPU seconds of the measured steps from the running ``total/cpu_s`` (trainer, samplers, env actors)."""
    total = {s["step"]: float(s[M.TOTAL_CPU_S]) for s in steps if M.TOTAL_CPU_S in s}
    diffs = [
        total[s["step"]] - total[s["step"] - 1]
        for s in measured_steps
        if s["step"] in total and s["step"] - 1 in total
    ]
    return statistics.fmean(diffs) if diffs else None


def run_limit_bench(
    cfg: BenchLimitConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """The real run, the bench's own step, the microbenchmarks at the run's shapes, then the limit composed from
    them beside the real step (``summary_json``), written to ``bench_out/results.json``."""
    import ray
    import torch

    tc = cfg.train
    load0 = [round(x, 2) for x in os.getloadavg()]
    real = run_real(cfg, progress)
    ray.shutdown()  # its workers would stay beside the microbenchmarks
    steps = measured(real["steps"], cfg.warmup_steps, tc.steps or 0)
    if not steps:
        raise RuntimeError(f"the real run logged no steps {cfg.warmup_steps + 1}..{(tc.steps or 0) - 1}")
    torch.set_num_threads(1)  # a sampler actor's threads (pools.rollout_cpus) and the trainer's (Ray's OMP)
    progress("== the bench's own step (one sampler, in process)")
    own = own_step(tc)
    progress(
        f"   {own['wall_s']:.1f} s, {len(own['sampler_calls'])} sampler calls, {len(own['cells'])} tool calls"
    )
    counts_share = len(own["answers"]) / max(own["sampled_leaves"], 1)
    counts = step_counts(steps, counts_share)
    llm_calls = max(_mean(steps, M.LLM_CALLS), 1.0)
    micro = Micro.measure(tc, cfg.repeats, own, counts, llm_calls, _mean(steps, M.PREFILL_REUSED), progress)
    cpu_rates = micro.rates(cpu=True)
    layout = Layout(tc.pools.rollout_workers, tc.pools.env_workers, _cpus())
    fast = fastest_step(steps)
    extra = {
        "run_id": real["run_id"],
        "tracking_uri": real["tracking_uri"],
        "run_steps": tc.steps,
        "measured_steps": f"{steps[0]['step']}-{steps[-1]['step']}",
        "fastest_step": {
            "step": fast["step"],
            "real_s": real_split(fast),
            "limit_s": compose(step_counts([fast], counts_share), cpu_rates, layout),
        },
        "limit_wall_clock_s": compose(counts, micro.rates(cpu=False), layout),
        "cpu_per_step": {
            "real": cpu_per_step(real["steps"], steps),
            "limit": compose(counts, cpu_rates, Layout(1, 0, 1))["total"],
        },
        "microbench": micro.section(own, counts),
        "own_step": own_step_section(own),
        "per_step": real["steps"],
        "machine": {
            "cpus": _cpus(),
            "load_avg_start": load0,
            "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        },
    }
    summary = summary_json(counts, cpu_rates, layout, mean_split(steps), extra)
    write_json(summary, Path(cfg.bench_out) / "results.json", cfg.json_path)
    return summary


def own_step_section(own: dict[str, Any]) -> dict[str, Any]:
    """The JSON's ``own_step``: its wall seconds, sampler calls, rows per call and tokens per second, its ledger."""
    calls = [c for c in own["sampler_calls"] if c["rows"]]
    return {
        "wall_s": own["wall_s"],
        "sampler_calls": len(calls),
        "sampler_rows_per_call": statistics.fmean(c["rows"] for c in calls) if calls else 0.0,
        "sampler_tokens_per_cpu_s": sum(c["kept_tokens"] for c in calls)
        / max(sum(c["cpu_s"] for c in calls), 1e-9),
        "sampler_tokens_per_wall_s": sum(c["kept_tokens"] for c in calls)
        / max(sum(c["seconds"] for c in calls), 1e-9),
        **own["ledger"],
    }
