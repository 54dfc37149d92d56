"""The reports' one table writer: rows of already-formatted cells as a Markdown table, a fixed-width text table or an
HTML table, and ``num`` for a number that may be missing. The study, curves and compare reports write every table
through it, so a column is named once, beside its values."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any


def num(value: Any, spec: str = ".3f", missing: str = "n/a") -> str:
    """``value`` formatted by ``spec``; ``missing`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table, one line per row (header and rule first)."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def text(columns: Sequence[tuple[str, int, str]], rows: Sequence[Sequence[str]]) -> str:
    """A fixed-width table: ``columns`` as (title, width, '<' or '>'); a longer cell widens its line, not cut."""
    fmt = " ".join(f"{{:{align}{width}}}" for _, width, align in columns)
    return "\n".join(fmt.format(*row) for row in [[title for title, _, _ in columns], *rows])


def html_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], classes: Sequence[str] = (), id_: str = ""
) -> str:
    """An HTML table, cells escaped; ``classes[j]`` (if any) is column j's cell class."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)

    def cell(j: int, v: str) -> str:
        cls = f" class='{classes[j]}'" if j < len(classes) and classes[j] else ""
        return f"<td{cls}>{html.escape(v)}</td>"

    body = "".join("<tr>" + "".join(cell(j, v) for j, v in enumerate(row)) + "</tr>" for row in rows)
    ident = f" id='{id_}'" if id_ else ""
    return f"<table{ident}><tr>{head}</tr>{body}</table>"


__all__ = ["html_table", "markdown", "num", "text"]
