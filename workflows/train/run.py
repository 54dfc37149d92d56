"""``tracerl train``: TRACE (or any baseline allocator) end to end on Ray Train or in-process, tracked in MLflow.

Topology (docs/design.md): ``TorchTrainer`` workers hold the policy (DDP; gloo on CPU, NCCL on GPU;
FSDP as an option). The RL loop runs inside the worker function: rank 0 owns the sampler/environment
actor pools, the predictor and the allocator, drives the step, and broadcasts the collated batch;
every rank updates on its shard. After each update rank 0 pushes the weights to the samplers. With
``cluster.address=inprocess`` the same loop runs in this process as rank 0 of 1 with one in-process sampler and no
Ray (``run_in_process``; what differs is behind workflows/train/context.py).

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
sent when it is back (workflows/tracking/spool.py); ``chaos.enabled`` runs the fault drill around all this (workflows/train/chaos.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.config import TrainConfig
from tracerl.config_loader import to_yaml
from tracerl.envs.registry import check_data, resolve_env_paths
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.tracking.runs import RunSummary, create_run, resumed_config, run_summary
from tracerl.workflows.tracking.store import resolve_uri, where
from tracerl.workflows.train.loop import LOOP_INPUT, LoopInput, guarded_loop
from tracerl.workflows.train.preflight import check_budget, check_context, longest_prompt, training_tasks
from tracerl.workflows.train.step_log import StartupClock
from tracerl.workflows.train.summary import compute_summary, progress_bar

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
    """
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
    from tracerl.workflows.ops.disk import DiskFull, no_space
    from tracerl.workflows.ops.no_retry import loop_failed
    from tracerl.workflows.ops.progress import bar
    from tracerl.workflows.ops.ray_utils import check_resources, end_on_signals, init_ray
    from tracerl.workflows.tracking import store as trk
    from tracerl.workflows.tracking.local_runs import tracking_client
    from tracerl.workflows.tracking.log_file import tracking_logs_to
    from tracerl.workflows.tracking.outage import PatientClient
    from tracerl.workflows.tracking.run_info import train_tags
    from tracerl.workflows.tracking.runs import end_run, failing_run
    from tracerl.workflows.tracking.spool import (
        ATTEMPTS,
        MetricsPending,
        PendingStatus,
        fail_fast_http,
        replay_statuses,
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
    t0 = time.perf_counter()
    status = "FAILED"
    state = CheckpointState.read(resume_ckpt) if resume_ckpt is not None else CheckpointState(0)
    steps_bar = progress_bar(cfg, client, run_id, state, lambda n, s, u, i: bar(progress, n, s, u, i))
    full = stuck = failed = None
    try:
        fit()
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
    summary = read_summary(run_id, cfg, patient if tracked else client, progress)
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
    from tracerl.workflows.tracking.spool import STATUS, PendingStatus

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
    from tracerl.workflows.tracking.store import TrackingUnreachable

    try:
        summary = run_summary(run_id, cfg.tracking, client)
        summary.update(compute_summary(client, run_id, cfg))
    except TrackingUnreachable as exc:
        say(f"the run is complete in the store, but its summary could not be read back: {exc}")
        return RunSummary()
    return summary


def ray_trainer(
    cfg: TrainConfig,
    run_id: str,
    storage: Path,
    resume_ckpt: Path | None,
    callbacks: list[Any] | None,
    startup: tuple[StartupClock, int] | None = None,
) -> Any:
    """The Ray Train trainer of a run: ``guarded_loop`` on ``trainer.num_workers`` ranks, restarted from the newest
    intact checkpoint up to ``max_failures`` times (never on a full disk), the last ``keep_checkpoints`` kept.
    ``startup``: the launch's start-up clock and the attempt number whose first step logs it."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from tracerl.workflows.ops.disk_callback import StopOnDiskFull
    from tracerl.workflows.ops.ray_utils import torch_trainer

    t = cfg.trainer
    run_callbacks: list[Any] = [StopOnDiskFull(), *(callbacks or [])]  # a full disk is not retried
    return torch_trainer(cfg.cluster)(
        guarded_loop,
        train_loop_config={
            LOOP_INPUT: LoopInput(cfg, run_id, storage, reported(storage, resume_ckpt), startup)
        },
        # The process group's timeout must outlast rank 0's rollout phase, which ranks 1..n wait through in a
        # broadcast (Ray's default is 1800 s).
        torch_config=TorchConfig(timeout_s=t.collective_timeout_s),
        scaling_config=ScalingConfig(
            num_workers=t.num_workers,
            use_gpu=t.use_gpu,
            resources_per_worker={
                "CPU": t.cpus_per_worker,
                **({"GPU": 1} if t.use_gpu else {}),
                **t.resources,
            },
        ),
        run_config=RunConfig(
            name=storage.name,
            storage_path=str(storage.parent),  # type: ignore[call-arg]
            failure_config=FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            logging_config=LoggingConfig(log_level="WARNING"),
            callbacks=run_callbacks,
        ),
    )


class TrainingFailed(RuntimeError):
    """The in-process loop failed on its last attempt (``max_failures`` restarts spent); the cause is chained."""


def reported(storage: Path, resume_ckpt: Path | None) -> tuple[str, ...]:
    """Checkpoints newer than the one a resume starts from: the driver said which of them were damaged already."""
    return tuple(
        p.name for p in storage.glob("checkpoint_*") if resume_ckpt is None or p.name > resume_ckpt.name
    )


def run_in_process(
    cfg: TrainConfig,
    run_id: str,
    storage: Path,
    resume_ckpt: Path | None,
    startup: tuple[StartupClock, int],
    progress: Callable[[str], None],
) -> None:
    """The run's loop in this process (``cluster.address=inprocess``): ``guarded_loop`` as rank 0 of 1, restarted
    from the newest intact checkpoint up to ``max_failures`` times, as Ray Train restarts its workers (never on a
    full disk or a signal). Each attempt is a new ``system/attempt``; the last failure is raised as
    ``TrainingFailed`` (the run ends FAILED)."""
    from tracerl.workflows.ops.disk import DiskFull
    from tracerl.workflows.ops.no_retry import LoopFailed
    from tracerl.workflows.train.context import InProcessContext

    context = InProcessContext(storage, cfg.keep_checkpoints)
    config = {LOOP_INPUT: LoopInput(cfg, run_id, storage, reported(storage, resume_ckpt), startup, context)}
    for failures in range(cfg.max_failures + 1):
        try:
            guarded_loop(config)
            return
        except (DiskFull, LoopFailed):  # a restart cannot get past either
            raise
        except Exception as exc:
            if failures == cfg.max_failures:  # a bug keeps its traceback, as with Ray's TrainingFailedError
                msg = f"the training loop failed after {failures + 1} attempt(s): {exc}"
                raise TrainingFailed(msg) from exc
            progress(
                f"the training loop failed ({type(exc).__name__}: {exc}); restarting from the newest intact "
                f"checkpoint ({failures + 1} of max_failures={cfg.max_failures})"
            )


def check_model(cfg: TrainConfig) -> None:
    """The policy checkpoint exists and its weights files are whole, its context window fits the sampler's, LoRA
    targets name its layers, and the update's largest micro-batch fits ``trainer.gpu_memory_gb`` by the memory
    estimate: checked before any run is created (these are the user's to fix)."""
    from tracerl.models.hf import check_weights, check_window
    from tracerl.workflows.lm.stack import SetupError

    if not Path(cfg.model.path).is_dir():
        raise SetupError(
            f"model.path={cfg.model.path!r} is not a checkpoint directory; build the tiny policy with "
            "`tracerl bootstrap` or point model.path at an HF checkpoint"
        )
    check_weights(cfg.model.path)
    check_window(cfg.model.path, cfg.sampler)
    if cfg.trainer.lora_rank > 0:
        from tracerl.models.wrap import check_lora

        check_lora(cfg.model.path, cfg.trainer)
    if cfg.trainer.use_gpu and cfg.trainer.gpu_memory_gb is not None:
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
    from tracerl.actors.services import service_factories
    from tracerl.envs.registry import env_class

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
