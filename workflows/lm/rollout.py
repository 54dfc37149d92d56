"""``tracerl rollout``: allocation-and-rollout steps of the LM policy; writes trees as JSONL and an HTML view.

The predictor learns across the ``steps`` steps (cold at first: uniform allocation until
``predictor.warmup_steps`` fits); the last step's trees are written with their decisions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracerl.config import RolloutConfig
from tracerl.engine.mc_scorer import mc_metrics
from tracerl.engine.step import StepOutcome
from tracerl.engine.step_stats import step_metrics
from tracerl.engine.stepper import Stepper
from tracerl.envs.registry import check_data
from tracerl.metrics import (
    EFFECTIVE_RATIO,
    GENERATED_TOKENS,
    LEAVES,
    PREFILL_COMPUTED,
    PREFILL_REUSED,
    SUCCESS_RATE,
    TOOL_CALLS,
)
from tracerl.tree_io import tree_to_record
from tracerl.workflows.lm.stack import LMStack, build_stack, stack_allocation, task_prompts
from tracerl.workflows.lm.viewer import render_html
from tracerl.workflows.ops.results import results_dir


@dataclass(frozen=True)
class RolloutResult:
    """What ``tracerl rollout`` wrote and the last step's metrics (docs/metrics.md)."""

    out_dir: Path
    metrics: dict[str, float]

    def format(self) -> str:
        m = self.metrics
        return (
            f"wrote {self.out_dir / 'trees.jsonl'} and {self.out_dir / 'trees.html'}\n"
            f"effective ratio {m[EFFECTIVE_RATIO]:.3f}, {m[LEAVES]:.0f} leaves, "
            f"{m[GENERATED_TOKENS]:.0f} generated tokens, {m[TOOL_CALLS]:.0f} tool calls, "
            f"prefill re-used {m[PREFILL_REUSED]:.0f} / computed {m[PREFILL_COMPUTED]:.0f}"
        )


def outcome_records(out: StepOutcome) -> list[dict[str, Any]]:
    """Every tree of a step with its root score, bare rollouts, prefix scores and continuations."""
    index = {id(p): i for i, p in enumerate(out.pool)}
    scores: dict[int, dict[int, float]] = {}
    for ti, nid, p in out.prefix_scores:
        scores.setdefault(ti, {})[nid] = p
    records = []
    for ti, tree in enumerate(out.trees):
        i = index[id(tree.prompt)]
        conts = {}
        if out.expansions:
            ex = out.expansions[ti]
            conts = {int(n): int(k) for n, k in zip(ex.node_ids, ex.counts) if k}
        records.append(
            tree_to_record(tree, float(out.root_scores[i]), int(out.root_counts[i]), scores.get(ti), conts)
        )
    return records


def run_rollout(cfg: RolloutConfig, progress: Callable[[str], None] = lambda s: None) -> RolloutResult:
    check_data(cfg.env)  # a bad data file fails before any model loads
    stack = build_stack(cfg.model, cfg.sampler, cfg.env, cfg.seed)
    return rollout_steps(cfg, stack, progress)


def rollout_steps(
    cfg: RolloutConfig, stack: LMStack, progress: Callable[[str], None] = lambda s: None
) -> RolloutResult:
    """``cfg.steps`` steps on a built stack; writes the last step's trees (trees.jsonl, trees.html), its metrics
    and the resolved config to ``cfg.out_dir``."""
    out_dir = results_dir(cfg.out_dir, cfg)
    # Only some environments have a sandbox (math); any may report protections the machine lacks.
    for w in getattr(stack.env, "warnings", []):
        progress(w)
    allocator, predictor = stack_allocation(cfg.allocator, cfg.predictor, stack, cfg.seed)
    prompts = task_prompts(cfg.env)
    stepper = Stepper(
        prompts, allocator, predictor, stack.engine, np.random.default_rng(cfg.seed), cfg.pipeline.mode
    )
    metrics: dict[str, float] = {}
    out = None
    for s in range(cfg.steps):
        t0 = time.perf_counter()
        out = stepper.run(s, cfg.budget)
        metrics = step_metrics(out) | mc_metrics(predictor)
        predictor.fit(out.sampled_trees)
        allocator.observe(out.sampled_trees)
        progress(
            f"step {s}: {len(out.trees)} trees, {metrics[LEAVES]:.0f} leaves, effective ratio "
            f"{metrics[EFFECTIVE_RATIO]:.2f}, success {metrics[SUCCESS_RATE]:.2f} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    assert out is not None
    records = outcome_records(out)
    with open(out_dir / "trees.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    (out_dir / "trees.html").write_text(
        render_html(records, f"tracerl rollout: allocator {cfg.allocator.name}")
    )
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return RolloutResult(out_dir, metrics)
