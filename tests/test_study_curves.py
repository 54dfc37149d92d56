"""The learning-curve study (issue 29): conf/study/curves.yaml's arithmetic, the report's statistics on synthetic
cells with known answers (curve files in a tmp dir, no training run), the budget-off flag, and the grid on a real
MLflow store with a fake train that writes curve files (the report reads them back after the runs moved)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tracerl.config import TrackingConfig
from tracerl.config_loader import compose
from tracerl.workflows.experiments.curve_cells import check_curve_study, eval_points
from tracerl.workflows.experiments.curve_results import AllocatorStats, CurveVerdict, Fit, TestbedStats
from tracerl.workflows.experiments.curve_study import CURVES as CURVE_STUDY
from tracerl.workflows.experiments.curves_doc import CurvesReport, _iv, _ratio, _resolution, answer, markdown
from tracerl.workflows.experiments.curves_report import cell_record, per_testbed_stats
from tracerl.workflows.study.bootstrap import Interval
from tracerl.workflows.study.cells import enumerate_cells
from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.study.grid import cell_config, run_study
from tracerl.workflows.train.budget import Totals, append_point, curve_point, read_curve

CURVES = ROOT / "conf" / "study" / "curves.yaml"
MAIN = ROOT / "conf" / "study" / "main.yaml"

# -- the committed grid ----------------------------------------------------------------------------------------


def test_the_curves_grid_has_48_cells_each_with_8_points_on_twice_grpos_budget() -> None:
    cfg = compose(StudyConfig, CURVES)
    check_curve_study(cfg)
    cells = enumerate_cells(cfg)
    assert len(cells) == 48
    assert {c.budget for c in cells} == {"leaves"}
    per_tb = {tb: {c.allocator for c in cells if c.testbed == tb} for tb in cfg.testbeds}
    assert per_tb["math-habit"] == per_tb["search-habit"] == {"grpo", "pcl", "trace"}
    assert per_tb["math-late"] == per_tb["search-late"] == {"grpo", "pcl", "trace", "knapsack", "trace_mc_k2"}
    assert {c.seed for c in cells} == {0, 1, 2}
    main = compose(StudyConfig, MAIN)
    for tb, spec in cfg.testbeds.items():
        assert eval_points(spec) >= 8
        # 1.8 x grpo's 20 study steps of T tokens, rounded to 100 (the config says why not 2.0 x)
        assert abs(spec["stop_tokens"] - 36 * main.testbeds[tb]["token_budget"]) <= 100
        assert spec["stop_tokens"] < (cfg.steps or 0) * main.testbeds[tb]["token_budget"]  # steps only bounds


def test_a_curve_cell_gets_its_token_stop_schedule_and_subset() -> None:
    cfg = compose(StudyConfig, CURVES)
    cell = next(c for c in enumerate_cells(cfg) if c.testbed == "math-late" and c.allocator == "trace_mc_k2")
    tcfg = cell_config(cfg, cell, kind=CURVE_STUDY)
    assert tcfg.stop.tokens == 113200 and tcfg.eval_every_tokens == 14150 and tcfg.eval_subset == 50
    assert tcfg.eval_every == 0 and tcfg.eval_at_start is False and tcfg.steps == 150
    assert tcfg.allocator.name == "trace_mc" and tcfg.allocator.mc_samples == 2


def test_curve_study_settings_fail_in_one_line() -> None:
    cfg = compose(StudyConfig, CURVES)
    tbs = {**cfg.testbeds, "math-late": {**cfg.testbeds["math-late"], "eval_every_tokens": None}}
    with pytest.raises(
        ValueError, match=r"^x.yaml: testbeds.math-late.eval_every_tokens must be an integer >= 1"
    ):
        check_curve_study(dataclasses.replace(cfg, testbeds=tbs), "x.yaml")
    bad = [{**cfg.hypotheses[0], "expect": "better"}]
    with pytest.raises(ValueError, match=r"hypotheses\[0\].expect must be one of"):
        check_curve_study(dataclasses.replace(cfg, hypotheses=bad), "x.yaml")
    bad = [{**cfg.hypotheses[0], "allocator": "dapo"}]
    with pytest.raises(ValueError, match=r"hypotheses\[0\] names \['dapo'\]"):
        check_curve_study(dataclasses.replace(cfg, hypotheses=bad), "x.yaml")


# -- the report on synthetic cells -----------------------------------------------------------------------------

TASKS = [f"p{i}" for i in range(10)]
XS = (100.0, 200.0, 300.0, 400.0)
START = 0.2
CURVE = {  # accuracy at XS; every task scores the same, so every bootstrap replicate is the data
    "grpo": (0.325, 0.45, 0.575, 0.7),  # linear from 0.2 at 0 tokens: the target 0.65 at 360 tokens
    "pcl": (0.325, 0.45, 0.575, 0.7),  # grpo's curve: ratio 1
    "trace": (0.45, 0.7, 0.7, 0.7),  # twice as steep: the target at 180 tokens
    "trace_mc_k2": (0.7, 0.7, 0.7, 0.7),  # the target at 90 tokens
}
CPU_PER_TOKEN = {"grpo": 0.1, "pcl": 0.1, "trace": 0.2, "trace_mc_k2": 0.2}


def _write_cell(storage: Path, alloc: str, last_tokens: float = 400.0) -> Path:
    """A cell's curve.jsonl as train writes it: points on the subset, the last one on every task."""
    storage.mkdir(parents=True, exist_ok=True)
    for i, (x, acc) in enumerate(zip((*XS[:-1], last_tokens), CURVE[alloc]), 1):
        full = i == len(XS)
        outcomes = {t: acc for t in TASKS} | ({"q0": acc, "q1": acc} if full else {})
        totals = Totals(
            generated_tokens=x, leaves=48.0 * i, updates=i, cpu_s=CPU_PER_TOKEN[alloc] * x, wall_s=x
        )
        cost = {"generated_tokens": 10.0, "wall_s": 1.0, "cpu_s": 1.0}
        append_point(storage, curve_point(totals, outcomes, TASKS, full, cost))
    return storage


def _cells(tmp: Path, budget: float = 400.0, off: dict[str, float] | None = None) -> list[dict[str, Any]]:
    start = {t: START for t in TASKS}
    cells = []
    for alloc in CURVE:
        for seed in (0, 1, 2):
            last = (off or {}).get(f"{alloc}/s{seed}", 400.0)
            pts = read_curve(_write_cell(tmp / f"{alloc}-{seed}", alloc, last))
            cells.append(cell_record(("tb", "leaves", alloc, seed), f"r-{alloc}-{seed}", pts, budget, start))
    return cells


def test_report_statistics_have_the_known_answers(tmp_path: Path) -> None:
    cells = _cells(tmp_path)
    first = cells[0]["points"][0]
    assert first["generated_tokens"] == 0 and first["accuracy"] == pytest.approx(START)
    st = per_testbed_stats(cells, 400.0, samples=200).to_json()
    assert st["start"] == pytest.approx(START) and st["grpo_final"] == pytest.approx(0.7)
    assert st["target"] == pytest.approx(0.65)
    a = st["allocators"]
    assert a["grpo"]["tokens"]["tokens_to_target"]["estimate"] == pytest.approx(360.0)
    trace = a["trace"]
    assert trace["tokens"]["ratio"] == pytest.approx({"estimate": 0.5, "low": 0.5, "high": 0.5})
    assert trace["tokens"]["verdict"] == "win"
    assert trace["cpu_s"]["ratio"]["estimate"] == pytest.approx(1.0)  # twice the CPU per token
    assert trace["cpu_s"]["verdict"] == "tie"
    assert a["pcl"]["tokens"]["verdict"] == "tie"
    assert trace["tokens"]["auc"]["estimate"] == pytest.approx((0.45 * 200 + 0.7 * 200) / 400)
    assert a["grpo"]["tokens"]["auc"]["estimate"] == pytest.approx(0.45)
    assert trace["final_accuracy"] == pytest.approx(0.7) and trace["final_difference"]["estimate"] == 0.0
    assert st["ceiling"] == "trace_mc_k2"
    assert st["headroom"]["tokens"]["ratio"]["estimate"] == pytest.approx(0.5)
    assert not any(c["budget_flag"] for c in cells)


def test_the_answer_and_hypotheses_read_off_the_rule(tmp_path: Path) -> None:
    from tracerl.workflows.experiments.curves_report import hypothesis_verdicts

    cells = _cells(tmp_path)
    st = {"tb": per_testbed_stats(cells, 400.0, samples=200)}
    hyps = [
        {"claim": "trace wins", "allocator": "trace", "vs": "grpo", "testbeds": ["tb"], "expect": "win"},
        {"claim": "pcl wins", "allocator": "pcl", "vs": "grpo", "testbeds": ["tb"], "expect": "win"},
        {
            "claim": "mc beats trace",
            "allocator": "trace_mc_k2",
            "vs": "trace",
            "testbeds": ["tb"],
            "expect": "win",
        },
        {"claim": "elsewhere", "allocator": "trace", "vs": "grpo", "testbeds": ["other"], "expect": "win"},
    ]
    cfg = dataclasses.replace(compose(StudyConfig, CURVES), hypotheses=hyps)
    got = hypothesis_verdicts(cfg, st, cells, 200)
    assert [h.state for h in got] == ["held", "failed", "held", "not measured"]
    for i, c in enumerate(cells):  # a grid resumed across sessions: cells from two commits
        c["git_sha"] = "c1" if i == 0 else "c0"
    text = markdown(CurvesReport("abc", cells, st, got, decision_rule="r", target="t"), [])
    assert (
        f"Cells ran at commit `c0` ({len(cells) - 1}), `c1` (1); this report at `abc`; {len(cells)} cells."
        in text
    )
    # the numbers in tables, one sentence per verdict
    assert (
        "| trace | tb | 50 % (50 to 50 %) | 100 % (100 to 100 %) | more compute-efficient than grpo |" in text
    )
    assert "| pcl | tb | " in text and "| neither more nor less compute-efficient than grpo |" in text
    assert "- trace: more compute-efficient than grpo by the rule on tb." in text
    assert "- pcl: more compute-efficient than grpo by the rule nowhere, not on tb." in text
    assert (
        "- trace on tb: more compute-efficient than grpo by the rule (the tokens ratio's interval lies below 1)."
        in text
    )
    assert "| trace wins | win of trace against grpo | **held** | tb: win, 50 % (50 to 50 %) |" in text
    assert "| elsewhere | win of trace against grpo | **not measured** | - |" in text
    assert (
        "| trace_mc_k2 | 50 % (50 to 50 %) | 50 % |" in text
    )  # the headroom: half trace's tokens, half saved
    assert "every cell within 5 %" in text


def test_a_cell_more_than_5_percent_off_its_budget_is_flagged(tmp_path: Path) -> None:
    cells = _cells(tmp_path, off={"trace/s1": 381.0, "pcl/s2": 419.0})  # -4.75 % and +4.75 %
    flagged = {(c["allocator"], c["seed"]) for c in cells if c["budget_flag"]}
    assert flagged == set()
    cells = _cells(tmp_path / "b", off={"trace/s1": 370.0, "pcl/s2": 421.0})  # -7.5 %, +5.25 %
    flagged = {(c["allocator"], c["seed"]) for c in cells if c["budget_flag"]}
    assert flagged == {("trace", 1), ("pcl", 2)}
    stats = {"tb": per_testbed_stats(cells, 400.0, samples=100)}
    text = markdown(CurvesReport("x", cells, stats, []), [])
    assert "**2 cells are more than 5 % off its token budget**" in text
    assert "more than 5 % off: pcl/s2 (+5.2 %), trace/s1 (-7.5 %)" in text


def test_evaluations_past_a_wall_clock_limit_are_named(tmp_path: Path) -> None:
    cells = _cells(tmp_path)
    assert {c["eval_timeouts"] for c in cells} == {None}  # points from before the counts were recorded
    start = {t: START for t in TASKS}
    pts = read_curve(tmp_path / "trace-1")
    for p in pts:
        p["eval"] |= {"tool_timeouts": 0.0, "grade_timeouts": 0.0}
    clean = cell_record(("tb", "leaves", "pcl", 0), "r-clean", pts, 400.0, start)
    pts[2]["eval"] |= {"tool_timeouts": 2.0, "grade_timeouts": 1.0}
    timed = cell_record(("tb", "leaves", "trace", 1), "r-timed", pts, 400.0, start)
    assert (clean["eval_timeouts"], timed["eval_timeouts"]) == (0, 3)
    keep = [c for c in cells if (c["allocator"], c["seed"]) not in {("pcl", 0), ("trace", 1)}]
    cells = [*keep, clean, timed]
    text = markdown(CurvesReport("x", cells, {"tb": per_testbed_stats(cells, 400.0, samples=50)}, []), [])
    assert "- Evaluations that hit a wall-clock limit" in text and "): trace/s1 (3)." in text


def test_a_target_reached_before_the_first_point_is_called_out_and_never_reads_plainly() -> None:
    inf = math.inf

    def verdict(ratio: Interval, mine: float = 1.0, base: float = 1.0, v: str = "tie") -> CurveVerdict:
        t, b = Interval(mine, mine, mine), Interval(base, base, base)
        return CurveVerdict(ratio, ratio, t, b, ratio, 1.0, True, v)

    only = verdict(Interval(0.0, 0.0, 0.83), mine=102221.8, base=inf, v="win")
    assert _ratio(only) == "0 %: only it reaches the target (0 % (0 to 83 %))"  # the baseline never does
    never = Interval(inf, 0.16, inf)
    fit = Fit(*[math.nan] * 5, identified=False, poor=True, why_poor="")
    pcl = AllocatorStats(3, None, None, verdict(never, mine=inf), verdict(never, mine=inf), None, fit, 1.0)
    st = TestbedStats(400.0, {"pcl": pcl}, start=0.4, grpo_final=0.7, target=0.67)
    text = "\n".join(answer({"tb": st}, []))
    assert "| pcl | tb | never (16 to inf %) | never (16 to inf %) |" in text
    assert _iv(Interval(inf, 0.16, inf), pct=True) == "never (16 to inf %)"
    assert _iv(Interval(0.85, 0.0, 1.1), pct=True) == "85 % (0 to 110 %)"
    cells = [{"points": [{"generated_tokens": 0.0}, {"generated_tokens": x}]} for x in (17100.0, 17400.0)]
    stats = lambda t: dataclasses.replace(  # noqa: E731
        st, allocators={"grpo": dataclasses.replace(pcl, tokens=verdict(Interval(1.0, 1.0, 1.0), mine=t))}
    )
    (line,) = _resolution(stats(14250.0), cells)
    assert "grpo reaches the target at 14250 tokens, before the first evaluation point (17100 tokens)" in line
    assert _resolution(stats(20000.0), cells) == [] and _resolution(stats(inf), cells) == []


# -- the grid and the report on a real MLflow store ------------------------------------------------------------


class FakeCurveTrain:
    """Stands in for ``tracerl.workflows.train.run.train`` in a curve study: makes the child run and writes the curve file a
    real train would write into its storage, then returns the summary the grid reads (run id, storage)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.stops: list[int | None] = []

    def baseline(self, cfg: Any) -> dict[str, float]:
        return {t: START for t in TASKS} | {"q0": START, "q1": START}

    def __call__(self, cfg: Any, tags: dict[str, str]) -> dict[str, Any]:
        import mlflow

        self.stops.append(cfg.stop.tokens)
        client = mlflow.MlflowClient()
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        assert exp is not None
        rid = client.create_run(exp.experiment_id, tags=tags).info.run_id
        storage = _write_cell(self.tmp / "runs" / rid, tags["tracerl.study.allocator"])
        (storage / "config.yaml").write_text("steps: 4\n")
        client.set_tag(rid, "tracerl.storage", str(storage))
        client.log_param(rid, "stop.tokens", 400)
        client.set_terminated(rid, "FINISHED")
        return {"run_id": rid, "storage": str(storage), "acc_after": 0.7, "wall_s": 1.0}


def _study(tmp: Path, **kw: Any) -> StudyConfig:
    text = re.sub(r"stop_tokens: \d+", "stop_tokens: 400", CURVES.read_text())
    text = re.sub(r"eval_every_tokens: \d+", "eval_every_tokens: 100", text)
    path = tmp / "curves.yaml"
    path.write_text(text)
    cfg = compose(
        StudyConfig,
        path,
        [
            f"out_dir={tmp}/report",
            "only=testbed=math-late,allocator=grpo,allocator=trace,seed=0",
            "archive_dir=null",  # the committed config's archive is the checkout's: never written by a test
        ],
    )
    return dataclasses.replace(
        cfg, tracking=TrackingConfig(uri=f"sqlite:///{tmp}/mlruns.db", artifact_location=f"{tmp}/art"), **kw
    )


def test_grid_keeps_curves_in_mlflow_and_the_report_survives_moved_runs(tmp_path: Path) -> None:
    import mlflow

    fake = FakeCurveTrain(tmp_path)
    s = run_study(
        _study(tmp_path), tmp_path / "curves.yaml", train_fn=fake, baseline_fn=fake.baseline, kind=CURVE_STUDY
    )
    assert s["failed"] == {} and len(s["ran"]) == 2 and fake.stops == [400, 400]
    assert s["report_path"] == f"{tmp_path}/report/curves.md"
    doc = json.loads((tmp_path / "report" / "curves.json").read_text())
    assert [c["source"] for c in doc["cells"]] == ["mlflow", "mlflow"]
    first = doc["testbeds"]["math-late"]["allocators"]["trace"]["tokens"]["ratio"]
    assert first["estimate"] == pytest.approx(0.5)
    shutil.rmtree(tmp_path / "runs")  # the runs' storage moved away: the report reads the MLflow artifacts
    again = run_study(
        _study(tmp_path, report_only=True), tmp_path / "curves.yaml", train_fn=fake, kind=CURVE_STUDY
    )
    assert again["ran"] == [] and len(fake.stops) == 2
    assert (
        again["report"]["testbeds"]["math-late"]["allocators"]["trace"]["tokens"]["ratio"]["estimate"]
        == first["estimate"]
    )
    out = tmp_path / "report"
    assert {p.name for p in out.iterdir()} >= {
        "curves.md",
        "curves.json",
        "curves_accuracy_vs_generated_tokens.png",
        "curves_accuracy_vs_cpu_s.png",
    }
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlruns.db")
    logged = {f.path for f in client.list_artifacts(s["parent_run_id"], "report")}
    assert "report/curves_accuracy_vs_generated_tokens.png" in logged and "report/curves.md" in logged
    assert "| trace | math-late | 50 % (" in (out / "curves.md").read_text()


def test_a_study_resumes_in_a_fresh_store_from_its_archive(tmp_path: Path) -> None:
    """The grid archives each finished cell and baseline; a fresh MLflow store (a new checkout, the next session)
    with the same archive_dir skips every cell and rebuilds the same report from the restored runs."""
    import mlflow

    fake = FakeCurveTrain(tmp_path)
    arch = tmp_path / "archive"
    first = run_study(
        _study(tmp_path, archive_dir=str(arch)),
        tmp_path / "curves.yaml",
        train_fn=fake,
        baseline_fn=fake.baseline,
        kind=CURVE_STUDY,
    )
    assert len(first["ran"]) == 2 and len(list(arch.glob("*.json.gz"))) == 3  # two cells and the baseline
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.rmtree(tmp_path / "runs")
    cfg = _study(tmp_path, archive_dir=str(arch))
    cfg = dataclasses.replace(
        cfg, tracking=TrackingConfig(uri=f"sqlite:///{fresh}/mlruns.db", artifact_location=f"{fresh}/art")
    )
    lines: list[str] = []
    again = run_study(
        cfg,
        tmp_path / "curves.yaml",
        lines.append,
        train_fn=fake,
        baseline_fn=fake.baseline,
        kind=CURVE_STUDY,
    )
    assert again["ran"] == [] and len(again["skipped"]) == 2 and len(fake.stops) == 2
    assert any(ln.startswith(f"restored 3 finished run(s) from {arch}") for ln in lines)
    trace = lambda s: s["report"]["testbeds"]["math-late"]["allocators"]["trace"]["tokens"]["ratio"]  # noqa: E731
    assert trace(again)["estimate"] == trace(first)["estimate"] == pytest.approx(0.5)
    assert len(list(arch.glob("*.json.gz"))) == 3  # restored runs are not archived a second time
    client = mlflow.MlflowClient(f"sqlite:///{fresh}/mlruns.db")
    kids = client.search_runs(
        [client.get_experiment_by_name(cfg.tracking.experiment).experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{again['parent_run_id']}'",
    )
    assert len(kids) == 3 and all(k.info.status == "FINISHED" for k in kids)
    assert {k.data.params.get("stop.tokens") for k in kids if "tracerl.study.testbed" in k.data.tags} == {
        "400"
    }
