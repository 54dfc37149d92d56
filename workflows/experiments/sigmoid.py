"""ScaleRL's saturating fit of a learning curve (arXiv 2510.13786): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) by
bounded least squares, with its goodness of fit and whether the data pin the asymptote down. Pure numpy/scipy; the
curve statistics are in workflows/experiments/curves.py, the curves report in workflows/experiments/curves_report.py.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit


@dataclass(frozen=True)
class SigmoidFit:
    """ScaleRL's saturating curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) fitted to (C, R) points.

    A fit that did not converge has ``converged`` False, the reason in ``message`` and NaN parameters.
    """

    converged: bool
    message: str
    start: float
    """R0, the accuracy at no compute (fixed, not fitted)."""
    asymptote: float
    """A, the accuracy the curve saturates at."""
    midpoint: float
    """C_mid, the compute at which half of A - R0 is gained."""
    exponent: float
    """B, how sharply the curve rises around C_mid."""
    r2: float
    """Coefficient of determination on the fitted points (1 - residual / total sum of squares)."""
    rmse: float
    """Root mean squared residual on the fitted points."""
    compute_range: tuple[float, float]
    """Smallest and largest compute among the fitted points."""
    at_bound: bool
    """Some parameter ended on its bound: the data do not pin it down."""

    def predict(self, c: np.ndarray | float) -> np.ndarray:
        """R(C) at compute ``c`` (> 0)."""
        return sigmoid(np.asarray(c, float), self.start, self.asymptote, self.midpoint, self.exponent)

    @property
    def identified(self) -> bool:
        """Converged, no parameter on its bound, and C_mid inside the data: the asymptote is measured, not
        extrapolated from a curve that has not yet bent."""
        lo, hi = self.compute_range
        return self.converged and not self.at_bound and lo <= self.midpoint <= hi


def sigmoid(c: np.ndarray, start: float, asymptote: float, midpoint: float, exponent: float) -> np.ndarray:
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), for C > 0."""
    return start + (asymptote - start) / (1.0 + (midpoint / np.asarray(c, float)) ** exponent)


def _failed(message: str, start: float, c: np.ndarray) -> SigmoidFit:
    lo, hi = (float(c.min()), float(c.max())) if c.size else (math.nan, math.nan)
    nan = math.nan
    return SigmoidFit(False, message, start, nan, nan, nan, nan, nan, (lo, hi), False)


def fit_sigmoid(
    c: np.ndarray,
    r: np.ndarray,
    start: float | None = None,
    asymptote_bounds: tuple[float, float] = (0.0, 1.0),
    exponent_bounds: tuple[float, float] = (0.05, 20.0),
    midpoint_span: float = 1e3,
    max_evals: int = 5000,
) -> SigmoidFit:
    """Fit ScaleRL's sigmoid (arXiv 2510.13786) to accuracy r at compute c by bounded least squares.

    [choice] R0 is fixed, as in ScaleRL: ``start`` if given, else r at the smallest c; points with c <= 0 (the
    starting evaluation) only set R0 and are not fitted. A, log C_mid and B are fitted (C_mid on a log scale, within
    ``midpoint_span`` times beyond the data either side) with A in ``asymptote_bounds`` and B in ``exponent_bounds``.

    Returns:
        the fit; one that fails (fewer than 3 points with c > 0, a non-finite value, no convergence within
        ``max_evals`` evaluations) has ``converged`` False and says why.
    """
    c = np.asarray(c, dtype=float)
    r = np.asarray(r, dtype=float)
    if c.shape != r.shape or c.ndim != 1 or c.size == 0:
        return _failed(f"need two equal-length non-empty vectors (got {c.shape} and {r.shape})", math.nan, c)
    if not (np.isfinite(c).all() and np.isfinite(r).all()):
        return _failed("compute and accuracy must be finite", math.nan, c)
    r0 = float(r[np.argmin(c)]) if start is None else float(start)
    keep = c > 0
    cc, rr = c[keep], r[keep]
    if cc.size < 3:
        return _failed(f"{cc.size} points with compute > 0; the fit has 3 parameters", r0, cc)
    log_lo = math.log(cc.min()) - math.log(midpoint_span)
    log_hi = math.log(cc.max()) + math.log(midpoint_span)

    def model(x: np.ndarray, a: float, log_mid: float, b: float) -> np.ndarray:
        return r0 + (a - r0) / (1.0 + np.exp(b * (log_mid - np.log(x))))

    lower = (asymptote_bounds[0], log_lo, exponent_bounds[0])
    upper = (asymptote_bounds[1], log_hi, exponent_bounds[1])
    guess = (
        float(np.clip(rr.max(), *asymptote_bounds)),
        float(np.log(np.median(cc))),
        float(np.clip(1.0, *exponent_bounds)),
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", OptimizeWarning
            )  # covariance not estimable: the parameters still are
            params, _ = curve_fit(model, cc, rr, p0=guess, bounds=(lower, upper), max_nfev=max_evals)
    except (RuntimeError, ValueError) as e:
        return _failed(f"the fit did not converge: {e}", r0, cc)
    a, log_mid, b = (float(p) for p in params)
    resid = rr - model(cc, a, log_mid, b)
    ss_res = float(resid @ resid)
    ss_tot = float(((rr - rr.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else -math.inf)
    tol = 1e-6
    on_bound = any(
        abs(p - lo) <= tol * max(1.0, abs(lo)) or abs(p - hi) <= tol * max(1.0, abs(hi))
        for p, lo, hi in zip(params, lower, upper)
    )
    return SigmoidFit(
        converged=True,
        message="converged",
        start=r0,
        asymptote=a,
        midpoint=math.exp(log_mid),
        exponent=b,
        r2=r2,
        rmse=math.sqrt(ss_res / cc.size),
        compute_range=(float(cc.min()), float(cc.max())),
        at_bound=on_bound,
    )
