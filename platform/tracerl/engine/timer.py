"""The one way a step's phases are timed: ``with timer("rollout"): ...`` adds the block's wall seconds to
``timer.seconds["rollout"]``.

A phase entered twice in a step sums (``score`` runs for the roots and again for the prefixes; ``rollout`` for the
bare rollouts and again for the continuations). The timer also knows when its step started, in wall and process
CPU time, for ``time/step_s`` and ``system/cpu_s`` (docs/metrics.md). ``process_tree_cpu_s`` is a process's CPU with
its children's, for the run's ``total/cpu_s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from tracerl import metrics as M


class PhaseTimer:
    """Wall seconds per named phase of one step (a new timer per step)."""

    def __init__(self, seconds: dict[str, float] | None = None) -> None:
        self.seconds: dict[str, float] = {} if seconds is None else seconds
        """Seconds per phase; pass a dict to collect into it (a ``BudgetLedger.phase_s``)."""
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def restart(self) -> None:
        """Start the step's wall and CPU clocks now, keeping the phases timed so far (a step that began beside the
        previous one, ``pipeline.overlap``)."""
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def elapsed(self) -> float:
        """Wall seconds since the timer started."""
        return time.perf_counter() - self.wall0

    def cpu(self) -> float:
        """This process's CPU seconds since the timer started."""
        return time.process_time() - self.cpu0

    def metrics(self) -> dict[str, float]:
        """``time/<phase>_s`` for every phase timed so far."""
        return {M.phase_time(k): v for k, v in self.seconds.items()}


def process_tree_cpu_s() -> float:
    """CPU seconds (user + system, every thread) of this process since it started, with its children's: those it
    reaped (a sandboxed tool call's process) and those still running (e.g. a vLLM engine core). A child that ends
    and is reaped by another child than this process drops out of the sum, so a caller that adds differences
    clamps them at 0."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # ended since the listing
            continue
        total += c.user + c.system
    return float(total)
