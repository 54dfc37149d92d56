"""`tracerl submit` and the cluster contract, against a real Ray head started by the test (and stopped by it).

The head runs as a cluster's would: from a directory of its own, with the dependencies (the venv) but not the project
(no PYTHONPATH to it); the job's uploaded working directory carries code, configs and the committed models."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_tracerl, stop_process
from tracerl.workflows.cli.app import main

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`ray start --head --block` in the foreground, from a temporary directory: terminating it stops exactly this
    cluster (not `ray stop`, which would stop every Ray on the machine, the test session's own included)."""
    gcs, dash = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("headlog") / "ray-start.log"
    # A short temp dir of its own: Ray's socket paths under it must fit AF_UNIX's 107 bytes, which pytest's own
    # temp dirs do not leave room for in a parallel lane (/tmp/pytest-of-root/pytest-N/popen-gw1/...).
    temp = tempfile.mkdtemp(prefix="rayhead-", dir="/tmp")
    env = {
        **{
            k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_")) and k != "PYTHONPATH"
        },
        "RAY_AUTH_MODE": "token",
    }
    ray_bin = str(Path(sys.executable).parent / "ray")
    proc = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            "--dashboard-host=127.0.0.1",
            "--num-cpus=3",
            "--disable-usage-stats",
            # every port of its own: another Ray on the machine may hold the defaults (52365, ...)
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}",
            f"--runtime-env-agent-port={_free_port()}",
            f"--metrics-export-port={_free_port()}",
            f"--temp-dir={temp}",
        ],
        cwd=tmp_path_factory.mktemp("headcwd"),
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            break
        except urllib.error.HTTPError:
            break  # answering (401 without a token): up
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"ray head did not come up (exit {proc.poll()}); its output ends:\n{log.read_text()[-3000:]}"
            )
            time.sleep(1)
    yield url
    stop_process(proc, group=True)
    shutil.rmtree(temp, ignore_errors=True)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`tracerl ...` in a fresh process from the repository root, as from a new shell (the test session may hold
    its own Ray)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_")) or k == "RAY_AUTH_MODE"
    }  # as from a new shell: no Ray or MLflow server that an earlier test of this lane pointed at
    return run_tracerl(*args, env=env, timeout=1200)


def _find(pattern: str, text: str) -> tuple[str, ...]:
    m = re.search(pattern, text, re.M)
    assert m, f"no line matching {pattern!r} in:\n{text[-3000:]}"
    return m.groups()


def _job_id(stdout: str) -> str:
    return next(line.split()[1].rstrip(":") for line in stdout.splitlines() if line.startswith("job "))


# -- what the job's working directory carries (no cluster needed) ---------------------------------------------------


def _project(root: Path) -> Path:
    """A small copy of the project's layout with the repository's .gitignore: code, configs, a committed model and
    what must stay behind (another model, a venv, run outputs, an MLflow store)."""
    for rel in [
        "platform/tracerl/__init__.py",
        "workflows/cli/app.py",
        "conf/train/smoke.yaml",
        "models/tiny-math/model.safetensors",
        "models/tiny-math-habit/config.json",
        "models/smollm2/big.bin",
        ".venv/bin/python",
        "runs/r1/summary.json",
        "mlruns.db",
        "platform/tracerl/__pycache__/x.pyc",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    # the package's data folder links to models/ as the repository's does (platform/tracerl/share/models)
    (root / "platform/tracerl/share").mkdir(parents=True)
    (root / "platform/tracerl/share/models").symlink_to("../../../models")
    return root


def _uploaded(working_dir: Path, tmp: Path) -> set[str]:
    """The files Ray's own packaging puts in the job's package, with submit's runtime env and upload rules (the
    code path of JobSubmissionClient.submit_job)."""
    from ray._private.runtime_env.packaging import create_package

    from tracerl.workflows.ops.submit import runtime_env, upload_rules

    renv, git = runtime_env(working_dir)
    with upload_rules(git):
        create_package(
            renv["working_dir"],
            tmp / "pkg.zip",
            include_gitignore=os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1",
            excludes=renv["excludes"],
        )
    return {n for n in zipfile.ZipFile(tmp / "pkg.zip").namelist() if not n.endswith("/")}


@pytest.mark.parametrize("git", [True, False], ids=["git-checkout", "no-git"])
def test_the_upload_carries_code_configs_and_committed_models(tmp_path: Path, git: bool) -> None:
    proj = _project(tmp_path / "proj")
    if git:
        subprocess.run(["git", "init", "-q", str(proj)], check=True)
        subprocess.run(["git", "-C", str(proj), "add", "platform/tracerl/share/models"], check=True)
    files = _uploaded(proj, tmp_path)
    assert {
        "platform/tracerl/__init__.py",
        "workflows/cli/app.py",
        "conf/train/smoke.yaml",
        "models/tiny-math/model.safetensors",
        "models/tiny-math-habit/config.json",
    } <= files
    assert not [
        f
        for f in files
        if f.startswith(("models/smollm2", ".venv", "runs/", ".git/"))
        or f in ("mlruns.db",)
        or f.endswith(".pyc")
    ]
    if (
        git
    ):  # through the link too: the committed models, not `make smollm2`'s (a 0.5 GB upload the API refuses)
        assert "platform/tracerl/share/models/tiny-math/model.safetensors" in files
        assert not [f for f in files if f.startswith("platform/tracerl/share/models/smollm2")]


def test_the_repository_upload_has_the_shipped_models() -> None:
    from tracerl.workflows.ops.submit import runtime_env

    renv, git = runtime_env(ROOT)
    assert (
        renv["env_vars"]["PYTHONPATH"] == "platform"
    )  # relative: each job process starts in the working dir
    if git:  # this checkout: git's own rules decide, and they keep the committed models
        from ray._private.thirdparty.pathspec import PathSpec

        spec = PathSpec.from_lines("gitwildmatch", renv["excludes"])
        for model in ("tiny-math", "tiny-math-habit", "tiny-search"):
            for folder in ("models", "platform/tracerl/share/models"):
                assert not spec.match_file(f"{folder}/{model}/model.safetensors"), (folder, model)


def test_wildcards_in_ignored_names_match_only_that_name() -> None:
    from ray._private.thirdparty.pathspec import PathSpec

    from tracerl.workflows.ops.submit import _pattern

    spec = PathSpec.from_lines("gitwildmatch", [_pattern("out[1]*?.log")])
    assert spec.match_file("out[1]*?.log") and not spec.match_file("out1xy.log")


def test_a_directory_that_is_not_the_project_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # nothing is contacted: the address is never reached
    assert main(["submit", "--address", "http://127.0.0.1:9", "--working-dir", str(tmp_path), "eval"]) == 2
    err = capsys.readouterr().err
    assert f"--working-dir {tmp_path} is not the project's root" in err and "platform/tracerl" in err


def test_train_and_sweep_join_the_cluster_they_are_sent_to() -> None:
    from tracerl.workflows.ops.submit import entrypoint

    assert entrypoint("train", ["--steps", "1"]) == "tracerl train --steps 1 cluster.address=auto"
    assert (
        entrypoint("sweep", ["cluster.address=ray://h:10001"], "/py")
        == "/py -m tracerl.workflows.cli.app sweep cluster.address=ray://h:10001"
    )
    assert (
        entrypoint("eval", ["model.path=models/tiny-math-habit"])
        == "tracerl eval model.path=models/tiny-math-habit"
    )


def test_submit_refuses_other_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--address", "http://127.0.0.1:9", "bootstrap"]) == 2
    assert "train, sweep, eval" in capsys.readouterr().err


# -- on the head ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_job(head: str) -> subprocess.CompletedProcess[str]:
    """The documented command with the relative config path, sent once; the tests below read what it did."""
    return _cli(
        "submit",
        "--address",
        head,
        "--python",
        sys.executable,
        "train",
        "--config",
        "conf/train/smoke.yaml",
        "--steps",
        "1",
        # no start evaluation and a 2-task last one (the smoke config's are on 24): what runs where is the claim
        "eval_at_start=false",
        "env.math.eval_tasks=2",
    )


def test_the_shipped_smoke_train_runs_on_the_cluster(smoke_job: subprocess.CompletedProcess[str]) -> None:
    """The job finds models/tiny-math in its working directory, joins the head's Ray and writes its MLflow store
    into that working directory."""
    res = smoke_job
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert re.search(r"^job \S+: SUCCEEDED$", res.stdout, re.M)
    assert re.search(r"^steps\s+1$", res.stdout, re.M)  # the job's own summary, streamed back
    store, storage = map(
        Path, _find(r"MLflow run \w+ \(sqlite:///(\S+)\); checkpoints in (\S+)$", res.stdout)
    )
    wd = store.parent  # the job's working directory: the uploaded project, on this machine (the head's node)
    assert store.name == "mlruns.db" and store.is_file() and wd != ROOT
    assert (wd / "models" / "tiny-math" / "model.safetensors").is_file() and storage.parent == wd / "runs"


def test_submit_streams_logs_and_reports_status(
    head: str, smoke_job: subprocess.CompletedProcess[str]
) -> None:
    """The job's own output streamed back while it ran, then its status and its logs asked for by job id: the smoke
    job above's (an eval job of its own, one more job start on the head, showed the same)."""
    res = smoke_job
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    summary = _find(r"^(steps\s+1)$", res.stdout)[0]  # the job's own output, streamed back
    job_id = _job_id(res.stdout)
    st = _cli("submit", "--address", head, "--status", job_id)
    assert st.returncode == 0 and st.stdout.strip() == "SUCCEEDED"
    logs = _cli("submit", "--address", head, "--logs", job_id)
    assert logs.returncode == 0 and summary in logs.stdout


def test_the_job_imports_the_uploaded_code(head: str, tmp_path: Path) -> None:
    """Driver and workers import the project from the job's working directory, though a copy of it is installed in
    this venv too (from the main checkout): PYTHONPATH must win. Sent with the `ray job submit` CLI and submit's
    runtime env and upload rules."""
    import json

    from tracerl.workflows.ops.submit import runtime_env

    code = (
        "import os, ray, tracerl, tracerl.workflows; ray.init(); "
        "f = ray.remote(lambda: (__import__('tracerl').__file__, __import__('tracerl.workflows').workflows.__file__)); "
        "print('cwd', os.getcwd()); print('driver', tracerl.__file__, tracerl.workflows.__file__); "
        "print('worker', *ray.get(f.remote()))"
    )
    renv, git = runtime_env(ROOT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_RUNTIME_ENV_IGNORE_GITIGNORE="1" if git else "0")
    for _ in range(3):  # once seen on a loaded machine: the head dropped the connection before taking the job
        res = subprocess.run(
            [
                str(Path(sys.executable).parent / "ray"),
                "job",
                "submit",
                "--address",
                head,
                "--runtime-env-json",
                json.dumps(renv),
                "--",
                sys.executable,
                "-c",
                code,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        logs = res.stdout + res.stderr
        if "submitted successfully" in logs or "Connection aborted" not in logs:
            break
    assert res.returncode == 0 and "succeeded" in logs, logs[-3000:]
    wd = Path(_find(r"^cwd (\S+)$", logs)[0])
    assert wd != ROOT and (wd / "models" / "tiny-math" / "model.safetensors").is_file()
    for who in ("driver", "worker"):
        tracerl_file, workflows_file = _find(rf"^{who} (\S+) (\S+)$", logs)
        assert tracerl_file == str(wd / "platform" / "tracerl" / "__init__.py"), who
        assert workflows_file == str(wd / "platform" / "tracerl" / "workflows" / "__init__.py"), who
