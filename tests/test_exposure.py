"""What the one-machine modes listen on (issue 43, item 6): the embedded Ray of ``cluster: local``, the in-process
mode and ``tracerl ui`` open listening sockets on loopback only, watched for the whole of a real smoke run.

The two-node cluster's sockets beyond loopback, and that each refuses a client without Ray's token, are checked in
tests/test_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import ROOT, WAIT_LIMIT_S, stop_process
from tests.net_exposure import Listener, Watch, answer_without_token, listening, tree

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

SMOKE = str(ROOT / "conf" / "train" / "smoke.yaml")


def _shell_env() -> dict[str, str]:
    """As from a new shell: no Ray or MLflow address an earlier test of this lane set; token auth as Ray's default
    for a new embedded cluster (on)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}


def _tracerl(out: IO[str], *args: str) -> subprocess.Popen[str]:
    """``tracerl ARGS`` in a fresh process and session, as from a new shell, its output (stderr too) into ``out``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tracerl.workflows.cli.app", *args],
        cwd=ROOT,
        env=_shell_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _watched_run(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], set[Listener]]:
    """``tracerl train`` on the smoke config (one step, a 2-task last evaluation) in a fresh process, with every
    listening socket of its process tree collected while it ran."""
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = _tracerl(
            out,
            "train",
            "--config",
            SMOKE,
            "--steps",
            "1",
            "eval_at_start=false",
            "env.math.eval_tasks=2",
            f"out_dir={tmp_path / 'runs'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
            f"tracking.artifact_location={tmp_path / 'mlartifacts'}",
            *overrides,
        )
        watch = Watch(proc.pid)
        try:
            rc = proc.wait(timeout=1200)
        finally:
            seen = watch.stop()
            if proc.poll() is None:
                stop_process(proc, group=True)  # type: ignore[arg-type]
    return subprocess.CompletedProcess(proc.args, rc, log.read_text(), ""), seen


def test_the_embedded_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    """Every service of the embedded Ray (GCS, raylet, agents, the driver's and the actors' and Train workers'
    RPC servers, the metrics exporter) bound 127.0.0.1 for the whole run; before the fix the GCS, the raylet and
    the workers bound all interfaces and the metrics exporter answered anyone without the token (issue 43)."""
    res, seen = _watched_run(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:]
    names = {s.name for s in seen}
    assert {"gcs_server", "raylet"} <= names, sorted(map(str, seen))  # the watch saw Ray's own services
    assert any(n.startswith("ray::") for n in names), sorted(map(str, seen))  # and its actors' or workers'
    # The one exception, torch's and not Ray's: rank 0 of the Train worker group hosts the process group's
    # rendezvous store (c10d TCPStore, the MASTER_PORT Ray Train picks), which binds all interfaces and has no
    # bind-address setting (docs/reliability.md, "What a cluster exposes").
    # (named by its command line, or by /proc's 15-character comm "ray::RayTrainWo" when that was unreadable; while
    # the worker runs one of Train's torch set-up or shut-down calls its title is that call's:
    # "ray::execute._shutdown_torch")
    train = {s.pid for s in seen if s.name.startswith("ray::RayTrainWo")}
    torch_calls = ("ray::RayTrainWo", "ray::execute._setup_torch", "ray::execute._shutdown_torch")
    beyond = sorted(
        str(s) for s in seen if not s.loopback and s.pid not in train and not s.name.startswith(torch_calls)
    )
    assert not beyond, f"listening beyond loopback: {beyond}"
    stores = [s for s in seen if not s.loopback]
    assert len({s.pid for s in stores}) <= 1, sorted(map(str, stores))  # rank 0's, the only rank here


def test_the_in_process_mode_listens_on_loopback_only(tmp_path: Path) -> None:
    res, seen = _watched_run(tmp_path, "cluster=inprocess")
    assert res.returncode == 0, res.stdout[-3000:]
    beyond = sorted(str(s) for s in seen if not s.loopback)
    assert not beyond, f"listening beyond loopback: {beyond}"


def test_the_ui_listens_on_loopback_only(tmp_path: Path) -> None:
    """`tracerl ui` (MLflow's server and the processes it starts) on its default host, while it serves."""
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        proc = _tracerl(
            out, "ui", "--tracking-uri", f"sqlite:///{tmp_path / 'mlruns.db'}", "--port", str(_free_port())
        )
        try:
            from tests.conftest import wait_for

            wait_for(lambda: "MLflow UI on" in log.read_text() or proc.poll() is not None, "the UI's URL")
            assert proc.poll() is None, log.read_text()[-3000:]
            seen = listening(tree(proc.pid))
        finally:
            stop_process(proc, group=True, limit_s=WAIT_LIMIT_S)
    assert seen, "the UI's server was not found listening"
    beyond = sorted(str(s) for s in seen if not s.loopback)
    assert not beyond, f"listening beyond loopback: {beyond}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_plain_http_server_reads_as_open(tmp_path: Path) -> None:
    """The probe does not mistake a server that lets anyone in for a refusal (a real HTTP server on loopback)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port := _free_port())],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from tests.conftest import wait_for

        wait_for(lambda: any(s.port == port for s in listening(tree(proc.pid))), "the HTTP server")
        answer = answer_without_token("127.0.0.1", port)
    finally:
        stop_process(proc)
    assert answer.startswith("open:") and "HTTP GET / -> 200" in answer, answer
