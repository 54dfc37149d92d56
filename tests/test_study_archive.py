"""workflows/study/archive.py on real SQLite MLflow stores: a finished run written to a file and recreated in
another store with the same tags, params, metric histories (steps and timestamps) and small artifacts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tracerl.workflows.study.archive import ARCHIVED_TAG, MAX_ARTIFACT_BYTES, export_finished, import_archive


def _store(path: Path) -> tuple[object, str, str]:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{path}/mlruns.db")
    exp = client.create_experiment("study", artifact_location=str(path / "art"))
    parent = client.create_run(exp, run_name="curves").info.run_id
    return client, exp, parent


def test_a_finished_run_round_trips_through_the_archive(tmp_path: Path) -> None:
    from mlflow.entities import Metric

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    client, exp, parent = _store(tmp_path / "a")
    tags = {"mlflow.parentRunId": parent, "tracerl.study.testbed": "math-late"}
    rid = client.create_run(exp, run_name="cell grpo/s0", tags=tags, start_time=1_000).info.run_id
    client.log_param(rid, "stop.tokens", 400)
    client.log_batch(rid, metrics=[Metric("eval/accuracy", 0.1 * k, 5_000 + k, 100 * k) for k in range(3)])
    src = tmp_path / "src"
    (src / "curve").mkdir(parents=True)
    (src / "curve" / "curve.jsonl").write_text('{"generated_tokens": 100}\n')
    (src / "big.bin").write_text("x" * (MAX_ARTIFACT_BYTES + 1))
    client.log_artifact(rid, str(src / "curve" / "curve.jsonl"), "curve")
    client.log_artifact(rid, str(src / "big.bin"))
    client.set_terminated(rid, status="FINISHED", end_time=9_000)
    cut = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id  # RUNNING: not archived
    arch = tmp_path / "archive"

    (path,) = export_finished(client, exp, parent, arch)
    assert path.name == f"cell_grpo_s0-{rid}.json.gz"
    rec = json.loads(gzip.decompress(path.read_bytes()))
    assert rec["skipped_artifacts"] == ["big.bin"] and list(rec["artifacts"]) == ["curve/curve.jsonl"]
    assert export_finished(client, exp, parent, arch) == []  # once only
    first_bytes = path.read_bytes()
    path.unlink()
    export_finished(client, exp, parent, arch)
    assert path.read_bytes() == first_bytes  # the same run gives the same file

    other, exp2, parent2 = _store(tmp_path / "b")
    (new,) = import_archive(other, exp2, parent2, arch)
    assert import_archive(other, exp2, parent2, arch) == []  # held already
    run = other.get_run(new)
    assert run.info.status == "FINISHED" and (run.info.start_time, run.info.end_time) == (1_000, 9_000)
    assert run.info.run_name == "cell grpo/s0"
    assert run.data.tags["mlflow.parentRunId"] == parent2 and run.data.tags[ARCHIVED_TAG] == rid
    assert run.data.tags["tracerl.study.testbed"] == "math-late" and run.data.params == {"stop.tokens": "400"}
    hist = [(m.step, m.timestamp, m.value) for m in other.get_metric_history(new, "eval/accuracy")]
    assert hist == [(100 * k, 5_000 + k, pytest.approx(0.1 * k)) for k in range(3)]
    local = other.download_artifacts(new, "curve/curve.jsonl", str(tmp_path / "dl"))
    assert Path(local).read_text() == '{"generated_tokens": 100}\n'
    assert export_finished(other, exp2, parent2, arch) == []  # a restored run counts under its original id
    assert cut not in {p.name for p in arch.iterdir()}


def test_a_file_that_is_not_an_archived_run_is_named(tmp_path: Path) -> None:
    client, exp, parent = _store(tmp_path)
    arch = tmp_path / "archive"
    arch.mkdir()
    (arch / "notes-abc.json.gz").write_bytes(b"not gzip")
    with pytest.raises(
        ValueError, match=r"notes-abc\.json\.gz: not a study archive file .*remove it or re-export"
    ):
        import_archive(client, exp, parent, arch)
