"""Runs without MLflow (``tracking.enabled: false``): the part of ``mlflow.MlflowClient`` that ``tracerl train``
calls, kept in files under each run's storage directory ``<out_dir>/<run name>-<run id[:8]>``.

* ``metrics.jsonl``: one JSON object a line for each step logged, ``{"step": S, "timestamp": MS, KEY: VALUE, ...}``
  holding each of the step's metrics once (the held-out evaluation before training is the line of step 0). A step
  a restarted trainer re-runs gets a second line, later; readers take the last (``tracerl.workflows.tracking.runs.
  metric_series``). The learning curve's ``curve/`` metrics, logged against tokens, are not written here: they are
  ``curve.jsonl`` beside it.
* ``params.json``: the resolved config, flattened (``allocator.name``, ...), and the params the run adds
  (``threads/trainer``, ``threads/sampler``).
* ``run.json``: the run's name, tags and status; ``artifacts/``: what would be the run's MLflow artifacts.

Nothing here registers a model or resumes a run: those need an MLflow store.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tracerl.workflows.tracking.store import resolve_uri

METRICS = "metrics.jsonl"
PARAMS = "params.json"
RUN = "run.json"
CURVE_PREFIX = "curve/"


class LocalRuns:
    """Runs kept as files under ``out_dir`` (one directory a run), with ``MlflowClient``'s method names."""

    def __init__(self, out_dir: Path | str) -> None:
        self.out_dir = Path(out_dir)
        self._dirs: dict[str, Path] = {}
        self._read: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # run id -> (bytes parsed, their lines)

    def storage(self, run_id: str) -> Path:
        """The run's directory: ``<out_dir>/<name>-<id[:8]>`` (made by ``create_run``, found by its id after)."""
        if run_id not in self._dirs:
            found = sorted(self.out_dir.glob(f"*-{run_id[:8]}"))
            if len(found) != 1:
                raise FileNotFoundError(f"no single run directory for run {run_id} under {self.out_dir}")
            self._dirs[run_id] = found[0]
        return self._dirs[run_id]

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> Any:
        run_id = uuid.uuid4().hex
        d = self.out_dir / f"{run_name}-{run_id[:8]}"
        d.mkdir(parents=True, exist_ok=True)
        self._dirs[run_id] = d
        self._write_run(run_id, {"run_id": run_id, "name": run_name, "status": "RUNNING", "tags": dict(tags)})
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))

    def _read_run(self, run_id: str) -> dict[str, Any]:
        path = self.storage(run_id) / RUN
        return json.loads(path.read_text()) if path.is_file() else {"run_id": run_id, "tags": {}}

    def _write_run(self, run_id: str, rec: dict[str, Any]) -> None:
        _replace(self.storage(run_id) / RUN, json.dumps(rec, indent=2))

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        rec = self._read_run(run_id)
        rec.setdefault("tags", {})[key] = str(value)
        self._write_run(run_id, rec)

    def update_run(self, run_id: str, status: str) -> None:
        rec = self._read_run(run_id)
        rec["status"] = status
        self._write_run(run_id, rec)

    def set_terminated(self, run_id: str, status: str = "FINISHED") -> None:
        self.update_run(run_id, status)

    def get_run(self, run_id: str) -> Any:
        rec = self._read_run(run_id)
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id, status=rec.get("status", "RUNNING")),
            data=SimpleNamespace(tags=rec.get("tags", {}), params=self.params(run_id)),
        )

    def params(self, run_id: str) -> dict[str, str]:
        path = self.storage(run_id) / PARAMS
        return json.loads(path.read_text()) if path.is_file() else {}

    def log_batch(
        self, run_id: str, metrics: Iterable[Any] = (), params: Iterable[Any] = (), tags: Iterable[Any] = ()
    ) -> None:
        """Params merge into params.json; metrics are appended as one line per step they hold (each line
        fsynced: a checkpoint taken after a step's log never outruns it)."""
        params = list(params)
        if params:
            merged = {**self.params(run_id), **{p.key: p.value for p in params}}
            _replace(self.storage(run_id) / PARAMS, json.dumps(merged, indent=1, sort_keys=True))
        for t in tags:
            self.set_tag(run_id, t.key, t.value)
        lines: dict[int, dict[str, Any]] = {}
        for m in metrics:
            if m.key.startswith(CURVE_PREFIX):
                continue  # logged against tokens, kept in curve.jsonl
            line = lines.setdefault(int(m.step), {"step": int(m.step), "timestamp": int(m.timestamp)})
            line[m.key] = float(m.value)
            line["timestamp"] = max(line["timestamp"], int(m.timestamp))
        if lines:
            with open(self.storage(run_id) / METRICS, "a") as f:
                f.write("".join(json.dumps(v) + "\n" for _, v in sorted(lines.items())))
                f.flush()
                os.fsync(f.fileno())

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        return [
            SimpleNamespace(key=key, value=r[key], step=r["step"], timestamp=r["timestamp"])
            for r in self._rows(run_id)
            if key in r
        ]

    def _rows(self, run_id: str) -> list[dict[str, Any]]:
        """The run's metric lines, reading only what was appended since the last call (the progress bar polls this
        every few seconds for the whole run)."""
        path = self.storage(run_id) / METRICS
        offset, rows = self._read.get(run_id, (0, []))
        if path.is_file():
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            rows = rows + [json.loads(x) for x in whole.splitlines() if x.strip()]
            self._read[run_id] = (offset + len(whole), rows)
        return rows

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        dest = self.storage(run_id) / "artifacts" / (artifact_path or "")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local_path, dest / Path(local_path).name)

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        dest = self.storage(run_id) / "artifacts" / (artifact_path or "")
        shutil.copytree(local_dir, dest, dirs_exist_ok=True)


def read_metrics(storage: Path) -> list[dict[str, Any]]:
    """The lines of a run's ``metrics.jsonl``, in the order they were logged."""
    path = storage / METRICS
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def tracking_client(tracking: Any, out_dir: Path | str) -> Any:
    """The client a training run logs through: MLflow's, pointed at ``tracking.uri`` (resolved), or with
    ``tracking.enabled: false`` the run files under ``out_dir``."""
    if not tracking.enabled:
        return LocalRuns(out_dir)
    import mlflow  # slow to import: mlflow (not needed with tracking.enabled: false)

    mlflow.set_tracking_uri(resolve_uri(tracking.uri))
    return mlflow.MlflowClient()
