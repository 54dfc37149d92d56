"""`tracerl submit` against a real Ray head started on loopback by the test (and stopped by it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, stop_process
from workflows.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`ray start --head --block` in the foreground: terminating it stops exactly this cluster (not `ray stop`,
    which would stop every Ray on the machine, the test session's own included)."""
    gcs, dash = _free_port(), _free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "RAY_AUTH_MODE": "token"}
    ray_bin = str(Path(sys.executable).parent / "ray")
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}",
                             "--dashboard-host=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
                             # every port of its own: another Ray on the machine may hold the defaults (52365, ...)
                             f"--dashboard-agent-listen-port={_free_port()}",
                             f"--dashboard-agent-grpc-port={_free_port()}",
                             f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}",
                             f"--temp-dir={tmp_path_factory.mktemp('rayhead')}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            break
        except urllib.error.HTTPError:
            break  # answering (401 without a token): up
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "ray head did not come up"
            time.sleep(1)
    yield url
    stop_process(proc, group=True)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`tracerl ...` in a fresh process, as from a new shell (the test session may hold its own Ray)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_AUTH_MODE"}
    return subprocess.run([sys.executable, "-m", "workflows.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_submit_streams_logs_and_reports_status(head: str, tiny_policy: Path, tmp_path: Path) -> None:
    res = _cli("submit", "--address", head, "--working-dir", str(ROOT), "--python", sys.executable, "eval",
               f"model.path={tiny_policy}", "env.math.eval_tasks=3", "sampler.max_turns=2", "--samples", "0",
               "--out", str(tmp_path / "eval"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "greedy pass@1" in res.stdout  # the job's own output, streamed back
    job_id = next(line.split()[1].rstrip(":") for line in res.stdout.splitlines() if line.startswith("job "))
    st = _cli("submit", "--address", head, "--status", job_id)
    assert st.returncode == 0 and st.stdout.strip() == "SUCCEEDED"
    logs = _cli("submit", "--address", head, "--logs", job_id)
    assert logs.returncode == 0 and "greedy pass@1" in logs.stdout
    assert (tmp_path / "eval" / "summary.json").is_file()


def test_submit_refuses_other_commands(head: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--address", head, "bootstrap"]) == 2
    assert "train, sweep, eval" in capsys.readouterr().err
