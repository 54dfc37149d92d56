"""One allocation assembly (tracerl.engine.allocation.build_allocation): every registered allocator is built through
it and steps; no command assembles an allocator and its scorer by hand; `tracerl rollout`, `bench rollout` and
`bench limit`'s own step run the two allocators that need more than a predictor (trace_plus: a length predictor,
trace_mc: Monte-Carlo scoring)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, UNHURRIED
from tracerl import metrics as M
from tracerl.algos.allocators import ALLOCATORS
from tracerl.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.config_loader import compose
from tracerl.engine.allocation import allocator_of, build_allocation
from tracerl.engine.mc_scorer import MonteCarloScorer
from tracerl.engine.step import run_step
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.workflows.bench.config import BenchRolloutConfig
from tracerl.workflows.bench.rollout import run_one
from tracerl.workflows.cli.app import main
from tracerl.workflows.experiments.config import BenchLimitConfig
from tracerl.workflows.experiments.limit import own_step

HABIT = ROOT / "models" / "tiny-math-habit"
SMALL = [
    "budget.num_leaves=6",
    "budget.group_size=2",
    "sampler.max_turns=2",
    "sampler.max_turn_tokens=24",
    "env.math.num_tasks=16",
    "allocator.mc_samples=2",
    f"model.path={HABIT}",
]
ASSEMBLY = {"build_allocator", "with_monte_carlo"}
"""The calls that make up the assembly: only tracerl/engine/allocation.py makes them."""


@pytest.mark.parametrize("name", ALLOCATORS.names())
def test_every_registered_allocator_is_built_and_steps_on_the_simulator(name: str) -> None:
    env = Simulator(SimulatorConfig(num_prompts=64), seed=0)
    budget = BudgetConfig(num_leaves=48, group_size=4, pool_factor=2)
    alloc, pred = build_allocation(AllocatorConfig(name=name), PredictorConfig(name="tabular"), 0, env)
    assert (alloc.lengths is not None) == (alloc.length_predictor is not None)
    assert isinstance(pred, MonteCarloScorer) == alloc.monte_carlo
    # the same allocator without a scorer (a replay of plans)
    alone = allocator_of(AllocatorConfig(name=name))
    assert type(alone) is type(alloc) and (alone.lengths is None) == (alloc.lengths is None)
    for _ in range(2):  # the second step allocates with a fitted predictor
        out = run_step(
            env.sample_pool(budget.num_candidates), alloc, pred, env, budget, np.random.default_rng(0)
        )
        assert out.ledger.leaves > 0
        pred.fit(out.sampled_trees)
        alloc.observe(out.sampled_trees)


def assembly_calls(path: Path) -> list[str]:
    """The name of every call of an assembly function in ``path``, sorted."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in ASSEMBLY or (name == "get" and "LENGTH_PREDICTORS" in ast.unparse(fn)):
                out.append(name)
    return sorted(out)


def test_no_command_assembles_an_allocator_by_hand() -> None:
    roots = [ROOT / "platform/tracerl", ROOT / "workflows", ROOT / "envs", ROOT / "predictors"]
    found = {
        str(p.relative_to(ROOT)): calls
        for root in roots
        for p in sorted(
            root.rglob("*.py")
        )  # rglob does not follow platform/tracerl's links: each folder once
        if (calls := assembly_calls(p))
    }
    assert found == {"platform/tracerl/engine/allocation.py": ["build_allocator", "get", "with_monte_carlo"]}


@pytest.mark.parametrize("allocator", ["trace_plus", "trace_mc"])
def test_tracerl_rollout_runs_the_allocators_with_extra_parts(allocator: str, tmp_path: Path) -> None:
    args = ["rollout", "--out", str(tmp_path), "--steps", "1", f"allocator={allocator}", *SMALL, *UNHURRIED]
    assert main(args) == 0
    trees = [json.loads(x) for x in (tmp_path / "trees.jsonl").read_text().splitlines()]
    assert sum(len(t["rewards"]) for t in trees) >= 6


def test_bench_rollout_runs_the_allocators_with_extra_parts() -> None:
    cfg = compose(BenchRolloutConfig, ROOT / "conf/bench/rollout.yaml", ["steps=1", *SMALL, *UNHURRIED])
    for name in ("trace_plus", "trace_mc"):
        steps, _ = run_one(cfg, name, 0, lambda s: None)
        assert len(steps) == 1 and steps[0][M.LEAVES] >= 6


def test_bench_limit_scores_trace_mc_by_its_rollouts() -> None:
    """`bench limit allocator=trace_mc` times trace_mc's own scoring: its Monte-Carlo rollouts are sampler calls of
    the measured step (before, it ran plain trace scoring)."""
    import torch

    torch.set_num_threads(1)
    plain = own_step(
        compose(BenchLimitConfig, ROOT / "conf/bench/limit.yaml", ["allocator=trace", *SMALL]).train
    )
    mc = own_step(
        compose(BenchLimitConfig, ROOT / "conf/bench/limit.yaml", ["allocator=trace_mc", *SMALL]).train
    )
    assert mc["ledger"]["generated_tokens"] > 0
    assert sum(c["rows"] for c in mc["sampler_calls"]) > sum(c["rows"] for c in plain["sampler_calls"])
