"""The run's meter (workflows/train/meter.py): what a step, an evaluation and a stop check add, the token-mode budget,
and the round trip through a checkpoint's state."""

from __future__ import annotations

from dataclasses import replace

from tracerl.config import BudgetConfig, StopConfig, TrainConfig
from tracerl.engine.ledger import BudgetLedger
from tracerl.workflows.tracking.checkpoint_state import CheckpointState
from tracerl.workflows.train.meter import RunMeter


def ledger(tokens: int, leaves: int) -> BudgetLedger:
    led = BudgetLedger()
    led.generated_tokens, led.leaves = tokens, leaves
    return led


def test_an_evaluation_s_cpu_is_left_out_and_the_samplers_reading_before_it_is_kept() -> None:
    meter = RunMeter(TrainConfig(steps=None, stop=StopConfig(cpu_s=20.0)))
    meter.start(ranks_cpu=100.0)
    meter.add_eval(rank0_cpu=3.0, samplers_before=2.0)  # rank 0 evaluated for 3 s; samplers had trained 2 s
    assert not meter.check_stop(1, ranks_cpu=110.0, samplers_cpu=4.0)  # (110 - 100 - 3) + 2 + 4 = 13
    assert meter.cpu_s == 13.0 and meter.stopped_by is None
    assert meter.check_stop(2, ranks_cpu=118.0, samplers_cpu=0.0)  # + 8 = 21 >= 20
    assert (meter.cpu_s, meter.stopped_by) == (21.0, "cpu_s")


def test_tokens_stop_the_run_and_cross_the_schedule() -> None:
    meter = RunMeter(TrainConfig(steps=None, stop=StopConfig(tokens=1000), eval_every_tokens=500))
    meter.add_rollout(ledger(400, 12))
    assert not meter.crossed() and not meter.reached(1)
    meter.add_rollout(ledger(700, 12))
    assert meter.crossed() and meter.reached(2)  # 1100 tokens: past 500 and 1000
    assert (meter.tokens, meter.leaves, meter.tokens_before) == (1100.0, 24.0, 400.0)


def test_token_mode_sizes_the_next_step_from_the_tokens_left() -> None:
    budget = BudgetConfig(num_leaves=48, continuations=2, group_size=4, pool_factor=1, token_budget=1200)
    meter = RunMeter(replace(TrainConfig(), budget=budget))
    assert meter.budget(0, num_prompts=100) == budget  # no leaf's cost known yet
    meter.add_rollout(ledger(1800, 36))  # 50 tokens a leaf; step 0 overspent by 600
    nxt = meter.budget(1, num_prompts=100)  # 2 x 1200 - 1800 = 600 tokens left: 12 leaves
    assert (nxt.token_budget, nxt.num_leaves) == (600, 12)


def test_the_checkpoint_state_round_trips_the_totals() -> None:
    meter = RunMeter(TrainConfig())
    meter.add_rollout(ledger(300, 6))
    meter.add_wall(2.5)
    meter.start(0.0)
    meter.check_stop(1, ranks_cpu=4.0, samplers_cpu=1.0)
    state = meter.state(1, "run", {"state": 7})
    assert state == CheckpointState(1, "run", {"state": 7}, (300.0, 6.0), 5.0, 2.5)
    again = RunMeter(TrainConfig())
    again.restore(state)
    assert again.totals(1) == meter.totals(1)


def test_an_evaluation_gives_one_curve_point_at_the_step_s_totals() -> None:
    meter = RunMeter(TrainConfig())
    assert meter.curve_point(0, ["a"], attempt=1) is None  # no evaluation held
    meter.add_rollout(ledger(300, 6))
    meter.add_evaluation({"a": 1.0, "b": 0.0, "c": 1.0}, full=True, cost={"wall_s": 2.0})
    point = meter.curve_point(1, ["a", "b"], attempt=2)
    assert point is not None
    assert (point.accuracy, point.tasks, point.full, point.attempt) == (0.5, ["a", "b"], True, 2)
    assert (point.totals.generated_tokens, point.totals.leaves, point.totals.updates) == (300.0, 6.0, 1)
    assert point.eval_cost == {"wall_s": 2.0}
    assert meter.curve_point(1, ["a", "b"], attempt=2) is None  # taken once
