"""The vLLM sampler's side of a collective weight push (``trainer.push_transport: nccl``, tracerl/actors/collective.py)
through vLLM's own weight transfer: an engine started with ``WeightTransferConfig(backend="nccl")`` whose workers join
trainer rank 0's NCCL group (``init_weight_transfer_engine``) and take each push's tensors by broadcast
(``update_weights`` with their names, dtypes and shapes; between ``start_weight_update`` and ``finish_weight_update``
where the engine has them: vLLM's releases differ there).

Written against vLLM's documented weight-transfer API (the engine's ``init_weight_transfer_engine`` and
``update_weights`` requests); not yet run: it needs a GPU build of vLLM, and no GPU ran it here (docs/design.md).
Imported only by ``tracerl.samplers.vllm``; vllm itself only inside the methods.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from tracerl.engine.aio import run as on_loop


def transfer_engine_kwargs(push_transport: str) -> dict[str, Any]:
    """Engine arguments for ``trainer.push_transport``: NCCL weight transfer for 'nccl', none for 'ray'."""
    if push_transport != "nccl":
        return {}
    from vllm.config import WeightTransferConfig

    return {"weight_transfer_config": WeightTransferConfig(backend="nccl")}


async def _call(engine: Any, method: str, *args: Any) -> Any:
    out = getattr(engine, method)(*args)
    return await out if inspect.isawaitable(out) else out


class VLLMTransfer:
    """Mixed into ``VLLMSampler``: the receiving side of tracerl/actors/collective.py's protocol."""

    collective_push = True
    """This backend takes ``trainer.push_transport=nccl`` (the config check reads it)."""
    engine: Any
    engine_kwargs: dict[str, Any]
    _updating: bool = False

    def transfer_ranks(self) -> int:
        """The engine's workers that join the push's group: its tensor x pipeline parallel ranks."""
        kw = self.engine_kwargs
        return int(kw.get("tensor_parallel_size", 1)) * int(kw.get("pipeline_parallel_size", 1))

    def init_transfer(self, address: str, port: int, rank_offset: int, world: int) -> None:
        """The engine's workers join trainer rank 0's group as ranks ``rank_offset ..`` of ``world``."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        info = {
            "master_address": address,
            "master_port": port,
            "rank_offset": rank_offset,
            "world_size": world,
        }
        on_loop(_call(self.engine, "init_weight_transfer_engine", WeightTransferInitRequest(init_info=info)))

    def receive_weights(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> int:
        """One batch: the engine's workers receive each tensor by broadcast, in order, and load it; the bytes."""
        import torch
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        info = {"names": list(names), "dtype_names": list(dtypes), "shapes": [list(s) for s in shapes]}
        if not self._updating and hasattr(self.engine, "start_weight_update"):
            on_loop(_call(self.engine, "start_weight_update"))
        self._updating = True
        on_loop(_call(self.engine, "update_weights", WeightTransferUpdateRequest(update_info=info)))
        sizes = [torch.Size(s).numel() * getattr(torch, d).itemsize for s, d in zip(shapes, dtypes)]
        return int(sum(sizes))

    def finish_transfer(self) -> None:
        """The push ended: the engine's update finishes and its prefix cache (the old weights') is dropped."""
        if not self._updating:
            return
        self._updating = False
        if hasattr(self.engine, "finish_weight_update"):
            on_loop(_call(self.engine, "finish_weight_update"))
        on_loop(_call(self.engine, "reset_prefix_cache"))
