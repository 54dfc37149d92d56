"""Success-probability predictors V~(H) for roots and prefixes (docs/method.md, "The shared predictor").

Chosen by name from ``PREDICTORS``: constant, tabular, learned, oracle (or 'module:attr');
length predictors (generated tokens from an anchor, for trace_plus) from ``LENGTH_PREDICTORS``.
"""

from predictors.base import PREDICTORS, Predictor, build_predictor

# Register the built-in predictors.
from predictors import constant, learned, oracle, tabular  # noqa: E402,F401  isort: skip
from predictors.length import LENGTH_PREDICTORS  # noqa: E402  isort: skip

__all__ = ["LENGTH_PREDICTORS", "PREDICTORS", "Predictor", "build_predictor"]
