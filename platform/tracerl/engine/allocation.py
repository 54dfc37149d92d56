"""The allocation assembly: an allocator name and a predictor section turned into what ``Stepper`` runs.

Every command that allocates (``tracerl train``, ``tracerl rollout``, the rollout, limit, pipeline and simulator
benches) builds its allocator and scorer here, so a cost-aware allocator always has its length predictor and a
Monte-Carlo allocator is always scored by its extra rollouts (tests/test_allocation_assembly.py holds every
registered allocator to it).
"""

from __future__ import annotations

from tracerl.algos.allocators import Allocator, build_allocator
from tracerl.algos.config import AllocatorConfig, PredictorConfig
from tracerl.engine.mc_scorer import SeededBackend, with_monte_carlo
from tracerl.predictor import LENGTH_PREDICTORS, FeaturizerFactory, Predictor, build_predictor


def build_allocation(
    allocator_cfg: AllocatorConfig,
    predictor_cfg: PredictorConfig,
    seed: int,
    backend: SeededBackend,
    features: FeaturizerFactory | None = None,
) -> tuple[Allocator, Predictor]:
    """The allocator ``allocator_cfg`` names and the step's scorer.

    The allocator gets its length predictor where it prices by tokens (``Allocator.length_predictor``: trace_plus).
    The predictor is ``predictor_cfg``'s, or the one the allocator forces (``Allocator.predictor``), fitted on the
    allocator's targets, reading ``features`` (None: the simulator's numeric features). A Monte-Carlo allocator
    (trace_mc) is scored by extra rollouts on ``backend`` (a sampler pool, an engine, the simulator) around it.
    """
    allocator = allocator_of(allocator_cfg)
    predictor = build_predictor(
        predictor_cfg, seed, name=allocator.predictor, targets=allocator.targets, features=features
    )
    return allocator, with_monte_carlo(allocator, predictor, backend)


def allocator_of(allocator_cfg: AllocatorConfig) -> Allocator:
    """The allocator ``allocator_cfg`` names, with its length predictor where it prices by tokens; no scorer (a
    replay of its plans, as ``tracerl bench peer`` replays grpo's prompt draws)."""
    allocator = build_allocator(allocator_cfg)
    if allocator.length_predictor is not None:
        allocator.lengths = LENGTH_PREDICTORS.get(allocator.length_predictor)()
    return allocator
