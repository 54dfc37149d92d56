"""What a user sees: the experiment kind MLflow's UI opens on, run tags and description, key/ metrics, and the
progress lines of long commands when output is not a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tracerl.config import TrackingConfig, TrainConfig
from tracerl.config_loader import compose
from tracerl.workflows.ops.progress import Progress, bar
from tracerl.workflows.tracking import run_info
from tracerl.workflows.tracking import store as tracking


def test_new_and_old_experiments_open_on_the_runs_table(tmp_path: Path) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    cfg = TrackingConfig(uri=uri, artifact_location=str(tmp_path / "art"))
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp_id = tracking.setup(cfg)
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment("made-before", artifact_location=(tmp_path / "a2").as_uri())
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    assert tracking.setup(cfg, "made-before") == old
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    genai = client.create_experiment(
        "genai",
        tags={"mlflow.experimentKind": "genai_development"},
        artifact_location=(tmp_path / "a3").as_uri(),
    )
    tracking.setup(cfg, "genai")  # a kind someone chose is kept
    assert client.get_experiment(genai).tags["mlflow.experimentKind"] == "genai_development"


def test_ui_url_is_the_experiments_runs_page(tmp_path: Path) -> None:
    import mlflow

    from tracerl.workflows.tracking.ui import experiment_url

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("tracerl", artifact_location=(tmp_path / "art").as_uri())
    assert experiment_url(uri, "tracerl", "http://127.0.0.1:5001") == (
        f"http://127.0.0.1:5001/#/experiments/{exp}/runs?workflowType=machine_learning&viewStateShareKey=tracerl"
    )
    tags = client.get_experiment(exp).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.tracerl"])  # the columns the link opens with
    assert view["selectedColumns"][:3] == [
        "metrics.`key/accuracy`",
        "metrics.`key/effective_ratio`",
        "metrics.`key/generated_tokens`",
    ]
    assert (
        experiment_url(uri, "other", "http://h:1") == "http://h:1  (no experiment 'other' in this store yet)"
    )


def test_train_tags_describe_the_run() -> None:
    cfg = compose(TrainConfig, ROOT / "conf" / "train" / "demo.yaml", ["seed=7"])
    tags = run_info.train_tags(cfg)
    shape = f"L={cfg.budget.num_leaves} N={cfg.budget.continuations} m_max={cfg.allocator.m_max}"
    assert tags["tracerl.budget"] == shape and tags["tracerl.seed"] == "7" and tags["tracerl.env"] == "math"
    note = tags["mlflow.note.content"]
    assert note.startswith(
        f"trace on math with the {Path(cfg.model.path).name} policy: {cfg.steps} steps, budget {shape}"
    )
    assert "seed 7" in note and "key/accuracy" in note
    budgeted = compose(TrainConfig, ROOT / "conf" / "train" / "demo.yaml", ["steps=null", "stop.tokens=5000"])
    assert ": 5000 tokens, budget " in run_info.train_tags(budgeted)["mlflow.note.content"]


def test_key_metrics_repeat_the_ones_users_compare() -> None:
    m = {
        "eval/accuracy": 0.25,
        "rollout/effective_ratio": 0.5,
        "budget/generated_tokens": 90.0,
        "train/loss": 1.0,
    }
    assert run_info.key_metrics(m, 300.0) == {
        "key/accuracy": 0.25,
        "key/effective_ratio": 0.5,
        "key/generated_tokens": 300.0,
    }
    assert run_info.key_metrics({"eval/accuracy": 0.1}) == {"key/accuracy": 0.1}
    assert sorted(run_info.key_metrics(m, 1.0)) == [
        "key/accuracy",
        "key/effective_ratio",
        "key/generated_tokens",
    ]


def test_progress_off_a_terminal_prints_plain_lines_with_times_left() -> None:
    out = io.StringIO()
    p = Progress(out=out, tty=False, interval=3600.0)
    b = bar(p, 4, "train demo", "step")
    b.set(1)  # the first count is printed, the next ones only after the interval...
    b.set(2)
    b.set(4)  # ...and the last one always
    b.set(3)  # never backwards
    b.close()
    p("a message")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[2] == "a message"
    assert lines[0].startswith("train demo: 1/4 steps, 0:00 elapsed, ~") and lines[0].endswith(" left")
    assert lines[1] == "train demo: 4/4 steps, 0:00 elapsed"
    assert "\r" not in out.getvalue()  # no bar drawing in a log


def test_progress_on_a_terminal_draws_a_tqdm_bar() -> None:
    out = io.StringIO()
    p = Progress(out=out, tty=True)
    with p.open_bar(3, "sweep s", "trial") as b:
        b.update()
        p("trial 1 done")
    text = out.getvalue()
    assert "sweep s:" in text and "1/3" in text and "trial 1 done\n" in text


def test_a_plain_reporter_gets_a_silent_bar(capsys: pytest.CaptureFixture[str]) -> None:
    b = bar(print, 3, "x")  # tests and library callers pass any callable: no bar, no lines
    b.set(3)
    b.close()
    assert capsys.readouterr() == ("", "")


def test_a_sweeps_budget_tag_shows_the_swept_space() -> None:
    from tracerl.workflows.study.config import SweepConfig

    cfg = compose(SweepConfig, ROOT / "conf" / "sweep" / "smoke.yaml", [])
    tags = run_info.sweep_tags(cfg, "s1")
    assert tags["tracerl.budget"] == "L=15 N=[2, 4] m_max=[4, 8]"
    assert tags["mlflow.note.content"].startswith(
        "Sweep s1: 2 trials of trace on math (3 steps each, seed 0) over "
        "budget.continuations in [2, 4], allocator.m_max in [4, 8]"
    )


def test_a_followed_bar_reads_the_last_count_when_it_closes() -> None:
    out = io.StringIO()
    b = Progress(out=out, tty=False, interval=3600.0).open_bar(3, "sweep s", "trial")
    ended = [0]
    b.follow(lambda: ended[0], every=3600.0)  # the poller never wakes in this test
    ended[0] = 3
    b.close()
    assert out.getvalue().splitlines() == ["sweep s: 3/3 trials, 0:00 elapsed"]


def test_a_followed_bar_closed_while_its_poller_reads_ends_the_poller_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``close`` between two of the poller's waits (while it is in ``read``, e.g. a slow MLflow query): the poller
    ends at its next wait, without an exception (it used to raise AttributeError on the dropped stop event), and
    draws nothing after the bar's final line."""
    import threading

    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    out = io.StringIO()
    b = Progress(out=out, tty=False, interval=0.0).open_bar(5, "train", "step")
    in_read, release, calls = threading.Event(), threading.Event(), [0]

    def read() -> int:
        calls[0] += 1
        if calls[0] == 1:  # the poller's first read: held until the bar is closed
            in_read.set()
            assert release.wait(60)
            return 4
        return 2  # close's own read of the last count

    b.follow(read, every=0.01)
    (poller,) = [t for t in threading.enumerate() if t.name == "progress-train"]
    assert in_read.wait(60)
    b.close()
    release.set()
    poller.join(60)
    assert not poller.is_alive() and errors == []
    assert out.getvalue().splitlines() == ["train: 2/5 steps, 0:00 elapsed, ~0:00 left"]


@pytest.mark.e2e
def test_terminating_tracerl_ui_ends_the_mlflow_server(tmp_path: Path) -> None:
    """`mlflow ui` outlives a TERM of its server; `tracerl ui` runs it in its own process group and ends it all."""
    import os
    import re
    import signal
    import time

    from tests.cluster_nodes import free_port, start_ui

    db = tmp_path / "mlruns.db"
    port = free_port()
    proc, line = start_ui(f"sqlite:///{db}", tmp_path, port)
    assert re.match(
        rf"MLflow UI on sqlite:///{re.escape(str(db))}: http://127.0.0.1:{port}  \(no experiment", line
    )

    def servers() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(db) in cmd and int(pid) != proc.pid:
                found.append(int(pid))
        return found

    assert servers()  # the MLflow UI and its uvicorn server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    deadline = time.monotonic() + 60
    while servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert servers() == []


FAKE_UI = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Health).serve_forever()
"""
"""A fake for the `mlflow ui` process (the unit under test is ``tracerl ui --check``): it answers /health."""


def test_ui_check_waits_for_the_server_prints_the_runs_page_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracerl ui --check` on a store with a tracerl experiment: it waits until the server answers, prints the
    experiment's runs page and ends the server. The real `mlflow ui` starting and ending is the test above's;
    this one replaced test_train.py's `ui --check` on the train run's store (23 s of `mlflow ui` start-up there)."""
    import os
    import socket
    import sys

    import mlflow

    from tracerl.workflows.cli.app import main

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    exp = mlflow.MlflowClient(tracking_uri=uri).create_experiment(
        "tracerl", artifact_location=(tmp_path / "art").as_uri()
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    marker = str(tmp_path / "fake-ui")  # names the fake's process in /proc
    monkeypatch.setattr(
        "tracerl.workflows.tracking.compare.ui_command",
        lambda uri, host, port: [sys.executable, "-c", FAKE_UI, host, str(port), marker],
    )
    assert main(["ui", "--check", "--port", str(port), "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert f"MLflow UI on {uri}: http://127.0.0.1:{port}/#/experiments/{exp}/runs?" in out

    def alive() -> bool:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return True
            except OSError:
                continue
        return False

    assert not alive()  # ended (and reaped) before the command returned


def test_ui_that_never_answers_is_an_error_not_a_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A UI process that runs but never answers /health: no URL is printed, the exit code is 2 with a line saying
    so, and the process is ended."""
    import subprocess
    import sys

    from tracerl.workflows.tracking import ui

    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*a: Any, **kw: Any) -> subprocess.Popen[bytes]:
        started.append(real_popen(*a, **kw))
        return started[-1]

    monkeypatch.setattr(ui, "READY_S", 1.0)
    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(
        "tracerl.workflows.tracking.compare.ui_command",
        lambda uri, host, port: [sys.executable, "-c", "import time; time.sleep(60)"],
    )
    assert ui.serve(f"sqlite:///{tmp_path}/m.db", "127.0.0.1", 9, "tracerl", check=True) == 2
    out, err = capsys.readouterr()
    assert "MLflow UI on" not in out
    assert "the MLflow UI did not answer http://127.0.0.1:9/health within 1 s; it was stopped" in err
    assert started and started[0].poll() is not None
