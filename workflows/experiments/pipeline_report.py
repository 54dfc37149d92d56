"""The scale model's output (``tracerl bench pipeline --sim``): the issue's JSON "sim" entry of a profile, its
validation against the CPU bench's JSON, and the printed table. The simulation itself is workflows/experiments/pipeline_sim.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracerl.workflows.experiments.pipeline_profile import Profile
from tracerl.workflows.experiments.pipeline_sim import MODES, SAMPLERS, simulate


def validation_error(
    pred: dict[str, dict[str, list[float]]], samplers: tuple[int, ...], cpu: dict[str, Any]
) -> float:
    """max over barrier and streaming of |predicted - measured| / measured step time at S = 2 (the CPU bench's
    ``cpu.<mode>.step_s``)."""
    if 2 not in samplers:
        raise ValueError("validation needs S = 2 among the simulated samplers")
    i = samplers.index(2)
    errs = []
    for mode in ("barrier", "streaming"):
        measured = cpu.get(mode, {}).get("step_s") if isinstance(cpu.get(mode), dict) else None
        if not isinstance(measured, (int, float)) or measured <= 0:
            raise ValueError(f"the CPU bench JSON has no cpu.{mode}.step_s > 0 to validate against")
        errs.append(abs(pred[mode]["step_s"][i] - measured) / measured)
    return max(errs)


def validation_detail(
    pred: dict[str, dict[str, list[float]]], samplers: tuple[int, ...], cpu: dict[str, Any]
) -> dict[str, dict[str, float | None]]:
    """Predicted and measured step and rollout seconds at S = 2 per mode the CPU bench reports (for reading a
    ``validation_error``: the bench's step may hold work the profile does not, e.g. no update)."""
    i = samplers.index(2)
    out: dict[str, dict[str, float | None]] = {}
    for mode in MODES:
        got = cpu.get(mode)
        if isinstance(got, dict):
            out[mode] = {
                "predicted_step_s": pred[mode]["step_s"][i],
                "measured_step_s": got.get("step_s"),
                "predicted_rollout_s": pred[mode]["rollout_s"][i],
                "measured_rollout_s": got.get("rollout_s"),
            }
    return out


def sim_entry(
    p: Profile, samplers: tuple[int, ...] = SAMPLERS, cpu: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The issue's JSON "sim" entry for one profile, plus per mode the bubble, rollout time, rollout-phase
    utilisation and occupancy, the update time, and (with ``cpu``) the numbers behind ``validation_error``."""
    res = simulate(p, samplers)
    entry: dict[str, Any] = {"profile": p.name, "samplers": list(samplers)}
    for mode in MODES:
        entry[f"{mode}_util"] = res[mode]["util"]
    for mode in MODES:
        entry[f"{mode}_step_s"] = res[mode]["step_s"]
    for key in ("bubble", "rollout_s", "rollout_util", "occupancy"):
        for mode in MODES:
            entry[f"{mode}_{key}"] = res[mode][key]
    entry["update_s"] = res["barrier"]["update_s"]
    entry["validation_error"] = None if cpu is None else validation_error(res, samplers, cpu)
    if cpu is not None:
        entry["validation"] = validation_detail(res, samplers, cpu)
        entry["validated_on"] = cpu.get("measured_in", "frozen")
    return entry


def format_table(entries: list[dict[str, Any]]) -> str:
    """Per profile, S and mode: step and rollout seconds, utilisation of the step and of its rollout phase, bubble."""
    lines = []
    for e in entries:
        err = e["validation_error"]
        lines.append(
            f"\n{e['profile']}" + ("" if err is None else f"  (validation error at S = 2: {err:.3f})")
        )
        lines.append(
            f"{'S':>4} {'mode':<10} {'step_s':>9} {'rollout_s':>9} {'util':>6} {'r_util':>6} {'bubble':>6}"
        )
        for i, s in enumerate(e["samplers"]):
            for mode in MODES:
                rollout = e[f"{mode}_rollout_s"][i]
                lines.append(
                    f"{s:>4} {mode:<10} {e[f'{mode}_step_s'][i]:>9.2f} {rollout:>9.2f} "
                    f"{e[f'{mode}_util'][i]:>6.3f} {e[f'{mode}_rollout_util'][i]:>6.3f} {e[f'{mode}_bubble'][i]:>6.3f}"
                )
    return "\n".join(lines)


def read_cpu(path: Path) -> dict[str, Any]:
    """What a ``tracerl bench pipeline --json`` file measured per mode, to validate the model against: its train
    runs (``train.<mode>``, from ``--train-steps``) when it has them, since a profile models a training step (the
    update, the weight push and the driver's work between steps); else its frozen steps (``cpu.<mode>``), which
    hold no update."""
    data = json.loads(Path(path).read_text())
    cpu = data.get("cpu") if isinstance(data, dict) else None
    if not isinstance(cpu, dict):
        raise ValueError(f'{path}: no "cpu" object (write it with tracerl bench pipeline --json PATH)')
    train = data.get("train")
    if isinstance(train, dict) and all(isinstance(train.get(m), dict) for m in ("barrier", "streaming")):
        return {**{m: v for m, v in train.items() if isinstance(v, dict)}, "measured_in": "train"}
    return {**cpu, "measured_in": "frozen"}
