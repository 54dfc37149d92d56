"""What the engine asks of a sampler: one turn for each of a batch of token contexts (``Sampler``), and what comes
back (``Generation``). The backends (hf, vllm, scripted) live in ``tracerl.samplers``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Generation:
    """One generated turn."""

    token_ids: list[int]
    """New tokens, cut before any stop string (the stop string itself is not kept)."""
    logprobs: list[float]
    """Sampling log-probability of each kept token."""
    text: str
    finish: str
    """'stop' (a stop string), 'eos' (an end token, ``end_ids``), or 'length' (hit max_new_tokens: a runaway turn)."""
    prefill_tokens: int = 0
    """Context tokens the backend had to encode for this call."""
    reused_tokens: int = 0
    """Context tokens served from a cache."""
    cache: object | None = None
    """Opaque handle to the backend's KV cache of context + kept tokens; pass it back with a longer context
    that starts with them (the next turn, or every continuation from this turn) to skip re-encoding."""


class Sampler(Protocol):
    """Generates one turn per context (see ``Generation`` for what comes back)."""

    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seeds: Sequence[int],
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        """One turn per context. ``seeds[i]`` (``tracerl.engine.seeds.SeedKey.value``) alone decides context i's
        random draws: its tokens must not depend on which other contexts share the call (up to the float
        effects of batching and padding)."""
        ...
