"""Progress of long commands (train, sweep, bench, bootstrap, eval): one helper, built on tqdm.

tqdm rather than rich: transformers, datasets, huggingface_hub and optuna already require it (rich arrives
only with typer), it draws one line on stderr with the count, the elapsed time and an estimate of the time
left from the rate, and ``tqdm.write`` prints a message above a live bar without breaking it.

When stderr is not a terminal (CI, ``tracerl submit`` job logs, a pipe) there is no bar: a plain line with the
same numbers at most every ``interval`` seconds and at the end, so logs stay readable.

Workflows take ``progress: Callable[[str], None]`` for messages; a :class:`Progress` is such a callable and also
opens bars. ``bar(progress, ...)`` gives a workflow a bar when it was handed a :class:`Progress` and a no-op
otherwise, so tests and library callers pass any callable (or none).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Bar:
    """A count towards ``total``: a tqdm bar on a terminal, else periodic plain lines."""

    def __init__(
        self, total: int, desc: str, unit: str, out: IO[str], tty: bool, interval: float, initial: int = 0
    ) -> None:
        self.total, self.desc, self.unit, self.out, self.interval = total, desc, unit, out, interval
        self.done, self.t0, self.last_line = initial, time.monotonic(), -math.inf
        self.initial = initial
        self._tqdm: Any = None
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._read: Callable[[], int] | None = None
        self._closed = False
        if tty:
            # slow to import: tqdm; the CLI imports this module at start-up and bars are drawn only on a terminal
            from tqdm import tqdm

            self._tqdm = tqdm(
                total=total, desc=desc, unit=unit, initial=initial, file=out, dynamic_ncols=True, leave=True
            )

    def line(self) -> str:
        """The plain progress line: count, elapsed time and the estimated time left."""
        elapsed = time.monotonic() - self.t0
        ran = self.done - self.initial
        left = (
            f", ~{_clock(elapsed / ran * (self.total - self.done))} left"
            if ran > 0 and self.done < self.total
            else ""
        )
        return f"{self.desc}: {self.done}/{self.total} {self.unit}s, {_clock(elapsed)} elapsed{left}"

    def set(self, done: int) -> None:
        """Move to ``done`` (never backwards)."""
        with self._lock:
            if self._closed:  # a poller's read that finished after close: the bar is final
                return
            done = min(max(done, self.done), self.total)
            if done == self.done:
                return
            step, self.done = done - self.done, done
            if self._tqdm is not None:
                self._tqdm.update(step)
                return
            now = time.monotonic()
            if done == self.total or now - self.last_line >= self.interval:
                self.last_line = now
                print(self.line(), file=self.out, flush=True)

    def update(self, n: int = 1) -> None:
        self.set(self.done + n)

    def follow(self, read: Callable[[], int], every: float = 2.0) -> None:
        """Poll ``read()`` (the count done so far, e.g. steps logged to MLflow) in a thread until ``close``."""
        # The thread keeps its own event: ``close`` drops ``self._stop``, possibly while the thread is between two
        # waits (in ``read``), and the next wait must still see the stop.
        stop = threading.Event()
        self._stop, self._read = stop, read

        def loop() -> None:
            while not stop.wait(every):
                try:
                    self.set(read())
                except Exception:  # noqa: BLE001 - a busy store: the next poll reads it
                    continue

        threading.Thread(target=loop, name=f"progress-{self.desc}", daemon=True).start()

    def write(self, msg: str) -> None:
        if self._tqdm is not None:
            self._tqdm.write(msg, file=self.out)
        else:
            print(msg, file=self.out, flush=True)

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            # the last count (the poller may not have seen it); closing never masks what ended the command
            with contextlib.suppress(Exception):
                if self._read is not None:
                    self.set(self._read())
        with self._lock:  # not while a poller's ``set`` is drawing on it
            self._closed = True
            if self._tqdm is not None:
                self._tqdm.close()
                self._tqdm = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Progress:
    """The command line's reporter: ``progress(msg)`` prints a message (above a live bar); ``open_bar`` starts one."""

    def __init__(self, out: IO[str] | None = None, tty: bool | None = None, interval: float = 30.0) -> None:
        self._out, self._tty, self.interval = out, tty, interval
        self.bars: list[Bar] = []

    def __getstate__(self) -> dict[str, Any]:
        # Tune and Ray pickle what a trainable or callback holds: a copy elsewhere prints to its own stderr and
        # carries no bars (their streams, locks and threads cannot travel, e.g. pytest's capture stream).
        return {"_out": None, "_tty": self._tty, "interval": self.interval, "bars": []}

    @property
    def out(self) -> IO[str]:
        return self._out or sys.stderr  # looked up when used: the stderr of the moment

    @property
    def tty(self) -> bool:
        if self._tty is not None:
            return self._tty
        try:
            return self.out.isatty()
        except (AttributeError, ValueError):
            return False

    def __call__(self, msg: str) -> None:
        live = [b for b in self.bars if b._tqdm is not None]
        if live:
            live[-1].write(msg)
        else:
            print(msg, file=self.out, flush=True)

    def open_bar(self, total: int, desc: str, unit: str = "step", initial: int = 0) -> Bar:
        b = Bar(total, desc, unit, self.out, self.tty, self.interval, initial)
        self.bars.append(b)
        return b


class _NoBar(Bar):
    def __init__(self) -> None:
        super().__init__(0, "", "", sys.stderr, tty=False, interval=float("inf"))

    def set(self, done: int) -> None:
        self.done = done

    def follow(self, read: Callable[[], int], every: float = 2.0) -> None:
        pass


def bar(progress: Callable[[str], None], total: int, desc: str, unit: str = "step", initial: int = 0) -> Bar:
    """A bar from the command line's :class:`Progress`, or one that shows nothing for any other reporter."""
    if isinstance(progress, Progress):
        return progress.open_bar(total, desc, unit, initial)
    return _NoBar()
