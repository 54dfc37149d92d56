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
    """'stop' (a stop string), 'eos' (an end token, ``end_ids``), or 'length' (hit max_new_tokens: a runaway turn)."""
    prefill_tokens: int = 0
    """Context tokens the backend had to encode for this call."""
    reused_tokens: int = 0
    """Context tokens served from a cache."""
    cache: object | None = None
    """Opaque handle to the backend's KV cache of context + kept tokens; pass it back with a longer context
    that starts with them (the next turn, or every continuation from this turn) to skip re-encoding."""


def end_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """Every token that ends a turn: the tokenizer's EOS first, then each end token the model's generation config
    lists (Qwen3 lists ``<|im_end|>`` and ``<|endoftext|>``); a generation that writes any of them has ended.
    A tokenizer without EOS has none (a benchmark runs every row to the length it asks)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    ids = [eos]
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += listed if isinstance(listed, (list, tuple)) else [listed]
    return [int(i) for i in dict.fromkeys(ids) if i is not None]


def cut_at_stop(
    tokenizer: Any, new: list[int], stop: Sequence[str], ends: Sequence[int] = ()
) -> tuple[list[int], str, str]:
    """The ``Generation`` contract from a backend's raw new tokens: cut at the first end token, drop a pad tail,
    cut before the first stop string (a backend that stops at one still returns the tokens that spell it).
    Returns (tokens, text, finish).

    ``ends`` (``end_ids``) are the tokens that end a turn besides the tokenizer's EOS. The EOS (the chat template's
    end-of-turn marker) is kept as a model token: the policy is trained to end its turns, and the template's next
    message continues after it. Any other end token is not kept (the template's next message writes the
    end-of-turn marker itself), so the context reads as the chat template renders the conversation."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    others = set(ends) - {eos}
    finish = "length"
    for i, t in enumerate(new):
        if t == eos or t in others:
            new, finish = new[: i + (t == eos)], "eos"
            break
        if t == pad:
            new = new[:i]
            break
    body = new[:-1] if new and new[-1] == eos and finish == "eos" else new  # EOS: a model token, not text
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


def stop_token_ids(tokenizer: Any, stop: Sequence[str], ends: Sequence[int]) -> list[int]:
    """Token ids a backend that matches stop strings on detokenized text should stop on as well: the end tokens
    and every stop string that is one special token (``<|im_start|>``), which text without special tokens never
    shows."""
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(
        getattr(tokenizer, "added_tokens_decoder", {}) or {}
    )
    ids = list(ends)
    for s in stop:
        enc = tokenizer(s, add_special_tokens=False)["input_ids"]
        if len(enc) == 1 and enc[0] in special:
            ids.append(int(enc[0]))
    return list(dict.fromkeys(ids))


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
