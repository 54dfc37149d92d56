"""Loaders for real math task files (MATH-500, AIME, AMC, DeepScaleR, ...) through HF datasets.

Accepts JSON (a list of records), JSONL and parquet. The question field is the first of
``problem``/``question``/``prompt`` present; the answer is ``answer`` (numbers become strings;
OlympiadBench's list-strings like "['$2^{1009}$']" are unwrapped), else the last \\boxed{} of
``solution``.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

from envs.math.reward import extract_boxed
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
        ValueError: unsupported extension, or records without a question or an answer field.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"math task file not found: {path}")
    kind = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}.get(path.suffix)
    if kind is None:
        raise ValueError(f"{path}: unsupported extension {path.suffix!r}; use .json, .jsonl or .parquet")
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    qkey = next((k for k in QUESTION_KEYS if k in ds.column_names), None)
    if qkey is None:
        raise ValueError(f"{path}: no question field; expected one of {QUESTION_KEYS}, found {ds.column_names}")
    out: list[Prompt] = []
    for i, row in enumerate(ds):
        if limit is not None and len(out) >= limit:
            break
        ans = _answer(row)
        if ans is None:
            raise ValueError(f"{path}: record {i} has no 'answer' (nor a \\boxed answer in 'solution')")
        q = str(row[qkey])
        pid = f"{path.stem}-{i}-" + hashlib.sha1(q.encode()).hexdigest()[:8]
        out.append(Prompt(prompt_id=pid, text=q, answer=ans, source=path.name))
    return out
