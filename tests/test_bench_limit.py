"""``tracerl bench limit``'s harness: the composition of the limit on known inputs, the real step's split, the
tool-cost fit, the config (the embedded default's keys), the JSON and table, and the measuring parts on the tiny
policy (what they count, not how fast)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tests.conftest import ROOT, UNHURRIED
from tracerl.config import TrainConfig
from tracerl.config_loader import ConfigError, compose
from tracerl.envs.math.config import MathEnvConfig
from tracerl.workflows.experiments import limit_report
from tracerl.workflows.experiments.config import BenchLimitConfig
from tracerl.workflows.experiments.limit import cpu_per_step, measured, own_step
from tracerl.workflows.experiments.limit_micro import (
    grade_costs,
    matmul_flops,
    model_rates,
    tool_costs,
    update_time,
)
from tracerl.workflows.experiments.limit_report import (
    Layout,
    Rates,
    StepCounts,
    fastest_step,
    fit_tool_cost,
    format_table,
    mean_split,
    ratios,
    real_split,
    summary_json,
    update_flops,
    write_json,
)

LIMIT = ROOT / "conf/bench/limit.yaml"
COUNTS = StepCounts(
    generated_tokens=2000,
    prefill_tokens=3000,
    decode_steps=250,
    decode_rows=2000,
    tool_calls=40,
    replayed_cells=20,
    grades=30,
    loss_tokens=4000,
)
RATES = Rates(
    decode_tokens_per_s=1000,
    prefill_tokens_per_s=10_000,
    tool_call_s=0.05,
    tool_cell_s=0.01,
    grade_s=0.002,
    update_s=1.0,
    update_loss_tokens=2000,
)


def test_the_limit_is_each_phase_s_work_over_its_rate_and_parallelism() -> None:
    lim = limit_report.compose(COUNTS, RATES, Layout(sampler_actors=2, env_actors_per_sampler=2, cpus=2))
    # generate: (2000 / 1000 + 3000 / 10000) / min(2, 2) = 1.15; tools: (40 x 0.05 + 20 x 0.01) / min(4, 2) = 1.1
    assert lim["generate"] == pytest.approx(1.15)
    assert lim["tools"] == pytest.approx(1.1)
    assert lim["grade"] == pytest.approx(30 * 0.002 / 2)
    assert lim["update"] == pytest.approx(2.0)  # twice the measured batch's loss tokens
    assert lim["rest"] == 0.0
    assert lim["total"] == pytest.approx(1.15 + 1.1 + 0.03 + 2.0)
    assert COUNTS.occupancy == 8.0
    # more CPUs: tools spread over all four env actors, generate still over the two samplers
    wide = limit_report.compose(COUNTS, RATES, Layout(2, 2, 16))
    assert (wide["generate"], wide["tools"]) == (pytest.approx(1.15), pytest.approx(0.55))
    one = limit_report.compose(COUNTS, RATES, Layout(2, 0, 1))  # one CPU: nothing runs in parallel
    assert one["generate"] == pytest.approx(2.3) and one["tools"] == pytest.approx(2.2)


def test_the_real_split_leaves_out_the_evaluation_and_puts_the_remainder_in_rest() -> None:
    step = {
        "time/step_s": 10.0,
        "time/eval_s": 2.0,
        "time/rollout_s": 5.0,
        "time/generate_s": 3.0,
        "time/tools_s": 1.0,
        "time/grade_s": 0.5,
        "time/update_policy_s": 1.5,
    }
    s = real_split(step)
    # rest: outside the rollout and the update (8 - 5 - 1.5) plus the rollout beyond its phases (5 - 4.5)
    assert s == {"generate": 3.0, "tools": 1.0, "grade": 0.5, "update": 1.5, "rest": 2.0, "total": 8.0}
    # two samplers: the slowest one's phases may add up to more than the rollout; nothing negative goes to rest
    assert real_split({**step, "time/tools_s": 2.0})["rest"] == 1.5
    m = mean_split([step, {**step, "time/step_s": 12.0}])
    assert (m["total"], m["rest"]) == (9.0, 3.0)
    assert fastest_step([{**step, "time/step_s": 12.0, "step": 1}, {**step, "step": 2}])["step"] == 2
    r = ratios(s, {"generate": 1.5, "tools": 0.5, "grade": 0.5, "update": 1.5, "rest": 0.0, "total": 4.0})
    assert r == {"generate": 2.0, "tools": 2.0, "grade": 1.0, "update": 1.0, "rest": None, "total": 2.0}


def test_measured_steps_leave_out_the_warm_up_and_the_last() -> None:
    steps = [{"step": k} for k in range(1, 7)]
    assert [s["step"] for s in measured(steps, 1, 6)] == [2, 3, 4, 5]
    assert [s["step"] for s in measured(steps, 0, 3)] == [1, 2]


def test_tool_cost_fit() -> None:
    a, b = fit_tool_cost([(1, 0.05), (2, 0.06), (3, 0.07), (1, 0.05)])
    assert (a, b) == (pytest.approx(0.05), pytest.approx(0.01))
    assert fit_tool_cost([(1, 0.04), (1, 0.06)]) == (pytest.approx(0.05), 0.0)  # one cell count: the mean
    assert fit_tool_cost([(1, 0.06), (2, 0.04)]) == (pytest.approx(0.05), 0.0)  # a negative slope: the mean
    with pytest.raises(ValueError, match="no tool calls"):
        fit_tool_cost([])


def test_update_flops_count_the_matmuls_and_attention() -> None:
    assert update_flops(1000, 10, 2, 8, 0.0) == 6 * 10 * 1000
    assert update_flops(1000, 10, 2, 8, 5.0) == 6 * 10 * (1000 + 2 * 2 * 8 * 5)


def test_the_bench_runs_the_embedded_default() -> None:
    """Every key of conf/bench/limit.yaml's setup is conf/train/default.yaml's but the three it names."""
    bench = compose(BenchLimitConfig, LIMIT).train
    default = compose(TrainConfig, ROOT / "conf/train/default.yaml")
    math_b, math_d = bench.env.settings(MathEnvConfig), default.env.settings(MathEnvConfig)
    assert (bench.steps, bench.eval_at_start, math_b.eval_tasks) == (6, False, 8)
    assert dataclasses.replace(math_b, eval_tasks=math_d.eval_tasks) == math_d
    same = dataclasses.replace(
        bench, steps=default.steps, eval_at_start=default.eval_at_start, env=default.env
    )
    assert same == default
    assert (bench.env.name, bench.env.reward_timeout_s) == (default.env.name, default.env.reward_timeout_s)


def test_the_config_says_what_it_cannot_model() -> None:
    with pytest.raises(ConfigError, match="warmup_steps"):
        compose(BenchLimitConfig, LIMIT, ["steps=2"])
    with pytest.raises(ConfigError, match="embedded default"):
        compose(BenchLimitConfig, LIMIT, ["sampler=vllm"])
    with pytest.raises(ConfigError, match="barrier"):
        compose(BenchLimitConfig, LIMIT, ["pipeline.overlap=true"])


def test_json_and_table(tmp_path: Path) -> None:
    lay = Layout(2, 2, 2)
    real = {"generate": 2.3, "tools": 2.2, "grade": 0.03, "update": 2.0, "rest": 3.0, "total": 9.53}
    s = summary_json(COUNTS, RATES, lay, real, {"run_steps": 6, "measured_steps": "2-5", "x": math.inf})
    write_json(s, tmp_path / "r.json", str(tmp_path / "copy.json"))
    back = json.loads((tmp_path / "copy.json").read_text())
    assert back["x"] is None and back["ratio"]["rest"] is None
    assert back["ratio"]["generate"] == pytest.approx(2.0)
    assert back["layout"]["tool_parallel"] == 2 and back["counts"]["occupancy"] == 8.0
    table = format_table(s)
    assert "generate" in table and "2.0x" in table and "steps 2-5 of a 6-step run" in table


TINY = [
    "budget.num_leaves=6",
    "budget.group_size=2",
    "sampler.max_turns=2",
    "sampler.max_turn_tokens=24",
    "env.math.num_tasks=12",
    f"model.path={ROOT / 'models/tiny-math-habit'}",
    *UNHURRIED,
]


def test_cpu_per_step_differences_the_running_total() -> None:
    steps = [{"step": k, "total/cpu_s": 10.0 * k * k} for k in range(1, 6)]
    assert cpu_per_step(steps, measured(steps, 1, 5)) == pytest.approx((30 + 50 + 70) / 3)
    assert cpu_per_step([{"step": 2}], [{"step": 2}]) is None


def test_the_measuring_parts_count_what_they_say_on_the_tiny_policy() -> None:
    """The bench's own step times every sampler call where it runs and records every tool call and graded answer
    (as many as its ledger counts); the model's rates, the update, the tools and the grades are then measured on
    them; nothing here is timed against a bound."""
    import torch

    tc = compose(BenchLimitConfig, LIMIT, TINY).train
    torch.set_num_threads(1)
    own = own_step(tc)
    calls = own["sampler_calls"]
    assert sum(c["kept_tokens"] for c in calls) == own["ledger"]["generated_tokens"] > 0
    assert all(c["seconds"] > 0 and c["cpu_s"] >= 0 for c in calls)
    assert len(own["cells"]) == own["ledger"]["tool_calls"]
    assert len(own["answers"]) <= own["sampled_leaves"] == 6
    stack = own["stack"]
    r = model_rates(stack.model, own["trees"], rows=2, context=16, suffix=8, new_tokens=4, repeats=1)
    assert (r["rows"], r["context"], r["suffix"], r["new_tokens"]) == (2, 16, 8, 4)
    assert r["decode_tokens_per_wall_s"] == pytest.approx(2 * 4 / r["decode_wall_s"])
    assert r["prefill_tokens_per_s"] == pytest.approx(2 * 8 / max(r["prefill_cpu_s"], 1e-9))
    before = [p.detach().clone() for p in stack.model.parameters()]
    u = update_time(tc, stack.model, stack.tokenizer, own["batch"], repeats=1)
    assert u["loss_tokens"] == own["batch"].num_tokens and u["sequences"] == 6
    assert u["tokens"] <= u["padded_tokens"] and u["wall_s"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, stack.model.parameters()))  # a copy was updated
    cells = [("x = 2",), ("x = 2", "print(x + 1)")]
    timed = tool_costs(stack.env, cells)
    assert [c for c, _, _ in timed] == [1, 2] and all(w > 0 and x > 0 for _, w, x in timed)  # the child's CPU
    prompt = own["trees"][0].prompt
    wall, cpu = grade_costs(stack.env, [(prompt, prompt.answer), (prompt, "no answer here")])
    assert wall > 0 and cpu >= 0
    assert grade_costs(stack.env, []) == (0.0, 0.0)
    assert matmul_flops(1, n=64)["per_wall_s"] > 0
