"""The sampler pool in the trainer's own process (``cluster.address=inprocess``): no Ray, no actors.

``LocalPool`` holds one ``RolloutWorker`` (actors/worker.py: its own copy of the policy, the sampler, the engine and
the environment, whose tool calls run on threads of this process; the sandbox and grading subprocesses stay as they are). It shards
a step's work exactly as the Ray pool does over ``pools.rollout_workers`` workers (actors/sharded.py), and runs the
shards one after another on that one worker: every sampler call then holds the paths it would hold on the Ray
mode's actors, so the batches, their padding and so the floats of every turn are the same, and the same seed gives
the same trees in both modes (``pools.rollout_workers=1`` runs one batch: fewer, larger forwards).

What travels between the step driver and a Ray actor is a copy; here every call's arguments and results are deep
copies too (``_call_all``), so the driver's trees and the worker's own (which keep their KV caches for the
expansion) never share a node list, as across processes. Weights are copied into the worker's policy copy bucket
by bucket (``push``: the Ray actors' own ``load_bucket``), never shared with the trainer's tensors: the trainer's update
would otherwise change the weights a step's rollouts (with ``pipeline.overlap``) are still sampling with.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from tracerl.actors.sharded import ShardedPool
from tracerl.actors.spec import WorkerSpec
from tracerl.actors.worker import RolloutWorker
from tracerl.engine.stream import OnBare
from tracerl.tree import RolloutTree
from tracerl.types import Prompt


class LocalPool(ShardedPool):
    """The step driver's ``TreeBackend`` over one in-process ``RolloutWorker`` that runs ``shards`` workers' work."""

    parallel = False

    def __init__(self, spec: WorkerSpec, shards: int, seed: int) -> None:
        """Load the policy copy now (the caller's process sets torch's threads: the worker leaves them alone);
        environment actors and shared service actors are never started: a round's tool calls run on as many threads
        of this process as the Ray mode has environment actors (``shards * pools.env_workers``, at least ``shards``)."""
        if shards < 1:
            raise ValueError(f"pools.rollout_workers must be >= 1 (got {shards})")
        tool_threads = shards * max(1, spec.pools.env_workers)
        spec = replace(spec, pools=replace(spec.pools, env_workers=0), services={})
        super().__init__(spec, seed)
        self.worker = RolloutWorker(spec, own_threads=False, tool_threads=tool_threads)
        self.workers = [self.worker] * shards

    @property
    def threads(self) -> int:
        """The process's torch threads (the trainer sets them; the worker shares them)."""
        import torch

        return int(torch.get_num_threads())

    def _call_all(self, calls: list[tuple[int, str, tuple[Any, ...]]]) -> list[Any]:
        """The calls one after another on the one worker, arguments and results copied as a Ray call copies them."""
        return [copy.deepcopy(getattr(self.worker, m)(*copy.deepcopy(args))) for _, m, args in calls]

    def release(self, step: int) -> None:
        self.worker.release(step)

    def warnings(self) -> list[str]:
        return self.worker.warnings()

    def wait_ready(self) -> None:
        """Nothing to wait for: the constructor loaded the policy."""

    def push(self, buckets: Iterable[Any], bucket_bytes: int) -> None:
        """A weight push (``tracerl.models.buckets``) into the worker's own policy copy, bucket by bucket."""
        for bucket in buckets:
            self.worker.load_bucket(bucket)
        self._pushed_to([self.worker.end_push()])

    def stream(self, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare) -> list[RolloutTree]:
        """A streaming step (``pipeline.mode=streaming``) on the one engine, as ``tracerl rollout`` streams
        (engine/stream.py): every tree in one run of rounds, its expansion joining as soon as ``on_bare`` decides it."""
        self._phase += 1
        trees, ledger = self.worker.stream_whole(self.step, self.seed, prompts, counts, on_bare)
        self._merge([ledger])
        for t, p in zip(trees, prompts):
            t.prompt = p  # the caller's prompt objects (identity matters to the step driver)
        return trees

    def cpu_s(self) -> float:
        """0: the worker runs in the trainer's process, whose CPU the trainer's own reading counts already."""
        return 0.0

    def shutdown(self) -> None:
        """Drop the worker's trees and streaming state, and its sampler's engine (the policy copy goes with the
        pool)."""
        self.worker.shutdown()
