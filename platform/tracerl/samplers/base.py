"""The sampler protocol: generate one turn for each of a batch of token contexts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tracerl.registry import Registry

SAMPLERS: Registry = Registry("sampler")


@dataclass(frozen=True)
class Generation:
    """One generated turn."""

    token_ids: list[int]
    """New tokens, cut before any stop string (the stop string itself is not kept)."""
    logprobs: list[float]
    """Sampling log-probability of each kept token."""
    text: str
    finish: str
    """'stop' (a stop string), 'eos', or 'length' (hit max_new_tokens: a runaway turn)."""
    prefill_tokens: int = 0
    """Context tokens the backend had to encode for this call."""
    reused_tokens: int = 0
    """Context tokens served from a cache."""
    cache: object | None = None
    """Opaque handle to the backend's KV cache of context + kept tokens; pass it back with a longer context
    that starts with them (the next turn, or every continuation from this turn) to skip re-encoding."""


class Sampler(Protocol):
    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seed: int,
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]: ...
