"""`tracerl bench targets` on a small sample (the full measurement is not part of the suite)."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracerl.workflows.cli.app import main
from tracerl.workflows.experiments.targets import bias_by_bin, target_records


def test_bias_by_bin_golden() -> None:
    # (true V, V^, n, D, W): two roots in bin 0.1-0.2, one in 0.9-1.0.
    recs = np.array([[0.10, 0.30, 3, 0.10, 1], [0.15, 0.00, 1, 0.25, 3], [0.95, 1.0, 2, 1.0, 2]])
    rows = bias_by_bin(recs, min_count=2)
    b = rows[1]
    assert (b["count"], b["judged"]) == (2, True) and rows[9]["judged"] is False and rows[0]["count"] == 0
    # recursive: (3 * 0.2 + 1 * -0.15) / 4; debiased: (1 * 0 + 3 * 0.1) / 4
    assert b["recursive"]["bias"] == pytest.approx(0.1125) and b["debiased"]["bias"] == pytest.approx(0.075)
    se = np.sqrt(9 * (0.2 - 0.1125) ** 2 + (-0.15 - 0.1125) ** 2) / 4
    assert b["recursive"]["se"] == pytest.approx(se)
    assert rows[0]["recursive"]["bias"] is None


def test_records_need_true_values() -> None:
    from tests.test_tree import nested_tree

    with pytest.raises(ValueError, match="only the simulator provides"):
        target_records([nested_tree()])


def run_sim_bench(
    bench: str, steps: int, seeds: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], *overrides: str
) -> tuple[str, dict[str, Any]]:
    """``tracerl bench BENCH`` (targets or baseline) on 600 simulated prompts: what it printed, and its JSON summary
    (the same at ``--json`` and in ``--out``)."""
    argv = ["bench", bench, "--steps", str(steps), "--seeds", str(seeds), "--out", str(tmp_path / "out")]
    argv += ["--json", str(tmp_path / "s.json"), *overrides, "env.simulator.num_prompts=600"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary == json.loads((tmp_path / "out" / "results.json").read_text())
    return capsys.readouterr().out, summary


def test_bench_targets_command_on_a_small_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    printed, summary = run_sim_bench("targets", 8, 1, tmp_path, capsys)
    assert "oracle_trace, roots:" in printed and "oracle_trace, prefixes:" in printed
    for level in ("roots", "prefixes"):
        s = summary["allocators"]["oracle_trace"][level]
        assert len(s["bins"]) == 10 and s["judged_bins"] == 0  # 8 steps hold far fewer than 400 nodes a bin
        counts = sum(b["count"] for b in s["bins"])
        assert counts > 0
        assert s["recursive"]["within_tolerance"] is False  # nothing judged: no verdict
    # 8 steps minus the cold start: every step's active prompts are roots
    assert sum(b["count"] for b in summary["allocators"]["oracle_trace"]["roots"]["bins"]) >= 7 * 2
