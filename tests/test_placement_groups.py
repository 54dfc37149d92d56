"""Orphaned placement groups on a real Ray: only a group whose creating actor is dead is removed."""

from __future__ import annotations

import time
from typing import Any

import pytest


@pytest.fixture(scope="module")
def ray_up() -> None:
    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))


def _state(pg: Any) -> str:
    import ray

    return str(ray.util.placement_group_table(pg).get("state", "REMOVED"))


def test_only_a_dead_creators_group_is_released(ray_up: None) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from tracerl.workflows.ops.placement_groups import orphaned, release_orphaned

    @ray.remote(num_cpus=0)
    class Creator:  # stands in for a Ray Train controller: it reserves a group for its workers
        def reserve(self) -> Any:
            pg = placement_group([{"CPU": 0.01}])
            ray.get(pg.ready(), timeout=120)
            return pg

    driver_pg = placement_group(
        [{"CPU": 0.01}]
    )  # the driver's own (as Tune's per-trial groups): never touched
    ray.get(driver_pg.ready(), timeout=120)
    stopped, running = Creator.remote(), Creator.remote()
    stopped_pg, running_pg = ray.get(stopped.reserve.remote()), ray.get(running.reserve.remote())
    assert stopped_pg.id.hex() not in orphaned()  # its creator is alive
    ray.kill(stopped)  # as Tune kills a trial that ASHA stops
    deadline = time.monotonic() + 120
    while stopped_pg.id.hex() not in orphaned():
        assert time.monotonic() < deadline, "the killed creator's group never showed as orphaned"
        time.sleep(0.5)
    assert _state(stopped_pg) == "CREATED"  # Ray itself keeps it reserved while the job lives
    assert stopped_pg.id.hex() in release_orphaned()
    assert _state(stopped_pg) == "REMOVED"
    assert _state(running_pg) == "CREATED" and _state(driver_pg) == "CREATED"
    assert release_orphaned() == []
    ray.kill(running)
    remove_placement_group(driver_pg)
