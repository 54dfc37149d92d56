"""End to end: `tracerl bench allocation` on a tiny budget, with a real MLflow SQLite store and a real local Ray."""

import json
from pathlib import Path

import pytest

from tracerl.config_loader import compose, conf_dir
from tracerl.workflows.bench.config import BenchAllocationConfig
from tracerl.workflows.cli.app import main

ALLOCS = "[grpo,pcl,dapo,treepo,trace_root_only,trace_prefix_only,trace,oracle_trace]"


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "allocation",
        "--steps",
        "5",
        "--seeds",
        "2",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--json",
        str(tmp_path / "summary.json"),
        f"allocators={ALLOCS}",
        "noise_scales=[1.0,4.0]",
        "noise_allocators=[grpo,trace]",
        "noise_seeds=1",
        "env.simulator.num_prompts=600",
        f"tracking.uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracking.artifact_location={tmp_path}/artifacts",
        "tracking.experiment=bench-test",
        *extra,
    ]


def test_bench_writes_table_json_pngs_and_mlflow_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(tiny(tmp_path)) == 0
    printed = capsys.readouterr().out
    assert (
        "budget: L=288 leaves/step | flat: G=8 on L/G=36 prompts | tree: M=96 bare, N=2, m_min=2, m_max=16"
        in printed
    )
    assert "mlflow ui --backend-store-uri sqlite:///" in printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    allocs = summary["allocators"]
    assert list(allocs) == ALLOCS.strip("[]").split(",")
    for name, s in allocs.items():
        for key, typ in [
            ("effective_ratio", float),
            ("effective_ratio_ci95", float),
            ("leaf_effective_ratio", float),
            ("mixed_groups_per_step", float),
            ("contrast_pairs_per_100_leaves", float),
            ("leaves", int),
        ]:
            assert isinstance(s[key], typ), (name, key)
        assert 0 <= s["effective_ratio"] <= 1
        if name == "dapo":
            assert s["sampled_leaves"] >= s["leaves"]  # it spends more than it keeps
        else:
            assert s["leaves"] == s["sampled_leaves"] == 288
    assert allocs["dapo"]["effective_ratio"] == 1.0  # every kept group is mixed ...
    assert allocs["dapo"]["effective_ratio_sampled"] < 1.0  # ... out of more sampled ones
    assert allocs["oracle_trace"]["effective_ratio"] > allocs["grpo"]["effective_ratio"]
    assert set(summary["predictor"]) >= {"roots", "prefixes", "depth_1"}
    assert {"mse", "brier", "auc", "ece"} <= set(summary["predictor"]["roots"])
    noise = summary["noise_sweep"]
    assert noise["scales"] == [1.0, 4.0] and noise["prompt_r2"][0] > noise["prompt_r2"][1]
    out = tmp_path / "out"
    for f in [
        "results.json",
        "table.txt",
        "config.yaml",
        "effective_ratio_per_step.png",
        "effective_ratio_vs_noise.png",
    ]:
        assert (out / f).stat().st_size > 0, f

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns.db")
    runs = mlflow.search_runs(experiment_names=["bench-test"], output_format="list")
    assert sorted(r.data.tags["allocator"] for r in runs) == sorted(allocs)
    trace_run = next(r for r in runs if r.data.tags["allocator"] == "trace")
    assert trace_run.data.metrics["bench/effective_ratio"] == pytest.approx(
        allocs["trace"]["effective_ratio"]
    )
    history = mlflow.MlflowClient().get_metric_history(trace_run.info.run_id, "rollout/effective_ratio")
    assert sorted(m.step for m in history) == list(range(5))
    assert (
        trace_run.data.params["allocator.name"] == "trace"
        and trace_run.data.params["budget.continuations"] == "2"
    )
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(trace_run.info.run_id)}
    assert {"results.json", "effective_ratio_per_step.png"} <= artifacts


def test_parallel_ray_runs_match_serial_runs(tmp_path: Path) -> None:
    """Seeds flow through everything: the same jobs as Ray tasks give the same numbers."""
    from tracerl.workflows.bench.allocation import _execute

    cfg = compose(
        BenchAllocationConfig,
        conf_dir() / "bench/allocation.yaml",
        ["steps=4", "env.simulator.num_prompts=400", "cluster.num_cpus=2", "workers=2"],
    )
    jobs = [("trace", 0, 1.0), ("treepo", 1, 1.0), ("trace", 0, 2.0)]
    import dataclasses

    serial = _execute(dataclasses.replace(cfg, workers=1), jobs, lambda s: None)
    parallel = _execute(cfg, jobs, lambda s: None)
    import ray

    ray.shutdown()
    for a, b in zip(serial, parallel):
        assert (a.allocator, a.seed, a.noise) == (b.allocator, b.seed, b.noise)
        strip = [{k: v for k, v in m.items() if not k.startswith("time/")} for m in a.steps]
        assert strip == [{k: v for k, v in m.items() if not k.startswith("time/")} for m in b.steps]
        assert a.calibration == b.calibration


def test_bad_override_exits_2_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "allocation", "--out", str(tmp_path / "o"), "budget.nope=1"]) == 2
    assert "unknown config key 'budget.nope'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
