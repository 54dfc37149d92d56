"""The sampler actor pool: thin Ray adapters around the rollout engine.

* ``RolloutWorker`` holds a copy of the policy, a sampler and a ``TreeRolloutEngine`` (its tool calls go to its own
  environment actors: actors/envpool.py). It rolls out a share of the step's prompts and later expands the same
  trees, re-using the KV caches it kept for them; trees travel back without caches.
* ``RolloutPool`` is the step driver's ``TreeBackend`` on the trainer's rank 0: it shards prompts
  over the workers (balanced by rollouts, deterministic), hands every worker the run's seed and step
  (each turn's seed is keyed by what it samples, ``tracerl.engine.seeds``, so the trees do not depend on
  the number of workers or the sharding), replaces a dead worker (loading the current weights) and
  retries its share (actors/retry.py); the ledger counts the retries.

The spec's ``faults`` (actors/faults.py) make a worker exit for real during a chosen step, once per run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import ray

from tracerl.actors.envpool import EnvPool
from tracerl.actors.retry import DEAD, OWN, call_with_retries
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

    def __init__(self, spec: WorkerSpec) -> None:
        import torch

        from tracerl.engine.react import TEMPLATES
        from tracerl.engine.rollout import TreeRolloutEngine
        from tracerl.env_registry import env_class
        from tracerl.models.hf import load_policy
        from tracerl.samplers import make_sampler

        torch.set_num_threads(spec.threads)
        model_cfg, sampler_cfg, env_cfg, pools = spec.model, spec.sampler, spec.env, spec.pools
        self.faults = spec.faults
        cls = env_class(env_cfg.name)
        services = spec.services

        def env_factory() -> Any:
            # Shared services (one actor per run, e.g. the search retriever) where the run started them.
            return cls.from_config(env_cfg, services=services) if services else cls.from_config(env_cfg)

        if pools.env_workers > 0:
            env: ToolEnv = EnvPool(
                env_factory,
                pools.env_workers,
                pools.env_cpus,
                pools.max_retries,
                self.faults,
            )
        else:
            env = env_factory()
        self.env = env
        self.tok, self.model = load_policy(model_cfg)
        self.sampler = make_sampler(model_cfg, sampler_cfg, self.model, self.tok, pools.rollout_gpus)
        self.engine = TreeRolloutEngine(
            self.sampler, env, TEMPLATES.get(model_cfg.template)(self.tok), self.tok, sampler_cfg
        )
        self.sampler_cfg = sampler_cfg
        self.trees: dict[str, list[RolloutTree]] = {}
        self.stream_run: Any = None
        """This actor's share of the current streaming step (engine/stream.py), with its caches."""

    def warnings(self) -> list[str]:
        return list(self.env.warnings)

    def load_weights(self, state: dict[str, Any]) -> None:
        import torch

        if hasattr(self.sampler, "load_weights"):  # vLLM: (name, tensor) pairs into the running engine
            self.sampler.load_weights(state.items())
        else:
            with torch.no_grad():
                self.model.load_state_dict(state)
        self.trees.clear()  # caches of trees from the old weights must not be re-used
        self._drop_stream()

    def set_join(self, join: bool) -> None:
        """Batch turns by per-token join or in rounds from the next call (``sampler.join``; ``tracerl bench
        pipeline --batching rounds,join`` compares both on one pool)."""
        from dataclasses import replace

        self.sampler_cfg = replace(self.sampler_cfg, join=join)
        self.engine.limits = self.sampler_cfg

    def _begin(self, step: int, seed: int, fault: bool = True) -> None:
        self.engine.seed, self.engine.step, self.engine.ledger = seed, step, BudgetLedger()
        if isinstance(self.env, EnvPool):
            self.env.step = step
        if fault:
            self.faults.sampler(step)

    def rollout(
        self, step: int, key: str, prompts: list[Prompt], counts: list[int], seed: int
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        self._begin(step, seed)
        trees = self.engine.rollout(prompts, counts)
        self.trees = {k: v for k, v in self.trees.items() if k.startswith(f"{step}/")}
        self.trees[key] = trees
        return [strip_caches(t) for t in trees], self.engine.ledger

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


def balanced_shards(counts: Sequence[int], n: int) -> list[list[int]]:
    """Indices split into ``n`` shards with about equal total counts (largest first; ties by index)."""
    load = [0] * n
    shards: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        j = min(range(n), key=lambda j: (load[j], j))
        shards[j].append(i)
        load[j] += counts[i]
    return [sorted(s) for s in shards]


class RolloutPool:
    """The step driver's ``TreeBackend`` over a pool of ``RolloutWorker`` actors."""

    worker_class: type[RolloutWorker] = RolloutWorker
    """The actors' class (workflows/pipeline/pool.py times a subclass's calls)."""

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

        self.services: dict[str, Any] = {}
        if spec.pools.env_workers > 0 and not spec.services:
            # One actor per shared service for the whole run; env_workers=0 keeps everything in-process.
            self.services = start_services(env_class(spec.env.name), spec.env, spec.pools.env_cpus)
            spec = replace(spec, services=self.services)
        self.spec, self.cpus, self.gpus = spec, cpus, gpus
        self.max_retries, self.seed = max_retries, seed
        self.reencode_queue = reencode_queue
        """Streaming: an actor with more paths than this gives new expansions to the least-loaded one
        (``pipeline.reencode_queue``; -1: never)."""
        self.workers = [self._new() for _ in range(size)]
        self.ledger = BudgetLedger()
        self.step = 0
        self._phase = 0
        self._weights: Any = None
        self._owner: dict[int, tuple[int, str]] = {}  # id(tree) -> (worker, key)

    def _new(self) -> Any:
        return (
            ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=0)(self.worker_class)
            .options(scheduling_strategy=OWN)
            .remote(self.spec)
        )

    def warnings(self) -> list[str]:
        return list(ray.get(self.workers[0].warnings.remote()))

    def load_weights(self, state: dict[str, Any]) -> None:
        self._weights = ray.put(state)
        self._call_all([(w, "load_weights", (self._weights,)) for w in range(len(self.workers))])

    def begin_step(self, step: int) -> None:
        self.step, self._phase, self.ledger = step, 0, BudgetLedger()
        self._owner.clear()

    def _replace(self, w: int) -> None:
        for tries in range(
            self.max_retries + 1
        ):  # the fresh worker may die too (the chaos drill kills at random)
            self.workers[w] = self._new()
            if self._weights is None:
                return
            try:
                ray.get(self.workers[w].load_weights.remote(self._weights))
                return
            except DEAD:
                if tries == self.max_retries:
                    raise
                self.ledger.retried += 1

    def _call_all(self, calls: list[tuple[int, str, tuple]]) -> list[Any]:  # type: ignore[type-arg]
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

    def _merge(self, ledgers: Sequence[BudgetLedger]) -> None:
        """One phase's ledgers (a rollout or an expand call on each worker): counts add up; a phase time adds the
        slowest worker's time in this phase (workers run in parallel, phases one after the other)."""
        slowest: dict[str, float] = {}
        for led in ledgers:
            self.ledger.add_engine(led)
            for k, v in led.phase_s.items():
                slowest[k] = max(slowest.get(k, 0.0), v)
        for k, v in slowest.items():
            self.ledger.phase_s[k] = self.ledger.phase_s.get(k, 0.0) + v

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        phase = self._phase
        self._phase += 1
        shards = [s for s in balanced_shards(counts, len(self.workers))]
        calls = [
            (
                w,
                "rollout",
                (
                    self.step,
                    f"{self.step}/{phase}/{w}",
                    [prompts[i] for i in s],
                    [int(counts[i]) for i in s],
                    self.seed,
                ),
            )
            for w, s in enumerate(shards)
            if s
        ]
        results = self._call_all(calls)
        trees: list[RolloutTree | None] = [None] * len(prompts)
        for (w, _, args), (got, _led) in zip(calls, results):
            for i, t in zip(shards[w], got):
                t.prompt = prompts[
                    i
                ]  # keep the caller's prompt objects (identity matters to the step driver)
                trees[i] = t
                self._owner[id(t)] = (w, args[1])
        self._merge([led for _, led in results])
        return [t for t in trees if t is not None]

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        self._phase += 1
        groups: dict[tuple[int, str], list[int]] = {}
        for i, t in enumerate(trees):
            groups.setdefault(
                self._owner.get(id(t), (i % len(self.workers), f"{self.step}/orphan/{i}")), []
            ).append(i)
        keys = sorted(groups)
        calls = [
            (
                w,
                "expand",
                (
                    self.step,
                    key,
                    [trees[i] for i in groups[(w, key)]],
                    [expansions[i] for i in groups[(w, key)]],
                    self.seed,
                ),
            )
            for w, key in keys
        ]
        results = self._call_all(calls)
        for (w, key), (got, _led) in zip(keys, results):
            for i, new in zip(groups[(w, key)], got):
                trees[i].grow_to(new)
        self._merge([led for _, led in results])

    def stream(self, prompts: Sequence[Prompt], counts: Sequence[int], on_bare: OnBare) -> list[RolloutTree]:
        """A streaming step's rollouts (``pipeline.mode=streaming``): actors/stream_pool.py."""
        from tracerl.actors.stream_pool import PoolStream

        self._phase += 1
        shards = balanced_shards(counts, len(self.workers))
        return PoolStream(self, shards, prompts, counts, on_bare).run()

    def evaluate(
        self, prompts: Sequence[Prompt], samples: int, temperature: float, seed: int
    ) -> tuple[list[RolloutTree], BudgetLedger]:
        shards = balanced_shards([1] * len(prompts), len(self.workers))
        calls = [
            (w, "evaluate", ([prompts[i] for i in s], samples, temperature, seed))
            for w, s in enumerate(shards)
            if s
        ]
        results = self._call_all(calls)
        trees: list[RolloutTree | None] = [None] * len(prompts)
        ledger = BudgetLedger()
        for (w, _, _), (got, led) in zip(calls, results):
            for i, t in zip(shards[w], got):
                t.prompt = prompts[i]
                trees[i] = t
            for f in (
                "generated_tokens",
                "llm_calls",
                "tool_calls",
                "invalid_actions",
                "grade_timeouts",
                "retried",
            ):
                setattr(ledger, f, getattr(ledger, f) + getattr(led, f))
            self.ledger.retried += led.retried  # the step's ledger counts every retry, evaluation's too
        return [t for t in trees if t is not None], ledger

    def shutdown(self) -> None:
        from tracerl.actors.services import stop_services

        for w in self.workers:
            ray.kill(w)
        stop_services(self.services)
