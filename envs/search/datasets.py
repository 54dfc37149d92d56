"""Loaders for real multi-hop QA question files (read and checked by ``tracerl.envs.files``): HotpotQA and 2WikiMultihopQA JSON
(a list of records, or JSONL), Bamboogle CSV, and FlashRAG JSONL.

The question field is the first of ``question``/``Question`` present; the gold answer(s) come from
``golden_answers`` (FlashRAG: a list), ``answer`` or ``Answer``. Several gold answers travel in
``Prompt.answer`` as a JSON list string (``tracerl.envs.search.reward.gold_answers`` reads them back).
The category (``type`` in HotpotQA / 2Wiki) becomes ``Prompt.source``. These files hold questions
only: the passages come from a user-supplied corpus (``env.search.corpus``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracerl.envs.files import load_question_file
from tracerl.types import Prompt

QUESTION_KEYS = ("question", "Question")
ANSWER_KEYS = ("golden_answers", "answer", "Answer", "answers")


def _answer(row: dict[str, Any]) -> str | None:
    for key in ANSWER_KEYS:
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            values = [str(v).strip() for v in value if str(v).strip()]
            if not values:
                continue
            return values[0] if len(values) == 1 else json.dumps(values)
        if str(value).strip():
            return str(value).strip()
    return None


def load_qa_file(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from a QA question file (.json list, .jsonl, or .csv with Question/Answer columns).

    Raises:
        FileNotFoundError: the file does not exist.
        DataFileError: unsupported extension, an empty or malformed file, or a record without a question or an
            answer (the message names the file and the record).
    """
    return load_question_file(
        path,
        what="search question file",
        key="env.search.tasks",
        kinds={".json": "json", ".jsonl": "jsonl", ".csv": "csv"},
        question_keys=QUESTION_KEYS,
        answer=_answer,
        no_answer=f"expected one of {ANSWER_KEYS}",
        answer_keys=ANSWER_KEYS,
        source=lambda row, p: str(row.get("type") or p.stem),
        limit=limit,
    )
