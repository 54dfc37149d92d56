"""What a rollout worker actor is built from: the run's configs, its fault drills and the run's shared services."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracerl.config import EnvConfig, ModelConfig, PoolConfig, SamplerConfig


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a ``RolloutWorker`` needs; sent to each actor (and to its replacement after a failure)."""

    model: ModelConfig
    sampler: SamplerConfig
    env: EnvConfig
    pools: PoolConfig
    kill_at_step: int = -1
    """Fault drill: the worker exits at the start of this step (once per run; -1: never)."""
    kill_env_at_step: int = -1
    """Fault drill: an environment actor exits at this step (once per run; -1: never)."""
    fault_dir: str | None = None
    """Where the drills mark that a fault already fired (so a restarted run does not repeat it)."""
    services: Mapping[str, Any] = field(default_factory=dict)
    """The run's shared service actors by name (e.g. the search retriever); empty: each environment builds its
    own."""

    @property
    def threads(self) -> int:
        """torch threads of the worker: the CPUs Ray reserves for it (at least one)."""
        return max(1, int(self.pools.rollout_cpus))
