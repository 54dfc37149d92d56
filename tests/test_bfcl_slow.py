"""BFCL end to end with a real pretrained chat model (slow; outside `make test`: `make test-bfcl-slow`).

SmolLM2-135M-Instruct (`make smollm2` converts it into models/smollm2-135m-instruct) runs `tracerl eval` on
a handful of held-out BFCL tasks and a one-step `tracerl train`. A 135M model solves no BFCL task: these tests
check that the whole path runs (per-task function schemas rendered in the model's chat template, user turns
from the environment, the official checker, the update) and leaves no backend state behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (make install)")
    if not (MODEL / "config.json").exists():
        pytest.skip(f"{MODEL} is missing: run `make smollm2`")
    return MODEL


def test_eval_runs_on_bfcl_tasks(smollm2: Path, tmp_path: Path) -> None:
    from tracerl.workflows.cli.app import main

    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--config",
                str(ROOT / "conf/eval/bfcl_smoke.yaml"),
                "--out",
                str(out),
                f"model.path={smollm2}",
                f"tracking.uri=sqlite:///{tmp_path}/m.db",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    greedy = summary["greedy"]
    assert greedy["tasks"] == 4 and set(greedy["by_source"]) == {
        "bfcl-base",
        "bfcl-miss_func",
        "bfcl-miss_param",
        "bfcl-long_context",
    }
    assert 0.0 <= summary["accuracy"] <= 1.0 and sum(greedy["statuses"].values()) == 4
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(t["rollouts"][0]["turns"] for t in traces)


def test_short_training_run_completes(smollm2: Path, tmp_path: Path) -> None:
    import mlflow

    from tracerl.workflows.cli.app import main

    args = [
        "train",
        "--config",
        str(ROOT / "conf/train/bfcl_smoke.yaml"),
        f"model.path={smollm2}",
        f"tracking.uri=sqlite:///{tmp_path}/m.db",
        f"tracking.artifact_location={tmp_path}/art",
        "--out",
        str(tmp_path / "runs"),
    ]
    assert main(args) == 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    client = mlflow.MlflowClient()
    run = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])[0]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["budget/leaves"] == 6 and "eval/accuracy" in run.data.metrics
