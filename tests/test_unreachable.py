"""A server the CLI is pointed at that refuses, or accepts and never answers, is one line and exit 2 within a
bounded time: the MLflow tracking server (``tracerl.workflows.tracking.store.check_reachable``) and the Ray job API
(``tracerl submit``). Limits are shortened here; the waits they bound are the defaults' (15 s, 120 s)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tracerl.workflows.cli.app import main
from tracerl.workflows.ops import submit
from tracerl.workflows.tracking import store as tracking


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose socket listens (connections are accepted by the kernel) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@pytest.fixture
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


@pytest.fixture
def short_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "PROBE_ANSWER_S", 0.5)
    monkeypatch.setattr(submit, "ANSWER_TIMEOUT_S", {})
    monkeypatch.setattr(submit, "DEFAULT_ANSWER_S", 0.5)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 32)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line (progress lines such as 'MLflow tracking at ...' may come before it)."""
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("tracerl:")]
    assert "Traceback" not in out.err + out.out and len(errors) == 1, out.err
    return errors[0]


@pytest.mark.parametrize("command", ["compare", "register"])
def test_a_tracking_server_that_refuses_is_one_line(
    command: str, closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"http://127.0.0.1:{closed_port}"
    args = ["--no-log"] if command == "compare" else ["RUN", "--name", "m"]
    assert main([command, *args, "--tracking-uri", uri]) == 2
    err = _one_line(capsys)
    assert f"tracking server {uri}: cannot connect (connection refused)" in err
    assert "tracking.uri=sqlite:///mlruns.db" in err


def test_a_tracking_server_that_never_answers_is_one_line(
    silent_port: int, short_limits: None, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"http://127.0.0.1:{silent_port}"
    assert main(["compare", "--no-log", "--tracking-uri", uri]) == 2
    assert "accepted a connection but did not answer within 0 s" in _one_line(capsys)


def test_train_refuses_a_dead_tracking_server_before_ray_starts(
    closed_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracerl.workflows.train.run

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ray was started before the tracking server was checked")

    monkeypatch.setattr(tracerl.workflows.train.run, "init_ray", boom)  # the name launch() calls
    uri = f"http://127.0.0.1:{closed_port}"
    assert main(["train", "--config", "conf/train/smoke.yaml", f"tracking.uri={uri}"]) == 2
    assert f"tracking server {uri}: cannot connect" in _one_line(capsys)


def test_any_http_answer_counts_as_a_server() -> None:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tracking.check_reachable(f"http://127.0.0.1:{server.server_port}/prefix")  # a 404 is an answer
        tracking.check_reachable("sqlite:///nowhere/mlruns.db")  # not HTTP: left to MLflow
    finally:
        server.shutdown()


def test_submit_to_a_job_api_that_never_answers_is_one_line(
    silent_port: int, short_limits: None, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"http://127.0.0.1:{silent_port}"
    assert main(["submit", "--address", address, "--no-follow", "train"]) == 2
    err = _one_line(capsys)
    assert f"the Ray job API at {address} accepted a connection but did not answer GET /api/version" in err
    assert main(["submit", "--address", address, "--status", "raysubmit_1"]) == 2
    assert "did not answer GET /api/version" in _one_line(capsys)


def test_submit_without_a_token_is_one_line(silent_port: int, tmp_path: Path) -> None:
    # In a child: Ray's token loader keeps the token it first found for the life of the process.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    env.update(HOME=str(tmp_path), RAY_AUTH_TOKEN_PATH=str(tmp_path / "absent"))
    address = f"http://127.0.0.1:{silent_port}"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tracerl.workflows.cli.app",
            "submit",
            "--address",
            address,
            "--no-follow",
            "train",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"tracerl: the Ray job API at {address} needs an authentication token" in res.stderr


class _FakeJobClient:
    """A fake job client whose log stream yields given chunks, then stays open without a word."""

    def __init__(self, chunks: list[str], states: list[str]) -> None:
        self.chunks, self.states, self.asked = chunks, states, 0

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        import asyncio

        for c in self.chunks:
            yield c
        await asyncio.sleep(3600)  # a silent, half-open stream

    def get_job_status(self, job_id: str) -> Any:
        from ray.job_submission import JobStatus

        self.asked += 1
        state = self.states[min(self.asked - 1, len(self.states) - 1)]
        if state == "DEAD":
            raise ConnectionError("the Ray job API at http://x:8265 did not answer")
        return JobStatus(state)


def test_following_a_silent_log_stream_ends_when_the_job_does() -> None:
    import asyncio

    from tracerl.workflows.ops.submit import follow_logs

    client = _FakeJobClient(["a\n", "b\n"], ["RUNNING", "SUCCEEDED"])
    seen: list[str] = []
    asyncio.run(follow_logs(client, "job", seen.append, quiet_s=0.05))
    assert seen == ["a\n", "b\n"] and client.asked == 2


def test_following_a_silent_log_stream_of_a_dead_head_is_a_connection_error() -> None:
    import asyncio

    from tracerl.workflows.ops.submit import follow_logs

    client = _FakeJobClient(["a\n"], ["DEAD"])
    with pytest.raises(ConnectionError, match="did not answer"):
        asyncio.run(follow_logs(client, "job", lambda s: None, quiet_s=0.05))


def test_an_upload_to_a_head_that_reads_it_slowly_is_not_cut_at_the_connect_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """urllib3 sends a request's body under the connect limit: a busy head that takes longer than that to read a
    working directory's upload once made `tracerl submit` fail with "('Connection aborted.', TimeoutError)". A body
    now has the answer limit for its send too; the connect limit is shortened here, the head reads after 1.5 s."""
    import json
    import time

    got: list[int] = []

    class SlowHead(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"ray_version": "2.60.0", "version": "4", "ray_commit": "x"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            time.sleep(1.5)  # busy: the client's send blocks once the socket buffers are full
            got.append(len(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowHead)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(submit, "CONNECT_TIMEOUT_S", 0.2)
    monkeypatch.setattr(submit, "DEFAULT_ANSWER_S", 60.0)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 32)
    size = 64 << 20  # more than loopback's socket buffers hold
    try:
        client = submit._client(f"http://127.0.0.1:{server.server_port}")
        answer = client._do_request("PUT", "/api/packages/gcs/_ray_pkg_test.zip", data=b"\0" * size)
    finally:
        server.shutdown()
    assert answer.status_code == 200 and got == [size]
