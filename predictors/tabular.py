"""The tabular predictor: a per-prompt Beta posterior over the success probability.

A root scores (prior_alpha + alpha) / (prior_alpha + prior_beta + alpha + beta), with alpha / beta
the prompt's discounted bare-rollout successes / failures (predictors/history.py); a prefix scores
its prompt's posterior (no per-prefix state). An unseen prompt scores the prior mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from tracerl.algos.config import PredictorConfig
from tracerl.predictors.base import FeaturizerFactory, Predictor
from tracerl.predictors.history import PromptHistory
from tracerl.tree import RolloutTree
from tracerl.types import Anchor


class TabularPredictor(Predictor):
    def __init__(
        self, cfg: PredictorConfig, seed: int = 0, features: FeaturizerFactory | None = None
    ) -> None:
        super().__init__(cfg, seed, features)
        self.history = PromptHistory(cfg.discount)

    def _score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        a0, b0 = self.cfg.prior_alpha, self.cfg.prior_beta
        out = np.empty(len(anchors))
        for i, anchor in enumerate(anchors):
            a, b = self.history.get(anchor.prompt.prompt_id)
            out[i] = (a0 + a) / (a0 + b0 + a + b)
        return out

    def _fit(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        self.history.update(trees)
        return {"prompts_seen": float(len(self.history.counts))}

    def state_dict(self) -> dict[str, object]:
        return {**super().state_dict(), "history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.history.load_state_dict(cast("dict[str, object]", state["history"]))
