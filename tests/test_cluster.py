"""A two-node Ray cluster on this machine (issue 43, item 1; `make test-cluster`, marker ``cluster``).

A head on 127.0.0.1 and a second node on 127.0.0.2, each from its own temporary directory with its own ports and a
custom resource (``node1``, ``node2``) that places work on it; token authentication on, the token handed to both
nodes and every client in ``RAY_AUTH_TOKEN`` (as infra/ hands the ``ray-auth`` secret to the pods) and ``HOME`` a
temporary folder, so nothing is written to the user's home. Every process is stopped by its process group's id.

The head runs in Ray's single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), which keeps its node address
127.0.0.1 and so every head service on loopback; the second node joins at the GCS's IPv4-mapped address
``[::ffff:127.0.0.1]``, because Ray rewrites the literal ``127.0.0.1`` of a joining node to the machine's primary
address (measured with Ray 2.60: the join then failed to reach the GCS).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, WAIT_LIMIT_S, stop_process, wait_for
from tests.net_exposure import answer_without_token, listening, tree

pytestmark = pytest.mark.cluster

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    head: subprocess.Popen[bytes]
    node2: subprocess.Popen[bytes]
    address: str
    """What a client passes to ``ray.init`` (the GCS)."""
    env: dict[str, str]
    """A client's environment: the token, and a HOME of its own."""
    home: Path
    metrics_port2: int
    """The second node's metrics exporter (the one socket beyond loopback without token authentication)."""
    jobs: str
    """The head's job API (the dashboard, on loopback): what `tracerl submit --address` takes."""


def _node_args(temp: Path, resource: str) -> list[str]:
    """What both nodes are given: a temp dir of their own, every port chosen here (another Ray on this machine may
    hold Ray's defaults), two CPUs and the resource that places work on the node."""
    return [
        "--block",
        "--num-cpus=2",
        f"--resources={json.dumps({resource: 1})}",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
    ]


def _start(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [RAY, "start", *args],
        cwd=cwd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as a whole, by its id
    )


DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1])
deadline = time.monotonic() + float(sys.argv[2])
while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
where = ray.remote(num_cpus=0)(lambda: ray.util.get_node_ip_address())
print(json.dumps({
    "nodes": sorted(
        [n["NodeManagerAddress"], sorted(k for k in n["Resources"] if k.startswith("node") and ":" not in k)]
        for n in ray.nodes() if n["Alive"]
    ),
    "placed": {r: ray.get(where.options(resources={r: 0.01}).remote()) for r in ("node1", "node2")},
}))
"""


def _driver(cluster: Cluster, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, cluster.address, str(WAIT_LIMIT_S)],
        cwd=cluster.home,
        env=env or cluster.env,
        capture_output=True,
        text=True,
        timeout=WAIT_LIMIT_S + 120,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Short temp dirs of their own: Ray's socket paths under them must fit AF_UNIX's 107 bytes.
    temps = [Path(tempfile.mkdtemp(prefix=f"ray{n}-", dir="/tmp")) for n in ("head", "node2")]
    logs = tmp_path_factory.mktemp("cluster-logs")
    home = tmp_path_factory.mktemp("home")
    env = {
        **{
            k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_")) and k != "PYTHONPATH"
        },
        "HOME": str(home),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        # the suite's start-up limits (tests/conftest.py), for the nodes and the jobs they run: a loaded machine
        "RAY_worker_register_timeout_seconds": "600",
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "600",
        "RAY_worker_niceness": "0",
    }
    gcs, dash = _free_port(), _free_port()
    head = _start(
        [
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs}",
            "--include-dashboard=true",  # the job API `tracerl submit` sends to (on loopback)
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--metrics-export-port={_free_port()}",
            *_node_args(temps[0], "node1"),
        ],
        {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        logs / "head.log",
        home,
    )
    node2: subprocess.Popen[bytes] | None = None
    try:
        wait_for(
            lambda: head.poll() is not None or any(s.port == gcs for s in listening(tree(head.pid))),
            "the head's GCS listening",
        )
        assert head.poll() is None, (logs / "head.log").read_text()[-3000:]
        address = f"[::ffff:127.0.0.1]:{gcs}"
        metrics2 = _free_port()
        node2 = _start(
            [
                f"--address={address}",
                "--node-ip-address=127.0.0.2",
                f"--metrics-export-port={metrics2}",
                *_node_args(temps[1], "node2"),
            ],
            env,
            logs / "node2.log",
            home,
        )
        yield Cluster(head, node2, address, env, home, metrics2, f"http://127.0.0.1:{dash}")
    finally:
        for proc in (node2, head):
            if proc is not None:
                stop_process(proc, group=True)
        for t in temps:
            shutil.rmtree(t, ignore_errors=True)


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
        lambda: any(s.name == "raylet" for s in listening(tree(cluster.node2.pid))),
        "node 2's raylet",
        every_s=1,
    )
    seen = listening(tree(cluster.node2.pid))
    beyond = [s for s in seen if not s.loopback]
    assert {s.name for s in beyond} >= {"raylet"}, sorted(map(str, seen))
    answers = {str(s): answer_without_token("127.0.0.1", s.port) for s in beyond}
    metrics = [k for k in answers if k.endswith(f":{cluster.metrics_port2}")]
    assert len(metrics) == 1 and answers[metrics[0]].startswith("open:"), answers
    assert "HTTP GET / -> 200" in answers[metrics[0]]
    refused = {k: v for k, v in answers.items() if k not in metrics}
    assert refused and all(v.startswith("refused:") for v in refused.values()), answers


def test_a_submitted_smoke_training_places_the_trainer_on_node1_and_the_samplers_on_node2(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`tracerl submit` with the token in the environment (infra/README.md, step 5): two smoke steps whose trainer
    asks for ``node1`` and whose samplers and environment actors ask for ``node2``; the run's own params say where
    each ran."""
    import sqlite3

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracerl.workflows.cli.app",
            "submit",
            "--address",
            cluster.jobs,
            "--python",
            sys.executable,
            "train",
            "--config",
            "conf/train/smoke.yaml",
            "--steps",
            "2",
            "eval_at_start=false",
            "env.math.eval_tasks=2",
            "trainer.resources={node1: 0.01}",
            "pools.rollout_resources={node2: 0.01}",
            "pools.env_resources={node2: 0.01}",
            f"out_dir={tmp_path / 'runs'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
            f"tracking.artifact_location={tmp_path / 'mlartifacts'}",
        ],
        cwd=ROOT,
        env={**cluster.env, "PYTHONPATH": f"{ROOT}:{ROOT / 'platform'}"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0 and re.search(r"^job \S+: SUCCEEDED$", res.stdout, re.M), out[-4000:]
    with sqlite3.connect(tmp_path / "mlruns.db") as db:
        params = dict(db.execute("select key, value from params where key like 'placement/%'").fetchall())
        steps = db.execute("select count(distinct step) from metrics where key like 'train/%'").fetchone()[0]
    assert params == {
        "placement/trainer": "127.0.0.1",
        "placement/samplers": "127.0.0.2",
        "placement/env": "127.0.0.2",
    }
    assert steps >= 2
