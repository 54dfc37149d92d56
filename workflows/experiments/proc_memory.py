"""Memory of a whole process tree: its summed PSS (proportional set size, so shared pages count once), sampled
on a thread while it runs (``tracerl bench peer`` measures each side this way); and one process's own resident set,
sampled likewise (``RssPeak``: ``tracerl bench sync``'s sender and sampler actors)."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any


def tree_pss_mb(pid: int) -> tuple[float, int]:
    """Summed PSS (MiB) of process ``pid`` and all its descendants, and how many processes were counted. A child
    that shares its parent's address space (vfork'd, not yet exec'd: every ``subprocess.Popen`` that may vfork, for a
    moment) is not counted again: its PSS is its parent's."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0
    total, n = 0.0, 0
    for p in procs:
        try:
            if p is not root and same_address_space(p.ppid(), p.pid):
                continue
            total += p.memory_full_info().pss
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total / 2**20, n


# kcmp(2)'s number by machine, and its KCMP_VM: whether two processes share one address space.
_KCMP = {"x86_64": 312, "aarch64": 272}
_KCMP_VM = 1


def same_address_space(a: int, b: int) -> bool:
    """Whether processes ``a`` and ``b`` share one address space (kcmp(2); False where it cannot tell)."""
    number = _KCMP.get(os.uname().machine)
    return number is not None and _libc().syscall(number, a, b, _KCMP_VM, 0, 0) == 0


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


class TreeMemory:
    """Samples ``tree_pss_mb`` of a process every ``every`` seconds on a thread until ``stop``; keeps the peak."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every = pid, every
        self.peak_mb, self.peak_processes, self.samples = 0.0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss", daemon=True)

    def _run(self) -> None:
        while True:
            mb, n = tree_pss_mb(self.pid)
            if n:
                self.samples += 1
                self.peak_mb = max(self.peak_mb, mb)
                self.peak_processes = max(self.peak_processes, n)
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class RssPeak:
    """A thread that samples this process's resident set (VmRSS) every ``interval_s`` until ``stop``."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.base = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, int]:
        """The reading at the start, the peak, and the peak less the start (bytes)."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return {"base": self.base, "peak": self.peak, "extra": self.peak - self.base}


def rss_bytes() -> int:
    """This process's resident set, bytes (VmRSS: anonymous, file-backed and shared pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (tracerl bench sync reads Linux's /proc)")
