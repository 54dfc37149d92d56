"""The built wheel is the whole package: one top-level name, ``tracerl``, with the shipped configs and tiny
policies inside, so ``tracerl train`` on a shipped config runs from any directory of a fresh environment.

The fresh environment borrows the project venv's third-party packages through a ``.pth`` line (a plain path:
the venv's editable finder for this checkout is not loaded), so nothing is downloaded; the wheel itself is built
from a copy of this checkout's files with ``pip wheel --no-build-isolation`` (the setuptools of the project venv).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, sqlite_client

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

RUN_LIMIT_S = 900


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "OMP_NUM_THREADS": "1"}  # nothing of this checkout's
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S, check=False
    )


def _checkout_copy(dest: Path) -> Path:
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


def test_the_wheel_installs_one_package_that_trains_from_any_directory(tmp_path: Path) -> None:
    src = _checkout_copy(
        tmp_path / "src"
    )  # a build/ left in the checkout would add its stale files to the wheel
    dist = tmp_path / "dist"
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
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tracerl"}  # no envs/, predictors/, workflows/ or conf/ beside it in site-packages
    for inside in (
        "tracerl/workflows/cli/app.py",
        "tracerl/workflows/experiments/commands.py",
        "tracerl/envs/math/env.py",
        "tracerl/predictors/__init__.py",
        "tracerl/share/conf/train/smoke.yaml",
        "tracerl/share/models/tiny-math/config.json",
    ):
        assert inside in names, inside

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
        ).stdout.strip()
    )
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    where = tmp_path / "elsewhere"
    where.mkdir()
    found = _run([str(python), "-c", "import tracerl; print(tracerl.__file__)"], where)
    assert found.stdout.strip().startswith(str(site / "tracerl")), found.stdout + found.stderr
    # the experiments reach the installed CLI as a command family (no entry point needed) and find their profiles
    sim = _run([str(env_dir / "bin" / "tracerl"), "bench", "pipeline", "--sim", "--samplers", "2"], where)
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert [x for x in sim.stdout.split() if x.endswith(("-vllm", "-cpu"))] == [
        "qwen3-8b-h100-vllm",
        "tiny-cpu",
    ]
    smoke = site / "tracerl" / "share" / "conf" / "train" / "smoke.yaml"
    train = _run(
        [
            str(env_dir / "bin" / "tracerl"),  # the console script the wheel installed
            "train",
            "--config",
            str(smoke),
            "--steps",
            "1",
            "cluster=inprocess",
            "eval_at_start=false",
            "eval_at_end=false",
            f"tracking.uri=sqlite:///{where}/mlruns.db",
            f"tracking.artifact_location={where}/art",
            "--out",
            str(where / "runs"),
        ],
        where,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    client = sqlite_client(where)
    (run,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.path"] == str(site / "tracerl" / "share" / "models" / "tiny-math")
    assert (
        len(client.get_metric_history(run.info.run_id, "key/effective_ratio")) == 1
    )  # one step, logged once
