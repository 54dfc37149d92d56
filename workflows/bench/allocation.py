"""``tracerl bench allocation``: every allocator at equal leaf budget on the calibrated simulator.

Runs ``allocators x seeds`` online runs (the predictor learning as it goes), plus an
informativeness sweep (feature noise x allocators), in parallel Ray tasks when ``workers > 1``.
Writes a table, PNGs and JSON to ``out_dir``, and one MLflow run per allocator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracerl import metrics as M
from tracerl.calibration import mean_calibration
from tracerl.config_loader import to_flat_dict
from tracerl.envs.simulator import Simulator, SimulatorConfig, calibrate, with_noise_scale
from tracerl.workflows.bench.config import BenchAllocationConfig
from tracerl.workflows.bench.sim_runs import RunResult, run_allocator
from tracerl.workflows.ops.progress import bar
from tracerl.workflows.ops.ray_utils import init_ray
from tracerl.workflows.ops.results import ci95, results_dir
from tracerl.workflows.tracking import store as tracking

Job = tuple[str, int, float]  # allocator, seed, noise scale

SUMMARY_KEYS = {
    "effective_ratio": M.EFFECTIVE_RATIO,
    "effective_ratio_candidates": M.EFFECTIVE_RATIO_CANDIDATES,
    "effective_ratio_sampled": M.EFFECTIVE_RATIO_SAMPLED,
    "leaf_effective_ratio": M.LEAF_EFFECTIVE_RATIO,
    "mixed_groups_per_step": M.MIXED_GROUPS,
    "contrast_pairs_per_100_leaves": M.CONTRAST_PAIRS_PER_100,
    "step_contrast_pairs_per_100_leaves": M.STEP_CONTRAST_PAIRS_PER_100,
    "active_prompts": M.ACTIVE_PROMPTS,
    "leaves": M.LEAVES,
    "sampled_leaves": M.SAMPLED_LEAVES,
}


def _execute(
    cfg: BenchAllocationConfig, jobs: Sequence[Job], progress: Callable[[str], None]
) -> list[RunResult]:
    """Run every job, serially or as Ray tasks; results come back in job order."""
    t0 = time.perf_counter()
    runs_bar = bar(progress, len(jobs), "bench allocation", "run")

    def report(i: int, r: RunResult, noise: float) -> None:
        warm = int(cfg.steps * cfg.warmup_fraction)
        er = float(np.mean([m[M.EFFECTIVE_RATIO] for m in r.steps[warm:]]))
        tag = "" if noise == 1.0 else f" noise x{noise:g}"
        progress(
            f"[{i}/{len(jobs)}] {r.allocator:<18} seed {r.seed}{tag}: effective ratio {er:.3f} ({time.perf_counter() - t0:.0f} s)"
        )
        runs_bar.set(i)
        if i == len(jobs):
            runs_bar.close()

    if cfg.workers <= 1:
        out = []
        for i, (name, seed, noise) in enumerate(jobs, 1):
            out.append(_run_job(cfg, name, seed, noise))
            report(i, out[-1], noise)
        return out
    import ray  # slow to import: ray (a one-worker bench runs without Ray)

    init_ray(cfg.cluster)
    remote = ray.remote(num_cpus=1)(_run_job)
    refs = [remote.remote(cfg, *job) for job in jobs]
    pending, done, results = list(refs), 0, {}
    index = {ref.hex(): i for i, ref in enumerate(refs)}
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            i = index[ref.hex()]
            results[i] = ray.get(ref)
            done += 1
            report(done, results[i], jobs[i][2])
    return [results[i] for i in range(len(jobs))]


def _run_job(cfg: BenchAllocationConfig, name: str, seed: int, noise: float) -> RunResult:
    """One job on one torch thread, serial or as a Ray task: float sums then add up in the same order either way
    (with the driver's default thread count, calibration differed from the Ray tasks' in the 8th digit)."""
    import torch  # slow to import: torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core per task; the predictor's ops are tiny
    try:
        return run_allocator(cfg, name, seed, noise)
    finally:
        torch.set_num_threads(threads)


def _ci95(values: Sequence[float]) -> float:
    half = ci95(values)
    return float("nan") if half is None else half


def _summarize(cfg: BenchAllocationConfig, runs: Sequence[RunResult]) -> dict[str, Any]:
    warm = int(cfg.steps * cfg.warmup_fraction)
    per_seed = {
        k: [float(np.mean([s[m] for s in r.steps[warm:]])) for r in runs] for k, m in SUMMARY_KEYS.items()
    }
    out: dict[str, Any] = {k: float(np.mean(v)) for k, v in per_seed.items()}
    out["effective_ratio_ci95"] = _ci95(per_seed["effective_ratio"])
    out["leaf_effective_ratio_ci95"] = _ci95(per_seed["leaf_effective_ratio"])
    out["leaves"] = int(round(out["leaves"]))
    out["sampled_leaves"] = int(round(out["sampled_leaves"]))
    out["seeds"] = len(runs)
    out["calibration"] = mean_calibration([r.calibration for r in runs])
    return out


def _per_step_mean(runs: Sequence[RunResult]) -> list[dict[str, float]]:
    return [M.mean_metrics([r.steps[s] for r in runs]) for s in range(len(runs[0].steps))]


def format_table(cfg: BenchAllocationConfig, summary: dict[str, Any]) -> str:
    """The printed comparison table, with the budget it was measured at."""
    b, a = cfg.budget, cfg.allocator
    lines = [
        f"budget: L={b.leaves} leaves/step | flat: G={b.group_size} on L/G={b.num_groups} prompts | "
        f"tree: M={b.roots} bare, N={b.continuations}, m_min={a.m_min}, m_max={a.m_max}, uniform g={a.root_group_size} | "
        f"pool B={b.num_candidates}",
        f"steps={cfg.steps} (first {int(cfg.steps * cfg.warmup_fraction)} left out), seeds={cfg.seeds}, predictor={cfg.predictor.name}",
        "",
        f"{'allocator':<18} {'eff.ratio':>15} {'x grpo':>7} {'leaf ER':>8} {'mixed/step':>10} {'pairs/100':>9} "
        f"{'leaves':>6} {'sampled':>7} {'ER sampled':>10}",
    ]
    allocs = summary["allocators"]
    base = allocs.get("grpo", {}).get("effective_ratio")
    for name, s in allocs.items():
        rel = f"{s['effective_ratio'] / base:.2f}" if base else "-"
        lines.append(
            f"{name:<18} {s['effective_ratio']:>8.3f} ±{s['effective_ratio_ci95']:<6.3f} {rel:>7} "
            f"{s['leaf_effective_ratio']:>8.3f} {s['mixed_groups_per_step']:>10.1f} "
            f"{s['contrast_pairs_per_100_leaves']:>9.1f} {s['leaves']:>6d} {s['sampled_leaves']:>7d} "
            f"{s['effective_ratio_sampled']:>10.3f}"
        )
    pred = summary.get("predictor", {})
    if pred:
        lines.append("")
        lines.append(f"predictor ({cfg.predictor.name}, under trace) calibration after warm-up:")
        for group, m in pred.items():
            vals = " ".join(f"{k}={v:.3f}" for k, v in m.items() if k != "count")
            lines.append(f"  {group:<9} {vals}")
    noise = summary.get("noise_sweep")
    if noise:
        lines.append("")
        lines.append("effective ratio vs feature noise (x default; prompt / prefix feature R^2):")
        scales = noise["scales"]
        lines.append(f"  {'allocator':<16}" + "".join(f"{s:>8g}" for s in scales))
        lines.append(f"  {'prompt R^2':<16}" + "".join(f"{r:>8.2f}" for r in noise["prompt_r2"]))
        lines.append(f"  {'prefix R^2':<16}" + "".join(f"{r:>8.2f}" for r in noise["prefix_r2"]))
        for name, ers in noise["effective_ratio"].items():
            lines.append(f"  {name:<16}" + "".join(f"{e:>8.3f}" for e in ers))
    return "\n".join(lines)


def _plots(
    cfg: BenchAllocationConfig, series: dict[str, list[dict[str, float]]], summary: dict[str, Any], out: Path
) -> list[Path]:
    # slow to import: matplotlib
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # slow to import: matplotlib; after the backend is chosen

    paths = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, steps in series.items():
        ax.plot([s[M.EFFECTIVE_RATIO] for s in steps], label=name, lw=1.2)
    ax.axvspan(0, int(cfg.steps * cfg.warmup_fraction), color="0.9", label="predictor warm-up")
    ax.set(
        xlabel="step",
        ylabel="effective ratio (mean over seeds)",
        title="Effective ratio per step",
        ylim=(0, 1.02),
    )
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    paths.append(out / "effective_ratio_per_step.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    noise = summary.get("noise_sweep")
    if noise:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name, ers in noise["effective_ratio"].items():
            ax.plot(noise["scales"], ers, marker="o", label=name)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(noise["scales"])
        ax.set_xticklabels(
            [f"x{s:g}\nR²={r:.2f}" for s, r in zip(noise["scales"], noise["prompt_r2"])], fontsize=8
        )
        ax.set(
            xlabel="feature noise (prompt-feature R²): more noise = less informative predictor",
            ylabel="effective ratio",
            title="Effective ratio vs predictor informativeness",
            ylim=(0, 1.02),
        )
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "effective_ratio_vs_noise.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _tree_throughput(cfg: BenchAllocationConfig, trees: int = 512) -> float:
    """Simulator speed: trees of G bare rollouts built per second (one core)."""
    env = Simulator(cfg.env.settings(SimulatorConfig), seed=cfg.seed)
    pool = env.sample_pool(min(trees, cfg.env.settings(SimulatorConfig).num_prompts))
    t0 = time.perf_counter()
    env.rollout(pool, [cfg.budget.group_size] * len(pool))
    return len(pool) / (time.perf_counter() - t0)


def run_allocation_bench(
    cfg: BenchAllocationConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON summary (also written to ``out_dir`` and ``json_path``)."""
    out = results_dir(cfg.out_dir, cfg)
    sim = calibrate(cfg.env.settings(SimulatorConfig), seed=cfg.seed, group_size=cfg.budget.group_size)
    sim["trees_per_second"] = _tree_throughput(cfg)
    progress(
        f"simulator calibration: prompt-feature R^2 {sim['prompt_r2']:.3f}, prefix-feature R^2 {sim['prefix_r2']:.3f}, "
        f"uniform GRPO (G={cfg.budget.group_size}) expected effective ratio {sim['grpo_effective_ratio']:.3f}; "
        f"{sim['trees_per_second']:.0f} trees/s (G={cfg.budget.group_size} bare rollouts each)"
    )
    seeds = [cfg.seed + k for k in range(cfg.seeds)]
    jobs: list[Job] = [(name, s, 1.0) for name in cfg.allocators for s in seeds]
    noise_scales = list(cfg.noise_scales)
    noise_jobs: list[Job] = [
        (name, cfg.seed + k, scale)
        for scale in noise_scales
        for name in cfg.noise_allocators
        for k in range(cfg.noise_seeds)
    ]
    results = _execute(cfg, jobs + noise_jobs, progress)
    main, noisy = results[: len(jobs)], results[len(jobs) :]
    by_alloc = {name: [r for r in main if r.allocator == name] for name in cfg.allocators}
    summary: dict[str, Any] = {"allocators": {n: _summarize(cfg, rs) for n, rs in by_alloc.items()}}
    ref = "trace" if "trace" in by_alloc else cfg.allocators[0]
    summary["predictor"] = summary["allocators"][ref]["calibration"]
    summary["simulator"] = sim
    summary["budget"] = {
        "leaves": cfg.budget.leaves,
        "roots": cfg.budget.roots,
        "continuations": cfg.budget.continuations,
        "group_size": cfg.budget.group_size,
        "candidates": cfg.budget.num_candidates,
    }
    if noise_scales and noise_jobs:
        warm = int(cfg.steps * cfg.warmup_fraction)
        cal = [
            calibrate(with_noise_scale(cfg.env.settings(SimulatorConfig), s), seed=cfg.seed, samples=50_000)
            for s in noise_scales
        ]
        summary["noise_sweep"] = {
            "scales": noise_scales,
            "prompt_r2": [c["prompt_r2"] for c in cal],
            "prefix_r2": [c["prefix_r2"] for c in cal],
            "effective_ratio": {
                name: [
                    float(
                        np.mean(
                            [
                                np.mean([m[M.EFFECTIVE_RATIO] for m in r.steps[warm:]])
                                for r in noisy
                                if r.allocator == name and r.noise == s
                            ]
                        )
                    )
                    for s in noise_scales
                ]
                for name in cfg.noise_allocators
            },
        }
    series = {n: _per_step_mean(rs) for n, rs in by_alloc.items()}
    pngs = _plots(cfg, series, summary, out)
    table = format_table(cfg, summary)
    (out / "table.txt").write_text(table + "\n")
    paths = [out / "results.json"] + ([Path(cfg.json_path)] if cfg.json_path else [])
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(summary, indent=2))
    summary["run_ids"] = _log_mlflow(
        cfg, summary, series, [out / "results.json", out / "table.txt", out / "config.yaml", *pngs]
    )
    return summary


def _log_mlflow(
    cfg: BenchAllocationConfig,
    summary: dict[str, Any],
    series: dict[str, list[dict[str, float]]],
    artifacts: Sequence[Path],
) -> dict[str, str]:
    if not cfg.tracking.enabled:
        return {}
    import mlflow  # slow to import: mlflow (not needed with tracking.enabled: false)

    params = to_flat_dict(cfg)
    run_ids = {}
    for name, s in summary["allocators"].items():
        with tracking.run(
            cfg.tracking, f"bench-allocation-{name}", tags={"bench": "allocation", "allocator": name}
        ) as run:
            tracking.log_params({**params, "allocator.name": name})
            tracking.log_step_series(series[name])
            tracking.log_metrics({M.bench(k): v for k, v in s.items() if isinstance(v, (int, float))})
            for group, m in s["calibration"].items():
                tracking.log_metrics({M.calibration(group, k): v for k, v in m.items()})
            for path in artifacts:
                mlflow.log_artifact(str(path))
            run_ids[name] = run.info.run_id
    return run_ids
