"""Environment actors: ``EnvWorker`` runs tool calls of one environment (each in its own sandboxed process);
``EnvPool`` is the ``ToolEnv`` a sampler actor hands its engine. A round's tool calls go to the env actors in
parallel; a call whose actor died is re-submitted to a fresh actor and counted as retried. Rewards, states and the
environment's other hooks run locally, in the sampler actor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import ray

from tracerl.actors.faults import NO_FAULTS, Faults
from tracerl.actors.retry import DEAD, OWN, call_with_retries
from tracerl.engine.protocol import ToolEnv, ToolResult, WrappedEnv
from tracerl.engine.react import Action
from tracerl.types import Prompt


class EnvWorker:
    """Runs tool calls of one environment (a Ray actor)."""

    def __init__(self, env_factory: Callable[[], Any], faults: Faults = NO_FAULTS) -> None:
        self.env = env_factory()
        self.faults = faults

    def execute(self, step: int, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        self.faults.env(step)
        return self.env.execute(prompt, state, action)  # type: ignore[no-any-return]

    def node(self) -> str:
        """The address of the node this actor runs on (the run's ``placement/env`` param)."""
        return str(ray.util.get_node_ip_address())

    def cpu_s(self) -> float:
        """This actor's CPU seconds since it started, its tool-call processes' included."""
        from tracerl.engine.timer import process_tree_cpu_s

        return process_tree_cpu_s()


class EnvPool(WrappedEnv):
    """A ``ToolEnv`` whose tool calls run on env actors; rewards and states are computed locally."""

    def __init__(
        self,
        env_factory: Callable[[], ToolEnv],
        size: int,
        cpus: float,
        max_retries: int,
        faults: Faults = NO_FAULTS,
        resources: dict[str, float] | None = None,
        lost_node_wait_s: float = 300.0,
    ) -> None:
        from tracerl.actors.placement import needs

        super().__init__(env_factory())
        self._want = needs(cpus, 0.0, resources or {})
        self.lost_node_wait_s = lost_node_wait_s
        """How long a replacement waits while no live node can take it (``pools.lost_node_wait_s``)."""
        self._new = lambda: (
            ray.remote(num_cpus=cpus, resources=resources or {})(EnvWorker)
            .options(scheduling_strategy=OWN)
            .remote(env_factory, faults)
        )
        self.actors = [self._new() for _ in range(size)]
        self.max_retries = max_retries
        self.step = -1
        self._next = 0

    def nodes(self) -> list[str]:
        """The node address of each env actor."""
        return [str(n) for n in ray.get([a.node.remote() for a in self.actors])]  # type: ignore[attr-defined]

    def cpu_s(self) -> float:
        """The env actors' CPU seconds since each started (an actor that cannot answer counts 0)."""
        total = 0.0
        for actor in self.actors:
            try:
                [used] = ray.get([actor.cpu_s.remote()])  # type: ignore[attr-defined]
                total += float(used)
            except DEAD:
                continue
        return total

    def execute(self, prompt: Prompt, state: Any, action: Action) -> ToolResult:
        return self.execute_batch([(prompt, state, action)])[0]

    def execute_batch(self, calls: Sequence[tuple[Prompt, Any, Action]]) -> list[ToolResult]:
        actor = [0] * len(calls)  # the actor each call last ran on

        def submit(i: int) -> Any:
            actor[i] = self._next % len(self.actors)
            self._next += 1
            return self.actors[actor[i]].execute.remote(self.step, *calls[i])  # type: ignore[attr-defined]

        def on_dead(i: int) -> None:
            from tracerl.actors.placement import wait_placed

            self.actors[actor[i]] = new = self._new()
            wait_placed([new], self._want, self.lost_node_wait_s, "a replacement environment actor")

        results, retried = call_with_retries(len(calls), submit, on_dead, self.max_retries)
        return [replace(r, retried=r.retried + n) for r, n in zip(results, retried)]
