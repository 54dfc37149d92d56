"""``StopOnDiskFull``: no Ray Train restart after a full disk (workflows/ops/disk.py says why)."""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from workflows.ops.disk import DiskFull, no_space, quiet_disk_full


class StopOnDiskFull(ControllerCallback, WorkerGroupCallback):
    """A Ray Train callback (it runs in the controller) that turns a restart after a full disk into the end of the
    run: the controller's failure policy retries any worker-group error up to ``max_failures``, so when a polled
    worker error is a full disk this raises from the hook that runs before the decision is carried out, which the
    controller treats as a controller error it does not retry. Ray Train 2.x internals (the hooks
    ``after_worker_group_poll_status`` and ``before_controller_execute_failure_decision``); passed in
    ``RunConfig.callbacks``, which hands callbacks that are not ``UserCallback``s to the controller as they are."""

    def __init__(self) -> None:
        self.full: str | None = None

    def after_controller_start(self, train_run_context: Any) -> None:
        quiet_disk_full("ray.train.v2._internal.execution.callback_manager")

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        for err in (getattr(worker_group_status, "errors", None) or {}).values():
            path = no_space(err)
            if path is not None:
                self.full = path

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        if self.full is not None and getattr(failure_decision, "value", "") == "RETRY":
            raise DiskFull(self.full)
