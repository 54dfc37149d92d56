"""The chaos drill and its exactly-once metrics: the spool and the readers on a real SQLite MLflow store, then a
smoke-sized drill (`tracerl train --config conf/train/chaos.yaml`, fewer steps and kills, streaming steps) with
real SIGKILLs of sampler, environment and Ray Train worker processes and a real `mlflow server` killed and started
again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tracerl.workflows.cli.app import main

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

CHAOS = str(ROOT / "conf" / "train" / "chaos.yaml")


class FakeOutage:
    """A fake for the test of the spool: a real MlflowClient whose log calls fail while ``down``."""

    def __init__(self, client: Any) -> None:
        self.client, self.down, self.batches = client, False, 0

    def log_batch(self, run_id: str, metrics: Any) -> None:
        if self.down:
            raise ConnectionError("tracking server unreachable")
        self.batches += 1
        self.client.log_batch(run_id, metrics=metrics)

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str) -> None:
        if self.down:
            raise ConnectionError("tracking server unreachable")
        self.client.log_artifacts(run_id, local_dir, artifact_path)


@pytest.fixture
def store(tmp_path: Path) -> tuple[Any, str]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns.db")
    client = mlflow.MlflowClient()
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    return client, client.create_run(exp).info.run_id


def test_spooled_metrics_arrive_once_and_the_last_attempt_wins(
    store: tuple[Any, str], tmp_path: Path
) -> None:
    from tracerl.workflows.experiments.chaos import check_steps
    from tracerl.workflows.tracking.runs import metric_series
    from tracerl.workflows.tracking.spool import MetricLog, next_attempt, spooled_records

    client, run_id = store
    storage = tmp_path / "run"
    storage.mkdir()
    fake = FakeOutage(client)
    first = MetricLog(fake, run_id, storage, next_attempt(storage), fail_fast=False)
    assert first.attempt == 1
    assert first.log({"train/loss": 1.0, "system/attempt": 1}, 1)
    fake.down = True
    assert not first.log(
        {"train/loss": 2.0, "system/attempt": 1, "x": float("nan")}, 2
    )  # spooled, NaN dropped
    (storage / "t").mkdir()
    (storage / "t" / "a.txt").write_text("tree")
    first.log_artifacts(storage / "t", "trees/step_00002")
    assert [(r["key"], r["step"], r["attempt"]) for r in spooled_records(storage)] == [
        ("train/loss", 2, 1),
        ("system/attempt", 2, 1),
    ]
    # the trainer dies; the restarted attempt re-runs step 2 while the server is still down, then it comes back
    second = MetricLog(fake, run_id, storage, next_attempt(storage), fail_fast=False)
    assert second.attempt == 2
    assert not second.log({"train/loss": 3.0, "system/attempt": 2}, 2)
    fake.down = False
    assert second.log({"train/loss": 4.0, "system/attempt": 2}, 3)  # sends the spool first, then this step
    assert metric_series(client, run_id, "train/loss") == {1: 1.0, 2: 3.0, 3: 4.0}
    assert metric_series(client, run_id, "system/attempt") == {1: 1.0, 2: 2.0, 3: 2.0}
    assert [a.path for a in client.list_artifacts(run_id, "trees/step_00002")] == ["trees/step_00002/a.txt"]
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.value for m in history) == [
        1.0,
        2.0,
        3.0,
        4.0,
    ]  # every attempt's value is kept, read once
    sent = fake.batches
    assert (
        MetricLog(fake, run_id, storage, 0, fail_fast=False).flush() and fake.batches == sent
    )  # nothing left to send
    # a re-send of everything (a crash between sending and recording the offset) leaves one row per record
    (storage / "metrics_spool.sent").write_text("0")
    assert MetricLog(fake, run_id, storage, 0, fail_fast=False).flush()
    assert sorted(m.value for m in client.get_metric_history(run_id, "train/loss")) == [1.0, 2.0, 3.0, 4.0]
    assert check_steps(client, run_id, 3) == []


def test_a_restarted_attempt_outranks_the_last_one_on_a_stopped_or_slow_clock(
    store: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both attempts log step 2 within one millisecond (a fast restart), then the third on a clock an hour behind:
    the last attempt's value is still the one read."""
    from tracerl.workflows.experiments.chaos import check_steps
    from tracerl.workflows.tracking.runs import metric_series
    from tracerl.workflows.tracking.spool import MetricLog, next_attempt

    client, run_id = store
    storage = tmp_path / "run"
    storage.mkdir()
    monkeypatch.setattr("tracerl.workflows.tracking.spool.time.time", lambda: 1_700_000_000.0)
    first = MetricLog(client, run_id, storage, next_attempt(storage), fail_fast=False)
    assert first.log({"train/loss": 1.0, "system/attempt": 1}, 1)
    assert first.log({"train/loss": 2.0, "system/attempt": 1}, 2)
    second = MetricLog(client, run_id, storage, next_attempt(storage), fail_fast=False)
    assert second.log({"train/loss": 3.0, "system/attempt": 2}, 2)
    monkeypatch.setattr("tracerl.workflows.tracking.spool.time.time", lambda: 1_700_000_000.0 - 3600)
    third = MetricLog(client, run_id, storage, next_attempt(storage), fail_fast=False)
    assert third.log({"train/loss": 5.0, "system/attempt": 3}, 2)
    assert third.log({"train/loss": 6.0, "system/attempt": 3}, 3)
    assert metric_series(client, run_id, "train/loss") == {1: 1.0, 2: 5.0, 3: 6.0}
    stamps = [m.timestamp for m in client.get_metric_history(run_id, "train/loss")]
    assert len(set(stamps)) == 5 and max(stamps) == 1_700_000_000_000 + 4
    assert check_steps(client, run_id, 3) == []


def test_a_reader_that_took_an_older_attempt_is_caught(store: tuple[Any, str]) -> None:
    from mlflow.entities import Metric

    from tracerl.workflows.experiments.chaos import check_steps

    client, run_id = store
    client.log_batch(
        run_id, metrics=[Metric("system/attempt", 2, 1000, 1), Metric("train/loss", 5.0, 1000, 1)]
    )
    # an older attempt's value delivered with a newer timestamp (what keeping the original timestamp prevents)
    client.log_batch(
        run_id, metrics=[Metric("system/attempt", 1, 2000, 1), Metric("train/loss", 9.0, 2000, 1)]
    )
    assert check_steps(client, run_id, 1) == [
        "system/attempt step 1: read 1.0, the completing attempt logged [2.0]",
        "train/loss step 1: read 9.0, the completing attempt logged [5.0]",
    ]


@pytest.fixture(scope="module")
def drill(tiny_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("chaos")
    # 3 steps with evaluation and a checkpoint at every step, so each kill's target phase comes round soon. In
    # streaming mode: a sampler killed mid-stream is replaced inside the step (actors/stream_pool.py); the barrier
    # step's recovery from killed samplers, environments and trainer is tests/test_train.py's run.
    rc = main(
        [
            "train",
            "--config",
            CHAOS,
            f"model.path={tiny_policy}",
            f"tracking.artifact_location={tmp}/art",
            "--out",
            str(tmp / "runs"),
            "steps=3",
            "eval_every=1",
            "checkpoint_every=1",
            "log_trees_every=0",
            "env.math.eval_tasks=4",
            "chaos.actor_kills=4",
            "chaos.min_gap_s=0.2",
            "chaos.max_gap_s=1.5",
            "chaos.server_down_s=1",
            "pipeline.mode=streaming",
        ]
    )
    (report,) = [json.loads(p.read_text()) for p in (tmp / "runs").glob("*/chaos.json")]
    (db,) = (tmp / "runs").glob("*.mlflow/mlflow.db")
    return {"rc": rc, "report": report, "db": db, "storage": next((tmp / "runs").glob("*/chaos.json")).parent}


def test_the_drill_run_survives_every_kill_and_reads_one_value_per_step(drill: dict[str, Any]) -> None:
    import mlflow

    from tracerl.config import TrackingConfig
    from tracerl.workflows.experiments.chaos import check_steps
    from tracerl.workflows.tracking.compare import collect
    from tracerl.workflows.tracking.runs import latest_checkpoint, metric_series, run_summary
    from tracerl.workflows.tracking.spool import spooled_records

    rep = drill["report"]
    assert drill["rc"] == 0, rep
    assert rep["kills"] == {"sampler": 2, "env": 2, "trainer": 1, "server": 1}, rep["events"]
    assert (
        rep["status"] == "FINISHED" and rep["steps"] == 4
    )  # 3 steps, then one more resumed from the final checkpoint
    mlflow.set_tracking_uri(f"sqlite:///{drill['db']}")  # the drill's server is gone; its store stays
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    # one value per step for every per-step metric, the completing attempt's, in every reader
    assert check_steps(client, run_id, 4) == []
    attempt = metric_series(client, run_id, "system/attempt")
    assert (
        sorted(attempt) == [1, 2, 3, 4] and attempt[4] == rep["attempts"] >= 3
    )  # first, after the kill, resume
    er = metric_series(client, run_id, "rollout/effective_ratio")
    assert run_summary(run_id, TrackingConfig(uri=f"sqlite:///{drill['db']}"))["steps"] == 4
    assert collect(client, [run])[0]["series"]["effective_ratio"] == er
    # everything spooled while the server was down arrived, with the timestamp it was made with
    spooled = spooled_records(drill["storage"])
    assert spooled and rep["spooled"] == len(spooled)
    for r in spooled:
        assert any(
            m.step == r["step"] and m.timestamp == r["timestamp"] and m.value == r["value"]
            for m in client.get_metric_history(run_id, r["key"])
        ), r
    # every sampler kill that hit a step the run kept is counted as a retry
    kept = [
        e
        for e in rep["events"]
        if e["kind"] == "sampler"
        and 1 <= e["step"] < 4
        and attempt.get(e["step"]) == e["attempt"] == attempt.get(e["step"] + 1)
    ]
    assert sum(metric_series(client, run_id, "budget/retried").values()) >= len(kept)
    ckpt = latest_checkpoint(drill["storage"])
    assert ckpt is not None and json.loads((ckpt / "state.json").read_text())["step"] == 4
