"""Memory of a whole process tree: its summed PSS (proportional set size, so shared pages count once), sampled
on a thread while it runs (``tracerl bench peer`` measures each side this way)."""

from __future__ import annotations

import threading


def tree_pss_mb(pid: int) -> tuple[float, int]:
    """Summed PSS (MiB) of process ``pid`` and all its descendants, and how many processes were counted."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0
    total, n = 0.0, 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total / 2**20, n


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
