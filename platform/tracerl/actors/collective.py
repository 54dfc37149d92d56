"""The collective weight push (``trainer.push_transport: nccl``): trainer rank 0 broadcasts the policy's tensors to
the sampler engines' workers over a process group of their own; Ray carries only what each broadcast will hold.

The protocol has the shape of vLLM's weight transfer (an engine started with a ``WeightTransferConfig``): set up
once, then per push the tensors' names, dtypes and shapes on the control plane (Ray calls to the sampler actors) and
the tensors themselves on the data plane (one broadcast each, in that order):

1. ``CollectivePush.setup`` (before the first push): every sampler says how many ranks its engine has
   (``transfer_ranks``); rank 0 picks a port, starts every sampler's ``init_transfer(address, port, rank_offset,
   world)`` (its engine's workers join as ranks ``rank_offset ..``) and joins as rank 0 itself; world = 1 + them all.
2. Per batch of at most ``trainer.push_bucket_mb`` (``batched``): every sampler's ``receive_weights(names, dtypes,
   shapes)`` starts (each engine rank enters one broadcast per tensor and loads what it gets), rank 0 broadcasts each
   tensor, then waits for the samplers; each returns the bytes it took, which must be the batch's.
3. ``end_push`` on every sampler (vLLM: its weight update ends, its prefix cache is reset).

The group is a ``PushGroup``: ``GlooGroup`` (torch's gloo over a TCP store of its own, on the CPU: the tests' fake
engine) or ``nccl_group`` (vLLM's stateless NCCL communicator, the one its engine workers build on their side; GPU
builds of vLLM only). Either is separate from the default process group the trainer ranks share. A sampler that dies
mid-push leaves the others waiting in a broadcast: the push fails, and the run restarts from its last checkpoint
(``max_failures``); a replaced sampler is not caught up over the group (``RolloutPool`` says so).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch

Batch = list[tuple[str, torch.Tensor]]
TIMEOUT = timedelta(minutes=30)
"""How long a member waits for the group to form, or for a broadcast."""


class PushGroup(Protocol):
    """The data plane: a process group in which rank 0 (trainer rank 0) broadcasts."""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0 sends ``tensor``; every other rank receives into its ``tensor`` (same dtype and shape)."""
        ...


class GlooGroup:
    """A gloo process group of its own (a TCP store at ``address:port``, rank 0 its server): CPU tensors."""

    def __init__(self, address: str, port: int, rank: int, world: int) -> None:
        import torch.distributed as dist

        store = dist.TCPStore(address, port, world, rank == 0, timeout=TIMEOUT)
        self.group = dist.ProcessGroupGloo(store, rank, world, TIMEOUT)

    def broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        flat = tensor.reshape(-1).view(torch.uint8)  # any dtype travels as its bytes (gloo lacks bfloat16)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([flat], opts).wait()  # type: ignore[attr-defined]


def nccl_group(address: str, port: int, rank: int, world: int) -> PushGroup:
    """Trainer rank 0's member of the engines' NCCL group: vLLM's stateless communicator on this GPU.

    Raises:
        tracerl.models.hf.SetupError: no CUDA here, or no vLLM with weight transfer."""
    from tracerl.models.hf import SetupError

    if not torch.cuda.is_available():
        raise SetupError(
            "trainer.push_transport=nccl needs CUDA on trainer rank 0, and this node has none: set "
            "trainer.push_transport=ray"
        )
    try:  # vLLM >= 0.17 (weight transfer engines); the module moved between releases
        from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group
    except ImportError:
        try:
            from vllm.distributed.weight_transfer.nccl_engine import stateless_init_process_group
        except ImportError as exc:
            raise SetupError(
                "trainer.push_transport=nccl needs a vLLM with weight transfer (vllm.distributed.weight_transfer) "
                f"on the trainer too ({exc}): install the vllm extra there, or set trainer.push_transport=ray"
            ) from None
    device = torch.device("cuda", torch.cuda.current_device())
    comm = stateless_init_process_group(address, port, rank, world, device)

    class _Nccl:
        def broadcast(self, tensor: torch.Tensor) -> None:
            t = tensor.to(device, non_blocking=True).contiguous()
            comm.broadcast(t, src=0, stream=torch.cuda.current_stream())

    return _Nccl()


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the group's store listens on it)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class CollectivePush:
    """Rank 0's side of the protocol over ``n`` samplers, reached through ``start`` (``(method, per-sampler args)``
    -> one handle per sampler, the calls running meanwhile) and ``wait`` (handles -> results)."""

    def __init__(
        self,
        start: Callable[[str, Sequence[tuple[Any, ...]]], list[Any]],
        wait: Callable[[list[Any]], list[Any]],
        n: int,
        address: str,
        make_group: Callable[[str, int, int, int], PushGroup],
    ) -> None:
        self.start, self.wait, self.n = start, wait, n
        self.address, self.make_group = address, make_group
        self.group: PushGroup | None = None
        self.world = 0

    def setup(self) -> None:
        """Form the group: every sampler's engine ranks and rank 0 (this process)."""
        ranks = [int(r) for r in self.wait(self.start("transfer_ranks", [()] * self.n))]
        self.world = 1 + sum(ranks)
        port = free_port(self.address)
        offsets = [1 + sum(ranks[:i]) for i in range(self.n)]
        joining = self.start("init_transfer", [(self.address, port, o, self.world) for o in offsets])
        self.group = self.make_group(self.address, port, 0, self.world)  # returns once every rank joined
        self.wait(joining)

    def push(self, batches: Iterable[Batch]) -> list[Any]:
        """One push, batch by batch (the group formed first if it is not); returns every sampler's ``end_push``.

        Raises:
            RuntimeError: a sampler took other than the batch's bytes."""
        if self.group is None:
            self.setup()
        assert self.group is not None
        for batch in batches:
            header = (
                [name for name, _ in batch],
                [str(t.dtype).removeprefix("torch.") for _, t in batch],
                [tuple(t.shape) for _, t in batch],
            )
            receiving = self.start("receive_weights", [header] * self.n)
            for _, t in batch:
                self.group.broadcast(t)
            want = sum(t.numel() * t.element_size() for _, t in batch)
            got = self.wait(receiving)
            if any(int(g) != want for g in got):
                raise RuntimeError(
                    f"a collective weight push sent {want} bytes but the samplers took {got}: their weights are "
                    "mixed; restart the run from its last checkpoint"
                )
        return self.wait(self.start("end_push", [()] * self.n))


def receive(
    group: PushGroup, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
) -> Batch:
    """An engine rank's side of one batch: a tensor of each dtype and shape, filled by rank 0's broadcasts in order
    (what a fake engine runs; vLLM's engine workers run their own)."""
    out = []
    for name, dt, shape in zip(names, dtypes, shapes):
        t = torch.empty(tuple(shape), dtype=getattr(torch, dt))
        group.broadcast(t)
        out.append((name, t))
    return out
