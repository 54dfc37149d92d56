"""A sandboxed Python executor: every call runs in a fresh, limited, isolated process.

Layers, each used where the machine allows it (``Sandbox.protections`` says which are on, and
``Sandbox.warnings`` names the ones that are not, so a user knows at start):

* rlimits on the child: CPU seconds, address space, processes (per uid), file size (which also caps
  the captured output: stdout/stderr go to files in the scratch directory), open files;
* an unprivileged random uid (when started as root), so the code can write nowhere but its scratch
  directory and cannot signal anything of ours, and every process it left behind can be killed by uid;
* bubblewrap (when installed and working): a read-only root holding only the interpreter, its libraries
  and a minimal /dev and /proc (envs/sandbox_fs.py: the project tree, /etc, /root and home are not
  there), a private /tmp, the scratch directory as the only writable place, a new network namespace (no
  network, not even loopback) and a new PID namespace (everything dies with the call); without
  bubblewrap but as root, a network namespace is still created with unshare(2);
* a wall-clock timeout; the whole process group is killed on expiry and leftovers are killed by uid.

This module starts the call and collects its result; what the child runs and is held to (the launcher that
applies the limits, the cell runner and its report, the bubblewrap probe) is in envs/sandbox_child.py.

A crash, timeout, memory blow-up or flood is an observation (``ExecResult``), never an exception.
[choice] Calls are stateless; ``run_cells`` rebuilds state by replaying earlier cells with their
output discarded (how the math environment offers a notebook-like tool).

[choice] All-or-nothing cells. ``ExecResult.completed`` says whether the last cell *finished normally*, the
condition for a caller to keep it in the replayed state (the math environment drops the others, so one bad
cell cannot make every later call of its episode fail the same way). A cell finished normally when the
runner saw it return, or raise an ordinary exception, and then found no thread or process of it still
running. Not normal, hence ``completed=False``: the wall-clock timeout; a kill by a signal (CPU or memory
limit, a crash); the process ending before the runner's report (``os._exit``, a fork that fell through); the
output or file-size limit; a resource-limit error raised into Python (``MemoryError``, or an ``OSError``
meaning a limit was hit: EAGAIN from ``fork``, EFBIG, EMFILE, ENFILE, ENOMEM, ENOSPC, EDQUOT), since
replaying it would spend the limit again; a thread, child process or timer (``signal.alarm``, ``setitimer``)
left running when the cell returned (replayed, it would run beside every later cell). An ordinary exception (``NameError``, ``ZeroDivisionError``,
``SystemExit``...) is normal, with REPL semantics: the statements before it ran, and replay re-runs them and
swallows the same exception. The invariant: a kept state replayed within the limits at least once (when its
last cell was accepted). The runner's report is a file in the scratch directory, so code that forges it can
keep a bad cell, which harms only its own episode.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.envs.sandbox_child import (
    CELLS_FILE,
    NAMESPACES,
    RUNNER,
    STATUS_FILE,
    SandboxConfig,
    bwrap_view,
    launch,
    launcher_spec,
    read_report,
    util_linux,
    wait_exit,
    write_cells,
)


@dataclass(frozen=True)
class ExecResult:
    """What one call produced."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The process's exit code; negative for a signal; None if it was killed on timeout."""
    timed_out: bool
    truncated: bool
    """Output was longer than ``max_output_chars`` (or hit the file-size limit) and was cut."""
    wall_s: float
    completed: bool = False
    """The last cell finished normally (see the module docstring): only such a cell may be kept in replayed state."""
    problem: str = ""
    """Why the cell did not finish normally when the exit code and stderr do not say it (e.g. a leftover thread)."""
    cpu_s: float = 0.0
    """CPU seconds of the call's interpreter and the processes it reaped, as its runner reported them (0 without a
    report). Not in the host's rusage: bubblewrap's reaper in the call's PID namespace is not our child. A cell can
    forge it: for measurement only."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.completed

    def observation(self) -> str:
        """The text the agent sees: output, or the error and why."""
        parts = [self.stdout.rstrip()] if self.stdout.strip() else []
        if self.timed_out:
            parts.append(f"Error: execution timed out after {self.wall_s:.1f} s and was killed.")
        elif self.problem:
            parts.append(f"Error: {self.problem}")
        elif self.exit_code not in (0, None):
            last = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
            if self.exit_code < 0:
                name = (
                    signal.Signals(-self.exit_code).name
                    if -self.exit_code in signal.Signals._value2member_map_
                    else str(-self.exit_code)
                )
                why = {
                    "SIGKILL": "memory or CPU limit",
                    "SIGXCPU": "CPU time limit",
                    "SIGXFSZ": "output or file size limit",
                    "SIGSEGV": "crash",
                }.get(name, "signal")
                parts.append(f"Error: process killed by {name} ({why}).")
            else:
                parts.append("Error: " + (last[-1] if last else f"exit code {self.exit_code}"))
        if self.truncated:
            parts.append("[output truncated]")
        return "\n".join(parts) if parts else "(no output)"


def _python(cfg: SandboxConfig, as_root: bool) -> str:
    if cfg.python != "auto":
        return cfg.python
    # The interpreter must be readable by the unprivileged uid (a pyenv Python under /root is not).
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if os.path.exists(cand) and (not as_root or os.stat(os.path.realpath(cand)).st_mode & 0o005 == 0o005):
            return cand
    return sys.executable


class Sandbox:
    """Runs Python code under the protections the machine allows.

    Args:
        cfg: limits and options.
    """

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.as_root = os.geteuid() == 0
        self.python = _python(cfg, self.as_root)
        self.launch_tools = util_linux()
        """util-linux's prlimit and setpriv, which set up a call's child (None: a Python launcher does it)."""
        bwrap = shutil.which("bwrap") if cfg.use_bwrap else None
        self.view, self.bwrap_problem = (
            bwrap_view(bwrap, self.python, self.launch_tools) if bwrap else (None, "")
        )
        """What a call can read (None without bubblewrap), and why bubblewrap was not usable if it was found."""
        self.bwrap = bwrap if self.view is not None else None
        self.protections = {
            "rlimits": True,
            "unprivileged_user": self.as_root,
            "network_isolated": self.bwrap is not None or self.as_root,
            "read_only_filesystem": self.bwrap is not None,
            "limited_reads": self.bwrap is not None,
            "private_tmp": self.bwrap is not None,
            "pid_namespace": self.bwrap is not None,
        }

    @property
    def warnings(self) -> list[str]:
        """One line per protection that is not enforced on this machine."""
        no_bwrap = "no working bubblewrap"
        why = {
            "unprivileged_user": "not started as root, so calls keep our uid",
            "network_isolated": "no bubblewrap and not root: calls can reach the network",
            "read_only_filesystem": (
                f"bubblewrap unusable: {self.bwrap_problem}"
                if self.bwrap_problem
                else f"{no_bwrap} (apt-get install bubblewrap)"
            )
            + ": calls can write wherever the uid may",
            "limited_reads": f"{no_bwrap}: calls can read every file the uid may, the project tree and /etc included",
            "private_tmp": f"{no_bwrap}: calls share /tmp",
            "pid_namespace": f"{no_bwrap}: leftover processes are killed by uid/process group instead",
        }
        return [f"sandbox: {k} not enforced ({why[k]})" for k, on in self.protections.items() if not on]

    def run(self, code: str) -> ExecResult:
        """Run one cell of Python code."""
        return self.run_cells([code])

    def run_cells(self, cells: Sequence[str]) -> ExecResult:
        """Run the last cell after silently replaying the earlier ones (state across calls).

        Raises:
            ValueError: ``cells`` is empty.
        """
        if not cells:
            raise ValueError("run_cells needs at least one cell (the one to run)")
        uid = self.cfg.uid_base + random.SystemRandom().randrange(65536) if self.as_root else os.getuid()
        scratch = Path(tempfile.mkdtemp(prefix="tracerl-sbx-"))
        try:
            (scratch / "runner.py").write_text(RUNNER)
            write_cells(scratch / CELLS_FILE, cells)
            for name in ("stdout", "stderr"):
                (scratch / name).touch()
            if self.as_root:
                for p in [scratch, *scratch.iterdir()]:
                    os.chown(p, uid, uid)
            scratch.chmod(0o700)
            return self._execute(scratch, uid)
        finally:
            if self.as_root:
                self._kill_uid(uid)
            shutil.rmtree(scratch, ignore_errors=True)

    def _command(self, scratch: Path) -> list[str]:
        # private: the call has a uid (root) or a PID namespace (bwrap) of its own, so every other process the
        # runner sees under it is one the cell left running.
        runner = [
            self.python,
            "-I",
            "runner.py",
            CELLS_FILE,
            str(scratch / STATUS_FILE),  # absolute: cells may chdir
            "1" if self.as_root or self.bwrap else "0",
        ]
        if self.bwrap is None or self.view is None:
            return runner
        # The root is an empty tmpfs holding only the view, made read-only; the scratch directory lives under
        # /tmp and is mounted back at its own path over the private /tmp.
        return [
            self.bwrap,
            *NAMESPACES,
            *self.view.bwrap_args(),
            "--remount-ro",
            "/",
            "--bind",
            str(scratch),
            str(scratch),
            "--chdir",
            str(scratch),
            *runner,
        ]

    def _spec(self, uid: int) -> dict[str, Any]:
        """The launcher's set-up of the call's child (envs/sandbox_child.py)."""
        return launcher_spec(self.cfg, self.as_root, self.as_root and self.bwrap is None, uid)

    def _execute(self, scratch: Path, uid: int) -> ExecResult:
        cfg = self.cfg
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": str(scratch),
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        t0 = time.perf_counter()
        timed_out = False
        with open(scratch / "stdout", "wb") as fo, open(scratch / "stderr", "wb") as fe:
            try:
                how = launch(self._spec(uid), self._command(scratch), self.launch_tools)
                proc = subprocess.Popen(
                    how.argv,
                    start_new_session=how.new_session,
                    cwd=scratch,
                    stdin=subprocess.DEVNULL,
                    stdout=fo,
                    stderr=fe,
                    env=env,
                    close_fds=True,
                )
            except OSError as exc:
                return ExecResult("", f"sandbox failed to start: {exc}", 1, False, False, 0.0)
            code = wait_exit(proc, cfg.timeout_s)
            if code is None:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.perf_counter() - t0
        stdout, cut_out = self._read(scratch / "stdout")
        stderr, cut_err = self._read(scratch / "stderr", tail=True)
        flooded = (
            max((scratch / f).stat().st_size for f in ("stdout", "stderr")) >= cfg.max_file_mb * 1024 * 1024
        )
        if flooded:
            stderr += "\nOutputLimitError: output exceeded the sandbox's file-size limit"
        if code is not None and code > 128 and self.bwrap is not None:
            code = -(code - 128)  # bwrap reports a child's signal as 128 + n
        report = read_report(scratch / STATUS_FILE)
        status = str(report.get("status", ""))
        threads, processes, timers = (
            n if isinstance(n := report.get(k), int) and n > 0 else 0
            for k in ("threads", "processes", "timers")
        )
        left = [f"{threads} thread" + "s" * (threads != 1)] if threads else []
        left += [f"{processes} process" + "es" * (processes != 1)] if processes else []
        left += [f"{timers} timer" + "s" * (timers != 1)] if timers else []
        cpu = report.get("cpu_s")
        cpu_s = float(cpu) if isinstance(cpu, (int, float)) and 0 <= cpu < float("inf") else 0.0
        problem = ""
        if status == "leftover" and left:
            problem = f"the cell left {' and '.join(left)} running when it returned."
        elif status not in ("ok", "exception") and not timed_out and code == 0:
            problem = "the process ended before the cell finished."
        completed = (
            status in ("ok", "exception") and not (timed_out or flooded) and code is not None and code >= 0
        )
        return ExecResult(
            stdout,
            stderr,
            code,
            timed_out,
            cut_out or cut_err or flooded or code == -signal.SIGXFSZ,
            wall,
            completed,
            problem,
            cpu_s,
        )

    def _read(self, path: Path, tail: bool = False) -> tuple[str, bool]:
        """The first (or, for tracebacks, last) ``max_output_chars`` characters, and whether more existed."""
        limit = self.cfg.max_output_chars
        size = path.stat().st_size
        with open(path, "rb") as f:
            if tail and size > limit * 4:
                f.seek(size - limit * 4)
            data = f.read(limit * 4 + 1)
        text = data.decode("utf-8", errors="replace")
        cut = len(text) > limit or size > len(data)
        return (text[-limit:] if tail else text[:limit]), cut

    @staticmethod
    def _kill_uid(uid: int, wait_s: float = 2.0) -> None:
        """Kill every process the call's uid still has and wait until they are gone.

        Most calls leave only bubblewrap's own processes, already exiting: each live one is signalled through a pidfd
        (which cannot hit a process that took over a reused pid) and waited for on it, in this process. Whatever is
        left after that (a process forked meanwhile), or everything where pidfds are missing, a process of that uid
        kills at once (kill(-1)), until none is left."""
        deadline, first = time.monotonic() + wait_s, True
        while pids := uid_processes(uid):
            killed = first and kill_pids(uid, pids, deadline)
            if not killed:  # no pidfds, or survivors (a fork racing the first kill): all at once by uid
                kill = f"import os; os.setgroups([]); os.setgid({uid}); os.setuid({uid}); os.kill(-1, 9)"
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [sys.executable, "-I", "-S", "-c", kill],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=10,
                    )
                time.sleep(0.01)
            first = False
            if time.monotonic() > deadline:
                break


def kill_pids(uid: int, pids: list[int], deadline: float) -> bool:
    """SIGKILL each of ``pids`` still owned by ``uid`` through a pidfd, and wait (until ``deadline``) for them to end;
    False when pidfds are unavailable or a signal could not be sent: the caller then kills by uid."""
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            fds.append(fd)
            try:  # the pidfd pins this process: if it is still the uid's, it is the one to kill
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                continue
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        left = len(fds)
        while left and (ms := int((deadline - time.monotonic()) * 1000)) > 0:
            for fd, _ in poller.poll(ms):  # readable: that process has ended
                poller.unregister(fd)
                left -= 1
        return True
    except (AttributeError, OSError):
        return False
    finally:
        for fd in fds:
            os.close(fd)


def uid_processes(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes owned by ``uid``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != "Z":
            out.append(int(pid))
    return out
