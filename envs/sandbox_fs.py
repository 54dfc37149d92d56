"""What a sandboxed call may read under bubblewrap: the interpreter, its libraries and nothing else.

Instead of a read-only bind of the whole filesystem (the project tree, /etc/passwd, /root...), the new root
is an empty tmpfs (remounted read-only) holding only, each bound read-only at its own path:

* the interpreter: every symlink on the way from the configured path to the real binary (recreated as
  symlinks), the binary, and a venv's ``pyvenv.cfg`` when the interpreter is one;
* the directories on its ``sys.path`` (as ``python -I`` sees it) that lie under its prefix, base prefix or exec
  prefixes: the stdlib, lib-dynload and site-packages. Any other entry (an editable install's source tree, a
  path a ``.pth`` file adds) is left out, so a venv inside a project exposes its lib directories, never the
  project;
* its shared libraries: the directory of every library it maps after importing the stdlib's common modules
  (``libc``'s directory, where the stdlib extensions' libraries live too), or just the file for a library in a
  prefix's ``lib`` directory (a shared ``libpython``); the dynamic loader; ``/etc/ld.so.cache``.

Nothing else exists in the sandbox but a minimal /dev, a /proc of its own PID namespace, a private /tmp and the
scratch directory (added by ``Sandbox``). A library outside these places (e.g. one an extension module in
site-packages links from /usr/local) cannot be loaded inside the sandbox.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from envs.sandbox_scripts import LAUNCHER

# Run by the interpreter itself (as ``python -I``) to say where it lives and which libraries it maps.
_PROBE = r"""
import json, sys
for name in ("math", "cmath", "json", "fractions", "decimal", "re", "random", "statistics", "itertools",
             "functools", "collections", "datetime", "heapq", "bisect", "array", "struct", "hashlib", "string"):
    try:
        __import__(name)
    except ImportError:
        pass
maps = set()
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
            maps.add(parts[5].strip())
print(json.dumps({"prefixes": [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix],
                  "path": sys.path, "maps": sorted(maps)}))
"""
_LOADERS = ("/lib64/ld-linux*.so*", "/lib/ld-linux*.so*", "/lib/ld-musl-*.so*", "/lib32/ld-linux*.so*")


@dataclass(frozen=True)
class ReadOnlyView:
    """The read-only part of a sandbox's filesystem."""

    binds: tuple[str, ...]
    """Real host paths (files or directories), each bound read-only at its own path."""
    symlinks: tuple[tuple[str, str], ...]
    """(target, link path) pairs recreating the host's symlinks on the way to the bound paths."""

    def bwrap_args(self) -> list[str]:
        """Arguments that build this view over bubblewrap's empty root."""
        args: list[str] = []
        for path in self.binds:
            args += ["--ro-bind", path, path]
        for target, link in self.symlinks:
            args += ["--symlink", target, link]
        return args


class _Builder:
    def __init__(self) -> None:
        self.binds: set[str] = set()
        self.symlinks: dict[str, str] = {}

    def expose(self, path: str) -> None:
        """Make ``path`` resolve inside the sandbox as on the host: symlinks on the way, then the real path."""
        path, seen = os.path.abspath(path), 0
        while True:
            resolved = "/"
            rest = [p for p in path.split("/") if p]
            for i, part in enumerate(rest):
                candidate = os.path.join(resolved, part)
                if os.path.islink(candidate):
                    target = os.readlink(candidate)
                    self.symlinks[candidate] = target
                    path = os.path.normpath(os.path.join(resolved, target, *rest[i + 1 :]))
                    break
                resolved = candidate
            else:
                if os.path.exists(path):
                    self.binds.add(path)
                return
            seen += 1
            if seen > 40:  # a symlink loop: leave the path out
                return

    def view(self) -> ReadOnlyView:
        binds = sorted(self.binds)
        # A path inside another bound directory is already visible; a symlink inside one already exists.
        kept = [b for b in binds if not any(b != o and b.startswith(o.rstrip("/") + "/") for o in binds)]
        links = [
            (t, link)
            for link, t in sorted(self.symlinks.items())
            if not any(link.startswith(o.rstrip("/") + "/") for o in kept)
        ]
        return ReadOnlyView(tuple(kept), tuple(links))


def _under(path: str, roots: set[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def interpreter_view(python: str, timeout_s: float = 30.0) -> ReadOnlyView:
    """The read-only view ``python`` needs to run its stdlib and site-packages.

    Raises:
        RuntimeError: the interpreter could not be run to find out (its stderr in the message).
    """
    try:
        probe = subprocess.run(
            [python, "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"could not run the sandbox's interpreter {python!r}: {exc}") from exc
    if probe.returncode != 0:
        raise RuntimeError(f"the sandbox's interpreter {python!r} failed: {probe.stderr.strip()[-300:]}")
    try:
        info = json.loads(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise RuntimeError(
            f"the sandbox's interpreter {python!r} printed no report: {probe.stdout[-300:]!r}"
        ) from exc
    prefixes = {os.path.realpath(p) for p in info["prefixes"]} | {p for p in info["prefixes"]}
    b = _Builder()
    b.expose(python)
    for cfg in (
        os.path.join(os.path.dirname(python), "pyvenv.cfg"),
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(python))), "pyvenv.cfg"),
    ):
        if os.path.isfile(cfg):
            b.expose(cfg)
    for entry in info["path"]:
        if (
            entry
            and os.path.isabs(entry)
            and os.path.exists(entry)
            and _under(os.path.realpath(entry), prefixes)
        ):
            b.expose(entry)
    prefix_libs = {os.path.join(p, lib) for p in prefixes for lib in ("lib", "lib64")}
    for lib in info["maps"]:
        # A shared libpython in a prefix's lib directory: the file, not the directory (it holds more than
        # libraries); a library under a sys.path directory is visible already; others: their directory.
        b.expose(lib if os.path.dirname(lib) in prefix_libs else os.path.dirname(lib))
    for pattern in _LOADERS:
        for loader in glob.glob(pattern):
            b.expose(loader)
    if os.path.exists("/etc/ld.so.cache"):
        b.expose("/etc/ld.so.cache")
    return b.view()


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


def bwrap_view(bwrap: str, python: str) -> tuple[ReadOnlyView | None, str]:
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
    spec = json.dumps({"unshare_net": False, "limits": [], "uid": 65534 if os.geteuid() == 0 else None})
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-S", "-c", LAUNCHER, spec, *command],
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
