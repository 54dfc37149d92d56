"""Issue 28.2 ("the step at its limit"): cutting a step's overhead must not change what a run learns.

``test_fixed_seed_trees_are_pinned`` pins one step's rollout trees of the embedded default's training path (the
smoke config, the committed tiny policy, seed 0) for ``grpo`` and ``trace``: a fingerprint of every node's token
ids, parent, depth, status and reward, recorded at the commit before the step's overhead was cut. A change to the
engine, the samplers' threads or the actor layout that alters a tree fails here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import pytest

from tests.conftest import ROOT, UNHURRIED
from tracerl.tree import RolloutTree

SMOKE = ROOT / "conf" / "train" / "smoke.yaml"
TINY = ROOT / "models" / "tiny-math"

PINNED = {
    "grpo": "ea38b318db28cb2a806fa0856b12f6f5e6c7c01c00599ff9f4b187d4a48d0b6e",
    "trace": "1a55c5183688f798a7890ab995d593bf6363035e54502b19fb919bacb24f9ac5",
}
"""sha256 of ``fingerprint`` of step 0's sampled trees, seed 0 (recorded at 72fec73, before issue 28.2's changes)."""


def fingerprint(trees: Sequence[RolloutTree]) -> str:
    """sha256 of the trees' prompts and every node's token ids, parent, depth, status and reward, in order."""
    rows = [
        [
            t.prompt.prompt_id,
            [[n.parent, n.depth, n.status.value, n.reward, list(n.token_ids)] for n in t.nodes],
        ]
        for t in trees
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def step_trees(allocator: str, seed: int = 0) -> list[RolloutTree]:
    """Step 0's sampled trees of ``tracerl train --config conf/train/smoke.yaml`` (as the driver builds the step:
    its allocator, text predictor and stepper), rolled out in this process on the committed tiny policy."""
    import numpy as np

    from predictors.length import attach_lengths
    from tracerl.algos.allocators import build_allocator
    from tracerl.config import TrainConfig
    from tracerl.config_loader import compose
    from tracerl.engine.stepper import Stepper
    from workflows.lm.stack import build_stack, build_text_predictor, task_prompts

    cfg = compose(
        TrainConfig, SMOKE, [f"model.path={TINY}", f"allocator={allocator}", f"seed={seed}", *UNHURRIED]
    )
    stack = build_stack(cfg.model, cfg.sampler, cfg.env, cfg.seed)
    alloc = build_allocator(cfg.allocator)
    attach_lengths(alloc)
    pred = build_text_predictor(cfg.predictor, stack, cfg.seed, name=alloc.predictor, targets=alloc.targets)
    stepper = Stepper(
        task_prompts(cfg.env), alloc, pred, stack.engine, np.random.default_rng(cfg.seed), cfg.pipeline.mode
    )
    return stepper.run(0, cfg.budget).sampled_trees


@pytest.mark.parametrize("allocator", ["grpo", "trace"])
def test_fixed_seed_trees_are_pinned(allocator: str) -> None:
    trees = step_trees(allocator)
    assert sum(len(t.nodes) for t in trees) > len(trees)  # real rollouts, not bare roots
    assert fingerprint(trees) == PINNED[allocator]
