"""``tracerl ui``: the MLflow UI on a tracking store, opened on the experiment's runs table.

The printed URL is the runs page in MLflow 3's model-training mode with the key/ metrics and tracerl tags as
columns (workflows/tracking/run_info.py); the server runs in its own process group and ends with this command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from tracerl.workflows.tracking.run_info import VIEW_TAG, runs_url, runs_view_state
from tracerl.workflows.tracking.store import mark_kind


def server_env() -> dict[str, str]:
    """The environment for an ``mlflow server`` / ``mlflow ui`` this project starts: MLflow 3's server also spawns
    a huey job runner and its consumer processes (GenAI jobs: judges, prompt optimisation) that no tracerl command
    uses; off unless ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` is set, which saves their CPU and start-up time."""
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def experiment_url(uri: str, experiment: str, base: str) -> str:
    """The runs page of ``experiment`` (marked as model training so the UI opens on its runs), or the UI's
    home page where the store has no such experiment."""
    import mlflow  # slow to import: mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return f"{base}  (no experiment {experiment!r} in this store yet)"
    mark_kind(client, exp)
    client.set_experiment_tag(exp.experiment_id, VIEW_TAG, runs_view_state())
    return runs_url(base, exp.experiment_id)


def stop_group(proc: Any) -> None:
    """End the MLflow UI and the server processes it started (its own process group): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=20)
            return
        except ProcessLookupError:
            return
        except (
            subprocess.TimeoutExpired
        ):  # `mlflow ui` outlives a TERM of its server (measured with MLflow 3.17)
            continue


READY_S = 180.0
"""How long ``serve`` waits for the MLflow UI to answer /health before it gives up (a busy machine's start-up
of MLflow's server, measured over 60 s with four workers on 2 loaded cores)."""


def serve(uri: str, host: str, port: int, experiment: str, check: bool = False) -> int:
    """Start the MLflow UI on ``uri``, print the runs page of ``experiment`` once it answers, and serve until
    interrupted (``check``: stop right away); returns the exit code."""
    from tracerl.workflows.tracking.compare import ui_command  # slow to import: pandas (tracking.compare)

    url = f"http://{host}:{port}"
    # Its own process group, ended as a whole below: a TERM of `tracerl ui` (a test, a job runner) leaves no server.
    proc = subprocess.Popen(ui_command(uri, host, port), start_new_session=True, env=server_env())
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)) if main_thread else None
    try:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                print(
                    f"tracerl: the MLflow UI exited with code {proc.returncode} (is port {port} in use?)",
                    file=sys.stderr,
                )
                return 2
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            print(
                f"tracerl: the MLflow UI did not answer {url}/health within {READY_S:.0f} s; it was stopped "
                "(try again, or run `mlflow ui` yourself to see why)",
                file=sys.stderr,
            )
            return 2
        print(f"MLflow UI on {uri}: {experiment_url(uri, experiment, url)}", flush=True)
        if not check:
            proc.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(proc)
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
