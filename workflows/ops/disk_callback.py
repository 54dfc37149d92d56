"""``StopOnDiskFull``: no Ray Train restart after a full disk or an error a restart cannot get past
(workflows/ops/disk.py and workflows/ops/no_retry.py say why)."""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from tracerl.workflows.ops.disk import DiskFull, no_space, quiet_disk_full
from tracerl.workflows.ops.no_retry import LoopFailed, loop_failed, quiet_loop_failed


class StopOnDiskFull(ControllerCallback, WorkerGroupCallback):
    """A Ray Train callback (it runs in the controller) that turns a restart after a full disk into the end of the
    run: the controller's failure policy retries any worker-group error up to ``max_failures``, so when a polled
    worker error is a full disk or a ``LoopFailed`` (a bad value, an unknown name) this raises from the hook that runs before the decision is carried out, which the
    controller treats as a controller error it does not retry. Ray Train 2.x internals (the hooks
    ``after_worker_group_poll_status`` and ``before_controller_execute_failure_decision``); passed in
    ``RunConfig.callbacks``, which hands callbacks that are not ``UserCallback``s to the controller as they are."""

    def __init__(self) -> None:
        self.full: str | None = None
        self.failed: LoopFailed | None = None

    def after_controller_start(self, train_run_context: Any) -> None:
        quiet_disk_full("ray.train.v2._internal.execution.callback_manager")
        quiet_loop_failed(
            "ray.train.v2._internal.execution.callback_manager", "ray.train.v2._internal.execution.controller"
        )

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        for err in (getattr(worker_group_status, "errors", None) or {}).values():
            path = no_space(err)
            if path is not None:
                self.full = path
            elif self.failed is None:
                self.failed = loop_failed(err)

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        if getattr(failure_decision, "value", "") != "RETRY":
            return
        if self.full is not None:
            raise DiskFull(self.full)
        if self.failed is not None:
            raise self.failed
