"""A KV cache for ``HFSampler.generate`` whose keys and values grow in place.

transformers' ``DynamicLayer`` grows by concatenation: every decode forward copies each layer's whole cache to
append one token, so a turn of n tokens on a context of L copies about n * L * rows * heads * head_dim floats per
layer (on SmolLM2-135M with 24 rows of 500 tokens, about half a gigabyte a forward). A ``ReservedLayer`` instead
writes the new keys and values into buffers sized for the whole call (the context plus the turn's token cap) and
hands attention views of the filled part: the same numbers, in the same shape, without the copies (the buffers
double if a caller outgrows them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` over buffers of ``capacity`` tokens; ``keys``/``values`` are views of their filled part."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._bufs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._filled = 0

    def fill(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Start from ``keys``/``values`` (rows, heads, tokens, head_dim), copied into fresh buffers."""
        self.lazy_initialization(keys, values)
        self._reserve(keys, values, max(self.capacity, keys.shape[-2]))

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        b, h, n, d = keys.shape
        bk = keys.new_empty((b, h, capacity, d))
        bv = values.new_empty((b, h, capacity, values.shape[-1]))
        bk[:, :, :n].copy_(keys)
        bv[:, :, :n].copy_(values)
        self._bufs, self._filled = (bk, bv), n
        self.keys, self.values = bk[:, :, :n], bv[:, :, :n]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # lazy_initialization made them
        bufs = self._bufs
        if bufs is None or keys.data_ptr() != bufs[0].data_ptr() or keys.shape[-2] != self._filled:
            # first use, or a caller replaced the tensors (crop, reorder, select): start over from what they hold
            if keys.numel() == 0:
                keys, values = key_states[:, :, :0], value_states[:, :, :0]
            self._reserve(keys, values, max(self.capacity, keys.shape[-2]))
        n, t = self._filled, key_states.shape[-2]
        assert self._bufs is not None
        if n + t > self._bufs[0].shape[-2]:
            self._reserve(
                self._bufs[0][:, :, :n], self._bufs[1][:, :, :n], max(2 * self._bufs[0].shape[-2], n + t)
            )
        bk, bv = self._bufs
        bk[:, :, n : n + t].copy_(key_states)
        bv[:, :, n : n + t].copy_(value_states)
        self._filled = n + t
        self.keys, self.values = bk[:, :, : n + t], bv[:, :, : n + t]
        return self.keys, self.values


def reserved_cache(capacity: int, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> DynamicCache:
    """A ``DynamicCache`` whose layers are ``ReservedLayer``s of ``capacity`` tokens (made as the model's layers
    first write), filled with ``prefix`` (per layer keys and values) when given."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = cast(Any, lambda: ReservedLayer(capacity))
    for k, v in prefix:
        layer = ReservedLayer(capacity)
        layer.fill(k, v)
        cache.layers.append(layer)
    return cache


def full_attention(config: Any) -> bool:
    """Every layer of the model attends to its whole context (no sliding window, no linear attention): the layers a
    ``ReservedLayer`` stands in for. Other models (or none: ``config`` None) keep transformers' own cache."""
    if config is None:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None) or ()
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) else None
    return all(t == "full_attention" for t in types) and window is None
