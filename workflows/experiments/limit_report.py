"""``tracerl bench limit``'s model of the step at its limit: the composition, the real step's split, the table.

Pure functions (no torch, no Ray): what the bench measured goes in as numbers, the per-phase limit and the ratios
come out. docs/results/limit.md states the model; tests/test_bench_limit.py checks it on known inputs.

The limit of one step (barrier layout: the rollout phases, then the update, one after the other)::

    generate = (G / r_decode(B) + P / r_prefill(B)) / min(A, C)
    tools    = (T * t_call + R * t_cell) / min(A * E, C)
    grade    = N_grade * t_grade / min(A, C)
    update   = t_update * (K / K_0)
    limit    = generate + tools + grade + update

G generated tokens, P prefill tokens computed, T tool calls, R replayed cells, N_grade graded answers, K loss tokens
of the step (the real run's counts); B the samplers' mean decode occupancy (decode rows per decode forward); A
sampler actors, E env actors per sampler actor, C CPUs this process may use; r_decode, r_prefill the model's token
rates at batch B on one torch thread; t_call a tool call's seconds with one cell, t_cell each further (replayed)
cell's; t_grade one answer's grading seconds; t_update one update of a measured batch with K_0 loss tokens.
Everything else a step does (selection, predictor scoring and fit, allocation, collation, broadcast, weight sync,
logging, Ray calls) has limit 0: it is the overhead the ratio exposes.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tracerl import metrics as M

PHASES = ("generate", "tools", "grade", "update", "rest")
"""The step's phases in the table; ``rest`` is everything else (limit 0)."""


@dataclass(frozen=True)
class StepCounts:
    """One step's work, from the real run's metrics (means over the measured steps)."""

    generated_tokens: float
    """``budget/generated_tokens``: G."""
    prefill_tokens: float
    """``budget/prefill_tokens_computed``: P."""
    decode_steps: float
    """``budget/decode_steps`` (summed over the sampler actors)."""
    decode_rows: float
    """``budget/decode_rows``: rows that produced a token in those forwards."""
    tool_calls: float
    """``budget/tool_calls``: T."""
    replayed_cells: float
    """``budget/tool_calls_replayed``: R."""
    grades: float
    """Answers graded: N_grade (``budget/sampled_leaves`` x the answered share the bench's own step measured)."""
    loss_tokens: float
    """``train/loss_tokens``: K."""

    @property
    def occupancy(self) -> float:
        """B: decode rows per decode forward (1 when nothing was decoded)."""
        return self.decode_rows / self.decode_steps if self.decode_steps > 0 else 1.0


@dataclass(frozen=True)
class Rates:
    """What the microbenchmarks measured on this machine (one torch thread)."""

    decode_tokens_per_s: float
    """r_decode: the model's tokens per second decoding with a KV cache at batch B."""
    prefill_tokens_per_s: float
    """r_prefill: the model's tokens per second encoding contexts at batch B."""
    tool_call_s: float
    """t_call: a sandboxed tool call with one cell."""
    tool_cell_s: float
    """t_cell: each further cell a call replays."""
    grade_s: float
    """t_grade: grading one answer (exact match or math-verify in its worker)."""
    update_s: float
    """t_update: forward + backward + optimizer step of a measured batch."""
    update_loss_tokens: float
    """K_0: the loss tokens of that batch."""


@dataclass(frozen=True)
class Layout:
    """The default run's parallelism."""

    sampler_actors: int
    """A: ``pools.rollout_workers``."""
    env_actors_per_sampler: int
    """E: ``pools.env_workers`` (0: tools run in the sampler actor)."""
    cpus: int
    """C: CPUs this process may use."""

    @property
    def sampler_parallel(self) -> int:
        return max(1, min(self.sampler_actors, self.cpus))

    @property
    def tool_parallel(self) -> int:
        return max(1, min(self.sampler_actors * max(self.env_actors_per_sampler, 1), self.cpus))


def compose(counts: StepCounts, rates: Rates, layout: Layout) -> dict[str, float]:
    """The limit of each phase of a step (seconds) and their sum (``total``); ``rest`` is 0 by definition."""
    generate = (
        counts.generated_tokens / rates.decode_tokens_per_s
        + counts.prefill_tokens / rates.prefill_tokens_per_s
    ) / layout.sampler_parallel
    tools = (
        counts.tool_calls * rates.tool_call_s + counts.replayed_cells * rates.tool_cell_s
    ) / layout.tool_parallel
    grade = counts.grades * rates.grade_s / layout.sampler_parallel
    scale = counts.loss_tokens / rates.update_loss_tokens if rates.update_loss_tokens > 0 else 0.0
    update = rates.update_s * scale
    out = {"generate": generate, "tools": tools, "grade": grade, "update": update, "rest": 0.0}
    out["total"] = generate + tools + grade + update
    return out


REAL_KEYS = {
    "step": M.TIME_STEP,
    "eval": M.phase_time("eval"),
    "rollout": M.TIME_ROLLOUT,
    "generate": M.phase_time("generate"),
    "tools": M.phase_time("tools"),
    "grade": M.phase_time("grade"),
    "update": M.phase_time("update_policy"),
}
"""The real step's phases, as the run logs them (docs/metrics.md, time/)."""


def real_split(step: Mapping[str, float]) -> dict[str, float]:
    """A logged step's seconds per phase: ``total`` is ``time/step_s`` less its evaluation; generate, tools and
    grade are each the slowest sampler's (so with several samplers they may add up to more than the rollout);
    ``rest`` is what lies outside the rollout and the update, plus the rollout's seconds beyond its three phases
    where there are any (Ray calls, the engine's own work)."""
    get = {k: float(step.get(key, 0.0)) for k, key in REAL_KEYS.items()}
    total = get["step"] - get["eval"]
    out = {p: get[p] for p in ("generate", "tools", "grade", "update")}
    inside = max(0.0, get["rollout"] - out["generate"] - out["tools"] - out["grade"])
    out["rest"] = max(0.0, total - get["rollout"] - out["update"]) + inside
    out["total"] = total
    return out


def mean_split(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean over steps of ``real_split``, per phase and total."""
    splits = [real_split(s) for s in steps]
    return {k: statistics.fmean(s[k] for s in splits) for k in (*PHASES, "total")}


def fastest_step(steps: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    """The step with the least ``real_split`` total (on a loaded machine the closest to an idle one)."""
    return min(steps, key=lambda s: real_split(s)["total"])


def ratios(real: Mapping[str, float], limit: Mapping[str, float]) -> dict[str, float | None]:
    """real / limit per phase and in total; None where the limit is 0 (``rest``)."""
    return {k: (real[k] / limit[k] if limit[k] > 0 else None) for k in (*PHASES, "total")}


def fit_tool_cost(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(t_call, t_cell) from (cells run, seconds) of tool calls: least squares of seconds = t_call + t_cell x
    (cells - 1); with one cell count only (or a negative slope), t_cell = 0 and t_call the mean."""
    if not samples:
        raise ValueError("no tool calls were timed")
    xs = [float(c - 1) for c, _ in samples]
    ys = [s for _, s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return my, 0.0
    return my - slope * mx, slope


def update_flops(params: int, padded_tokens: int, layers: int, hidden: int, attended: float) -> float:
    """FLOPs of one forward + backward over ``padded_tokens``: 6 x params per token (the matmuls, the tied head
    included) plus 6 x 2 x layers x hidden per attended position (QK^T and AV), ``attended`` the mean positions a
    token attends to."""
    return 6.0 * padded_tokens * (params + 2.0 * layers * hidden * attended)


def decode_flops_per_token(params: int, layers: int, hidden: int, context: float) -> float:
    """FLOPs of one decoded token: 2 x params plus 2 x 2 x layers x hidden x context (attention over the cache)."""
    return 2.0 * params + 4.0 * layers * hidden * context


def summary_json(
    counts: StepCounts,
    rates: Rates,
    layout: Layout,
    real: Mapping[str, float],
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The bench's JSON: inputs, the per-phase limit, the real split and their ratios, and ``extra`` (the runs'
    details, the microbenchmarks' raw numbers, the machine)."""
    limit = compose(counts, rates, layout)
    return {
        "limit_s": limit,
        "real_s": dict(real),
        "ratio": ratios(real, limit),
        "counts": {**asdict(counts), "occupancy": counts.occupancy},
        "rates": asdict(rates),
        "layout": {
            **asdict(layout),
            "sampler_parallel": layout.sampler_parallel,
            "tool_parallel": layout.tool_parallel,
        },
        **extra,
    }


def write_json(summary: Mapping[str, Any], out: Path, extra: str | None = None) -> None:
    """``summary`` as JSON at ``out`` and, if given, at ``extra`` (NaN and infinities as null)."""

    def clean(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    text = json.dumps(clean(summary), indent=2)
    for p in [out, *([Path(extra)] if extra else [])]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _work(phase: str, s: Mapping[str, Any]) -> str:
    c, r = s["counts"], s["rates"]
    if phase == "generate":
        return (
            f"{c['generated_tokens']:.0f} tok @ {r['decode_tokens_per_s']:.0f}/s, "
            f"{c['prefill_tokens']:.0f} prefill @ {r['prefill_tokens_per_s']:.0f}/s, B={c['occupancy']:.1f}"
        )
    if phase == "tools":
        return (
            f"{c['tool_calls']:.0f} calls x {1000 * r['tool_call_s']:.0f} ms + "
            f"{c['replayed_cells']:.0f} replayed x {1000 * r['tool_cell_s']:.0f} ms"
        )
    if phase == "grade":
        return f"{c['grades']:.0f} answers x {1000 * r['grade_s']:.1f} ms"
    if phase == "update":
        return f"{c['loss_tokens']:.0f} loss tok; {r['update_s']:.2f} s per {r['update_loss_tokens']:.0f}"
    return "select, score, fit, collate, sync, log, Ray"


def format_table(s: Mapping[str, Any]) -> str:
    """Per phase: the work, the limit, the real seconds and their ratio; then the total."""
    lay = s["layout"]
    lines = [
        f"the embedded default's step at its limit: {lay['sampler_actors']} sampler actors, "
        f"{lay['env_actors_per_sampler']} env actors each, {lay['cpus']} CPUs; "
        f"real: steps {s['measured_steps']} of a {s['run_steps']}-step run",
        f"{'phase':<9} {'limit s':>8} {'real s':>8} {'real/limit':>10}  work",
    ]
    for p in (*PHASES, "total"):
        ratio = s["ratio"][p]
        rt = "-" if ratio is None else f"{ratio:.1f}x"
        work = _work(p, s) if p != "total" else ""
        lines.append(f"{p:<9} {s['limit_s'][p]:>8.2f} {s['real_s'][p]:>8.2f} {rt:>10}  {work}")
    fast = s.get("fastest_step")
    if fast:
        lines.append(
            f"fastest measured step ({fast['step']}): {fast['real_s']['total']:.2f} s, its own work's limit "
            f"{fast['limit_s']['total']:.2f} s: {fast['real_s']['total'] / fast['limit_s']['total']:.1f}x"
        )
    floor = s.get("microbench", {}).get("update_at_matmul_peak_s")
    if floor:
        lines.append(f"update at the matmul peak (its FLOPs / a 512 x 512 matmul's FLOP/s): {floor:.2f} s")
    wall = s.get("limit_wall_clock_s")
    if wall:
        lines.append(
            f"limit from wall-clock microbenchmarks (this machine's load in them): {wall['total']:.2f} s "
            f"(real/limit {s['real_s']['total'] / wall['total']:.1f}x)"
        )
    own = s.get("own_step")
    if own:
        lines.append(
            f"the hf sampler's generate in the bench's own step: {own['sampler_tokens_per_cpu_s']:.0f} tokens per CPU s "
            f"at {own['sampler_rows_per_call']:.1f} rows a call (the model alone: {s['rates']['decode_tokens_per_s']:.0f} "
            f"at {s['counts']['occupancy']:.1f})"
        )
    cpu = s.get("cpu_per_step")
    if cpu and cpu.get("real") is not None:
        lines.append(
            f"CPU seconds per step: real {cpu['real']:.2f} (total/cpu_s), limit {cpu['limit']:.2f} "
            f"(the same work on one core): {cpu['real'] / cpu['limit']:.1f}x"
        )
    m = s.get("machine", {})
    if m:
        lines.append(
            f"load average {m.get('load_avg_start')} at the start, {m.get('load_avg_end')} at the end"
        )
    return "\n".join(lines)
