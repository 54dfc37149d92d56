"""A disk that fills while ``tracerl train`` runs: the run's storage, its SQLite store and its artifacts on a real
16 MiB tmpfs (mounted here: needs root), filled as soon as the command prints step 1. The user's view is the test: exit
28, the last line names the full disk and says how the run's status reaches the store, a short output (no traceback,
none of MLflow's "SQLAlchemy database error" logs), and once space is back ``tracerl sync`` leaves the store with
the run FAILED, not RUNNING.

A real ``tracerl train`` process (in-process cluster, the smoke config for 3 steps): the fill happens from outside,
as a user's disk fills, at whatever point of step 2 the process has reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, UNHURRIED, fill_disk, run_tracerl, small_tmpfs

SMOKE = str(ROOT / "conf" / "train" / "smoke.yaml")
HABIT = ROOT / "models" / "tiny-math-habit"
MAX_LINES = 20  # what the command may print in all on this fault (it printed 113 lines, 2 tracebacks, before)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (needs root: mount), unmounted at the end."""
    with small_tmpfs(tmp_path / "disk", 16) as mnt:
        yield mnt


def test_a_disk_that_fills_mid_run_is_one_line_and_exit_28(disk: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{disk}/m.db"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'platform'}"}
    cmd = [
        sys.executable,
        "-m",
        "tracerl.workflows.cli",
        "train",
        "--config",
        SMOKE,
        f"model.path={HABIT}",
        "cluster=inprocess",
        "steps=3",
        "checkpoint_every=1",
        "eval_at_start=false",
        f"tracking.uri={uri}",
        f"tracking.artifact_location={disk}/art",
        f"out_dir={disk}/runs",
        *UNHURRIED,
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines, filled = [], False
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if not filled and line.startswith("step 1/3"):
            fill_disk(disk)
            filled = True
    assert proc.wait(timeout=600) == 28, "\n".join(lines)
    assert filled
    last = lines[-1]
    assert last.startswith(f"tracerl: no space left on device at {disk}/"), last
    assert ": free space or point out_dir/tracking.uri elsewhere" in last
    assert len(lines) <= MAX_LINES, "\n".join(lines)
    assert not any("Traceback" in ln or "SQLAlchemy" in ln or "sqlite3." in ln for ln in lines), "\n".join(
        lines
    )
    assert sum(ln.startswith("tracerl: ") for ln in lines) == 1

    (disk / "filler").unlink()  # space is back
    import mlflow

    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run_id = run.info.run_id
    if "tracerl sync" in last:  # the store could not take the status: the line says how it gets there
        assert f"`tracerl sync {run_id} --tracking-uri {uri}` records it" in last
        assert run.info.status == "RUNNING"
        sync = run_tracerl("sync", run_id, "--tracking-uri", uri, cwd=tmp_path, env=env)
        assert sync.returncode == 0, sync.stderr
        assert sync.stdout.strip().endswith("status FAILED recorded")
    assert client.get_run(run_id).info.status == "FAILED"
