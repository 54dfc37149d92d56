"""``tracerl bench update`` (workflows/experiments/update.py): one learner update of a chosen shape, chunked and not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracerl.workflows.experiments.config import BenchUpdateConfig
from tracerl.workflows.experiments.update import format_table, run_case, run_update_bench

SMALL = dict(vocab=512, hidden=32, layers=1, tokens=256, seq_len=128, updates=1)


def test_chunked_and_unchunked_updates_give_the_same_loss() -> None:
    cfg = BenchUpdateConfig(**SMALL)  # type: ignore[arg-type]
    chunked, full = run_case(cfg, 16), run_case(cfg, 0)
    assert chunked["status"] == full["status"] == "ok" and chunked["device"] == "cpu"
    assert chunked["loss"] == pytest.approx(full["loss"], rel=1e-6, abs=1e-7)
    assert chunked["micro_batches"] == 1 and chunked["peak_bytes"] >= chunked["rss_before_update_bytes"] > 0
    assert chunked["tokens_per_s"] == pytest.approx(256 / chunked["seconds"])


def test_each_case_runs_in_a_subprocess_and_lands_in_the_json(tmp_path: Path) -> None:
    cfg = BenchUpdateConfig(  # type: ignore[arg-type]
        **SMALL,
        micro_tokens=128,
        logit_chunks=[32],
        bench_out=str(tmp_path),
        json_path=str(tmp_path / "u.json"),
    )
    summary = run_update_bench(cfg)
    (case,) = summary["cases"]
    assert case["status"] == "ok" and case["logit_chunk"] == 32 and case["micro_batches"] == 2
    assert case["estimate_bytes"]["logits"] == 20 * 32 * 512
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(
        (tmp_path / "u.json").read_text()
    )
    table = format_table(summary)
    assert "micro_tokens 128" in table and table.splitlines()[-1].split()[0] == "32"


def test_a_shape_the_model_cannot_take_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="hidden must be a multiple of 32"):
        BenchUpdateConfig(hidden=48)
    with pytest.raises(ValueError, match=r"tokens \(1000\) must be a multiple of seq_len"):
        BenchUpdateConfig(tokens=1000)
    with pytest.raises(ValueError, match=r"startup_ranks must be 0 \(off\) or >= 2"):
        BenchUpdateConfig(startup_ranks=1)


def test_startup_ranks_measures_each_rank_of_both_set_ups(tmp_path: Path) -> None:
    cfg = BenchUpdateConfig(**SMALL, startup_ranks=2, bench_out=str(tmp_path))  # type: ignore[arg-type]
    summary = run_update_bench(cfg)
    rows = [(r["case"], r["rank"]) for r in summary["startup"]]
    assert rows == [("every_rank", 0), ("every_rank", 1), ("from_rank0", 0), ("from_rank0", 1)]
    assert summary["params"] > 0 and all(r["peak_growth_bytes"] >= 0 for r in summary["startup"])
    assert (tmp_path / "startup-checkpoint" / "tokenizer.json").exists()
    assert json.loads((tmp_path / "results.json").read_text())["startup"] == summary["startup"]
    assert (
        format_table(summary).splitlines()[0]
        == "start-up of 2 FSDP ranks, 0 M parameters (0.00 GB in float32)"
    )
