"""Success-probability predictors V~(H) for roots and prefixes (docs/method.md, "The shared predictor").

Chosen by name from ``PREDICTORS`` (``tracerl.predictor``; the built-ins constant, tabular, learned, oracle are
imported on first use, or 'module:attr'); length predictors (generated tokens from an anchor, for trace_plus)
from ``LENGTH_PREDICTORS``.
"""

from tracerl.predictor import PREDICTORS, Predictor, build_predictor
from tracerl.predictors.length import LENGTH_PREDICTORS

__all__ = ["LENGTH_PREDICTORS", "PREDICTORS", "Predictor", "build_predictor"]
