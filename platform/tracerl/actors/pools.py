"""The sampler actor pool: thin Ray adapters around the rollout engine.

* ``RolloutWorker`` (actors/worker.py) holds a copy of the policy, a sampler and a ``TreeRolloutEngine`` (its tool
  calls go to its own environment actors: actors/envpool.py). It rolls out a share of the step's prompts and later
  expands the same trees, re-using the KV caches it kept for them; trees travel back without caches.
* ``RolloutPool`` is the step driver's ``TreeBackend`` on the trainer's rank 0 over ``RolloutWorker`` actors: it
  shards the work as every pool does (actors/sharded.py), replaces a dead worker (loading the current weights) and
  retries its share (actors/retry.py); the ledger counts the retries.

The spec's ``faults`` (actors/faults.py) make a worker exit for real during a chosen step, once per run.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import ray

from tracerl.actors.retry import DEAD, OWN, call_with_retries
from tracerl.actors.sharded import ShardedPool, balanced_shards
from tracerl.actors.spec import WorkerSpec
from tracerl.actors.worker import RolloutWorker, strip_caches
from tracerl.engine.stream import OnBare
from tracerl.tree import RolloutTree
from tracerl.types import Prompt

__all__ = ["RolloutPool", "RolloutWorker", "balanced_shards", "strip_caches"]

SHUTDOWN_WAIT_S = 30.0
"""How long the pool's shutdown waits for its samplers to shut their engines down before it kills them."""


class RolloutPool(ShardedPool):
    """The step driver's ``TreeBackend`` over a pool of ``RolloutWorker`` actors."""

    worker_class: type[RolloutWorker] = RolloutWorker
    """The actors' class (workflows/experiments/pipeline_pool.py times a subclass's calls)."""
    push_group: Any = None
    """How this process joins a collective push's group: None is NCCL (``collective.nccl_group``); the tests' fake
    engines use gloo."""

    def __init__(
        self,
        spec: WorkerSpec,
        size: int,
        cpus: float,
        gpus: float,
        max_retries: int,
        seed: int,
        reencode_queue: int = 128,
    ) -> None:
        from tracerl.actors.services import start_services
        from tracerl.env_registry import env_class

        services: dict[str, Any] = {}
        if spec.pools.env_workers > 0 and not spec.services:
            # One actor per shared service for the whole run; env_workers=0 keeps everything in-process.
            services = start_services(
                env_class(spec.env.name),
                spec.env,
                spec.pools.env_cpus,
                dict(spec.pools.env_resources),
                spec.pools.lost_node_wait_s,
            )
            spec = replace(spec, services=services)
        super().__init__(spec, seed)
        self.services = services
        self.cpus, self.gpus = cpus, gpus
        self.max_retries = max_retries
        self.reencode_queue = reencode_queue
        """Streaming: an actor with more paths than this gives new expansions to the least-loaded one
        (``pipeline.reencode_queue``; -1: never)."""
        self.workers = [self._new() for _ in range(size)]
        self._pushed = False
        """Whether a push replaced the weights the samplers loaded from ``model.path``."""
        self._kept: list[Any] = []
        self._bucket_bytes = 0
        self._push_checked = False
        self._collective: Any = None
        """The collective push's rank 0 side (``trainer.push_transport=nccl``), formed at the first push."""

    def _new(self) -> Any:
        return (
            ray.remote(
                num_cpus=self.cpus,
                num_gpus=self.gpus,
                resources=dict(self.spec.pools.rollout_resources),
                max_restarts=0,
            )(self.worker_class)
            .options(scheduling_strategy=OWN)
            .remote(self.spec)
        )

    def warnings(self) -> list[str]:
        return list(ray.get(self.workers[0].warnings.remote()))

    def placement(self) -> dict[str, str]:
        """Where the actors run, as the run's params: ``placement/samplers`` and ``placement/env``, each the sorted
        node addresses of those actors (one per node), and ``placement/trainer`` this process's (trainer rank 0)."""
        found = ray.get([w.nodes.remote() for w in self.workers])
        return {
            "placement/trainer": str(ray.util.get_node_ip_address()),
            "placement/samplers": ",".join(sorted({s for s, _ in found})),
            "placement/env": ",".join(sorted({e for _, envs in found for e in envs})) or "in the samplers",
        }

    def wait_ready(self) -> None:
        """Block until every sampler actor has finished its constructor (loaded its policy); one that no live node
        can take fails the run after ``pools.lost_node_wait_s`` (actors/placement.py)."""
        self._placed(list(self.workers), f"{len(self.workers)} sampler actor(s)")
        ray.get([w.warnings.remote() for w in self.workers])

    def _placed(self, actors: list[Any], what: str) -> None:
        from tracerl.actors.placement import needs, wait_placed

        want = needs(self.cpus, self.gpus, self.spec.pools.rollout_resources)
        wait_placed(actors, want, self.spec.pools.lost_node_wait_s, what)

    def push(self, buckets: Iterable[Any], bucket_bytes: int) -> None:
        """A weight push (``tracerl.models.buckets``): each bucket its own object in the store, loaded by every
        sampler while the next one is packed and put, and freed once every sampler loaded it (at most two buckets
        in the store at a time). A sampler that dies meanwhile is replaced by one that copies a live peer's
        weights (``_catch_up``) and then loads the bucket it missed."""
        from concurrent.futures import ThreadPoolExecutor

        self._bucket_bytes = bucket_bytes
        self._kept = []
        loading = None
        held, last = (
            0,
            0,
        )  # bytes the store holds at once: the kept buckets, or the bucket in flight and the next
        with ThreadPoolExecutor(1, thread_name_prefix="tracerl-push") as ex:
            for bucket in buckets:
                held = held + bucket.nbytes if self._keep else max(held, last + bucket.nbytes)
                last = bucket.nbytes
                ref = ray.put(bucket)
                del bucket
                if self._keep:
                    self._kept.append(ref)
                if loading is not None:
                    loading.result()
                calls = [(w, "load_bucket", (ref,)) for w in range(len(self.workers))]
                loading = ex.submit(self._call_all, calls)
                del ref, calls  # the store frees the bucket once every sampler loaded it
            if loading is not None:
                loading.result()
        self._pushed_to(self._call_all([(w, "end_push", ()) for w in range(len(self.workers))]))
        self._pushed = True
        if not self._push_checked:  # the same sizes every step: once a run
            self._push_checked = True
            warning = push_too_big(held, node_object_store_bytes())
            if warning:
                print(f"tracerl: warning: {warning}", file=sys.stderr, flush=True)

    def push_collective(self, batches: Iterable[Any]) -> None:
        """A collective weight push (``trainer.push_transport=nccl``; tracerl/actors/collective.py): this process
        broadcasts each batch's tensors to the samplers' engines over a group formed before the first push."""
        from tracerl.actors.collective import CollectivePush, nccl_group

        if self._collective is None:
            self._collective = CollectivePush(
                lambda m, args: [getattr(w, m).remote(*a) for w, a in zip(self.workers, args)],
                ray.get,
                len(self.workers),
                str(ray.util.get_node_ip_address()),
                self.push_group or nccl_group,
            )
        self._pushed_to(self._collective.push(batches))
        self._pushed = True

    @property
    def _keep(self) -> bool:
        """Whether the pool keeps the last push's buckets for a replaced sampler: where no peer can hand its weights
        over (one sampler, or an engine sampler with no HF model to export from: ``loads_own_weights``)."""
        from tracerl.samplers import SAMPLERS

        backend = SAMPLERS.get(self.spec.sampler.backend)
        return len(self.workers) == 1 or bool(getattr(backend, "loads_own_weights", False))

    def _catch_up(self, w: int) -> None:
        """Give the fresh sampler ``w`` the pool's current weights: the kept buckets, else a live peer's, bucket by
        bucket."""
        new = self.workers[w]
        if self._collective is not None:
            raise RuntimeError(
                "a sampler was replaced after a collective weight push (trainer.push_transport=nccl), which cannot "
                "catch it up: the run restarts from its last checkpoint (max_failures), or use "
                "trainer.push_transport=ray"
            )
        if self._keep:
            for ref in self._kept:
                ray.get(new.load_bucket.remote(ref))
            self._pushed_to([ray.get(new.end_push.remote())])
            return
        peer = self.workers[(w + 1) % len(self.workers)]
        for index in itertools.count():
            ref = peer.export_bucket.remote(index, self._bucket_bytes)
            if ray.get(ref) is None:
                self._pushed_to([ray.get(new.end_push.remote())])
                return
            ray.get(new.load_bucket.remote(ref))

    def _replace(self, w: int) -> None:
        for tries in range(
            self.max_retries + 1
        ):  # the fresh worker may die too (the chaos drill kills at random)
            self.workers[w] = self._new()
            # a sampler lost with its node: its replacement waits for a node that can take it, within bounds
            self._placed([self.workers[w]], f"a replacement for sampler actor {w}")
            if not self._pushed:
                return  # it loads model.path, which the samplers still hold
            try:
                self._catch_up(w)
                return
            except DEAD:
                if tries == self.max_retries:
                    raise
                self.ledger.retried += 1

    def _call_all(self, calls: list[tuple[int, str, tuple[Any, ...]]]) -> list[Any]:
        """Run ``(worker, method, args)`` calls in parallel; a call whose worker died is retried on a fresh one."""

        def on_dead(i: int) -> None:
            self.ledger.retried += 1
            self._replace(calls[i][0])

        out, _ = call_with_retries(
            len(calls),
            lambda i: getattr(self.workers[calls[i][0]], calls[i][1]).remote(*calls[i][2]),
            on_dead,
            self.max_retries,
        )
        return out

    def release(self, step: int) -> None:
        """Each actor drops step ``step``'s trees; not waited for (a dead actor's trees went with it)."""
        for w in self.workers:
            w.release.remote(step)

    def stream(self, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare) -> list[RolloutTree]:
        """A streaming step's rollouts (``pipeline.mode=streaming``): actors/stream_pool.py."""
        from tracerl.actors.stream_pool import PoolStream

        self._phase += 1
        shards = balanced_shards(counts, len(self.workers))
        return PoolStream(self, shards, prompts, counts, on_bare).run()

    def shutdown(self) -> None:
        """Each sampler shuts its engine down and removes its files (``RolloutWorker.shutdown``; a dead or stuck one is
        not waited for past ``SHUTDOWN_WAIT_S``), then the actors and shared services are killed."""
        from tracerl.actors.services import stop_services

        ray.wait(
            [w.shutdown.remote() for w in self.workers],
            num_returns=len(self.workers),
            timeout=SHUTDOWN_WAIT_S,
        )
        for w in self.workers:
            ray.kill(w)
        stop_services(self.services)


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of the tensors in a state dict (other values are negligible)."""
    return sum(int(v.numel() * v.element_size()) for v in state.values() if hasattr(v, "element_size"))


def node_object_store_bytes() -> int:
    """The object store size of the node this process runs on (where ``ray.put`` puts a weight push)."""
    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here:
            return int(node.get("Resources", {}).get("object_store_memory", 0))
    return int(ray.cluster_resources().get("object_store_memory", 0))


def push_too_big(nbytes: int, store_bytes: int) -> str | None:
    """The warning for a weight push that needs more of the node's object store at once (``nbytes``: two buckets in
    flight, or every bucket where the pool keeps them for a replaced sampler) than it has, or None. Ray then spills
    the push to disk (or fails to put it) on every step instead of holding it in memory."""
    if store_bytes <= 0 or nbytes <= store_bytes:
        return None
    return (
        f"a weight push to the samplers holds {nbytes / 2**20:,.0f} MiB in the Ray object store at once but this "
        f"node's store holds "
        f"{store_bytes / 2**20:,.0f} MiB: Ray spills every push to disk; raise cluster.object_store_memory_mb (the "
        f"embedded Ray) or the nodes' --object-store-memory (a cluster)"
    )
