"""Shared test helpers: small hand-built trees and the repository paths."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tracerl.tree import RolloutTree
from tracerl.types import Prompt, Status

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip cleanly on machines without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def chain(tree: RolloutTree, parent: int, rewards_depths: Sequence[tuple[float, int]], bare: bool = True) -> list[int]:
    """Add rollouts below ``parent``: each (reward, turns) adds a chain of that many turns; returns leaf ids."""
    leaves = []
    for reward, turns in rewards_depths:
        pid = tree.new_path(bare)
        cur = parent
        for t in range(turns):
            last = t == turns - 1
            node = tree.add_node(cur, pid, status=Status.ANSWERED if last else Status.TURN, reward=reward if last else None)
            cur = node.node_id
        leaves.append(cur)
    return leaves


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly trained tiny policy (real tokenizer, LlamaForCausalLM, SFT on rendered traces), built once."""
    from tracerl.config import BootstrapConfig
    from workflows.bootstrap import bootstrap

    out = tmp_path_factory.mktemp("tiny") / "policy"
    cfg = BootstrapConfig(out_dir=str(out), train_tasks=80, eval_tasks=6, hidden_size=48, num_layers=2, num_heads=4,
                          intermediate_size=96, steps=40, batch_size=8, time_budget_s=60, force=True)
    metrics = bootstrap(cfg)
    assert metrics["train_steps"] == 40 and metrics["final_loss"] < 4.5  # it learned something (from ln(vocab) ~ 6)
    assert {"accuracy", "by_level", "well_formed_turns"} <= set(metrics["sampled"])
    return out


@pytest.fixture
def small_tree() -> RolloutTree:
    """Root with two bare rollouts (2 turns each) and two continuations from the first one's turn 1.

        0 (root)
        ├── 1 ── 2 (r=0)            bare path 0
        │   ├── 5 (r=1)             continuation path 2 from node 1
        │   └── 6 (r=1)             continuation path 3 from node 1
        └── 3 ── 4 (r=1)            bare path 1
    """
    tree = RolloutTree(Prompt("p0"))
    chain(tree, 0, [(0.0, 2), (1.0, 2)])
    chain(tree, 1, [(1.0, 1), (1.0, 1)], bare=False)
    return tree
