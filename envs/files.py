"""Data files of the environments (question files, corpora): read and checked record by record.

Every problem is a ``DataFileError`` (a ``ValueError``) on one line that names the file, the record (``line N`` of
JSONL / JSON / CSV text, ``record N`` of a JSON list, ``row N`` of parquet; all 1-based) and what is wrong or
missing, so a workflow can check its data before it starts Ray or opens an MLflow run.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracerl.types import Prompt

Record = tuple[str, dict[str, Any]]
"""(where in the file, e.g. 'line 3', the record)."""


class DataFileError(ValueError):
    """A data file that cannot be used; the message names the file, the record and what to change."""


def _kind_name(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        bool: "a boolean",
        type(None): "null",
        str: "text",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def describe_fields(row: Mapping[str, Any]) -> str:
    """The fields a record has, empty ones marked: 'problem, answer (null), type'."""

    def mark(v: Any) -> str:
        return " (null)" if v is None else " (empty)" if v in ("", [], {}) else ""

    return ", ".join(f"{k}{mark(v)}" for k, v in row.items()) or "nothing"


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataFileError(f"{path} line {line}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _lines(path: Path) -> Iterator[str]:
    """The file's lines, streamed (a corpus may not fit in memory twice), decoded one at a time.

    Each line is decoded on its own, so a decoding error names the line it is on (a text-mode reader decodes
    ahead of the line it yields). Line ends are read as Python's universal newlines: ``\\n``, ``\\r\\n`` and a
    lone ``\\r`` each end a line.
    """
    with path.open("rb") as f:
        n = 0
        for raw in f:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFileError(f"{path} line {n + 1}: not UTF-8 text ({e.reason})") from None
            if "\r" in text:
                text = text.replace("\r\n", "\n")
                parts = text.split("\r")
                for part in parts[:-1]:
                    n += 1
                    yield part + "\n"
                text = parts[-1]
                if not text:
                    continue
            n += 1
            yield text


def _jsonl(path: Path, lines: Iterable[str]) -> Iterator[Record]:
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFileError(
                f"{path} line {n}: not valid JSON ({e.msg} at column {e.colno}); "
                "expected one JSON object a line"
            ) from None
        if not isinstance(obj, dict):
            raise DataFileError(f"{path} line {n}: expected a JSON object, got {_kind_name(obj)}")
        yield f"line {n}", obj


def _json(path: Path, text: str) -> Iterator[Record]:
    if not text.strip():
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several values: JSON Lines in a .json file
            yield from _jsonl(path, text.splitlines())
            return
        raise DataFileError(f"{path} line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, list):
        what = (
            f"an object with keys {', '.join(map(str, list(data)[:8]))}"
            if isinstance(data, dict)
            else _kind_name(data)
        )
        raise DataFileError(
            f"{path}: expected a JSON list of records (or one JSON object a line), got {what}"
        )
    for i, obj in enumerate(data, start=1):
        if not isinstance(obj, dict):
            raise DataFileError(f"{path} record {i}: expected a JSON object, got {_kind_name(obj)}")
        yield f"record {i}", obj


def _csv(path: Path, text: str) -> Iterator[Record]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    for row in reader:
        where = f"line {reader.line_num}"
        if None in row:
            raise DataFileError(
                f"{path} {where}: {len(header) + len(row[None])} fields, but the header has "
                f"{len(header)} ({', '.join(header)})"
            )
        yield where, {k: (None if v is None or v == "" else v) for k, v in row.items()}


def _parquet(path: Path) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataFileError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]})") from None
    for i, row in enumerate(rows, start=1):
        yield f"row {i}", row


READERS: dict[str, Callable[[Path, str], Iterator[Record]]] = {"json": _json, "csv": _csv}


def columns_of(path: Path, kind: str) -> list[str] | None:
    """The column names of a tabular file (CSV header, parquet schema); None for JSON."""
    if kind == "csv":
        first = next(csv.reader(_text(path).splitlines()), [])
        return list(first)
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except (pa.ArrowException, OSError) as e:
            raise DataFileError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]})") from None
    return None


def read_records(path: Path, kind: str, what: str, expect: str, limit: int | None = None) -> list[Record]:
    """The records of an existing file of ``kind`` (json: a list or JSON Lines, jsonl, csv, parquet), with where
    each is; at most ``limit``. ``expect`` says what a record should hold (for the empty-file message)."""
    if path.stat().st_size == 0:
        raise DataFileError(f"{what} {path} is empty; expected {expect}")
    if kind == "parquet":
        records = _parquet(path)
    elif kind == "jsonl":
        records = _jsonl(path, _lines(path))
    else:
        records = READERS[kind](path, _text(path))
    out: list[Record] = []
    for rec in records:
        if limit is not None and len(out) >= limit:
            break
        out.append(rec)
    if not out:
        raise DataFileError(f"{what} {path} has no records; expected {expect}")
    return out


def _check_value(path: Path, where: str, key: str, value: Any) -> None:
    """An answer-like field: text, a number, or a list of them."""
    ok = (isinstance(value, (str, int, float)) and not isinstance(value, bool)) or (
        isinstance(value, list)
        and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
    )
    if value is not None and not ok:
        raise DataFileError(
            f"{path} {where}: '{key}' is {_kind_name(value)}; expected text, a number or a list of them"
        )


def load_question_file(
    path: str | Path,
    *,
    what: str,
    key: str,
    kinds: Mapping[str, str],
    question_keys: Sequence[str],
    answer: Callable[[dict[str, Any]], str | None],
    no_answer: str,
    source: Callable[[dict[str, Any], Path], str],
    limit: int | None = None,
    answer_keys: Sequence[str] = ("answer",),
) -> list[Prompt]:
    """Prompts from a question file: ``kinds`` maps a suffix to a reader (json, jsonl, csv, parquet); the question
    is the first of ``question_keys`` a record has; ``answer(row)`` gives the gold answer (None: an error ending with
    ``no_answer``); ``answer_keys`` must hold text, numbers or lists of them; ids are ``<stem>-<row>-<hash of the
    question>`` (row counted from 0).

    Raises:
        FileNotFoundError: the file does not exist (the message names ``key``, the config key that set it).
        DataFileError: unsupported extension, an empty or malformed file, or a record without a question or an
            answer, or with a field of the wrong type (the message names the file and the record).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path} (set {key} to an existing file)")
    kind = kinds.get(path.suffix)
    if kind is None:
        raise DataFileError(f"{path}: unsupported extension {path.suffix!r}; use {', '.join(kinds)}")
    qkeys = tuple(question_keys)
    expect = f"records with a question (one of {', '.join(qkeys)}) and an answer"
    cols = columns_of(path, kind)
    if cols is not None and not any(k in cols for k in qkeys):
        raise DataFileError(
            f"{what} {path}: no question column; expected one of {qkeys} (columns: {', '.join(cols)})"
        )
    out: list[Prompt] = []
    for i, (where, row) in enumerate(read_records(path, kind, what, expect)):
        qkey = next((k for k in qkeys if row.get(k) is not None), None)
        if qkey is None:
            raise DataFileError(
                f"{path} {where}: no question field; expected one of {qkeys} (have: {describe_fields(row)})"
            )
        if not isinstance(row[qkey], str):
            raise DataFileError(f"{path} {where}: '{qkey}' is {_kind_name(row[qkey])}; expected text")
        q = row[qkey].strip()
        if not q:
            raise DataFileError(f"{path} {where}: '{qkey}' is empty")
        for k in answer_keys:
            _check_value(path, where, k, row.get(k))
        ans = answer(row)
        if ans is None:
            raise DataFileError(f"{path} {where}: no answer; {no_answer} (have: {describe_fields(row)})")
        if limit is None or len(out) < limit:
            pid = f"{path.stem}-{i}-" + hashlib.sha1(q.encode()).hexdigest()[:8]
            out.append(Prompt(prompt_id=pid, text=q, answer=ans, source=source(row, path)))
    return out
