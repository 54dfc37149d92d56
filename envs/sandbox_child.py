"""What a sandboxed call's child process runs and is held to (envs/sandbox.py starts it and collects the result).

* ``launch``: how the child is set up before it execs the sandboxed command: a new session, the rlimits
  (``launcher_spec``) and the unprivileged uid, by ``Popen`` and util-linux's ``prlimit`` and ``setpriv``; where
  they are missing, or a network namespace is needed (root without bubblewrap), by ``LAUNCHER``, a freshly exec'd
  interpreter;
* ``RUNNER``: replays the earlier cells silently, runs the last one, and writes its report (``STATUS_FILE``:
  ok, exception, limit or leftover, with the threads, processes and timers the cell left) before it exits;
* ``NAMESPACES`` and ``bwrap_view``: bubblewrap's namespaces, and the probe that checks the interpreter runs in
  its read-only view (envs/sandbox_fs.py) before any call relies on it;
* ``wait_exit``: the child's exit, woken by the kernel when it ends rather than by polling.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.envs.sandbox_fs import ReadOnlyView, interpreter_view
from tracerl.schema import check


@dataclass(frozen=True)
class SandboxConfig:
    """The Python tool's sandbox (envs/sandbox.py): one fresh process per call."""

    timeout_s: float = 5.0
    """Wall-clock limit per call."""
    cpu_s: int = 5
    """CPU-time limit per call (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    max_processes: int = 32
    """Process/thread limit for the call's user (RLIMIT_NPROC)."""
    max_file_mb: int = 8
    """Largest file the call may write, its captured output included (RLIMIT_FSIZE)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_output_chars: int = 2000
    """Observation length cap; the rest is cut and marked."""
    python: str = "auto"
    """Interpreter run inside the sandbox; 'auto' prefers /usr/bin/python3 (readable by an unprivileged user)."""
    use_bwrap: bool = True
    """Use bubblewrap when present: only the interpreter and its libraries readable, private /tmp, no network, own PIDs."""
    uid_base: int = 200_000
    """Calls run as a random unprivileged uid in [uid_base, uid_base + 65536) when started as root."""

    def __post_init__(self) -> None:
        check(self.timeout_s > 0, f"sandbox.timeout_s must be > 0 (got {self.timeout_s})")
        check(self.cpu_s >= 1, f"sandbox.cpu_s must be >= 1 (got {self.cpu_s})")
        check(self.memory_mb >= 64, f"sandbox.memory_mb must be >= 64 (got {self.memory_mb})")
        check(self.max_processes >= 1, f"sandbox.max_processes must be >= 1 (got {self.max_processes})")
        check(self.max_file_mb >= 1, f"sandbox.max_file_mb must be >= 1 (got {self.max_file_mb})")
        check(self.max_open_files >= 16, f"sandbox.max_open_files must be >= 16 (got {self.max_open_files})")
        check(
            self.max_output_chars >= 16,
            f"sandbox.max_output_chars must be >= 16 (got {self.max_output_chars})",
        )
        check(self.uid_base >= 1000, f"sandbox.uid_base must be >= 1000 (got {self.uid_base})")


# bubblewrap's namespaces and minimal /dev, /proc and private /tmp (the read-only view and scratch come after).
NAMESPACES = (
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
STATUS_FILE = ".cell-status.json"  # the runner's report on the last cell, in the scratch directory
CELLS_FILE = "cells.bin"  # the cells to run, as write_cells writes them
# Runs in the child (as root, before dropping privileges), then execs the sandboxed command: the fallback where
# ``prlimit`` or ``setpriv`` is missing, and the set-up that needs a network namespace of its own (root without
# bubblewrap).
LAUNCHER = r"""
import json, os, resource, sys
spec = json.loads(sys.argv[1])
os.setsid()
if spec["unshare_net"]:
    import ctypes
    ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # a fresh network namespace: no interfaces up
for res, value in spec["limits"]:
    resource.setrlimit(res, (value, value))
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.execv(sys.argv[2], sys.argv[2:])
"""
# Imports only built-in modules (json, traceback and signal would cost more than the rest of a short call's start):
# the cells come in CELLS_FILE's length-prefixed form, the report is formatted by hand, and an exception is printed by
# the interpreter's own hook.
RUNNER = r"""
import _signal, errno, os, sys, time

LIMIT_ERRNOS = {errno.EAGAIN, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT}


def main():
    # Everything the report needs is bound here, before any cell runs, so a cell that rebinds a name or
    # patches a module cannot break it. Cells run in their own namespace, not this module's.
    _exit, _open, _write, _close, _listdir, _stat = os._exit, os.open, os.write, os.close, os.listdir, os.stat
    _getpid, _getppid, _getuid, _getsid = os.getpid, os.getppid, os.getuid, os.getsid
    _print_exception, _compile, _exec, _isinstance = sys.__excepthook__, compile, exec, isinstance
    _with_traceback, _times, _cpu = BaseException.with_traceback, os.times, time.process_time
    _fopen, _print, _O_NEW = open, print, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    _getitimer, _itimers = _signal.getitimer, (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF)
    with open(sys.argv[1], "rb") as f:  # a line of byte lengths, then the cells' UTF-8 one after another
        sizes, data = f.readline().split(), f.read()
    cells, at = [], 0
    for size in map(int, sizes):
        cells.append(data[at : at + size].decode("utf-8", "surrogatepass"))
        at += size
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
            tb = exc.__traceback__.tb_next  # the cell's frames, not the runner's
            _print_exception(type(exc), _with_traceback(exc, tb), tb)
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
    # This process's CPU (to the nanosecond) and its reaped children's (in clock ticks): bubblewrap's reaper in the
    # call's PID namespace keeps both from the host's rusage.
    children = _times()
    cpu = _cpu() + children[2] + children[3]
    report = '{"status": "%s", "threads": %d, "processes": %d, "timers": %d, "cpu_s": %.6f}' % (
        status, threads, processes, timers, cpu
    )
    _write(fd, report.encode())
    _close(fd)
    _exit(code)  # skips atexit handlers and the join of leftover threads: the report above is final


main()
"""


def launcher_spec(cfg: SandboxConfig, as_root: bool, unshare_net: bool, uid: int) -> dict[str, Any]:
    """What the launcher applies in the child before exec: session, namespaces, rlimits, uid."""
    mb = 1024 * 1024
    limits = [
        (resource.RLIMIT_CPU, cfg.cpu_s),
        (resource.RLIMIT_AS, cfg.memory_mb * mb),
        (resource.RLIMIT_FSIZE, cfg.max_file_mb * mb),
        (resource.RLIMIT_NOFILE, cfg.max_open_files),
        (resource.RLIMIT_CORE, 0),
    ]
    if as_root:  # NPROC counts per uid: only meaningful with a uid of the call's own
        limits.append((resource.RLIMIT_NPROC, cfg.max_processes))
    return {"unshare_net": unshare_net, "limits": limits, "uid": uid if as_root else None}


# prlimit's option for each limit launcher_spec sets.
PRLIMIT_OPTIONS = {
    resource.RLIMIT_CPU: "cpu",
    resource.RLIMIT_AS: "as",
    resource.RLIMIT_FSIZE: "fsize",
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_CORE: "core",
    resource.RLIMIT_NPROC: "nproc",
}


@dataclass(frozen=True)
class Launch:
    """How to start a sandboxed command: the argv, and whether ``subprocess.Popen`` makes the new session (else the
    launcher does)."""

    argv: list[str]
    new_session: bool


def launch(spec: dict[str, Any], command: list[str], tools: tuple[str, str] | None) -> Launch:
    """``command`` behind the set-up ``spec`` asks for. Nothing runs Python between fork and exec: forking a threaded
    host (a Ray actor: gRPC threads) and running Python before exec can deadlock or crash the child on locks held by
    other threads (no ``preexec_fn``).

    With util-linux's ``prlimit`` and ``setpriv`` (``tools``: their paths), ``Popen`` makes the new session, ``prlimit``
    sets the limits and ``setpriv`` drops to the uid, each exec'ing the next: about 2 ms. ``Popen`` is given nothing
    that stops it from using vfork (a ``user``, ``group`` or ``extra_groups`` would: then a host of a gigabyte is
    copied page table by page table, on every call). Without them, or where the call needs a network namespace of
    its own (root without bubblewrap), a freshly exec'd interpreter does all of it (``LAUNCHER``: about 10 ms more)."""
    if tools is None or spec["unshare_net"]:
        return Launch([sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(spec), *command], False)
    prlimit, setpriv = tools
    argv = [prlimit, *(f"--{PRLIMIT_OPTIONS[res]}={value}:{value}" for res, value in spec["limits"]), "--"]
    if spec["uid"] is not None:
        uid = str(spec["uid"])
        argv += [setpriv, "--reuid", uid, "--regid", uid, "--clear-groups", "--"]
    return Launch([*argv, *command], True)


def util_linux() -> tuple[str, str] | None:
    """The paths of ``prlimit`` and ``setpriv``, or None when either is missing (``launch`` then uses ``LAUNCHER``)."""
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    return (prlimit, setpriv) if prlimit and setpriv else None


def write_cells(path: Path, cells: Sequence[str]) -> None:
    """The cells in the runner's form: a line of their UTF-8 sizes, then their bytes one after another (a cell may
    hold any character, a lone surrogate included)."""
    blobs = [cell.encode("utf-8", "surrogatepass") for cell in cells]
    path.write_bytes(" ".join(str(len(b)) for b in blobs).encode() + b"\n" + b"".join(blobs))


def bwrap_view(bwrap: str, python: str, tools: tuple[str, str] | None) -> tuple[ReadOnlyView | None, str]:
    """The interpreter's read-only view, and why bubblewrap cannot run it there ('' when it can): the probe
    runs the stdlib modules the math tool needs inside the same namespaces and view as a call, as an
    unprivileged uid when we are root."""
    try:
        view = interpreter_view(python)
    except RuntimeError as exc:
        return None, str(exc)
    command = [
        bwrap,
        *NAMESPACES,
        *view.bwrap_args(),
        "--remount-ro",
        "/",
        python,
        "-I",
        "-c",
        "import math, json, fractions, re, decimal; print(math.gcd(12, 18))",
    ]
    # Through the launcher, as a call is (no preexec_fn in a threaded host), as the unprivileged uid 65534 if root.
    spec: dict[str, Any] = {
        "unshare_net": False,
        "limits": [],
        "uid": 65534 if os.geteuid() == 0 else None,
    }
    try:
        how = launch(spec, command, tools)
        r = subprocess.run(
            how.argv,
            start_new_session=how.new_session,
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


def read_report(path: Path) -> dict[str, object]:
    """The runner's report on the last cell; empty when it did not get to write one (crash, kill, timeout)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """``proc``'s exit code, or None if it is still running after ``timeout_s`` seconds.

    ``Popen.wait(timeout=...)`` polls with sleeps that grow to 50 ms, so a call that ends between two polls waits up
    to 50 ms more. A pidfd (Linux 5.3+) becomes readable the moment the child exits: the wait ends then. Where
    pidfds are unavailable it falls back to ``Popen.wait``."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd: another OS or an old kernel
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout_s * 1000))):
            return None
    finally:
        os.close(fd)
    return proc.wait()
