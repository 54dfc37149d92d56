"""Question files through HF datasets, shared by the environments' loaders (math, search)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tracerl.types import Prompt


def load_question_file(path: str | Path, *, what: str, key: str, kinds: Mapping[str, str], question_keys: Sequence[str],
                       answer: Callable[[dict[str, Any]], str | None], no_answer: str,
                       source: Callable[[dict[str, Any], Path], str], limit: int | None = None) -> list[Prompt]:
    """Prompts from a question file: ``kinds`` maps a suffix to an HF datasets builder (json, csv, parquet); the
    question is the first of ``question_keys`` present; ``answer(row)`` gives the gold answer (None: an error
    ending with ``no_answer``); ids are ``<stem>-<row>-<hash of the question>``.

    Raises:
        FileNotFoundError: the file does not exist (the message names ``key``, the config key that set it).
        ValueError: unsupported extension, or records without a question or an answer.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path} (set {key} to an existing file)")
    kind = kinds.get(path.suffix)
    if kind is None:
        raise ValueError(f"{path}: unsupported extension {path.suffix!r}; use {', '.join(kinds)}")
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    qkey = next((k for k in question_keys if k in ds.column_names), None)
    if qkey is None:
        raise ValueError(f"{path}: no question field; expected one of {tuple(question_keys)}, found {ds.column_names}")
    out: list[Prompt] = []
    for i, row in enumerate(ds):
        if limit is not None and len(out) >= limit:
            break
        ans = answer(row)
        if ans is None:
            raise ValueError(f"{path}: record {i} has no answer; {no_answer}")
        q = str(row[qkey]).strip()
        pid = f"{path.stem}-{i}-" + hashlib.sha1(q.encode()).hexdigest()[:8]
        out.append(Prompt(prompt_id=pid, text=q, answer=ans, source=source(row, path)))
    return out
