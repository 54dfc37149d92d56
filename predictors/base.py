"""The predictor interface: score anchors (roots and prefixes), fit on finished trees.

Training targets are the recursive targets V^ of every non-leaf node of the trees just built
(section 6), weighted by the node's leaf count n_y where a predictor supports weights; with
``predictor.targets=debiased`` (forced by allocator ``trace_debiased``) they are the debiased targets D,
weighted by the node's number of children, split into examples that are each unbiased
(platform/tracerl/tree.py derives why). Predictors only
steer allocation; they never enter the policy loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, cast

import numpy as np

from predictors.features import Featurizer
from tracerl.config import PredictorConfig
from tracerl.registry import Registry
from tracerl.tree import Node, RolloutTree
from tracerl.types import Anchor

PREDICTORS: Registry[type[Predictor]] = Registry("predictor", group="tracerl.predictors")
"""Every predictor is built as ``cls(cfg, seed, features=...)`` (``build_predictor``); third-party packages
register under the entry-point group ``tracerl.predictors``."""

FeaturizerFactory = Callable[[], Featurizer]
"""Builds the anchor featurizer; only predictors that read anchor features call it (so a workflow can offer
text features, and say what is missing, without knowing which predictor will use them)."""


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


class Predictor:
    """Base class. Subclasses implement ``_score`` and ``_fit``; ``ready`` gates cold start.

    Args:
        cfg: the predictor section.
        seed: the run's seed.
        features: builds the anchor featurizer for a predictor that reads features (None: the simulator's
            numeric features); predictors that do not read features ignore it.
    """

    needs_true_values: ClassVar[bool] = False
    """It reads the true success probabilities (``Prompt.true_value``): only an environment with
    ``Env.true_values`` (the simulator) can serve it; the config loader checks this before a run starts."""

    def __init__(
        self, cfg: PredictorConfig, seed: int = 0, features: FeaturizerFactory | None = None
    ) -> None:
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
        self.steps_fit = int(cast(int, state["steps_fit"]))


def build_predictor(
    cfg: PredictorConfig,
    seed: int = 0,
    name: str | None = None,
    targets: Literal["recursive", "debiased"] | None = None,
    features: FeaturizerFactory | None = None,
) -> Predictor:
    """Instantiate ``name`` (default ``cfg.name``): a registered name, an import path or an entry point.

    ``targets`` overrides ``cfg.targets`` (an allocator's ``targets``: trace_debiased forces 'debiased');
    ``features`` builds the featurizer of a predictor that reads anchor features (None: numeric features).
    """
    if targets is not None:
        cfg = replace(cfg, targets=targets)
    return PREDICTORS.get(name or cfg.name)(cfg, seed, features=features)
