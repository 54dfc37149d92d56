"""A two-node Ray cluster on this machine for tests/test_cluster.py (issue 43), and the MLflow server its jobs log to.

A head on 127.0.0.1 and a second node on 127.0.0.2, each from its own temporary directory with its own ports and a
custom resource (``node1``, ``node2``) that places work on it; token authentication on, the token handed to both
nodes and every client in ``RAY_AUTH_TOKEN`` (as infra/ hands the ``ray-auth`` secret to the pods) and ``HOME`` a
temporary folder, so nothing is written to the user's home. Both nodes get ``MLFLOW_TRACKING_URI`` (the address
the cluster gives its pods) and the project venv's ``bin`` on PATH (``tracerl`` there, as in the images). Every
process is stopped by its process group's id.

The head runs in Ray's single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), which keeps its node address
127.0.0.1 and so every head service on loopback; the second node joins at the GCS's IPv4-mapped address
``[::ffff:127.0.0.1]``, because Ray rewrites the literal ``127.0.0.1`` of a joining node to the machine's primary
address (measured with Ray 2.60: the join then failed to reach the GCS).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT, WAIT_LIMIT_S, stop_process, wait_for
from tests.net_exposure import listening, tree

RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ui(uri: str, cwd: Path, port: int | None = None) -> tuple[subprocess.Popen[str], str]:
    """`tracerl ui` on a store, from this checkout; returns the process and the line it prints once its server
    answers ("MLflow UI on <uri>: <url> ..."). MLflow's own log goes to ``cwd/ui.stderr``, whose tail the
    assertion shows if the command exits without that line."""
    port = port or free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}
    command = "import sys; from tracerl.workflows.cli.app import main; sys.exit(main())"
    with (cwd / "ui.stderr").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", command, "ui", "--tracking-uri", uri, "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("MLflow UI on"):
            return proc, line
    proc.kill()
    code = proc.wait()
    tail = (cwd / "ui.stderr").read_text().splitlines()[-15:]
    raise AssertionError(f"tracerl ui exited ({code}) without printing its URL:\n" + "\n".join(tail))


def _node_args(temp: Path, resource: str) -> list[str]:
    """What both nodes are given: a temp dir of their own, every port chosen here (another Ray on this machine may
    hold Ray's defaults), two CPUs and the resource that places work on the node."""
    return [
        "--block",
        "--num-cpus=2",
        f"--resources={json.dumps({resource: 1})}",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]


def _start(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [RAY, "start", *args],
        cwd=cwd,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as a whole, by its id
    )


@dataclass
class Cluster:
    head: subprocess.Popen[bytes]
    address: str
    """What a client passes to ``ray.init`` (the GCS)."""
    env: dict[str, str]
    """A client's environment: the token, and a HOME of its own."""
    node_env: dict[str, str]
    """The nodes' environment: the client's, ``MLFLOW_TRACKING_URI`` and the project venv's ``bin`` on PATH."""
    home: Path
    logs: Path
    mlflow: str
    """The MLflow server's address, as the cluster's nodes have it in ``MLFLOW_TRACKING_URI``."""
    jobs: str
    """The head's job API (the dashboard, on loopback): what `tracerl submit --address` takes."""
    node2: subprocess.Popen[bytes] | None = None
    metrics_port2: int = 0
    """The second node's metrics exporter (the one socket beyond loopback without token authentication)."""
    temps: list[Path] = field(default_factory=list)

    @property
    def node2_pid(self) -> int:
        assert self.node2 is not None
        return self.node2.pid

    def start_node2(self) -> None:
        """(Re)start the second node: a fresh temp dir and ports, the same resource and address."""
        temp = Path(
            tempfile.mkdtemp(prefix="ray2-", dir="/tmp")
        )  # Ray's socket paths must fit AF_UNIX's 107 bytes
        self.temps.append(temp)
        self.metrics_port2 = free_port()
        self.node2 = _start(
            [
                f"--address={self.address}",
                "--node-ip-address=127.0.0.2",
                f"--metrics-export-port={self.metrics_port2}",
                *_node_args(temp, "node2"),
            ],
            self.node_env,
            self.logs / "node2.log",
            self.home,
        )

    def lose_node2(self) -> list[int]:
        """Stop the second node as a lost machine stops: SIGKILL to its process group and to every process below
        it (its raylet, agents and the workers of the actors it ran), no shutdown. Returns the pids killed."""
        assert self.node2 is not None
        procs = tree(self.node2.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.node2.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()
        self.node2.wait()
        return [p.pid for p in procs]


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


def driver(cluster: Cluster, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A Ray client that waits for two live nodes, then says which they are and where each resource places work."""
    return subprocess.run(
        [sys.executable, "-c", DRIVER, cluster.address, str(WAIT_LIMIT_S)],
        cwd=cluster.home,
        env=env or cluster.env,
        capture_output=True,
        text=True,
        timeout=WAIT_LIMIT_S + 120,
    )


@contextlib.contextmanager
def mlflow_server(tmp: Path) -> Iterator[str]:
    """An MLflow tracking server on loopback (SQLite backend, artifacts under ``tmp``); yields its address."""
    from tracerl.workflows.tracking.ui import server_env

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp}/srv.db",
            "--default-artifact-root",
            str(tmp / "art"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=(tmp / "mlflow.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=server_env(),  # without MLflow's job runner, which no command uses
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"mlflow server exited with code {proc.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=10):
                return True
        except OSError:
            return False

    try:
        wait_for(up, "the mlflow server answering /health")
        yield url
    finally:
        stop_process(proc, group=True)


@contextlib.contextmanager
def two_nodes(home: Path, logs: Path, mlflow: str) -> Iterator[Cluster]:
    """The head, then the second node joining it; both stopped (by process group) on exit."""
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
    nodes_env = {
        **env,
        "MLFLOW_TRACKING_URI": mlflow,
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
    }
    head_temp = Path(tempfile.mkdtemp(prefix="ray1-", dir="/tmp"))
    gcs, dash = free_port(), free_port()
    head = _start(
        [
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs}",
            "--include-dashboard=true",  # the job API `tracerl submit` sends to (on loopback)
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--metrics-export-port={free_port()}",
            *_node_args(head_temp, "node1"),
        ],
        {**nodes_env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        logs / "head.log",
        home,
    )
    cluster = Cluster(
        head,
        f"[::ffff:127.0.0.1]:{gcs}",
        env,
        nodes_env,
        home,
        logs,
        mlflow,
        f"http://127.0.0.1:{dash}",
        temps=[head_temp],
    )
    try:
        wait_for(
            lambda: head.poll() is not None or any(s.port == gcs for s in listening(tree(head.pid))),
            "the head's GCS listening",
        )
        assert head.poll() is None, (logs / "head.log").read_text()[-3000:]
        cluster.start_node2()
        yield cluster
    finally:
        for proc in (cluster.node2, head):
            if proc is not None:
                stop_process(proc, group=True)
        for t in cluster.temps:
            shutil.rmtree(t, ignore_errors=True)
