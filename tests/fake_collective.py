"""``FakeCollectiveSampler``: a fake engine sampler (test double) that takes a collective weight push as vLLM's
weight transfer does (tracerl/actors/collective.py), over a gloo group on the CPU instead of NCCL on GPUs.

Its "engine" is one rank of the push's group: ``init_transfer`` joins it, ``receive_weights`` takes each tensor by
broadcast and keeps it, ``export_bucket`` hands what it holds back (so a test reads a Ray actor's weights).
Importable by path (``sampler.backend=tests.fake_collective:FakeCollectiveSampler``), so Ray sampler actors build it
through the sampler registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tracerl.actors.collective import GlooGroup, PushGroup, receive
from tracerl.models.buckets import Bucket, pack


class FakeCollectiveSampler:
    """Fake engine sampler: no HF model, one group rank, the received tensors by name."""

    loads_own_weights = True
    collective_push = True

    def __init__(self, tokenizer: Any, ranks: int = 1) -> None:
        self.tok, self.ranks = tokenizer, ranks
        self.groups: list[PushGroup] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.ended = 0

    @classmethod
    def from_config(
        cls,
        model_cfg: Any,
        cfg: Any,
        model: Any,
        tokenizer: Any,
        gpus: float = 1.0,
        push_transport: str = "ray",
    ) -> FakeCollectiveSampler:
        assert model is None and push_transport == "nccl"
        return cls(tokenizer)

    def transfer_ranks(self) -> int:
        return self.ranks

    def init_transfer(self, address: str, port: int, rank_offset: int, world: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(
            self.ranks
        ) as ex:  # an engine's ranks join together (each blocks until all do)
            joins = [ex.submit(GlooGroup, address, port, rank_offset + r, world) for r in range(self.ranks)]
            self.groups = [j.result() for j in joins]

    def receive_weights(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> int:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.ranks) as ex:  # every rank receives every tensor (a replica per rank)
            got = [f.result() for f in [ex.submit(receive, g, names, dtypes, shapes) for g in self.groups]]
        for name, t in got[0]:
            assert all(torch.equal(t, dict(other)[name]) for other in got[1:])
            self.weights[name] = t
        return sum(t.numel() * t.element_size() for _, t in got[0])

    def end_push(self) -> None:
        self.ended += 1

    def export_bucket(self, index: int, bucket_bytes: int) -> Bucket | None:
        """Everything received so far and, as the tensor ``ended``, how many pushes ended: one bucket (index 0;
        ``bucket_bytes`` must hold them all)."""
        if index > 0:
            return None
        items = [*self.weights.items(), ("ended", torch.tensor([self.ended]))]
        dtypes = {t.dtype for _, t in self.weights.items()} or {torch.float32}
        return next(pack(iter(items), dtypes.pop(), bucket_bytes))
