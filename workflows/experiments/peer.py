"""``tracerl bench peer``: TRL's ``GRPOTrainer`` and ``tracerl train`` side by side on the same work.

Sides: ``trl`` (TRL's trainer, the project's environment inside its ``rollout_func``: workflows/experiments/peer_trl.py, run
with the peer venv's interpreter), ``grpo`` (``tracerl train`` with ``allocator=grpo`` and grpo advantages) and
``trace`` (``tracerl train`` as configured: ``allocator=trace``), both in-process (``cluster.address=inprocess``: one
process, no Ray), and ``grpo-ray`` and ``trace-ray``, the same on an embedded Ray (the JSON's ``modes`` and each
run's ``mode`` say which). Every side is a subprocess started from here, so
each one's whole process tree (Ray's raylet, workers and environment actors included) is measured the same way:
its summed PSS sampled every ``sample_s`` seconds (the peak is reported), and its per-step times. Seeds run in
turn, the sides' order rotating by one each seed; within a seed the sides run one whole run after another
(``interleave=seed``) or take turns a step each (``interleave=step``: the waits left out); every side runs with the same CPUs (the first ``threads`` of
this process's affinity), ``OMP_NUM_THREADS`` = its torch threads T and Ray's workers at nice 0; TRL's single
process sets ``torch.set_num_threads(T)``, tracerl's trainer worker ``trainer.torch_threads=T`` and its sampler
actors ``pools.sampler_threads=1`` each (the run's params ``threads/trainer``, ``threads/sampler``; an in-process
side's one process runs T for both), as recorded in the JSON. T is ``torch_threads``, or the side's own where it is
named ``side@T``: ``--sides trl@1,trl@2,grpo@1,grpo@2`` runs each side at both counts, interleaved, and the JSON's
``best`` gives each side's fastest and its ratio to TRL's fastest (each side at the thread count best for it).

``settings`` (workflows/experiments/peer_settings.py) is the one place where the training setup is turned into TRL's
arguments; its rows are printed into the JSON, so a reader can check both sides do the same work. Running a side
and reading its steps back: workflows/experiments/peer_sides.py.

Per step and side: wall seconds between step ends (an evaluation's own seconds left out), split into rollout
(tracerl: select, score, allocate_roots, rollout, expand_prefixes; TRL: the rollout function), update (tracerl:
broadcast and update_policy; TRL: the step's forward/backward micro-batches and optimizer step) and the rest;
generated tokens per second over those seconds; start-up seconds from launch to the first step's begin. The first
``warmup_steps`` steps are not in the means. With ``eval_every`` > 0 each side is evaluated (greedy, held-out,
as ``tracerl train`` does) at every ``eval_every`` steps and at the end, giving held-out accuracy against wall
seconds (start-up included, evaluations left out) and the wall seconds to ``target`` accuracy.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.config import TrainConfig
from tracerl.workflows.experiments.config import BenchPeerConfig, split_side
from tracerl.workflows.experiments.peer_report import (
    KEYS,
    SideRun,
    SideStats,
    aggregate,
    best_sides,
    side_stats,
    write_json,
)
from tracerl.workflows.experiments.peer_settings import run_order, settings, side_mode, side_tag, side_threads
from tracerl.workflows.experiments.peer_sides import (
    SideJob,
    peer_interpreter,
    run_in_turns,
    run_tracerl_side,
    run_trl_side,
    tracerl_job,
    trl_job,
)

__all__ = ["BenchPeerConfig", "checkpoint_accuracy", "run_peer_bench"]


# -- statistics --------------------------------------------------------------------------------------------------


def checkpoint_accuracy(tc: TrainConfig) -> float:
    """Greedy held-out accuracy of the starting checkpoint, in this process (as ``tracerl train`` evaluates)."""
    from tracerl.workflows.lm.stack import task_prompts
    from tracerl.workflows.train.evaluate import evaluate_prompts, local_runner

    run = local_runner(tc.model, tc.sampler, tc.env)
    m, _ = evaluate_prompts(run, task_prompts(tc.env, held_out=True), 0, 0.0, tc.seed + 10_000)
    return float(m["accuracy"])


def run_peer_bench(cfg: BenchPeerConfig, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every side for every seed (the order rotating), then the summary written to ``bench_out/results.json``."""
    trl_sides = [s for s in cfg.sides if split_side(s)[0] == "trl"]
    # a setting TRL cannot match fails before anything runs
    mapping = settings(cfg.train, sorted({side_threads(cfg, s) for s in trl_sides}))
    if trl_sides:
        peer_interpreter(cfg)
    curves = cfg.train.eval_every > 0
    acc0 = None
    if curves:
        progress("held-out accuracy of the starting checkpoint ...")
        acc0 = checkpoint_accuracy(cfg.train)
        progress(f"   {acc0:.3f}")
    raw, stats, order = _run_sides(cfg, acc0, progress)
    target = cfg.target
    if target is None and curves and acc0 is not None:
        from tracerl.workflows.experiments.curves import target_accuracy

        first = stats[cfg.sides[0]]
        final = statistics.fmean(r["curve"][-1][1] for r in first if r["curve"])
        target = target_accuracy(acc0, final)
    sides = aggregate(stats, target if curves else None)
    summary = {
        "sides": sides,
        "best": best_sides(sides),
        "runs": {s: [_run_record(r, st) for r, st in zip(raw[s], stats[s])] for s in cfg.sides},
        "order": order,
        "modes": {s: side_mode(s) for s in cfg.sides},
        "settings": mapping,
        "steps": cfg.train.steps,
        "seeds": cfg.seeds,
        "interleave": cfg.interleave,
        "warmup_steps": cfg.warmup_steps,
        "threads": cfg.threads,
        "torch_threads": cfg.torch_threads,
        "side_torch_threads": {s: side_threads(cfg, s) for s in cfg.sides},
        "eval_every": cfg.train.eval_every,
        "acc_start": acc0,
        "target": target if curves else None,
        "machine": {"cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg())},
    }
    write_json(summary, Path(cfg.bench_out) / "results.json", cfg.json_path)
    return summary


def _run_sides(
    cfg: BenchPeerConfig, acc0: float | None, progress: Callable[[str], None]
) -> tuple[dict[str, list[SideRun]], dict[str, list[SideStats]], list[str]]:
    """Each seed's sides in their rotated order: (raw runs, their statistics, the order run), by side."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw: dict[str, list[SideRun]] = {s: [] for s in cfg.sides}
    stats: dict[str, list[SideStats]] = {s: [] for s in cfg.sides}
    order = []
    for k in range(cfg.seeds):
        seed = cfg.train.seed + k
        sides = run_order(cfg.sides, k)
        tags = {side: f"peer-{side_tag(side)}-s{seed}-{stamp}" for side in sides}
        if cfg.interleave == "step":
            progress(f"== seed {seed}: {', '.join(sides)} taking turns, a step each, {cfg.train.steps} steps")
            runs = run_in_turns(cfg, {side: _job(cfg, side, seed, tags[side], progress) for side in sides})
        else:
            runs = {}
            for side in sides:
                progress(
                    f"== {side}, seed {seed}: {cfg.train.steps} steps, {side_threads(cfg, side)} torch threads"
                )
                runs[side] = (
                    run_trl_side(cfg, seed, tags[side], progress, side)
                    if side_mode(side) == "trl"
                    else run_tracerl_side(cfg, side, seed, tags[side], progress)
                )
        for side in sides:
            run = runs[side]
            run["seed"] = seed
            st = side_stats(run, cfg.warmup_steps, acc0)
            raw[side].append(run)
            stats[side].append(st)
            order.append(f"{side}/s{seed}")
            progress(
                f"   {side} seed {seed}: {st['s_per_step']:.2f} s/step, start-up {st['startup_s']:.1f} s, "
                f"peak PSS {st['peak_pss_mb']:.0f} MB"
            )
    return raw, stats, order


def _job(cfg: BenchPeerConfig, side: str, seed: int, tag: str, progress: Callable[[str], None]) -> SideJob:
    return (
        trl_job(cfg, seed, tag, progress, side)
        if side_mode(side) == "trl"
        else tracerl_job(cfg, side, seed, tag, progress)
    )


def _run_record(r: SideRun, st: SideStats) -> dict[str, Any]:
    """One run as the JSON lists it: its statistics, per-step rows, threads and CPUs."""
    return {
        "seed": r["seed"],
        **{k: st[k] for k in KEYS},
        "paused_s": sum(b - a for a, b in r.get("pauses", [])),
        "peak_processes": st["peak_processes"],
        "steps_measured": st["steps_measured"],
        "curve": st["curve"],
        "per_step": st["per_step"],
        "mode": r.get("mode"),
        "threads": r["threads"],
        "cpus": r["cpus"],
        **({"run_id": r["run_id"]} if "run_id" in r else {}),
    }
