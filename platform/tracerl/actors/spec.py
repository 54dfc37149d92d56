"""What a rollout worker actor is built from: the run's configs, its fault drills and the run's shared services."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracerl.actors.config import PoolConfig
from tracerl.actors.faults import NO_FAULTS, Faults
from tracerl.engine.config import SamplerConfig
from tracerl.env_config import EnvConfig
from tracerl.models.config import ModelConfig


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a ``RolloutWorker`` needs; sent to each actor (and to its replacement after a failure)."""

    model: ModelConfig
    sampler: SamplerConfig
    env: EnvConfig
    pools: PoolConfig
    faults: Faults = NO_FAULTS
    """Fault drills (actors/faults.py): the worker or one of its environment actors exits at a given step, once per
    run."""
    services: Mapping[str, Any] = field(default_factory=dict)
    """The run's shared service actors by name (e.g. the search retriever); empty: each environment builds its
    own."""
    push_transport: str = "ray"
    """``trainer.push_transport``: 'nccl' starts the sampler's engine ready for a collective push
    (tracerl/actors/collective.py)."""
    lora_targets: tuple[str, ...] = ()
    """A LoRA run whose pushes after the first carry the adapters alone (``trainer.lora_targets``): the worker keeps
    a copy of these layers' base weights to merge them into (``tracerl.models.buckets.LoraBase``). Empty: every
    push carries whole weights."""

    @property
    def threads(self) -> int:
        """torch threads of the worker: ``pools.sampler_threads``, else the CPUs Ray reserves for it (at least one)."""
        return self.pools.sampler_threads or max(1, int(self.pools.rollout_cpus))
