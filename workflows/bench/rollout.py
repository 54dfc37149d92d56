"""``tracerl bench rollout``: allocators at equal leaves with the frozen tiny policy on built-in math tasks.

Each allocator runs ``steps`` steps on the same fixed task set (revisited across steps), the predictor
learning online; counts are per step, averaged after the warm-up, with 95 % t intervals over seeds. Writes a
table and JSON, and one MLflow run per allocator. Each allocator x seed run is kept in ``out_dir/runs/`` with the
settings it ran under: a rerun with the same settings (an interrupted benchmark, started again) reuses it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracerl import metrics as M
from tracerl.calibration import CalibrationData, collect_calibration, mean_calibration, summarize_calibration
from tracerl.config_loader import to_flat_dict
from tracerl.engine.step import StepOutcome
from tracerl.engine.step_stats import step_metrics
from tracerl.engine.stepper import Stepper
from tracerl.envs.registry import check_data, env_section
from tracerl.workflows.bench.config import BenchRolloutConfig
from tracerl.workflows.lm.stack import build_stack, stack_allocation, task_prompts
from tracerl.workflows.ops.progress import bar
from tracerl.workflows.ops.results import ci95, results_dir, write_results
from tracerl.workflows.tracking import store as tracking

KEYS = {
    "effective_ratio": M.EFFECTIVE_RATIO,
    "leaf_effective_ratio": M.LEAF_EFFECTIVE_RATIO,
    "mixed_groups_per_step": M.MIXED_GROUPS,
    "leaves": M.LEAVES,
    "generated_tokens": M.GENERATED_TOKENS,
    "prefill_tokens_reused": M.PREFILL_REUSED,
    "prefill_tokens_computed": M.PREFILL_COMPUTED,
    "tool_calls": M.TOOL_CALLS,
    "tool_calls_replayed": M.TOOL_CALLS_REPLAYED,
    "wall_s": M.TIME_STEP,
    "success_rate": M.SUCCESS_RATE,
    "invalid_actions": M.INVALID_ACTIONS,
    "continuations": M.CONTINUATIONS,
    "continuation_prefill_computed": M.CONTINUATION_PREFILL_COMPUTED,
    "continuation_prefill_reencode": M.CONTINUATION_PREFILL_REENCODE,
}
INT_KEYS = {
    "leaves",
    "generated_tokens",
    "prefill_tokens_reused",
    "prefill_tokens_computed",
    "tool_calls",
    "tool_calls_replayed",
}


def run_one(
    cfg: BenchRolloutConfig, name: str, seed: int, progress: Callable[[str], None]
) -> tuple[list[dict[str, float]], dict[str, dict[str, float]]]:
    """One allocator x seed: per-step metrics and the predictor's post-warm-up calibration."""
    stack = build_stack(cfg.model, cfg.sampler, cfg.env, seed)
    allocator, predictor = stack_allocation(
        dataclasses.replace(cfg.allocator, name=name), cfg.predictor, stack, seed
    )
    prompts = task_prompts(cfg.env)
    stepper = Stepper(
        prompts, allocator, predictor, stack.engine, np.random.default_rng([seed, 17]), cfg.pipeline.mode
    )
    steps = []
    calib: CalibrationData = {}
    warm = int(cfg.steps * cfg.warmup_fraction)
    for s in range(cfg.steps):
        t0 = time.perf_counter()
        out = stepper.run(s, cfg.budget)
        if s >= warm:
            collect_calibration(out, calib)
        predictor.fit(out.sampled_trees)
        m = step_metrics(out)
        m[M.TIME_STEP] = time.perf_counter() - t0
        m.update(_continuation_prefill(out))
        steps.append(m)
        progress(
            f"  {name} seed {seed} step {s}: ER {m[M.EFFECTIVE_RATIO]:.2f} leaves {m[M.LEAVES]:.0f} "
            f"tokens {m[M.GENERATED_TOKENS]:.0f} ({m[M.TIME_STEP]:.1f} s)"
        )
    return steps, summarize_calibration(calib)


RunRecord = tuple[list[dict[str, float]], dict[str, dict[str, float]]]
_NOT_SETTINGS = ("allocators", "seeds", "seed", "warmup_fraction", "out_dir", "json_path", "tracking.")
"""Keys that do not change one allocator x seed run (the run file names its allocator and seed)."""


def cached_run(cfg: BenchRolloutConfig, name: str, seed: int, progress: Callable[[str], None]) -> RunRecord:
    """``run_one``, or its record in ``out_dir/runs/`` from an earlier invocation with the same settings."""
    settings = {k: v for k, v in to_flat_dict(cfg).items() if not k.startswith(_NOT_SETTINGS)}
    settings = json.loads(json.dumps(settings, default=str))
    path = Path(cfg.out_dir) / "runs" / f"{name}-seed{seed}.json"
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except ValueError:
            saved = {}
        if saved.get("settings") == settings:
            progress(f"  {name} seed {seed}: reusing {path}")
            return saved["steps"], saved["calibration"]
        progress(f"  {name} seed {seed}: {path} ran under other settings; running again")
    steps, calibration = run_one(cfg, name, seed, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps({"settings": settings, "steps": steps, "calibration": calibration}))
    tmp.replace(path)
    return steps, calibration


def _per_seed(runs: list[list[dict[str, float]]], warm: int) -> dict[str, list[float]]:
    """Post-warm-up means per seed of the quantities reported with intervals."""
    out: dict[str, list[float]] = {}
    for r in runs:
        steps = r[warm:]

        def mean(key: str, steps: list[dict[str, float]] = steps) -> float:
            return float(np.mean([st[key] for st in steps]))

        out.setdefault("effective_ratio", []).append(mean(M.EFFECTIVE_RATIO))
        out.setdefault("mixed_groups_per_step", []).append(mean(M.MIXED_GROUPS))
        out.setdefault("generated_tokens_per_leaf", []).append(
            mean(M.GENERATED_TOKENS) / max(mean(M.LEAVES), 1.0)
        )
        out.setdefault("prefill_tokens_reused", []).append(mean(M.PREFILL_REUSED))
        out.setdefault("success_rate", []).append(mean(M.SUCCESS_RATE))
    return out


def _continuation_prefill(out: StepOutcome) -> dict[str, float]:
    """Prefill of continuations, counted where tokens were fed to the model, vs re-encoding every prefix.

    Each continuation's first call is recorded by the engine (prefill computed for it); re-encoding would
    have fed the whole prefix context.
    """
    computed = reencode = 0
    for tree in out.trees:
        for n in tree.nodes[1:]:
            parent = n.parent
            if parent is None:  # only the root has none
                continue
            if (
                n.path_id >= tree.num_bare and tree.nodes[parent].path_id != n.path_id
            ):  # a continuation's first node
                reencode += len(tree.fork_state[parent].context)
                computed += n.prefill_computed
    return {
        M.CONTINUATION_PREFILL_COMPUTED: float(computed),
        M.CONTINUATION_PREFILL_REENCODE: float(reencode),
    }


def run_rollout_bench(
    cfg: BenchRolloutConfig, progress: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    check_data(cfg.env)  # a bad data file fails before any model loads
    progress(tracking.where(cfg.tracking))
    out = results_dir(cfg.out_dir, cfg)
    warm = int(cfg.steps * cfg.warmup_fraction)
    summary: dict[str, Any] = {"allocators": {}}
    series = {}
    runs_bar = bar(progress, len(cfg.allocators) * cfg.seeds, "bench rollout", "run")
    done: dict[tuple[str, int], RunRecord] = {}
    # Seed-major: an interrupted benchmark holds every allocator's first seeds (and resumes from out_dir/runs).
    for offset in range(cfg.seeds):
        for name in cfg.allocators:
            done[name, offset] = cached_run(cfg, name, cfg.seed + offset, progress)
            runs_bar.update()
    for name in cfg.allocators:
        results = [done[name, offset] for offset in range(cfg.seeds)]
        runs = [r[0] for r in results]
        s: dict[str, Any] = {
            k: float(np.mean([np.mean([st[m] for st in r[warm:]]) for r in runs])) for k, m in KEYS.items()
        }
        for k in INT_KEYS:
            s[k] = int(round(s[k]))
        s["continuation_prefill_fraction"] = (
            s["continuation_prefill_computed"] / s["continuation_prefill_reencode"]
            if s["continuation_prefill_reencode"]
            else 0.0
        )
        s["generated_tokens_per_leaf"] = s["generated_tokens"] / max(s["leaves"], 1)
        per_seed = _per_seed(runs, warm)
        s["effective_ratio_per_seed"] = per_seed["effective_ratio"]
        for key, values in per_seed.items():
            s[f"{key}_ci95"] = ci95(values)
        s["calibration"] = mean_calibration([r[1] for r in results])
        summary["allocators"][name] = s
        series[name] = [M.mean_metrics([r[i] for r in runs]) for i in range(cfg.steps)]
        progress(f"{name}: effective ratio {s['effective_ratio']:.3f}, {s['generated_tokens']} tokens/step")
    named = summary["allocators"]
    if "trace" in named and "grpo" in named and named["grpo"]["effective_ratio"] > 0:
        summary["trace_over_grpo_effective_ratio"] = (
            named["trace"]["effective_ratio"] / named["grpo"]["effective_ratio"]
        )
    write_results(out, summary, cfg.json_path)
    table = format_table(cfg, summary)
    (out / "table.txt").write_text(table + "\n")
    if cfg.tracking.enabled:
        import mlflow  # slow to import: mlflow

        for name, s in summary["allocators"].items():
            with tracking.run(
                cfg.tracking, f"bench-rollout-{name}", tags={"bench": "rollout", "allocator": name}
            ):
                tracking.log_params({**to_flat_dict(cfg), "allocator.name": name})
                tracking.log_step_series(series[name])
                tracking.log_metrics({M.bench(k): v for k, v in s.items() if isinstance(v, (int, float))})
                for group, cal in s["calibration"].items():
                    tracking.log_metrics({M.calibration(group, k): v for k, v in cal.items()})
                mlflow.log_artifact(str(out / "results.json"))
    return summary


def _pm(half: float | None) -> str:
    return f"±{half:.3f}" if half is not None else "±  -  "


def format_table(cfg: BenchRolloutConfig, summary: dict[str, Any]) -> str:
    b = cfg.budget
    lines = [
        f"budget: L={b.leaves} leaves/step | flat: G={b.group_size} on {b.num_groups} prompts | tree: M={b.roots}, "
        f"N={b.continuations} | pool {b.num_candidates} of {getattr(env_section(cfg.env), 'num_tasks', '?')} tasks | steps={cfg.steps}, seeds={cfg.seeds}",
        f"{'allocator':<10} {'ER':>6} {'(95 %)':>7} {'leafER':>6} {'mixed':>5} {'leaves':>6} {'gen tok':>7} {'tok/leaf':>8} "
        f"{'prefill reused':>14} {'computed':>8} {'cont. recompute':>15} {'tools':>5} {'replayed':>8} {'wall s':>6}",
    ]
    for name, s in summary["allocators"].items():
        lines.append(
            f"{name:<10} {s['effective_ratio']:>6.3f} {_pm(s.get('effective_ratio_ci95')):>7} "
            f"{s['leaf_effective_ratio']:>6.3f} {s['mixed_groups_per_step']:>5.1f} "
            f"{s['leaves']:>6d} {s['generated_tokens']:>7d} {s['generated_tokens_per_leaf']:>8.1f} "
            f"{s['prefill_tokens_reused']:>14d} {s['prefill_tokens_computed']:>8d} "
            f"{s['continuation_prefill_fraction']:>15.3f} {s['tool_calls']:>5d} {s['tool_calls_replayed']:>8d} {s['wall_s']:>6.1f}"
        )
    if "trace_over_grpo_effective_ratio" in summary:
        lines.append(
            f"effective ratio trace / grpo: {summary['trace_over_grpo_effective_ratio']:.2f} "
            "(the paper, Qwen3-8B math: 60.6 / 26.8 = 2.26)"
        )
    return "\n".join(lines)
