"""``tracerl submit``: send train / sweep / eval to a Ray cluster through the Ray Jobs SDK.

The job's runtime environment uploads the working directory (the repository: configs, the committed tiny
policy; virtual environments, run outputs and stores left out) and the entrypoint is the ``tracerl`` command
(or ``PYTHON -m workflows.cli`` with ``--python``, for heads whose PATH has no ``tracerl``: Ray resolves the
entrypoint with the PATH of whoever ran ``ray start``). Logs stream until the job ends; ``--status``,
``--logs`` and ``--stop`` act on an existing job. Ray token authentication stays on: the client reads the
token the way the ``ray`` CLI does (``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN`` or the local token file).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SUBMITTABLE = ("train", "sweep", "eval")
EXCLUDES = [".git", ".venv", ".venv-vllm", "runs", "bench_out", "eval_out", "rollout_out", "mlruns.db",
            "mlartifacts", "mlruns", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"]


def _client(address: str) -> Any:
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def entrypoint(command: str, args: Sequence[str], python: str | None = None) -> str:
    if command not in SUBMITTABLE:
        raise ValueError(f"tracerl submit sends one of {', '.join(SUBMITTABLE)} (got {command!r})")
    head = [python, "-m", "workflows.cli"] if python else ["tracerl"]
    return " ".join(shlex.quote(a) for a in [*head, command, *args])


def submit(address: str, command: str, args: Sequence[str], working_dir: str = ".", python: str | None = None,
           follow: bool = True, env: dict[str, str] | None = None,
           emit: Callable[[str], None] = lambda s: print(s, end="", flush=True),
           agent_wait_s: float = 120.0) -> tuple[str, str]:
    """Submit; returns (job id, final status or 'PENDING' when not following). A head without a job agent is
    retried for ``agent_wait_s`` seconds, then reported."""
    client = _client(address)
    runtime_env: dict[str, Any] = {"working_dir": str(Path(working_dir).resolve()), "excludes": EXCLUDES}
    if env:
        runtime_env["env_vars"] = dict(env)
    job_id = ""
    deadline = time.monotonic() + agent_wait_s
    while True:  # a head that just started answers before its job agent is up
        try:
            job_id = str(client.submit_job(entrypoint=entrypoint(command, args, python), runtime_env=runtime_env))
            break
        except RuntimeError as exc:
            if "No available agent" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Ray head at {address} has no job agent after {agent_wait_s:.0f} s; its dashboard agent "
                    "may have failed to start (for example its port 52365 taken by another Ray on the machine: "
                    "start the head with --dashboard-agent-listen-port=FREE_PORT); see dashboard_agent.log in the "
                    "head's session logs") from exc
            time.sleep(1)
    emit(f"submitted job {job_id} to {address}\n")
    if not follow:
        return job_id, "PENDING"

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            emit(chunk)

    asyncio.run(tail())
    return job_id, str(client.get_job_status(job_id).value)


def status(address: str, job_id: str) -> str:
    return str(_client(address).get_job_status(job_id).value)


def logs(address: str, job_id: str) -> str:
    return str(_client(address).get_job_logs(job_id))


def stop(address: str, job_id: str) -> bool:
    return bool(_client(address).stop_job(job_id))
