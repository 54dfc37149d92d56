"""Metric names: every constant in ``tracerl.metrics`` is defined in docs/metrics.md and every metric the page
defines is a constant (or built by one of the module's name functions), and no module spells a name itself."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tracerl import metrics as M
from tracerl.engine.ledger import BudgetLedger

DOC = (ROOT / "docs" / "metrics.md").read_text()
NAMESPACES = (
    "rollout",
    "budget",
    "time",
    "predictor",
    "bench",
    "train",
    "throughput",
    "system",
    "eval",
    "key",
    "total",
    "stop",
    "curve",
    "mc",
    "sampler",
)
DOC_NAMES = {
    n
    for n in re.findall(r"`([a-z_]+/[^`\s]+)`", DOC)
    if n.split("/")[0] in NAMESPACES and not n.endswith(".json")
}
CONSTANTS = {
    k: v for k, v in vars(M).items() if k.isupper() and isinstance(v, str) and v.split("/")[0] in NAMESPACES
}
EXEMPT = {
    "platform/tracerl/metrics.py",
}
PHASES = M.STEP_PHASES + M.ENGINE_PHASES + M.TRAIN_PHASES


def test_every_constant_is_defined_in_the_docs() -> None:
    names = {k: v for k, v in CONSTANTS.items() if not v.endswith("/")}
    assert len(names) > 60
    built = {M.phase_time(p) for p in PHASES}  # documented by their phase (next test)
    missing = {k: v for k, v in names.items() if v not in DOC_NAMES | built}
    assert not missing, f"metric constants not defined in docs/metrics.md: {missing}"
    prefixes = {v for v in CONSTANTS.values() if v.endswith("/")}
    assert prefixes == {"budget/", "eval/", "key/"} and all(f"\n## {p} " in DOC for p in prefixes)


def test_every_phase_and_calibration_stat_is_in_the_docs() -> None:
    assert "`time/<phase>_s`" in DOC
    undocumented = [p for p in PHASES if f"`{p}`" not in DOC and f"`{M.phase_time(p)}`" not in DOC]
    assert not undocumented, f"phases missing from docs/metrics.md's time/ sections: {undocumented}"
    assert all(f"`{M.calibration('<group>', s)}`" in DOC for s in M.CALIBRATION_STATS)


def test_every_name_function_matches_its_documented_template() -> None:
    templates = {
        M.eval_source("<source>"): "eval/accuracy/<source>",
        M.predictor_fit("<key>"): "predictor/fit_<key>",
        M.bench("<key>"): "bench/<key>",
        M.phase_time("<phase>"): "time/<phase>_s",
        M.startup_phase("<phase>"): "time/startup_<phase>_s",
        M.prefix_group_depth(0).replace("0", "<t>"): "rollout/prefix_group_effective_ratio/depth_<t>",
    }
    for built, template in templates.items():
        assert built == template and f"`{template}`" in DOC


def test_every_documented_metric_is_a_constant() -> None:
    built = {M.phase_time(p) for p in PHASES}
    unknown = {n for n in DOC_NAMES if "<" not in n} - set(CONSTANTS.values()) - built
    assert not unknown, f"docs/metrics.md defines metrics with no constant in tracerl/metrics.py: {unknown}"


def test_the_ledger_makes_exactly_the_budget_constants() -> None:
    ledger = BudgetLedger(phase_s={"generate": 1.0})
    budget = {k for k in ledger.as_metrics() if k.startswith(M.BUDGET)}
    assert budget <= set(CONSTANTS.values())
    assert M.phase_time("generate") in ledger.as_metrics()


def test_every_engine_phase_is_logged_every_step_even_when_nothing_ran_in_it() -> None:
    # a streaming chaos drill (seed 1) had a step whose paths graded nothing: time/grade_s was missing at that step,
    # and the drill's exactly-once check (every per-step metric at steps 1..S) failed
    got = BudgetLedger(phase_s={"generate": 1.5}).as_metrics()
    assert {k: got[M.phase_time(k)] for k in ("generate", "tools", "grade")} == {
        "generate": 1.5,
        "tools": 0.0,
        "grade": 0.0,
    }


def test_no_module_spells_a_metric_name() -> None:
    # A quoted string that starts with a namespace and a name character; conf/ paths such as "eval/math.yaml" and
    # "train/default.yaml" name command configs, not metrics.
    names = "|".join(NAMESPACES)
    pattern = re.compile(r"""["'](?:""" + names + r""")/[a-z{][^"'\n]*(?<!\.yaml)["']""")
    offenders = []
    for sub in ("platform", "workflows", "envs", "predictors"):
        for path in sorted((ROOT / sub).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() in EXEMPT:
                continue
            text = path.read_text()
            offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert not offenders, f"use the constants of tracerl.metrics: {offenders}"
