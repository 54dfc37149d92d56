"""How a launched run's loop runs (workflows/train/run.py ``launch``): on Ray Train's workers (``ray_trainer``), or in
the command's own process as rank 0 of 1 (``run_in_process``, ``cluster.address=inprocess``); both restart it from
the newest intact checkpoint up to ``max_failures`` times."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.config import TrainConfig
from tracerl.workflows.ops.disk import DiskFull
from tracerl.workflows.ops.no_retry import LoopFailed
from tracerl.workflows.ops.ray_utils import torch_trainer
from tracerl.workflows.train.context import InProcessContext
from tracerl.workflows.train.loop import LOOP_INPUT, LoopInput, guarded_loop
from tracerl.workflows.train.step_log import StartupClock

# Slow imports (torch, transformers, Ray, scipy: seconds) stay inside the functions that use them: this module loads
# with the CLI, which starts without them (docs/results/startup.md).


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
    # slow to import: ray (ops.disk_callback too); the in-process mode never loads Ray
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from tracerl.workflows.ops.disk_callback import StopOnDiskFull

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
