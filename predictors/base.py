"""The predictor interface: score anchors (roots and prefixes), fit on finished trees.

Training targets are the recursive targets V^ of every non-leaf node of the trees just built
(section 6), weighted by the node's leaf count n_y where a predictor supports weights; with
``predictor.targets=debiased`` (forced by allocator ``trace_debiased``) they are the debiased targets D,
weighted by the node's number of children, split into examples that are each unbiased
(platform/tracerl/tree.py derives why). Predictors only
steer allocation; they never enter the policy loss.

The ``Predictor`` base class, ``PREDICTORS`` and ``build_predictor`` are defined in ``tracerl.predictor`` (the
platform uses them without importing this package) and re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracerl.predictor import PREDICTORS, FeaturizerFactory, Predictor, build_predictor
from tracerl.tree import Node, RolloutTree
from tracerl.types import Anchor


@dataclass(frozen=True)
class Targets:
    """Training examples taken from trees: one per non-leaf node."""

    anchors: list[Anchor]
    values: np.ndarray
    """V^ (or D) per anchor, shape (n,)."""
    weights: np.ndarray
    """Leaf count n_y (or, debiased, the number of children) per anchor, shape (n,)."""


TARGETS = ("recursive", "debiased")


def tree_targets(trees: Sequence[RolloutTree], kind: str = "recursive") -> Targets:
    """Every non-leaf node with at least one leaf below, with its target and fit weight.

    ``kind``: 'recursive' (V^, weight n_y) or 'debiased' (``RolloutTree.debiased_examples``: the root's D with
    weight = number of bare rollouts; per other node its path's reward, weight 1, and where continuations
    started there their mean, weight K; together the node's D with weight = number of children).
    """
    if kind not in TARGETS:
        raise ValueError(f"predictor targets must be one of {', '.join(TARGETS)} (got {kind!r})")
    anchors, values, weights = [], [], []
    for tree in trees:
        history: list[tuple[Node, ...]] = [()]  # node id -> turns from the root (parents come first)
        for node in tree.nodes[1:]:
            history.append(history[node.parent or 0] + (node,))
        if kind == "debiased":  # up to two examples per node, each unbiased on its own (tree.py, point 4)
            ids, v, w = tree.debiased_examples()
            anchors += [Anchor(tree.prompt, history[i]) for i in ids]
            values += v.tolist()
            weights += w.tolist()
            continue
        v, n = tree.targets(), tree.leaf_counts()
        for node in tree.nodes:
            if not node.is_leaf and n[node.node_id] > 0:
                anchors.append(Anchor(tree.prompt, history[node.node_id]))
                values.append(v[node.node_id])
                weights.append(n[node.node_id])
    return Targets(anchors, np.asarray(values, float), np.asarray(weights, float))


__all__ = [
    "PREDICTORS",
    "TARGETS",
    "FeaturizerFactory",
    "Predictor",
    "Targets",
    "build_predictor",
    "tree_targets",
]
