"""``tracerl bench train``: training runs of several allocators at equal leaf budget, mean over seeds.

Each (allocator, seed) is one ``tracerl train`` run (its own MLflow run, tagged ``tracerl.bench``); the
summary reports held-out greedy accuracy before and after (mean and std over seeds), mean effective
ratio, and per-run budget (leaves, generated tokens) and wall time, averaged over seeds.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from tracerl.config import TrainConfig
from tracerl.workflows.bench.config import BenchTrainConfig
from tracerl.workflows.ops.progress import bar
from tracerl.workflows.ops.results import write_results
from tracerl.workflows.tracking.runs import RunSummary
from tracerl.workflows.tracking.store import resolve_uri
from tracerl.workflows.train.run import train


def run_configs(cfg: BenchTrainConfig) -> list[tuple[str, int, TrainConfig]]:
    """Every (allocator, seed) run: the bench's training setup with that allocator, seed and a run name."""
    base = cfg.train
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = []
    for name in cfg.allocators:
        for k in range(cfg.seeds):
            seed = base.seed + k
            tc = dataclasses.replace(
                base,
                allocator=dataclasses.replace(base.allocator, name=name),
                seed=seed,
                run_name=f"bench-{name}-s{seed}-{stamp}",
            )
            out.append((name, seed, tc))
    return out


def run_train_bench(
    cfg: BenchTrainConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    per: dict[str, list[RunSummary]] = {}
    configs = run_configs(cfg)
    runs_bar = bar(progress, len(configs), "bench train", "run")
    for name, seed, tc in configs:
        progress(f"== {name}, seed {seed}: {tc.steps} steps")
        s = train(tc, progress=progress)
        per.setdefault(name, []).append(s)
        progress(
            f"   {name} seed {seed}: held-out {s.get('acc_before', float('nan')):.3f} -> "
            f"{s.get('acc_after', float('nan')):.3f}, ER {s['effective_ratio']:.3f}, {s['wall_s']:.0f} s"
        )
        runs_bar.update()
    runs_bar.close()
    runs: dict[str, Any] = {}
    for name, ss in per.items():
        after = [s["acc_after"] for s in ss]
        runs[name] = {
            "run_id": ss[0]["run_id"],
            "run_ids": [s["run_id"] for s in ss],
            "acc_before": statistics.fmean(s["acc_before"] for s in ss),
            "acc_after": statistics.fmean(after),
            "acc_after_std": statistics.stdev(after) if len(after) > 1 else 0.0,
            "effective_ratio": statistics.fmean(s["effective_ratio"] for s in ss),
            "leaves": int(statistics.fmean(s["leaves"] for s in ss)),
            "generated_tokens": int(statistics.fmean(s["generated_tokens"] for s in ss)),
            "wall_s": statistics.fmean(s["wall_s"] for s in ss),
            "alloc_predictor_fraction_of_rollout": statistics.fmean(
                s["alloc_predictor_fraction_of_rollout"] for s in ss
            ),
            "seeds": len(ss),
        }
    summary = {
        "runs": runs,
        "tracking_uri": resolve_uri(cfg.train.tracking.uri),
        "steps": cfg.train.steps,
        "budget": dataclasses.asdict(cfg.train.budget),
    }
    write_results(cfg.bench_out, summary, cfg.json_path)
    return summary


def format_table(summary: dict[str, Any]) -> str:
    head = f"{'allocator':<10} {'acc before':>10} {'acc after':>16} {'change':>8} {'eff.ratio':>9} {'leaves':>7} {'gen.tokens':>10} {'wall s':>7}"
    lines = [f"steps={summary['steps']}, leaves/step={summary['budget']['num_leaves']}", head]
    for name, r in summary["runs"].items():
        lines.append(
            f"{name:<10} {r['acc_before']:>10.3f} {r['acc_after']:>9.3f} ±{r['acc_after_std']:.3f} "
            f"{100 * (r['acc_after'] - r['acc_before']):>+7.1f} {r['effective_ratio']:>9.3f} {r['leaves']:>7d} "
            f"{r['generated_tokens']:>10d} {r['wall_s']:>7.0f}"
        )
    lines.append(
        f"\nMLflow: {summary['tracking_uri']}  (mlflow ui --backend-store-uri {summary['tracking_uri']})"
    )
    return "\n".join(lines)
