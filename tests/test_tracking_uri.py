"""Where runs go: tracking.uri when set, else $MLFLOW_TRACKING_URI (the k8s manifests set it), else
sqlite:///mlruns.db; commands say which at start, and a run's saved config names the store it used."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tracerl.config import TrackingConfig, TrainConfig
from tracerl.config_loader import compose, conf_dir, to_yaml
from tracerl.workflows.cli.app import main
from tracerl.workflows.tracking.store import resolve_uri, resolved, where
from tracerl.workflows.train.run import resolve_paths


def test_config_beats_the_environment_which_beats_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_uri(None) == "sqlite:///mlruns.db"
    assert where(TrackingConfig()) == (
        "MLflow tracking at sqlite:///mlruns.db (from the default; set tracking.uri or "
        "$MLFLOW_TRACKING_URI to change it)"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "  ")  # empty counts as unset
    assert resolve_uri(None) == "sqlite:///mlruns.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.tracerl.svc:5000")
    assert resolved(TrackingConfig()).uri == "http://mlflow.tracerl.svc:5000"
    assert (
        where(TrackingConfig())
        == "MLflow tracking at http://mlflow.tracerl.svc:5000 (from $MLFLOW_TRACKING_URI)"
    )
    assert resolve_uri("sqlite:///other.db") == "sqlite:///other.db"
    assert (
        where(TrackingConfig(uri="sqlite:///other.db"))
        == "MLflow tracking at sqlite:///other.db (from tracking.uri)"
    )
    assert where(TrackingConfig(enabled=False)) == "MLflow tracking is off (tracking.enabled=false)"


def test_shipped_configs_leave_the_uri_unset_and_saved_configs_keep_theirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    cfg = compose(TrainConfig, conf_dir() / "train" / "smoke.yaml", [])
    assert cfg.tracking.uri is None  # conf/tracking/sqlite.yaml: unset, so the environment can choose
    # The config saved with a run holds the resolved, absolute URI ...
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(resolve_paths(cfg)))
    assert compose(TrainConfig, saved, []).tracking.uri == f"sqlite:///{tmp_path}/env.db"
    # ... and a config saved before the URI could be unset resumes against its own store, whatever the environment.
    old = tmp_path / "old.yaml"
    old.write_text(
        to_yaml(dataclasses.replace(cfg, tracking=TrackingConfig(uri="sqlite:////srv/old/mlruns.db")))
    )
    assert resolve_paths(compose(TrainConfig, old, [])).tracking.uri == "sqlite:////srv/old/mlruns.db"


def test_a_command_logs_to_the_store_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracerl bench allocation` (no Ray with one worker) with only MLFLOW_TRACKING_URI set: its runs are in that
    SQLite store, no mlruns.db appears in the working directory, and the first line says where runs go."""
    import mlflow

    env_uri = f"sqlite:///{tmp_path}/from_env.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env_uri)
    monkeypatch.chdir(tmp_path)
    args = [
        "bench",
        "allocation",
        "--steps",
        "2",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "out"),
        "allocators=[grpo,trace]",
        "noise_scales=[1.0]",
        "noise_allocators=[grpo]",
        "noise_seeds=1",
        "env.simulator.num_prompts=200",
        f"tracking.artifact_location={tmp_path}/art",
        "tracking.experiment=env-uri",
    ]
    assert main(args) == 0
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == f"MLflow tracking at {env_uri} (from $MLFLOW_TRACKING_URI)"
    assert f"2 runs in experiment 'env-uri' at {env_uri}" in out.out
    assert (tmp_path / "from_env.db").is_file() and not (tmp_path / "mlruns.db").exists()
    runs = mlflow.MlflowClient(tracking_uri=env_uri).search_runs(
        [mlflow.MlflowClient(tracking_uri=env_uri).get_experiment_by_name("env-uri").experiment_id]
    )
    assert sorted(r.data.tags["allocator"] for r in runs) == ["grpo", "trace"]
