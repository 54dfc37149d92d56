"""``tracerl train`` with ``cluster.address=inprocess`` (no Ray): what the mode refuses, a failure that ends the run
FAILED with what it logged kept, a resume of that run in-process from its checkpoint, and a restart in-process
(``max_failures``) that repeats the resumed run's step. The trees the mode trains against the Ray mode's:
tests/test_step_limit.py.

The runs here are in this process, so a failure is injected by replacing ``train_step`` for one call (the mode has
no actor to kill: ``faults.*`` are refused).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FRESH_CLI, ROOT, UNHURRIED, sqlite_client
from tracerl import metrics as M
from tracerl.workflows.cli.app import main

SMOKE = str(ROOT / "conf" / "train" / "smoke.yaml")
HABIT = ROOT / "models" / "tiny-math-habit"
SEED = 1
"""tests/test_train.py's seed with HABIT: its smoke steps hold mixed groups, so updates change the policy."""


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("trainer.num_workers=2", "trainer.num_workers=2: set it to 1"),
        ("trainer.use_gpu=true", "set trainer.use_gpu=false"),
        ("pools.rollout_gpus=0.5", "set pools.rollout_gpus=0"),
        ("sampler=vllm", "sampler.backend=vllm: its engine runs in a sampler actor; set sampler=hf"),
        ("chaos.enabled=true", "set chaos.enabled=false"),
        ("faults.kill_trainer_at_step=1", "faults.kill_*_at_step"),
    ],
)
def test_the_mode_refuses_what_needs_more_than_one_process(
    override: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "train", "cluster=inprocess", override]) == 2
    err = capsys.readouterr().err
    assert "cluster.address=inprocess runs in one process" in err and says in err
    assert "or use cluster.address=local" in err


def test_a_ray_command_refuses_the_in_process_address() -> None:
    from tracerl.config import ClusterConfig
    from tracerl.models.hf import SetupError
    from tracerl.workflows.ops.ray_utils import init_ray

    with pytest.raises(SetupError, match="set cluster.address=local"):
        init_ray(ClusterConfig(address="inprocess"))


def _args(tmp: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--config",
        SMOKE,
        f"model.path={HABIT}",
        f"seed={SEED}",
        "cluster=inprocess",
        "steps=3",
        "checkpoint_every=1",
        "keep_checkpoints=1",
        "eval_at_start=false",
        "eval_at_end=false",
        "env.math.eval_tasks=4",
        f"tracking.uri=sqlite:///{tmp}/mlruns.db",
        f"tracking.artifact_location={tmp}/art",
        *UNHURRIED,
        "--out",
        str(tmp / "runs"),
        *extra,
    ]


def _fail_once_at(monkeypatch: pytest.MonkeyPatch, at: int) -> list[int]:
    """``train_step`` raises once, as step ``at`` (0-based) begins; returns the steps begun (the record)."""
    from tracerl.workflows.train import loop as run_module

    real, begun = run_module.train_step, []

    def train_step(step: int, *args: Any, **kwargs: Any) -> Any:
        begun.append(step)
        if step == at and begun.count(at) == 1:
            raise RuntimeError(f"injected failure at step {step}")
        return real(step, *args, **kwargs)

    monkeypatch.setattr(run_module, "train_step", train_step)
    return begun


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run that fails as its second step begins, with no restart (max_failures=0), then resumed in-process."""
    from tracerl.config import TrackingConfig
    from tracerl.workflows.tracking.runs import metric_series, run_storage

    tmp = tmp_path_factory.mktemp("inprocess")
    from tracerl.workflows.train.fit import TrainingFailed

    with (
        pytest.MonkeyPatch.context() as mp,
        pytest.raises(TrainingFailed, match="injected failure at step 1"),
    ):
        _fail_once_at(mp, 1)
        main(_args(tmp, "max_failures=0"))  # a bug, not a user error: it keeps its traceback
    collecting = {
        "after the failure": gc.isenabled()
    }  # train() turns the collector off for its start-up only
    client = sqlite_client(tmp)
    (r,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    rid = r.info.run_id
    storage = run_storage(rid, TrackingConfig(uri=f"sqlite:///{tmp}/mlruns.db"))
    out: dict[str, Any] = {"tmp": tmp, "run_id": rid, "status": r.info.status}
    out["before"] = {k: metric_series(client, rid, k) for k in (M.LEAVES, M.GENERATED_TOKENS, M.LOSS)}
    out["checkpoints"] = sorted(p.name for p in storage.glob("checkpoint_*") if p.is_dir())
    assert main([*_args(tmp), f"resume={rid}"]) == 0
    collecting["after the resumed run"] = gc.isenabled()
    out["collecting"] = collecting
    out["after"] = {k: metric_series(client, rid, k) for k in (M.LEAVES, M.GENERATED_TOKENS, M.LOSS)}
    out["resumed_status"] = client.get_run(rid).info.status
    out["kept"] = sorted(p.name for p in storage.glob("checkpoint_*") if p.is_dir())
    out["state"] = json.loads((storage / "checkpoint_000003" / "state.json").read_text())
    return out


def test_a_failure_ends_the_run_failed_with_its_metrics_and_checkpoint(failed: dict[str, Any]) -> None:
    assert failed["status"] == "FAILED"
    assert failed["before"][M.LEAVES] == {1: 15.0}  # step 1 was logged before step 2 failed, and kept
    assert failed["before"][M.GENERATED_TOKENS][1] > 0
    assert failed["checkpoints"] == ["checkpoint_000001"]


def test_the_collector_is_on_after_a_run_that_failed_and_one_that_finished(failed: dict[str, Any]) -> None:
    assert failed["collecting"] == {"after the failure": True, "after the resumed run": True}


def test_resume_in_process_continues_the_run_from_its_checkpoint(failed: dict[str, Any]) -> None:
    assert failed["resumed_status"] == "FINISHED"
    assert failed["after"][M.LEAVES] == {1: 15.0, 2: 15.0, 3: 15.0}
    assert failed["after"][M.GENERATED_TOKENS][1] == failed["before"][M.GENERATED_TOKENS][1]
    assert failed["kept"] == ["checkpoint_000003"]  # keep_checkpoints=1: the older ones removed
    assert failed["state"]["step"] == 3


def test_a_restart_in_process_repeats_the_resumed_step(
    failed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same failure with max_failures=1: the loop restarts from checkpoint_000001 in this process and finishes;
    its steps are the failed-then-resumed run's (same tokens, leaves and loss), steps 2 and 3 logged by the second
    attempt."""
    from tracerl.workflows.tracking.runs import metric_series

    begun = _fail_once_at(monkeypatch, 1)
    assert main(_args(tmp_path, "max_failures=1")) == 0
    assert begun == [0, 1, 1, 2]
    client = sqlite_client(tmp_path)
    (r,) = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    assert r.info.status == "FINISHED"
    rid = r.info.run_id
    assert metric_series(client, rid, M.ATTEMPT) == {1: 1.0, 2: 2.0, 3: 2.0}
    for key in (M.LEAVES, M.GENERATED_TOKENS, M.LOSS):
        assert metric_series(client, rid, key) == failed["after"][key], key


STUDY = str(ROOT / "conf" / "study" / "smoke.yaml")


@pytest.mark.e2e
def test_a_study_runs_its_baseline_and_cells_in_process(tmp_path: Path) -> None:
    """``tracerl study cluster=inprocess``: the testbed's baseline evaluation and a 1-step cell in the command's own
    process, one after another, no Ray imported; the cell is a FINISHED child of the study's run and starts from
    the baseline's accuracy."""
    import subprocess
    import sys

    args = [
        "study",
        "--config",
        STUDY,
        "--out",
        str(tmp_path / "report"),
        f"tracking.uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracking.artifact_location={tmp_path}/art",
        f"runs_dir={tmp_path}/runs",
        "cluster=inprocess",
        "steps=1",
        "eval_tasks=2",
        "only=allocator=grpo",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_CLI, json.dumps(args)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "ray": []}
    assert "ran 1 cells, skipped 0, failed 0" in proc.stdout
    client = sqlite_client(tmp_path)
    exp = client.get_experiment_by_name("tracerl").experiment_id
    [parent] = client.search_runs([exp], filter_string="tags.`tracerl.command` = 'study'")
    [base] = client.search_runs([exp], filter_string="tags.`tracerl.study.baseline` = 'math-habit'")
    [cell] = client.search_runs([exp], filter_string="tags.`tracerl.study.allocator` = 'grpo'")
    assert parent.info.status == base.info.status == cell.info.status == "FINISHED"
    assert cell.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert cell.data.params["cluster.address"] == "inprocess" and cell.data.metrics[M.LEAVES] > 0


def test_a_study_in_process_runs_one_cell_at_a_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["study", "--config", STUDY, "cluster=inprocess", "parallel_cells=2"]) == 2
    assert (
        "cluster.address=inprocess runs the cells one after another in this process: set parallel_cells=1"
        in (capsys.readouterr().err)
    )
