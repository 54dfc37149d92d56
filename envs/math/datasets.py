"""Loaders for real math task files (MATH-500, AIME, AMC, DeepScaleR, ...).

Accepts JSON (a list of records), JSONL and parquet (read and checked by ``tracerl.envs.files``). The question field is the first of
``problem``/``question``/``prompt`` present; the answer is ``answer`` (numbers become strings;
OlympiadBench's list-strings like "['$2^{1009}$']" are unwrapped), else the last \\boxed{} of
``solution``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from tracerl.envs.files import load_question_file
from tracerl.envs.math.reward import extract_boxed
from tracerl.types import Prompt

QUESTION_KEYS = ("problem", "question", "prompt")


def _answer(row: dict[str, Any]) -> str | None:
    ans = row.get("answer")
    if isinstance(ans, list):
        ans = ans[0] if ans else None
    if isinstance(ans, float) and ans.is_integer():
        ans = int(ans)
    if isinstance(ans, str) and ans.startswith("[") and ans.endswith("]"):
        try:
            parsed = ast.literal_eval(ans)
            ans = parsed[0] if isinstance(parsed, list) and parsed else ans
        except (ValueError, SyntaxError):
            pass
    if ans is None and isinstance(row.get("solution"), str):
        ans = extract_boxed(row["solution"])
    return None if ans is None else str(ans).strip()


def load_math_file(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from a JSON / JSONL / parquet file of math problems.

    Raises:
        FileNotFoundError: the file does not exist.
        DataFileError: unsupported extension, an empty or malformed file, or a record without a question or an
            answer (the message names the file and the record).
    """
    return load_question_file(
        path,
        what="math task file",
        key="env.math.tasks",
        kinds={".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"},
        question_keys=QUESTION_KEYS,
        answer=_answer,
        no_answer="expected 'answer' (or a \\boxed answer in 'solution')",
        source=lambda row, p: p.name,
        limit=limit,
    )
