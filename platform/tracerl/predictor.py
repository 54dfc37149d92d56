"""The predictor interface below the layers that implement it: the ``Predictor`` base class (what the allocation
step and the config checks call) and the ``PREDICTORS`` registry.

The built-in predictors (constant, tabular, learned, oracle) live in the ``predictors`` package and are lazy
entries here (``Registry.add_lazy``): listed by name at once, imported on first use, so the platform looks
predictors up without importing that package (``predictors`` re-exports these names). docs/method.md, "The
shared predictor", says what they predict; predictors/base.py derives their training targets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import ClassVar, Literal, cast

import numpy as np

from tracerl.algos.config import PredictorConfig
from tracerl.algos.trace_plus import LengthModel
from tracerl.registry import Registry
from tracerl.tree import RolloutTree
from tracerl.types import Anchor

Featurizer = Callable[[Sequence[Anchor]], np.ndarray]
"""Anchors -> feature rows, shape (len(anchors), d)."""

FeaturizerFactory = Callable[[], Featurizer]
"""Builds the anchor featurizer; only predictors that read anchor features call it (so a workflow can offer
text features, and say what is missing, without knowing which predictor will use them)."""


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


PREDICTORS: Registry[type[Predictor]] = Registry("predictor", group="tracerl.predictors")
"""Every predictor is built as ``cls(cfg, seed, features=...)`` (``build_predictor``); third-party packages
register under the entry-point group ``tracerl.predictors``."""
for _name, _path in {
    "constant": "tracerl.predictors.constant:ConstantPredictor",
    "tabular": "tracerl.predictors.tabular:TabularPredictor",
    "learned": "tracerl.predictors.learned:LearnedPredictor",
    "oracle": "tracerl.predictors.oracle:OraclePredictor",
}.items():
    PREDICTORS.add_lazy(_name, _path)


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


LENGTH_PREDICTORS: Registry[Callable[..., LengthModel]] = Registry("length predictor")
"""Length predictors for cost-aware allocators (trace_plus), built with no arguments; the built-in ``ridge`` lives in
``tracerl.predictors.length`` and is imported on first use."""
LENGTH_PREDICTORS.add_lazy("ridge", "tracerl.predictors.length:RidgeLengthPredictor")
