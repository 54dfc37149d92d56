"""Waiting for a new actor to be placed, bounded where the cluster has no node that can take it (a lost node).

A pool replaces an actor that died (actors/retry.py). Where the actor died with its node, and its resources (a
custom resource such as ``node2`` that only that node offered) exist on no live node, Ray keeps the replacement
pending forever, and so did the run. :func:`wait_placed` waits for the new actors' constructors as long as some
live node has what each asks for (a slow constructor is not a lost node), and for at most ``wait_s`` seconds
(``pools.lost_node_wait_s``) while none has: a node that comes back in time (a restarted pod) takes the actor and the
run goes on; else the pending actors are killed and :class:`Unplaceable` says in one line what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

POLL_S = 2.0
"""How often the live nodes are read while an actor waits to be placed."""


class Unplaceable(LookupError):
    """No live node of the cluster offers what an actor asks for, and none came within ``pools.lost_node_wait_s``.

    A ``LookupError``: the training loop reports it as one line and Ray Train does not restart the run
    (workflows/ops/no_retry.py), since a restart would wait for the same missing node."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # crosses Ray's process boundaries intact
        return (Unplaceable, (str(self),))


def needs(cpus: float, gpus: float, resources: Mapping[str, float]) -> dict[str, float]:
    """What one actor asks a node for (Ray's resource names; zero amounts left out)."""
    out = {"CPU": float(cpus), "GPU": float(gpus), **{k: float(v) for k, v in resources.items()}}
    return {k: v for k, v in out.items() if v > 0}


def live_nodes() -> list[dict[str, float]]:
    """The resource totals of each live node of the cluster."""
    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def missing(want: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> list[str]:
    """The resources of ``want`` that keep every node of ``nodes`` from taking the actor (an actor runs on one node,
    so each node is checked on its own); empty when some node has them all in total (busy or not)."""
    best: list[str] | None = None
    for node in nodes:
        short = [k for k, v in want.items() if node.get(k, 0.0) < v]
        if not short:
            return []
        if best is None or len(short) < len(best):
            best = short
    return best if best is not None else sorted(want)


def wait_placed(
    actors: Sequence[Any],
    want: Mapping[str, float],
    wait_s: float,
    what: str,
    *,
    ready: Callable[[Any], Any] | None = None,
    nodes: Callable[[], list[dict[str, float]]] = live_nodes,
    wait: Callable[..., tuple[list[Any], list[Any]]] | None = None,
    kill: Callable[[Any], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Block until every actor of ``actors`` (each asking for ``want``) has run its constructor, or raise
    ``Unplaceable`` once no live node could take them for ``wait_s`` seconds in a row. An actor whose constructor
    failed counts as done (its first call raises, and the pool's retries handle it). ``ready``, ``nodes``, ``wait``,
    ``kill`` and ``clock`` are Ray's and the monotonic clock unless a test hands fakes."""
    ready = ready or (lambda a: a.__ray_ready__.remote())
    wait = wait or ray.wait
    kill = kill or ray.kill
    refs = [ready(a) for a in actors]
    since: float | None = None  # when no live node could take them, since then without a break
    while refs:
        done, refs = wait(refs, num_returns=len(refs), timeout=POLL_S)
        if not refs:
            return
        short = missing(want, nodes())
        now = clock()
        if not short:
            since = None
            continue
        since = now if since is None else since
        if now - since >= wait_s:
            for a in actors:
                kill(a)
            have = ", ".join(f"{k}={v:g}" for k, v in sorted(want.items()))
            raise Unplaceable(
                f"{what} cannot be placed: it asks for {have}, and no live node of the Ray cluster has "
                f"{', '.join(short)} (for {wait_s:g} s, pools.lost_node_wait_s): a node that offered it was lost. "
                f"Bring back a node with --resources offering {', '.join(short)} (or change the pools' resources), "
                f"then continue the run with `tracerl train resume=RUN_ID`"
            )
