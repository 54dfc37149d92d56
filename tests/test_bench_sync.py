"""``tracerl bench sync`` (workflows/experiments/sync.py): weight pushes to real hf sampler actors on the embedded Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.workflows.experiments.config import BenchSyncConfig
from tracerl.workflows.experiments.sync import format_table, run_sync_bench


def test_every_push_lands_in_every_sampler_and_the_json_holds_the_table(tmp_path: Path) -> None:
    cfg = BenchSyncConfig(
        vocab=512,
        hidden=64,
        layers=2,
        pushes=2,
        bucket_mb=1,
        bench_out=str(tmp_path),
        json_path=str(tmp_path / "s.json"),
    )
    summary = run_sync_bench(cfg)
    # 512 x 64 twice (embedding, head), per layer q, k, v, o (64 x 64), MLP 3 x 64 x 256, norms 4 x 64 + 2 x 64
    per_layer = 4 * 64 * 64 + 3 * 64 * 256 + 2 * 64 + 2 * 64
    assert summary["params"] == 2 * 512 * 64 + 2 * per_layer + 64
    assert summary["model_bytes"] == 2 * summary["params"]  # bfloat16
    assert summary["landed"] is True  # the sampler holds the sender's last version, cast to bfloat16
    assert [r["push"] for r in summary["pushes"]] == [0, 1] and len(summary["pushes"][0]["receivers"]) == 2
    assert all(r["sender"]["peak"] >= r["sender"]["base"] > 0 for r in summary["pushes"])
    assert summary["seconds_mean"] == summary["pushes"][1]["seconds"]
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(
        (tmp_path / "s.json").read_text()
    )
    assert not (tmp_path / "model").exists()  # the samplers' checkpoint is removed
    table = format_table(summary)
    assert "to 2 hf sampler actors" in table and "weights landed: True" in table


def test_a_shape_the_model_cannot_take_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="hidden must be a multiple of 64"):
        BenchSyncConfig(hidden=96)
    with pytest.raises(ValueError, match="must be >= 1"):
        BenchSyncConfig(samplers=0)
