"""The loop every rank of a ``tracerl train`` run runs (a Ray Train worker function, or the command's own process in
the in-process mode): set up and restore (workflows/train/setup.py), then ``train_step`` until a limit ends the run,
each step reported (metrics, and a checkpoint when due). ``tracerl.workflows.train.run.train`` launches it in either mode
(workflows/train/context.py says what differs between them); rank 0's pools, predictor, evaluation and logging are
in workflows/train/driver.py.
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.algos.batch import collate, debiased_setting
from tracerl.config import TrainConfig
from tracerl.engine.timer import PhaseTimer
from tracerl.workflows.ops.disk import DiskFull, no_space, quiet_disk_full
from tracerl.workflows.ops.no_retry import as_permanent, quiet_loop_failed
from tracerl.workflows.ops.turns import take_turn
from tracerl.workflows.tracking.checkpoint_files import publish, scratch
from tracerl.workflows.train.budget import Totals, stop_reason
from tracerl.workflows.train.context import RayTrainContext, checkpoint_name
from tracerl.workflows.train.driver import Ahead, Driver, overlaps_next
from tracerl.workflows.train.setup import Worker, quiet_train_reports, ranks_cpu, setup_worker
from tracerl.workflows.train.step_log import StartupClock, start_pool

# Slow imports (torch, transformers, Ray, scipy: seconds) stay inside the functions that use them: this module loads
# with the CLI, which starts without them (docs/results/startup.md).

LOOP_INPUT = "run"
"""The one key of the loop's config dict (Ray Train's ``train_loop_config``): a ``LoopInput``."""


@dataclass(frozen=True)
class LoopInput:
    """What every rank's loop is started with (through Ray Train, or in this process)."""

    cfg: TrainConfig
    run_id: str
    storage: Path
    """The run's storage directory (``out_dir/<run name>``): checkpoints, spooled metrics, curve.jsonl."""
    reported: tuple[str, ...] = ()
    """Checkpoints newer than the one a resume starts from (the driver said which of them were damaged)."""
    startup: tuple[StartupClock, int] | None = None
    """The launch's start-up clock and the attempt number whose first step logs ``time/startup_s``."""
    context: Any = None
    """An ``InProcessContext`` (the in-process mode); None: a Ray Train worker's context."""


def guarded_loop(config: dict[str, LoopInput]) -> None:
    """``train_loop``, a full disk re-raised as ``DiskFull`` and a bad value or unknown name as ``LoopFailed`` (one
    line each, which the controller does not retry and the driver reports; workflows/ops/disk.py, no_retry.py)."""

    quiet_disk_full("ray.train.v2._internal.util")  # it logs the error's traceback from every rank
    quiet_loop_failed("ray.train.v2._internal.util")
    try:
        train_loop(config[LOOP_INPUT])
    except Exception as exc:
        full = no_space(exc, config[LOOP_INPUT].storage)  # a checkpoint's torch.save writes under the storage
        if full is not None:
            raise DiskFull(full or str(config[LOOP_INPUT].storage)) from None
        failed = as_permanent(exc)
        if failed is None or failed is exc:
            raise
        raise failed from exc


def train_loop(run: LoopInput) -> None:
    """The loop of every rank (a Ray Train worker function, or the command's own process with ``run.context``, an
    ``InProcessContext``): set up and restore, then ``train_step`` until a limit (``steps``, ``stop.tokens``,
    ``stop.cpu_s``) ends the run. A failure shuts rank 0's samplers down before it propagates (in-process, a restart
    builds new ones)."""
    import torch  # slow to import: torch

    cfg, storage = run.cfg, run.storage
    clock = run.startup[0] if run.startup is not None else None
    ctx = run.context
    if ctx is None:
        ctx = RayTrainContext()
        quiet_train_reports()
    if clock is not None:
        clock.mark("trainer")
    if cfg.trainer.torch_threads is not None:
        torch.set_num_threads(cfg.trainer.torch_threads)
    # Rank 0's samplers load their policy copies in their own processes while this one loads the trainer's.
    pool = start_pool(cfg, storage) if ctx.rank == 0 else None
    try:
        run_steps(run, ctx, pool)
    except BaseException:
        if pool is not None:
            with contextlib.suppress(Exception):  # the failure is what the caller needs to see
                pool.shutdown()
        raise


def run_steps(run: LoopInput, ctx: Any, pool: Any) -> None:
    """``train_loop`` after the samplers started: this rank's worker, rank 0's driver, the steps."""
    cfg, run_id, storage = run.cfg, run.run_id, run.storage
    clock, first_attempt = run.startup or (None, 0)
    worker = setup_worker(cfg, storage, ctx, run.reported)
    start = worker.state.step
    driver = None
    if worker.rank == 0:
        from tracerl.models.wrap import unwrap  # slow to import: torch (models.wrap)

        if clock is not None:
            clock.mark("policy")
        driver = Driver(cfg, run_id, storage, worker.tok, unwrap(worker.model), start, pool)
        if worker.ckpt_dir is not None:
            driver.restore(worker.ckpt_dir, worker.state)
    # A restored policy is pushed to the samplers; a fresh run's samplers loaded these very weights from model.path,
    # so nothing is pushed to them (under FSDP a push gathers every parameter: every rank takes part).
    if worker.ckpt_dir is not None:
        sync(worker, driver, start)
    if driver is not None:
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
    state = worker.state  # a resumed run that already reached a limit runs no step
    so_far = Totals(state.spent[0], state.spent[1], state.step, state.cpu_s, state.wall_s)
    ahead, step, last = None, start, stop_reason(cfg.stop, cfg.steps, so_far) is not None
    # What set-up made (modules, MLflow, the policy's Python objects: ~690k objects in-process on the tiny policy)
    # is kept out of the collector's reach, so a full collection scans what the steps make (one over all of it took
    # up to 270 ms). Such objects are still freed when their last reference goes. In-process ``train`` turned the
    # collector off for the start-up (workflows/train/run.py): it is on from here.
    gc.freeze()
    gc.enable()
    while not last:
        take_turn(step)  # only under a conductor (tracerl bench peer --interleave step): else returns at once
        ahead, last = train_step(step, worker, driver, ahead)
        step += 1
    if driver is not None:
        driver.close()


def train_step(
    step: int, worker: Worker, driver: Driver | None, ahead: Ahead | None = None
) -> tuple[Ahead | None, bool]:
    """One RL step on every rank; ``driver`` (rank 0's driver) is None on the others, which only update on their shard.

    Rank 0 selects the candidate pool, scores it, allocates roots, rolls out, expands prefixes (run_step), fits
    the predictor and collates; the batch is broadcast and every rank updates; the new weights are pushed to rank 0's
    samplers bucket by bucket (every rank takes part under FSDP), rank 0 evaluates when due and logs; a checkpoint every ``checkpoint_every`` steps. One timer times each phase.
    With ``pipeline.overlap`` the next step's Stage 1 and bare rollouts start before the update (``ahead``, which
    this step returns and the next finishes on the new weights). After the update rank 0 checks the run's limits
    (``Driver.check_stop``) and every rank learns whether this step is the last (returned with ``ahead``); the last
    evaluates on every held-out task and checkpoints.
    """
    from tracerl.learner import denominator  # slow to import: torch (learner)

    cfg, done = worker.cfg, step + 1
    timer = ahead.timer if ahead is not None else PhaseTimer()
    timer.restart()
    batch = out = next_ahead = None
    step_metrics: dict[str, float] = {}
    rollout_s = 0.0
    if driver is not None:
        driver.mark("rollout", done)
        t0 = time.perf_counter()
        # select, score, allocate_roots, rollout, expand_prefixes (tracerl/engine/step.py)
        out, budget = driver.roll_out(step, timer) if ahead is None else driver.finish_ahead(ahead)
        rollout_s = time.perf_counter() - t0
        step_metrics = driver.rollout_metrics(
            out, budget
        )  # calibration of this step's scores, before the fit
        with timer("fit_predictor"):
            step_metrics.update(driver.fit(out))
        with timer("collate"):
            debiased = debiased_setting(cfg.loss.debiased_values, driver.allocator, cfg.loss.advantage)
            batch = collate(out.trees, cfg.loss.advantage, cfg.loss.normalize_std, debiased)
        step_metrics.update(driver.batch_metrics(batch, out))
        next_ahead = (
            driver.start_ahead(done) if overlaps_next(cfg, done) and not driver.reached(done) else None
        )  # beside the update, on the current weights
    t0 = time.perf_counter()
    with timer("broadcast"):
        batch = worker.broadcast(batch)
    with timer("update_policy"):
        # A token budget shares the batch balanced by length; otherwise contiguous shards.
        shard = (batch.balanced_shard if cfg.loss.micro_tokens > 0 else batch.shard)(
            worker.rank, worker.world
        )
        stats = worker.learner.update(shard, denominator(batch, cfg.loss.aggregation))
    update_s = time.perf_counter() - t0
    if driver is not None:
        step_metrics.update(stats)
        step_metrics[M.TIME_TRAIN_STEP] = (
            rollout_s + update_s
        )  # the step's own rollout and update, nothing around them
        if cfg.pipeline.overlap:
            with timer("wait_rollouts"):
                driver.wait_ahead(next_ahead)
    cpu = ranks_cpu(worker)  # after the wait: a sampler answers once its rollouts end
    last = bool(worker.broadcast(driver.check_stop(done, cpu) if driver is not None else None))
    if driver is not None and last:
        next_ahead = None  # a step started early past the run's end: its rollouts are dropped
    with timer("sync_weights"):
        sync(worker, driver, done)
    # The whole policy on rank 0 only when a checkpoint is written (a collective under FSDP).
    weights, adapters = (
        worker.gather() if checkpoint_due(worker.cfg.checkpoint_every, done, last) else ({}, {})
    )
    if driver is not None:
        due = driver.eval_due(done)
        if due is not None:
            with timer("eval"):
                step_metrics.update(driver.evaluate(done, full=due == "full"))
        step_metrics = driver.close_step(step_metrics, done, out, timer)  # the last metrics, then the log
    report(worker, driver, done, step_metrics, weights, adapters, last)
    if driver is not None:
        driver.faults.trainer(step)
    return next_ahead, last


def sync(worker: Worker, driver: Driver | None, version: int) -> None:
    """The policy into rank 0's samplers, bucket by bucket (workflows/train/push.py); the other ranks take part in
    the gathers under FSDP."""
    if driver is not None:
        driver.sync(worker.push, version)
    else:
        worker.push(None)


def checkpoint_due(every: int, done: int, last: bool) -> bool:
    return last or done % every == 0


def report(
    worker: Worker,
    driver: Driver | None,
    done: int,
    metrics: dict[str, float],
    weights: Any,
    adapters: Any,
    last: bool = False,
) -> None:
    """Every step reports its metrics to where it runs (Ray Train: a sweep's scheduler sees the curve); every
    ``checkpoint_every`` steps and at the end (``last``) with a checkpoint (each rank's learner state, rank 0's
    share), written whole or not at all (``tracerl.workflows.tracking.checkpoint_files.publish``: staged, manifest last,
    renamed into place), the last ``keep_checkpoints`` kept (workflows/train/context.py).
    """
    import torch  # slow to import: torch

    if not checkpoint_due(worker.cfg.checkpoint_every, done, last):
        worker.ctx.report({"step": done, **metrics})
        return
    name = checkpoint_name(done)
    # Staged under the run's storage, not the node's /tmp: a large policy's files (an 8B policy's fp32 weights and
    # optimizer shard) need room that /tmp may not have, and the rename into the checkpoint stays on one filesystem.
    with tempfile.TemporaryDirectory(dir=scratch(worker.storage), prefix=f"rank{worker.rank}-") as tmp:
        torch.save(worker.learner.state_dict(), Path(tmp) / f"trainer_rank{worker.rank}.pt")
        if driver is not None:
            driver.save(Path(tmp), done, weights, adapters)
        worker.ctx.report(
            {"step": done, **metrics},
            Path(tmp),
            lambda staged: publish(staged, worker.storage, name, worker.rank, worker.world, worker.barrier),
        )
