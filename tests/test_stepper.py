"""The one assembly of a step's phases (tracerl/engine/stepper.py): every path takes the same decisions and the
same trees as the engine's run_step on the same generator, and counts the backend's work once per step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tracerl.algos.allocators import Expansion, build_allocator
from tracerl.config import AllocatorConfig, BudgetConfig, PredictorConfig
from tracerl.engine.ledger import BudgetLedger
from tracerl.engine.step import run_step
from tracerl.engine.stepper import Stepper, sample_pool
from tracerl.engine.timer import PhaseTimer
from tracerl.envs.simulator import Simulator, SimulatorConfig
from tracerl.predictors import build_predictor
from tracerl.tree import RolloutTree
from tracerl.types import Prompt

BUDGET = BudgetConfig(num_leaves=96, pool_factor=2)


class FakeCountingSim:
    """A fake counting backend: the simulator's trees, with a ledger that counts rollout calls as tokens."""

    def __init__(self, seed: int) -> None:
        self.sim = Simulator(SimulatorConfig(num_prompts=128), seed=seed)
        self.ledger = BudgetLedger()
        self.steps: list[int] = []

    def begin_step(self, step: int) -> None:
        self.steps.append(step)
        self.ledger = BudgetLedger()

    def rollout(self, prompts: Sequence[Prompt], counts: Sequence[int]) -> list[RolloutTree]:
        self.ledger.generated_tokens += 10 * sum(counts)
        return self.sim.rollout(prompts, counts)

    def expand(self, trees: Sequence[RolloutTree], expansions: Sequence[Expansion]) -> None:
        self.ledger.generated_tokens += sum(int(e.counts.sum()) for e in expansions)
        self.sim.expand(trees, expansions)


def _parts(name: str, seed: int) -> tuple[FakeCountingSim, list[Prompt], Any, Any]:
    backend = FakeCountingSim(seed)
    prompts = [backend.sim.prompt(i) for i in range(128)]
    alloc = build_allocator(AllocatorConfig(name=name))
    pred = build_predictor(PredictorConfig(name="tabular", warmup_steps=1), seed=seed, name=alloc.predictor)
    return backend, prompts, alloc, pred


def _signature(trees: Sequence[RolloutTree]) -> list[tuple[str, int, list[float]]]:
    return [(t.prompt.prompt_id, len(t.nodes), [float(r) for r in t.path_rewards()]) for t in trees]


def _steps(how: str, name: str, seed: int = 3, steps: int = 3) -> list[tuple[list, int]]:
    backend, prompts, alloc, pred = _parts(name, seed)
    rng = np.random.default_rng(seed)
    stepper = Stepper(prompts, alloc, pred, backend, rng)
    seen = []
    for s in range(steps):
        if how == "engine":  # the reference: the engine's step on a pool drawn the same way
            backend.begin_step(s)
            out = run_step(
                sample_pool(prompts, BUDGET.num_candidates, rng), alloc, pred, backend, BUDGET, rng
            )
        elif how == "run":
            out = stepper.run(s, BUDGET)
        else:  # overlapped: Stage 1, bare rollouts, Stage 2 apart
            planned, ledger = stepper.start(s, BUDGET, PhaseTimer())
            out = stepper.finish(planned, stepper.bare(planned), ledger)
        pred.fit(out.sampled_trees)
        seen.append((_signature(out.sampled_trees), out.ledger.generated_tokens))
    assert backend.steps == list(range(steps))
    return seen


@pytest.mark.parametrize("name", ["grpo", "trace", "dapo"])
def test_every_path_gives_the_engines_trees(name: str) -> None:
    ref = _steps("engine", name)
    run, split = _steps("run", name), _steps("split", name)
    assert [t for t, _ in run] == [t for t, _ in ref] == [t for t, _ in split]
    assert len(ref[0][0]) > 0


def test_the_step_ledger_takes_the_backends_counts_once() -> None:
    for how in ("run", "split"):
        counted = [tokens for _, tokens in _steps(how, "trace")]
        assert all(c > 0 for c in counted)
        assert counted == [tokens for _, tokens in _steps(how, "trace")]  # one fresh ledger per step


def test_a_pool_larger_than_the_task_set_says_what_to_change() -> None:
    with pytest.raises(ValueError, match="raise env.<name>.num_tasks or lower budget.pool_factor"):
        sample_pool([], 4, np.random.default_rng(0))
