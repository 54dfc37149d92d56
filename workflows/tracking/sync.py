"""Metrics a tracking server has not taken by the end of a run, and ``tracerl sync`` that delivers them.

A run spools its metrics (and artifacts) under its storage while the server is away (workflows/tracking/spool.py).
At the end of ``tracerl train`` the driver waits up to ``tracking.flush_timeout_s`` for the server to take them,
saying so on one line (``spool.flush_within``). If the server answers in time, the run ends as usual. If not, nothing of
the end reaches the store: the run stays RUNNING there (the state that says it is not complete), its final status is
kept with the spool (``<storage>/status.pending``), and the command ends with one line, ``MetricsPending``, naming
the command that delivers them, exit ``PENDING_EXIT_CODE`` (both in workflows/tracking/spool.py). ``tracerl sync RUN`` (``sync_run``) sends the spooled metrics
and artifacts, then the status, without training; running it again sends nothing twice. The next ``tracerl train``
with the same ``out_dir`` does the same for every run it finds waiting (``replay_statuses``), metrics first: a
status is never sent before its run's metrics, so the store never shows a FINISHED run with steps missing.
"""

from __future__ import annotations

from collections.abc import Callable

from tracerl.config import TrackingConfig
from tracerl.workflows.tracking.log_file import tracking_logs_to
from tracerl.workflows.tracking.runs import run_storage
from tracerl.workflows.tracking.spool import MetricLog, MetricsPending, PendingStatus
from tracerl.workflows.tracking.store import check_reachable


def sync_run(run_id: str, uri: str, say: Callable[[str], None] = lambda s: None) -> tuple[int, str | None]:
    """Send a run's spooled metrics and artifacts, then the final status kept with them; no training.

    Returns:
        (metrics sent, the status recorded or None when none was waiting).

    Raises:
        tracerl.workflows.tracking.store.TrackingUnreachable: the server does not answer (one line).
        LookupError: no such run in the store, or not a ``tracerl train`` run.
        MetricsPending: the server stopped answering while they were sent.
    """
    from mlflow import MlflowClient  # slow to import: mlflow

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
