"""A replacement actor that no live node can take (its node lost) fails the run in one line after
``pools.lost_node_wait_s`` (issue 43, item 4; tracerl/actors/placement.py).

The waits run on a fake cluster (``FakeCluster``: a fake clock, fake node list and fake ``ray.wait``), so no test
sleeps; one test reads a real local Ray's node list. tests/test_cluster.py loses a real node mid-run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tracerl.actors.config import PoolConfig
from tracerl.actors.placement import POLL_S, Unplaceable, missing, needs, wait_placed
from tracerl.workflows.ops.no_retry import as_permanent

HEAD = {"CPU": 2.0, "node1": 1.0, "memory": 1e9}
NODE2 = {"CPU": 2.0, "node2": 1.0, "memory": 1e9}
SAMPLER = needs(0.5, 0.0, {"node2": 0.01})


class FakeCluster:
    """A fake of what ``wait_placed`` asks Ray: live nodes (``nodes_at(t)``), whether an actor's constructor has
    finished (``ready_at``: the fake time it finishes, None never) and a clock that ``wait`` moves on."""

    def __init__(self, nodes_at: Callable[[float], list[dict[str, float]]], ready_at: float | None) -> None:
        self.now = 0.0
        self.nodes_at, self.ready_at = nodes_at, ready_at
        self.killed: list[Any] = []

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        self.now += timeout
        if self.ready_at is not None and self.now >= self.ready_at:
            return refs, []
        return [], refs

    def run(self, wait_s: float) -> None:
        wait_placed(
            ["actor"],
            SAMPLER,
            wait_s,
            "a replacement for sampler actor 0",
            ready=lambda a: f"ready:{a}",
            nodes=lambda: self.nodes_at(self.now),
            wait=self.wait,
            kill=self.killed.append,
            clock=lambda: self.now,
        )


def test_what_keeps_every_node_from_taking_an_actor_is_named() -> None:
    assert SAMPLER == {"CPU": 0.5, "node2": 0.01}
    assert missing(SAMPLER, [HEAD]) == ["node2"]
    assert missing(SAMPLER, [HEAD, NODE2]) == []
    assert missing(needs(4, 0, {}), [HEAD, NODE2]) == ["CPU"]  # one node must have it all, not the sum
    assert missing(SAMPLER, []) == ["CPU", "node2"]


def test_a_replacement_no_live_node_can_take_fails_in_one_line_after_the_wait() -> None:
    fake = FakeCluster(lambda t: [HEAD], ready_at=None)
    with pytest.raises(Unplaceable) as err:
        fake.run(wait_s=20.0)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(
        "a replacement for sampler actor 0 cannot be placed: it asks for CPU=0.5, node2=0.01,"
    )
    assert "no live node of the Ray cluster has node2 (for 20 s, pools.lost_node_wait_s)" in line
    assert "`tracerl train resume=RUN_ID`" in line
    assert fake.killed == ["actor"]  # the pending actor is not left waiting in the cluster
    assert 20.0 <= fake.now <= 20.0 + 2 * POLL_S


def test_a_node_back_within_the_wait_takes_the_replacement() -> None:
    fake = FakeCluster(lambda t: [HEAD] if t < 15 else [HEAD, NODE2], ready_at=30.0)
    fake.run(wait_s=20.0)
    assert fake.killed == [] and fake.now >= 30.0


def test_a_slow_start_on_a_node_that_exists_is_not_bounded_by_the_wait() -> None:
    fake = FakeCluster(lambda t: [HEAD, NODE2], ready_at=500.0)  # a big policy loading for minutes
    fake.run(wait_s=20.0)
    assert fake.killed == [] and fake.now >= 500.0


def test_the_wait_counts_from_when_the_node_went_missing_again() -> None:
    """Back for a while, then lost again: the wait starts over at the second loss."""
    fake = FakeCluster(lambda t: [HEAD, NODE2] if 10 <= t < 40 else [HEAD], ready_at=None)
    with pytest.raises(Unplaceable):
        fake.run(wait_s=20.0)
    assert 60.0 <= fake.now <= 60.0 + 2 * POLL_S


def test_the_training_loop_reports_it_as_one_line_from_an_actor_too() -> None:
    """Raised in a sampler actor (its environment actor's node lost), it reaches the trainer inside Ray's
    RayTaskError, whose text is a traceback: the loop's one line is the cause's message."""
    cause = Unplaceable("a replacement environment actor cannot be placed: it asks for node2=0.01")

    class RayTaskErrorLike(LookupError):  # how Ray wraps an actor's error: a subclass of its class, .cause
        def __init__(self) -> None:
            super().__init__("Traceback (most recent call last):\n  File ...\nUnplaceable: ...")
            self.cause = cause

    for raised in (cause, RayTaskErrorLike()):
        failed = as_permanent(raised)
        assert failed is not None
        assert str(failed) == (
            "the training loop stopped (Unplaceable): a replacement environment actor cannot be placed: it asks "
            "for node2=0.01"
        )


def test_the_wait_is_a_pools_setting() -> None:
    assert PoolConfig().lost_node_wait_s == 300.0
    with pytest.raises(ValueError, match="pools.lost_node_wait_s must be >= 0"):
        PoolConfig(lost_node_wait_s=-1)


def test_a_real_ray_s_node_list_names_a_resource_it_lacks() -> None:
    """The node list as a real (local, one-node) Ray gives it: its resources are found, a missing one named."""
    import ray

    from tracerl.actors.placement import live_nodes
    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=1))  # or the Ray an earlier test of this process started
    nodes = live_nodes()
    assert len(nodes) == 1 and nodes[0]["CPU"] == ray.cluster_resources()["CPU"] >= 1.0
    assert missing(needs(0.5, 0.0, {}), nodes) == []
    assert missing(needs(0.5, 0.0, {"node2": 0.01}), nodes) == ["node2"]
    actor = ray.remote(num_cpus=0.01, resources={"node2": 0.01})(FakeCluster).remote(lambda t: [], None)
    with pytest.raises(Unplaceable, match="no live node of the Ray cluster has node2"):
        wait_placed([actor], needs(0.01, 0.0, {"node2": 0.01}), 0.0, "an actor")
