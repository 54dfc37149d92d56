"""The predictor interface: score anchors (roots and prefixes), fit on finished trees.

Training targets are the recursive targets V^ of every non-leaf node of the trees just built
(section 6), weighted by the node's leaf count n_y where a predictor supports weights. Predictors
only steer allocation; they never enter the policy loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracerl.config import PredictorConfig
from tracerl.registry import Registry
from tracerl.tree import Node, RolloutTree
from tracerl.types import Anchor

PREDICTORS: Registry = Registry("predictor")


@dataclass(frozen=True)
class Targets:
    """Training examples taken from trees: one per non-leaf node."""

    anchors: list[Anchor]
    values: np.ndarray
    """V^ per anchor, shape (n,)."""
    weights: np.ndarray
    """Leaf count n_y per anchor, shape (n,)."""


def tree_targets(trees: Sequence[RolloutTree]) -> Targets:
    """Every non-leaf node with at least one leaf below, with its recursive target and leaf count."""
    anchors, values, weights = [], [], []
    for tree in trees:
        v, n = tree.targets(), tree.leaf_counts()
        history: list[tuple[Node, ...]] = [()]  # node id -> turns from the root (parents come first)
        for node in tree.nodes[1:]:
            history.append(history[node.parent or 0] + (node,))
        for node in tree.nodes:
            if not node.is_leaf and n[node.node_id] > 0:
                anchors.append(Anchor(tree.prompt, history[node.node_id]))
                values.append(v[node.node_id])
                weights.append(n[node.node_id])
    return Targets(anchors, np.asarray(values, float), np.asarray(weights, float))


class Predictor:
    """Base class. Subclasses implement ``_score`` and ``_fit``; ``ready`` gates cold start."""

    def __init__(self, cfg: PredictorConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.steps_fit = 0

    @property
    def ready(self) -> bool:
        """True once fit on ``warmup_steps`` steps; before that allocation is uniform."""
        return self.steps_fit >= self.cfg.warmup_steps

    def score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        """Predicted success probabilities, shape (len(anchors),), each in [0, 1]."""
        if not anchors:
            return np.zeros(0)
        return np.clip(self._score(anchors), 0.0, 1.0)

    def fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """One online update on the trees of a step; returns fit statistics (e.g. loss)."""
        stats = self._fit(trees)
        self.steps_fit += 1
        return stats

    def _score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        raise NotImplementedError

    def _fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, object]:
        """Everything needed to resume (checkpoints)."""
        return {"steps_fit": self.steps_fit}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.steps_fit = int(state["steps_fit"])  # type: ignore[call-overload]


def build_predictor(cfg: PredictorConfig, seed: int = 0, name: str | None = None) -> Predictor:
    """Instantiate ``name`` (default ``cfg.name``) from the registry or an import path."""
    cls = PREDICTORS.get(name or cfg.name)
    return cls(cfg, seed)  # type: ignore[no-any-return]
