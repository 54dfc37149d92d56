"""Untrusted model text: the limits and clean-ups the turn parser applies before anything is executed or encoded.

JSON and Python escapes such as ``\\ud800`` decode to lone surrogates, which no UTF-8 encoder or tokenizer accepts:
:func:`encodable` replaces them. Argument values nested past ``MAX_ARGUMENT_DEPTH`` (``clean`` raises ``TooDeep``)
and action inputs longer than ``MAX_ACTION_CHARS`` are error observations in ``tracerl.engine.react``.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_ACTION_CHARS = 65_536
"""Longest action input the parser reads (a call list, a tool's bracketed or JSON input, one ``<tool_call>`` block);
a longer one is an error observation (a turn is already capped in tokens: this bounds the parser's work)."""
MAX_ARGUMENT_DEPTH = 32
"""Deepest nesting of lists, tuples, sets and dicts in a call's arguments; deeper is an error observation."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD.

    A JSON or Python escape such as ``\\ud800`` decodes to a lone surrogate, which no UTF-8 encoder (and no
    tokenizer) accepts; whatever the engine encodes or echoes goes through here."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


class TooDeep(ValueError):
    """Argument values nested deeper than ``MAX_ARGUMENT_DEPTH``."""


def clean(value: Any, depth: int = 0) -> Any:
    """``value`` with every string made encodable; raises ``TooDeep`` past ``MAX_ARGUMENT_DEPTH`` levels."""
    if isinstance(value, str):
        return encodable(value)
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        return value
    if depth >= MAX_ARGUMENT_DEPTH:
        raise TooDeep(depth)
    if isinstance(value, dict):
        return {clean(k, depth + 1): clean(v, depth + 1) for k, v in value.items()}
    return type(value)(clean(v, depth + 1) for v in value)


def oversized(body: str) -> str | None:
    """The error observation for an action input longer than ``MAX_ACTION_CHARS``, else None."""
    if len(body) <= MAX_ACTION_CHARS:
        return None
    return f"Error: the action's input is {len(body)} characters long; the limit is {MAX_ACTION_CHARS}."


def json_error(exc: Exception) -> str:
    """What was wrong with a JSON text, for the error observation."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(":")[0]  # e.g. 'Exceeds the limit (4300 digits) for integer string conversion'
