"""`tracerl sweep` (Ray Tune + Optuna) on the smoke sweep, logging over HTTP to a real MLflow server on loopback."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_nodes import mlflow_server as serve_mlflow
from tests.conftest import ROOT, wait_for
from tracerl.workflows.cli.app import main

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)


@pytest.fixture(scope="module", autouse=True)
def long_lived_ray() -> None:
    """The sweeps join a Ray that is up before them and outlives them, as on a cluster (init_ray is a no-op when
    Ray is up). No dashboard: Ray Train's own placement-group cleaner, which needs the State API it serves, cannot
    act here, so a stopped trial's group is gone only if the sweep removes it."""
    from tracerl.config import ClusterConfig
    from tracerl.workflows.ops.ray_utils import init_ray

    init_ray(ClusterConfig(num_cpus=2))


def _reserved_groups() -> dict[str, Any]:
    import ray

    return {k: v for k, v in ray.util.placement_group_table().items() if v["state"] != "REMOVED"}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_mlflow(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_asha_sweep_on_a_server_in_token_mode_stops_a_trailing_trial_and_restores(
    tiny_policy: Path, mlflow_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One sweep checks what two used to (each a few minutes on 2 cores): the smoke sweep over HTTP to a real
    MLflow server in token mode, with ASHA at rung 1. The first trial (15 leaves at step 1) sets the bar; the
    second (6) trails it and is stopped after its first step: its child run keeps what it logged and is marked
    killed, and its Ray Train placement group is released. The same name again restores the finished sweep."""
    import mlflow
    import yaml

    from tracerl.config import BudgetConfig

    conf = yaml.safe_load((ROOT / "conf" / "sweep" / "smoke.yaml").read_text())
    conf.update(
        space={"budget.num_leaves": [15, 6]},
        first_trials=[{"budget.num_leaves": 15}, {"budget.num_leaves": 6}],
        scheduler="asha",
        grace_period=1,
        metric="budget/leaves",
        scope="last",
    )
    (tmp_path / "asha.yaml").write_text(yaml.safe_dump(conf))
    args = [
        "sweep",
        "--config",
        str(tmp_path / "asha.yaml"),
        f"model.path={tiny_policy}",
        f"tracking.uri={mlflow_server}",
        f"out_dir={tmp_path}/runs",
        "--name",
        "asha",
        "budget.token_budget=400",
        # no start evaluation and a 2-task last one (the smoke sweep's are on 24): the sweep ranks by budget/leaves
        "eval_at_start=false",
        "env.math.eval_tasks=2",
    ]
    before = set(_reserved_groups())  # the test session's Ray may hold groups of its own
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "best (budget/leaves" in cap.out and "stopped early" in cap.out
    # The Ray outlives the sweep: the stopped trial's Ray Train placement group was removed by the sweep (Ray
    # Train's own cleaner cannot act here), nothing is left reserved
    # (the removal is asynchronous in Ray's GCS: a loaded machine saw the group still listed right after the sweep)
    wait_for(lambda: set(_reserved_groups()) - before == set(), "the trials' placement groups removed")
    assert "released the Ray Train placement group" in cap.err
    summary = json.loads((tmp_path / "runs" / "sweeps" / "asha.summary.json").read_text())
    by_leaves = {t["config"]["budget.num_leaves"]: t for t in summary["trials"]}
    assert by_leaves[15]["steps"] == 3 and by_leaves[6]["steps"] == 1 and by_leaves[6]["stopped_early"]
    assert summary["best_config"] == {"budget.num_leaves": 15}

    mlflow.set_tracking_uri(mlflow_server)
    client = mlflow.MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("tracerl.command") == "sweep"]
    assert parent.info.status == "FINISHED"
    assert json.loads(parent.data.tags["tracerl.best_config"]) == {"budget.num_leaves": 15}
    children = {
        r.data.params["budget.num_leaves"]: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert sorted(children) == ["15", "6"] and all(
        r.data.tags["tracerl.sweep"] == "asha" for r in children.values()
    )
    stopped, kept = children["6"], children["15"]
    # stopped after step 1; its Train run may log the step it was in before the trial's actor is gone
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "budget/leaves")] in ([1], [1, 2])
    assert stopped.info.status == "KILLED" and stopped.data.tags["tracerl.stopped_early"] == "asha"
    assert kept.info.status == "FINISHED"
    # every step of the finished trial reached the server
    assert len(client.get_metric_history(kept.info.run_id, "rollout/effective_ratio")) == 3
    # token mode: L starts at num_leaves; step t (0-based) may spend (t + 1) x 400 tokens less what the steps
    # before spent (unspent tokens carry over), at the trial's mean tokens per leaf so far, at least m_min roots
    hist = {
        k: [m.value for m in sorted(client.get_metric_history(kept.info.run_id, k), key=lambda m: m.step)]
        for k in ("budget/leaf_budget", "budget/generated_tokens", "budget/leaves")
    }
    budget = BudgetConfig(num_leaves=15, continuations=2, group_size=3, pool_factor=2, token_budget=400)
    gen, leaves = hist["budget/generated_tokens"], hist["budget/leaves"]
    expected = [15] + [
        dataclasses.replace(budget, token_budget=max(1, int(400 * (t + 1) - sum(gen[:t]))))
        .for_tokens(sum(gen[:t]) / sum(leaves[:t]), max_candidates=64, min_roots=2)
        .leaves
        for t in (1, 2)
    ]
    assert hist["budget/leaf_budget"] == expected
    # the same name again restores the finished experiment instead of starting new trials
    assert main(args) == 0
    runs = client.search_runs([client.get_experiment_by_name("tracerl").experiment_id])
    assert len([r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]) == 2


def test_a_restored_trial_resumes_its_own_unfinished_run(tmp_path: Path) -> None:
    """After an interruption, Tune restores a trial under the same name: it continues the MLflow run that has a
    saved config (resume), and a run killed before it saved anything is closed as KILLED for a fresh start."""
    import mlflow

    from tracerl.config import TrackingConfig, TrainConfig
    from tracerl.workflows.study.sweep import _unfinished_child

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    cfg = TrainConfig(tracking=TrackingConfig(uri=uri))
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("tracerl")

    def child(trial: str, status: str, saved: bool) -> str:
        storage = tmp_path / f"runs-{trial}-{status}"
        storage.mkdir()
        if saved:
            (storage / "config.yaml").write_text("steps: 4\n")
        run = client.create_run(
            exp, tags={"mlflow.parentRunId": "P", "tracerl.trial": trial, "tracerl.storage": str(storage)}
        ).info.run_id
        if status != "RUNNING":
            client.set_terminated(run, status=status)
        return run

    child("t0", "FINISHED", True)
    assert _unfinished_child(cfg, "P", "t0") is None  # a finished trial is never re-entered
    cut = child("t1", "RUNNING", True)
    assert _unfinished_child(cfg, "P", "t1") == cut
    assert _unfinished_child(cfg, "other-parent", "t1") is None
    early = child("t2", "RUNNING", False)
    assert _unfinished_child(cfg, "P", "t2") is None
    assert client.get_run(early).info.status == "KILLED"


def test_an_interrupted_sweep_is_told_from_a_finished_one(tmp_path: Path) -> None:
    """Tune keeps one state file per session; the newest says whether trials were cut short by Ctrl-C."""
    from tracerl.workflows.study.sweep import _interrupted

    def state(name: str, statuses: list[str]) -> None:
        trials = [[json.dumps({"status": s, "trial_id": f"t{i}"}), "{}"] for i, s in enumerate(statuses)]
        (tmp_path / f"experiment_state-{name}.json").write_text(json.dumps({"trial_data": trials}))

    state("2026-11-29_20-01-58", ["TERMINATED", "RUNNING"])  # the interrupted session
    assert _interrupted(tmp_path, None)
    state("2026-11-29_20-06-56", ["TERMINATED", "TERMINATED"])  # the resumed one finished both
    assert not _interrupted(tmp_path, None)
    state("2026-11-29_20-09-00", ["TERMINATED", "ERROR", "PENDING"])
    assert _interrupted(tmp_path, None)
