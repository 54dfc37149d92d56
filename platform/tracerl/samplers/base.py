"""The sampler backends' registry and what every backend shares: the end tokens of a turn and cutting at a stop.

The protocol itself (``Sampler``: one turn for each of a batch of token contexts, and ``Generation``) is the
engine's (``tracerl.engine.generation``), re-exported here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["SAMPLERS", "Generation", "Sampler", "SamplerBackend", "cut_at_stop", "end_ids", "stop_token_ids"]

from tracerl.engine.config import SamplerConfig
from tracerl.engine.generation import Generation, Sampler
from tracerl.models.config import ModelConfig
from tracerl.registry import Registry


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
