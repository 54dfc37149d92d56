"""The weight push: the trainer's policy after an update into every sampler, bucket by bucket.

Every rank iterates the policy's tensors (``tracerl.models.buckets.policy_tensors``: under FSDP2 one parameter's
``full_tensor()`` at a time, a collective), so no rank gathers the whole model; rank 0 casts them into buckets of at
most ``trainer.push_bucket_mb`` in ``model.dtype`` and hands each to its sampler pool (``RolloutPool.push``: one
object in the store per bucket, freed once every sampler loaded it; ``LocalPool.push`` in-process). The other
ranks' tensors are dropped as soon as the collective returns them. A LoRA run with hf samplers pushes its adapters
alone after its first (whole) push (``adapter_pushes``; the samplers merge them into their base copy). ``EngineRestarts`` is what rank 0 logs about
sampler engines that restart to take a push.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl import metrics as M
from tracerl.config import TrainerConfig


def push_policy(model: Any, trainer: TrainerConfig, pool: Any, dtype: str, adapters: bool = False) -> None:
    """Push ``model``'s HF-named weights (LoRA merged), cast to ``dtype``, into every sampler of ``pool`` (rank 0);
    ``pool`` None on the other ranks, which only take part in the gathers (under FSDP; DDP ranks return at once).
    ``adapters``: a LoRA model's adapters alone, in float32, which the samplers merge into their base copy (every
    rank must pass the same)."""
    # slow to import: torch (and models.buckets, models.wrap)
    import torch

    from tracerl.models.buckets import adapter_tensors, batched, pack, policy_tensors
    from tracerl.models.wrap import is_fsdp, lora_scaling

    tensors = adapter_tensors(model) if adapters else policy_tensors(model, trainer)
    if pool is None:
        if is_fsdp(model):
            for _ in tensors:  # each parameter's gather, in rank 0's order
                pass
        return
    bucket_bytes = trainer.push_bucket_mb << 20
    if trainer.push_transport == "nccl":  # broadcast to the engines' GPUs (tracerl/actors/collective.py)
        pool.push_collective(batched(tensors, getattr(torch, dtype), bucket_bytes))
        return
    if adapters:
        pool.push(pack(tensors, torch.float32, bucket_bytes, lora_scaling(trainer)), bucket_bytes)
        return
    pool.push(pack(tensors, getattr(torch, dtype), bucket_bytes), bucket_bytes)


def adapter_pushes(trainer: TrainerConfig, backend: str) -> bool:
    """Whether a run's pushes after the first carry its LoRA adapters alone: a LoRA run (``trainer.lora_rank > 0``)
    whose samplers hold an HF copy of the policy to merge them into (not an engine that loads its own weights:
    vLLM gets every push whole)."""
    from tracerl.samplers import SAMPLERS  # slow to import: torch, transformers (samplers)

    own = bool(getattr(SAMPLERS.get(backend), "loads_own_weights", False))
    return trainer.lora_rank > 0 and not own


class EngineRestarts:
    """What rank 0 logs about sampler engines that restart to take a push (vLLM without in-place loading, e.g. the
    CPU build): their number each step (``sampler/engine_restarts``, from the pool's count), and one warning per
    run, the first time any restarted (a marker file in the run's storage keeps a restarted trainer or a resumed
    run from saying it again)."""

    MARKER = ".engine_restart_warned"

    def __init__(self, storage: Path, say: Callable[[str], None]) -> None:
        self.marker = Path(storage) / self.MARKER
        self.say = say
        self.logged = 0
        """The pool's count at the last step's log."""

    def metrics(self, pool: Any) -> dict[str, float]:
        """The restarts since the last step's log (a restored run's first push counts at its first step); says the
        warning if this is the run's first."""
        count = int(getattr(pool, "engine_restarts", 0))
        new, self.logged = count - self.logged, count
        if new > 0 and not self.marker.exists():
            self.say(
                "tracerl: warning: a sampler's vLLM engine cannot load pushed weights in place "
                f"({getattr(pool, 'restart_reason', None)}): every weight push restarts every sampler engine on a "
                f"checkpoint of the new weights (much slower; the CPU build does this); counted each step as "
                f"{M.ENGINE_RESTARTS}"
            )
            self.marker.touch()
        return {M.ENGINE_RESTARTS: float(new)}
