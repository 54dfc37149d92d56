"""MLflow's, SQLAlchemy's and Alembic's own log lines go to a file, not to the user's terminal.

MLflow logs a SQL store's every failed statement with its traceback ("SQLAlchemy database error", about 80 lines
each); on a full disk one run printed 12 of them around the one line that said what happened. ``tracerl train``
sends these loggers to ``tracking.log``: under ``out_dir`` until the run exists, then under the run's storage (the
driver and rank 0 each append to it). What the command has to say about the store (a full disk, an absent server)
it says itself, once. A line the file cannot take (the disk it is on is full) is dropped silently.
"""

from __future__ import annotations

import logging
from pathlib import Path

NAME = "tracking.log"
LOGGERS = ("mlflow", "sqlalchemy", "sqlalchemy.engine", "alembic")
"""The loggers MLflow sets up with its own terminal handler (and SQLAlchemy's parent)."""


class _QuietFileHandler(logging.FileHandler):
    """A file handler that drops a record it cannot write instead of printing logging's error report (a traceback
    on stderr) about it."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        pass


def tracking_logs_to(directory: Path | str) -> Path:
    """Send the tracking libraries' log lines to ``<directory>/tracking.log`` (appended; opened on the first line)
    from now on, in this process; returns the file. Call again to move them (the previous file is closed)."""
    # slow to import: mlflow; importing it sets up its loggers, which are replaced here
    import mlflow  # noqa: F401

    path = Path(directory) / NAME
    handler = _QuietFileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in LOGGERS:
        log = logging.getLogger(name)
        for old in log.handlers:
            if isinstance(old, _QuietFileHandler):
                old.close()
        log.handlers = [handler]
        log.propagate = False
    return path
