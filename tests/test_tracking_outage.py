"""A tracking server that goes away mid-run and stays away past the run's end: the run waits a bounded time, leaves
the run RUNNING (never FINISHED with steps missing), exits 75 with the one command that delivers the metrics, and
``tracerl sync RUN`` then sends every step's metrics exactly once, and the final status after them.

A real ``mlflow server`` on loopback, killed (SIGKILL) as the run's second step begins and restarted on the same
port and store after the command has ended. The run is in-process (no Ray): the same loop, driver and spool as a
Ray run, and the step at which the server dies is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, UNHURRIED
from tracerl import metrics as M
from workflows.cli.app import main
from workflows.train.chaos import MlflowServer

SMOKE = str(ROOT / "conf" / "train" / "smoke.yaml")
HABIT = ROOT / "models" / "tiny-math-habit"
STEPS = 3


def test_metrics_spooled_past_the_end_of_a_run_reach_the_store_once_by_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    from workflows.train import loop as loop_module

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
    argv = [
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
        "tracking.flush_timeout_s=2",
        f"out_dir={tmp_path}/runs",
        *UNHURRIED,
    ]
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


def test_a_full_store_is_not_called_an_unreachable_server(tmp_path: Path) -> None:
    """Artifacts the store refuses for lack of space are kept, and the line says the store is full."""
    import errno

    from workflows.tracking.spool import ARTIFACTS, MetricLog

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
