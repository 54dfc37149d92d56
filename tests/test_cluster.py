"""A two-node Ray cluster on this machine (issue 43; `make test-cluster`, marker ``cluster``): tests/cluster_nodes.py
starts it (a head on 127.0.0.1 offering ``node1``, a node on 127.0.0.2 offering ``node2``, token authentication on,
an MLflow server whose address the nodes have in ``MLFLOW_TRACKING_URI``). Here: the join and placement, a client
without the token refused, what each node listens on, infra/README.md's "Run on your cluster" lines run as they
stand from a virtualenv holding only the project's wheel (tests/cluster_steps.py), and the second node lost in the
middle of a run: one line, then ``resume=RUN_ID`` on the node brought back completes it."""

from __future__ import annotations

import json
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_nodes import Cluster, driver, mlflow_server, two_nodes
from tests.cluster_steps import JOBS, MLFLOW, RUN_ID, SHARED, Steps, lines
from tests.conftest import ROOT, wait_for
from tests.net_exposure import answer_without_token, listening, tree
from tests.wheel_venv import bare_env, build_wheel, wheel_venv
from tracerl.config import TrackingConfig
from tracerl.workflows.tracking.checkpoint_files import newest_good
from tracerl.workflows.tracking.runs import run_storage

pytestmark = pytest.mark.cluster

JOB_LIMIT_S = 1800


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("home")
    logs = tmp_path_factory.mktemp("cluster-logs")
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url, two_nodes(home, logs, url) as c:
        yield c


def _driver(cluster: Cluster, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return driver(cluster, env)


def test_the_second_node_joins_with_the_token_and_takes_what_its_resource_places(cluster: Cluster) -> None:
    res = _driver(cluster)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["nodes"] == [["127.0.0.1", ["node1"]], ["127.0.0.2", ["node2"]]]
    assert seen["placed"] == {"node1": "127.0.0.1", "node2": "127.0.0.2"}
    assert not (
        cluster.home / ".ray"
    ).exists()  # the token came from the environment; nothing written to HOME


def test_a_client_without_the_token_is_refused(cluster: Cluster) -> None:
    res = _driver(cluster, {**cluster.env, "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    assert res.returncode != 0
    assert "InvalidAuthToken" in res.stderr and "Failed to connect to Ray cluster" in res.stderr, res.stderr[
        -3000:
    ]


def test_the_head_listens_on_loopback_only(cluster: Cluster) -> None:
    seen = listening(tree(cluster.head.pid))
    assert {s.name for s in seen} >= {"gcs_server", "raylet"}, sorted(map(str, seen))
    assert not [str(s) for s in seen if not s.loopback]


def test_what_the_second_node_opens_beyond_loopback_refuses_a_client_without_the_token(
    cluster: Cluster,
) -> None:
    """Node 2's address is not 127.0.0.1, so Ray binds its raylet, workers and agent RPC on all interfaces: each
    answers a call without the token UNAUTHENTICATED. The exception, reported in docs/reliability.md: its metrics
    exporter (Prometheus text, read-only) binds all interfaces and answers anyone, and Ray 2.60 has no switch for
    it. The probe goes to the socket through loopback (a socket bound to all interfaces is the same socket)."""
    wait_for(
        lambda: any(s.name == "raylet" for s in listening(tree(cluster.node2_pid))),
        "node 2's raylet",
        every_s=1,
    )
    seen = listening(tree(cluster.node2_pid))
    beyond = [s for s in seen if not s.loopback]
    assert {s.name for s in beyond} >= {"raylet"}, sorted(map(str, seen))
    answers = {str(s): answer_without_token("127.0.0.1", s.port) for s in beyond}
    metrics = [k for k in answers if k.endswith(f":{cluster.metrics_port2}")]
    assert len(metrics) == 1 and answers[metrics[0]].startswith("open:"), answers
    assert "HTTP GET / -> 200" in answers[metrics[0]]
    refused = {k: v for k, v in answers.items() if k not in metrics}
    assert refused and all(v.startswith("refused:") for v in refused.values()), answers


PLACED = {"placement/trainer": "127.0.0.1", "placement/samplers": "127.0.0.2", "placement/env": "127.0.0.2"}


def _client(cluster: Cluster) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri=cluster.mlflow)


def test_the_readme_steps_from_a_client_venv_train_on_both_nodes_register_and_evaluate(
    cluster: Cluster, tmp_path: Path
) -> None:
    """infra/README.md's "Run on your cluster", line for line, from a virtualenv holding only the project's wheel (not
    the cluster's venv): the job logs to the MLflow the nodes' ``MLFLOW_TRACKING_URI`` names (over
    ``tracking=server``'s default), the trainer on node 1, the samplers and environment actors on node 2 (the run's
    own placement params); the client registers the run's last checkpoint and evaluates ``models:/NAME/1``."""
    steps = lines()
    assert [ln.split()[:2] for ln in steps] == [
        ["tracerl", "submit"],
        ["export", f"MLFLOW_TRACKING_URI={MLFLOW}"],
        ["tracerl", "register"],
        ["tracerl", "eval"],
    ]
    for old in (JOBS, SHARED, RUN_ID):
        assert old in "\n".join(steps), old
    client_venv = wheel_venv(build_wheel(tmp_path / "wheel"), tmp_path / "client")
    shared = tmp_path / "shared"
    env = {
        **bare_env(cluster.home),
        "PATH": f"{client_venv.bin}:/usr/bin:/bin",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": cluster.env["RAY_AUTH_TOKEN"],
    }
    assert shutil.which("tracerl", path=env["PATH"]) == str(
        client_venv.bin / "tracerl"
    )  # the wheel's, not ours
    run = Steps({JOBS: cluster.jobs, MLFLOW: cluster.mlflow, SHARED: str(shared)}, env, ROOT, JOB_LIMIT_S)

    def job_done(res: subprocess.CompletedProcess[str]) -> None:
        assert re.search(r"^job \S+: SUCCEEDED$", res.stdout, re.M), (res.stdout + res.stderr)[-4000:]
        run.subs[RUN_ID] = re.findall(r"MLflow run ([0-9a-f]{32}) \((http://\S+)\)", res.stdout)[0][0]
        assert f"MLflow run {run.subs[RUN_ID]} ({cluster.mlflow})" in res.stdout  # the nodes' URI won

    run.run(steps[0], job_done)
    run_id = run.subs[RUN_ID]
    client = _client(cluster)
    params = client.get_run(run_id).data.params
    assert {k: v for k, v in params.items() if k.startswith("placement/")} == PLACED
    assert params["tracking.uri"] == cluster.mlflow
    run.run(steps[1])
    assert env["MLFLOW_TRACKING_URI"] == cluster.mlflow
    run.run(steps[2])
    assert f"registered tracerl-smoke version 1 from run {run_id}: " in run.ran[-1][1].stdout
    run.run(steps[3])
    summary = json.loads((shared / "eval" / "summary.json").read_text())
    loaded = Path(summary["model"])  # where models:/tracerl-smoke/1 was downloaded to
    assert summary["task_set"].startswith("math:")
    ckpt = newest_good(run_storage(run_id, TrackingConfig(uri=cluster.mlflow))).path
    assert ckpt is not None and str(ckpt).startswith(str(shared / "runs"))
    assert (loaded / "model.safetensors").read_bytes() == (ckpt / "policy" / "model.safetensors").read_bytes()
    print("cluster README steps ran:", *(shlex.join(argv) for argv, _ in run.ran), sep="\n  ")


def test_a_node_lost_mid_run_fails_in_one_line_and_resume_completes_the_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Item 4: the samplers and environment actors on node 2, node 2 killed (SIGKILL, its whole process tree) once
    step 2 is logged: the replacements find no node offering ``node2`` for ``pools.lost_node_wait_s`` (20 s here)
    and the job fails with one ``tracerl:`` line naming it; node 2 started again, ``resume=RUN_ID`` completes the
    run with each step's metrics once (the chaos drill's exactly-once rule)."""
    from tracerl.workflows.experiments.chaos import check_steps

    steps = 4
    submit = [sys.executable, "-m", "tracerl.workflows.cli.app", "submit", "--address", cluster.jobs, "train"]
    env = {**cluster.env, "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}"}
    log = tmp_path / "job.log"
    with log.open("w") as out:
        job = subprocess.Popen(
            [
                *submit,
                "--config",
                "conf/train/smoke.yaml",
                "tracking=server",
                "--steps",
                str(steps),
                "checkpoint_every=1",
                "eval_at_start=false",
                "eval_at_end=false",
                "env.math.eval_tasks=2",
                "pools.lost_node_wait_s=20",
                "trainer.resources={node1: 0.01}",
                "pools.rollout_resources={node2: 0.01}",
                "pools.env_resources={node2: 0.01}",
                f"out_dir={tmp_path / 'runs'}",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    client = _client(cluster)
    found: list[str] = []

    def started() -> bool:
        assert job.poll() is None, log.read_text()[-4000:]
        found[:] = re.findall(r"MLflow run ([0-9a-f]{32}) ", log.read_text())
        return bool(found)

    wait_for(started, "the run's creation", limit_s=JOB_LIMIT_S)
    run_id = found[0]

    def logged(step: int) -> bool:
        assert job.poll() is None, log.read_text()[-4000:]
        return any(m.step == step for m in client.get_metric_history(run_id, "key/effective_ratio"))

    wait_for(lambda: logged(2), "step 2's metrics", limit_s=JOB_LIMIT_S, every_s=0.5)
    lost = time.monotonic()
    assert cluster.lose_node2()
    failed_after: list[float] = []

    def failed() -> bool:
        if not failed_after and "cannot be placed" in log.read_text():
            failed_after.append(time.monotonic() - lost)
        return job.poll() is not None

    wait_for(failed, "the job's end after the node's loss", limit_s=JOB_LIMIT_S, every_s=0.5)
    ended_s = time.monotonic() - lost
    text = log.read_text()
    assert job.returncode == 1 and re.search(r"^job \S+: FAILED$", text, re.M), text[-4000:]
    [line] = [ln for ln in text.splitlines() if "cannot be placed" in ln]
    assert re.fullmatch(
        r"tracerl: the training loop stopped \(Unplaceable\): a replacement for sampler actor \d cannot be placed: "
        r"it asks for CPU=0\.5, node2=0\.01, and no live node of the Ray cluster has node2 \(for 20 s, "
        r"pools\.lost_node_wait_s\): .*`tracerl train resume=RUN_ID`",
        line,
    ), line
    assert client.get_run(run_id).info.status == "FAILED"

    restarted = time.monotonic()
    cluster.start_node2()
    back = driver(cluster)
    back_s = time.monotonic() - restarted
    assert back.returncode == 0 and json.loads(back.stdout.strip().splitlines()[-1])["placed"]["node2"] == (
        "127.0.0.2"
    ), (back.stdout + back.stderr)[-3000:]
    began = time.monotonic()
    resumed = subprocess.run(
        [*submit, f"resume={run_id}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=JOB_LIMIT_S
    )
    resume_s = time.monotonic() - began
    assert re.search(r"^job \S+: SUCCEEDED$", resumed.stdout, re.M), (resumed.stdout + resumed.stderr)[-4000:]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert check_steps(client, run_id, steps) == []
    params = client.get_run(run_id).data.params
    assert {k: v for k, v in params.items() if k.startswith("placement/")} == PLACED
    print(
        f"node loss: the failure line {failed_after[0]:.0f} s after the loss, the job ended at {ended_s:.0f} s; "
        f"node 2 back and placing in {back_s:.0f} s; the resume job took {resume_s:.0f} s"
    )
