"""``FakeSeededSampler``: a fake sampler whose every turn is a pure function of the request's seed.

Used where the unit under test is the seeding of rollouts (the engine, the rollout pool): a turn is a python
tool call or a final answer with random numbers drawn from ``seeds[i]`` alone, so two rollouts give the same
trees exactly when every turn got the same seed. Importable by path (``sampler.backend=
tests.fake_seeded:FakeSeededSampler``), so Ray rollout workers build it through the sampler registry.
``FakeSampler`` is the base of fakes whose turns are computed one context at a time (``turn``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tracerl.samplers.base import Generation


class FakeSampler:
    """Base of the fake samplers: ``generate`` asks ``turn`` for each context's turn, one context at a time."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    @classmethod
    def from_config(
        cls, model_cfg: Any, cfg: Any, model: Any, tokenizer: Any, gpus: float = 1.0
    ) -> FakeSampler:
        """How the sampler registry builds every backend: only the policy's tokenizer is used."""
        return cls(tokenizer)

    def generate(
        self,
        contexts: Sequence[list[int]],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seeds: Sequence[int],
        caches: Sequence[object | None] | None = None,
    ) -> list[Generation]:
        assert len(seeds) == len(contexts)
        return [self.turn(ctx, seed, max_new_tokens) for ctx, seed in zip(contexts, seeds)]

    def turn(self, context: list[int], seed: int, max_new_tokens: int) -> Generation:
        """The turn after ``context`` (at most ``max_new_tokens``), drawn from ``seed`` if at all."""
        raise NotImplementedError

    def stopped(self, context: list[int], ids: list[int], logprobs: list[float]) -> Generation:
        """A turn of ``ids`` that ended at a stop string."""
        return Generation(ids, logprobs, self.tok.decode(ids), "stop", prefill_tokens=len(context))


class FakeSeededSampler(FakeSampler):
    """Fake sampler: each context's turn (text and log-probs) is drawn from its own seed only."""

    def turn(self, context: list[int], seed: int, max_new_tokens: int) -> Generation:
        rng = np.random.default_rng(seed)
        a, b = rng.integers(1, 10, size=2)
        if rng.random() < 0.35:
            text = f"Thought: done\nFinal Answer: {a * b}\n"
        else:
            text = f"Thought: compute\nAction: python[print({a} * {b})]\n"
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])[:max_new_tokens]
        return self.stopped(context, ids, (-rng.random(len(ids))).tolist())


class FakeAsyncSeededSampler(FakeSeededSampler):
    """Fake async sampler (``agenerate``: the per-path driver of engine/paths.py): the same seed-only turns, each
    finishing after a delay drawn from its seed, so paths finish their turns out of the order they started them."""

    async def agenerate(
        self,
        context: list[int],
        max_new_tokens: int,
        stop: Sequence[str],
        temperature: float,
        seed: int,
        cache: object | None = None,
    ) -> Generation:
        import asyncio

        await asyncio.sleep(0.002 * (seed % 7))
        (g,) = self.generate([context], max_new_tokens, stop, temperature, [seed])
        return g


class FakeEngineSampler(FakeSeededSampler):
    """Fake sampler standing for an engine that loads the policy's weights itself (as vLLM does)."""

    loads_own_weights = True
