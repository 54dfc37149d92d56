"""Helpers every config dataclass uses to validate itself, wherever it lives (tracerl, envs, a plug-in).

Closed choices are ``Literal`` fields: the config loader rejects any other value (a YAML ``on`` or ``true`` for
a string choice included) with a message naming the key, the value and the allowed values, and
``check_choices`` does the same for a config built in Python.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal, get_args, get_origin


def check(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` unless ``cond``: the range checks of a config's ``__post_init__``."""
    if not cond:
        raise ValueError(msg)


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal[...]`` type (also inside ``X | None`` and ``list[...]``), else None."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    for arg in get_args(tp):
        found = literal_choices(arg)
        if found is not None:
            return found
    return None


_CHOICES: dict[type, dict[str, tuple[Any, ...]]] = {}


def _choice_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    if cls not in _CHOICES:
        hints = typing.get_type_hints(cls)
        _CHOICES[cls] = {
            f.name: choices
            for f in dataclasses.fields(cls)
            if (choices := literal_choices(hints[f.name])) is not None
        }
    return _CHOICES[cls]


def choice_message(key: str, value: Any, choices: tuple[Any, ...]) -> str:
    """The one wording of a bad closed choice: the key, the value given and the allowed values."""
    allowed = ", ".join(repr(c) for c in choices)
    return f"{key} must be one of {allowed} (got {value!r})"


def check_choices(obj: Any, prefix: str) -> None:
    """Check every ``Literal`` field of the dataclass ``obj`` (lists element by element).

    Args:
        prefix: the config key of ``obj`` (``"loss"``), used in the message.

    Raises:
        ValueError: naming the key, the bad value and the allowed values.
    """
    for name, choices in _choice_fields(type(obj)).items():
        value = getattr(obj, name)
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            # bool is an int: True == 1 must not pass for a Literal[1] or a string choice.
            if isinstance(v, bool) or v not in choices:
                if v is None and type(None) in get_args(typing.get_type_hints(type(obj))[name]):
                    continue
                raise ValueError(choice_message(f"{prefix}.{name}" if prefix else name, v, choices))
