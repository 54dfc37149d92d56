"""Metrics a tracking server has not taken by the end of a run, and ``tracerl sync`` that delivers them.

A run spools its metrics (and artifacts) under its storage while the server is away (workflows/tracking/spool.py).
At the end of ``tracerl train`` the driver waits up to ``tracking.flush_timeout_s`` for the server to take them,
saying so on one line (``flush_within``). If the server answers in time, the run ends as usual. If not, nothing of
the end reaches the store: the run stays RUNNING there (the state that says it is not complete), its final status is
kept with the spool (``<storage>/status.pending``), and the command ends with one line, ``MetricsPending``, naming
the command that delivers them, exit ``EXIT_CODE``. ``tracerl sync RUN`` (``sync_run``) sends the spooled metrics
and artifacts, then the status, without training; running it again sends nothing twice. The next ``tracerl train``
with the same ``out_dir`` does the same for every run it finds waiting (``replay_statuses``), metrics first: a
status is never sent before its run's metrics, so the store never shows a FINISHED run with steps missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_CODE = 75
"""What ``tracerl train`` exits with when its metrics are still spooled (sysexits' EX_TEMPFAIL: try again later)."""


class MetricsPending(Exception):
    """The tracking server did not take a run's spooled metrics in time; the message says how to send them."""

    def __init__(
        self, run_id: str, storage: Path, uri: str, unsent: int, waited_s: float, status: str
    ) -> None:
        self.run_id, self.storage, self.uri = run_id, storage, uri
        super().__init__(
            f"{unsent} metrics of MLflow run {run_id} are kept in {storage} (its status {status} too): the tracking "
            f"server at {uri} did not take them in {waited_s:g} s (tracking.flush_timeout_s); the run stays RUNNING "
            f"in the store until `tracerl sync {run_id} --tracking-uri {uri}` sends them"
        )


def flush_within(log: Any, limit_s: float, say: Callable[[str], None], poll_s: float = 5.0) -> bool:
    """Send what ``log`` (a ``MetricLog``) spooled, trying for up to ``limit_s`` seconds; one line says it waits.
    True when nothing is left.

    Raises:
        OSError: the store is full (waiting cannot help; the caller reports a full disk, not an absent server).
    """
    from tracerl.workflows.ops.disk import no_space

    if log.flush():
        return True
    if log.last_error is not None and no_space(log.last_error) is not None:
        raise log.last_error
    say(
        f"the tracking server is unreachable: waiting up to {limit_s:g} s (tracking.flush_timeout_s) for it to "
        f"take {log.unsent()} spooled metrics"
    )
    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(poll_s, left))
        if log.flush():
            return True
    return False


def sync_run(run_id: str, uri: str, say: Callable[[str], None] = lambda s: None) -> tuple[int, str | None]:
    """Send a run's spooled metrics and artifacts, then the final status kept with them; no training.

    Returns:
        (metrics sent, the status recorded or None when none was waiting).

    Raises:
        tracerl.workflows.tracking.store.TrackingUnreachable: the server does not answer (one line).
        LookupError: no such run in the store, or not a ``tracerl train`` run.
        MetricsPending: the server stopped answering while they were sent.
    """
    from mlflow import MlflowClient

    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.log_file import tracking_logs_to
    from tracerl.workflows.tracking.runs import run_storage
    from tracerl.workflows.tracking.spool import MetricLog, PendingStatus
    from tracerl.workflows.tracking.store import check_reachable

    check_reachable(uri)
    storage = run_storage(run_id, TrackingConfig(uri=uri))
    tracking_logs_to(
        storage
    )  # MLflow's own lines ("View run ...", a SQL store's errors): the run's tracking.log
    client = MlflowClient(uri)
    log = MetricLog(client, run_id, storage, 0, say)
    unsent = log.unsent()
    if not log.flush():
        raise MetricsPending(run_id, storage, uri, log.unsent(), 0, "unchanged")
    kept = PendingStatus(storage).pending()
    status = kept[0] if kept is not None and kept[1] == run_id else None
    if status is not None:
        PendingStatus(storage).replay(client)
    return unsent, status
