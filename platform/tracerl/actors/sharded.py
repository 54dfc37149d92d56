"""The sharding of a step's work over sampler workers, shared by the Ray actor pool (actors/pools.py) and the
in-process pool (actors/local.py): prompts split over the workers balanced by rollouts (deterministic), every
worker handed the run's seed and step (each turn's seed is keyed by what it samples, ``tracerl.engine.seeds``, so
the trees do not depend on the number of workers or the sharding), expansions sent back to the worker that holds
the tree's KV caches, the workers' ledgers merged into the step's. How a call reaches a worker (a Ray actor call
with retries, or a plain method call) is the subclass's ``_call_all``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracerl.actors.spec import WorkerSpec
from tracerl.algos.allocators import Expansion
from tracerl.engine.ledger import BudgetLedger
from tracerl.tree import RolloutTree
from tracerl.types import Prompt


def balanced_shards(counts: Sequence[int], n: int) -> list[list[int]]:
    """Indices split into ``n`` shards with about equal total counts (largest first; ties by index)."""
    load = [0] * n
    shards: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        j = min(range(n), key=lambda j: (load[j], j))
        shards[j].append(i)
        load[j] += counts[i]
    return [sorted(s) for s in shards]


class ShardedPool:
    """The step driver's ``TreeBackend`` over ``workers`` (``RolloutWorker``s, each reached by ``_call_all``)."""

    parallel: bool = True
    """The workers run at the same time (a phase takes the slowest one's time), or one after another (the sum)."""

    def __init__(self, spec: WorkerSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        self.workers: list[Any] = []
        self.ledger = BudgetLedger()
        self.step = 0
        self._phase = 0
        self._owner: dict[int, tuple[int, str]] = {}  # id(tree) -> (worker, key)
        self._cpu_seen: list[
            tuple[Any, float]
        ] = []  # per worker slot: (actor, its CPU seconds at the last read)
        self.engine_restarts = 0
        """Sampler engines restarted to take a weight push (vLLM without in-place loading), over the pool's life."""
        self.restart_reason: str | None = None
        """Why the last of them restarted (the engine's error on an in-place load)."""

    def _pushed_to(self, reasons: Sequence[str | None]) -> None:
        """Count the engine restarts a push caused: each worker's ``end_push`` value (why it restarted, or None)."""
        for why in reasons:
            if why is not None:
                self.engine_restarts += 1
                self.restart_reason = why

    @property
    def threads(self) -> int:
        """torch intra-op threads of each worker (``WorkerSpec.threads``)."""
        return self.spec.threads

    def _call_all(self, calls: list[tuple[int, str, tuple[Any, ...]]]) -> list[Any]:
        """The results of ``(worker, method, args)`` calls, in order."""
        raise NotImplementedError

    def begin_step(self, step: int) -> None:
        self.step, self._phase, self.ledger = step, 0, BudgetLedger()
        self._owner.clear()

    def _merge(self, ledgers: Sequence[BudgetLedger]) -> None:
        """One phase's ledgers (a rollout or an expand call on each worker): counts add up; a phase time adds the
        slowest worker's time in this phase (workers run in parallel, phases one after the other), or the sum of the
        workers' times when they run one after another (``parallel`` false)."""
        slowest: dict[str, float] = {}
        for led in ledgers:
            self.ledger.add_engine(led)
            for k, v in led.phase_s.items():
                slowest[k] = max(slowest.get(k, 0.0), v) if self.parallel else slowest.get(k, 0.0) + v
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

    def release(self, step: int) -> None:
        """Step ``step``'s rollouts are complete: the workers may drop its trees and their KV caches now rather than
        at the next step's rollout (``RolloutWorker.release``), so they do not sit through the update."""

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
                "tool_timeouts",
                "grade_timeouts",
                "retried",
            ):
                setattr(ledger, f, getattr(ledger, f) + getattr(led, f))
            self.ledger.retried += led.retried  # the step's ledger counts every retry, evaluation's too
        return [t for t in trees if t is not None], ledger

    def cpu_s(self) -> float:
        """CPU seconds the sampler actors and their env actors used since the last call (the first call sets the
        starting point and returns 0). A replaced actor counts from its start; what a dead one used since the last
        read is lost; the run's shared services are not counted."""
        readings = self._call_all([(w, "cpu_s", ()) for w in range(len(self.workers))])
        first = not self._cpu_seen
        seen = dict(enumerate(self._cpu_seen))
        used = 0.0
        self._cpu_seen = []
        for w, (actor, now) in enumerate(zip(self.workers, readings)):
            before = seen.get(w)
            last = before[1] if before is not None and before[0] is actor else 0.0
            used += max(0.0, float(now) - last)
            self._cpu_seen.append((actor, float(now)))
        return 0.0 if first else used
