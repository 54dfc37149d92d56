"""Success-probability predictors V~(H) for roots and prefixes (docs/TRACE.md section 6).

Chosen by name from ``PREDICTORS``: constant, tabular, learned, oracle (or 'module:attr').
"""

from predictors.base import PREDICTORS, Predictor, build_predictor

# Register the built-in predictors.
from predictors import constant, learned, oracle, tabular  # noqa: E402,F401  isort: skip

__all__ = ["PREDICTORS", "Predictor", "build_predictor"]
