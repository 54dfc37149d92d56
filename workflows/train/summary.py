"""What ``tracerl train``'s driver reads back from a run's metrics while and after it runs: the progress bar, the
compute summary (what stopped it, the overshoot past its limits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.runs import RunSummary, metric_series
from tracerl.workflows.train.budget import Totals, overshoot, stop_reason


def compute_summary(client: Any, run_id: str, cfg: TrainConfig) -> RunSummary:
    """The run's compute at its last step (``total/``), what stopped it (``stopped_by``: tokens, cpu_s, steps;
    null if it ended otherwise) and the overshoot past its compute limits."""
    last = {
        k: metric_series(client, run_id, k) for k in (M.TOTAL_GENERATED_TOKENS, M.TOTAL_LEAVES, M.TOTAL_CPU_S)
    }
    tokens = last[M.TOTAL_GENERATED_TOKENS]
    if not tokens:
        return RunSummary(stopped_by=None)
    step = max(tokens)
    totals = Totals(
        tokens[step],
        last[M.TOTAL_LEAVES].get(step, 0.0),
        step,
        last[M.TOTAL_CPU_S].get(step, 0.0),
    )
    out = RunSummary(stopped_by=stop_reason(cfg.stop, cfg.steps, totals), total_cpu_s=totals.cpu_s)
    over = overshoot(cfg.stop, totals)
    if M.OVERSHOOT_TOKENS in over:
        out["overshoot_tokens"] = over[M.OVERSHOOT_TOKENS]
    if M.OVERSHOOT_CPU_S in over:
        out["overshoot_cpu_s"] = over[M.OVERSHOOT_CPU_S]
    return out


def progress_bar(
    cfg: TrainConfig, client: Any, run_id: str, state: CheckpointState, open_bar: Callable[..., Any]
) -> Any:
    """The run's progress bar: steps logged out of ``steps``, or with a compute stop the running total of its first
    limit (tokens, else CPU seconds) out of that limit."""
    name = f"train {cfg.run_name or run_id[:8]}"
    if cfg.stop.enabled:
        key, limit, unit, start = (
            (M.TOTAL_GENERATED_TOKENS, cfg.stop.tokens, "token", state.spent[0])
            if cfg.stop.tokens is not None
            else (M.TOTAL_CPU_S, cfg.stop.cpu_s, "CPU second", state.cpu_s)
        )
        b = open_bar(int(limit or 0), name, unit, int(start))

        def read() -> int:
            hist = client.get_metric_history(run_id, key)
            return int(max(hist, key=lambda m: m.step).value) if hist else int(start)

        b.follow(read)
        return b
    b = open_bar(cfg.num_steps, name, "step", state.step)
    b.follow(lambda: max((m.step for m in client.get_metric_history(run_id, M.LOSS)), default=0))
    return b
