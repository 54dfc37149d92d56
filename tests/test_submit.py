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

from tests.conftest import ROOT
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
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    ray_bin = str(Path(sys.executable).parent / "ray")
    proc = subprocess.Popen([ray_bin, "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}",
                             "--dashboard-host=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
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
    os.killpg(proc.pid, 15)
    proc.wait(timeout=60)


def test_submit_streams_logs_and_reports_status(head: str, tiny_policy: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = ["submit", "--address", head, "--working-dir", str(ROOT), "--python", sys.executable, "eval",
            f"model.path={tiny_policy}", "env.math.eval_tasks=3", "sampler.max_turns=2", "--samples", "0",
            "--out", str(tmp_path / "eval")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "greedy pass@1" in out  # the job's own output, streamed back
    job_id = next(line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("job "))
    assert main(["submit", "--address", head, "--status", job_id]) == 0
    assert capsys.readouterr().out.strip() == "SUCCEEDED"
    assert main(["submit", "--address", head, "--logs", job_id]) == 0
    assert "greedy pass@1" in capsys.readouterr().out
    assert (tmp_path / "eval" / "summary.json").is_file()


def test_submit_refuses_other_commands(head: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--address", head, "bootstrap"]) == 2
    assert "train, sweep, eval" in capsys.readouterr().err
