"""Shared environment services: one Ray actor per service, used by every environment actor of a run.

An environment class may declare ``services(env_cfg) -> {name: factory}`` (the search environment's
BM25 retriever, say: building it once per run, not once per environment actor, saves memory and start-up
time). :func:`start_services` builds each service once inside a ``ServiceActor`` and returns a
:class:`RemoteService` proxy per name; the proxies pickle (they hold actor handles), so they travel to
sampler and environment actors and are handed to ``env_class.from_config(env_cfg, services=...)``.
A proxy's method call is a blocking call of the same method on the actor. Environment classes without
``services`` get none, and ``from_config`` builds whatever it needs in-process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

# Outside any capturing placement group (a Tune trial's, a Ray Train worker's), as the pools are.
# ray's annotations type placement_group as PlacementGroup, though None (no group) is its documented opt-out.
_OWN = PlacementGroupSchedulingStrategy(placement_group=None)  # type: ignore[arg-type]


class ServiceActor:
    """Holds one service object and runs its methods (a Ray actor)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.service = factory()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method.startswith("_"):
            raise AttributeError(f"service method {method!r} is private")
        return getattr(self.service, method)(*args, **kwargs)


class RemoteService:
    """A proxy of a service held by a ``ServiceActor``: ``proxy.search(q, k)`` runs ``search`` on the actor."""

    def __init__(self, handle: Any, name: str) -> None:
        self.handle, self.name = handle, name

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return ray.get(self.handle.call.remote(method, *args, **kwargs))

        return call


def service_factories(env_cls: Any, env_cfg: Any) -> dict[str, Callable[[], Any]]:
    """The services an environment class declares for ``env_cfg`` (empty if it declares none)."""
    return dict(env_cls.services(env_cfg))


def start_services(
    env_cls: Any,
    env_cfg: Any,
    cpus: float = 0.25,
    resources: dict[str, float] | None = None,
    lost_node_wait_s: float = 300.0,
) -> dict[str, RemoteService]:
    """One actor per declared service, built once (blocks until each is up, so build errors surface here).

    Raises:
        ray.exceptions.RayActorError: a service failed to build (the message carries the cause).
        tracerl.actors.placement.Unplaceable: no live node offered ``resources`` for ``lost_node_wait_s`` seconds.
    """
    from tracerl.actors.placement import needs, wait_placed

    out: dict[str, RemoteService] = {}
    for name, factory in service_factories(env_cls, env_cfg).items():
        handle = (
            ray.remote(num_cpus=cpus, resources=resources or {})(ServiceActor)
            .options(scheduling_strategy=_OWN)
            .remote(factory)
        )
        wait_placed(
            [handle], needs(cpus, 0.0, resources or {}), lost_node_wait_s, f"the {name} service actor"
        )
        # ray's annotations make .remote() of an actor class return ObjectRef | ActorHandle; this is the handle.
        ray.get(handle.__ray_ready__.remote())  # type: ignore[union-attr]
        out[name] = RemoteService(handle, name)
    return out


def stop_services(services: dict[str, RemoteService]) -> None:
    """Kill the service actors."""
    for s in services.values():
        ray.kill(s.handle)
