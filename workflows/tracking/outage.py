"""A tracking server that stops answering while ``tracerl train`` sets a run up or ends it.

During the steps, rank 0 spools what the server cannot take (workflows/tracking/spool.py). Around them, the driver
talks to the server directly: the experiment, the run's creation (tags, params, its config as an artifact), a
resume's status, and at the end the final status and the summary read back. A server restarting there (a minute is
common under load) used to end the command with MLflow's traceback (exit 1) and could leave a run RUNNING with
nothing in it. Here each of those calls waits for the server, in bounds: ``PatientClient`` retries a call whose
error says the server is unreachable (``unreachable``) until ``tracking.flush_timeout_s`` has passed since the
outage began, saying so on one line; then it raises ``TrackingUnreachable``, which the CLI prints as one line, exit 2.
A full disk is never taken for an absent server (workflows/ops/disk.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tracerl.workflows.ops.disk import error_chain, no_space
from tracerl.workflows.tracking.store import TrackingUnreachable

_MLFLOW_TEXTS = ("failed with exception", "failed with timeout exception")
"""MLflow's REST client on a request that got no answer: ``API request to URL failed with exception ...`` (a 5xx past
its retries reads "Max retries exceeded" there too); an answer it refused reads "failed with error code"."""


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the tracking server did not answer (refused, timed out, reset, a gateway's 502/503/504
    past MLflow's retries) rather than refusing the request or running out of space."""
    import requests  # slow to import: requests (a training run loads this module)

    if no_space(exc) is not None:
        return False
    for e in error_chain(exc):
        if isinstance(
            e, (TrackingUnreachable, requests.exceptions.ConnectionError, requests.exceptions.Timeout)
        ):
            return True
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        text = str(e).lower()
        if text.startswith("api request to") and any(t in text for t in _MLFLOW_TEXTS):
            return True
    return False


class PatientClient:
    """An ``MlflowClient`` (or anything with its methods) whose calls wait for an absent server: a call that fails
    because the server is unreachable is tried again every ``poll_s`` seconds until ``limit_s`` seconds after the
    outage began (one outage, one line, however many calls it spans), then ``TrackingUnreachable`` names the call.
    Any other error goes through at once.

    A call the server may have carried out before its answer was lost (``create_run`` on a reset connection) could
    be carried out twice; a refused or unanswered connection carried out nothing."""

    def __init__(
        self, client: Any, uri: str, limit_s: float, say: Callable[[str], None], poll_s: float = 5.0
    ) -> None:
        self._client, self._uri, self._limit, self._say, self._poll = client, uri, limit_s, say, poll_s
        self._since: float | None = None  # when the current outage began (monotonic)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self.call(name, attr, *args, **kwargs)

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, waiting for the server as described above."""
        while True:
            t0 = time.monotonic()
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - only an absent server is waited for
                if not unreachable(exc):
                    raise
                now = time.monotonic()
                if self._since is None:
                    self._since = t0
                    self._say(
                        f"the tracking server at {self._uri} stopped answering ({what}): waiting up to "
                        f"{self._limit:g} s (tracking.flush_timeout_s) for it"
                    )
                left = self._since + self._limit - now
                if left <= 0:
                    raise TrackingUnreachable(
                        f"tracking server {self._uri}: no answer for {now - self._since:.0f} s ({what}; "
                        f"tracking.flush_timeout_s={self._limit:g}); start it again or raise "
                        "tracking.flush_timeout_s, then run the command again"
                    ) from None
                time.sleep(min(self._poll, left))
                continue
            if self._since is not None:
                self._say(f"the tracking server at {self._uri} answers again ({what})")
                self._since = None
            return out
