"""What a user sees, checked in a real browser (`make test-ui`; marked `ui`, not in CI: it needs Debian's chromium).

A short sweep (2 trials of 2 steps, conf/sweep/smoke.yaml) and a 2-step run of the demo config, each in its own
SQLite store; `tracerl ui` serves a store and headless Chromium opens the URL it prints. Screenshots go to
$TRACERL_UI_ARTIFACTS (default ui_artifacts/ in the repository).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import Browser, chromium_path
from tests.cluster_nodes import start_ui
from tests.conftest import ROOT
from tracerl.workflows.cli.app import main

pytestmark = pytest.mark.ui

ARTIFACTS = Path(os.environ.get("TRACERL_UI_ARTIFACTS", ROOT / "ui_artifacts"))


def _client(uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if chromium_path() is None:
        pytest.fail(
            "no chromium: run `make test-ui` (it installs Debian's chromium as root) or apt-get install chromium"
        )
    with Browser(tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


@pytest.fixture(scope="module")
def sweep(tiny_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ui-sweep")
    uri = f"sqlite:///{tmp}/mlruns.db"
    assert (
        main(
            [
                "sweep",
                "--config",
                str(ROOT / "conf" / "sweep" / "smoke.yaml"),
                "--samples",
                "2",
                "--steps",
                "2",
                "--name",
                "ui-sweep",
                f"model.path={tiny_policy}",
                f"tracking.uri={uri}",
                f"tracking.artifact_location={tmp}/art",
                f"out_dir={tmp}/runs",
            ]
        )
        == 0
    )
    assert main(["compare", "--tracking-uri", uri, "--out", str(tmp / "compare")]) == 0
    client = _client(uri)
    exp = client.get_experiment_by_name("tracerl")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    children = sorted(n for n in runs if n.startswith("ui-sweep-"))
    assert "ui-sweep" in runs and len(children) == 2, sorted(runs)
    return {"tmp": tmp, "uri": uri, "runs": runs, "children": children}


def _ui(uri: str, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    """`tracerl ui` on a store; returns the process and the URL it printed."""
    proc, line = start_ui(uri, cwd)
    found = re.search(r"MLflow UI on \S+: (\S+)", line)
    assert found, line
    return proc, found.group(1)


@pytest.fixture(scope="module")
def sweep_ui(sweep: dict[str, Any]) -> Iterator[str]:
    proc, url = _ui(sweep["uri"], sweep["tmp"])
    yield url
    proc.terminate()
    proc.wait(timeout=60)


def test_runs_page_lists_the_sweep_with_its_key_columns(
    sweep: dict[str, Any], sweep_ui: str, browser: Browser
) -> None:
    exp_id = sweep["runs"]["ui-sweep"].info.experiment_id
    assert sweep_ui.endswith(
        f"/#/experiments/{exp_id}/runs?workflowType=machine_learning&viewStateShareKey=tracerl"
    )
    browser.open(sweep_ui)
    text = browser.wait_for(
        [
            "ui-sweep",
            "key/accuracy",
            "key/effective_ratio",
            "key/generated_tokens",
            "tracerl.budget",
            "L=15 N=[2, 4] m_max=[4, 8]",
        ]
    )
    assert "Runs" in text and "Traces: 0" not in text  # the runs table, not the GenAI overview
    browser.screenshot(ARTIFACTS / "sweep_runs.png")
    # the parent sweep row carries its best trial's key/ numbers
    best = _client(sweep["uri"]).get_run(sweep["runs"]["ui-sweep"].info.run_id).data.metrics
    assert {"key/accuracy", "key/effective_ratio", "key/generated_tokens"} <= set(best)
    # the trials are its children: expanding it lists them, with their numbers in the key/ columns
    browser.eval(
        "[...document.querySelectorAll('button[data-component-id*=runnamecellrenderer]')].forEach(b => b.click())"
    )
    text = browser.wait_for(sweep["children"])
    browser.screenshot(ARTIFACTS / "sweep_runs_expanded.png")
    for child in sweep["children"]:
        tokens = int(sweep["runs"][child].data.metrics["key/generated_tokens"])
        assert str(tokens) in text.replace(",", ""), (child, tokens)


def test_trees_html_shows_expanded_prefixes_with_p_and_k(sweep: dict[str, Any], browser: Browser) -> None:
    import mlflow

    child = sweep["runs"][sweep["children"][0]]
    local = mlflow.artifacts.download_artifacts(
        run_id=child.info.run_id,
        artifact_path="trees/step_00002/trees.html",
        dst_path=str(sweep["tmp"] / "trees"),
        tracking_uri=sweep["uri"],
    )
    browser.open(Path(local).as_uri())
    browser.wait_for(["step 2", "predicted p=", "continuations K="])
    expanded = browser.eval("[...document.querySelectorAll('.exp')].map(e => e.innerText)")
    assert expanded and all(
        re.fullmatch(r"predicted p=\d\.\d\d; continuations K=[1-9]\d*", e) for e in expanded
    )
    assert browser.eval("document.querySelectorAll('.tree').length") >= 1
    assert browser.eval("document.querySelectorAll('.ok, .fail').length") >= 1  # leaf rewards
    browser.screenshot(ARTIFACTS / "trees.png")


def test_compare_report_has_the_ranking_and_plots(sweep: dict[str, Any], browser: Browser) -> None:
    report = sweep["tmp"] / "compare" / "report.html"
    browser.open(report.as_uri())
    browser.wait_for(["training runs, ranked", *[c[:20] for c in sweep["children"]]])
    rows = browser.eval("[...document.querySelectorAll('#ranking tr')].map(r => r.innerText)")
    assert len(rows) == 3 and rows[0].split("\t")[:3] == ["rank", "run", "allocator"]
    assert [r.split("\t")[0] for r in rows[1:]] == ["1", "2"]
    sizes = browser.eval("[...document.images].map(i => [i.alt, i.naturalWidth])")
    assert [a for a, _ in sizes] == [
        "effective_ratio_per_step",
        "accuracy_vs_budget",
        "learning_curve",
        "budget_shape_heatmap",
    ]
    assert all(w > 300 for _, w in sizes)  # every plot decoded
    browser.screenshot(ARTIFACTS / "compare_report.png")


def test_demo_run_shows_accuracy_and_effective_ratio_on_the_first_screen(
    tmp_path: Path, browser: Browser, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `make demo` then `tracerl ui` shows, on a 2-step run of the demo config."""
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    assert (
        main(
            [
                "train",
                "--config",
                str(ROOT / "conf" / "train" / "demo.yaml"),
                "--steps",
                "2",
                f"tracking.uri={uri}",
                f"tracking.artifact_location={tmp_path}/art",
                "--out",
                str(tmp_path / "runs"),
            ]
        )
        == 0
    )
    assert f"tracerl ui --tracking-uri {uri}" in capsys.readouterr().out  # the command the demo prints
    run = _client(uri).search_runs([_client(uri).get_experiment_by_name("tracerl").experiment_id])[0]
    acc, er = run.data.metrics["key/accuracy"], run.data.metrics["key/effective_ratio"]
    proc, url = _ui(uri, tmp_path)
    try:
        browser.open(url)
        text = browser.wait_for([run.info.run_name, "key/accuracy", "key/effective_ratio"])
        browser.screenshot(ARTIFACTS / "demo_runs.png")
        # the run's cells (ag-grid splits a row into a pinned and a scrolling part) that lie on the first screen
        cells = dict(
            browser.eval(
                "const runName = "
                + json.dumps(run.info.run_name)
                + ";"
                + """(() => {
            const r = [...document.querySelectorAll('.ag-row')].find(r => r.innerText.includes(runName));
            if (!r) return [];
            return [...document.querySelectorAll(`.ag-row[row-index="${r.getAttribute('row-index')}"] .ag-cell`)]
              .filter(c => { const b = c.getBoundingClientRect();
                             return b.width > 0 && b.right <= window.innerWidth && b.bottom <= window.innerHeight; })
              .map(c => [c.getAttribute('col-id'), c.innerText.trim()]); })()"""
            )
        )
        for key, value in (("key/accuracy", acc), ("key/effective_ratio", er)):
            shown = cells.get(f"metrics.`{key}`")
            assert shown is not None and abs(float(shown) - value) < 5e-3, (key, value, cells, text[:300])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
