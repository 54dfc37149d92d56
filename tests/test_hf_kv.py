"""The hf sampler's reserved KV cache (samplers/hf_kv.py): in place, the same contents as transformers' own, the
same turns from the sampler, and transformers' cache kept where layers do not attend to their whole context."""

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config
from transformers.cache_utils import DynamicLayer

from tracerl.samplers.hf import HFSampler
from tracerl.samplers.hf_kv import ReservedLayer, full_attention, reserved_cache


def _states(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 2, n, 4, generator=g), torch.randn(3, 2, n, 4, generator=g)


def test_a_reserved_layer_holds_what_a_dynamic_layer_holds_and_writes_in_place() -> None:
    reserved, dynamic = ReservedLayer(capacity=8), DynamicLayer()
    buffers = set()
    for i, n in enumerate([5, 1, 1, 1, 1, 1, 3]):  # 5 + 3 fill the 8 reserved tokens; the last 3 outgrow them
        k, v = _states(n, i)
        got, want = reserved.update(k, v), dynamic.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert reserved.get_seq_length() == dynamic.get_seq_length()
        buffers.add(got[0].untyped_storage().data_ptr())
    assert len(buffers) == 2  # one buffer for the first 8 tokens, one after it doubled
    assert reserved.keys.shape == (3, 2, 13, 4)


def test_a_reserved_layer_follows_a_caller_that_replaced_its_tensors() -> None:
    reserved, dynamic = ReservedLayer(capacity=16), DynamicLayer()
    for layer in (reserved, dynamic):
        layer.update(*_states(6, 0))
        layer.crop(-2)  # transformers' own trimming: assigns sliced tensors
    got, want = reserved.update(*_states(2, 1)), dynamic.update(*_states(2, 1))
    assert got[0].shape[-2] == 6
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_reserved_cache_starts_from_a_prefix() -> None:
    k, v = _states(4, 0)
    cache = reserved_cache(10, [(k, v), (2 * k, 2 * v)])
    assert cache.get_seq_length() == 4 and len(cache.layers) == 2
    keys, _ = cache.update(*_states(1, 1), layer_idx=1)
    assert torch.equal(keys[:, :, :4], 2 * k) and keys.shape[-2] == 5
    assert isinstance(reserved_cache(10).update(k, v, layer_idx=0)[0], torch.Tensor)


def test_only_layers_that_attend_to_their_whole_context_get_it() -> None:
    assert full_attention(LlamaConfig())
    assert full_attention(Qwen2Config(use_sliding_window=False, sliding_window=4096))
    assert not full_attention(Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=0))
    assert not full_attention(
        LlamaConfig(layer_types=["full_attention", "sliding_attention"], num_hidden_layers=2)
    )


def test_the_sampler_samples_the_same_turns_on_either_cache(parts) -> None:  # type: ignore[no-untyped-def]
    """Two turns (the second from the first's KV handles) on the reserved cache and on transformers' own."""
    tok, model = parts
    reserved, plain = HFSampler(model, tok), HFSampler(model, tok)
    plain.full_attention = False
    assert reserved.full_attention
    prompts = [
        tok(t, add_special_tokens=False)["input_ids"] for t in ("Question: 5 + 5?\n", "Question: 4 * 7?\n")
    ]
    turns = []
    for s in (reserved, plain):
        first = s.generate(prompts, 12, [], temperature=1.0, seeds=[1, 2])
        nxt = [p + g.token_ids + p[:3] for p, g in zip(prompts, first)]
        second = s.generate(nxt, 12, [], temperature=1.0, seeds=[3, 4], caches=[g.cache for g in first])
        assert all(g.reused_tokens > 0 for g in second)
        turns.append(first + second)
    for a, b in zip(*turns):
        assert a.token_ids == b.token_ids and a.finish == b.finish
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
