"""What the MLflow runs table shows at a glance: run tags, the run description and the ``key/`` metrics.

The runs table lists tags and the latest value of every metric as columns; a run's description
(``mlflow.note.content``) is its Overview text. ``key/`` metrics repeat the numbers users compare runs by
under names that sort together (the originals keep their names): see docs/metrics.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tracerl import metrics as M

NOTE = "mlflow.note.content"

# key/ name -> the per-step metric it repeats (key/generated_tokens is the run's running total instead)
KEY_ALIASES = {M.KEY_ACCURACY: M.EVAL_ACCURACY, M.KEY_EFFECTIVE_RATIO: M.EFFECTIVE_RATIO}
KEY_TOKENS = M.KEY_GENERATED_TOKENS


def budget_shape(budget: Any, allocator: Any, space: Mapping[str, Any] | None = None) -> str:
    """The budget shape in the paper's letters, e.g. ``L=15 N=2 m_max=4``; a sweep's swept keys show their
    space (``N=[2, 4]``)."""
    space = space or {}

    def val(key: str, value: Any) -> Any:
        return space.get(key, value)

    if budget.token_budget is not None:
        head = f"tokens={val('budget.token_budget', budget.token_budget)}"
    elif budget.num_leaves is not None:
        head = f"L={val('budget.num_leaves', budget.num_leaves)}"
    else:
        head = f"M={val('budget.num_roots', budget.num_roots)}"
    return f"{head} N={val('budget.continuations', budget.continuations)} m_max={val('allocator.m_max', allocator.m_max)}"


def train_tags(cfg: Any) -> dict[str, str]:
    """Tags and description of a training run: allocator, budget shape, environment (the testbed), policy, seed."""
    shape = budget_shape(cfg.budget, cfg.allocator)
    model = str(cfg.model.path).rstrip("/").rsplit("/", 1)[-1]
    limits = []  # what ends the run, whichever comes first
    if cfg.stop.tokens is not None:
        limits.append(f"{cfg.stop.tokens} tokens")
    if cfg.stop.cpu_s is not None:
        limits.append(f"{cfg.stop.cpu_s:g} CPU s")
    if cfg.steps is not None:
        limits.append(f"{cfg.steps} steps")
    length = " or ".join(limits)
    note = (
        f"{cfg.allocator.name} on {cfg.env.name} with the {model} policy: {length}, budget {shape} "
        f"(G={cfg.budget.group_size}), seed {cfg.seed}. Compare runs by key/accuracy (held-out greedy "
        "accuracy), key/effective_ratio and key/generated_tokens (docs/metrics.md)."
    )
    return {
        "tracerl.env": cfg.env.name,
        "tracerl.budget": shape,
        "tracerl.seed": str(cfg.seed),
        "tracerl.model": model,
        NOTE: note,
    }


def sweep_tags(cfg: Any, name: str) -> dict[str, str]:
    """Tags and description of a sweep's parent run (``cfg``: a ``SweepConfig``)."""
    space = ", ".join(f"{k} in {v}" for k, v in cfg.space.items()) or "no space"
    t = cfg.train
    note = (
        f"Sweep {name}: {cfg.num_samples} trials of {t.allocator.name} on {t.env.name} ({t.steps} steps "
        f"each, seed {t.seed}) over {space}; {cfg.mode} {cfg.metric} ({cfg.scheduler}). Each trial is a child "
        "run (expand this row in the runs table); this run's key/ metrics are the best trial's."
    )
    return {
        "tracerl.env": t.env.name,
        "tracerl.allocator": t.allocator.name,
        "tracerl.budget": budget_shape(t.budget, t.allocator, cfg.space),
        "tracerl.seed": str(t.seed),
        NOTE: note,
    }


def key_metrics(
    metrics: Mapping[str, float], generated_tokens_total: float | None = None
) -> dict[str, float]:
    """The ``key/`` copies of a step's metrics (``generated_tokens_total``: the run's tokens so far)."""
    out = {k: float(metrics[src]) for k, src in KEY_ALIASES.items() if src in metrics}
    if generated_tokens_total is not None:
        out[KEY_TOKENS] = float(generated_tokens_total)
    return out


# The runs table's columns (MLflow's UI shows no metric or tag column until one is chosen): a view state shared
# through an experiment tag, which the UI loads from ``?viewStateShareKey=``.
VIEW_KEY = "tracerl"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
VIEW_COLUMNS = (
    "metrics.`key/accuracy`",
    "metrics.`key/effective_ratio`",
    "metrics.`key/generated_tokens`",
    "tags.`tracerl.allocator`",
    "tags.`tracerl.budget`",
    "tags.`tracerl.env`",
    "tags.`tracerl.seed`",
)


def runs_view_state() -> str:
    """The shared view state (JSON) of the runs table: the key/ metrics and tracerl tags as columns."""
    widths = dict(zip(VIEW_COLUMNS, (110, 135, 150, 120, 150, 90, 90)))  # each header readable in full
    return json.dumps(
        {"selectedColumns": list(VIEW_COLUMNS), "columnOrder": list(VIEW_COLUMNS), "columnWidths": widths}
    )


def runs_url(base_url: str, experiment_id: str) -> str:
    """The runs page of an experiment in MLflow 3's UI (a hash-routed app), in its model-training mode and with
    the columns of ``runs_view_state`` (stored on the experiment by ``tracerl ui``)."""
    return (
        f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"
    )
