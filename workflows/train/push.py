"""The weight push: the trainer's policy after an update into every sampler, bucket by bucket.

Every rank iterates the policy's tensors (``tracerl.models.buckets.policy_tensors``: under FSDP2 one parameter's
``full_tensor()`` at a time, a collective), so no rank gathers the whole model; rank 0 casts them into buckets of at
most ``trainer.push_bucket_mb`` in ``model.dtype`` and hands each to its sampler pool (``RolloutPool.push``: one
object in the store per bucket, freed once every sampler loaded it; ``LocalPool.push`` in-process). The other
ranks' tensors are dropped as soon as the collective returns them.
"""

from __future__ import annotations

from typing import Any

from tracerl.config import TrainerConfig


def push_policy(model: Any, trainer: TrainerConfig, pool: Any, dtype: str) -> None:
    """Push ``model``'s HF-named weights (LoRA merged), cast to ``dtype``, into every sampler of ``pool`` (rank 0);
    ``pool`` None on the other ranks, which only take part in the gathers (under FSDP; DDP ranks return at once)."""
    import torch

    from tracerl.models.buckets import pack, policy_tensors
    from tracerl.models.wrap import is_fsdp

    tensors = policy_tensors(model, trainer)
    if pool is None:
        if is_fsdp(model):
            for _ in tensors:  # each parameter's gather, in rank 0's order
                pass
        return
    bucket_bytes = trainer.push_bucket_mb << 20
    pool.push(pack(tensors, getattr(torch, dtype), bucket_bytes), bucket_bytes)
