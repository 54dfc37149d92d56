"""The reports' shared pieces: the run frame (workflows/tracking/frame.py) and the table writer (tables.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from tracerl.workflows.tracking import tables
from tracerl.workflows.tracking.frame import frame_of, newest_finished, param, value


def _run(rid: str, start: int, status: str = "FINISHED", **tags: str) -> SimpleNamespace:
    info = SimpleNamespace(
        run_id=rid, run_name=f"n-{rid}", status=status, start_time=start, end_time=start + 10
    )
    data = SimpleNamespace(tags=tags, params={"budget.token_budget": "None", "optim.lr": "1e-5"}, metrics={})
    return SimpleNamespace(info=info, data=data)


def test_frame_has_search_runs_columns_and_missing_values_read_as_defaults() -> None:
    f = frame_of([_run("a", 1, cell="x"), _run("b", 2)])
    assert {"run_id", "run_name", "status", "start_time", "tags.cell", "params.optim.lr"} <= set(f.columns)
    first, second = (row for _, row in f.iterrows())
    assert value(first, "tags.cell") == "x" and value(second, "tags.cell", "?") == "?"
    assert param(first, "optim.lr") == 1e-5 and param(first, "budget.token_budget") is None
    assert param(first, "not.there") is None
    assert list(frame_of([]).columns)[:2] == ["run_id", "run_name"]


def test_newest_finished_run_per_key_first_of_a_tie() -> None:
    f = frame_of(
        [
            _run("a", 5, k="x"),
            _run("b", 9, k="x"),
            _run("c", 12, "FAILED", k="x"),  # newer, not finished
            _run("d", 3, k="y"),
            _run("e", 3, k="y"),  # the same millisecond: the first in the frame wins
            _run("f", 30),  # no key
        ]
    )
    assert list(newest_finished(f, ["tags.k"])["run_id"]) == ["b", "d"]
    assert newest_finished(f, ["tags.absent"]).empty and newest_finished(pd.DataFrame(), ["tags.k"]).empty


def test_tables_write_markdown_fixed_width_and_html() -> None:
    assert tables.markdown(("a", "b"), [["1", "x"]]) == ["| a | b |", "|---|---|", "| 1 | x |"]
    assert tables.text([("n", 3, ">"), ("name", 5, "<")], [["7", "ab"], ["12", "longer"]]).splitlines() == [
        "  n name ",
        "  7 ab   ",
        " 12 longer",
    ]
    html = tables.html_table(("run", "x"), [["<r>", "1"]], classes=("name",), id_="t")
    assert (
        html
        == "<table id='t'><tr><th>run</th><th>x</th></tr><tr><td class='name'>&lt;r&gt;</td><td>1</td></tr></table>"
    )
    assert (tables.num(float("nan")), tables.num(None, missing="-"), tables.num(0.12345)) == (
        "n/a",
        "-",
        "0.123",
    )
