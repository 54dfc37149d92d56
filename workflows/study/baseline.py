"""The study's baseline: each testbed's starting checkpoint evaluated once (greedy, on the cells' held-out tasks).

Every cell of a testbed starts from the same checkpoint and evaluates the same held-out tasks greedily, so its "before"
is one number per testbed: the baseline runs once, as a child run of the study tagged ``tracerl.study.baseline``
(metric ``eval/accuracy`` at step 0 and the per-task outcomes ``eval/outcomes_step_00000.json``), and the cells
skip their own evaluation at step 0 (``eval_at_start=false``). The report reads every cell's ``acc_before`` here.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.workflows.tracking import frame
from tracerl.workflows.train.evaluate import evaluate_prompts, local_runner, task_outcomes

BASELINE_TAG = "tracerl.study.baseline"

BaselineFn = Callable[[TrainConfig], dict[str, float]]
"""A testbed's first cell config -> per-task greedy outcomes of its starting checkpoint."""


def evaluate_start(cfg: TrainConfig) -> dict[str, float]:
    """Greedy outcomes of ``cfg.model`` on ``cfg.env``'s held-out tasks, in this process (the real engine)."""
    from tracerl.workflows.lm.stack import task_prompts  # slow to import: torch, transformers (lm.stack)

    prompts = task_prompts(cfg.env, held_out=True)
    _, traces = evaluate_prompts(
        local_runner(cfg.model, cfg.sampler, cfg.env), prompts, 0, 0.0, cfg.seed + 10_000
    )
    return task_outcomes(traces)


def _ray_evaluate(cfg: TrainConfig) -> dict[str, float]:
    import ray  # slow to import: ray (and an in-process study never loads Ray)

    outcomes: dict[str, float] = ray.get(ray.remote(num_cpus=1, max_retries=0)(evaluate_start).remote(cfg))
    return outcomes


def finished_baselines(client: Any, exp_id: str, parent: str) -> dict[str, str]:
    """Testbed -> run id of its newest FINISHED baseline child run."""
    rows = frame.newest_finished(frame.children(client, exp_id, parent), [f"tags.{BASELINE_TAG}"])
    return {str(r[f"tags.{BASELINE_TAG}"]): str(r["run_id"]) for _, r in rows.iterrows()}


def baseline_accuracy(client: Any, run_id: str) -> float:
    """The accuracy a baseline run logged at step 0."""
    (m,) = client.get_metric_history(run_id, M.EVAL_ACCURACY)
    return float(m.value)


def ensure_baselines(
    client: Any,
    exp_id: str,
    parent: str,
    configs: dict[str, TrainConfig],
    tags: dict[str, str],
    progress: Callable[[str], None],
    evaluate: BaselineFn | None = None,
) -> dict[str, float]:
    """Evaluate each testbed in ``configs`` (testbed -> one of its cell configs) that has no finished baseline yet;
    returns testbed -> baseline accuracy for all of them. ``evaluate`` replaces the Ray task (a unit test's fake)."""
    done = finished_baselines(client, exp_id, parent)
    out: dict[str, float] = {}
    for tb, cfg in configs.items():
        if tb in done:
            out[tb] = baseline_accuracy(client, done[tb])
            continue
        progress(f"baseline {tb}: evaluating {cfg.model.path} once on the held-out tasks (greedy)")
        run_id = client.create_run(
            exp_id,
            run_name=f"{tags.get('tracerl.study', 'study')}-{tb}-baseline",
            tags={**tags, BASELINE_TAG: tb},
        ).info.run_id
        try:
            outcomes = (evaluate or _ray_evaluate)(cfg)
            if not outcomes:
                raise ValueError(f"testbed {tb}: the held-out task set is empty")
            acc = sum(outcomes.values()) / len(outcomes)
            client.log_param(run_id, "model.path", cfg.model.path)
            client.log_metric(run_id, M.EVAL_ACCURACY, acc, step=0)
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "outcomes_step_00000.json").write_text(json.dumps(outcomes))
                client.log_artifacts(run_id, tmp, "eval")
        except BaseException:
            client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status="FINISHED")
        progress(f"baseline {tb}: held-out greedy accuracy {acc:.3f} ({len(outcomes)} tasks)")
        out[tb] = acc
    return out
