"""``tracerl sweep``: budget-shape sweeps with Ray Tune and Optuna's sampler.

Each trial is a full ``tracerl train`` run: the sampled values are applied as overrides to the sweep's
base config and validated like any command line. Its Ray Train reports (every step) reach Tune through
``TuneReportCallback``, so a scheduler (ASHA) can stop trailing trials; the Ray Train placement group a stopped
trial leaves reserved is removed (``workflows/ops/placement_groups.py``). MLflow holds one parent run for
the sweep and one child run per trial (tags ``mlflow.parentRunId``, ``tracerl.sweep``, ``tracerl.trial``);
the best configuration is printed and tagged on the parent. Running the same command with the same
``sweep_name`` after an interruption restores the Tune experiment and finishes it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.config_loader import compose, to_yaml
from tracerl.envs.registry import check_data
from tracerl.workflows.ops.progress import bar
from tracerl.workflows.ops.ray_utils import check_resources, init_ray
from tracerl.workflows.study.config import SweepConfig
from tracerl.workflows.tracking import store as trk
from tracerl.workflows.tracking.run_info import sweep_tags
from tracerl.workflows.train.run import RESOURCE_KNOBS, resolve_paths, resource_demand, train


def search_space(space: dict[str, Any]) -> dict[str, Any]:
    """Tune domains from the config's space (lists -> choice, {low, high, log} -> (log)uniform)."""
    from ray import tune  # slow to import: ray

    out: dict[str, Any] = {}
    for key, dom in space.items():
        if isinstance(dom, list):
            out[key] = tune.choice(list(dom))
        elif dom.get("log"):
            out[key] = tune.loguniform(float(dom["low"]), float(dom["high"]))
        else:
            out[key] = tune.uniform(float(dom["low"]), float(dom["high"]))
    return out


def _trial(config: dict[str, Any], base_yaml: str, parent_run_id: str, sweep: str) -> None:
    """One Tune trial: the base config with this trial's values, run through the train workflow."""
    # slow to import: ray
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial = ray.tune.get_context().get_trial_name()
    overrides = [f"{k}={v}" for k, v in sorted(config.items())] + [f"run_name={sweep}-{trial}"]
    cfg = compose(TrainConfig, base_yaml, overrides)
    # A trial restored after the sweep was interrupted continues its own MLflow run from its last checkpoint.
    earlier = _unfinished_child(cfg, parent_run_id, trial)
    if earlier is not None:
        cfg = dataclasses.replace(cfg, resume=earlier)
    # Every step's metrics reach Tune through the callback; the run's summary lives in its MLflow child run.
    train(
        cfg,
        tags={"mlflow.parentRunId": parent_run_id, "tracerl.sweep": sweep, "tracerl.trial": trial},
        callbacks=[TuneReportCallback()],
    )


def _interrupted(sweep_dir: Path, grid: Any) -> bool:
    """Whether ``Tuner.fit`` returned because of Ctrl-C (SIGINT): Tune then saves its state with the trials it cut
    short still pending or running, while its in-memory results may already call them terminated."""
    states = sorted(sweep_dir.glob("experiment_state-*.json"))  # one per session, named by its start time
    try:
        trials = json.loads(states[-1].read_text())["trial_data"]
        return any(json.loads(t[0])["status"] not in ("TERMINATED", "ERROR") for t in trials)
    except (IndexError, KeyError, TypeError, ValueError):  # no or another state format: the in-memory view
        return bool(grid.num_terminated + grid.num_errors < len(grid))


def _unfinished_child(cfg: TrainConfig, parent_run_id: str, trial: str) -> str | None:
    import mlflow  # slow to import: mlflow

    client = mlflow.MlflowClient(tracking_uri=cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=(f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`tracerl.trial` = '{trial}'"),
    )
    for r in runs:
        storage = r.data.tags.get("tracerl.storage")
        if r.info.status != "FINISHED" and storage and (Path(storage) / "config.yaml").is_file():
            return str(r.info.run_id)
        if r.info.status == "RUNNING":  # killed before it saved anything: a fresh run replaces it
            client.set_terminated(r.info.run_id, status="KILLED")
    return None


class TrialRecord(TypedDict):
    """One trial of a sweep, as the summary lists it."""

    trial: str
    config: dict[str, Any]
    error: str | None
    metric_last: float | None
    steps: int
    stopped_early: bool


class SweepSummary(TypedDict, total=False):
    """What ``run_sweep`` returns and writes to ``<name>.summary.json``; ``best_config`` only when a trial
    finished, ``interrupted`` only when Ctrl-C cut the sweep short."""

    sweep: str
    parent_run_id: str
    trials: list[TrialRecord]
    wall_s: float
    tracking_uri: str | None
    interrupted: bool
    best_config: dict[str, Any]


def run_sweep(cfg: SweepConfig, progress: Callable[[str], None] = lambda s: None) -> SweepSummary:
    """Run (or resume, by ``sweep_name``) the sweep: checks before Ray starts, the parent run, the Tuner, then the
    trials' records and the best configuration on the parent."""
    # slow to import: mlflow, ray (ops.placement_groups)
    import mlflow

    from tracerl.workflows.ops.placement_groups import release_when_trials_end

    if not cfg.train.tracking.enabled:
        raise ValueError("tracerl sweep needs MLflow tracking (tracking.enabled=true)")
    check_data(cfg.train.env)  # before Ray starts or the parent run exists
    progress(trk.where(cfg.train.tracking))
    name = cfg.sweep_name or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    base = resolve_paths(cfg.train)
    root = Path(base.out_dir) / "sweeps"
    root.mkdir(parents=True, exist_ok=True)
    sweep_dir = root / name
    _start_ray_if_it_fits(cfg, base, progress)  # before the parent run: a sweep that cannot fit leaves no run
    exp_id = trk.setup(base.tracking)
    client = mlflow.MlflowClient()
    parent = _parent_run(client, exp_id, cfg, name, root / f"{name}.json", progress)
    base_yaml = root / f"{name}.base.yaml"
    base_yaml.write_text(to_yaml(base))
    tuner = _tuner(cfg, name, root, str(base_yaml), parent, progress)
    t0 = time.perf_counter()
    status = "FAILED"
    trials_bar = bar(progress, cfg.num_samples, f"sweep {name}", "trial")

    def ended() -> int:
        return sum(
            r.info.status in ("FINISHED", "KILLED", "FAILED")
            for r in client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
        )

    trials_bar.follow(ended, every=5.0)
    try:
        grid = tuner.fit()
        release_when_trials_end(
            progress
        )  # a stopped trial's Train group outlives it on a Ray that outlives the sweep
        interrupted = _interrupted(sweep_dir, grid)
        status = "KILLED" if interrupted else "FINISHED"
    finally:
        trials_bar.close()
        client.set_terminated(parent, status=status)
    summary: SweepSummary = {
        "sweep": name,
        "parent_run_id": parent,
        "trials": [],
        "tracking_uri": base.tracking.uri,
    }
    if interrupted:
        client.set_tag(parent, "tracerl.interrupted", time.strftime("%Y-%m-%d %H:%M:%S"))
        progress(
            f"sweep {name} interrupted: run the same command (--name {name}) to resume it; finished trials "
            "are kept and an interrupted trial continues its MLflow run from its last checkpoint"
        )
        return {**summary, "interrupted": True, "wall_s": time.perf_counter() - t0}
    summary["trials"], best_config = _records(cfg, grid, client, exp_id, name, parent, progress)
    summary["wall_s"] = time.perf_counter() - t0
    if best_config is not None:
        summary["best_config"] = best_config
    (root / f"{name}.summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _start_ray_if_it_fits(cfg: SweepConfig, base: Any, progress: Callable[[str], None]) -> None:
    """Start (or join) Ray and check that the concurrent trials fit: each holds a Tune slot plus a whole training
    run's actors (space values that change the pools are not counted: the base config's shares are)."""
    init_ray(cfg.train.cluster)
    n = cfg.max_concurrent_trials
    demand = [
        (what, n * k, c, g) for what, k, c, g in [("trials", 1, cfg.trial_cpus, 0.0), *resource_demand(base)]
    ]
    check_resources(
        demand, cfg.train.cluster, "max_concurrent_trials, trial_cpus, " + RESOURCE_KNOBS, progress
    )


def _records(
    cfg: SweepConfig,
    grid: Any,
    client: Any,
    exp_id: str,
    name: str,
    parent: str,
    progress: Callable[[str], None],
) -> tuple[list[TrialRecord], dict[str, Any] | None]:
    """Every trial's record, and the best trial's configuration (tagged on the parent run), None if none ended."""
    results = [grid[i] for i in range(len(grid))]
    children = {
        r.data.tags.get("tracerl.trial", ""): r.info
        for r in client.search_runs(
            [exp_id],
            filter_string=f"tags.`tracerl.sweep` = '{name}' and tags.`mlflow.parentRunId` = '{parent}'",
        )
    }
    records = [_trial_record(cfg, r, children, client, progress) for r in results]
    ok = [r for r in results if r.error is None and r.metrics]
    best = grid.get_best_result(metric=cfg.metric, mode=cfg.mode, scope=cfg.scope) if ok else None
    if best is None:
        return records, None
    _tag_best(client, parent, best, children)
    return records, dict(best.config)


def _parent_run(
    client: Any, exp_id: str, cfg: SweepConfig, name: str, meta_path: Path, progress: Callable[[str], None]
) -> str:
    """The sweep's MLflow parent run: the one its metadata file names (a resumed sweep), or a new one with the
    space and the search settings as params."""
    if meta_path.is_file():
        parent = str(json.loads(meta_path.read_text())["parent_run_id"])
        client.update_run(parent, status="RUNNING")
        progress(f"resuming sweep {name} (MLflow parent run {parent})")
        return parent
    parent = str(
        client.create_run(
            exp_id,
            run_name=name,
            tags={"tracerl.command": "sweep", "tracerl.sweep": name, **sweep_tags(cfg, name)},
        ).info.run_id
    )
    for k, v in cfg.space.items():
        client.log_param(parent, f"space.{k}", json.dumps(v))
    for k in ("num_samples", "metric", "mode", "scope", "scheduler"):
        client.log_param(parent, k, str(getattr(cfg, k)))
    meta_path.write_text(json.dumps({"parent_run_id": parent}))
    return parent


def _tuner(
    cfg: SweepConfig, name: str, root: Path, base_yaml: str, parent: str, progress: Callable[[str], None]
) -> Any:
    """The Tune experiment: restored from ``root / name`` when it exists, else new (ASHA or FIFO, Optuna)."""
    # slow to import: ray, optuna (and ops.placement_groups, which imports ray)
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from tracerl.workflows.ops.placement_groups import ReleaseStoppedTrialGroups

    trainable = tune.with_resources(
        tune.with_parameters(_trial, base_yaml=base_yaml, parent_run_id=parent, sweep=name),
        {"cpu": cfg.trial_cpus},
    )
    sweep_dir = root / name
    if tune.Tuner.can_restore(str(sweep_dir)):
        return tune.Tuner.restore(str(sweep_dir), trainable, resume_unfinished=True, resume_errored=True)
    # max_t one past the last step: ASHA stops a trial that reaches max_t, which would cut a finished trial's
    # run short before it closes its MLflow run.
    scheduler = (
        tune.schedulers.ASHAScheduler(
            time_attr="step", grace_period=cfg.grace_period, max_t=cfg.train.num_steps + 1
        )
        if cfg.scheduler == "asha"
        else tune.schedulers.FIFOScheduler()
    )
    return tune.Tuner(
        trainable,
        param_space=search_space(cfg.space),
        tune_config=tune.TuneConfig(
            metric=cfg.metric,
            mode=cfg.mode,
            num_samples=cfg.num_samples,
            max_concurrent_trials=cfg.max_concurrent_trials,
            scheduler=scheduler,
            search_alg=OptunaSearch(
                seed=cfg.train.seed, points_to_evaluate=[dict(p) for p in cfg.first_trials] or None
            ),
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=str(root), callbacks=[ReleaseStoppedTrialGroups(progress)]
        ),
    )


def _child(children: dict[str, Any], result: Any) -> Any:
    """The MLflow child run of a Tune result (its trial name ends with the result's trial id), or None."""
    trial_id = str((result.metrics or {}).get("trial_id"))
    return next((info for t, info in children.items() if t and t.endswith(trial_id)), None)


def _trial_record(
    cfg: SweepConfig, r: Any, children: dict[str, Any], client: Any, progress: Callable[[str], None]
) -> TrialRecord:
    """One Tune result as the summary lists it; a trial the scheduler stopped is tagged so on its MLflow run (and
    marked KILLED if it was cut mid-step: not a failure of its own)."""
    steps = int((r.metrics or {}).get("step", 0))
    stopped = r.error is None and cfg.train.steps is not None and steps < cfg.train.steps
    record: TrialRecord = {
        "trial": Path(r.path).name if r.path else "?",
        "config": r.config,
        "error": None if r.error is None else str(r.error)[:300],
        "metric_last": (r.metrics or {}).get(cfg.metric),
        "steps": steps,
        "stopped_early": stopped,
    }
    run = _child(children, r)
    if stopped and run is not None:  # the scheduler ended it: what it logged stays, the run says why it ended
        client.set_tag(run.run_id, "tracerl.stopped_early", cfg.scheduler)
        if run.status in ("RUNNING", "FAILED"):
            client.set_terminated(run.run_id, status="KILLED")
        progress(
            f"trial {record['trial']} stopped early by {cfg.scheduler} after {steps} of {cfg.train.steps} steps"
        )
    return record


def _tag_best(client: Any, parent: str, best: Any, children: dict[str, Any]) -> None:
    """The best configuration and trial as tags of the parent; its row in the runs table shows the best trial's
    ``key/`` numbers."""
    import mlflow  # slow to import: mlflow

    client.set_tag(parent, "tracerl.best_config", json.dumps(best.config))
    client.set_tag(parent, "tracerl.best_trial", Path(best.path).name)
    best_run = _child(children, best)
    if best_run is not None:
        latest = client.get_run(best_run.run_id).data.metrics
        client.log_batch(
            parent,
            metrics=[
                mlflow.entities.Metric(k, v, int(time.time() * 1000), 0)
                for k, v in latest.items()
                if k.startswith(M.KEY)
            ],
        )
