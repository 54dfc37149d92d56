"""``tracerl submit``: send train / sweep / eval to a Ray cluster through the Ray Jobs SDK.

The cluster contract: the head (and every node) has the dependencies (the image or venv Ray runs from) but not the
project. The job's working directory, uploaded from ``--working-dir`` (the repository root), carries it: code,
configs and the committed models, exactly what git would commit (tracked files plus untracked ones it does not
ignore; git itself reads ``.gitignore``, since Ray's own reading of it can miss ``!`` exceptions such as the
one for the committed ``models/tiny-math``: ``upload_rules``), never ``.git``, virtual environments, run outputs or MLflow stores. The job finds the
packages without an install step: Ray puts the working directory first on ``PYTHONPATH`` and the job's
``env_vars`` add ``platform/`` (relative: each process starts in the working directory), so the uploaded code wins
over any copy installed on the cluster. A submitted train or sweep joins the cluster it is sent to
(``cluster.address=auto`` unless the command line sets ``cluster.address``). Relative paths in the config resolve
in the working directory, so its run outputs and the default SQLite MLflow store land in that copy on the node
that runs the driver, which Ray deletes eventually: point ``tracking.uri`` (or ``MLFLOW_TRACKING_URI`` in the
head's environment, which the job inherits) and ``out_dir`` at shared storage to keep them.

The entrypoint is the ``tracerl`` command (or ``PYTHON -m tracerl.workflows.cli.app`` with ``--python``, for heads whose PATH
has no ``tracerl``: Ray resolves the entrypoint with the PATH of whoever ran ``ray start``). Logs stream until the
job ends; ``--status``, ``--logs`` and ``--stop`` act on an existing job. Ray token authentication stays on: the
client reads the token the way the ``ray`` CLI does (``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN`` or the local
token file).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

SUBMITTABLE = ("train", "sweep", "eval", "study")
JOINS_CLUSTER = ("train", "sweep", "study")  # the commands that start Ray: on the cluster they join it
# Left out whatever git says (also where the working directory is not a git checkout):
EXCLUDES = [
    ".git",
    ".venv",
    ".venv-vllm",
    "runs",
    "bench_out",
    "eval_out",
    "rollout_out",
    "mlruns.db",
    "mlartifacts",
    "mlruns",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
]
PROJECT_MARKERS = ("platform/tracerl", "workflows", "conf")


CONNECT_TIMEOUT_S = 10.0
"""How long a call to the job API waits for its connection."""
ANSWER_TIMEOUT_S = {"/api/version": 15.0}
"""How long a call waits for the head's answer, by endpoint; others wait ``DEFAULT_ANSWER_S`` (an upload of the
working directory is answered once the head has stored it)."""
DEFAULT_ANSWER_S = 120.0
QUIET_S = 30.0
"""Following a job's log, seconds without a line before its status is asked (the stream has no time limit)."""


def _client(address: str) -> Any:
    """A Ray job client whose every HTTP call has a time limit (Ray's own has none: a listening socket that never
    answers held ``tracerl submit`` forever); a call past it is a ``ConnectionError`` naming the address."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    # slow to import: ray, requests (only the job client needs them; the CLI also loads this module for JobAPIError)
    import requests
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    class TimedClient(JobSubmissionClient):
        def _raise_error(self, r: Any) -> None:  # Ray's is a bare RuntimeError; the CLI reports this one
            raise JobAPIError(
                f"the Ray job API at {address} answered {r.status_code}: {r.text.strip()[:500]}"
            )

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            answer_s = ANSWER_TIMEOUT_S.get(endpoint, DEFAULT_ANSWER_S)
            # urllib3 sends a request's body under the connect limit (the read limit starts once it is sent): an
            # upload of the working directory (tens of MB) to a busy head may wait longer than that for the head
            # to read it, so a request with a body has the answer limit for both.
            connect_s = answer_s if kwargs.get("data") is not None else CONNECT_TIMEOUT_S
            kwargs.setdefault("timeout", (connect_s, answer_s))
            try:
                return super()._do_request(method, endpoint, **kwargs)
            except requests.exceptions.ConnectTimeout:
                raise ConnectionError(
                    f"the Ray job API at {address} did not take a connection within {connect_s:.0f} s: "
                    "check --address (the head's dashboard, e.g. http://HEAD:8265) and that the head is up"
                ) from None
            except requests.exceptions.Timeout:
                raise ConnectionError(
                    f"the Ray job API at {address} accepted a connection but did not answer {method} {endpoint} "
                    f"within {answer_s:.0f} s: check that --address is a Ray head's dashboard (e.g. "
                    "http://HEAD:8265), not another service, and that the head is not overloaded"
                ) from None
            except requests.exceptions.ConnectionError as exc:  # refused, reset, or a send that timed out
                raise ConnectionError(
                    f"the Ray job API at {address} dropped {method} {endpoint} ({exc}): check that the head is up "
                    "and not overloaded, then submit again"
                ) from None

    try:
        return TimedClient(address)
    except (
        AuthenticationError
    ) as exc:  # no token here, or the head refused it: Ray's text says where to put one
        raise ConnectionError(f"the Ray job API at {address} needs an authentication token: {exc}") from None


class JobAPIError(RuntimeError):
    """The Ray job API answered with an error (the text is the head's); the CLI prints it as one line."""


def entrypoint(command: str, args: Sequence[str], python: str | None = None) -> str:
    if command not in SUBMITTABLE:
        raise ValueError(f"tracerl submit sends one of {', '.join(SUBMITTABLE)} (got {command!r})")
    head = [python, "-m", "tracerl.workflows.cli.app"] if python else ["tracerl"]
    args = list(args)
    if command in JOINS_CLUSTER and not any(a.startswith("cluster.address=") for a in args):
        args.append("cluster.address=auto")  # not an embedded Ray of its own inside the job
    return " ".join(shlex.quote(a) for a in [*head, command, *args])


def _pattern(rel: str) -> str:
    """A path as a gitwildmatch pattern anchored at the working directory (wildcards in names escaped)."""
    for ch in "\\*?[":
        rel = rel.replace(ch, "\\" + ch)
    return "/" + rel


def git_ignored(working_dir: Path) -> list[str] | None:
    """What git ignores under ``working_dir`` (its own rules, ``!`` exceptions included; an ignored directory as one
    entry), as anchored exclude patterns; None where ``working_dir`` is not in a git checkout."""
    try:
        res = subprocess.run(
            [
                "git",
                "-C",
                str(working_dir),
                "ls-files",
                "-z",
                "--others",
                "--ignored",
                "--exclude-standard",
                "--directory",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    ignored = [p.rstrip("/") for p in res.stdout.split("\0") if p]
    # Ray's packaging follows links: what git ignores under a linked folder inside the project (the package's
    # share/models -> models) is left out under the link's path too, or `make smollm2`'s 0.5 GB model rides along.
    linked = [
        f"{link}/{path[len(target) + 1 :]}"
        for link, target in _linked_folders(working_dir)
        for path in ignored
        if path.startswith(target + "/")
    ]
    return [_pattern(p) for p in ignored + linked]


def _linked_folders(working_dir: Path) -> list[tuple[str, str]]:
    """(link, target) for each link git tracks under ``working_dir`` that points at a folder inside it, both
    relative to it."""
    res = subprocess.run(
        ["git", "-C", str(working_dir), "ls-files", "-z", "-s"], capture_output=True, text=True, timeout=60
    )
    root = working_dir.resolve()
    out = []
    for entry in res.stdout.split("\0") if res.returncode == 0 else []:
        meta, _, rel = entry.partition("\t")
        if not meta.startswith("120000"):
            continue
        target = (root / rel).resolve()
        if target.is_dir() and target.is_relative_to(root):
            out.append((rel, str(target.relative_to(root))))
    return out


def runtime_env(working_dir: str | Path, env: dict[str, str] | None = None) -> tuple[dict[str, Any], bool]:
    """The job's runtime environment (the project as its working directory, ``platform/`` on its PYTHONPATH) and
    whether git listed what to leave out (then Ray must not read .gitignore itself: ``upload_rules``)."""
    wd = Path(working_dir).resolve()
    missing = [m for m in PROJECT_MARKERS if not (wd / m).exists()]
    if missing:
        raise ValueError(
            f"--working-dir {wd} is not the project's root (it has no {', '.join(missing)}): the job's "
            "working directory carries the project; run submit from the repository root or point "
            "--working-dir at it"
        )
    ignored = git_ignored(wd)
    # PYTHONPATH: Ray puts the working directory itself first; a relative entry resolves in each process's
    # working directory, which is the job's (the driver's and every worker's).
    return (
        {
            "working_dir": str(wd),
            "excludes": EXCLUDES + (ignored or []),
            "env_vars": {"PYTHONPATH": "platform", **(env or {})},
        },
        ignored is not None,
    )


@contextlib.contextmanager
def upload_rules(git: bool) -> Iterator[None]:
    """Where git listed the ignored paths, Ray must not apply .gitignore itself: its matcher tests a directory as
    ``models/tiny-math``, without the ``/`` an exception such as ``!models/tiny-math/`` names, so ``models/*`` wins
    and the whole directory (the committed model) is left out."""
    key = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"
    before = os.environ.get(key)
    if git:
        os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def submit(
    address: str,
    command: str,
    args: Sequence[str],
    working_dir: str = ".",
    python: str | None = None,
    follow: bool = True,
    env: dict[str, str] | None = None,
    emit: Callable[[str], None] = lambda s: print(s, end="", flush=True),
    agent_wait_s: float = 120.0,
) -> tuple[str, str]:
    """Submit; returns (job id, final status or 'PENDING' when not following). A head without a job agent is
    retried for ``agent_wait_s`` seconds, then reported."""
    entry = entrypoint(command, args, python)  # bad input is refused before anything is contacted
    renv, git = runtime_env(working_dir, env)
    client = _client(address)
    job_id = ""
    deadline = time.monotonic() + agent_wait_s
    while True:  # a head that just started answers before its job agent is up
        try:
            with upload_rules(git):
                job_id = str(client.submit_job(entrypoint=entry, runtime_env=renv))
            break
        except RuntimeError as exc:
            if "No available agent" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Ray head at {address} has no job agent after {agent_wait_s:.0f} s; its dashboard agent "
                    "may have failed to start (for example its port 52365 taken by another Ray on the machine: "
                    "start the head with --dashboard-agent-listen-port=FREE_PORT); see dashboard_agent.log in the "
                    "head's session logs"
                ) from exc
            time.sleep(1)
    emit(f"submitted job {job_id} to {address}\n")
    if not follow:
        return job_id, "PENDING"

    asyncio.run(follow_logs(client, job_id, emit))
    return job_id, str(client.get_job_status(job_id).value)


async def follow_logs(client: Any, job_id: str, emit: Callable[[str], Any], quiet_s: float = QUIET_S) -> None:
    """Print the job's log as it comes, until the job ends; every ``quiet_s`` without a line, ask its status.

    The log stream is a websocket with no time limit of its own: a head that goes silent (a half-open connection,
    a stopped machine) held it forever. The status call has the client's time limits: a head that does not answer
    it is a ConnectionError; a job that ended while its stream stayed open ends the follow.
    """
    last = [time.monotonic()]

    async def pump() -> None:
        async for chunk in client.tail_job_logs(job_id):
            last[0] = time.monotonic()
            emit(chunk)

    task = asyncio.ensure_future(pump())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, last[0] + quiet_s - time.monotonic()))
            if done:
                task.result()  # the stream's own error, if it had one
                return
            if time.monotonic() - last[0] < quiet_s:
                continue
            state = await asyncio.to_thread(client.get_job_status, job_id)
            if state.is_terminal():
                return
            last[0] = time.monotonic()
    finally:
        task.cancel()


def status(address: str, job_id: str) -> str:
    return str(_client(address).get_job_status(job_id).value)


def logs(address: str, job_id: str) -> str:
    return str(_client(address).get_job_logs(job_id))


def stop(address: str, job_id: str) -> bool:
    return bool(_client(address).stop_job(job_id))
