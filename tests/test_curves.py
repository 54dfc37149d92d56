import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracerl.workflows.experiments.curves import (
    EvalCurves,
    bootstrap_curve,
    compare_curves,
    first_crossing,
    interp_matrix,
    normalised_auc,
    target_accuracy,
    tokens_to_target,
)
from tracerl.workflows.experiments.sigmoid import fit_sigmoid, sigmoid

# -- tokens to target ---------------------------------------------------------------------------------------


def test_linear_curve_crosses_where_the_line_says() -> None:
    x = np.array([0.0, 10.0, 20.0, 30.0])
    y = 0.1 + 0.02 * x  # 0.1, 0.3, 0.5, 0.7
    assert tokens_to_target(x, y, 0.4) == pytest.approx(15.0)
    assert tokens_to_target(x, y, 0.62) == pytest.approx(26.0)
    assert tokens_to_target(x, y, 0.7) == 30.0  # reached exactly at the last point
    assert tokens_to_target(x, y, 0.05) == 0.0  # already there at the first point
    assert tokens_to_target(x, y, 0.71) == math.inf


def test_first_crossing_counts_even_if_the_curve_falls_back() -> None:
    x = np.array([0.0, 100.0, 200.0, 300.0])
    y = np.array([0.2, 0.6, 0.3, 0.8])
    assert tokens_to_target(x, y, 0.5) == pytest.approx(75.0)
    assert tokens_to_target(x, y, 0.7) == pytest.approx(280.0)  # 0.3 -> 0.8 over 200..300


def test_vectorised_crossing_matches_the_scalar_one() -> None:
    rng = np.random.default_rng(0)
    x = np.cumsum(rng.random(7)) * 1e4
    ys = rng.random((50, 7))
    targets = rng.random(50)
    got = first_crossing(x, ys, targets)
    np.testing.assert_array_equal(got, [tokens_to_target(x, y, t) for y, t in zip(ys, targets)])


def test_points_must_increase() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        tokens_to_target(np.array([0.0, 2.0, 2.0]), np.array([0.1, 0.2, 0.3]), 0.2)


# -- normalised area -----------------------------------------------------------------------------------------


def test_auc_of_a_constant_is_the_constant() -> None:
    x = np.array([0.0, 5.0, 17.0])
    assert normalised_auc(x, np.full(3, 0.3), 17.0) == pytest.approx(0.3)
    assert normalised_auc(x, np.full(3, 0.3), 100.0) == pytest.approx(0.3)  # held at its last value
    assert normalised_auc(x + 4.0, np.full(3, 0.3), 100.0) == pytest.approx(0.3)  # held at its first from 0


def test_auc_of_a_ramp() -> None:
    x, y = np.array([0.0, 100.0]), np.array([0.0, 1.0])
    assert normalised_auc(x, y, 100.0) == pytest.approx(0.5)
    assert normalised_auc(x, y, 50.0) == pytest.approx(0.25)  # cut inside: area 0.5 x 50 x 0.5 over 50
    assert normalised_auc(x, y, 200.0) == pytest.approx((50.0 + 100.0) / 200.0)  # then held at 1
    # A ramp starting at x = 20 from 0.2 to 0.6 at x = 60, budget 100: 20 x 0.2 + 40 x 0.4 + 40 x 0.6 = 44.
    assert normalised_auc(np.array([20.0, 60.0]), np.array([0.2, 0.6]), 100.0) == pytest.approx(0.44)
    with pytest.raises(ValueError, match="budget must be > 0"):
        normalised_auc(x, y, 0.0)


def test_target_accuracy() -> None:
    assert target_accuracy(0.2, 0.6) == pytest.approx(0.56)
    assert target_accuracy(0.2, 0.6, frac=0.5) == pytest.approx(0.4)


def test_interp_matrix_is_np_interp() -> None:
    x = np.array([1.0, 3.0, 4.0, 10.0])
    at = np.array([-1.0, 1.0, 2.0, 3.5, 9.0, 12.0])
    y = np.array([0.3, 0.1, 0.9, 0.4])
    np.testing.assert_allclose(interp_matrix(at, x) @ y, np.interp(at, x, y))


# -- hierarchical bootstrap -----------------------------------------------------------------------------------

S, P, T = 4, 8, 300
X = np.tile(np.linspace(0.0, 7e5, P), (S, 1))
TRUE = 0.2 + 0.5 * X[0] / X[0, -1]  # accuracy rises linearly from 0.2 to 0.7


def bernoulli(seed: int) -> EvalCurves:
    rng = np.random.default_rng(seed)
    return EvalCurves(X, (rng.random((S, P, T)) < TRUE[None, :, None]).astype(float))


def test_mean_curve_on_the_union_of_the_seeds_points() -> None:
    # Seed 0 evaluated at 0, 10 (accuracy 0, 1/2); seed 1 at 0, 20 (accuracy 1/2, 1): grid 0, 10, 20.
    x = np.array([[0.0, 10.0], [0.0, 20.0]])
    correct = np.array([[[0, 0], [1, 0]], [[1, 0], [1, 1]]], dtype=float)
    curves = EvalCurves(x, correct)
    np.testing.assert_array_equal(curves.grid(), [0.0, 10.0, 20.0])
    # seed 0 held at 1/2 after 10; seed 1 is 3/4 at 10.
    np.testing.assert_allclose(curves.mean_curve(), [0.25, (0.5 + 0.75) / 2, 0.75])


def test_band_contains_the_true_mean_and_is_seeded() -> None:
    stats = bootstrap_curve(bernoulli(0), target=0.5, samples=2000, rng=np.random.default_rng(1))
    assert (stats.low <= TRUE).all() and (stats.high >= TRUE).all()
    assert (stats.low <= stats.mean).all() and (stats.mean <= stats.high).all()
    assert stats.tokens_to_target.contains(4.2e5)  # the true curve reaches 0.5 at 0.6 of 7e5
    assert stats.auc.contains(0.45)  # the true ramp's mean over [0, 7e5]
    again = bootstrap_curve(bernoulli(0), target=0.5, samples=2000, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(stats.low, again.low)
    np.testing.assert_array_equal(stats.high, again.high)
    assert stats.tokens_to_target == again.tokens_to_target and stats.auc == again.auc
    other = bootstrap_curve(bernoulli(0), target=0.5, samples=2000, rng=np.random.default_rng(2))
    assert not np.array_equal(stats.low, other.low)


def test_band_covers_the_true_mean_at_least_nominally() -> None:
    """Over 100 data sets, each point's 95 % band holds the true accuracy at least 90 % of the time (resampling
    seeds then tasks counts the Bernoulli noise twice here, so it is conservative)."""
    hits = np.zeros(P)
    for k in range(100):
        stats = bootstrap_curve(bernoulli(100 + k), target=0.5, samples=400, rng=np.random.default_rng(k))
        hits += (stats.low <= TRUE) & (stats.high >= TRUE)
    assert (hits / 100 >= 0.9).all()


def test_an_allocator_twice_as_fast_has_ratio_one_half() -> None:
    base = bernoulli(3)
    fast = EvalCurves(base.x / 2, base.correct)  # the same accuracies at half the tokens
    paired = compare_curves(fast, base, samples=1000, rng=np.random.default_rng(0))
    assert paired.target == pytest.approx(target_accuracy(base.mean_curve()[0], base.mean_curve()[-1]))
    assert paired.ratio.estimate == 0.5
    assert (paired.ratio.low, paired.ratio.high) == (0.5, 0.5)  # every paired replicate is exactly 2x faster
    assert paired.budget == 3.5e5 and paired.auc_difference.low > 0
    free = compare_curves(fast, base, samples=1000, rng=np.random.default_rng(0), paired=False)
    assert free.ratio.estimate == 0.5 and free.ratio.contains(0.5)
    assert abs((free.ratio.low + free.ratio.high) / 2 - 0.5) < 0.05
    assert free.ratio.high - free.ratio.low > 0.05


def test_ratio_when_only_one_reaches_the_target() -> None:
    base = bernoulli(4)
    flat = EvalCurves(base.x, np.zeros_like(base.correct))  # never correct
    cmp = compare_curves(base, flat, target=0.4, samples=200)
    assert cmp.ratio.estimate == 0.0 and cmp.baseline.reached == 0.0
    cmp = compare_curves(flat, base, target=0.4, samples=200)
    assert cmp.ratio.estimate == math.inf and cmp.allocator.tokens_to_target.estimate == math.inf


def test_paired_needs_matching_shapes_and_curves_validate() -> None:
    base = bernoulli(5)
    fewer = EvalCurves(base.x[:2], base.correct[:2])
    with pytest.raises(ValueError, match="paired comparison needs equal seeds and tasks"):
        compare_curves(fewer, base, samples=10)
    assert compare_curves(fewer, base, samples=10, paired=False).paired is False
    with pytest.raises(ValueError, match=r"need x of shape \(seeds, points\)"):
        EvalCurves(base.x, base.correct[:, :3])
    with pytest.raises(ValueError, match="correctness must lie in"):
        EvalCurves(base.x, base.correct * 2)


# -- saturating fit ------------------------------------------------------------------------------------------

C = np.geomspace(1e3, 1e7, 25)


def test_sigmoid_fit_recovers_known_parameters() -> None:
    r = sigmoid(C, 0.1, 0.8, 1e5, 1.5)
    fit = fit_sigmoid(np.r_[0.0, C], np.r_[0.1, r])  # the c = 0 evaluation sets R0
    assert fit.converged and fit.identified and fit.message == "converged"
    assert fit.start == 0.1
    assert fit.asymptote == pytest.approx(0.8, rel=1e-6)
    assert fit.midpoint == pytest.approx(1e5, rel=1e-6)
    assert fit.exponent == pytest.approx(1.5, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9) and fit.rmse < 1e-6
    np.testing.assert_allclose(fit.predict(C), r, atol=1e-6)


def test_a_straight_line_has_no_identified_asymptote() -> None:
    line = 0.1 + 0.6 * C / C.max()
    fit = fit_sigmoid(C, line, start=0.1)
    assert fit.converged and fit.at_bound and not fit.identified  # A ends on its bound 1: it keeps rising


def test_noise_fits_poorly() -> None:
    noise = 0.4 + 0.05 * np.random.default_rng(0).standard_normal(C.size)
    fit = fit_sigmoid(C, noise, start=0.4)
    assert fit.converged and fit.r2 < 0.2 and not fit.identified
    assert fit.rmse == pytest.approx(0.05, rel=0.3)


def test_a_failed_fit_says_so() -> None:
    r = sigmoid(C, 0.1, 0.8, 1e5, 1.5)
    few = fit_sigmoid(C[:2], r[:2])
    assert not few.converged and "2 points with compute > 0" in few.message and math.isnan(few.asymptote)
    stuck = fit_sigmoid(C, r, max_evals=1)
    assert not stuck.converged and stuck.message.startswith("the fit did not converge")
    assert not stuck.identified
    bad = fit_sigmoid(C, np.r_[r[:-1], np.nan])
    assert not bad.converged and "finite" in bad.message


def test_compare_draws_learning_curves_only_for_runs_that_have_them(tmp_path: Path) -> None:
    from tracerl.workflows.tracking.compare import plots

    def row(name: str, curve: dict[int, float]) -> dict[str, Any]:
        series = {
            "effective_ratio": {1: 0.5},
            "accuracy": {1: 0.2},
            "cum_leaves": {1: 10.0},
            "cum_tokens": {1: 99.0},
        }
        cpu = {t: t / 100 for t in curve}
        return {
            "name": name,
            "continuations": float("nan"),
            "m_max": float("nan"),
            "acc_after": 0.2,
            "effective_ratio": 0.5,
            "series": {**series, "curve": curve, "curve_cpu_s": cpu},
        }

    names = {p.name for p in plots([row("a", {}), row("b", {})], tmp_path)}
    assert "learning_curve.png" not in names
    names = {p.name for p in plots([row("a", {}), row("b", {500: 0.3, 1000: 0.4})], tmp_path)}
    assert "learning_curve.png" in names and (tmp_path / "learning_curve.png").stat().st_size > 0
