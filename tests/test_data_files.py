"""Bad data files (missing, empty, malformed, mismatched) are one clear error naming the file and the record, and
`tracerl train` / `tracerl eval` refuse them with exit 2 before Ray starts or MLflow is touched."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tracerl.envs.files import DataFileError
from tracerl.envs.math.datasets import load_math_file
from tracerl.envs.search.datasets import load_qa_file
from tracerl.envs.search.index import read_corpus
from tracerl.workflows.cli.app import main

GOOD = [
    {"question": "1+1?", "answer": "2"},
    {"question": "2+2?", "answer": 4},
    {"question": "3+3?", "answer": "6"},
]


def _jsonl(rows: list[Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


# (case, file name, how to write it, the config overrides' env part, the parts the one-line message must hold)
Writer = Callable[[Path], None]
MATH_CASES: list[tuple[str, str, Writer | None, list[str]]] = [
    ("missing file", "tasks.jsonl", None, ["math task file not found:", "tasks.jsonl", "set env.math.tasks"]),
    (
        "empty file",
        "tasks.jsonl",
        lambda p: p.write_text(""),
        [
            "math task file",
            "tasks.jsonl is empty; expected records with a question (one of problem, question, prompt)",
        ],
    ),
    ("blank lines only", "tasks.jsonl", lambda p: p.write_text("\n\n"), ["tasks.jsonl has no records"]),
    ("empty JSON list", "tasks.json", lambda p: p.write_text("[]"), ["tasks.json has no records"]),
    (
        "malformed JSONL line",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl(GOOD[:1]) + '{"question": "x", \n'),
        ["tasks.jsonl line 2: not valid JSON"],
    ),
    (
        "malformed JSON",
        "tasks.json",
        lambda p: p.write_text('[{"question": "x",\n "answer": }]'),
        ["tasks.json line 2: not valid JSON"],
    ),
    (
        "a JSONL line that is not an object",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl([GOOD[0], [1, 2]])),
        ["tasks.jsonl line 2: expected a JSON object, got a list"],
    ),
    (
        "a JSON object, not a list",
        "tasks.json",
        lambda p: p.write_text(json.dumps({"data": GOOD})),
        ["tasks.json: expected a JSON list of records", "keys data"],
    ),
    (
        "no answer field",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl([*GOOD[:2], {"question": "5+5?", "id": 7}])),
        ["tasks.jsonl line 3: no answer; expected 'answer'", "(have: question, id)"],
    ),
    (
        "null answer",
        "tasks.json",
        lambda p: p.write_text(json.dumps([*GOOD[:1], {"problem": "x", "answer": None}])),
        ["tasks.json record 2: no answer", "(have: problem, answer (null))"],
    ),
    (
        "no question field",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl([{"text": "x", "answer": "1"}])),
        [
            "tasks.jsonl line 1: no question field; expected one of ('problem', 'question', 'prompt')",
            "(have: text, answer)",
        ],
    ),
    (
        "question of the wrong type",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl([GOOD[0], {"question": ["a"], "answer": "1"}])),
        ["tasks.jsonl line 2: 'question' is a list; expected text"],
    ),
    (
        "empty question",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl([{"question": "  ", "answer": "1"}])),
        ["tasks.jsonl line 1: 'question' is empty"],
    ),
    (
        "answer of the wrong type",
        "tasks.jsonl",
        lambda p: p.write_text(_jsonl([GOOD[0], {"question": "q", "answer": {"v": 1}}])),
        ["tasks.jsonl line 2: 'answer' is an object; expected text, a number or a list of them"],
    ),
    (
        "not UTF-8",
        "tasks.jsonl",
        lambda p: p.write_bytes(b'{"question": "\xff", "answer": "1"}\n'),
        ["tasks.jsonl line 1: not UTF-8 text"],
    ),
    (
        "parquet with wrong columns",
        "tasks.parquet",
        lambda p: _parquet(p, [{"a": "x", "b": "1"}]),
        [
            "tasks.parquet: no question column; expected one of ('problem', 'question', 'prompt') (columns: a, b)"
        ],
    ),
    (
        "not a parquet file",
        "tasks.parquet",
        lambda p: p.write_text("question,answer\n"),
        ["tasks.parquet: not a readable parquet file"],
    ),
    (
        "unsupported extension",
        "tasks.csv",
        lambda p: p.write_text("question,answer\nq,1\n"),
        ["tasks.csv: unsupported extension '.csv'; use .json, .jsonl, .parquet"],
    ),
]

QA = [{"question": f"Who founded company {i}?", "answer": f"person {i}"} for i in range(40)]
CORPUS = '{"id": "0", "contents": "Acme\\nAcme was founded by person 0."}\n'
SEARCH_CASES: list[tuple[str, dict[str, Writer | None], list[str]]] = [
    (
        "CSV with wrong columns",
        {"q.csv": lambda p: p.write_text("q,a\nx,1\n"), "c.jsonl": lambda p: p.write_text(CORPUS)},
        ["q.csv: no question column; expected one of ('question', 'Question') (columns: q, a)"],
    ),
    (
        "CSV row with too many fields",
        {
            "q.csv": lambda p: p.write_text("question,answer\nx,1\ny,2,3\n"),
            "c.jsonl": lambda p: p.write_text(CORPUS),
        },
        ["q.csv line 3: 3 fields, but the header has 2 (question, answer)"],
    ),
    (
        "CSV row without an answer",
        {
            "q.csv": lambda p: p.write_text("question,answer\nx,1\ny,\n"),
            "c.jsonl": lambda p: p.write_text(CORPUS),
        },
        [
            "q.csv line 3: no answer; expected one of ('golden_answers', 'answer', 'Answer', 'answers')",
            "(have: question, answer (null))",
        ],
    ),
    (
        "missing corpus",
        {"q.jsonl": lambda p: p.write_text(_jsonl(QA)), "c.jsonl": None},
        ["search corpus not found:", "c.jsonl", "set env.search.corpus"],
    ),
    (
        "empty corpus",
        {"q.jsonl": lambda p: p.write_text(_jsonl(QA)), "c.jsonl": lambda p: p.write_text("")},
        ["search corpus", "c.jsonl is empty", '"contents"'],
    ),
    (
        "corpus line without text",
        {
            "q.jsonl": lambda p: p.write_text(_jsonl(QA)),
            "c.jsonl": lambda p: p.write_text(CORPUS + '{"id": "1", "title": "T"}\n'),
        },
        ["c.jsonl line 2: no 'contents' or 'text' field (have: id, title)"],
    ),
    (
        "empty question file",
        {"q.jsonl": lambda p: p.write_text(""), "c.jsonl": lambda p: p.write_text(CORPUS)},
        ["search question file", "q.jsonl is empty"],
    ),
]


def _write(tmp_path: Path, files: dict[str, Writer | None]) -> dict[str, Path]:
    paths = {}
    for name, write in files.items():
        paths[name] = tmp_path / "data" / name
        paths[name].parent.mkdir(exist_ok=True)
        if write is not None:
            write(paths[name])
    return paths


@pytest.mark.parametrize(("case", "name", "write", "expected"), MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_math_loader_names_the_file_and_the_record(
    tmp_path: Path, case: str, name: str, write: Writer | None, expected: list[str]
) -> None:
    path = _write(tmp_path, {name: write})[name]
    with pytest.raises((DataFileError, FileNotFoundError)) as err:
        load_math_file(path)
    msg = str(err.value)
    assert "\n" not in msg and all(part in msg for part in expected), msg


def test_search_loaders_name_the_file_and_the_line(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        {
            "q.csv": lambda p: p.write_text("Question,Answer\nx,1\n,2\n"),
            "c.jsonl": lambda p: p.write_text(CORPUS + '{"id": "1", "contents": 5}\n'),
        },
    )
    with pytest.raises(DataFileError, match=r"q\.csv line 3: no question field"):
        load_qa_file(p["q.csv"])
    with pytest.raises(DataFileError, match=r"c\.jsonl line 2: 'contents' is not text"):
        read_corpus(p["c.jsonl"])
    assert [x.title for x in read_corpus(p["c.jsonl"], limit=1)] == ["Acme"]  # the check of a corpus head


def test_good_files_still_load_with_the_same_ids(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        {
            "t.jsonl": lambda p: p.write_text("\n" + _jsonl(GOOD) + "\n"),
            "t.json": lambda p: p.write_text(_jsonl(GOOD)),  # JSON Lines in a .json file
            "t.parquet": lambda p: _parquet(p, [{"problem": "3*3?", "answer": 9.0}]),
        },
    )
    got = load_math_file(p["t.jsonl"])
    assert [(x.text, x.answer) for x in got] == [("1+1?", "2"), ("2+2?", "4"), ("3+3?", "6")]
    assert got[1].prompt_id.startswith("t-1-")  # <stem>-<record index from 0>-<hash>, as before
    assert [(x.prompt_id, x.answer) for x in load_math_file(p["t.json"])] == [
        (x.prompt_id, x.answer) for x in got
    ]
    assert [(x.text, x.answer) for x in load_math_file(p["t.parquet"])] == [("3*3?", "9")]


@pytest.mark.parametrize("name", ["tasks.jsonl", "tasks.json", "corpus.jsonl"])
@pytest.mark.parametrize("bad_line", [2, 5001])
def test_a_line_that_is_not_utf8_is_named_by_its_own_number(tmp_path: Path, name: str, bad_line: int) -> None:
    # The streamed reader decoded ahead of its line counter: line 2 was reported as line 1, 5001 as 4841.
    path = tmp_path / name
    good = json.dumps({"question": "q", "answer": "1", "contents": "c"}).encode() + b"\r\n"
    path.write_bytes(good * (bad_line - 1) + b'{"question": "\xff", "answer": "1"}\n' + good * 3)
    with pytest.raises(DataFileError, match=rf"{name} line {bad_line}: not UTF-8 text"):
        read_corpus(path) if name.startswith("corpus") else load_math_file(path)


def test_line_ends_of_every_kind_give_the_same_records(tmp_path: Path) -> None:
    rows = _jsonl(GOOD)
    for end in ("\r\n", "\r"):
        path = tmp_path / f"t{len(end)}.jsonl"
        path.write_bytes(rows.replace("\n", end).encode())
        got = load_math_file(path)
        assert [(x.text, x.answer) for x in got] == [("1+1?", "2"), ("2+2?", "4"), ("3+3?", "6")]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes((_jsonl(GOOD[:2]) + '{"question": "x", \n').replace("\n", "\r").encode())
    with pytest.raises(DataFileError, match=r"bad\.jsonl line 3: not valid JSON"):
        load_math_file(bad)


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Run in an empty directory where starting Ray fails the test; returns the MLflow store's path (must stay
    absent: no run created, no store opened)."""
    import ray

    import tracerl.workflows.train.run

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started before the data was checked")

    monkeypatch.setattr(ray, "init", boom)
    monkeypatch.setattr(tracerl.workflows.train.run, "init_ray", boom)  # the name launch() calls
    monkeypatch.chdir(tmp_path)
    return tmp_path / "m.db"


def _cli_refuses(
    argv: list[str],
    store: Path,
    expected: list[str],
    capsys: pytest.CaptureFixture[str],
    tracking: bool = True,
) -> None:
    capsys.readouterr()
    keys = (
        [f"tracking.uri=sqlite:///{store}", f"tracking.artifact_location={store.parent}/art"]
        if tracking
        else []
    )
    assert main([*argv, *keys]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tracerl: ") and all(p in err[0] for p in expected), err
    assert (
        not store.exists()
        and not (store.parent / "mlruns.db").exists()
        and not (store.parent / "art").exists()
    )


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize(("case", "name", "write", "expected"), MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_train_and_eval_refuse_a_bad_math_file_before_anything_starts(
    nothing_starts: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    case: str,
    name: str,
    write: Writer | None,
    expected: list[str],
) -> None:
    path = _write(nothing_starts.parent, {name: write})[name]
    _cli_refuses([command, "env=math", f"env.math.tasks={path}"], nothing_starts, expected, capsys)


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize(("case", "files", "expected"), SEARCH_CASES, ids=[c[0] for c in SEARCH_CASES])
def test_train_and_eval_refuse_bad_search_files_before_anything_starts(
    nothing_starts: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    case: str,
    files: dict[str, Writer | None],
    expected: list[str],
) -> None:
    paths = list(_write(nothing_starts.parent, files).values())
    _cli_refuses(
        [command, "env=search", f"env.search.tasks={paths[0]}", f"env.search.corpus={paths[1]}"],
        nothing_starts,
        expected,
        capsys,
    )


def test_sweep_refuses_a_bad_task_file_before_anything_starts(
    nothing_starts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        nothing_starts.parent, {"tasks.jsonl": lambda p: p.write_text(_jsonl([GOOD[0], {"question": "q"}]))}
    )
    _cli_refuses(
        ["sweep", "env=math", f"env.math.tasks={path['tasks.jsonl']}"],
        nothing_starts,
        ["tasks.jsonl line 2: no answer", "(have: question)"],
        capsys,
    )


@pytest.mark.parametrize(
    ("command", "extra"),
    [(["rollout"], ["--out"]), (["bench", "rollout"], ["--out"]), (["bench", "env"], [])],
)
def test_rollout_and_benches_refuse_a_bad_task_file_before_a_model_loads(
    nothing_starts: Path, capsys: pytest.CaptureFixture[str], command: list[str], extra: list[str]
) -> None:
    path = _write(
        nothing_starts.parent, {"tasks.json": lambda p: p.write_text('[{"question": "q", "answer": [{}]}]')}
    )
    out = nothing_starts.parent / "out"
    _cli_refuses(
        [
            *command,
            "env=math",
            f"env.math.tasks={path['tasks.json']}",
            "model.path=/nonexistent",
            *([*extra, str(out)] if extra else []),
        ],
        nothing_starts,
        ["tasks.json record 1: 'answer' is a list; expected text, a number or a list of them"],
        capsys,
        tracking=command == ["bench", "rollout"],
    )
    assert not out.exists()
