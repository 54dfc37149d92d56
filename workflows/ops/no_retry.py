"""Errors of a training loop that a restart cannot get past, reported as one line and not retried.

Ray Train restarts the workers after any error, up to ``FailureConfig.max_failures``: right for a lost node, a
killed process or a flaky service, wrong for a bad value or an unknown name (a ``ValueError`` or ``LookupError``:
a budget the task set cannot hold, a registry name nothing provides), which fails the same way on every attempt.
Such an error used to cost every attempt's start-up and a traceback from each rank and attempt, and reached the
user as Ray's "Training failed" with no ``tracerl:`` line. ``guarded_loop`` now raises it as ``LoopFailed``; the
controller callback ``tracerl.workflows.ops.disk_callback.StopOnDiskFull`` ends the run instead of restarting, and the
driver re-raises the ``LoopFailed`` itself, which the CLI prints as ``tracerl: <message>``, exit 2. A bug (any
other exception) keeps Ray Train's restarts and its traceback.
"""

from __future__ import annotations

from typing import Any

from tracerl.workflows.ops.disk import error_chain, quiet_reported

PERMANENT: tuple[type[BaseException], ...] = (ValueError, LookupError)
"""What a restart from the same config and checkpoint raises again."""


class LoopFailed(ValueError):
    """A training loop's error that a restart cannot get past; its message is the error's, on one line."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # crosses Ray's process boundaries intact
        return (LoopFailed, (str(self),))


def as_permanent(exc: BaseException) -> LoopFailed | None:
    """``exc`` as a ``LoopFailed`` where it is one (or a ``PERMANENT`` error), else None."""
    if isinstance(exc, LoopFailed):
        return exc
    if isinstance(exc, PERMANENT) and not isinstance(exc, OSError):
        inner = getattr(
            exc, "cause", None
        )  # Ray's RayTaskError(X) from an actor: X's message, not the traceback
        if isinstance(inner, PERMANENT) and not isinstance(inner, OSError):
            exc = inner
        text = " ".join(str(exc).split()) or type(exc).__name__
        return LoopFailed(f"the training loop stopped ({type(exc).__name__}): {text}")
    return None


def loop_failed(exc: BaseException) -> LoopFailed | None:
    """The ``LoopFailed`` inside ``exc``, however Ray Train wrapped it, or None."""
    return next((e for e in error_chain(exc) if isinstance(e, LoopFailed)), None)


def quiet_loop_failed(*loggers: str) -> None:
    """Keep Ray Train's tracebacks of a ``LoopFailed`` out of the terminal. Idempotent."""
    quiet_reported("LoopFailed", loop_failed, *loggers)
