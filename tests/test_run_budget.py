"""A run's compute budget and learning curve (workflows/train/budget.py, issue 29): when a run stops on its tokens, CPU
seconds or steps and by how much it overshoots, when the token schedule evaluates, the fixed curve subset, the
curve file read back for workflows/experiments/curves.py, the config's one-line errors and the totals a checkpoint keeps.
The schedule and stop run in a real run in tests/test_train.py."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tracerl import metrics as M
from tracerl.config import StopConfig, TrainConfig
from tracerl.config_loader import ConfigError, compose
from tracerl.workflows.experiments.curves import EvalCurves
from tracerl.workflows.tracking.checkpoint_state import STATE, CheckpointState
from tracerl.workflows.train.budget import (
    CURVE_FILE,
    Totals,
    append_point,
    crosses,
    curve_arrays,
    curve_point,
    eval_subset,
    overshoot,
    read_curve,
    stop_reason,
    token_eval_steps,
)

SMOKE = ROOT / "conf" / "train" / "smoke.yaml"


def _run(stop: StopConfig, steps: int | None, tokens: list[int], cpu: list[float]) -> tuple[int, str, Totals]:
    """The loop of ``train_loop``: a step, then the check; returns the last step, why, and its totals."""
    run = Totals()
    for done, (t, c) in enumerate(zip(tokens, cpu), 1):
        run = Totals(run.generated_tokens + t, run.leaves + 15, done, run.cpu_s + c, run.wall_s + 1.0)
        why = stop_reason(stop, steps, run)
        if why is not None:
            return done, why, run
    raise AssertionError("never stopped")


def test_the_token_stop_ends_at_the_first_step_that_reaches_it_and_records_the_overshoot() -> None:
    tokens = [400, 500, 450, 600, 380]
    last, why, run = _run(StopConfig(tokens=1300), None, tokens, [1.0] * 5)
    assert (last, why, run.generated_tokens) == (3, "tokens", 1350)  # 900 < 1300 <= 1350
    assert overshoot(StopConfig(tokens=1300), run) == {M.OVERSHOOT_TOKENS: 50.0}
    # reaching the limit exactly stops there, with no overshoot
    last, _, run = _run(StopConfig(tokens=900), None, tokens, [1.0] * 5)
    assert (last, overshoot(StopConfig(tokens=900), run)) == (2, {M.OVERSHOOT_TOKENS: 0.0})


def test_the_cpu_stop_and_the_steps_bound() -> None:
    stop = StopConfig(cpu_s=5.0)
    last, why, run = _run(stop, None, [100] * 9, [2.0, 2.0, 2.0, 2.0])
    assert (last, why, overshoot(stop, run)) == (3, "cpu_s", {M.OVERSHOOT_CPU_S: 1.0})
    # steps stays an upper bound: the budget is not reached in 2 steps; the unreached limit's overshoot is negative
    last, why, run = _run(StopConfig(tokens=10_000), 2, [400] * 5, [1.0] * 5)
    assert (last, why, overshoot(StopConfig(tokens=10_000), run)) == (
        2,
        "steps",
        {M.OVERSHOOT_TOKENS: -9200.0},
    )
    # without a compute stop, steps alone (the old behaviour); both limits at once name the compute one
    assert _run(StopConfig(), 4, [400] * 5, [1.0] * 5)[:2] == (4, "steps")
    assert _run(StopConfig(tokens=800), 2, [400] * 5, [1.0] * 5)[:2] == (2, "tokens")


def test_the_config_needs_steps_or_a_compute_stop() -> None:
    with pytest.raises(ConfigError) as err:
        compose(TrainConfig, SMOKE, ["steps=null"])
    assert (
        str(err.value)
        == "steps is null and no compute stop is set: set steps=N, stop.tokens=N or stop.cpu_s=S"
    )
    cfg = compose(TrainConfig, SMOKE, ["steps=null", "stop.tokens=20000"])
    assert (cfg.steps, cfg.stop.tokens, cfg.stop.cpu_s) == (None, 20000, None)
    assert compose(TrainConfig, SMOKE, ["stop.cpu_s=30"]).stop == StopConfig(cpu_s=30.0)  # steps: the bound
    with pytest.raises(ConfigError, match=r"^stop\.tokens must be >= 1 or null \(got 0\)$"):
        compose(TrainConfig, SMOKE, ["stop.tokens=0"])
    with pytest.raises(ConfigError, match=r"^optim\.schedule=cosine decays over steps: set steps"):
        compose(TrainConfig, SMOKE, ["steps=null", "stop.tokens=100", "optim.schedule=cosine"])


def test_a_checkpoint_keeps_the_running_totals(tmp_path: Path) -> None:
    CheckpointState(3, "r", {}, (2044.0, 45.0), cpu_s=9.5, wall_s=26.25).write(tmp_path)
    back = CheckpointState.read(tmp_path)
    assert (back.spent, back.cpu_s, back.wall_s) == ((2044.0, 45.0), 9.5, 26.25)
    # a checkpoint written before the CPU and wall totals existed starts them at 0
    (tmp_path / STATE).write_text(json.dumps({"step": 2, "spent": [10.0, 2.0]}))
    old = CheckpointState.read(tmp_path)
    assert (old.spent, old.cpu_s, old.wall_s) == ((10.0, 2.0), 0.0, 0.0)


def test_the_token_schedule_evaluates_at_each_crossing() -> None:
    totals = list(itertools.accumulate([400, 500, 450, 600, 380, 2500]))  # 400 900 1350 1950 2330 4830
    assert token_eval_steps(totals, 1000) == [3, 5, 6]  # 6 crosses 3000 and 4000: evaluated once
    assert token_eval_steps(totals, 900) == [2, 4, 6]  # reaching a multiple counts (900 at step 2)
    assert token_eval_steps(totals, 0) == []
    # a run resumed after step 2 (900 tokens) keeps the schedule of the uninterrupted run
    assert [s + 2 for s in token_eval_steps(totals[2:], 1000, start=totals[1])] == [3, 5, 6]
    assert crosses(999, 1000, 1000) and not crosses(1000, 1999, 1000)


def test_the_curve_subset_is_fixed_by_the_seed() -> None:
    a = eval_subset(24, 8, seed=3)
    assert a == eval_subset(24, 8, seed=3) and a == sorted(set(a)) and len(a) == 8 and max(a) < 24
    assert a != eval_subset(24, 8, seed=4)
    assert eval_subset(24, 0, seed=3) == eval_subset(24, 30, seed=3) == list(range(24))


def test_curve_points_log_at_the_token_step_and_read_back_for_the_curve_statistics(tmp_path: Path) -> None:
    tasks = ["a", "b"]
    everything = {"a": 1.0, "b": 0.0, "c": 1.0}  # a full evaluation: the curve reads its own tasks
    points = [
        curve_point(Totals(), everything, tasks, True, {"generated_tokens": 90.0}),
        curve_point(Totals(544, 15, 1, 3.5, 11.1), {"a": 1.0, "b": 1.0}, tasks, False, {}),
        curve_point(Totals(1428, 30, 2, 7.0, 21.7), {"a": 0.0, "b": 1.0}, tasks, False, {}),
    ]
    assert points[0].accuracy == 0.5 and points[1].accuracy == 1.0
    m = points[1].metrics()
    assert m[M.CURVE_ACCURACY] == 1.0 and m[M.CURVE_UPDATES] == 1.0 and m[M.CURVE_CPU_S] == 3.5
    for p in points:
        append_point(tmp_path, p)
    # a restart re-runs step 2 and evaluates it again: the line written last is the step's
    append_point(
        tmp_path, curve_point(Totals(1428, 30, 2, 7.2, 22.0), {"a": 1.0, "b": 1.0}, tasks, False, {})
    )
    back = read_curve(tmp_path)
    assert [p["updates"] for p in back] == [0, 1, 2] and back[2]["cpu_s"] == 7.2
    x, correct = curve_arrays(back)
    assert x.tolist() == [0.0, 544.0, 1428.0] and correct.tolist() == [[1, 0], [1, 1], [1, 1]]
    curves = EvalCurves(x[None], correct[None])  # one seed
    assert curves.mean_curve().tolist() == [0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="ran none of the curve's tasks"):
        curve_point(Totals(), {"a": 1.0}, tasks, False, {})
    (tmp_path / CURVE_FILE).write_text("{}\n")
    with pytest.raises(ValueError, match=r"curve\.jsonl:1 is not a curve point"):
        read_curve(tmp_path)
    with pytest.raises(ValueError, match="no learning curve at"):
        read_curve(tmp_path / "elsewhere")
    assert np.isfinite(x).all()


def test_commands_that_count_steps_need_them() -> None:
    from tracerl.workflows.study.config import SweepConfig

    sweep = ROOT / "conf" / "sweep" / "default.yaml"
    with pytest.raises(
        ConfigError, match=r"^scheduler=asha stops trials at rungs counted in steps: set steps$"
    ):
        compose(SweepConfig, sweep, ["scheduler=asha", "steps=null", "stop.tokens=5000"])
    fifo = compose(SweepConfig, sweep, ["scheduler=fifo", "steps=null", "stop.tokens=5000"])
    assert fifo.train.stop.tokens == 5000  # every trial on the same token budget
    with pytest.raises(ValueError, match="steps is null: this command runs a fixed number of steps"):
        _ = fifo.train.num_steps
