"""The project as a user installs it: a wheel built from this checkout's files and a fresh virtualenv holding it
(tests/test_wheel.py; tests/test_cluster.py's client, which is not the cluster's venv).

The fresh environment borrows the project venv's third-party packages through a ``.pth`` line (a plain path: the
venv's editable finder for this checkout is not loaded), so nothing is downloaded; the wheel itself is built from a
copy of this checkout's files with ``pip wheel --no-build-isolation`` (the setuptools of the project venv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

RUN_LIMIT_S = 900


def bare_env(home: Path) -> dict[str, str]:
    """An environment with nothing of this checkout's (no venv on PATH, no PYTHONPATH)."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "OMP_NUM_THREADS": "1"}


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=env or bare_env(cwd),
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )


def checkout_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and untracked, not ignored; links kept as links)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src, out = ROOT / rel, dest / rel
        if not src.is_symlink() and not src.is_file():
            continue  # deleted in the work tree
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, out)
    return dest


def build_wheel(tmp: Path) -> Path:
    """The project's wheel, built from a copy of the checkout (a build/ left in the checkout would add its stale
    files to it)."""
    src = checkout_copy(tmp / "src")
    dist = tmp / "dist"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("tracerl-*.whl")
    return wheel


@dataclass(frozen=True)
class WheelVenv:
    root: Path
    site: Path
    """Its site-packages, where the wheel's ``tracerl`` is."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.root / "bin"


def wheel_venv(wheel: Path, dest: Path) -> WheelVenv:
    """A fresh virtualenv at ``dest`` with ``wheel`` installed (its console script ``tracerl`` included)."""
    venv.EnvBuilder(with_pip=False).create(dest)
    python = dest / "bin" / "python"
    site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], dest.parent
        ).stdout.strip()
    )
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        dest.parent,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return WheelVenv(dest, site)
