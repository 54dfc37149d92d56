"""A full disk ends a command in one line.

An ``OSError`` with errno ENOSPC (no space left on device) or EDQUOT (disk quota exceeded), or SQLite's "database
or disk is full", anywhere in a run (a checkpoint write, an artifact or metric log, the spool, the final status
update) is not transient: retrying cannot succeed until someone frees space. ``no_space`` recognises one however
deeply it is wrapped (Ray Train's worker-group and controller errors, MLflow's and SQLAlchemy's exceptions);
``DiskFull`` is the one line the CLI prints (exit ``EXIT_CODE``, 28, the errno of ENOSPC);
``tracerl.workflows.ops.disk_callback.StopOnDiskFull`` keeps Ray Train from restarting the workers on one
(``FailureConfig.max_failures`` is for faults that a restart can get past). torch's file writer reports a full disk
without an errno ("basic_ios::clear: iostream error", "file write failed"): ``no_space`` given the folder written
to counts such an error as a full disk when that folder's filesystem has (next to) no space left.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

EXIT_CODE = 28  # errno.ENOSPC on Linux: what `tracerl` exits with when a disk or quota is full
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_TEXTS = ("no space left on device", "disk quota exceeded", "database or disk is full")
_WRITER_TEXTS = ("iostream error", "file write failed")
"""What torch's writer (``torch.save``, PyTorchStreamWriter) says when a write fails, with no errno."""
NEARLY_FULL_BYTES = 1 << 20
"""Free space below which a write error without an errno is taken for a full disk."""
_PATH = re.compile(r"""(?:: |file |to |at )['"]?(/[^'"\s:]+)""")


class DiskFull(OSError):
    """A write found no space (ENOSPC) or no quota (EDQUOT) left at ``path``; the message says what to do."""

    def __init__(self, path: str, note: str = "") -> None:
        super().__init__(errno.ENOSPC, "No space left on device")
        self.path, self.note = path, note

    def __str__(self) -> str:
        return (
            f"no space left on device at {self.path or 'the run storage'}: free space or point "
            "out_dir/tracking.uri elsewhere" + (f"; {self.note}" if self.note else "")
        )

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:  # crosses Ray's process boundaries intact
        return (DiskFull, (self.path, self.note))


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps: causes, contexts, Ray Train's per-worker and controller errors, SQLAlchemy's
    original DB-API error."""
    todo: list[Any] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, *e.args]
        todo += [getattr(e, a, None) for a in ("controller_failure", "cause", "orig", "_base_exc")]
        failures = getattr(e, "worker_failures", None)
        if isinstance(failures, dict):
            todo += list(failures.values())


def free_bytes(folder: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged write can still take on ``folder``'s filesystem (None: it cannot be read)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def no_space(exc: BaseException, written: str | os.PathLike[str] | None = None) -> str | None:
    """The path a full disk or quota was met at ("" if no path is known), or None when ``exc`` is no such error.
    ``written``: the folder the failed work wrote to; a write error without an errno (torch's writer) there counts
    when its filesystem has less than ``NEARLY_FULL_BYTES`` left."""
    found: str | None = None
    for e in error_chain(exc):
        if written is not None and any(t in str(e).lower() for t in _WRITER_TEXTS):
            left = free_bytes(written)
            if left is not None and left < NEARLY_FULL_BYTES:
                return str(written)
        if isinstance(e, DiskFull):
            return e.path
        hit = isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS
        text = str(e)
        if hit or any(t in text.lower() for t in _TEXTS):
            path = e.filename if isinstance(e, OSError) and e.filename else None
            if path is None:
                m = _PATH.search(text)
                path = m.group(1) if m else None
            if path:
                return str(path)
            found = ""
    return found


class DropReported(logging.Filter):
    """Drops a log record about an error the driver reports once itself: one ``found`` finds in the record's
    exception, or whose class name ``error`` is in its text."""

    def __init__(self, error: str, found: Callable[[BaseException], object | None]) -> None:
        super().__init__()
        self.error = error
        self.found = found

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and self.found(exc) is not None:
            return False
        return self.error not in record.getMessage()


def quiet_reported(error: str, found: Callable[[BaseException], object | None], *loggers: str) -> None:
    """A ``DropReported(error, found)`` on each of ``loggers``, once. Idempotent."""
    for name in loggers:
        log = logging.getLogger(name)
        if not any(isinstance(f, DropReported) and f.error == error for f in log.filters):
            log.addFilter(DropReported(error, found))


def quiet_disk_full(*loggers: str) -> None:
    """Ray Train logs a worker's error with its traceback, and a callback's too: not for a full disk (the CLI says
    it in one line). Idempotent."""
    quiet_reported("DiskFull", no_space, *loggers)


def store_path(uri: str) -> str:
    """The file behind a local tracking URI (``sqlite:////abs/db``, ``file:///dir``); other URIs as they are."""
    for prefix in ("sqlite:///", "file://"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri
