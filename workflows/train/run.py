"""``tracerl train``: TRACE (or any baseline allocator) end to end on Ray Train or in-process, tracked in MLflow.

Topology (docs/design.md): ``TorchTrainer`` workers hold the policy (DDP; gloo on CPU, NCCL on GPU;
FSDP as an option). The RL loop runs inside the worker function: rank 0 owns the sampler/environment
actor pools, the predictor and the allocator, drives the step, and broadcasts the collated batch;
every rank updates on its shard. After each update rank 0 pushes the weights to the samplers. With
``cluster.address=inprocess`` the same loop runs in this process as rank 0 of 1 with one in-process sampler and no
Ray (``run_in_process``, workflows/train/fit.py; what differs is behind workflows/train/context.py). ``train`` is
``launch`` (checks, Ray, the tracking run), the loop (``Launch.fit``) and ``close`` (final status, summary).

One step is ``train_step`` (workflows/train/loop.py, with the rest of the worker side), top to bottom, each phase
timed by one ``PhaseTimer``: select (candidate pool), score / allocate_roots / rollout / expand_prefixes
(tracerl/engine/step.py, the allocator's plan), fit_predictor, collate, broadcast, update_policy, sync_weights, eval,
log. Set-up and restore of a worker are in workflows/train/setup.py, rank 0's pools, predictor, evaluation and
logging in workflows/train/driver.py, fault injection in tracerl/actors/faults.py.

The driver opens the MLflow run (params, resolved config) before the workers start and closes it
after; rank 0 logs into it by run id, so a restart after a failure (Ray's ``FailureConfig``) or a
``resume=RUN_ID`` continues the same run from the last checkpoint. Checkpoints (``ray.train.report``
every ``checkpoint_every`` steps, the last ``keep_checkpoints`` kept) hold the policy in HF format,
optimizer and schedule, predictor, candidate-pool RNG and step. Steps re-run after a restart log again
at the same MLflow step; every report here reads the last value per step (the attempt that completed it,
logged as ``system/attempt``). Metrics the tracking server cannot take are spooled under the run's storage and
sent when it is back (workflows/tracking/spool.py); with ``chaos.enabled`` the CLI runs the fault drill (one of the
experiments, conf/train/chaos.yaml) around all this.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.config import TrainConfig
from tracerl.config_loader import to_yaml
from tracerl.envs.registry import check_data, env_class, resolve_env_paths
from tracerl.models.hf import SetupError, check_weights, check_window
from tracerl.workflows.ops.disk import DiskFull, no_space
from tracerl.workflows.ops.no_retry import loop_failed
from tracerl.workflows.ops.progress import bar
from tracerl.workflows.ops.ray_utils import check_resources, end_on_signals, init_ray
from tracerl.workflows.tracking import store as trk
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.local_runs import tracking_client
from tracerl.workflows.tracking.log_file import tracking_logs_to
from tracerl.workflows.tracking.outage import PatientClient
from tracerl.workflows.tracking.run_info import train_tags
from tracerl.workflows.tracking.runs import (
    RunSummary,
    create_run,
    end_run,
    failing_run,
    resumed_config,
    run_summary,
)
from tracerl.workflows.tracking.spool import (
    ATTEMPTS,
    STATUS,
    MetricsPending,
    PendingStatus,
    fail_fast_http,
    replay_statuses,
)
from tracerl.workflows.tracking.store import TrackingUnreachable, resolve_uri, where
from tracerl.workflows.train.fit import ray_trainer, run_in_process
from tracerl.workflows.train.preflight import check_budget, check_context, longest_prompt, training_tasks
from tracerl.workflows.train.step_log import StartupClock
from tracerl.workflows.train.summary import compute_summary, progress_bar

# Slow imports (torch, transformers, Ray, scipy: seconds) stay inside the functions that use them: this module loads
# with the CLI, which starts without them (docs/results/startup.md).

# -- driver side ------------------------------------------------------------------------------------


def _abs_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    return uri


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Absolute paths and URIs, so Ray workers (whatever their cwd) see the same files; the tracking URI resolved
    (``tracerl.workflows.tracking.store.resolve_uri``), so the config saved with a run names the store it went to."""
    model_path = cfg.model.path
    if not model_path.startswith(("models:/", "runs:/")) and Path(model_path).exists():
        model_path = str(Path(model_path).resolve())
    art = cfg.tracking.artifact_location
    if "://" not in art:
        art = str(Path(art).resolve())
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=model_path),
        env=resolve_env_paths(cfg.env),
        tracking=dataclasses.replace(
            cfg.tracking, uri=_abs_uri(resolve_uri(cfg.tracking.uri)), artifact_location=art
        ),
        out_dir=str(Path(cfg.out_dir).resolve()),
    )


@dataclass
class Launch:
    """A run made ready by ``launch``: its MLflow run (or local run) open, Ray up (or the in-process mode ready), and
    ``fit`` the call that runs its loop to the end."""

    cfg: TrainConfig
    run_id: str
    storage: Path
    resume_ckpt: Path | None
    client: Any
    """The run's tracking client (MLflow's, or the local-runs one with tracking off)."""
    patient: Any
    """``client`` waiting up to ``tracking.flush_timeout_s`` for a server that stops answering (outage.py)."""
    fit: Callable[[], None]


def train(
    cfg: TrainConfig,
    overrides: list[str] | None = None,
    progress: Callable[[str], None] = lambda s: None,
    tags: dict[str, str] | None = None,
    callbacks: list[Any] | None = None,
    launched: float | None = None,
) -> RunSummary:
    """Run (or resume) a training job; returns the summary (also written to <storage>/summary.json).

    ``tags`` go on a new MLflow run (a sweep passes its parent run and trial); ``callbacks`` are Ray Train
    user callbacks (a sweep forwards every report to Tune). ``launched``: when the command's process started
    (seconds since the epoch; default now), where ``time/startup_s`` counts from. With ``tracking.enabled: false``
    the run is kept in files under its storage (workflows/tracking/local_runs.py) instead of MLflow.
    Three parts: ``launch`` (checks, Ray, the run), its ``fit``, ``close`` (the run's status and summary).
    """
    # Start-up makes most of the process's long-lived objects (imports, MLflow, the policy: ~690k in-process on the
    # tiny policy), and each full collection on the way scanned them all: 1.4 s of a 7.2 s start-up here
    # (docs/results/startup.md). The collector is off until the loop's first step (workflows/train/loop.py freezes
    # what set-up made, then turns it on), or until the launch on Ray, where the loop runs in another process.
    collecting = gc.isenabled()
    gc.disable()
    try:
        run = launch(cfg, overrides, progress, tags, callbacks, launched)
        if collecting and not run.cfg.cluster.in_process:
            gc.enable()
        return close(run, progress)
    finally:  # the caller's setting back (the in-process loop turned the collector on at its first step)
        if collecting:
            gc.enable()
        else:
            gc.disable()


def launch(
    cfg: TrainConfig,
    overrides: list[str] | None,
    progress: Callable[[str], None],
    tags: dict[str, str] | None,
    callbacks: list[Any] | None,
    launched: float | None,
) -> Launch:
    """Everything before the loop: the config checked against the data, the budget and the model (before Ray
    starts or a run exists, so a mistake leaves nothing behind), Ray or the in-process mode, the tracking run
    created (or reopened for ``resume``)."""

    clock = StartupClock(launched if launched is not None else time.time())
    tracked = cfg.tracking.enabled
    if cfg.resume and not tracked:
        raise ValueError(
            "resume=RUN_ID continues an MLflow run: set tracking.enabled=true (and the run's tracking.uri)"
        )
    resume_ckpt: Path | None = None
    run_id = cfg.resume or ""
    if cfg.resume:
        cfg, storage, resume_ckpt = resumed_config(cfg.resume, cfg.tracking, overrides or [], progress)
        progress(f"resuming MLflow run {run_id} from {resume_ckpt or 'its start (no checkpoint yet)'}")
    check_data(cfg.env)  # a bad data file is the user's to fix: before Ray starts or a run exists
    check_budget(cfg, training_tasks(cfg))  # a step the task set cannot hold: refused now, not at step 1
    progress(
        where(cfg.tracking)
        if tracked
        else f"tracking off: each run's metrics go to its storage under {cfg.out_dir}"
    )
    cfg = resolve_paths(cfg)
    check_model(cfg)
    check_context(cfg, longest_prompt(cfg))  # a prompt the context cannot hold: refused before Ray starts
    # Quiet workers: no per-load progress bars (the workers inherit these when this process starts Ray).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if tracked:
        fail_fast_http()  # the driver's calls (progress bar, end of run) too: a server away is waited for in bounds
        Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
        tracking_logs_to(cfg.out_dir)  # MLflow's and SQLAlchemy's own lines: a file, not the terminal
        trk.check_reachable(
            resolve_uri(cfg.tracking.uri)
        )  # before Ray starts: a dead server is one line, at once
    clock.mark("launch")
    if cfg.cluster.in_process:  # no Ray: the run's loop runs in this process (run_in_process)
        if callbacks:
            raise ValueError(
                "cluster.address=inprocess has no Ray Train to report to: a sweep's trials need cluster.address=local"
            )
        end_on_signals()
    else:
        init_ray(cfg.cluster)  # before the run exists: a job that cannot fit leaves no empty run behind
        check_resources(resource_demand(cfg), cfg.cluster, RESOURCE_KNOBS, progress)
    clock.mark("ray")
    client = tracking_client(cfg.tracking, cfg.out_dir)
    # Set-up and end wait up to tracking.flush_timeout_s for a server that stops answering (outage.py).
    patient = PatientClient(client, cfg.tracking.uri or "", cfg.tracking.flush_timeout_s, progress)
    exp_id = patient.call("the experiment", trk.setup, cfg.tracking) if tracked else ""
    if tracked:
        replay_statuses(client, Path(cfg.out_dir), progress)  # what earlier runs could not tell a full store
    if not cfg.resume:
        run_id, storage, cfg = create_run(
            patient if tracked else client, exp_id, cfg, {**train_tags(cfg), **(tags or {})}
        )
    else:
        patient.update_run(run_id, status="RUNNING")
        with failing_run(patient, run_id, storage):
            PendingStatus(storage).reserve()
            (storage / "config.yaml").write_text(to_yaml(dataclasses.replace(cfg, resume=None)))
    if tracked:
        tracking_logs_to(storage)
    progress(
        f"MLflow run {run_id} ({cfg.tracking.uri}); checkpoints in {storage}"
        if tracked
        else f"run {run_id}: metrics, params and checkpoints in {storage}"
    )
    clock.mark("tracking")
    first = len(list((storage / ATTEMPTS).iterdir())) + 1 if (storage / ATTEMPTS).is_dir() else 1
    startup = (clock, first)
    fit = (
        functools.partial(run_in_process, cfg, run_id, storage, resume_ckpt, startup, progress)
        if cfg.cluster.in_process
        else ray_trainer(cfg, run_id, storage, resume_ckpt, callbacks, startup).fit
    )
    return Launch(cfg, run_id, storage, resume_ckpt, client, patient, fit)


def close(run: Launch, progress: Callable[[str], None]) -> RunSummary:
    """The loop run to its end (``run.fit``), then the run's final status sent (or kept, when the store or the
    disk cannot take it), and its summary read back and written to <storage>/summary.json."""

    cfg, run_id, storage, client = run.cfg, run.run_id, run.storage, run.client
    tracked = cfg.tracking.enabled
    t0 = time.perf_counter()
    status = "FAILED"
    state = CheckpointState.read(run.resume_ckpt) if run.resume_ckpt is not None else CheckpointState(0)
    steps_bar = progress_bar(cfg, client, run_id, state, lambda n, s, u, i: bar(progress, n, s, u, i))
    full = stuck = failed = None
    try:
        run.fit()
        status = "FINISHED"
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM / SIGHUP (tracerl.workflows.ops.ray_utils.Terminated)
        status = "KILLED"
        raise
    except Exception as exc:  # noqa: BLE001 - a full disk, however Ray wrapped it, is one line (workflows/ops/disk.py)
        full = no_space(exc)
        failed = loop_failed(exc) if full is None else None
        if failed is not None and failed is not exc:  # a bad value or unknown name: one line (no_retry.py)
            raise failed from None
        if full is None:
            raise
    finally:
        steps_bar.close()
        try:
            stuck = end_run(
                client,
                run_id,
                storage,
                status,
                progress,
                resolve_uri(cfg.tracking.uri),
                failed_note=full is None and failed is None,
                flush_timeout_s=cfg.tracking.flush_timeout_s,
            )
        except MetricsPending as pending:
            if status == "FINISHED":  # the command's outcome: exit 75 (workflows/tracking/sync.py)
                raise
            progress(str(pending))  # the run's own error, propagating, is the command's outcome

    if full is not None or stuck is not None:
        raise DiskFull(full or stuck or str(storage), kept_note(run_id, storage, cfg) if stuck else "")
    summary = read_summary(run_id, cfg, run.patient if tracked else client, progress)
    summary.update(
        RunSummary(
            run_id=run_id,
            storage=str(storage),
            wall_s=time.perf_counter() - t0,
            tracking_uri=cfg.tracking.uri if tracked else None,
            experiment=cfg.tracking.experiment,
        )
    )
    (storage / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def kept_note(run_id: str, storage: Path, cfg: TrainConfig) -> str:
    """What the full-disk line adds when the store could not take the run's final status (kept beside it)."""

    kept = PendingStatus(storage).pending()
    if kept is None:
        return f"the store could not take the run's final status, and {storage} could not keep it"
    return (
        f"run {run_id} stays RUNNING in the store, its status {kept[0]} kept in {storage / STATUS}: once there is "
        f"space, `tracerl sync {run_id} --tracking-uri {cfg.tracking.uri}` records it"
    )


def read_summary(run_id: str, cfg: TrainConfig, client: Any, say: Callable[[str], None]) -> RunSummary:
    """The finished run's summary read back from its store; when the server stops answering for good here, the run
    is complete in the store already (its status was the last thing sent), so one line says so and the summary is
    left empty rather than failing the command."""

    try:
        summary = run_summary(run_id, cfg.tracking, client)
        summary.update(compute_summary(client, run_id, cfg))
    except TrackingUnreachable as exc:
        say(f"the run is complete in the store, but its summary could not be read back: {exc}")
        return RunSummary()
    return summary


def check_model(cfg: TrainConfig) -> None:
    """The policy checkpoint exists and its weights files are whole, its context window fits the sampler's, LoRA
    targets name its layers, and the update's largest micro-batch fits ``trainer.gpu_memory_gb`` by the memory
    estimate: checked before any run is created (these are the user's to fix)."""
    if not Path(cfg.model.path).is_dir():
        raise SetupError(
            f"model.path={cfg.model.path!r} is not a checkpoint directory; build the tiny policy with "
            "`tracerl bootstrap` or point model.path at an HF checkpoint"
        )
    check_weights(cfg.model.path)
    check_window(cfg.model.path, cfg.sampler)
    if cfg.trainer.lora_rank > 0:
        from tracerl.models.wrap import check_lora  # slow to import: torch (models.wrap)

        check_lora(cfg.model.path, cfg.trainer)
    if cfg.trainer.use_gpu and cfg.trainer.gpu_memory_gb is not None:
        # slow to import: transformers, torch (memory_check)
        from transformers import AutoConfig

        from tracerl.workflows.train.memory_check import check_update_memory, update_shape

        arch = AutoConfig.from_pretrained(cfg.model.path, local_files_only=True)
        check_update_memory(update_shape(arch, cfg.trainer), cfg.trainer, cfg.loss, cfg.sampler)


RESOURCE_KNOBS = (
    "trainer.num_workers / trainer.cpus_per_worker, pools.rollout_workers / pools.rollout_cpus / "
    "pools.rollout_gpus or pools.env_workers / pools.env_cpus"
)


def resource_demand(cfg: TrainConfig) -> list[tuple[str, int, float, float]]:
    """(what, how many, CPUs each, GPUs each) of every actor a training run holds at once: Train workers,
    samplers, their environment actors and the run's shared services (e.g. the search retriever)."""
    from tracerl.actors.services import service_factories  # slow to import: ray (actors.services)

    t, p = cfg.trainer, cfg.pools
    rows = [
        ("trainer", t.num_workers, t.cpus_per_worker, 1.0 if t.use_gpu else 0.0),
        ("samplers", p.rollout_workers, p.rollout_cpus, p.rollout_gpus),
    ]
    if p.env_workers > 0:
        rows.append(("environments", p.rollout_workers * p.env_workers, p.env_cpus, 0.0))
        n = len(service_factories(env_class(cfg.env.name), cfg.env))
        if n:
            rows.append(("services", n, p.env_cpus, 0.0))
    return rows
