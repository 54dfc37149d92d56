"""The phase timer every step phase goes through (tracerl/engine/timer.py)."""

from __future__ import annotations

import pytest

from tracerl.engine.timer import PhaseTimer


def test_phases_sum_over_entries_and_name_their_metrics() -> None:
    into: dict[str, float] = {}
    timer = PhaseTimer(into)
    with timer("score"):
        pass
    first = into["score"]
    with timer("rollout"):
        pass
    with timer("score"):  # Stage 2 scores again: the phase sums
        pass
    assert into is timer.seconds and into["score"] >= first >= 0.0
    assert sorted(timer.metrics()) == ["time/rollout_s", "time/score_s"]
    assert timer.metrics()["time/score_s"] == into["score"]
    assert timer.elapsed() >= into["score"] + into["rollout"]


def test_a_phase_that_raises_is_still_timed() -> None:
    timer = PhaseTimer()
    with pytest.raises(RuntimeError, match="boom"), timer("sync_weights"):
        raise RuntimeError("boom")
    assert list(timer.seconds) == ["sync_weights"]
