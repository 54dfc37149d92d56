"""The sampler protocol: generate one turn for each of a batch of token contexts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tracerl.config import ModelConfig, SamplerConfig
from tracerl.registry import Registry


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


def cut_at_stop(tokenizer: Any, new: list[int], stop: Sequence[str]) -> tuple[list[int], str, str]:
    """The ``Generation`` contract from a backend's raw new tokens: drop a pad/EOS tail, cut before the first stop
    string (a backend that stops at one still returns the tokens that spell it). Returns (tokens, text, finish)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    finish = "length"
    for i, t in enumerate(new):
        if t in (eos, pad):
            new, finish = new[: i + (t == eos)], "eos" if t == eos else "length"
            break
    body = new[:-1] if finish == "eos" else new  # EOS is kept as a model token but not as text
    text = tokenizer.decode(body)
    hits = [text.find(s) for s in stop if s in text]
    if not hits:
        return new, text, finish
    pos = min(hits)
    keep = 0  # largest token prefix whose text ends at or before the stop string
    for k in range(len(body) + 1):
        if len(tokenizer.decode(body[:k])) <= pos:
            keep = k
        else:
            break
    return body[:keep], tokenizer.decode(body[:keep]), "stop"


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


class SamplerBackend(Protocol):
    """A sampler class as ``SAMPLERS`` holds it: every backend is built from the run's config the same way."""

    def from_config(
        self, model_cfg: ModelConfig, cfg: SamplerConfig, model: Any, tokenizer: Any, gpus: float = 1.0
    ) -> Sampler:
        """The backend for ``model_cfg``'s policy: around the already loaded ``model`` and ``tokenizer``
        (transformers), or an engine of its own started on ``model_cfg.path`` and sized by ``cfg`` and the
        GPU share ``gpus`` (vLLM)."""
        ...


SAMPLERS: Registry[SamplerBackend] = Registry("sampler")
