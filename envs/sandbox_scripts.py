"""The two scripts a sandboxed call runs in its child process (``envs.sandbox`` passes them to the interpreter).

``LAUNCHER`` applies the limits and the network namespace as root, drops privileges and execs the sandboxed
command; ``RUNNER`` runs the cells, reports how the last one ended (``ExecResult.completed``) in a status file.
"""

# Runs in the child (as root, before dropping privileges), then execs the sandboxed command.
LAUNCHER = r"""
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
RUNNER = r"""
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
