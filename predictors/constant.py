"""The constant predictor: every anchor scores ``predictor.constant_value`` (0.5: no information)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracerl.predictors.base import Predictor
from tracerl.types import Anchor


class ConstantPredictor(Predictor):
    def _score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        return np.full(len(anchors), self.cfg.constant_value)
