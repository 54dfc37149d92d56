"""``tracerl bench peer``'s statistics and output: per-side step statistics, wall seconds to a target accuracy,
means over seeds, the JSON and the table."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, get_args

from tracerl.workflows.experiments.config import split_side
from tracerl.workflows.ops.turns import paused_within


class StepRecord(TypedDict):
    """One step of a side as both sides' readers give it: wall-clock begin and end (seconds since the epoch), its
    evaluation's, rollout's and update's seconds, and its generated tokens."""

    step: int
    begin: float
    end: float
    eval_s: float
    rollout_s: float
    update_s: float
    generated_tokens: float
    generate_s: NotRequired[float]
    """Of the rollout: the sampler's generation seconds (``time/generate_s``; TRL's side: its engine's)."""
    tools_s: NotRequired[float]
    """Of the rollout: the environment's tool calls (``time/tools_s``)."""


class EvalPoint(TypedDict):
    step: int
    accuracy: float


class ProcessRun(TypedDict):
    """A side's process as ``peer_sides.run_process`` measured it: launch time, exit code, wall seconds, the peak
    PSS (MB) and process count of its tree, how many PSS samples were taken, the CPUs it ran on."""

    launch: float
    rc: int
    wall_s: float
    peak_pss_mb: float
    peak_processes: int
    pss_samples: int
    cpus: list[int]
    pauses: NotRequired[list[list[float]]]
    """[start, end] wall-clock seconds the process waited for its turn (``interleave=step``): left out of its
    steps, start-up and curve."""


class SideRun(ProcessRun):
    """One side's run for one seed: its process, steps, held-out evaluations and thread counts."""

    steps: list[StepRecord]
    evals: list[EvalPoint]
    threads: dict[str, int]
    mode: NotRequired[str]
    """``trl``, or how ``tracerl train`` ran: ``inprocess`` or ``ray`` (``peer_settings.side_mode``)."""
    seed: NotRequired[int]
    run_id: NotRequired[str]


class StepRow(StepRecord):
    """A step in ``side_stats``'s rows: its record, the seconds since the previous step's end (less that step's
    evaluation) and the rest (that interval less rollout and update)."""

    interval_s: float
    rest_s: float


class SideStats(TypedDict):
    """``side_stats``: the means over the measured steps, start-up, peak PSS, the accuracy curve
    ([wall seconds, accuracy] points) and the per-step rows (each with its interval and rest)."""

    s_per_step: float
    rollout_s: float
    update_s: float
    rest_s: float
    generate_s: float
    tools_s: float
    gen_tokens_per_s: float
    startup_s: float
    peak_pss_mb: float
    peak_processes: int
    steps_measured: int
    curve: list[list[float]]
    per_step: list[StepRow]


def side_stats(run: SideRun, warmup: int, acc0: float | None = None) -> SideStats:
    """One side's run: mean seconds per step (split), tokens per second, start-up, peak PSS, accuracy curve.

    A step's seconds run from the previous step's end (the first step: its begin) to its end, less the previous
    step's evaluation; the curve's x is wall seconds from launch less every earlier evaluation (start-up included).
    Every measure leaves out the seconds the process waited for its turn (``pauses``, with ``interleave=step``).
    """
    steps = sorted(run["steps"], key=lambda r: r["step"])
    if not steps:
        raise ValueError("the side logged no steps")
    launch = run["launch"]
    pauses = run.get("pauses", [])
    per: list[StepRow] = []
    prev_end, prev_eval, evals_before = steps[0]["begin"], 0.0, 0.0
    wall_at: dict[int, float] = {}
    for r in steps:
        interval = r["end"] - prev_end - prev_eval - paused_within(pauses, prev_end, r["end"])
        evals_before += prev_eval
        wall_at[r["step"]] = r["end"] - launch - evals_before - paused_within(pauses, launch, r["end"])
        per.append(StepRow(**r, interval_s=interval, rest_s=interval - r["rollout_s"] - r["update_s"]))
        prev_end, prev_eval = r["end"], r["eval_s"]
    measured = per[warmup:] if len(per) > warmup else per
    total = sum(r["interval_s"] for r in measured)
    startup = steps[0]["begin"] - launch - paused_within(pauses, launch, steps[0]["begin"])
    curve: list[list[float]] = [] if acc0 is None else [[startup, acc0]]
    curve += [[wall_at[e["step"]], e["accuracy"]] for e in run["evals"] if e["step"] in wall_at]
    return {
        "s_per_step": total / len(measured),
        "rollout_s": statistics.fmean(r["rollout_s"] for r in measured),
        "update_s": statistics.fmean(r["update_s"] for r in measured),
        "rest_s": statistics.fmean(r["rest_s"] for r in measured),
        "generate_s": statistics.fmean(r.get("generate_s", 0.0) for r in measured),
        "tools_s": statistics.fmean(r.get("tools_s", 0.0) for r in measured),
        "gen_tokens_per_s": sum(r["generated_tokens"] for r in measured) / total if total > 0 else 0.0,
        "startup_s": startup,
        "peak_pss_mb": run["peak_pss_mb"],
        "peak_processes": run["peak_processes"],
        "steps_measured": len(measured),
        "curve": curve,
        "per_step": per,
    }


def wall_to_target(curve: Sequence[Sequence[float]], target: float) -> float:
    """Wall seconds at which the piecewise-linear accuracy curve first reaches ``target`` (inf: never); of points
    at the same second the first is kept."""
    import numpy as np

    from tracerl.workflows.experiments.curves import tokens_to_target

    xs: list[float] = []
    ys: list[float] = []
    for x, y in sorted((float(x), float(y)) for x, y in curve):
        if not xs or x > xs[-1]:
            xs.append(x)
            ys.append(y)
    return tokens_to_target(np.array(xs), np.array(ys), target) if xs else math.inf


def _mean_std(values: Sequence[float]) -> dict[str, float]:
    v = [float(x) for x in values]
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0}


StatKey = Literal[
    "s_per_step",
    "rollout_s",
    "update_s",
    "rest_s",
    "generate_s",
    "tools_s",
    "gen_tokens_per_s",
    "startup_s",
    "peak_pss_mb",
]
KEYS: tuple[StatKey, ...] = get_args(StatKey)


def aggregate(per_seed: dict[str, list[SideStats]], target: float | None) -> dict[str, Any]:
    """Per side: mean and std over seeds of every ``KEYS`` entry, and the wall seconds to ``target`` of each seed's
    curve (mean over the seeds that reached it, and how many did)."""
    out: dict[str, Any] = {}
    for side, runs in per_seed.items():
        s: dict[str, Any] = {k: _mean_std([r[k] for r in runs]) for k in KEYS}
        s["seeds"] = len(runs)
        if target is not None:
            times = [wall_to_target(r["curve"], target) for r in runs]
            reached = [t for t in times if math.isfinite(t)]
            s["wall_to_target_s"] = {
                "per_seed": [t if math.isfinite(t) else None for t in times],
                "mean_reached": statistics.fmean(reached) if reached else None,
                "reached": len(reached),
            }
        out[side] = s
    return out


def best_sides(sides: dict[str, Any]) -> dict[str, Any]:
    """Per side (its name less any ``@T``): the variant with the fewest mean seconds a step (``trl@1`` against
    ``trl@2``), those seconds, and their ratio to TRL's best (when TRL ran): each side at its fastest thread count."""

    best: dict[str, Any] = {}
    for name, s in sides.items():
        base = split_side(name)[0]
        mean = s["s_per_step"]["mean"]
        if base not in best or mean < best[base]["s_per_step"]:
            best[base] = {"side": name, "s_per_step": mean}
    if "trl" in best:
        for b in best.values():
            b["vs_trl"] = b["s_per_step"] / best["trl"]["s_per_step"]
    return best


# -- the bench ---------------------------------------------------------------------------------------------------


def write_json(summary: dict[str, Any], out: Path, extra: str | None = None) -> None:
    """``summary`` as JSON at ``out`` and, if given, at ``extra`` (infinities as null)."""
    text = json.dumps(summary, indent=2, default=lambda o: None)
    for p in [out, *([Path(extra)] if extra else [])]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def format_table(summary: dict[str, Any]) -> str:
    """Per side: s/step (rollout, of it generation and tools, update, rest), generated tokens/s, start-up, peak PSS,
    and time to target."""
    head = (
        f"{'side':<11} {'s/step':>13} {'rollout':>8} {'(gen':>6} {'tools)':>6} {'update':>7} {'rest':>6} "
        f"{'gen tok/s':>10} "
        f"{'start-up s':>10} {'peak PSS MB':>12}"
    )
    target = summary.get("target")
    if target is not None:
        head += f" {'s to ' + format(target, '.3f'):>12}"
    lines = [
        f"steps={summary['steps']} (first {summary['warmup_steps']} not measured), seeds={summary['seeds']}, "
        f"CPUs={summary['threads']}, torch threads={summary.get('torch_threads', 1)} (a side@T: T), "
        f"interleave={summary.get('interleave', 'seed')}",
        head,
    ]
    for side, s in summary["sides"].items():
        row = (
            f"{side:<11} {s['s_per_step']['mean']:>7.2f} ±{s['s_per_step']['std']:<4.2f} {s['rollout_s']['mean']:>8.2f} "
            f"{s.get('generate_s', {}).get('mean', 0.0):>6.2f} {s.get('tools_s', {}).get('mean', 0.0):>6.2f} "
            f"{s['update_s']['mean']:>7.2f} {s['rest_s']['mean']:>6.2f} {s['gen_tokens_per_s']['mean']:>10.1f} "
            f"{s['startup_s']['mean']:>10.1f} {s['peak_pss_mb']['mean']:>12.0f}"
        )
        if target is not None:
            t = s["wall_to_target_s"]
            reached = "never" if t["mean_reached"] is None else f"{t['mean_reached']:.0f}"
            row += f" {reached:>8} ({t['reached']}/{s['seeds']})"
        lines.append(row)
    best = summary.get("best") or {}
    if best and len(summary["sides"]) > len(best):  # some side ran at more than one thread count
        lines.append(
            "fastest: "
            + ", ".join(
                f"{b['side']} {b['s_per_step']:.2f}"
                + (f" ({b['vs_trl']:.2f} x TRL's)" if "vs_trl" in b and base != "trl" else "")
                for base, b in best.items()
            )
        )
    if summary.get("interleave") == "step":
        lines.append(
            "peak PSS: the sides' processes lived side by side, so pages they share were split between them; "
            "compare memory with --interleave seed"
        )
    return "\n".join(lines)
