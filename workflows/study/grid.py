"""``tracerl study``: a grid of ``train`` runs (testbed x budget mode x allocator x seed) under one MLflow parent run.

Each cell is a child run of ``train`` tagged with its coordinates (``tracerl.study.testbed/budget/allocator/seed``)
and the git SHA. Running the same config again resumes the study by its name: a cell whose child run FINISHED is
skipped, a cut cell continues from its checkpoint (``train``'s ``resume=RUN_ID``); ``--only`` selects cells,
``--fresh`` re-runs them, ``--report-only`` rebuilds the report (workflows/study/report.py) from MLflow. Cells run
as Ray tasks, ``parallel_cells`` at a time. Token-mode cells spend T generated tokens a step, T being the mean
generated tokens per step of the testbed's leaves-mode grpo cells (``--fill-tokens`` writes it into the config).
What another kind of study adds to the grid (its cells' overrides, what it keeps of a finished cell, its report) is a
``StudyKind``: the learning-curve study (testbeds with ``stop_tokens``, one of the experiments) runs this grid as one.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from tracerl.config import TrainConfig
from tracerl.config_loader import compose, conf_dir
from tracerl.workflows.ops.ray_utils import init_ray
from tracerl.workflows.study.archive import export_finished, import_archive
from tracerl.workflows.study.baseline import BaselineFn, ensure_baselines, evaluate_start
from tracerl.workflows.study.cells import TAG, Cell, Child, enumerate_cells, plan, select
from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.study.report import write_report
from tracerl.workflows.study.token_budget import fill_tokens, token_budget_error
from tracerl.workflows.tracking import store as trk
from tracerl.workflows.tracking.runs import RunSummary, git_sha
from tracerl.workflows.train.run import resolve_paths, train

Progress = Callable[[str], None]


@dataclass(frozen=True)
class StudyKind:
    """What a kind of study adds to the grid of cells. ``GRID`` (study.md) adds nothing; the learning-curve study
    (run by the CLI in place of this one for a config whose testbeds set ``stop_tokens``) stops its cells on tokens,
    keeps each cell's curve file and writes curves.md."""

    report_name: str
    """The markdown report ``write_report`` writes in ``out_dir``."""
    write_report: Callable[[StudyConfig, Any, str, str, Progress], dict[str, Any]] = write_report
    """(config, MLflow client, experiment id, parent run id, progress) -> the report's JSON."""
    check: Callable[[StudyConfig, str | Path], None] = lambda cfg, where: None
    """Raises one ValueError line naming the key (and ``where``, the config's path) when the settings do not fit."""
    cell_overrides: Callable[[StudyConfig, Mapping[str, Any]], list[str]] = lambda cfg, testbed: []
    """A cell's train overrides from its testbed's settings (before the testbed's own overrides)."""
    after_cell: Callable[[Any, Mapping[str, Any]], object] = lambda client, summary: None
    """Keeps what the report needs of a finished cell (MLflow client, the cell's run summary)."""
    kept: str = ""
    """What ``after_cell`` keeps, for the line saying it could not."""


GRID = StudyKind("study.md")


def cell_config(
    cfg: StudyConfig,
    cell: Cell,
    resume: str | None = None,
    root: Path | None = None,
    kind: StudyKind = GRID,
) -> TrainConfig:
    """The cell's train config: its testbed's base config, model and overrides, the study's steps and eval tasks,
    and what its kind adds (a curve study's: its token stop and evaluation schedule)."""
    root = root or conf_dir()
    tb = cfg.testbeds[cell.testbed]
    base = compose(TrainConfig, root / tb["base"], [f"model.path={tb['model_path']}"], root=root)
    overrides = [
        f"model.path={tb['model_path']}",
        f"allocator={cell.allocator}",
        f"seed={cell.seed}",
        f"steps={'null' if cfg.steps is None else cfg.steps}",
        f"env.{base.env.name}.eval_tasks={cfg.eval_tasks}",
        f"run_name={cfg.name}-{cell.key.replace('/', '-')}",
        f"out_dir={cfg.runs_dir}",
        "eval_at_start=false",  # the testbed's baseline evaluated the starting checkpoint once (study_baseline.py)
        *kind.cell_overrides(cfg, tb),
        *[str(o) for o in tb.get("overrides", [])],
    ]
    if cell.budget == "tokens":
        if tb.get("token_budget") is None:
            raise ValueError(token_budget_error(cell.testbed, "the study config"))
        overrides.append(f"budget.token_budget={int(tb['token_budget'])}")
    tcfg = compose(TrainConfig, root / tb["base"], overrides, root=root)
    # Absolute paths and URIs: a cell's Ray task may run in another working directory.
    return resolve_paths(dataclasses.replace(tcfg, tracking=cfg.tracking, cluster=cfg.cluster, resume=resume))


def _parent(client: Any, exp_id: str, cfg: StudyConfig, progress: Callable[[str], None]) -> str:
    runs = client.search_runs(
        [exp_id],
        filter_string=f"tags.`tracerl.command` = 'study' and tags.`{TAG}` = '{cfg.name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if runs:
        client.update_run(runs[0].info.run_id, status="RUNNING")
        progress(f"resuming study {cfg.name} (MLflow parent run {runs[0].info.run_id})")
        return str(runs[0].info.run_id)
    run = client.create_run(
        exp_id,
        run_name=cfg.name,
        tags={"tracerl.command": "study", TAG: cfg.name, "tracerl.git_sha": git_sha()},
    )
    return str(run.info.run_id)


def children(client: Any, exp_id: str, parent: str) -> dict[str, list[Child]]:
    """The study's child runs by cell key; a RUNNING child that saved nothing (killed at once) is marked KILLED."""
    out: dict[str, list[Child]] = {}
    for r in client.search_runs(
        [exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'", max_results=5000
    ):
        t = r.data.tags
        if f"{TAG}.testbed" not in t:
            continue
        key = Cell(t[f"{TAG}.testbed"], t[f"{TAG}.budget"], t[f"{TAG}.allocator"], int(t[f"{TAG}.seed"])).key
        storage = t.get("tracerl.storage")
        resumable = bool(storage) and (Path(storage) / "config.yaml").is_file()
        status = r.info.status
        if status == "RUNNING" and not resumable:
            client.set_terminated(r.info.run_id, status="KILLED")
            status = "KILLED"
        out.setdefault(key, []).append(
            Child(r.info.run_id, status, resumable and status != "FINISHED", int(r.info.start_time or 0))
        )
    return out


def _result(ref: Any) -> dict[str, Any]:
    import ray  # slow to import: ray (and an in-process study never loads Ray)

    return dict(ray.get(ref))


def _run_cell(train_cfg: TrainConfig, tags: dict[str, str]) -> RunSummary:
    return train(train_cfg, tags=tags)


def _cell_here(train_cfg: TrainConfig, tags: dict[str, str]) -> dict[str, Any]:
    """A cell in this process (``cluster.address=inprocess``): its summary as the Ray task's result reads."""
    return dict(_run_cell(train_cfg, tags))


class StudyResult(TypedDict, total=False):
    """What ``run_study`` did: with ``fill_tokens`` only ``filled``; else the parent run, the cells ran, skipped
    (finished earlier) and failed (key: error), the report's JSON and the path of its markdown."""

    filled: bool
    parent_run_id: str
    ran: list[str]
    skipped: list[str]
    failed: dict[str, str]
    report: dict[str, Any]
    report_path: str


def run_study(
    cfg: StudyConfig,
    config_path: str | Path,
    progress: Callable[[str], None] = lambda s: None,
    train_fn: Callable[..., dict[str, Any]] | None = None,
    baseline_fn: BaselineFn | None = None,
    kind: StudyKind = GRID,
) -> StudyResult:
    """Run the selected cells not yet finished, then write the report (a ``StudyResult``). A failed cell does not stop the others: its run is kept and the next invocation resumes it.

    Before its first cell runs, each testbed's starting checkpoint is evaluated once (workflows/study/baseline.py).
    ``train_fn`` and ``baseline_fn`` replace the Ray tasks running ``tracerl.workflows.train.run.train`` and the baseline
    evaluation (a unit test passes fakes that record calls). With ``cluster.address=inprocess`` both run in this
    process, one cell after another, each a ``tracerl train`` in-process (no Ray at all).
    """
    import mlflow  # slow to import: mlflow

    if not cfg.tracking.enabled:
        raise ValueError("tracerl study needs MLflow tracking (tracking.enabled=true)")
    if cfg.cluster.in_process and cfg.parallel_cells > 1:
        raise ValueError(
            f"cluster.address=inprocess runs the cells one after another in this process: set parallel_cells=1 "
            f"(got {cfg.parallel_cells}) or cluster.address=local"
        )
    kind.check(cfg, config_path)
    cells = select(enumerate_cells(cfg), cfg.only)
    progress(trk.where(cfg.tracking))
    exp_id = trk.setup(cfg.tracking)
    client = mlflow.MlflowClient()
    if cfg.fill_tokens:
        for tb, t in fill_tokens(cfg, client, exp_id, config_path, progress).items():
            progress(f"testbed {tb}: T = {t} generated tokens per step written to {config_path}")
        return StudyResult(filled=True)
    parent = _parent(client, exp_id, cfg, progress)
    archive = _archiver(cfg, client, exp_id, parent, progress)
    ran: list[str] = []
    skipped: list[str] = []
    failed: dict[str, str] = {}
    status = "FAILED"
    try:
        if not cfg.report_only:
            todo, skip = plan(cells, children(client, exp_id, parent), cfg.fresh)
            skipped = [c.key for c in skip]
            for c in skip:
                progress(f"cell {c.key}: finished earlier, skipped")
            before = _baselines(cfg, todo, config_path, client, exp_id, parent, progress, baseline_fn, kind)
            archive()
            ran = _run_cells(cfg, todo, parent, progress, train_fn, failed, before, client, archive, kind)
        archive()
        report = kind.write_report(cfg, client, exp_id, parent, progress)
        status = "FAILED" if failed else "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        progress(
            f"study {cfg.name} interrupted: run the same command to continue it (a cut cell resumes from its "
            "last checkpoint)"
        )
        raise
    finally:
        client.set_terminated(parent, status=status)
    return StudyResult(
        parent_run_id=parent,
        ran=ran,
        skipped=skipped,
        failed=failed,
        report=report,
        report_path=str(Path(cfg.out_dir) / kind.report_name),
    )


def _archiver(
    cfg: StudyConfig, client: Any, exp_id: str, parent: str, progress: Callable[[str], None]
) -> Callable[[], None]:
    """With ``archive_dir``: restore its runs into the store now (so finished cells are skipped) and return the
    function that archives newly finished runs; a failure to archive is reported, never fatal (the run is in MLflow)."""
    if not cfg.archive_dir:
        return lambda: None
    folder = Path(cfg.archive_dir)
    import_archive(client, exp_id, parent, folder, progress)

    def archive() -> None:
        try:
            export_finished(client, exp_id, parent, folder, progress)
        except Exception as e:  # noqa: BLE001 - the runs stay in MLflow; the next call archives them
            progress(f"archive {folder}: not written ({e.__class__.__name__}: {e}); the runs stay in MLflow")

    return archive


def _baselines(
    cfg: StudyConfig,
    todo: list[tuple[Cell, str | None]],
    config_path: str | Path,
    client: Any,
    exp_id: str,
    parent: str,
    progress: Callable[[str], None],
    baseline_fn: BaselineFn | None,
    kind: StudyKind = GRID,
) -> dict[str, float]:
    """Each testbed's starting accuracy, evaluated once before its first cell runs (a testbed's first cell to run
    stands for all: same checkpoint, same tasks); nothing when no cell is left.

    Raises:
        ValueError: a token-budget cell's testbed has no ``token_budget`` yet (saying how to fill it).
    """
    missing = sorted(
        {
            c.testbed
            for c, _ in todo
            if c.budget == "tokens" and cfg.testbeds[c.testbed].get("token_budget") is None
        }
    )
    if missing:
        raise ValueError(token_budget_error(missing[0], config_path))
    if not todo:
        return {}
    if baseline_fn is None and cfg.cluster.in_process:
        baseline_fn = evaluate_start  # in this process, as the cells
    elif baseline_fn is None:
        init_ray(cfg.cluster)
    first: dict[str, TrainConfig] = {}
    for c, _ in todo:
        if c.testbed not in first:
            first[c.testbed] = cell_config(cfg, c, kind=kind)
    tags = {"mlflow.parentRunId": parent, TAG: cfg.name, "tracerl.git_sha": git_sha()}
    return ensure_baselines(client, exp_id, parent, first, tags, progress, baseline_fn)


def _run_cells(
    cfg: StudyConfig,
    todo: list[tuple[Cell, str | None]],
    parent: str,
    progress: Callable[[str], None],
    train_fn: Callable[..., dict[str, Any]] | None,
    failed: dict[str, str],
    before: dict[str, float],
    client: Any = None,
    archive: Callable[[], None] = lambda: None,
    kind: StudyKind = GRID,
) -> list[str]:
    """Run the cells; a cell that raises is recorded in ``failed`` (key -> error) and the others go on. What the
    kind keeps of a finished cell (``kind.after_cell``; a curve study: its curve file as its run's artifact) is kept
    when ``client`` is given, then ``archive`` runs."""
    sha = git_sha()
    jobs = [
        (
            c,
            cell_config(cfg, c, resume, kind=kind),
            {"mlflow.parentRunId": parent, TAG: cfg.name, "tracerl.git_sha": sha, **c.tags()},
        )
        for c, resume in todo
    ]
    for c, resume in todo:
        if resume:
            progress(f"cell {c.key}: resuming MLflow run {resume} from its checkpoint")
    t0, done = time.perf_counter(), 0

    def finished(c: Cell, result: Callable[[], dict[str, Any]]) -> None:
        nonlocal done
        done += 1
        try:
            s = result()
            try:
                if client is not None:
                    kind.after_cell(client, s)
            except Exception as e:  # noqa: BLE001 - the cell finished; what it kept stays readable in its storage
                progress(
                    f"cell {c.key}: {kind.kept} not logged to MLflow, read from {s.get('storage')} ({e})"
                )
            what = (
                f"held-out {before.get(c.testbed, float('nan')):.3f} -> {s.get('acc_after', float('nan')):.3f} "
                f"in {s.get('wall_s', 0):.0f} s"
            )
            archive()
        except Exception as e:  # noqa: BLE001 - any failure of one cell: the others go on, a rerun resumes it
            failed[c.key] = f"{e.__class__.__name__}: {e}"[:500]
            what = f"FAILED ({failed[c.key][:200]}); run the study again to resume it"
        per = (time.perf_counter() - t0) / done
        progress(
            f"cell {done}/{len(jobs)} {c.key}: {what}; about {per * (len(jobs) - done) / 60:.0f} min left"
        )

    if not jobs:
        return []
    if train_fn is None and cfg.cluster.in_process:
        train_fn = _cell_here  # one after another in this process, each cell `tracerl train` in-process
    if train_fn is not None:
        for c, tcfg, tags in jobs:
            finished(c, functools.partial(train_fn, tcfg, tags=tags))
        return [c.key for c, _, _ in jobs if c.key not in failed]
    import ray  # slow to import: ray (and an in-process study never loads Ray)

    init_ray(cfg.cluster)
    task = ray.remote(num_cpus=cfg.cell_cpus, max_retries=0)(_run_cell)
    pending: dict[Any, Cell] = {}
    queue = list(jobs)
    while queue or pending:
        while queue and len(pending) < cfg.parallel_cells:
            c, tcfg, tags = queue.pop(0)
            pending[task.remote(tcfg, tags)] = c
        ready, _ = ray.wait(list(pending), num_returns=1)
        c = pending.pop(ready[0])
        finished(c, functools.partial(_result, ready[0]))
    return [c.key for c, _, _ in jobs if c.key not in failed]
