"""MLflow wiring: one place that knows where runs go and how they are opened, tagged and logged.

Where runs go: ``tracking.uri`` when a config sets it; else ``$MLFLOW_TRACKING_URI`` (MLflow's own convention, set by
the k8s manifests); else ``sqlite:///mlruns.db`` in the working directory. Workflows resolve it once at start and
save the resolved URI with a run (its config.yaml and params), so a resume reads the same store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracerl.config import TrackingConfig


def _artifact_uri(location: str) -> str:
    if "://" in location:
        return location
    return Path(location).resolve().as_uri()


DEFAULT_URI = "sqlite:///mlruns.db"
ENV_VAR = "MLFLOW_TRACKING_URI"


def resolve_uri(uri: str | None) -> str:
    """``uri`` when set; else ``$MLFLOW_TRACKING_URI`` when set and not empty; else ``sqlite:///mlruns.db``."""
    if uri:
        return uri
    return os.environ.get(ENV_VAR, "").strip() or DEFAULT_URI


def resolved(cfg: TrackingConfig) -> TrackingConfig:
    """``cfg`` with its URI resolved (``resolve_uri``)."""
    return cfg if cfg.uri else dataclasses.replace(cfg, uri=resolve_uri(cfg.uri))


def where(cfg: TrackingConfig) -> str:
    """One line saying where runs go and which setting chose it (commands print it at start)."""
    if not cfg.enabled:
        return "MLflow tracking is off (tracking.enabled=false)"
    if cfg.uri:
        source = "tracking.uri"
    elif os.environ.get(ENV_VAR, "").strip():
        source = f"${ENV_VAR}"
    else:
        source = f"the default; set tracking.uri or ${ENV_VAR} to change it"
    return f"MLflow tracking at {resolve_uri(cfg.uri)} (from {source})"


# MLflow 3's UI opens an experiment of this kind on its runs table (one without a kind opens on the GenAI overview).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


PROBE_CONNECT_S = 5.0
PROBE_ANSWER_S = 15.0


class TrackingUnreachable(ConnectionError):
    """No tracking server answers at the configured address; the message names it and says what to do."""


def check_reachable(uri: str) -> None:
    """Fail fast, in one line, when nothing answers at an ``http(s)`` tracking URI (any HTTP answer will do).

    MLflow's own client retries an unreachable server for minutes (7 retries with back-off, 120 s each) and then
    raises a long traceback; this probe answers in at most ``PROBE_CONNECT_S + PROBE_ANSWER_S`` seconds. Other
    schemes (a SQLite or file store) are left to MLflow.

    Raises:
        TrackingUnreachable: the connection was refused, timed out, or the server accepted it and did not answer.
    """
    if not uri.startswith(("http://", "https://")):
        return
    import requests  # slow to import: requests (the CLI imports this module at start-up)

    fix = (
        "start the server (`mlflow server --host 127.0.0.1 --port PORT`, or `tracerl ui` for a local store) or "
        f"point tracking.uri (or ${ENV_VAR}) at one that runs, e.g. tracking.uri={DEFAULT_URI}"
    )
    try:
        requests.get(uri.rstrip("/") + "/health", timeout=(PROBE_CONNECT_S, PROBE_ANSWER_S))
    except requests.exceptions.ConnectTimeout:
        raise TrackingUnreachable(
            f"tracking server {uri}: no answer to a connection within {PROBE_CONNECT_S:.0f} s; {fix}"
        ) from None
    except requests.exceptions.ReadTimeout:
        raise TrackingUnreachable(
            f"tracking server {uri}: it accepted a connection but did not answer within {PROBE_ANSWER_S:.0f} s "
            f"(is it an MLflow server?); {fix}"
        ) from None
    except requests.exceptions.RequestException as exc:
        reason = "connection refused" if "refused" in str(exc).lower() else type(exc).__name__
        raise TrackingUnreachable(f"tracking server {uri}: cannot connect ({reason}); {fix}") from None


def setup(cfg: TrackingConfig, experiment: str | None = None) -> str:
    """Point MLflow at ``cfg.uri`` (resolved) and make sure the experiment exists, marked as a model-training
    experiment (an existing one that has no kind gets it); returns its id.

    Raises:
        TrackingUnreachable: ``cfg.uri`` is an HTTP address where no server answers (``check_reachable``).
    """
    import mlflow  # slow to import: mlflow

    uri = resolve_uri(cfg.uri)
    check_reachable(uri)
    mlflow.set_tracking_uri(uri)
    name = experiment or cfg.experiment
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        mark_kind(client, exp)
        return str(exp.experiment_id)
    location = None if uri.startswith(("http://", "https://")) else _artifact_uri(cfg.artifact_location)
    return str(client.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND])))


def mark_kind(client: Any, exp: Any) -> None:
    """Tag an experiment that has no ``mlflow.experimentKind`` as model training (one with a kind is left alone)."""
    if EXPERIMENT_KIND[0] not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)


def _clean(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


@contextlib.contextmanager
def run(
    cfg: TrackingConfig, name: str, experiment: str | None = None, tags: Mapping[str, str] | None = None
) -> Iterator[Any]:
    """Open an MLflow run (or a no-op when tracking is disabled); yields the run or None."""
    if not cfg.enabled:
        yield None
        return
    import mlflow  # slow to import: mlflow

    exp_id = setup(cfg, experiment)
    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags=dict(tags or {})) as active:
        yield active


def log_params(params: Mapping[str, Any]) -> None:
    import mlflow  # slow to import: mlflow

    items = {k: ("null" if v is None else str(v))[:6000] for k, v in params.items()}
    keys = list(items)
    for i in range(0, len(keys), 100):  # MLflow caps a batch at 100 params
        mlflow.log_params({k: items[k] for k in keys[i : i + 100]})


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    import mlflow  # slow to import: mlflow

    mlflow.log_metrics(_clean(metrics), step=step)


def log_step_series(series: Sequence[Mapping[str, float]]) -> None:
    """Log a list of per-step metric dicts in one batch call (much faster than one call per step)."""
    # slow to import: mlflow
    import mlflow
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(k, v, now, s) for s, m in enumerate(series) for k, v in _clean(m).items()]
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError(
            "log_step_series logs into the active MLflow run: start one first (mlflow.start_run)"
        )
    client, run_id = mlflow.MlflowClient(), run.info.run_id
    for i in range(0, len(batch), 1000):
        client.log_batch(run_id, metrics=batch[i : i + 1000])
