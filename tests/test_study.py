"""`tracerl study`: the grid, --only, skip/resume against a real MLflow store (a fake train records the calls),
the hierarchical bootstrap, the JSON schema, and (e2e) a 2-cell, 2-step study of the embedded default."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tracerl.config import TrackingConfig
from tracerl.config_loader import compose
from tracerl.workflows.study.bootstrap import Interval, paired_difference
from tracerl.workflows.study.cell_runs import StudyCell
from tracerl.workflows.study.cells import Cell, Child, enumerate_cells, plan, select
from tracerl.workflows.study.config import StudyConfig
from tracerl.workflows.study.grid import run_study
from tracerl.workflows.study.report import PairedComparison, verdict
from tracerl.workflows.study.token_budget import write_token_budget

pytestmark = pytest.mark.e2e  # a long end-to-end run: `make test-e2e` (CI runs it after `make test`)

MAIN = ROOT / "conf" / "study" / "main.yaml"
SMOKE = ROOT / "conf" / "study" / "smoke.yaml"


def test_the_committed_grid_has_88_cells() -> None:
    cells = enumerate_cells(compose(StudyConfig, MAIN))
    assert len(cells) == 88
    late = [c for c in cells if c.testbed == "math-late"]
    assert len(late) == 32 and sum(c.allocator == "grpo" for c in late) == 10
    assert {c.allocator for c in late if c.budget == "tokens"} == {
        "grpo",
        "trace",
        "trace_debiased",
        "trace_plus",
    }
    assert {c.allocator for c in cells if c.testbed == "search-habit"} == {"grpo", "trace"}


def test_only_selects_cells_and_names_bad_keys() -> None:
    cells = enumerate_cells(compose(StudyConfig, MAIN))
    picked = select(cells, "testbed=math-late,allocator=grpo,allocator=trace,budget=leaves")
    assert [c.key for c in picked][:2] == ["math-late/leaves/grpo/s0", "math-late/leaves/grpo/s1"]
    assert len(picked) == 10
    assert len(select(cells, "seed=4")) == 8  # the -late grpo and trace cells
    with pytest.raises(ValueError, match="k one of testbed, budget, allocator, seed"):
        select(cells, "model=x")
    with pytest.raises(ValueError, match="selects no cell"):
        select(cells, "testbed=math-habit,allocator=pcl")


def test_plan_skips_finished_resumes_cut_and_fresh_reruns() -> None:
    a, b, c = Cell("t", "leaves", "grpo", 0), Cell("t", "leaves", "trace", 0), Cell("t", "tokens", "grpo", 0)
    children = {
        a.key: [Child("r1", "FAILED", True, 1), Child("r2", "FINISHED", False, 2)],
        b.key: [
            Child("old", "KILLED", True, 1),
            Child("new", "FAILED", True, 5),
            Child("x", "KILLED", False, 9),
        ],
    }
    todo, skipped = plan([a, b, c], children, fresh=False)
    assert skipped == [a] and todo == [(b, "new"), (c, None)]
    todo, skipped = plan([a, b], children, fresh=True)
    assert skipped == [] and todo == [(a, None), (b, None)]


def test_write_token_budget_keeps_the_file(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(MAIN.read_text())
    write_token_budget(p, "math-late", 1234)
    cfg = compose(StudyConfig, p)
    before = compose(StudyConfig, MAIN).testbeds
    assert cfg.testbeds["math-late"]["token_budget"] == 1234 != before["math-late"]["token_budget"]
    assert all(cfg.testbeds[t] == before[t] for t in before if t != "math-late")
    assert p.read_text().count("#") == MAIN.read_text().count("#")


def test_bootstrap_golden_cases() -> None:
    # Constant per-task differences: no spread, the interval is the point.
    assert paired_difference(
        {0: np.ones(5), 1: np.ones(5)}, {0: np.zeros(5), 1: np.zeros(5)}, 500
    ) == Interval(1.0, 1.0, 1.0)
    # Seed 0 differs on 2 of 4 tasks, seed 1 on 1 of 4: observed 0.375; the interval (frozen, seed 0, 2000 draws).
    a = {0: np.array([1, 1, 0, 0]), 1: np.array([1, 0, 0, 0]), 2: np.array([0, 0, 0, 1])}
    b = {0: np.zeros(4), 1: np.zeros(4), 7: np.ones(4)}  # seeds 2 and 7 are not paired: left out
    d = paired_difference(a, b, 2000, seed=0)
    assert d.estimate == pytest.approx(0.375)
    assert (d.low, d.high) == pytest.approx((0.0, 0.75))
    with pytest.raises(ValueError, match="no seed common"):
        paired_difference({0: np.ones(2)}, {1: np.ones(2)})


@settings(deadline=None, max_examples=40)
@given(
    st.lists(st.lists(st.integers(-1, 1), min_size=1, max_size=12), min_size=1, max_size=5).filter(
        lambda seeds: len({len(s) for s in seeds}) == 1
    )
)
def test_bootstrap_interval_contains_the_observed_difference(seeds: list[list[int]]) -> None:
    a = {i: np.clip(np.array(d, float), 0, 1) for i, d in enumerate(seeds)}
    b = {i: np.clip(-np.array(d, float), 0, 1) for i, d in enumerate(seeds)}
    d = paired_difference(a, b, 300, seed=1)
    assert d.estimate == pytest.approx(np.mean([np.mean(a[i] - b[i]) for i in a]))
    assert d.low - 1e-9 <= d.estimate <= d.high + 1e-9


def test_verdict_applies_the_decision_rule() -> None:
    c = PairedComparison("math-late", "tokens", "trace", "grpo", Interval(0.05, 0.01, 0.09))
    assert verdict(c).startswith("trace beats grpo on math-late at equal tokens: +5.0 points")
    assert "does not beat grpo" in verdict(dataclasses.replace(c, diff=Interval(0.05, -0.01, 0.09)))
    assert verdict(dataclasses.replace(c, diff=Interval(-0.05, -0.09, -0.01))).startswith("grpo beats trace")


def test_the_report_header_names_every_commit_its_cells_ran_at() -> None:
    from tracerl.workflows.study.report import markdown

    head = markdown("bbb", [], [], [], cell_shas={"aaa": 20, "bbb": 68}).splitlines()[2]
    assert head.startswith(
        "Commit `bbb` (the parent run's); the cells ran at `bbb` (68 cells), `aaa` (20 cells);"
    )
    assert (
        markdown("bbb", [], [], [], cell_shas={"bbb": 88})
        .splitlines()[2]
        .startswith("Commit `bbb`; 0 cells.")
    )


def test_answer_checks_the_hypothesis_case_by_case() -> None:
    from tracerl.workflows.study.report import answer

    def comp(tb: str, budget: str, alloc: str, lo: float, hi: float, vs: str = "grpo") -> PairedComparison:
        return PairedComparison(tb, budget, alloc, vs, Interval((lo + hi) / 2, lo, hi))

    comps = [
        comp("math-late", "tokens", "trace", 0.01, 0.09),
        comp("math-late", "leaves", "trace", -0.02, 0.04),
        comp("math-habit", "leaves", "trace", -0.09, -0.01),
    ]
    text = "\n".join(answer(comps, [comp("math-late", "tokens", "trace_plus", 0.02, 0.06, vs="trace")]))
    assert "- Beats grpo: trace on math-late at equal tokens." in text
    assert "- Loses to grpo: trace on math-habit at equal leaves." in text
    assert "- on the -late testbeds trace beats grpo: partly confirmed (trace beats grpo on math-late" in text
    assert (
        "- on the -late testbeds trace_plus beats trace at equal tokens: confirmed (trace_plus beats trace"
        in text
    )
    assert "- on the turn-1 (-habit) testbeds grpo keeps up with trace: confirmed" in text
    assert "trace_plus beats trace at equal tokens: not measured." in "\n".join(answer(comps, []))


class FakeTrain:
    """Stands in for ``tracerl.workflows.train.run.train``: records each call and makes the child run a real train would
    (tags, metrics, the per-task outcomes artifact, a saved config), finishing it or, when told, cutting it."""

    def __init__(self, tmp: Path, cut: set[str] | None = None) -> None:
        self.tmp, self.cut = tmp, cut or set()
        self.calls: list[tuple[str, str | None]] = []
        self.token_budgets: list[int | None] = []
        self.baselines: list[str] = []

    def baseline(self, cfg: Any) -> dict[str, float]:
        """The fake's baseline evaluation: one of four held-out tasks solved (accuracy 0.25)."""
        self.baselines.append(cfg.model.path)
        assert cfg.eval_at_start is False  # the cells skip their own step-0 evaluation
        return {f"p{i}": float(i < 1) for i in range(4)}

    def __call__(self, cfg: Any, tags: dict[str, str]) -> dict[str, Any]:
        import mlflow

        key = Cell(
            tags["tracerl.study.testbed"],
            tags["tracerl.study.budget"],
            tags["tracerl.study.allocator"],
            int(tags["tracerl.study.seed"]),
        ).key
        self.calls.append((key, cfg.resume))
        self.token_budgets.append(cfg.budget.token_budget)
        client = mlflow.MlflowClient()
        if cfg.resume:
            rid = cfg.resume
        else:
            exp = client.get_experiment_by_name(cfg.tracking.experiment)
            rid = client.create_run(exp.experiment_id, tags=tags).info.run_id
            storage = self.tmp / rid
            storage.mkdir()
            (storage / "config.yaml").write_text("steps: 2\n")
            client.set_tag(rid, "tracerl.storage", str(storage))
        if key in self.cut:
            self.cut.discard(key)
            raise RuntimeError(f"cut {key}")
        good = 3 if tags["tracerl.study.allocator"] == "trace" else 2
        for step, acc in ((0, 0.25), (2, good / 4)):
            client.log_metric(rid, "eval/accuracy", acc, step=step)
        for step in (1, 2):
            for k, v in (
                ("rollout/effective_ratio", 0.5),
                ("budget/leaves", 6),
                ("budget/generated_tokens", 100),
                ("rollout/mixed_groups", 1),
                ("budget/tool_calls", 3),
            ):
                client.log_metric(rid, k, v, step=step)
        out = self.tmp / f"{rid}-eval"
        out.mkdir()
        (out / "outcomes_step_00002.json").write_text(
            json.dumps({f"p{i}": float(i < good) for i in range(4)})
        )
        client.log_artifacts(rid, str(out), "eval")
        client.set_terminated(rid, "FINISHED")
        return {"acc_before": 0.25, "acc_after": good / 4, "wall_s": 1.0}


def _smoke(tmp: Path, **kw: Any) -> StudyConfig:
    cfg = compose(StudyConfig, SMOKE, [f"out_dir={tmp}/report", f"runs_dir={tmp}/runs"])
    return dataclasses.replace(
        cfg, tracking=TrackingConfig(uri=f"sqlite:///{tmp}/mlruns.db", artifact_location=f"{tmp}/art"), **kw
    )


def test_study_skips_finished_cells_and_resumes_a_cut_one(tmp_path: Path) -> None:
    fake = FakeTrain(tmp_path, cut={"math-habit/leaves/trace/s0"})
    lines: list[str] = []
    first = run_study(_smoke(tmp_path), SMOKE, lines.append, train_fn=fake, baseline_fn=fake.baseline)
    assert first["failed"] == {"math-habit/leaves/trace/s0": "RuntimeError: cut math-habit/leaves/trace/s0"}
    assert first["ran"] == ["math-habit/leaves/grpo/s0"]
    assert (
        "cell 2/2 math-habit/leaves/trace/s0: FAILED (RuntimeError: cut math-habit/leaves/trace/s0); run the study "
        "again to resume it; about 0 min left" in lines
    )
    assert fake.calls == [("math-habit/leaves/grpo/s0", None), ("math-habit/leaves/trace/s0", None)]
    s = run_study(_smoke(tmp_path), SMOKE, lines.append, train_fn=fake, baseline_fn=fake.baseline)
    assert fake.calls[2][0] == "math-habit/leaves/trace/s0" and fake.calls[2][1] is not None
    assert s["skipped"] == ["math-habit/leaves/grpo/s0"] and s["ran"] == ["math-habit/leaves/trace/s0"]
    assert any(
        line.startswith("cell 1/1 math-habit/leaves/trace/s0: held-out 0.250 -> 0.750") for line in lines
    )
    again = run_study(_smoke(tmp_path), SMOKE, lines.append, train_fn=fake, baseline_fn=fake.baseline)
    assert len(fake.baselines) == 1  # once, however often the study is resumed
    assert "baseline math-habit: held-out greedy accuracy 0.250 (4 tasks)" in lines
    assert len(fake.calls) == 3 and again["ran"] == [] and len(again["skipped"]) == 2
    assert again["parent_run_id"] == s["parent_run_id"]
    fresh = run_study(
        _smoke(tmp_path, only="allocator=grpo", fresh=True),
        SMOKE,
        lines.append,
        train_fn=fake,
        baseline_fn=fake.baseline,
    )
    assert fake.calls[3] == ("math-habit/leaves/grpo/s0", None) and fresh["ran"] == [
        "math-habit/leaves/grpo/s0"
    ]
    doc = json.loads((tmp_path / "report" / "study.json").read_text())
    assert set(doc) == {"sha", "cells", "comparisons"} and len(doc["cells"]) == 2
    cell = doc["cells"][1]
    assert list(cell) == [
        "testbed",
        "budget",
        "allocator",
        "seed",
        "run_id",
        "steps",
        "acc_before",
        "acc_after",
        "effective_ratio",
        "prefix_group_er",
        "mixed_groups_per_step",
        "leaves",
        "generated_tokens",
        "tokens_per_step",
        "wall_s",
        "cpu_s",
    ]
    assert (
        cell["allocator"],
        cell["steps"],
        cell["acc_after"],
        cell["leaves"],
        cell["generated_tokens"],
        cell["tokens_per_step"],
        cell["prefix_group_er"],
    ) == ("trace", 2, 0.75, 12, 200, 100.0, None)
    [comp] = doc["comparisons"]
    assert {k: comp[k] for k in ("testbed", "budget", "allocator", "vs")} == {
        "testbed": "math-habit",
        "budget": "leaves",
        "allocator": "trace",
        "vs": "grpo",
    }
    assert comp["diff"] == pytest.approx(0.25) and len(comp["ci95"]) == 2
    md = (tmp_path / "report" / "study.md").read_text()
    assert "## math-habit, equal leaves" in md and "| trace | 1 | 0.250 | 0.750 +- 0.000 | +50.0 |" in md
    assert (tmp_path / "report" / "study_accuracy_vs_generated_tokens.png").stat().st_size > 1000


def test_token_cells_refuse_without_t(tmp_path: Path) -> None:
    cfg = _smoke(tmp_path)
    cfg = dataclasses.replace(cfg, groups=[{**cfg.groups[0], "budgets": ["tokens"]}])
    fake = FakeTrain(tmp_path)
    with pytest.raises(
        ValueError,
        match="mean generated tokens per step over all steps of the testbed's leaves-mode "
        "grpo cells.*--fill-tokens",
    ):
        run_study(cfg, SMOKE, train_fn=fake, baseline_fn=fake.baseline)
    assert fake.calls == []


def test_submit_sends_a_study_that_joins_the_cluster() -> None:
    from tracerl.workflows.ops.submit import entrypoint

    assert entrypoint("study", ["--only", "seed=0"]) == "tracerl study --only seed=0 cluster.address=auto"


def test_smoke_study_end_to_end_then_skips_both_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two real 2-step train cells (grpo, trace) of the embedded default on 4 held-out tasks (the smoke study's 8
    halved: three evaluations of them, the baseline's included), the report, and a second invocation that finds
    both cells FINISHED and only rebuilds the report."""
    import mlflow

    from tracerl.workflows.cli.app import main

    args = [
        "study",
        "--config",
        str(SMOKE),
        "--out",
        str(tmp_path / "report"),
        "--json",
        str(tmp_path / "s.json"),
        f"tracking.uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracking.artifact_location={tmp_path}/art",
        f"runs_dir={tmp_path}/runs",
        "eval_tasks=4",
    ]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "ran 2 cells, skipped 0, failed 0" in out.out
    assert (
        "cell 1/2 math-habit/leaves/grpo/s0: held-out" in out.err
        and "cell 2/2 math-habit/leaves/trace/s0" in out.err
    )
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc == json.loads((tmp_path / "report" / "study.json").read_text())
    assert [(c["allocator"], c["steps"], c["leaves"]) for c in doc["cells"]] == [
        ("grpo", 2, 12),
        ("trace", 2, 12),
    ]
    for c in doc["cells"]:
        assert 0 <= c["acc_before"] <= 1 and 0 <= c["acc_after"] <= 1 and c["generated_tokens"] > 0
        assert c["tokens_per_step"] == c["generated_tokens"] / 2 and c["wall_s"] > 0 and c["cpu_s"] > 0
    [comp] = doc["comparisons"]
    assert comp["allocator"] == "trace" and comp["ci95"][0] <= comp["diff"] <= comp["ci95"][1]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns.db")
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("tracerl")
    [parent] = client.search_runs([exp.experiment_id], filter_string="tags.`tracerl.command` = 'study'")
    assert parent.info.status == "FINISHED" and doc["sha"] == parent.data.tags["tracerl.git_sha"]
    assert {f.path for f in client.list_artifacts(parent.info.run_id, "report")} >= {
        "report/study.md",
        "report/study.json",
        "report/study_accuracy_vs_leaves.png",
    }
    child = client.get_run(doc["cells"][1]["run_id"])
    assert {k: v for k, v in child.data.tags.items() if k.startswith("tracerl.study.")} == {
        "tracerl.study.testbed": "math-habit",
        "tracerl.study.budget": "leaves",
        "tracerl.study.allocator": "trace",
        "tracerl.study.seed": "0",
    }
    assert (
        child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        and child.data.tags["tracerl.git_sha"] == doc["sha"]
    )
    outcomes = json.loads(
        Path(
            client.download_artifacts(child.info.run_id, "eval/outcomes_step_00002.json", str(tmp_path))
        ).read_text()
    )
    assert len(outcomes) == 4 and set(outcomes.values()) <= {0.0, 1.0}
    assert sum(outcomes.values()) / 4 == doc["cells"][1]["acc_after"]
    assert main(args) == 0
    assert "ran 0 cells, skipped 2, failed 0" in capsys.readouterr().out
    assert (
        len(client.search_runs([exp.experiment_id], filter_string="tags.`tracerl.study` = 'smoke-study'"))
        == 4  # the parent, the testbed's baseline and two cells
    )
    [base] = client.search_runs(
        [exp.experiment_id], filter_string="tags.`tracerl.study.baseline` = 'math-habit'"
    )
    assert base.info.status == "FINISHED" and all(
        c["acc_before"] == base.data.metrics["eval/accuracy"] for c in doc["cells"]
    )


def test_fill_tokens_writes_t_then_token_cells_run_with_it(tmp_path: Path) -> None:
    conf = tmp_path / "study.yaml"
    conf.write_text(SMOKE.read_text())
    fake = FakeTrain(tmp_path)
    run_study(
        _smoke(tmp_path), conf, train_fn=fake, baseline_fn=fake.baseline
    )  # the leaves-mode grpo and trace cells: 100 tokens a step
    lines: list[str] = []
    assert run_study(
        _smoke(tmp_path, fill_tokens=True), conf, lines.append, train_fn=fake, baseline_fn=fake.baseline
    ) == {"filled": True}
    assert "testbed math-habit: T = 100 generated tokens per step written to" in lines[-1]
    cfg = compose(StudyConfig, conf, [f"out_dir={tmp_path}/report", f"runs_dir={tmp_path}/runs"])
    assert cfg.testbeds["math-habit"]["token_budget"] == 100
    tokens = dataclasses.replace(
        _smoke(tmp_path),
        testbeds=cfg.testbeds,
        groups=[{**cfg.groups[0], "budgets": ["tokens"], "allocators": ["grpo"]}],
    )
    calls = len(fake.calls)
    s = run_study(tokens, conf, train_fn=fake, baseline_fn=fake.baseline)
    assert s["ran"] == ["math-habit/tokens/grpo/s0"] and len(fake.calls) == calls + 1
    assert fake.token_budgets == [None, None, 100]
    report = run_study(
        dataclasses.replace(tokens, report_only=True), conf, train_fn=fake, baseline_fn=fake.baseline
    )
    assert len(fake.calls) == calls + 1 and report["ran"] == [] and len(report["report"]["cells"]) == 3


def test_fill_tokens_waits_for_every_leaves_mode_grpo_seed(tmp_path: Path) -> None:
    """T is the mean over all of a testbed's leaves-mode grpo cells: with one seed of two finished nothing is
    written (a partial mean would commit another T)."""
    conf = tmp_path / "study.yaml"
    conf.write_text(SMOKE.read_text())
    fake = FakeTrain(tmp_path)
    two = dataclasses.replace(
        _smoke(tmp_path), groups=[{**_smoke(tmp_path).groups[0], "allocators": ["grpo"], "seeds": [0, 1]}]
    )
    run_study(dataclasses.replace(two, only="seed=0"), conf, train_fn=fake, baseline_fn=fake.baseline)
    lines: list[str] = []
    with pytest.raises(ValueError, match="has no finished leaves-mode grpo cell to compute T from"):
        run_study(dataclasses.replace(two, fill_tokens=True), conf, lines.append, train_fn=fake)
    assert "testbed math-habit: T not written, its leaves-mode grpo seeds [1] have not finished" in lines
    assert "token_budget: null" in conf.read_text()


def test_token_check_names_the_cells_off_their_token_budget() -> None:
    from tracerl.workflows.study.report import token_check

    def cell(alloc: str, seed: int, per_step: float, budget: float | None = 1000.0) -> StudyCell:
        return StudyCell(
            *(
                "tb",
                "tokens",
                alloc,
                seed,
                "r",
                10,
                0.2,
                0.3,
                0.5,
                None,
                1.0,
                100,
                10 * per_step,
                per_step,
                1.0,
                1.0,
            ),
            token_budget=budget,
            tokens_vs_budget=per_step / budget - 1 if budget else None,
            tool_calls=0,
            step_s=None,
            outcomes=None,
        )

    ok = [cell("grpo", 0, 1020.0), cell("trace", 0, 960.0)]
    assert token_check(ok) == (
        "- Realised tokens per step against T = 1000: -4.0 % to +2.0 %, every cell within +-5 %."
    )
    assert token_check([*ok, cell("trace", 1, 1100.0)]).endswith("; outside +-5 %: trace/s1 (+10.0 %).")
    assert (
        token_check([cell("grpo", 0, 1000.0, budget=None)])
        == "- Realised tokens per step: no T recorded for these cells."
    )
