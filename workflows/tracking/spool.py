"""Per-step metrics that survive a tracking-server outage, and the attempt that logged each step.

``MetricLog.log`` sends a step's metrics to MLflow in one batch. When the server cannot be reached the batch is
appended to ``<storage>/metrics_spool.jsonl`` (one JSON record per metric: key, value, step, timestamp, attempt;
flushed and fsynced before the call returns, so a checkpoint taken after it never outruns its metrics), and the
next call, ``flush`` on close, or the driver at the end of ``tracerl train`` sends every record not yet sent, oldest
first (``metrics_spool.sent`` holds the byte offset sent so far). Sending a record twice is harmless: MLflow keeps
one row per (key, step, timestamp, value), and a spooled record keeps the timestamp it was made with.

Which value a report reads: the last one logged for the step by timestamp (``tracerl.workflows.tracking.runs.metric_series``).
A step re-run after a trainer restart is logged again, later, by the new attempt, so the attempt that completed
the step wins; ``system/attempt`` (the number of that attempt, counted in ``<storage>/.attempts``) is logged with
every step's metrics to show which one it was. Timestamps increase strictly across attempts
(``<storage>/metrics_clock`` holds the last one used), so the order holds on a fast restart or a slow clock.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tracerl.workflows.ops.disk import no_space

SPOOL = "metrics_spool.jsonl"
SENT = "metrics_spool.sent"
ARTIFACTS = "artifact_spool"  # artifact directories that could not be uploaded, by artifact path
ATTEMPTS = ".attempts"
CLOCK = "metrics_clock"  # the last timestamp (ms) any attempt of the run logged with


def next_attempt(storage: Path) -> int:
    """Claim the next attempt number (1, 2, ...) of the run at ``storage`` (a marker file per attempt)."""
    d = storage / ATTEMPTS
    d.mkdir(parents=True, exist_ok=True)
    n = len(list(d.iterdir())) + 1
    while True:
        try:
            os.close(os.open(d / str(n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def fail_fast_http() -> None:
    """In this process, MLflow's HTTP calls give up after one retry, not after its default of minutes of back-off
    (7 retries, 120 s each): a run spools, and its end waits ``tracking.flush_timeout_s``, instead of hanging in a
    call (the driver's progress bar and end of run, rank 0's logging). urllib3's line per retried connection is
    kept out of the terminal: the spool says once what happened."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def spooled_records(storage: Path) -> list[dict[str, Any]]:
    """Every record ever spooled for the run at ``storage`` (sent or not)."""
    path = storage / SPOOL
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricLog:
    """Logs metrics of one MLflow run, spooling them under ``storage`` while the tracking server is unreachable."""

    def __init__(
        self,
        client: Any,
        run_id: str,
        storage: Path,
        attempt: int,
        say: Callable[[str], None] = lambda s: None,
        fail_fast: bool = True,
    ) -> None:
        if fail_fast:
            fail_fast_http()
        self.client, self.run_id, self.storage, self.attempt, self.say = client, run_id, storage, attempt, say
        self.spool, self.sent, self.clock = storage / SPOOL, storage / SENT, storage / CLOCK
        self.last_error: Exception | None = None  # why the last flush failed
        try:
            self.last_ts = int(self.clock.read_text() or 0)
        except (FileNotFoundError, ValueError):
            self.last_ts = 0

    def _now(self) -> int:
        # Strictly increasing across the run's attempts, not only within one: a restarted attempt re-logging a step
        # in the same millisecond as the one before it, or on a node whose clock is behind, must still win.
        self.last_ts = max(int(time.time() * 1000), self.last_ts + 1)
        tmp = self.clock.with_suffix(".tmp")
        tmp.write_text(str(self.last_ts))
        os.replace(tmp, self.clock)
        return self.last_ts

    def log(self, metrics: Mapping[str, float], step: int) -> bool:
        """Send ``metrics`` at ``step`` (non-finite values dropped); spool them if that fails. True if sent now."""
        now = self._now()
        recs = [
            {"key": k, "value": float(v), "step": step, "timestamp": now, "attempt": self.attempt}
            for k, v in metrics.items()
            if v is not None and math.isfinite(float(v))
        ]
        if self._pending() and not self.flush():
            self._append(recs)
            return False
        try:
            self._send(recs)
            return True
        except Exception as e:  # noqa: BLE001 - the REST and SQL stores raise their own types for "unreachable"
            self._append(recs)  # a full disk here too ends the run (workflows/ops/disk.py)
            why = "tracking store full" if no_space(e) is not None else "tracking unreachable"
            self.say(
                f"{why} ({e.__class__.__name__}): {len(recs)} metrics of step {step} spooled to {self.spool}"
            )
            return False

    def log_artifacts(self, local_dir: Path, artifact_path: str) -> None:
        """Upload a directory of artifacts; keep a copy under the spool to upload at the next flush if that fails."""
        try:
            self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)
        except Exception as e:  # noqa: BLE001
            shutil.copytree(local_dir, self.storage / ARTIFACTS / artifact_path, dirs_exist_ok=True)
            why = "tracking store full" if no_space(e) is not None else "tracking unreachable"
            self.say(f"{why} ({e.__class__.__name__}): artifacts {artifact_path} kept for later")

    def _pending(self) -> bool:
        return (self.spool.is_file() and self.spool.stat().st_size > self._offset()) or (
            self.storage / ARTIFACTS
        ).is_dir()

    def unsent(self) -> int:
        """How many spooled metrics the store has not taken yet."""
        if not self.spool.is_file():
            return 0
        with open(self.spool, "rb") as f:
            f.seek(self._offset())
            return f.read().count(b"\n")

    def _offset(self) -> int:
        try:
            return int(self.sent.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _append(self, recs: list[dict[str, Any]]) -> None:
        with open(self.spool, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs))
            f.flush()
            os.fsync(f.fileno())

    def _send(self, recs: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric  # slow to import: mlflow

        batch = [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in recs]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def flush(self) -> bool:
        """Send everything spooled and not yet sent (metrics, then kept artifacts). True when nothing is left."""
        try:
            if self.spool.is_file():
                start = self._offset()
                with open(self.spool, "rb") as f:
                    f.seek(start)
                    data = f.read()
                end = start + data.rfind(b"\n") + 1  # whole lines only
                recs = [json.loads(line) for line in data[: end - start].splitlines() if line.strip()]
                if recs:
                    self._send(recs)
                    tmp = self.sent.with_suffix(".tmp")
                    tmp.write_text(str(end))
                    os.replace(tmp, self.sent)
                    self.say(f"tracking reachable again: {len(recs)} spooled metrics sent")
            kept = self.storage / ARTIFACTS
            if kept.is_dir():
                for d in sorted({p.parent for p in kept.rglob("*") if p.is_file()}):
                    self.client.log_artifacts(self.run_id, str(d), str(d.relative_to(kept)))
                shutil.rmtree(kept)
            return True
        except Exception as e:  # noqa: BLE001 - still unreachable: try again later
            self.last_error = e
            return False


STATUS = "status.pending"
"""A terminal status the tracking store could not take (a full disk): ``<status> <run id>``, or ``none``."""
_STATUS_BYTES = 64


class PendingStatus:
    """The run's final status, kept under its storage when the tracking store cannot take it, for a later command
    to send (``replay``). The file is written at the run's start, padded to a fixed size, and overwritten in place
    at its end: rewriting bytes a file already holds needs no new space on a full disk."""

    def __init__(self, storage: Path) -> None:
        self.path = storage / STATUS

    def _write(self, text: str) -> None:
        data = text.encode().ljust(_STATUS_BYTES)[:_STATUS_BYTES]
        with open(self.path, "r+b" if self.path.is_file() else "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def reserve(self) -> None:
        """At the start of a run (or resume): the space the status will need."""
        if not self.path.is_file():
            self._write("none")

    def record(self, run_id: str, status: str) -> bool:
        """Keep ``status`` for ``run_id``; False when even that cannot be written."""
        try:
            self._write(f"{status} {run_id}")
            return True
        except OSError:
            return False

    def pending(self) -> tuple[str, str] | None:
        try:
            parts = self.path.read_text().split()
        except (OSError, UnicodeDecodeError):
            return None
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def replay(self, client: Any) -> str | None:
        """Send a kept status to the store; returns the run id it was sent for (None: nothing was pending)."""
        kept = self.pending()
        if kept is None:
            return None
        status, run_id = kept
        client.set_terminated(run_id, status=status)
        self._write("none")
        return run_id


def replay_statuses(client: Any, out_dir: Path, say: Callable[[str], None]) -> None:
    """Send every run status kept under ``out_dir`` (one run storage a directory) that the store can now take (a
    full store, or a server away at the run's end), after the metrics that run spooled: never a final status
    before its run's metrics (workflows/tracking/sync.py)."""
    for path in sorted(out_dir.glob(f"*/{STATUS}")):
        kept = PendingStatus(path.parent).pending()
        if kept is None:
            continue
        try:
            if not MetricLog(client, kept[1], path.parent, 0, say).flush():
                continue
            run_id = PendingStatus(path.parent).replay(client)
        except Exception:  # noqa: BLE001 - the store still cannot take it: a later command tries again
            continue
        if run_id:
            say(
                f"MLflow run {run_id}: its final status, kept in {path}, is now recorded (its metrics before it)"
            )


PENDING_EXIT_CODE = 75
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
