"""A tracking server that goes away mid-run and stays away past the run's end: the run waits a bounded time, leaves
the run RUNNING (never FINISHED with steps missing), exits 75 with the one command that delivers the metrics, and
``tracerl sync RUN`` then sends every step's metrics exactly once, and the final status after them.

A real ``mlflow server`` on loopback, killed (SIGKILL) as the run's second step begins and restarted on the same
port and store after the command has ended. The run is in-process (no Ray): the same loop, driver and spool as a
Ray run, and the step at which the server dies is exact.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, UNHURRIED
from tracerl import metrics as M
from tracerl.workflows.cli.app import main
from tracerl.workflows.experiments.chaos import MlflowServer

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

SMOKE = str(ROOT / "conf" / "train" / "smoke.yaml")
HABIT = ROOT / "models" / "tiny-math-habit"
STEPS = 3


def test_metrics_spooled_past_the_end_of_a_run_reach_the_store_once_by_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    from tracerl.workflows.train import loop as loop_module

    server = MlflowServer(tmp_path / "server")
    server.start()
    real = loop_module.train_step

    def train_step(
        step: int, *args: Any, **kwargs: Any
    ) -> Any:  # the real step; the server dies as step 1 begins
        if step == 1 and server.proc is not None:
            server.kill()
        return real(step, *args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", train_step)
    argv = _argv(server, tmp_path, 2)
    try:
        assert main(argv) == 75
        out = capsys.readouterr()
        last = out.err.strip().splitlines()[-1]
        assert last.startswith("tracerl: ") and last.endswith(f"--tracking-uri {server.uri}` sends them")
        assert "did not take them in 2 s (tracking.flush_timeout_s); the run stays RUNNING" in last
        waits = [
            ln
            for ln in (out.out + out.err).splitlines()
            if "waiting up to 2 s (tracking.flush_timeout_s)" in ln
        ]
        assert len(waits) == 1
        run_id = last.split("metrics of MLflow run ")[1].split()[0]

        server.start()  # back, after the command gave up: same port, same store
        client = MlflowClient(server.uri)
        assert client.get_run(run_id).info.status == "RUNNING"  # not FINISHED with steps missing
        before = client.get_metric_history(run_id, M.LOSS)
        assert len(before) < STEPS

        assert main(["sync", run_id, "--tracking-uri", server.uri]) == 0
        said = capsys.readouterr().out.strip().splitlines()[-1]
        assert said.startswith(f"MLflow run {run_id}: ") and said.endswith(
            " spooled metrics sent, status FINISHED recorded"
        )
        history = client.get_metric_history(run_id, M.LOSS)
        assert sorted(m.step for m in history) == sorted({m.step for m in history}) and len(history) == STEPS
        assert client.get_run(run_id).info.status == "FINISHED"

        assert main(["sync", run_id, "--tracking-uri", server.uri]) == 0  # again: nothing twice
        assert (
            capsys.readouterr()
            .out.strip()
            .endswith(f"MLflow run {run_id}: 0 spooled metrics sent, no final status was waiting")
        )
        assert len(client.get_metric_history(run_id, M.LOSS)) == STEPS
    finally:
        server.kill()


def _argv(server: MlflowServer, tmp_path: Path, flush_timeout_s: float) -> list[str]:
    return [
        "train",
        "--config",
        SMOKE,
        f"model.path={HABIT}",
        "cluster=inprocess",
        f"steps={STEPS}",
        "checkpoint_every=1",
        "keep_checkpoints=1",
        "eval_at_start=false",
        "eval_at_end=false",
        f"tracking.uri={server.uri}",
        f"tracking.flush_timeout_s={flush_timeout_s:g}",
        f"out_dir={tmp_path}/runs",
        *UNHURRIED,
    ]


def _kill_after_probe(
    server: MlflowServer, monkeypatch: pytest.MonkeyPatch, back_after_s: float | None
) -> None:
    """The server passes the start-up probe, then dies before the experiment is looked up (and, with
    ``back_after_s``, starts again that many seconds later, on the same port and store)."""
    from tracerl.workflows.tracking import store

    real = store.check_reachable

    def check_reachable(uri: str) -> None:
        real(uri)
        if server.proc is not None and not getattr(server, "killed_once", False):
            server.killed_once = True  # type: ignore[attr-defined]
            server.kill()
            if back_after_s is not None:
                threading.Timer(back_after_s, server.start).start()

    monkeypatch.setattr(store, "check_reachable", check_reachable)


def test_a_server_restarting_as_the_run_starts_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed right after the probe and back a few seconds later: the run waits (one line), then runs whole."""
    from mlflow import MlflowClient

    server = MlflowServer(tmp_path / "server")
    server.start()
    _kill_after_probe(server, monkeypatch, back_after_s=3)
    try:
        assert main(_argv(server, tmp_path, 600)) == 0
        out = capsys.readouterr()
        said = (out.out + out.err).splitlines()
        waits = [ln for ln in said if "stopped answering (the experiment): waiting up to 600 s" in ln]
        assert len(waits) == 1 and sum("answers again (the experiment)" in ln for ln in said) == 1
        assert not any(ln.startswith("tracerl: ") for ln in said)
        client = MlflowClient(server.uri)
        (run,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
        assert run.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, M.LOSS)) == [1, 2, 3]
    finally:
        server.kill()


def test_a_server_gone_for_good_at_start_up_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed right after the probe and not back within tracking.flush_timeout_s: one line, exit 2, no run."""
    server = MlflowServer(tmp_path / "server")
    server.start()
    _kill_after_probe(server, monkeypatch, back_after_s=None)
    assert main(_argv(server, tmp_path, 2)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "stopped answering (the experiment): waiting up to 2 s" in err[1]  # [0]: where
    assert err[-1].startswith(f"tracerl: tracking server {server.uri}: no answer for ")
    assert "(the experiment; tracking.flush_timeout_s=2); start it again or raise" in err[-1]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_server_gone_from_the_run_s_creation_past_its_end_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An outage covering the whole run (from just after the run exists until after the command ended): every step
    spooled, exit 75 with the sync command, and after `tracerl sync` every step's metrics once, then FINISHED."""
    from mlflow import MlflowClient

    from tracerl.workflows.train import run as run_module

    server = MlflowServer(tmp_path / "server")
    server.start()
    real = run_module.create_run

    def create_run(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        server.kill()
        return made

    monkeypatch.setattr(run_module, "create_run", create_run)
    try:
        assert main(_argv(server, tmp_path, 2)) == 75
        out = capsys.readouterr()
        last = out.err.strip().splitlines()[-1]
        assert last.startswith("tracerl: ") and last.endswith(f"--tracking-uri {server.uri}` sends them")
        assert not [ln for ln in out.err.splitlines() if "Traceback" in ln]
        run_id = last.split("metrics of MLflow run ")[1].split()[0]
        server.start()
        client = MlflowClient(server.uri)
        assert client.get_run(run_id).info.status == "RUNNING"
        assert client.get_metric_history(run_id, M.LOSS) == []
        assert main(["sync", run_id, "--tracking-uri", server.uri]) == 0
        assert capsys.readouterr().out.strip().endswith(" spooled metrics sent, status FINISHED recorded")
        assert sorted(m.step for m in client.get_metric_history(run_id, M.LOSS)) == [1, 2, 3]
        assert client.get_run(run_id).info.status == "FINISHED"
    finally:
        server.kill()


def test_unreachable_is_an_absent_server_only() -> None:
    """A refused connection through MLflow's real REST client is an absent server; an answer that refuses the
    request, and a full disk, are not."""
    import errno
    import socket

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tracerl.workflows.tracking.outage import unreachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        with pytest.raises(MlflowException) as refused:
            MlflowClient(f"http://127.0.0.1:{port}").get_experiment("0")
    assert unreachable(refused.value)
    assert not unreachable(MlflowException("API request to endpoint /x failed with error code 404 != 200"))
    assert not unreachable(OSError(errno.ENOSPC, "No space left on device", "/m.db"))


def test_a_full_store_is_not_called_an_unreachable_server(tmp_path: Path) -> None:
    """Artifacts the store refuses for lack of space are kept, and the line says the store is full."""
    import errno

    from tracerl.workflows.tracking.spool import ARTIFACTS, MetricLog

    class FakeFullStore:  # a fake MLflow client whose artifact store is out of space
        def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str) -> None:
            raise OSError(errno.ENOSPC, "No space left on device", "/art/x")

    said: list[str] = []
    src = tmp_path / "eval"
    src.mkdir()
    (src / "a.json").write_text("{}")
    MetricLog(FakeFullStore(), "r", tmp_path, 1, said.append).log_artifacts(src, "eval")
    assert said == ["tracking store full (OSError): artifacts eval kept for later"]
    assert (tmp_path / ARTIFACTS / "eval" / "a.json").read_text() == "{}"
