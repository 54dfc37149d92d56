"""Processes that take turns, one step each: a conductor runs several training processes on the same CPUs so that
only one computes at a time, and each waits, between its steps, until the conductor gives it the next turn.
``tracerl bench peer --interleave step`` runs its sides so: machine drift over a run then falls on every side alike.

The child's half is ``take_turn(step)``, called before each step (``tracerl train``'s loop and the bench's TRL
callback call it). It does nothing unless the process was started by a ``Conductor``, which passes two pipe ends
in ``TRACERL_TURNS`` ("<conductor pid>:<read fd>,<write fd>"; only the conductor's own child takes them, and
takes them out of its environment): the child writes the step it is about to run and blocks until the
conductor writes back. A conductor that went away (end of file, a broken pipe) lets the child run on freely.

The conductor's half, ``Conductor``: ``start`` launches a process and waits until it reaches its first turn (or
exits), so start-ups run one at a time as well; ``turn`` lets one process run one step and waits until it asks for
the next (or exits). Each process's pauses, [the conductor heard it ask, the conductor answered], are recorded so
that its wall-clock measurements can leave them out. Standard library only: the TRL side's venv imports it too.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ENV = "TRACERL_TURNS"


def take_turn(step: int) -> None:
    """Wait for this process's next turn, when a ``Conductor`` started it (``TRACERL_TURNS`` set); else return."""
    fds = _pipes()
    if fds is None:
        return
    read_fd, write_fd = fds
    try:
        os.write(write_fd, f"{step}\n".encode())
        os.read(read_fd, 1)  # b"": the conductor is gone, run on
    except OSError:  # a broken pipe or a closed descriptor: no conductor, run on
        _PIPES[:] = []


_PIPES: list[tuple[int, int]] = []
"""This process's pipe ends, once ``_pipes`` has taken them from the environment (empty: none, or gone)."""


def _pipes() -> tuple[int, int] | None:
    """The pipe ends the conductor gave this process. They are taken from the environment on first use (so the
    processes this one starts later do not inherit them) and trusted only in the conductor's own child, and only if
    both are pipes: a process further down (a Ray worker, a subprocess) that inherited the variable ignores it."""
    if _PIPES:
        return _PIPES[0]
    value = os.environ.pop(ENV, None)
    if not value:
        return None
    try:
        parent, ends = value.split(":")
        read_fd, write_fd = (int(x) for x in ends.split(","))
        if int(parent) != os.getppid():
            return None
        if not all(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (read_fd, write_fd)):
            return None
    except (ValueError, OSError):
        return None
    _PIPES.append((read_fd, write_fd))
    return _PIPES[0]


@dataclass
class Turns:
    """One conducted process: its ``Popen``, the two pipe ends the conductor holds, its pauses and the steps it
    asked for."""

    proc: subprocess.Popen[bytes]
    go: int
    """Write end: one byte gives the process its turn."""
    asks: int
    """Read end: the process writes the step it waits to run, one line each."""
    pauses: list[tuple[float, float]] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)
    waiting_since: float | None = None
    buffer: bytes = b""

    @property
    def alive(self) -> bool:
        return self.asks >= 0


class Conductor:
    """Starts processes that call ``take_turn`` and lets them compute one at a time, a step each
    (``tracerl bench peer --interleave step``)."""

    def __init__(self, poll_s: float = 0.5) -> None:
        self.poll_s = poll_s
        self.procs: dict[str, Turns] = {}

    def start(
        self, name: str, launch: Callable[[dict[str, str], tuple[int, ...]], subprocess.Popen[bytes]]
    ) -> Turns:
        """Start a process with ``launch(env, pass_fds)`` (which adds ``env`` to its environment and passes it the
        descriptors ``pass_fds``) and wait until it asks for its first turn or exits."""
        go_r, go_w = os.pipe()
        ask_r, ask_w = os.pipe()
        try:
            proc = launch({ENV: f"{os.getpid()}:{go_r},{ask_w}"}, (go_r, ask_w))
        except BaseException:
            os.close(go_w)
            os.close(ask_r)
            raise
        finally:
            os.close(go_r)
            os.close(ask_w)  # the child holds the only write end: its exit ends the conductor's reads
        t = Turns(proc, go_w, ask_r)
        self.procs[name] = t
        self._wait(t)
        return t

    def turn(self, name: str) -> bool:
        """Let ``name`` run until it asks for its next turn or exits; False once it has exited."""
        t = self.procs[name]
        if not t.alive:
            return False
        now = time.time()
        if t.waiting_since is not None:
            t.pauses.append((t.waiting_since, now))
            t.waiting_since = None
        with contextlib.suppress(OSError):  # it exited between its last ask and now
            os.write(t.go, b"g")
        self._wait(t)
        return t.alive

    def _wait(self, t: Turns) -> None:
        """Until ``t`` asks for a turn (then ``waiting_since`` is set) or its process ends (the pipes closed)."""
        while True:
            if b"\n" in t.buffer:
                line, t.buffer = t.buffer.split(b"\n", 1)
                t.asked.append(int(line) if line.strip().lstrip(b"-").isdigit() else -1)
                t.waiting_since = time.time()
                return
            ready, _, _ = select.select([t.asks], [], [], self.poll_s)
            chunk = os.read(t.asks, 64) if ready else None
            if chunk == b"" or (chunk is None and t.proc.poll() is not None):
                self._close(t)
                return
            t.buffer += chunk or b""

    def _close(self, t: Turns) -> None:
        for fd in (t.go, t.asks):
            with contextlib.suppress(OSError):
                os.close(fd)
        t.asks = -1

    def close(self) -> None:
        """Release every process still waiting (each runs on to its end on its own) and close the pipes."""
        for t in self.procs.values():
            if t.alive:
                self._close(t)


def paused_within(pauses: Sequence[Sequence[float]], a: float, b: float) -> float:
    """Seconds of ``pauses`` ([start, end] wall-clock pairs) that fall within [a, b]."""
    return sum(max(0.0, min(b, p1) - max(a, p0)) for p0, p1 in pauses)
