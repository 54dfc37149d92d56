"""Placement groups that stopped Tune trials leave reserved, found and removed by the sweep's driver.

Ray Train creates a run's worker placement group from its controller actor, which the Tune trial's actor owns.
When a scheduler (ASHA) stops the trial, its actor is killed and the controller dies with it, but a placement group
lives as long as the job that created it, not the actor: on a Ray that outlives the trial (the sweep's own driver,
a long-lived cluster) the group stays reserved, holding the CPUs and GPUs later trials need. Ray Train's own
cleaner removes it only where the dashboard's State API answers. Here a group is *orphaned* when the actor that
created it is dead while its job (this driver) lives on: nothing can use it any more. A running trial's group has a
live creator and is never touched; groups the driver made itself (Tune's per-trial groups) have no creator actor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray import tune
from ray._private.state import state

# The GCS placement-group record type (the public ``placement_group_table`` leaves out its creator fields); ray's
# generated protobuf module (gcs_pb2) declares no attributes to mypy
from ray.core.generated.gcs_pb2 import PlacementGroupTableData  # type: ignore[attr-defined]
from ray.util.placement_group import PlacementGroup, remove_placement_group


def _actor_made(job_id: str) -> list[Any]:
    """This job's reserved (not removed), non-detached placement groups that an actor created."""
    rec, job = PlacementGroupTableData, bytes.fromhex(job_id)
    table = [rec.FromString(raw) for raw in state._connect_and_get_accessor().get_placement_group_table()]
    return [
        pg
        for pg in table
        if pg.creator_job_id == job
        and not pg.is_detached
        and pg.state != rec.REMOVED
        and not ray.ActorID(pg.creator_actor_id).is_nil()
    ]


def orphaned(job_id: str | None = None) -> list[str]:
    """Hex ids of the job's reserved placement groups whose creating actor is dead (default: this driver's job)."""
    return [
        pg.placement_group_id.hex()
        for pg in _actor_made(job_id or ray.get_runtime_context().get_job_id())
        if pg.creator_actor_dead
    ]


def release_orphaned(job_id: str | None = None) -> list[str]:
    """Remove the job's orphaned placement groups; returns the ids removed here (one Ray Train's cleaner removed
    first is left out)."""
    removed = []
    for hex_id in orphaned(job_id):
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(hex_id))))
        except Exception:  # noqa: BLE001 - removed meanwhile (Ray Train's cleaner) or already gone: nothing to free
            continue
        removed.append(hex_id)
    return removed


def release_when_trials_end(
    progress: Callable[[str], None], wait_s: float = 300.0, poll_s: float = 1.0
) -> list[str]:
    """After the sweep: wait (up to ``wait_s``) for every actor-created group of this job to lose its creator (the
    stopped trials' controllers end shortly after their trial actors), removing each as it is orphaned."""
    job = ray.get_runtime_context().get_job_id()
    removed: list[str] = []
    deadline = time.monotonic() + wait_s
    while True:
        for hex_id in release_orphaned(job):
            removed.append(hex_id)
            progress(f"released the Ray Train placement group {hex_id} of a stopped trial")
        left = [pg.placement_group_id.hex() for pg in _actor_made(job)]
        if not left:
            return removed
        if time.monotonic() > deadline:
            progress(
                f"placement groups still reserved after the sweep (their creating actors are alive after "
                f"{wait_s:.0f} s): {', '.join(left)}; check `ray list placement-groups`"
            )
            return removed
        time.sleep(poll_s)


class ReleaseStoppedTrialGroups(tune.Callback):
    """During the sweep: after a trial ends (stopped, finished or failed) and then every ``every_s`` seconds of the
    Tune loop, remove orphaned groups, so the next trials find the resources the stopped ones held."""

    def __init__(self, progress: Callable[[str], None], every_s: float = 5.0) -> None:
        self.progress, self.every_s, self.last = progress, every_s, time.monotonic()

    def _release(self) -> None:
        self.last = time.monotonic()
        for hex_id in release_orphaned():
            self.progress(f"released the Ray Train placement group {hex_id} of a stopped trial")

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self._release()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._release()

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._release()
