"""A sampler: one copy of the policy, its sampler and a ``TreeRolloutEngine`` with its environment, and the trees of
the current step (with their KV caches). ``tracerl.actors.pools`` runs it as a Ray actor; ``tracerl.actors.local``
holds it in the trainer's own process (``cluster.address=inprocess``). Trees leave it without caches
(``strip_caches``), so they travel (or are copied) light, and the worker keeps its own copies to expand later.

Nothing here imports Ray: environment actors (``pools.env_workers > 0``, actors/envpool.py) are imported only when
asked for.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tracerl.actors.spec import WorkerSpec
from tracerl.algos.allocators import Expansion
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.protocol import ToolEnv
from tracerl.engine.stream import OnBare
from tracerl.tree import RolloutTree
from tracerl.types import Prompt


def strip_caches(tree: RolloutTree) -> RolloutTree:
    """A shallow copy of ``tree`` whose fork states hold no KV-cache handles (for transport)."""
    out = copy.copy(tree)
    out.fork_state = {
        k: replace(v, cache=None) if getattr(v, "cache", None) is not None else v
        for k, v in tree.fork_state.items()
    }
    return out


class RolloutWorker:
    """A sampler actor: policy copy, sampler, engine, and the trees of the current step (with caches)."""

    def __init__(self, spec: WorkerSpec, own_threads: bool = True, tool_threads: int = 1) -> None:
        """Load the policy and build the sampler, engine and environment of ``spec``. ``own_threads``: set torch's
        threads to ``spec.threads`` (an actor's own process); false in the trainer's process, which sets them.
        ``tool_threads``: without environment actors (``pools.env_workers`` 0), a round's tool calls run on this
        many threads of this process (``tracerl.engine.concurrent_env``)."""
        import torch

        from tracerl.engine.react import make_template
        from tracerl.engine.rollout import TreeRolloutEngine
        from tracerl.env_registry import env_class
        from tracerl.models.buckets import LoraBase
        from tracerl.models.hf import load_policy, load_tokenizer
        from tracerl.samplers import SAMPLERS, make_sampler

        if own_threads:
            torch.set_num_threads(spec.threads)
        model_cfg, sampler_cfg, env_cfg, pools = spec.model, spec.sampler, spec.env, spec.pools
        self.faults = spec.faults
        cls = env_class(env_cfg.name)
        services = spec.services

        def env_factory() -> Any:
            # Shared services (one actor per run, e.g. the search retriever) where the run started them.
            return cls.from_config(env_cfg, services=services) if services else cls.from_config(env_cfg)

        self.pooled = pools.env_workers > 0
        """Tool calls go to environment actors (actors/envpool.py, Ray); else they run in this process."""
        if self.pooled:
            from tracerl.actors.envpool import EnvPool

            env: ToolEnv = EnvPool(
                env_factory,
                pools.env_workers,
                pools.env_cpus,
                pools.max_retries,
                self.faults,
                dict(pools.env_resources),
                pools.lost_node_wait_s,
            )
        elif tool_threads > 1:
            from tracerl.engine.concurrent_env import ConcurrentEnv

            env = ConcurrentEnv(env_factory(), tool_threads)
        else:
            env = env_factory()
        self.env = env
        self.model: Any = None
        """The HF policy copy the hf sampler generates with; None for an engine that loads its own (vLLM)."""
        if getattr(SAMPLERS.get(sampler_cfg.backend), "loads_own_weights", False):
            self.tok = load_tokenizer(model_cfg)
        else:
            self.tok, self.model = load_policy(model_cfg)
        self.lora = (
            LoraBase(self.model, spec.lora_targets) if spec.lora_targets and self.model is not None else None
        )
        """The base weights that a LoRA run's adapter pushes merge into (taken before any push)."""
        extra = {"push_transport": spec.push_transport} if spec.push_transport != "ray" else {}
        self.sampler = make_sampler(model_cfg, sampler_cfg, self.model, self.tok, pools.rollout_gpus, **extra)
        self.engine = TreeRolloutEngine(
            self.sampler,
            env,
            make_template(model_cfg.template, self.tok, model_cfg.system_prompt),
            self.tok,
            sampler_cfg,
        )
        self.sampler_cfg = sampler_cfg
        self.trees: dict[str, list[RolloutTree]] = {}
        self.stream_run: Any = None
        """This actor's share of the current streaming step (engine/stream.py), with its caches."""

    def warnings(self) -> list[str]:
        return list(self.env.warnings)

    def nodes(self) -> tuple[str, list[str]]:
        """The node address of this sampler actor and of its environment actors (none when tools run here)."""
        import ray

        return str(ray.util.get_node_ip_address()), self.env.nodes() if self.pooled else []  # type: ignore[attr-defined]

    def load_bucket(self, bucket: Any) -> None:
        """One bucket of a weight push (``tracerl.models.buckets``) into the policy: copied into the hf model's
        parameters, LoRA adapters merged into the base copy (``lora_scaling`` set), or handed to an engine
        sampler's own ``load_bucket`` (vLLM).

        Raises:
            RuntimeError: adapters for a worker that keeps no base copy (its spec names no ``lora_targets``)."""
        from tracerl.models.buckets import load_bucket

        if getattr(bucket, "lora_scaling", None) is not None:
            if self.lora is None:
                raise RuntimeError(
                    "a LoRA adapter push reached a sampler that keeps no base copy to merge it into: "
                    "adapter pushes need sampler.backend=hf and the pool's spec to name trainer.lora_targets"
                )
            self.lora.load(self.model, bucket)
        elif hasattr(self.sampler, "load_bucket"):
            self.sampler.load_bucket(bucket)
        else:
            load_bucket(self.model, bucket)
        self.trees.clear()  # caches of trees from the old weights must not be re-used
        self._drop_stream()

    def end_push(self) -> str | None:
        """The last bucket of a push arrived (an engine sampler that restarts on the pushed weights does it now);
        why the engine restarted, or None (loaded in place, or an hf sampler)."""
        end = getattr(self.sampler, "end_push", None)
        return end() if end is not None else None

    def transfer_ranks(self) -> int:
        """Ranks this sampler's engine brings to a collective push's group (tracerl/actors/collective.py)."""
        return int(self._collective("transfer_ranks")())

    def init_transfer(self, address: str, port: int, rank_offset: int, world: int) -> None:
        """The engine's ranks join the collective push's group as ``rank_offset ..`` of ``world``."""
        self._collective("init_transfer")(address, port, rank_offset, world)

    def receive_weights(self, names: list[str], dtypes: list[str], shapes: list[tuple[int, ...]]) -> int:
        """One batch of a collective push, broadcast by trainer rank 0, into the engine; the bytes it took."""
        got = int(self._collective("receive_weights")(names, dtypes, shapes))
        self.trees.clear()  # caches of trees from the old weights must not be re-used
        self._drop_stream()
        return got

    def _collective(self, method: str) -> Any:
        fn = getattr(self.sampler, method, None)
        if fn is None:
            raise RuntimeError(
                f"sampler.backend={self.sampler_cfg.backend} takes no collective weight push: set "
                "trainer.push_transport=ray"
            )
        return fn

    def export_bucket(self, index: int, bucket_bytes: int) -> Any:
        """Bucket ``index`` of this sampler's current weights (None past the last): what a replaced peer loads
        (from an engine sampler that can export its own, else from the HF copy).

        Raises:
            RuntimeError: an engine sampler (vLLM) holds no HF copy of the weights to export."""
        from tracerl.models.buckets import export

        own = getattr(self.sampler, "export_bucket", None)
        if own is not None:
            return own(index, bucket_bytes)
        if self.model is None:
            raise RuntimeError(
                f"sampler.backend={self.sampler_cfg.backend} holds no HF copy of the policy to export (its engine "
                "loads and holds the weights itself, under its own names): a replaced sampler of this backend "
                "loads the last push's buckets, which the pool keeps for it"
            )
        return export(self.model, index, bucket_bytes)

    def cpu_s(self) -> float:
        """CPU seconds of this actor (and its children, e.g. a vLLM engine core) and of its env actors, each since it
        started."""
        from tracerl.engine.timer import process_tree_cpu_s

        env = self.env.cpu_s() if self.pooled else 0.0  # type: ignore[attr-defined]
        return process_tree_cpu_s() + env

    def set_join(self, join: bool) -> None:
        """Batch turns by per-token join or in rounds from the next call (``sampler.join``; ``tracerl bench
        pipeline --batching rounds,join`` compares both on one pool)."""
        from dataclasses import replace

        self.sampler_cfg = replace(self.sampler_cfg, join=join)
        self.engine.limits = self.sampler_cfg

    def _begin(self, step: int, seed: int, fault: bool = True) -> None:
        self.engine.seed, self.engine.step, self.engine.ledger = seed, step, BudgetLedger()
        if self.pooled:
            self.env.step = step  # type: ignore[attr-defined]
        if fault:
            self.faults.sampler(step)

    def rollout(
        self, step: int, key: str, prompts: list[Prompt], counts: list[int], seed: int
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        self._begin(step, seed)
        self.release(step - 1)  # an earlier step's caches go before this step's are made, not after
        trees = self.engine.rollout(prompts, counts)
        self.trees[key] = trees
        return [strip_caches(t) for t in trees], self.engine.ledger

    def release(self, step: int) -> None:
        """Drop the trees (and their KV caches) of ``step`` and every step before it: no expansion will come for
        them. Only deletes keys, so a later step's rollout running meanwhile (``pipeline.overlap``) keeps its own."""
        for k in list(self.trees):
            head = k.split("/", 1)[0]  # keys are "<step>/<phase>/<worker>" (ShardedPool)
            if not head.isdigit() or int(head) <= step:
                self.trees.pop(k, None)

    def expand(
        self, step: int, key: str, trees: list[RolloutTree], expansions: list[Expansion], seed: int
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        self._begin(step, seed)
        local = self.trees.get(key)
        # Our own copies carry the KV caches; a fresh worker (after a failure) continues from the sent trees.
        own = local is not None and [len(t.nodes) for t in local] == [len(t.nodes) for t in trees]
        if local is None or not own:
            local = trees
        for t, ex in zip(local, expansions):
            depths = [t.nodes[int(n)].depth for n, k in zip(ex.node_ids, ex.counts) for _ in range(int(k))]
            self.engine.ledger.count_continuations(depths, own)
        self.engine.expand(local, expansions)
        return [strip_caches(t) for t in local], self.engine.ledger

    def stream(
        self,
        step: int,
        seed: int,
        begin: tuple[list[int], list[Prompt], list[int]] | None,
        adds: list[tuple[int, RolloutTree, Expansion]],
    ) -> tuple[list[tuple[int, RolloutTree]], list[tuple[int, RolloutTree]], int, bool, BudgetLedger]:
        """One round of this actor's share of a streaming step (actors/stream_pool.py; with an async sampler, until
        a tree is reported: engine/paths.py): ``begin`` (tree ids, prompts, counts) starts the share, ``adds`` are
        expansions to start; returns the trees whose bare rollouts
        ended and those that finished (without caches), the paths still running, whether work is left, and the
        step's counts so far. A fault drill fires on the first call after the one that began (mid-stream)."""
        from tracerl.engine.paths import stream_run

        if begin is not None:
            self._drop_stream()
            self._begin(step, seed, fault=False)
            self.stream_run = stream_run(self.engine, *begin)
        else:
            self.faults.sampler(step)
        run = self.stream_run
        bare, done, running, active, ledger = run.serve(adds)
        return (
            [(i, strip_caches(run.trees[i])) for i in bare],
            [(i, strip_caches(run.trees[i])) for i in done],
            running,
            active,
            ledger,
        )

    def stream_whole(
        self, step: int, seed: int, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        """A whole streaming step on this worker's engine, ``on_bare`` called in this process (the in-process pool:
        engine/stream.py, as ``tracerl rollout`` streams); the trees without caches and the step's counts."""
        self._drop_stream()
        self._begin(step, seed, fault=False)
        trees = self.engine.stream(prompts, counts, on_bare)
        return [strip_caches(t) for t in trees], self.engine.ledger

    def close(self) -> None:
        """Drop the trees kept for expansion and any streaming step's share (its tasks and threads stop)."""
        self.trees.clear()
        self._drop_stream()

    def shutdown(self) -> None:
        """``close``, and the sampler's engine and its files (a vLLM restart's checkpoint) go: the pool calls it
        before it kills the actor, whose exit hooks would then not run."""
        self.close()
        end = getattr(self.sampler, "close", None)
        if end is not None:
            end()

    def _drop_stream(self) -> None:
        """Forget the last streaming step's share (a per-path run's tasks and threads stop)."""
        close = getattr(self.stream_run, "close", None)
        if close is not None:
            close()
        self.stream_run = None

    def evaluate(
        self, prompts: list[Prompt], samples: int, temperature: float, seed: int
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        self.engine.seed, self.engine.step, self.engine.ledger = seed, None, BudgetLedger()  # evaluation keys
        limits = self.engine.limits
        self.engine.limits = replace(limits, temperature=temperature)
        try:
            trees = self.engine.rollout(prompts, [samples] * len(prompts))
        finally:
            self.engine.limits = limits
        return [strip_caches(t) for t in trees], self.engine.ledger
