"""Grading under a wall-clock limit: a killable worker process, replaced after a timeout.

A verifier can run for minutes on a few characters of model output (math-verify's sympy on a tower of powers such as
``9^{9^{9^{9^9}}}``); a BFCL check replays every call of an episode. A signal-based timeout works only on a process's
main thread (not in a Ray actor's task thread, not in a thread pool) and a thread cannot be stopped, so a
``Grader`` runs grading functions in a child process and kills it when a call runs past ``timeout_s``: the call
raises :class:`GradeTimeout` (environments let it through; the rollout engine scores the answer 0 and flags the
leaf) and a fresh worker starts right away, in the background. Cheap checks (exact match) stay in the caller.

The worker is started on first use with this interpreter and ``sys.path``; it imports ``preload`` (modules, or
``module:function`` to call once) before it counts as started, so imports never count against the limit. It
exits with its parent (``PR_SET_PDEATHSIG`` on Linux, and on end of input), caps its address space at
``memory_mb`` (a ``MemoryError`` there is a failed grade), and writes nothing but its replies (what a grading
function prints goes to its stderr, which is discarded).

Grading functions must be importable module-level functions with picklable arguments and results.

``stated_answer`` is the part of an answer turn that environments grade: the final answer the policy states, never
the rest of its text (docs/method.md, "The graded answer").
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, BinaryIO

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_MARKER = re.compile(r"(?:final answer|the answer is)(?:\s+is)?\s*[:=]?\s*", re.I)


def stated_answer(text: str) -> str:
    """The final answer an answer turn states: the content of its last ``\\boxed{...}``; else what follows its last
    final-answer marker (``Final Answer:``, ``the final answer is``, ``the answer is``) up to the end of that line;
    else the whole text, stripped (an environment then applies its own rule, e.g. math's number it ends on)."""
    boxed = _BOXED.findall(text)
    if boxed:
        return str(boxed[-1]).strip()
    marks = list(_MARKER.finditer(text))
    if marks:
        rest = text[marks[-1].end() :].strip()
        return rest.splitlines()[0].strip() if rest else ""
    return text.strip()


START_LIMIT_S = 120.0
"""How long a worker may take to start (import ``preload``); past it the grade is a timeout."""
_HEADER = struct.Struct("!Q")


class GradeTimeout(Exception):  # noqa: N818 - reads as what happened, like TimeoutError
    """A grade ran past its wall-clock limit (``env.reward_timeout_s``): the answer scores 0, flagged as such."""


class GradeError(RuntimeError):
    """A grading function raised, or its worker died twice in one call (a crash on model text: a wrong answer)."""


class Grader:
    """Runs ``fn(*args)`` in a worker process, at most ``timeout_s`` wall seconds per call (thread-safe)."""

    def __init__(self, timeout_s: float, preload: Sequence[str] = (), memory_mb: int = 4096) -> None:
        if timeout_s <= 0:
            raise ValueError(f"a grading time limit must be > 0 seconds (got {timeout_s})")
        self.timeout_s, self.preload, self.memory_mb = float(timeout_s), tuple(preload), int(memory_mb)
        self.timeouts = 0
        """Calls that ran past the limit (each killed its worker)."""
        self.restarts = 0
        """Workers started after the first (after a timeout, or a worker that died)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._lock = threading.Lock()

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, computed in the worker.

        Raises:
            GradeTimeout: the call (or the worker's start) ran past its limit; the worker was killed and replaced.
            GradeError: ``fn`` raised (the message has its type and text), or the worker died twice in this call.
            RuntimeError: the worker could not import ``preload`` (a broken installation, not model text).
        """
        request = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            for attempt in (
                0,
                1,
            ):  # a worker that died between calls (killed from outside) gets one replacement
                self._ensure_started()
                try:
                    reply = self._exchange(request)
                except _WorkerDied as exc:
                    self._discard()
                    if attempt:
                        raise GradeError(f"the grading worker died while grading ({exc})") from None
                    continue
                kind, value = reply
                if kind == "error":
                    raise GradeError(str(value))
                return value
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        with self._lock:
            self._discard()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()

    # -- the parent side -------------------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:
                self._discard()
            self._spawn()
        if not self._ready:
            deadline = time.monotonic() + START_LIMIT_S
            try:
                kind, value = _read_message(self._out(), deadline)
            except _Late:
                self._kill_for_timeout()
                raise GradeTimeout(f"the grading worker did not start within {START_LIMIT_S:g} s") from None
            except _WorkerDied as exc:
                self._discard()
                raise RuntimeError(f"the grading worker exited while starting ({exc})") from None
            if kind != "ready":
                self._discard()
                raise RuntimeError(f"the grading worker could not start: {value}")
            self._ready = True

    def _spawn(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tracerl.grading", str(self.memory_mb), *self.preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            bufsize=0,
        )
        self._ready = False

    def _out(self) -> IO[bytes]:
        assert self._proc is not None and self._proc.stdout is not None
        return self._proc.stdout

    def _exchange(self, request: bytes) -> tuple[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(_HEADER.pack(len(request)) + request)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerDied(f"write failed: {exc}") from None
        try:
            return _read_message(self._out(), time.monotonic() + self.timeout_s)
        except _Late:
            self._kill_for_timeout()
            raise GradeTimeout(f"grading ran past {self.timeout_s:g} s") from None

    def _kill_for_timeout(self) -> None:
        self.timeouts += 1
        self._discard()
        self._spawn()  # the replacement imports in the background while the caller goes on
        self.restarts += 1

    def _discard(self) -> None:
        proc, self._proc, self._ready = self._proc, None, False
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


class _Late(Exception):  # noqa: N818 - internal signal
    """No complete reply before the deadline."""


class _WorkerDied(Exception):  # noqa: N818 - internal signal
    """The worker's pipe closed."""


def _read_exact(stream: IO[bytes], n: int, deadline: float) -> bytes:
    fd, chunks, got = stream.fileno(), [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise _Late()
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise _WorkerDied("end of output")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_message(stream: IO[bytes], deadline: float) -> tuple[str, Any]:
    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size, deadline))
    kind, value = pickle.loads(_read_exact(stream, size, deadline))  # noqa: S301 - our own child's reply
    return str(kind), value


# -- the worker side -----------------------------------------------------------------------------------------


def _send(out: BinaryIO, kind: str, value: Any) -> None:
    try:
        data = pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is a failed grade, not a dead worker
        data = pickle.dumps(("error", f"unpicklable result: {exc!r}"))
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def _recv(inp: BinaryIO) -> bytes | None:
    header = inp.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = inp.read(size)
    return data if len(data) == size else None


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (best effort elsewhere: end of input also ends it)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl
        os._exit(0)


def _serve(argv: Sequence[str]) -> None:
    out: BinaryIO = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever grading code prints must not corrupt the replies
    inp: BinaryIO = sys.stdin.buffer
    _die_with_parent()
    memory_mb, preload = int(argv[0]), argv[1:]
    try:
        for item in preload:
            module, _, func = item.partition(":")
            loaded = importlib.import_module(module)
            if func:
                getattr(loaded, func)()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        _send(out, "failed", f"preload {item!r}: {type(exc).__name__}: {exc}")
        return
    try:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
    _send(out, "ready", None)
    while True:
        data = _recv(inp)
        if data is None:
            return
        try:
            fn, args = pickle.loads(data)  # noqa: S301 - our own parent's request
            _send(out, "ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - MemoryError/RecursionError on model text are failed grades
            _send(out, "error", f"{type(exc).__name__}: {exc}"[:2000])


if __name__ == "__main__":
    _serve(sys.argv[1:])
