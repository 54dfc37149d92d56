"""The weight push: the trainer's policy after an update into every sampler (rank 0's ``Driver.sync``).

Today's push, as ``workflows/train/loop.py`` runs it: the whole state gathered on rank 0 (``Worker.gather``, a
collective under FSDP), cloned, cast to the samplers' dtype and put into the object store as one object that every
sampler fetches and loads.
"""

from __future__ import annotations

from typing import Any

from tracerl.config import TrainerConfig


def push_policy(model: Any, trainer: TrainerConfig, pool: Any, dtype: str) -> None:
    """Push ``model``'s HF-named weights (LoRA merged), cast to ``dtype``, into every sampler of ``pool``."""
    import torch

    from tracerl.models.wrap import gather_state, hf_weights

    weights = hf_weights(gather_state(model), trainer)
    cast = getattr(torch, dtype)
    pool.load_weights({k: v.to(cast) if v.is_floating_point() else v for k, v in weights.items()})
