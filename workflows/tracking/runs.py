"""Run bookkeeping shared by train, registry, compare, sweep and the chaos drill: a training run's creation (or the
config it resumes with), where its storage and checkpoints are, its lineage (git SHA, config hash, dataset
fingerprint), the phase marker rank 0 keeps for the fault drill, and summaries read back from MLflow (the last
value logged per step wins, so a step re-run after a restart is read once, from the attempt that completed it)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

from tracerl import metrics as M
from tracerl.config import TrainConfig
from tracerl.config_loader import compose, to_flat_dict, to_yaml
from tracerl.workflows.ops.disk import no_space, store_path
from tracerl.workflows.tracking import store as trk
from tracerl.workflows.tracking.checkpoint_files import newest_good
from tracerl.workflows.tracking.outage import PatientClient
from tracerl.workflows.tracking.spool import MetricLog, MetricsPending, PendingStatus, flush_within
from tracerl.workflows.tracking.store import TrackingUnreachable, resolve_uri

PHASE = ".phase"
PENDING = ".chaos_pending"
"""Present while the chaos controller still has kills to make (the chaos drill, conf/train/chaos.yaml)."""
HOLD = "hold"
"""The phase of a run whose last step waits for the controller's ``PENDING`` kills."""


def git_sha() -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def config_hash(cfg: TrainConfig) -> str:
    """Hash of the resolved config, leaving out what does not change the result (names, paths of outputs)."""
    flat = {
        k: v
        for k, v in to_flat_dict(cfg).items()
        if not k.startswith(("tracking.", "cluster.", "faults.", "chaos."))
        and k not in ("run_name", "resume", "out_dir")
    }
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


def dataset_fingerprint(cfg: TrainConfig) -> str:
    """Hash of the training prompts (ids, texts and answers)."""
    from tracerl.workflows.lm.stack import task_prompts  # slow to import: torch, transformers (lm.stack)

    h = hashlib.sha256()
    for p in task_prompts(cfg.env):
        h.update(f"{p.prompt_id}\x00{p.text}\x00{p.answer}\x01".encode())
    return h.hexdigest()[:16]


def latest_checkpoint(run_dir: Path, say: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint under a run's storage directory (``tracerl.workflows.tracking.checkpoint_files.newest_good``);
    ``say`` gets one line for each newer one passed over, naming the file that failed its check."""
    choice = newest_good(run_dir)
    if say is not None:
        for line in choice.notes():
            say(line)
    return choice.path


def run_storage(run_id: str, tracking: Any) -> Path:
    """A training run's Ray Train storage directory, from its MLflow tags."""
    import mlflow  # slow to import: mlflow

    trk.setup(tracking)
    try:
        run = mlflow.MlflowClient().get_run(run_id)
    except Exception as e:  # noqa: BLE001 - MLflow raises its own exception types per store
        raise LookupError(
            f"no MLflow run {run_id!r} at {resolve_uri(tracking.uri)} ({e.__class__.__name__})"
        ) from None
    storage = run.data.tags.get("tracerl.storage")
    if not storage:
        raise LookupError(f"MLflow run {run_id} was not made by `tracerl train` (no tracerl.storage tag)")
    return Path(storage)


def create_run(
    client: Any, exp_id: str, cfg: TrainConfig, tags: dict[str, str]
) -> tuple[str, Path, TrainConfig]:
    """A new MLflow run of ``tracerl train``: lineage tags (git SHA, config hash, dataset fingerprint) plus ``tags``,
    its storage directory ``<out_dir>/<run name>-<id>`` holding the resolved config (also the run's params and an
    artifact). Returns the run id, the storage and the config with its run name."""
    import mlflow  # slow to import: mlflow

    name = cfg.run_name or f"{cfg.allocator.name}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = client.create_run(
        exp_id,
        run_name=name,
        tags={
            "tracerl.command": "train",
            "tracerl.allocator": cfg.allocator.name,
            "tracerl.git_sha": git_sha(),
            "tracerl.config_hash": config_hash(cfg),
            "tracerl.dataset_fingerprint": dataset_fingerprint(cfg),
            "tracerl.base_model": cfg.model.path,
            **tags,
        },
    )
    run_id = run.info.run_id
    storage = Path(cfg.out_dir) / f"{name}-{run_id[:8]}"
    cfg = dataclasses.replace(cfg, run_name=name)
    with failing_run(client, run_id, storage):
        storage.mkdir(parents=True, exist_ok=True)
        PendingStatus(storage).reserve()
        (storage / "config.yaml").write_text(to_yaml(cfg))
        client.set_tag(run_id, "tracerl.storage", str(storage))
        flat = to_flat_dict(cfg)
        for i in range(0, len(flat), 100):
            keys = list(flat)[i : i + 100]
            client.log_batch(
                run_id,
                params=[
                    mlflow.entities.Param(k, ("null" if flat[k] is None else str(flat[k]))[:6000])
                    for k in keys
                ],
            )
        client.log_artifact(run_id, str(storage / "config.yaml"))
    return run_id, storage, cfg


@contextlib.contextmanager
def failing_run(client: Any, run_id: str, storage: Path | None = None) -> Iterator[None]:
    """A run whose set-up fails (a full disk at its storage, a server that stopped answering) is marked FAILED, not
    left RUNNING, and the error goes on. When the store cannot take that status either, it is kept in the run's
    ``status.pending`` (where that can be written), which the next ``tracerl train`` with the same ``out_dir`` or
    ``tracerl sync RUN`` sends."""
    try:
        yield
    except BaseException:
        try:
            client.set_terminated(run_id, status="FAILED")
        except Exception:  # noqa: BLE001 - the store may be what is full or away
            if storage is not None and storage.is_dir():
                PendingStatus(storage).record(run_id, "FAILED")
        raise


def resumed_config(
    run_id: str, tracking: Any, overrides: list[str], say: Callable[[str], None] = lambda s: None
) -> tuple[TrainConfig, Path, Path | None]:
    """What ``resume=RUN_ID`` continues with: the run's saved config.yaml with the command's other overrides on top,
    its storage, and its newest complete checkpoint (None: none yet; ``say`` names each damaged newer one)."""
    storage = run_storage(run_id, tracking)
    saved = storage / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"run {run_id} has no saved config at {saved}")
    keep = [o for o in overrides if not o.startswith("resume=")]
    cfg = compose(TrainConfig, saved, keep + [f"resume={run_id}"])
    return cfg, storage, latest_checkpoint(storage, say)


def end_run(
    client: Any,
    run_id: str,
    storage: Path,
    status: str,
    progress: Callable[[str], None],
    store: str,
    failed_note: bool = True,
    flush_timeout_s: float = 120.0,
) -> str | None:
    """Close a training run: send what rank 0 spooled, set its final status (KILLED when a sweep's scheduler stopped
    it), say how to resume one that did not finish. A store too full to take the status keeps it under the storage
    (``tracerl.workflows.tracking.spool.PendingStatus``, sent by a later command); returns where the disk was full (``store``, the
    tracking URI, when the error does not say; None: it was not full).

    Raises:
        tracerl.workflows.tracking.spool.MetricsPending: the server did not take the spooled metrics within
            ``flush_timeout_s``; the status is kept with them and nothing of the end was sent (the run stays RUNNING).
    """

    def pending(unsent: int) -> MetricsPending:
        if not PendingStatus(storage).record(run_id, status):
            raise OSError(f"cannot keep the run's status in {storage}")
        return MetricsPending(run_id, storage, store, unsent, flush_timeout_s, status)

    try:
        log = MetricLog(client, run_id, storage, 0, progress)  # fail fast: the wait below is the bound
        if not flush_within(log, flush_timeout_s, progress):
            raise pending(log.unsent())
        # The server took the metrics; should it stop answering now, the status waits for it in the same bounds.
        patient = PatientClient(client, store, flush_timeout_s, progress)
        try:
            if status == "FAILED" and "tracerl.stopped_early" in patient.get_run(run_id).data.tags:
                status = (
                    "KILLED"  # a sweep's scheduler stopped this trial (said so) before its Train run ended
                )
            patient.set_terminated(run_id, status=status)
        except TrackingUnreachable:
            raise pending(0) from None
    except Exception as exc:  # noqa: BLE001 - the stores raise their own types; only a full disk is handled
        full = no_space(exc)
        if full is None:
            raise
        PendingStatus(storage).record(run_id, status)  # the caller's line says whether it was kept
        return full or store_path(store)
    if status in ("FAILED", "KILLED") and failed_note:
        what = "training failed" if status == "FAILED" else "training stopped"
        progress(f"{what}; the run and its checkpoints are kept: `tracerl train resume={run_id}`")
    return None


def metric_series(client: Any, run_id: str, key: str) -> dict[int, float]:
    """step -> value, the last value logged for each step winning (steps re-run after a restart)."""
    series: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        prev = series.get(m.step)
        if prev is None or m.timestamp >= prev[0]:
            series[m.step] = (m.timestamp, m.value)
    return {s: v for s, (_, v) in sorted(series.items())}


class RunSummary(TypedDict, total=False):
    """``tracerl train``'s summary, also ``<storage>/summary.json``: the run, its held-out accuracy before and after
    (when evaluated), mean effective ratio, what it spent, what stopped it and how far past its compute limits
    (``overshoot_*``, with a compute stop); ``chaos``: the drill's report, on a drill run."""

    run_id: str
    storage: str
    wall_s: float
    tracking_uri: str | None
    experiment: str
    steps: int
    acc_before: float
    acc_after: float
    accuracy_by_step: dict[int, float]
    effective_ratio: float
    leaves: int
    generated_tokens: int
    tool_calls: int
    retried: int
    alloc_predictor_fraction_of_rollout: float
    stopped_by: str | None
    total_cpu_s: float
    overshoot_tokens: float
    overshoot_cpu_s: float
    chaos: dict[str, Any]


def run_summary(run_id: str, tracking: Any, client: Any = None) -> RunSummary:
    """Held-out accuracy before/after, mean effective ratio, budget spent: from the run's metrics (in ``client``,
    default the MLflow store of ``tracking``)."""
    if client is None:
        import mlflow  # slow to import: mlflow

        trk.setup(tracking)
        client = mlflow.MlflowClient()

    def total(key: str) -> int:
        return int(sum(metric_series(client, run_id, key).values()))

    acc = metric_series(client, run_id, M.EVAL_ACCURACY)
    er = metric_series(client, run_id, M.EFFECTIVE_RATIO)
    out = RunSummary(steps=len(er))
    if acc:
        out["acc_before"] = acc[min(acc)]
        out["acc_after"] = acc[max(acc)]
        out["accuracy_by_step"] = acc
    out["effective_ratio"] = sum(er.values()) / len(er) if er else float("nan")
    out["leaves"] = total(M.LEAVES)
    out["generated_tokens"] = total(M.GENERATED_TOKENS)
    out["tool_calls"] = total(M.TOOL_CALLS)
    out["retried"] = total(M.RETRIED)
    rollout = sum(metric_series(client, run_id, M.TIME_ROLLOUT).values())
    overhead = sum(
        sum(metric_series(client, run_id, M.phase_time(k)).values()) for k in M.ALLOC_PREDICTOR_PHASES
    )
    out["alloc_predictor_fraction_of_rollout"] = overhead / rollout if rollout else float("nan")
    return out


def format_summary(s: RunSummary) -> str:
    rows = [
        ("MLflow run" if s.get("tracking_uri", "") is not None else "run", s.get("run_id", "")),
        ("steps", s.get("steps", 0)),
    ]
    if "acc_before" in s:
        rows += [
            ("held-out greedy accuracy before", f"{s['acc_before']:.3f}"),
            ("held-out greedy accuracy after", f"{s['acc_after']:.3f}"),
            ("change (points)", f"{100 * (s['acc_after'] - s['acc_before']):+.1f}"),
        ]
    rows += [
        ("mean effective ratio", f"{s.get('effective_ratio', float('nan')):.3f}"),
        ("leaves", s.get("leaves", 0)),
        ("generated tokens", s.get("generated_tokens", 0)),
        ("tool calls", s.get("tool_calls", 0)),
        ("work retried after actor failures", s.get("retried", 0)),
        (
            "allocation + predictor time / rollout time",
            f"{s.get('alloc_predictor_fraction_of_rollout', 0):.1%}",
        ),
        ("wall time", f"{s.get('wall_s', 0):.0f} s"),
    ]
    if s.get("stopped_by") in ("tokens", "cpu_s"):  # a compute stop: what ended the run, and by how much past
        key = "overshoot_tokens" if s["stopped_by"] == "tokens" else "overshoot_cpu_s"
        rows.append(("stopped by", f"stop.{s['stopped_by']} ({s.get(key, 0):.0f} past it)"))
    w = max(len(k) for k, _ in rows)
    lines = [f"{k:<{w}}  {v}" for k, v in rows]
    uri = s.get("tracking_uri", "sqlite:///mlruns.db")
    if uri is None:  # tracking.enabled: false (workflows/tracking/local_runs.py)
        lines.append(f"\nmetrics in {s.get('storage', '')}/metrics.jsonl (tracking off)")
    elif uri.startswith(("sqlite:", "postgresql:", "mysql:")):
        exp = s.get("experiment", "tracerl")
        lines.append(
            f"\nopen the MLflow UI on these results:  tracerl ui --tracking-uri {uri}"
            + ("" if exp == "tracerl" else f" --experiment {exp}")
        )
    else:
        lines.append(f"\nopen the MLflow UI at {uri}")
    return "\n".join(lines)


def phase_marker(
    storage: Path, enabled: bool, step: int = 0, hold_at: int | None = None, hold_s: float = 600.0
) -> Callable[..., None]:
    """``mark(phase, step=None)`` writes rank 0's current phase and the step it works on (the step it will be
    logged at; ``step`` until a phase names one) for the controller. Step ``hold_at`` (the run's last) waits in
    phase ``HOLD``, before its rollout, while the controller's ``PENDING`` file exists (at most ``hold_s`` seconds):
    every planned kill lands before the run ends, however fast the machine runs it."""
    if not enabled:
        return lambda name, step=None: None
    path, last = storage / PHASE, [step]

    def write(name: str) -> None:
        tmp = path.with_name(f"{PHASE}.{os.getpid()}.tmp")
        tmp.write_text(f"{name} {last[0]}")
        os.replace(tmp, path)

    def mark(name: str, step: int | None = None) -> None:
        if step is not None:
            last[0] = step
        if name == "rollout" and last[0] == hold_at and (storage / PENDING).exists():
            write(HOLD)  # the controller aims what is left of its plan at this phase
            deadline = time.monotonic() + hold_s
            while (storage / PENDING).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        write(name)

    return mark


def read_phase(storage: Path) -> tuple[str, int]:
    try:
        name, step = (storage / PHASE).read_text().split()
        return name, int(step)
    except (OSError, ValueError):
        return "", -1
