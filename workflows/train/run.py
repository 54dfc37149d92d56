"""``tracerl train``: TRACE (or any baseline allocator) end to end on Ray Train or in-process, tracked in MLflow.

Topology (docs/design.md): ``TorchTrainer`` workers hold the policy (DDP; gloo on CPU, NCCL on GPU;
FSDP as an option). The RL loop runs inside the worker function: rank 0 owns the sampler/environment
actor pools, the predictor and the allocator, drives the step, and broadcasts the collated batch;
every rank updates on its shard. After each update rank 0 pushes the weights to the samplers. With
``cluster.address=inprocess`` the same loop runs in this process as rank 0 of 1 with one in-process sampler and no
Ray (``run_in_process``; what differs is behind workflows/train/context.py).

One step is ``train_step``, top to bottom, each phase timed by one ``PhaseTimer``: select (candidate pool),
score / allocate_roots / rollout / expand_prefixes (tracerl/engine/step.py, the allocator's plan), fit_predictor,
collate, broadcast, update_policy, sync_weights, eval, log. Set-up and restore of a worker are in
workflows/train/setup.py, rank 0's pools, predictor, evaluation and logging in workflows/train/driver.py, fault
injection in tracerl/actors/faults.py.

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

import contextlib
import dataclasses
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envs.registry import check_data, resolve_env_paths
from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.config_loader import to_yaml
from tracerl.engine.timer import PhaseTimer
from workflows.tracking.checkpoint_state import CheckpointState
from workflows.tracking.runs import RunSummary, create_run, resumed_config, run_summary
from workflows.tracking.store import resolve_uri, where
from workflows.train.budget import Totals, stop_reason
from workflows.train.driver import Ahead, Driver, overlaps_next
from workflows.train.setup import Worker, quiet_train_reports, ranks_cpu, setup_worker
from workflows.train.step_log import StartupClock, start_pool
from workflows.train.summary import compute_summary, progress_bar

# -- driver side ------------------------------------------------------------------------------------


def _abs_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    return uri


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Absolute paths and URIs, so Ray workers (whatever their cwd) see the same files; the tracking URI resolved
    (``workflows.tracking.store.resolve_uri``), so the config saved with a run names the store it went to."""
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
    progress(
        where(cfg.tracking)
        if tracked
        else f"tracking off: each run's metrics go to its storage under {cfg.out_dir}"
    )
    from workflows.ops.disk import DiskFull, no_space
    from workflows.ops.progress import bar
    from workflows.ops.ray_utils import check_resources, end_on_signals, init_ray
    from workflows.tracking import store as trk
    from workflows.tracking.local_runs import tracking_client
    from workflows.tracking.run_info import train_tags
    from workflows.tracking.runs import end_run, failing_run
    from workflows.tracking.spool import ATTEMPTS, PendingStatus, replay_statuses

    cfg = resolve_paths(cfg)
    check_model(cfg)
    # Quiet workers: no per-load progress bars (the workers inherit these when this process starts Ray).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if tracked:
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
    exp_id = trk.setup(cfg.tracking) if tracked else ""
    client = tracking_client(cfg.tracking, cfg.out_dir)
    if tracked:
        replay_statuses(client, Path(cfg.out_dir), progress)  # what earlier runs could not tell a full store
    if not cfg.resume:
        run_id, storage, cfg = create_run(client, exp_id, cfg, {**train_tags(cfg), **(tags or {})})
    else:
        client.update_run(run_id, status="RUNNING")
        with failing_run(client, run_id):
            PendingStatus(storage).reserve()
            (storage / "config.yaml").write_text(to_yaml(dataclasses.replace(cfg, resume=None)))
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
    full = stuck = None
    try:
        fit()
        status = "FINISHED"
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM / SIGHUP (workflows.ops.ray_utils.Terminated)
        status = "KILLED"
        raise
    except Exception as exc:  # noqa: BLE001 - a full disk, however Ray wrapped it, is one line (workflows/ops/disk.py)
        full = no_space(exc)
        if full is None:
            raise
    finally:
        steps_bar.close()
        stuck = end_run(
            client, run_id, storage, status, progress, resolve_uri(cfg.tracking.uri), failed_note=full is None
        )
    if full is not None or stuck is not None:
        raise DiskFull(full or stuck or str(storage))
    summary = run_summary(run_id, cfg.tracking, client)
    summary.update(
        RunSummary(
            run_id=run_id,
            storage=str(storage),
            wall_s=time.perf_counter() - t0,
            tracking_uri=cfg.tracking.uri if tracked else None,
            experiment=cfg.tracking.experiment,
        )
    )
    summary.update(compute_summary(client, run_id, cfg))
    (storage / "summary.json").write_text(json.dumps(summary, indent=2))
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

    from workflows.ops.disk_callback import StopOnDiskFull
    from workflows.ops.ray_utils import torch_trainer

    t = cfg.trainer
    run_callbacks: list[Any] = [StopOnDiskFull(), *(callbacks or [])]  # a full disk is not retried
    return torch_trainer(cfg.cluster)(
        guarded_loop,
        train_loop_config={
            "cfg": cfg,
            "run_id": run_id,
            "storage": str(storage),
            "reported": reported(storage, resume_ckpt),
            "startup": startup,
        },
        scaling_config=ScalingConfig(
            num_workers=t.num_workers,
            use_gpu=t.use_gpu,
            resources_per_worker={"CPU": t.cpus_per_worker, **({"GPU": 1} if t.use_gpu else {})},
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


def reported(storage: Path, resume_ckpt: Path | None) -> list[str]:
    """Checkpoints newer than the one a resume starts from: the driver said which of them were damaged already."""
    return [p.name for p in storage.glob("checkpoint_*") if resume_ckpt is None or p.name > resume_ckpt.name]


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
    from workflows.ops.disk import DiskFull
    from workflows.train.context import InProcessContext

    config: dict[str, Any] = {
        "cfg": cfg,
        "run_id": run_id,
        "storage": str(storage),
        "reported": reported(storage, resume_ckpt),
        "startup": startup,
        "context": InProcessContext(storage, cfg.keep_checkpoints),
    }
    for failures in range(cfg.max_failures + 1):
        try:
            guarded_loop(config)
            return
        except DiskFull:
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
    """The policy checkpoint exists and its weights files are whole, its context window fits the sampler's, and LoRA
    targets name its layers: checked before any run is created (these are the user's to fix)."""
    from tracerl.models.hf import check_weights, check_window
    from workflows.lm.stack import SetupError

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


RESOURCE_KNOBS = (
    "trainer.num_workers / trainer.cpus_per_worker, pools.rollout_workers / pools.rollout_cpus / "
    "pools.rollout_gpus or pools.env_workers / pools.env_cpus"
)


def resource_demand(cfg: TrainConfig) -> list[tuple[str, int, float, float]]:
    """(what, how many, CPUs each, GPUs each) of every actor a training run holds at once: Train workers,
    samplers, their environment actors and the run's shared services (e.g. the search retriever)."""
    from envs.registry import env_class
    from tracerl.actors.services import service_factories

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


# -- worker side: the step ---------------------------------------------------------------------------


def guarded_loop(config: dict[str, Any]) -> None:
    """``train_loop``, a full disk re-raised as ``DiskFull`` (one line, which the controller does not retry and the
    driver reports; workflows/ops/disk.py)."""
    from workflows.ops.disk import DiskFull, no_space, quiet_disk_full

    quiet_disk_full("ray.train.v2._internal.util")  # it logs the error's traceback from every rank
    try:
        train_loop(config)
    except Exception as exc:
        full = no_space(exc)
        if full is None:
            raise
        raise DiskFull(full or config["storage"]) from None


def train_loop(config: dict[str, Any]) -> None:
    """The loop of every rank (a Ray Train worker function, or the command's own process with ``config["context"]``,
    an ``InProcessContext``): set up and restore, then ``train_step`` until a limit (``steps``, ``stop.tokens``,
    ``stop.cpu_s``) ends the run. A failure shuts rank 0's samplers down before it propagates (in-process, a restart
    builds new ones)."""
    import torch

    cfg: TrainConfig = config["cfg"]
    storage = Path(config["storage"])
    clock = (config.get("startup") or (None, 0))[0]
    ctx = config.get("context")
    if ctx is None:
        from workflows.train.context import RayTrainContext

        ctx = RayTrainContext()
        quiet_train_reports()
    if clock is not None:
        clock.mark("trainer")
    if cfg.trainer.torch_threads is not None:
        torch.set_num_threads(cfg.trainer.torch_threads)
    # Rank 0's samplers load their policy copies in their own processes while this one loads the trainer's.
    pool = start_pool(cfg, storage) if ctx.rank == 0 else None
    try:
        run_steps(config, ctx, pool)
    except BaseException:
        if pool is not None:
            with contextlib.suppress(Exception):  # the failure is what the caller needs to see
                pool.shutdown()
        raise


def run_steps(config: dict[str, Any], ctx: Any, pool: Any) -> None:
    """``train_loop`` after the samplers started: this rank's worker, rank 0's driver, the steps."""
    cfg: TrainConfig = config["cfg"]
    run_id, storage = config["run_id"], Path(config["storage"])
    clock, first_attempt = config.get("startup") or (None, 0)
    worker = setup_worker(cfg, storage, ctx, config.get("reported", ()))
    # A restored policy is pushed to the samplers; a fresh run's samplers loaded these very weights from model.path,
    # so nothing is gathered for them (under FSDP a gather is a full-model collective).
    restored = worker.gather()[0] if worker.ckpt_dir is not None else None
    start = worker.state.step
    driver = None
    if worker.rank == 0:
        from tracerl.models.wrap import unwrap

        if clock is not None:
            clock.mark("policy")
        driver = Driver(cfg, run_id, storage, worker.tok, unwrap(worker.model), start, pool)
        if worker.ckpt_dir is not None and restored is not None:
            driver.restore(worker.ckpt_dir, worker.state, restored)
        if clock is not None:
            clock.mark("samplers")
        if start == 0 and cfg.eval_at_start:
            driver.evaluate(0)
        if (
            clock is not None and driver.metrics.attempt == first_attempt
        ):  # not after a restart of the workers
            clock.mark("eval")
            driver.startup = clock.metrics()
    cpu = ranks_cpu(worker)  # compute is counted from here (set-up and the first evaluation are not)
    if driver is not None:
        driver.start_meter(cpu)
    st = worker.state  # a resumed run that already reached a limit runs no step
    so_far = Totals(st.spent[0], st.spent[1], st.step, st.cpu_s, st.wall_s)
    ahead, step, last = None, start, stop_reason(cfg.stop, cfg.steps, so_far) is not None
    while not last:
        ahead, last = train_step(step, worker, driver, ahead)
        step += 1
    if driver is not None:
        driver.close()


def train_step(
    step: int, w: Worker, d: Driver | None, ahead: Ahead | None = None
) -> tuple[Ahead | None, bool]:
    """One RL step on every rank; ``d`` (rank 0's driver) is None on the others, which only update on their shard.

    Rank 0 selects the candidate pool, scores it, allocates roots, rolls out, expands prefixes (run_step), fits
    the predictor and collates; the batch is broadcast and every rank updates; rank 0 pushes the new weights to the
    samplers, evaluates when due and logs; a checkpoint every ``checkpoint_every`` steps. One timer times each phase.
    With ``pipeline.overlap`` the next step's Stage 1 and bare rollouts start before the update (``ahead``, which
    this step returns and the next finishes on the new weights). After the update rank 0 checks the run's limits
    (``Driver.check_stop``) and every rank learns whether this step is the last (returned with ``ahead``); the last
    evaluates on every held-out task and checkpoints.
    """
    from tracerl.algos.batch import collate
    from tracerl.learner import denominator

    cfg, done = w.cfg, step + 1
    timer = ahead.timer if ahead is not None else PhaseTimer()
    timer.restart()
    batch = out = nxt = None
    m: dict[str, float] = {}
    rollout_s = 0.0
    if d is not None:
        d.mark("rollout", done)
        t0 = time.perf_counter()
        # select, score, allocate_roots, rollout, expand_prefixes (tracerl/engine/step.py)
        out, budget = d.roll_out(step, timer) if ahead is None else d.finish_ahead(ahead)
        rollout_s = time.perf_counter() - t0
        m = d.rollout_metrics(out, budget)  # calibration of this step's scores, before the fit
        with timer("fit_predictor"):
            m.update(d.fit(out))
        with timer("collate"):
            batch = collate(out.trees, cfg.loss.advantage, cfg.loss.normalize_std, cfg.loss.debiased_values)
        m.update(d.batch_metrics(batch, out))
        nxt = (
            d.start_ahead(done) if overlaps_next(cfg, done) and not d.reached(done) else None
        )  # beside the update, on the current weights
    t0 = time.perf_counter()
    with timer("broadcast"):
        batch = w.broadcast(batch)
    with timer("update_policy"):
        stats = w.learner.update(batch.shard(w.rank, w.world), denominator(batch, cfg.loss.aggregation))
    update_s = time.perf_counter() - t0
    weights, adapters = w.gather()  # a collective under FSDP
    if d is not None:
        m.update(stats)
        m[M.TIME_TRAIN_STEP] = rollout_s + update_s  # the step's own rollout and update, nothing around them
        if cfg.pipeline.overlap:
            with timer("wait_rollouts"):
                d.wait_ahead(nxt)
    cpu = ranks_cpu(w)  # after the wait: a sampler answers once its rollouts end
    last = bool(w.broadcast(d.check_stop(done, cpu) if d is not None else None))
    if d is not None:
        if last:
            nxt = None  # a step started early past the run's end: its rollouts are dropped
        with timer("sync_weights"):
            d.sync(weights, done)
        due = d.eval_due(done)
        if due is not None:
            with timer("eval"):
                m.update(d.evaluate(done, full=due == "full"))
        m = d.close_step(m, done, out, timer)  # the last metrics, then the log
    report(w, d, done, m, weights, adapters, last)
    if d is not None:
        d.faults.trainer(step)
    return nxt, last


def report(
    w: Worker,
    d: Driver | None,
    done: int,
    metrics: dict[str, float],
    weights: Any,
    adapters: Any,
    last: bool = False,
) -> None:
    """Every step reports its metrics to where it runs (Ray Train: a sweep's scheduler sees the curve); every
    ``checkpoint_every`` steps and at the end (``last``) with a checkpoint (each rank's learner state, rank 0's
    share), written whole or not at all (``workflows.tracking.checkpoint_files.publish``: staged, manifest last,
    renamed into place), the last ``keep_checkpoints`` kept (workflows/train/context.py).
    """
    import torch

    from workflows.tracking.checkpoint_files import publish
    from workflows.train.context import checkpoint_name

    if done % w.cfg.checkpoint_every and not last:
        w.ctx.report({"step": done, **metrics})
        return
    name = checkpoint_name(done)
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(w.learner.state_dict(), Path(tmp) / f"trainer_rank{w.rank}.pt")
        if d is not None:
            d.save(Path(tmp), done, weights, adapters)
        w.ctx.report(
            {"step": done, **metrics},
            Path(tmp),
            lambda staged: publish(staged, w.storage, name, w.rank, w.world, w.barrier),
        )
