"""``tracerl compare`` and ``tracerl ui``: training runs side by side, and the MLflow UI on the configured store.

``compare`` reads training runs (an experiment's, or the given run ids) from MLflow and writes
``table.txt``, ``runs.json``, the plots (effective ratio per step, held-out accuracy against leaves and
against generated tokens spent, a heatmap of the budget shape: continuations N x m_max, colour = final
held-out accuracy, or mean effective ratio where a run has no evaluation, and, for runs that evaluate on a token
schedule, their learning curves: ``curve/accuracy`` against generated tokens and against CPU seconds) and
``report.html``, the ranking and
the plots on one self-contained page. The files are also logged to a
``compare`` run in the same experiment (tag ``tracerl.command=compare``), so the MLflow UI shows them.
Metric series take the last value logged for each step (steps re-run after a restart count once).
"""

from __future__ import annotations

import base64
import html
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracerl import metrics as M
from tracerl.workflows.tracking import store as trk
from tracerl.workflows.tracking import tables
from tracerl.workflows.tracking.frame import frame_of, metric_series, param, runs_frame, value
from tracerl.workflows.tracking.tables import num


def collect(client: Any, runs: Sequence[Any] | pd.DataFrame) -> list[dict[str, Any]]:
    """Per run (MLflow runs, or their frame: ``frame.runs_frame``): name, allocator, budget shape, per-step series
    and the summary numbers."""
    out = []
    for _, r in (runs if isinstance(runs, pd.DataFrame) else frame_of(runs)).iterrows():
        rid = r["run_id"]
        er = metric_series(client, rid, M.EFFECTIVE_RATIO)
        leaves = metric_series(client, rid, M.LEAVES)
        tokens = metric_series(client, rid, M.GENERATED_TOKENS)
        acc = metric_series(client, rid, M.EVAL_ACCURACY)
        curve = metric_series(
            client, rid, M.CURVE_ACCURACY
        )  # the learning curve: MLflow step = generated tokens
        curve_cpu = metric_series(client, rid, M.CURVE_CPU_S) if curve else {}
        cum_l, cum_t, tl, tt = {}, {}, 0.0, 0.0
        for s in sorted(set(leaves) | set(tokens)):
            tl += leaves.get(s, 0.0)
            tt += tokens.get(s, 0.0)
            cum_l[s], cum_t[s] = tl, tt
        out.append(
            {
                "run_id": rid,
                "name": r["run_name"],
                "status": r["status"],
                "allocator": value(r, "params.allocator.name", "?"),
                "continuations": _num(param(r, "budget.continuations")),
                "m_max": _num(param(r, "allocator.m_max")),
                "num_leaves": _num(param(r, "budget.num_leaves")),
                "lr": _num(param(r, "optim.lr")),
                "steps": len(er),
                "effective_ratio": sum(er.values()) / len(er) if er else math.nan,
                "acc_before": acc[min(acc)] if acc else math.nan,
                "acc_after": acc[max(acc)] if acc else math.nan,
                "leaves": tl,
                "generated_tokens": tt,
                "series": {
                    "effective_ratio": er,
                    "accuracy": acc,
                    "cum_leaves": cum_l,
                    "cum_tokens": cum_t,
                    "curve": curve,
                    "curve_cpu_s": curve_cpu,
                },
            }
        )
    return out


def _num(v: float | None) -> float:
    return math.nan if v is None else v


COLUMNS = (
    ("rank", "rank", 4, ">"),
    ("run", "run", 34, "<"),
    ("allocator", "allocator", 10, "<"),
    ("N", "N", 3, ">"),
    ("m_max", "m_max", 5, ">"),
    ("steps", "steps", 5, ">"),
    ("eff.ratio", "eff. ratio", 9, ">"),
    ("acc before", "acc before", 10, ">"),
    ("acc after", "acc after", 9, ">"),
    ("leaves", "leaves", 7, ">"),
    ("gen.tokens", "gen. tokens", 10, ">"),
)
"""The ranking's columns: title in table.txt, title in report.html, width and alignment in table.txt."""


def ranked(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The ranking's cells: runs by final held-out accuracy, then mean effective ratio."""
    best = sorted(rows, key=lambda r: (-_nan0(r["acc_after"]), -_nan0(r["effective_ratio"])))
    return [
        [
            str(i),
            str(r["name"]),
            str(r["allocator"]),
            num(r["continuations"], ".0f", "-"),
            num(r["m_max"], ".0f", "-"),
            str(r["steps"]),
            num(r["effective_ratio"], ".3f", "-"),
            num(r["acc_before"], ".3f", "-"),
            num(r["acc_after"], ".3f", "-"),
            str(int(r["leaves"])),
            str(int(r["generated_tokens"])),
        ]
        for i, r in enumerate(best, 1)
    ]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Runs ranked by final held-out accuracy, then mean effective ratio."""
    cells = [[c[:34] if j == 1 else c for j, c in enumerate(row)] for row in ranked(rows)]
    return tables.text([(title, width, align) for title, _, width, align in COLUMNS], cells)


def _nan0(x: float) -> float:
    return -1.0 if x is None or math.isnan(x) else x


Series = tuple[Sequence[float], Sequence[float]]


def _two_panels(
    lines: Sequence[tuple[str, Series, Series]], xlabels: tuple[str, str], ylabel: str, path: Path
) -> None:
    """Two side-by-side panels, one line per run in each: (name, (x, y) left, (x, y) right)."""
    import matplotlib.pyplot as plt  # slow to import: matplotlib

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, left, right in lines:
        for ax, (x, y) in zip(axes, (left, right)):
            ax.plot(x, y, marker="o", label=name)
    for ax, xlabel in zip(axes, xlabels):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plots(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    # slow to import: matplotlib
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # slow to import: matplotlib; after the backend is chosen

    files = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        s = r["series"]["effective_ratio"]
        ax.plot(list(s), list(s.values()), label=f"{r['name']}")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_ylabel("effective ratio")
    ax.legend(fontsize=6)
    fig.tight_layout()
    files.append(out / "effective_ratio_per_step.png")
    fig.savefig(files[-1], dpi=120)
    plt.close(fig)

    budget = []
    for r in rows:
        acc, cl, ct = r["series"]["accuracy"], r["series"]["cum_leaves"], r["series"]["cum_tokens"]
        steps = sorted(acc)
        y = [acc[s] for s in steps]
        budget.append((r["name"], ([cl.get(s, 0.0) for s in steps], y), ([ct.get(s, 0.0) for s in steps], y)))
    files.append(out / "accuracy_vs_budget.png")
    _two_panels(budget, ("leaves spent", "generated tokens spent"), "held-out accuracy", files[-1])

    curves = []
    for r in rows:  # runs with evaluation on a token schedule (eval_every_tokens): accuracy against compute
        c, cpu = r["series"].get("curve"), r["series"].get("curve_cpu_s", {})
        if c:
            tokens, at = sorted(c), [t for t in sorted(c) if t in cpu]
            curves.append(
                (r["name"], (tokens, [c[t] for t in tokens]), ([cpu[t] for t in at], [c[t] for t in at]))
            )
    if curves:
        files.append(out / "learning_curve.png")
        xlabels = ("generated tokens (training rollouts)", "trainer + sampler CPU seconds")
        _two_panels(curves, xlabels, "held-out accuracy (curve subset)", files[-1])

    ns = sorted({r["continuations"] for r in rows if not math.isnan(r["continuations"])})
    ms = sorted({r["m_max"] for r in rows if not math.isnan(r["m_max"])})
    if ns and ms:
        grid = np.full((len(ns), len(ms)), np.nan)
        use_acc = any(not math.isnan(r["acc_after"]) for r in rows)
        for r in rows:
            if math.isnan(r["continuations"]) or math.isnan(r["m_max"]):
                continue
            v = r["acc_after"] if use_acc else r["effective_ratio"]
            i, j = ns.index(r["continuations"]), ms.index(r["m_max"])
            grid[i, j] = v if math.isnan(grid[i, j]) else max(grid[i, j], v)
        fig, ax = plt.subplots(figsize=(5, 4))
        im = ax.imshow(grid, origin="lower", cmap="viridis")
        ax.set_xticks(range(len(ms)), [f"{m:g}" for m in ms])
        ax.set_yticks(range(len(ns)), [f"{n:g}" for n in ns])
        ax.set_xlabel("m_max")
        ax.set_ylabel("continuations N")
        fig.colorbar(im, label="held-out accuracy" if use_acc else "effective ratio")
        fig.tight_layout()
        files.append(out / "budget_shape_heatmap.png")
        fig.savefig(files[-1], dpi=120)
        plt.close(fig)
    return files


_CSS = """body{font:14px system-ui,sans-serif;margin:1.5em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td.name,td.alloc{text-align:left;font-family:ui-monospace,monospace;font-size:12px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0;display:block}"""


def report_html(rows: Sequence[dict[str, Any]], plot_files: Sequence[Path]) -> str:
    """One self-contained page: the ranking (as in table.txt) and the plots, embedded (it opens anywhere, the MLflow
    artifact viewer included)."""
    table = tables.html_table(
        [title for _, title, _, _ in COLUMNS], ranked(rows), classes=("", "name", "alloc"), id_="ranking"
    )
    imgs = [
        f"<h2>{html.escape(f.stem.replace('_', ' '))}</h2><img alt='{html.escape(f.stem)}' "
        f"src='data:image/png;base64,{base64.b64encode(f.read_bytes()).decode()}'>"
        for f in plot_files
    ]
    return (
        f"<!doctype html><meta charset='utf-8'><title>tracerl compare: {len(rows)} runs</title><style>{_CSS}</style>"
        f"<h1>{len(rows)} training runs, ranked</h1><p>By final held-out accuracy, then mean effective ratio. "
        "N: continuations; m_max: most prefixes expanded per prompt; leaves and generated tokens: spent over the "
        f"run.</p>{table}{''.join(imgs)}"
    )


@dataclass(frozen=True)
class CompareResult:
    """The ranked runs and what ``compare`` wrote (and logged)."""

    rows: list[dict[str, Any]]
    """One row per run (``collect``), best first."""
    table: str
    out_dir: Path
    files: list[Path]
    """Plots and the HTML report (beside table.txt and runs.json)."""
    run_id: str | None
    """The MLflow run the report was logged to; None with ``log_to_mlflow=False``."""

    def format(self, tracking_uri: str) -> str:
        lines = [
            self.table,
            f"\nwrote {self.out_dir}/table.txt, runs.json and " + ", ".join(f.name for f in self.files),
        ]
        if self.run_id:
            lines.append(
                f"logged to MLflow run {self.run_id} (artifacts/compare); "
                f"open: tracerl ui --tracking-uri {tracking_uri}"
            )
        return "\n".join(lines)


def compare(
    tracking: Any, experiment: str | None, run_ids: Sequence[str], out_dir: str, log_to_mlflow: bool = True
) -> CompareResult:
    """Collect, rank, plot and (optionally) log."""
    import mlflow  # slow to import: mlflow

    trk.setup(tracking)
    client = mlflow.MlflowClient()
    name = experiment or tracking.experiment
    if run_ids:
        runs = frame_of(client.get_run(r) for r in run_ids)
    else:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise LookupError(f"no MLflow experiment {name!r} at {tracking.uri}")
        runs = runs_frame(client, [exp.experiment_id], "tags.`tracerl.command` = 'train'", max_results=1000)
    if runs.empty:
        raise LookupError(f"no training runs to compare in experiment {name!r} at {tracking.uri}")
    rows = collect(client, runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = format_table(rows)
    (out / "table.txt").write_text(table + "\n")
    (out / "runs.json").write_text(
        json.dumps([{k: v for k, v in r.items() if k != "series"} for r in rows], indent=2)
    )
    files = plots(rows, out)
    (out / "report.html").write_text(report_html(rows, files))
    files.append(out / "report.html")
    run_id = None
    if log_to_mlflow:
        exp_id = str(runs.iloc[0]["experiment_id"])
        cmp = client.create_run(
            exp_id,
            run_name=f"compare-{len(rows)}-runs",
            tags={"tracerl.command": "compare", "tracerl.compared": ",".join(r["run_id"] for r in rows)},
        )
        client.log_artifacts(cmp.info.run_id, str(out), "compare")
        client.set_terminated(cmp.info.run_id)
        run_id = cmp.info.run_id
    return CompareResult(rows, table, out, files, run_id)


def ui_command(uri: str, host: str, port: int) -> list[str]:
    """The `mlflow ui` command for a tracking store (a database URI or a file store): one worker process (one
    person browses it; MLflow's default of four took over a minute to answer on a busy 2-core machine)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
