"""What the MLflow runs table shows at a glance: run tags, the run description and the ``key/`` metrics.

The runs table lists tags and the latest value of every metric as columns; a run's description
(``mlflow.note.content``) is its Overview text. ``key/`` metrics repeat the numbers users compare runs by
under names that sort together (the originals keep their names): see docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOTE = "mlflow.note.content"

# key/ name -> the per-step metric it repeats (key/generated_tokens is the run's running total instead)
KEY_ALIASES = {"key/accuracy": "eval/accuracy", "key/effective_ratio": "rollout/effective_ratio"}
KEY_TOKENS = "key/generated_tokens"


def budget_shape(budget: Any, allocator: Any) -> str:
    """The budget shape in the paper's letters, e.g. ``L=15 N=2 m_max=4``."""
    if budget.token_budget is not None:
        head = f"tokens={budget.token_budget}"
    elif budget.num_leaves is not None:
        head = f"L={budget.num_leaves}"
    else:
        head = f"M={budget.num_roots}"
    return f"{head} N={budget.continuations} m_max={allocator.m_max}"


def train_tags(cfg: Any) -> dict[str, str]:
    """Tags and description of a training run: allocator, budget shape, environment (the testbed), policy, seed."""
    shape = budget_shape(cfg.budget, cfg.allocator)
    model = str(cfg.model.path).rstrip("/").rsplit("/", 1)[-1]
    note = (f"{cfg.allocator.name} on {cfg.env.name} with the {model} policy: {cfg.steps} steps, budget {shape} "
            f"(G={cfg.budget.group_size}), seed {cfg.seed}. Compare runs by key/accuracy (held-out greedy "
            "accuracy), key/effective_ratio and key/generated_tokens (docs/metrics.md).")
    return {"tracerl.env": cfg.env.name, "tracerl.budget": shape, "tracerl.seed": str(cfg.seed),
            "tracerl.model": model, NOTE: note}


def sweep_tags(cfg: Any, name: str) -> dict[str, str]:
    """Tags and description of a sweep's parent run."""
    space = ", ".join(f"{k} in {v}" for k, v in cfg.space.items()) or "no space"
    note = (f"Sweep {name}: {cfg.num_samples} trials of {cfg.allocator.name} on {cfg.env.name} ({cfg.steps} steps "
            f"each, seed {cfg.seed}) over {space}; {cfg.mode} {cfg.metric} ({cfg.scheduler}). Each trial is a child "
            "run: expand this row in the runs table.")
    return {"tracerl.env": cfg.env.name, "tracerl.allocator": cfg.allocator.name,
            "tracerl.budget": budget_shape(cfg.budget, cfg.allocator), "tracerl.seed": str(cfg.seed), NOTE: note}


def key_metrics(metrics: Mapping[str, float], generated_tokens_total: float | None = None) -> dict[str, float]:
    """The ``key/`` copies of a step's metrics (``generated_tokens_total``: the run's tokens so far)."""
    out = {k: float(metrics[src]) for k, src in KEY_ALIASES.items() if src in metrics}
    if generated_tokens_total is not None:
        out[KEY_TOKENS] = float(generated_tokens_total)
    return out


def runs_url(base_url: str, experiment_id: str) -> str:
    """The runs page of an experiment in MLflow 3's UI (a hash-routed app)."""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
