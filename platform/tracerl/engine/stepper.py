"""The one assembly of a step's phases on a language-model backend, used by every caller.

    pool  = select(step)              # the candidate pool: num_candidates prompts drawn without replacement
    out   = run(step)                 # barrier or streaming: engine/step.py run_step
    # or, overlapped with the previous update (pipeline.overlap):
    plan  = start(step)               # select + Stage 1 now (the predictor may read the policy)
    bare  = bare(plan)                # the bare rollouts, on a background thread
    out   = finish(plan, bare)        # Stage 2 on the new weights

Every path ends in ``_close``: the step's ledger (leaves, rollouts) takes the backend's counts for the step
(tokens, calls, tool work, generation time), so ``tracerl train`` in every mode, ``tracerl rollout`` and the
benches count a step the same way. ``tracerl train``, ``tracerl rollout``, ``tracerl bench rollout`` and
``tracerl bench pipeline`` build a ``Stepper``; the simulator's benches call ``run_step`` on the simulator, which
has no backend ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tracerl.algos.allocators import Allocator
from tracerl.algos.config import BudgetConfig
from tracerl.engine.config import PipelineMode
from tracerl.engine.ledger import ENGINE_COUNTS, BudgetLedger
from tracerl.engine.protocol import TreeBackend
from tracerl.engine.step import (
    BareRollouts,
    PlannedStep,
    Scorer,
    StepOutcome,
    complete,
    plan_roots,
    roll_out_bare,
    run_step,
)
from tracerl.engine.timer import PhaseTimer
from tracerl.types import Prompt


class CountingBackend(TreeBackend, Protocol):
    """A tree backend that counts a step's work in its own ledger (the ReAct engine, the sampler pool)."""

    ledger: BudgetLedger

    def begin_step(self, step: int) -> None:
        """Rollouts from now on belong to RL step ``step`` (it keys their seeds); a fresh ledger counts them."""
        ...


def sample_pool(prompts: Sequence[Prompt], size: int, rng: np.random.Generator) -> list[Prompt]:
    """``size`` of ``prompts`` drawn without replacement (the step's candidate pool, M of docs/method.md)."""
    if size > len(prompts):
        raise ValueError(
            f"the candidate pool needs {size} prompts but the task set has {len(prompts)}; "
            "raise env.<name>.num_tasks or lower budget.pool_factor"
        )
    return [prompts[i] for i in rng.choice(len(prompts), size=size, replace=False)]


def merge_ledgers(step_ledger: BudgetLedger, engine_ledger: BudgetLedger) -> BudgetLedger:
    """The step's counts (leaves, rollouts) plus the engine's (tokens, calls, tool work, generation time)."""
    for f in ENGINE_COUNTS:
        setattr(step_ledger, f, getattr(engine_ledger, f))
    step_ledger.kv_depth = {d: list(c) for d, c in engine_ledger.kv_depth.items()}
    step_ledger.phase_s.update({k: v for k, v in engine_ledger.phase_s.items()})
    return step_ledger


@dataclass
class Stepper:
    """Steps of allocation and rollout over ``prompts`` on ``backend`` (docs/design.md, "One training step")."""

    prompts: Sequence[Prompt]
    allocator: Allocator
    predictor: Scorer
    backend: CountingBackend
    rng: np.random.Generator
    """Draws every step's pool, allocation ties and Stage 2 seed, in that order (the run's determinism)."""
    mode: PipelineMode = "barrier"

    def select(self, step: int, budget: BudgetConfig, timer: PhaseTimer | None = None) -> list[Prompt]:
        """Step ``step``'s candidate pool; the backend starts counting for the step."""
        timer = timer or PhaseTimer()
        with timer("select"):
            pool = sample_pool(self.prompts, budget.num_candidates, self.rng)
            self.backend.begin_step(step)
        return pool

    def run(self, step: int, budget: BudgetConfig, timer: PhaseTimer | None = None) -> StepOutcome:
        """Select, score, allocate roots, roll out, expand prefixes (barrier, or streaming by ``mode``)."""
        pool = self.select(step, budget, timer)
        ledger = self.backend.ledger
        out = run_step(pool, self.allocator, self.predictor, self.backend, budget, self.rng, timer, self.mode)
        return _close(out, ledger)

    def start(self, step: int, budget: BudgetConfig, timer: PhaseTimer) -> tuple[PlannedStep, BudgetLedger]:
        """Select and Stage 1 now; the backend's ledger for the step comes back beside the plan (a later step's
        ``start`` may begin a new one before this one finishes)."""
        pool = self.select(step, budget, timer)
        ledger = self.backend.ledger
        return plan_roots(pool, self.allocator, self.predictor, budget, self.rng, timer), ledger

    def bare(self, planned: PlannedStep) -> BareRollouts:
        """A started step's bare rollouts (safe on another thread: it touches no generator of the driver)."""
        return roll_out_bare(planned, self.backend)

    def finish(self, planned: PlannedStep, bare: BareRollouts, ledger: BudgetLedger) -> StepOutcome:
        """Stage 2 of a started step and its counts."""
        return _close(complete(planned, bare, self.allocator, self.predictor, self.backend), ledger)


def _close(out: StepOutcome, backend_ledger: BudgetLedger) -> StepOutcome:
    out.ledger = merge_ledgers(out.ledger, backend_ledger)
    return out
