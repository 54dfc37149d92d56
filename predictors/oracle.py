"""The oracle predictor: the simulator's true success probabilities (the allocation ceiling)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracerl.predictors.base import Predictor
from tracerl.types import Anchor


class OraclePredictor(Predictor):
    """Reads ``true_value`` from the prefix node, or from the prompt for a root."""

    needs_true_values = True

    def _score(self, anchors: Sequence[Anchor]) -> np.ndarray:
        out = np.empty(len(anchors))
        for i, a in enumerate(anchors):
            value = a.node.true_value if a.node is not None else a.prompt.true_value
            if value is None:
                raise ValueError(
                    "the oracle predictor needs true success probabilities, which only the simulator "
                    "provides; use predictor=learned or predictor=tabular for this environment"
                )
            out[i] = value
        return out
