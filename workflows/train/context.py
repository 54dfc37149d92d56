"""Where a ``tracerl train`` loop runs: what the loop asks of its surroundings, in the two modes (docs/design.md,
"Topology").

* ``RayTrainContext``: a Ray Train worker (``cluster.address`` local or a cluster): its rank and world size,
  the checkpoint the controller hands a restarted attempt, ``ray.train.torch`` to place the policy (DDP, FSDP2,
  its device), and ``ray.train.report``, which writes a checkpoint through the run's upload function
  (``tracerl.workflows.tracking.checkpoint_files.publish``) and keeps the last ``keep_checkpoints``.
* ``InProcessContext``: ``cluster.address=inprocess``, the command's own process as rank 0 of 1, no Ray: nothing
  to restore but the newest intact checkpoint in storage (``setup.restore_dir`` finds it), the policy stays where
  it was loaded (CPU), and a checkpoint is published the same way and the older ones beyond ``keep_checkpoints``
  removed here. Metrics go to the run's tracking by the driver in both modes; only Ray (a sweep's scheduler) reads
  the reported ones.

The loop (``tracerl.workflows.train.run.train_loop``), the step and the checkpoint files are the same in both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tracerl.config import TrainConfig
from tracerl.workflows.tracking.checkpoint_files import prune

Upload = Callable[[Path], Path]
"""Publishes a checkpoint's staged files (a temporary directory) under the run's storage; returns its directory."""


class TrainContext(Protocol):
    """What the training loop needs from where it runs."""

    rank: int
    world: int

    def checkpoint(self) -> Any:
        """The checkpoint this attempt is handed (Ray's, with a ``path``), or None: storage's newest decides."""
        ...

    def place(self, model: Any, cfg: TrainConfig) -> Any:
        """The policy placed for training on this rank (plain, DDP or FSDP2; on its device)."""
        ...

    def report(
        self, metrics: dict[str, float], staged: Path | None = None, upload: Upload | None = None
    ) -> None:
        """The step's metrics, and with ``staged`` a checkpoint, written by ``upload`` on every rank."""
        ...


class RayTrainContext:
    """A Ray Train worker's context (``ray.train.get_context()``), read in the worker process."""

    def __init__(self) -> None:
        import ray.train  # slow to import: ray (and the in-process mode never loads Ray)

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()

    def checkpoint(self) -> Any:
        import ray.train  # slow to import: ray

        return ray.train.get_checkpoint()

    def place(self, model: Any, cfg: TrainConfig) -> Any:
        """Plain (one worker) or DDP through ``ray.train.torch.prepare_model``, or FSDP2 (``trainer.strategy``)."""
        import ray.train.torch  # slow to import: ray, torch

        if self.world == 1 or cfg.trainer.strategy == "ddp":
            kwargs = {"broadcast_buffers": False} if self.world > 1 else None
            return ray.train.torch.prepare_model(
                model, parallel_strategy="ddp" if self.world > 1 else None, parallel_strategy_kwargs=kwargs
            )
        # slow to import: torch (and models.wrap)
        import torch

        from tracerl.models.wrap import fully_shard_model, is_meta

        device = ray.train.torch.get_device()
        if is_meta(
            model
        ):  # a rank but 0 (workflows/train/setup.py): sharded first, then given memory and weights
            sharded = fully_shard_model(model, compute_dtype=getattr(torch, cfg.model.dtype))
            return sharded.to_empty(device=device)
        return fully_shard_model(model.to(device), compute_dtype=getattr(torch, cfg.model.dtype))

    def report(
        self, metrics: dict[str, float], staged: Path | None = None, upload: Upload | None = None
    ) -> None:
        """``ray.train.report``: the checkpoint's directory is named after the step (``checkpoint_<step>``)."""
        import ray.train  # slow to import: ray

        if staged is None or upload is None:
            ray.train.report(metrics)
            return
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(staged),
            checkpoint_dir_name=checkpoint_name(int(metrics["step"])),
            checkpoint_upload_fn=lambda ckpt, name: ray.train.Checkpoint.from_directory(
                upload(Path(ckpt.path))
            ),
        )


@dataclass
class InProcessContext:
    """``cluster.address=inprocess``: rank 0 of 1 in the command's process; checkpoints kept in ``storage``."""

    storage: Path
    keep: int
    """The newest checkpoints kept (``keep_checkpoints``), as Ray's ``CheckpointConfig(num_to_keep)`` does."""
    rank: int = 0
    world: int = 1

    def checkpoint(self) -> None:
        return None

    def place(self, model: Any, cfg: TrainConfig) -> Any:
        """As loaded: one rank on the CPU (the mode refuses ``trainer.num_workers > 1`` and GPUs)."""
        return model

    def report(
        self, metrics: dict[str, float], staged: Path | None = None, upload: Upload | None = None
    ) -> None:
        """Publish the checkpoint (``upload``), then remove all but the newest ``keep`` of the run's checkpoints."""
        if staged is not None and upload is not None:
            upload(staged)
            prune(self.storage, self.keep)


def checkpoint_name(step: int) -> str:
    """The directory of step ``step``'s checkpoint under the run's storage."""
    return f"checkpoint_{step:06d}"
