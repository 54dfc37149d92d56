"""Helpers every config dataclass uses to validate itself, wherever it lives (tracerl, envs, a plug-in).

Closed choices are ``Literal`` fields: the config loader rejects any other value (a YAML ``on`` or ``true`` for
a string choice included) with a message naming the key, the value and the allowed values, and
``check_choices`` does the same for a config built in Python.

A command config composes another config by holding it in a flattened field (``flattened``): the sweep holds the
training setup as ``train: TrainConfig`` rather than being one, so code that takes a ``TrainConfig`` cannot be handed
a sweep, while users still write the train keys at the top level of the sweep's YAML (``budget.num_leaves``, not
``train.budget.num_leaves``). ``flat_routes`` says where each top-level key lives.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")

FLATTEN = "flatten"
"""Field metadata key: the field's dataclass is written flat, its keys at the level of the field's own class."""


def check(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` unless ``cond``: the range checks of a config's ``__post_init__``."""
    if not cond:
        raise ValueError(msg)


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal[...]`` type (also inside ``X | None`` and ``list[...]``), else None.

    ``bool | Literal[...]`` allows true and false too (``loss.debiased_values``: true, false or 'auto')."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    args = get_args(tp)
    for arg in args:
        found = literal_choices(arg)
        if found is not None:
            return (True, False, *found) if bool in args else found
    return None


def _allowed(value: Any, choices: tuple[Any, ...]) -> bool:
    # bool is an int: True == 1 must not pass for a Literal[1] or a string choice, nor 1 for a bool choice.
    return any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices)


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
    # Bools as YAML writes them (loss.debiased_values: true, false, 'auto').
    allowed = ", ".join(str(c).lower() if isinstance(c, bool) else repr(c) for c in choices)
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
            if not _allowed(v, choices):
                if v is None and type(None) in get_args(typing.get_type_hints(type(obj))[name]):
                    continue
                raise ValueError(choice_message(f"{prefix}.{name}" if prefix else name, v, choices))


def flattened(cls: type[T]) -> T:
    """A field holding a default ``cls`` whose keys the config loader, ``to_yaml`` and the component checks treat as
    the enclosing config's own top-level keys."""
    return dataclasses.field(default_factory=cls, metadata={FLATTEN: True})


_ROUTES: dict[type, dict[str, tuple[str, ...]]] = {}


def flat_routes(cls: type) -> Mapping[str, tuple[str, ...]]:
    """Every top-level key users write for the config dataclass ``cls``, mapped to its field path: its own fields
    to themselves (``space`` -> ``("space",)``), a flattened field's keys through it (``budget`` ->
    ``("train", "budget")``). The flattened field's own name is no key.

    Raises:
        TypeError: a key both the config's own and a flattened field's, or two flattened fields': a schema that
            could not say where the key goes.
    """
    if cls in _ROUTES:
        return _ROUTES[cls]
    routes: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get(FLATTEN):
            sub = typing.get_type_hints(cls)[f.name]
            if not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
                raise TypeError(f"{cls.__name__}.{f.name} is flattened but holds no dataclass ({sub!r})")
            items = [(key, (f.name, *path)) for key, path in flat_routes(sub).items()]
            where = f"{cls.__name__}.{f.name} ({sub.__name__})"
        else:
            items, where = [(f.name, (f.name,))], cls.__name__
        for key, path in items:
            if key in routes:
                raise TypeError(
                    f"config key {key!r} of {cls.__name__} is both {owner[key]}'s and {where}'s: "
                    "rename one, the loader could not say where it goes"
                )
            routes[key], owner[key] = path, where
    _ROUTES[cls] = routes
    return routes


def check_flat_keys(cls: type[T]) -> type[T]:
    """Class decorator: check ``flat_routes`` when the class is defined, so a clash fails at import."""
    flat_routes(cls)
    return cls


def flat_parts(obj: Any) -> list[Any]:
    """The config ``obj`` and every config it holds in a flattened field (recursively), outermost first."""
    parts = [obj]
    for f in dataclasses.fields(obj):
        if f.metadata.get(FLATTEN):
            parts += flat_parts(getattr(obj, f.name))
    return parts


def flat_values(obj: Any) -> dict[str, Any]:
    """The config ``obj``'s top-level keys (its flattened fields' keys in their place) and their values."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out.update(flat_values(value) if f.metadata.get(FLATTEN) else {f.name: value})
    return out
