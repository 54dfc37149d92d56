"""``loss.debiased_values``: 'auto' by default, debiased node values for tree allocators and the leaf means, exactly as
before, for flat ones (docs/results/baseline_bias.md, "Decision")."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import tracerl.algos  # noqa: F401  (registers knapsack and trace_plus)
from tests.test_learner import _tree_with_tokens
from tracerl.algos.advantages import TreeAdvantages
from tracerl.algos.allocators import build_allocator
from tracerl.algos.batch import collate, debiased_setting
from tracerl.algos.config import AllocatorConfig, LossConfig
from tracerl.config import TrainConfig
from tracerl.config_loader import ConfigError, compose, conf_dir
from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status

FLAT = ("grpo", "pcl", "knapsack", "dapo")
TREE = (
    "treepo",
    "trace",
    "trace_debiased",
    "trace_plus",
    "trace_root_only",
    "trace_prefix_only",
    "oracle_trace",
    "trace_mc",
)
ESTIMATORS = ("grpo", "tree_subgroup", "node_mc", "tree_grpo")
BAD: Any = "on"  # a value the type does not allow, as a config built in Python could pass


def user_estimator(tree: RolloutTree, normalize_std: bool = False) -> TreeAdvantages:
    """An estimator registered by a user (by import path), without the ``debiased`` flag."""
    leaves = [n.node_id for n in tree.nodes if n.is_leaf]
    return TreeAdvantages(leaves, [np.zeros(len(tree.path(i)) - 1) for i in leaves])


def _branched() -> RolloutTree:
    """Prompt [1, 2]; bare path: turn n1 (model 3 4 | obs 5), then answer 6 (r = 1); a continuation from n1: answer
    7 8 (r = 0). V^(root) = V^(n1) = 1/2; D(root) = 1 (the one bare rollout), D(n1) = (1 + 0) / 2."""
    return _tree_with_tokens()


def _flat() -> RolloutTree:
    """Three bare one-turn rollouts, rewards 1, 0, 0."""
    t = RolloutTree(Prompt("q"))
    t.prompt_token_ids = [1]
    for i, r in enumerate((1.0, 0.0, 0.0)):
        p = t.new_path(True)
        t.add_node(
            0, p, token_ids=[10 + i], model_mask=[True], logprobs=[-0.5], status=Status.ANSWERED, reward=r
        )
    return t


def _auto(allocator: str, estimator: str = "tree_subgroup") -> bool:
    return debiased_setting("auto", build_allocator(AllocatorConfig(name=allocator)), estimator)


def test_auto_is_the_default_everywhere_the_key_is_written() -> None:
    assert LossConfig().debiased_values == "auto"
    for name in ("default", "demo", "search"):
        assert compose(TrainConfig, conf_dir() / f"train/{name}.yaml").loss.debiased_values == "auto"


@pytest.mark.parametrize("value", ["yes", "Auto", "1", "null"])
def test_a_bad_value_names_the_key_and_the_three_choices(value: str) -> None:
    shown = {"1": "1", "null": "None"}.get(value, repr(value))
    message = f"loss.debiased_values must be one of true, false, 'auto' (got {shown})"
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(TrainConfig, conf_dir() / "train/default.yaml", [f"loss.debiased_values={value}"])
    with pytest.raises(
        ValueError, match=re.escape("loss.debiased_values must be one of true, false, 'auto'")
    ):
        LossConfig(debiased_values=BAD)
    with pytest.raises(ValueError, match=re.escape("(got 'on')")):
        debiased_setting("on", build_allocator(AllocatorConfig(name="trace")), "tree_subgroup")


@pytest.mark.parametrize("value", [True, False])
def test_true_and_false_are_kept_and_force_the_choice(value: bool) -> None:
    cfg = compose(
        TrainConfig, conf_dir() / "train/default.yaml", [f"loss.debiased_values={str(value).lower()}"]
    )
    assert cfg.loss.debiased_values is value
    for name in FLAT + TREE:
        assert debiased_setting(value, build_allocator(AllocatorConfig(name=name)), "tree_subgroup") is value


def test_auto_means_debiased_for_tree_allocators_with_built_in_estimators_only() -> None:
    for estimator in ESTIMATORS:
        assert [_auto(n, estimator) for n in FLAT] == [False] * len(FLAT)
        assert [_auto(n, estimator) for n in TREE] == [True] * len(TREE)
    # An estimator of the user's own (it need not take the flag): leaf means, as before.
    assert _auto("trace", f"{__name__}:user_estimator") is False


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_auto_for_a_flat_allocator_is_exactly_false(estimator: str) -> None:
    for name in FLAT:
        for tree in (_flat, _branched):
            auto = collate([tree()], estimator, False, _auto(name, estimator))
            assert auto == collate([tree()], estimator, False, False)  # every field: ids, masks, advantages


def test_auto_for_a_tree_allocator_takes_the_debiased_values() -> None:
    # tree_subgroup, terms at depth 0 (the root) and 1 (n1, two leaves). Leaf means: both baselines 1/2, so the
    # answer leaf gets mean(1 - 1/2, 1 - 1/2) = 1/2 and the continuation -1/2. Debiased: D(root) = 1, D(n1) = 1/2,
    # so mean(1 - 1, 1 - 1/2) = 1/4 and mean(0 - 1, 0 - 1/2) = -3/4.
    old = collate([_branched()], "tree_subgroup", False, False)
    assert old.advantages == [[0, 0, 0.5, 0.5, 0, 0.5], [0, 0, -0.5, -0.5, 0, -0.5, -0.5]]
    for name in TREE:
        new = collate([_branched()], "tree_subgroup", False, _auto(name))
        assert new.advantages == [[0, 0, 0.25, 0.25, 0, 0.25], [0, 0, -0.75, -0.75, 0, -0.75, -0.75]]
        assert (new.input_ids, new.loss_mask, new.sampler_logprobs) == (
            old.input_ids,
            old.loss_mask,
            old.sampler_logprobs,
        )
    # grpo: r - D(root) = 0 and -1 (leaf means: +-1/2); node_mc: D(n1) - D(root) = -1/2 on the shared turn.
    assert collate([_branched()], "grpo", False, _auto("trace", "grpo")).advantages[1][-1] == -1.0
    assert collate([_branched()], "node_mc", False, _auto("trace", "node_mc")).advantages[0][2:] == [
        -0.5,
        -0.5,
        0,
        0.5,
    ]
