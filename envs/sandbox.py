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
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox_fs import ReadOnlyView, interpreter_view
from tracerl.config import SandboxConfig

_CLONE_NEWNET = 0x40000000
# bubblewrap's namespaces and minimal /dev, /proc and private /tmp (the read-only view and scratch come after).
_NAMESPACES = (
    "--unshare-net",
    "--unshare-pid",
    "--unshare-ipc",
    "--die-with-parent",
    "--new-session",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
)
_STATUS = ".cell-status.json"  # the runner's report on the last cell, in the scratch directory
# Runs in the child (as root, before dropping privileges), then execs the sandboxed command.
_LAUNCHER = r"""
import ctypes, json, os, resource, sys
spec = json.loads(sys.argv[1])
os.setsid()
if spec["unshare_net"]:
    ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # a fresh network namespace: no interfaces up
for res, value in spec["limits"]:
    resource.setrlimit(res, (value, value))
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.execv(sys.argv[2], sys.argv[2:])
"""
_RUNNER = r"""
import errno, json, os, signal, sys, traceback

LIMIT_ERRNOS = {errno.EAGAIN, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT}


def main():
    # Everything the report needs is bound here, before any cell runs, so a cell that rebinds a name or
    # patches a module cannot break it. Cells run in their own namespace, not this module's.
    _exit, _open, _write, _close, _listdir, _stat = os._exit, os.open, os.write, os.close, os.listdir, os.stat
    _getpid, _getppid, _getuid, _getsid, _dumps = os.getpid, os.getppid, os.getuid, os.getsid, json.dumps
    _print_exception, _compile, _exec, _isinstance = traceback.print_exception, compile, exec, isinstance
    _fopen, _print, _O_NEW = open, print, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    _getitimer, _itimers = signal.getitimer, (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
    with open(sys.argv[1]) as f:
        cells = json.load(f)
    status_path, private = sys.argv[2], sys.argv[3] == "1"
    me, out, err, sink = _getpid(), sys.stdout, sys.stderr, open(os.devnull, "w")
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    for cell in cells[:-1]:  # replay earlier cells for their state; their output was already shown
        sys.stdout = sys.stderr = sink
        try:
            _exec(_compile(cell, "<cell>", "exec"), ns)
        except BaseException:
            pass
        if _getpid() != me:  # a fork that fell through the cell: only the runner's own process goes on
            _exit(0)
    sys.stdout, sys.stderr = out, err
    status, code = "ok", 0
    try:
        _exec(_compile(cells[-1], "<cell>", "exec"), ns)
    except SystemExit as exc:
        if _getpid() != me:
            _exit(0)
        status, code = "exception", exc.code
        if not _isinstance(code, int):
            if code is not None:
                _print(code, file=err)
            code = 0 if code is None else 1
        code = code & 0xFF
    except BaseException as exc:
        if _getpid() != me:  # a forked child raising (a fork bomb's many children): not the runner's to report
            _exit(0)
        limit = _isinstance(exc, MemoryError) or (_isinstance(exc, OSError) and exc.errno in LIMIT_ERRNOS)
        status, code = ("limit" if limit else "exception"), 1
        sys.stderr = err
        try:
            _print_exception(type(exc), exc, exc.__traceback__.tb_next)  # the cell's frames, not the runner's
        except BaseException:
            pass
    if _getpid() != me:
        _exit(0)
    sys.stdout, sys.stderr = out, err
    threads = processes = 0
    timers = sum(_getitimer(t)[0] > 0 for t in _itimers)  # signal.alarm / setitimer: would fire in later calls
    try:
        threads = len(_listdir("/proc/self/task")) - 1
        uid, sid, parent = _getuid(), _getsid(0), _getppid()
        for pid in _listdir("/proc"):
            if not pid.isdigit() or int(pid) in (me, parent):
                continue
            try:  # private: every other process of our uid (or PID namespace) is the call's; else our session's
                if (_stat("/proc/" + pid).st_uid == uid) if private else (_getsid(int(pid)) == sid):
                    with _fopen("/proc/" + pid + "/stat") as f:
                        processes += f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except (OSError, IndexError):
                continue
    except OSError:
        pass
    if status != "limit" and (threads or processes or timers):
        status, code = "leftover", code or 1
    for stream in (out, err):
        try:
            stream.flush()
        except BaseException:
            pass
    fd = _open(status_path, _O_NEW, 0o600)
    _write(fd, _dumps({"status": status, "threads": threads, "processes": processes, "timers": timers}).encode())
    _close(fd)
    _exit(code)  # skips atexit handlers and the join of leftover threads: the report above is final


main()
"""


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


def _bwrap_view(bwrap: str, python: str) -> tuple[ReadOnlyView | None, str]:
    """The interpreter's read-only view, and why bubblewrap cannot run it there ('' when it can): the probe
    runs the stdlib modules the math tool needs inside the same namespaces and view as a call, as an
    unprivileged uid when we are root."""
    try:
        view = interpreter_view(python)
    except RuntimeError as exc:
        return None, str(exc)
    command = [
        bwrap,
        *_NAMESPACES,
        *view.bwrap_args(),
        "--remount-ro",
        "/",
        python,
        "-I",
        "-c",
        "import math, json, fractions, re, decimal; print(math.gcd(12, 18))",
    ]
    # Through the launcher, as a call is (no preexec_fn in a threaded host), as the unprivileged uid 65534 if root.
    spec = json.dumps({"unshare_net": False, "limits": [], "uid": 65534 if os.geteuid() == 0 else None})
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, spec, *command],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"bubblewrap failed to start: {exc}"
    if r.returncode != 0 or r.stdout.strip() != "6":
        return (
            None,
            f"bubblewrap could not run {python} with only its libraries visible: {r.stderr.strip()[-300:]}",
        )
    return view, ""


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
        bwrap = shutil.which("bwrap") if cfg.use_bwrap else None
        self.view, self.bwrap_problem = _bwrap_view(bwrap, self.python) if bwrap else (None, "")
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
            (scratch / "runner.py").write_text(_RUNNER)
            (scratch / "cells.json").write_text(json.dumps(list(cells)))
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
            "cells.json",
            str(scratch / _STATUS),  # absolute: cells may chdir
            "1" if self.as_root or self.bwrap else "0",
        ]
        if self.bwrap is None or self.view is None:
            return runner
        # The root is an empty tmpfs holding only the view, made read-only; the scratch directory lives under
        # /tmp and is mounted back at its own path over the private /tmp.
        return [
            self.bwrap,
            *_NAMESPACES,
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

    def _limits(self, uid: int) -> dict[str, object]:
        """What the launcher applies in the child before exec: session, namespaces, rlimits, uid."""
        cfg = self.cfg
        mb = 1024 * 1024
        limits = [
            (resource.RLIMIT_CPU, cfg.cpu_s),
            (resource.RLIMIT_AS, cfg.memory_mb * mb),
            (resource.RLIMIT_FSIZE, cfg.max_file_mb * mb),
            (resource.RLIMIT_NOFILE, cfg.max_open_files),
            (resource.RLIMIT_CORE, 0),
        ]
        if self.as_root:  # NPROC counts per uid: only meaningful with a uid of the call's own
            limits.append((resource.RLIMIT_NPROC, cfg.max_processes))
        return {
            "unshare_net": self.as_root and self.bwrap is None,
            "limits": limits,
            "uid": uid if self.as_root else None,
        }

    def _launch(self, command: list[str], uid: int) -> list[str]:
        """``command`` behind the launcher. The child is set up by a freshly exec'd interpreter, not by a
        ``preexec_fn``: forking a threaded host (a Ray actor: gRPC threads) and running Python before exec
        can deadlock or crash the child on locks held by other threads."""
        return [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(self._limits(uid)), *command]

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
                proc = subprocess.Popen(
                    self._launch(self._command(scratch), uid),
                    cwd=scratch,
                    stdin=subprocess.DEVNULL,
                    stdout=fo,
                    stderr=fe,
                    env=env,
                    close_fds=True,
                )
            except OSError as exc:
                return ExecResult("", f"sandbox failed to start: {exc}", 1, False, False, 0.0)
            try:
                code: int | None = proc.wait(timeout=cfg.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, code = True, None
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
        report = _report(scratch / _STATUS)
        status = str(report.get("status", ""))
        threads, processes, timers = (
            n if isinstance(n := report.get(k), int) and n > 0 else 0
            for k in ("threads", "processes", "timers")
        )
        left = [f"{threads} thread" + "s" * (threads != 1)] if threads else []
        left += [f"{processes} process" + "es" * (processes != 1)] if processes else []
        left += [f"{timers} timer" + "s" * (timers != 1)] if timers else []
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
        """Kill every process the call's uid still has (kill(-1) as that uid) and wait until they are gone."""
        kill = f"import os; os.setgroups([]); os.setgid({uid}); os.setuid({uid}); os.kill(-1, 9)"
        deadline = time.monotonic() + wait_s
        while uid_processes(uid):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [sys.executable, "-I", "-S", "-c", kill],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=10,
                )
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)


def _report(path: Path) -> dict[str, object]:
    """The runner's report on the last cell; empty when it did not get to write one (crash, kill, timeout)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


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
