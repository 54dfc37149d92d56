"""Surviving actor deaths: a call whose actor died runs again on a fresh actor (the sampler and environment pools
use this, and count the retries in the step's ledger)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

DEAD = (RayActorError, ActorDiedError, ActorUnavailableError)
# Pools reserve their own resources: outside any placement group that captures child actors (a Tune trial's, a
# Ray Train worker's), where they would wait forever for room that the group does not have.
OWN = PlacementGroupSchedulingStrategy(placement_group=None)  # type: ignore[arg-type]


def call_with_retries(
    n: int, submit: Callable[[int], Any], on_dead: Callable[[int], None], max_retries: int
) -> tuple[list[Any], list[int]]:
    """Run calls ``0 .. n-1`` in parallel (``submit(i)`` starts call i on some actor and returns its ref); a call
    whose actor died gets ``on_dead(i)`` (which replaces the actor) and runs again, at most ``max_retries`` times.
    Returns the results and how many times each call was retried."""
    out: list[Any] = [None] * n
    tries = [0] * n
    pending = {submit(i): i for i in range(n)}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(done[0])
        try:
            out[i] = ray.get(done[0])
        except DEAD:
            if tries[i] >= max_retries:
                raise
            tries[i] += 1
            on_dead(i)
            pending[submit(i)] = i
    return out, tries
