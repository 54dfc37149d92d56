"""A study's finished runs as files in a folder (``archive_dir``), so a study can move between MLflow stores: to a
fresh checkout, another machine, or the next session of a long grid, where the store it ran in is gone.

Each FINISHED child run of the study's parent (cells and baselines) is written once, as
``<archive_dir>/<run name>-<run id>.json.gz``: its name, start and end time, tags, params, every metric's full
history (step, timestamp, value) and its small artifacts (files of at most ``MAX_ARTIFACT_BYTES``: the curve, the
evaluation outcomes; checkpoints stay out). At the start of ``tracerl study`` every archived run that the store does
not hold yet (matched by the tag ``tracerl.study.archived_run``, the original run id) is recreated under the study's
parent run, FINISHED, with the same metrics, steps and timestamps, so the grid skips its cell and the report reads it
as if it had run here. A cut cell is not archived: it resumes from its checkpoint in the store it ran in, or reruns.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARCHIVED_TAG = "tracerl.study.archived_run"
"""On a run recreated from the archive: the id of the run it was archived from."""
MAX_ARTIFACT_BYTES = 512 * 1024
"""Artifacts larger than this are not archived (they are listed in the file's ``skipped_artifacts``)."""
FORMAT = 1


def _file_name(name: str, run_id: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}-{run_id}.json.gz"


def _artifacts(client: Any, run_id: str, path: str | None = None) -> list[Any]:
    """Every artifact file of the run (recursively), as MLflow's FileInfo."""
    out = []
    for f in client.list_artifacts(run_id, path):
        out.extend(_artifacts(client, run_id, f.path) if f.is_dir else [f])
    return out


def export_run(client: Any, run: Any, folder: Path) -> Path:
    """Write one finished run into ``folder`` (see the module's docstring); returns the file."""
    rid = run.info.run_id
    metrics = {
        key: [[m.step, m.timestamp, m.value] for m in client.get_metric_history(rid, key)]
        for key in sorted(run.data.metrics)
    }
    artifacts: dict[str, str] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in _artifacts(client, rid):
            if (f.file_size or 0) > MAX_ARTIFACT_BYTES:
                skipped.append(f.path)
                continue
            local = Path(client.download_artifacts(rid, f.path, tmp))
            artifacts[f.path] = local.read_text(errors="replace")
    record = {
        "format": FORMAT,
        "run_id": rid,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "start_time": run.info.start_time,
        "end_time": run.info.end_time,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params),
        "metrics": metrics,
        "artifacts": artifacts,
        "skipped_artifacts": skipped,
    }
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / _file_name(run.info.run_name or "run", rid)
    part = out.with_name(out.name + ".part")
    with open(part, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(json.dumps(record, sort_keys=True).encode())  # mtime 0: the same run gives the same bytes
    part.replace(out)
    return out


def archived_ids(folder: Path) -> set[str]:
    """The original run ids the folder holds (read from the file names)."""
    return {p.name[: -len(".json.gz")].rsplit("-", 1)[-1] for p in folder.glob("*.json.gz")}


def export_finished(
    client: Any, exp_id: str, parent: str, folder: Path, progress: Callable[[str], None] = lambda s: None
) -> list[Path]:
    """Archive every FINISHED child run of ``parent`` not archived yet (a run recreated from the archive counts as
    archived under its original id)."""
    have = archived_ids(folder)
    written = []
    for r in client.search_runs(
        [exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=5000
    ):
        rid = r.data.tags.get(ARCHIVED_TAG, r.info.run_id)
        if r.info.status != "FINISHED" or rid in have:
            continue
        written.append(export_run(client, r, folder))
        have.add(rid)
    if written:
        progress(f"archived {len(written)} finished run(s) to {folder}")
    return written


def import_archive(
    client: Any, exp_id: str, parent: str, folder: Path, progress: Callable[[str], None] = lambda s: None
) -> list[str]:
    """Recreate under ``parent`` every archived run the store does not hold yet; returns the new run ids.

    Raises:
        ValueError: a file that is not an archived run (naming it).
    """
    from mlflow.entities import Metric, Param  # slow to import: mlflow

    files = sorted(folder.glob("*.json.gz")) if folder.is_dir() else []
    if not files:
        return []
    held = {
        r.data.tags.get(ARCHIVED_TAG, r.info.run_id)
        for r in client.search_runs(
            [exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=5000
        )
    }
    made = []
    for path in files:
        try:
            with gzip.open(path, "rt") as fh:
                rec = json.load(fh)
            if rec.get("format") != FORMAT:
                raise ValueError(f"format {rec.get('format')!r}, expected {FORMAT}")
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a study archive file ({e}); remove it or re-export the run") from e
        if rec["run_id"] in held:
            continue
        tags = {**rec["tags"], "mlflow.parentRunId": parent, ARCHIVED_TAG: rec["run_id"]}
        run = client.create_run(exp_id, start_time=rec["start_time"], tags=tags, run_name=rec["run_name"])
        rid = run.info.run_id
        params = [Param(k, str(v)) for k, v in rec["params"].items()]
        for i in range(0, len(params), 100):
            client.log_batch(rid, params=params[i : i + 100])
        metrics = [
            Metric(k, float(v), int(ts), int(step))
            for k, pts in rec["metrics"].items()
            for step, ts, v in pts
        ]
        for i in range(0, len(metrics), 1000):
            client.log_batch(rid, metrics=metrics[i : i + 1000])
        with tempfile.TemporaryDirectory() as tmp:
            for apath, text in rec["artifacts"].items():
                local = Path(tmp) / apath
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(text)
                parent_dir = str(Path(apath).parent)
                client.log_artifact(rid, str(local), None if parent_dir == "." else parent_dir)
        client.set_tag(rid, "tracerl.study.archive_file", path.name)
        client.set_terminated(rid, status=rec["status"], end_time=rec["end_time"])
        made.append(rid)
        held.add(rec["run_id"])
    if made:
        progress(f"restored {len(made)} finished run(s) from {folder}")
    return made


__all__ = ["ARCHIVED_TAG", "archived_ids", "export_finished", "export_run", "import_archive"]
